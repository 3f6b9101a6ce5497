# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nic_irq_pinning's library install (roles/nic_irq_pinning/tasks/library.yml), run for real.

ansible-playbook runs the role's library tasks on localhost into a temporary
nic_irq_pinning_lib_dir: the tree must equal the collection's module_utils
(content, modes), a second run must change nothing, and a tampered, re-moded
or stale file must be drift in check mode (nothing written) and fixed by a
run, with Python's own __pycache__ left alone. The lab scenarios run the same
tasks on guests; this test covers the comparison logic without a lab.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE_VARS = yaml.safe_load((ROOT / "roles" / "nic_irq_pinning" / "vars" / "main.yml").read_text())
PKG = "ansible_collections/gpunode/tuning/plugins/module_utils"

PLAY = """
- name: Install the library only
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's library tasks
      ansible.builtin.include_role:
        name: gpunode.tuning.nic_irq_pinning
        tasks_from: library
"""


def expected_tree():
    files = {"%s/__init__.py" % d: b"" for d in ROLE_VARS["__nic_irq_pinning_init_dirs"]}
    for src in sorted((ROOT / "plugins" / "module_utils").glob("_*.py")):
        files["%s/%s" % (PKG, src.name)] = src.read_bytes()
    return files


def tree(lib):
    out = {}
    for path in sorted(lib.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(lib))] = path.read_bytes()
    return out


def run(tmp_path, *extra):
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (Path(sys.executable).parent, os.environ.get("PATH", "")))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
            "-e", "ansible_python_interpreter=%s" % sys.executable,
            "-e", "nic_irq_pinning_lib_dir=%s" % (tmp_path / "lib")] + list(extra)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return int(re.search(r"(?m)^localhost\s*:\s*ok=\d+\s+changed=(\d+)", res.stdout).group(1))


@pytest.mark.skipif(os.geteuid() != 0, reason="the role installs files owned by root")
def test_library_install_is_exact_idempotent_and_repairs_drift(tmp_path):
    lib = tmp_path / "lib"
    assert run(tmp_path) > 0
    assert tree(lib) == expected_tree()
    for path in lib.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
    assert run(tmp_path) == 0, "second run changed something"

    # Drift: one file edited, one re-moded, one stale module, plus Python's bytecode cache.
    edited = lib / PKG / "_cpulist.py"
    edited.write_text("# edited on the node\n")
    remoded = lib / PKG / "_nic.py"
    remoded.chmod(0o600)
    stale = lib / PKG / "_gone.py"
    stale.write_text("")
    cache = lib / PKG / "__pycache__" / "_nic.cpython-311.pyc"
    cache.parent.mkdir()
    cache.write_bytes(b"\0")

    assert run(tmp_path, "--check", "--diff") > 0, "check mode reported no drift"
    assert edited.read_text() == "# edited on the node\n" and stale.exists()
    assert stat.S_IMODE(remoded.stat().st_mode) == 0o600, "check mode changed a mode"

    assert run(tmp_path) > 0
    got = {k: v for k, v in tree(lib).items() if "__pycache__" not in k}
    assert got == expected_tree()
    assert stat.S_IMODE(remoded.stat().st_mode) == 0o644
    assert cache.exists(), "the bytecode cache was removed"
    assert run(tmp_path) == 0
