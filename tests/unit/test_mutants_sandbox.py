# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tests/tools/mutants.py runs mutmut, as root, where a mutant cannot write the host: / (with /etc, /var, the
repository unless it lies under /tmp), /proc and /sys read-only, the scratch copy and /tmp writable, the working
directory kept. A kernel_cmdline
mutant once wrote a test's GRUB files into this machine's /etc/default/grub.d (docs/mutation_testing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tools"))

import mutants  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
                                reason="the sandbox is for runs as root (unshare --mount)")


def test_a_write_outside_the_scratch_copy_fails_and_one_inside_succeeds(tmp_path):
    scratch = tmp_path / "scratch"
    work = scratch / "area"
    work.mkdir(parents=True)
    probe = Path("/etc") / ("gpunode-sandbox-probe-%d" % os.getpid())
    # /var/tmp: on the root filesystem, outside /tmp (a clone of the repository may itself lie under /tmp, which the
    # sandbox leaves writable for pytest's tmp_path)
    var_probe = Path("/var/tmp") / ("gpunode-sandbox-probe-%d" % os.getpid())
    script = ("touch %s; echo etc=$?; touch %s; echo var=$?; echo 1 > /proc/sys/kernel/printk_ratelimit; echo proc=$?; "
              "mkdir here && echo cwd=$?; touch %s/x; echo scratch=$?" % (probe, var_probe, scratch))
    proc = subprocess.run(mutants.sandboxed(str(scratch), ["sh", "-c", script]), cwd=str(work), capture_output=True,
                          text=True, check=False)
    try:
        assert not probe.exists() and not var_probe.exists()
        status = dict(line.split("=") for line in proc.stdout.split() if "=" in line)
        assert [key for key, rc in sorted(status.items()) if rc != "0"] == ["etc", "proc", "var"], proc.stdout + proc.stderr
        assert sorted(status) == ["cwd", "etc", "proc", "scratch", "var"] and "Read-only file system" in proc.stderr
        assert (work / "here").is_dir() and (scratch / "x").exists()
    finally:
        for path in (probe, var_probe):
            if path.exists():
                path.unlink()


def test_an_unprivileged_run_is_not_wrapped(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert mutants.sandboxed("/tmp/x", ["mutmut", "run"]) == ["mutmut", "run"]
