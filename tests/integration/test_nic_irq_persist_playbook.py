# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nic_irq_persist through ansible-playbook (a real AnsiballZ payload) on a generated tree.

The library the module installs comes from its own payload, so this is the test
that the payload carries the entry point's whole import closure: the installed
tree must equal the closure read from this checkout, byte for byte, with the
right modes; a second run changes nothing; a tampered, re-moded or stale
(previously installed, no longer shipped) library file is drift in check mode
(nothing written) and repaired by a run; Python's __pycache__ and a file the
collection did not install are left alone. Files land under the tree's root,
never on this host.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import treegen  # noqa: E402
from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload  # noqa: E402

PLAY = """
- name: nic_irq_persist on a generated tree
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Pin and persist
      gpunode.tuning.nic_irq_persist:
        pci_address: "0000:42:01.0"
        count: 4
        allow_irqbalance: true
        recheck_interval: 1min
        procfs_path: "{{ tree }}/proc"
        sysfs_path: "{{ tree }}/sys"
"""
LIB = "usr/local/lib/gpunode-tuning"


def run(tmp_path, tree, *extra):
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (Path(sys.executable).parent, os.environ.get("PATH", "")))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
            "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "tree=%s" % tree.root] + list(extra)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return int(re.search(r"(?m)^localhost\s*:\s*ok=\d+\s+changed=(\d+)", res.stdout).group(1)), res.stdout


def library(root):
    lib = Path(root) / LIB
    return {str(p.relative_to(lib)): p.read_bytes() for p in sorted(lib.rglob("*"))
            if p.is_file() and "__pycache__" not in str(p) and p.name != _payload.MANIFEST}


@pytest.mark.skipif(os.geteuid() != 0, reason="the module installs files owned by root")
def test_payload_library_is_exact_idempotent_and_repairs_drift(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    changed, _out = run(tmp_path, tree)
    assert changed == 1
    want = _payload.library_files()
    assert library(tree.root) == want
    assert "ansible_collections/gpunode/tuning/plugins/module_utils/_nic_irq/pin_cli.py" in want
    for path in (Path(tree.root) / LIB).rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
    assert run(tmp_path, tree)[0] == 0, "second run changed something"

    pkg = Path(tree.root) / LIB / _payload.PKG_DIR
    edited, remoded, stale, foreign = pkg / "_parse/cpulist.py", pkg / "_nic_irq/nic.py", pkg / "_gone.py", pkg / "_site_local.py"
    edited.write_text("# edited on the node\n")
    remoded.chmod(0o600)
    stale.write_text("")                        # installed by an earlier version: in the manifest
    foreign.write_text("# not the collection's\n")
    manifest = Path(tree.root) / LIB / _payload.MANIFEST
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) + [_payload.PKG_DIR + "/_gone.py"]))
    cache = pkg / "__pycache__" / "_nic.cpython-311.pyc"
    cache.parent.mkdir()
    cache.write_bytes(b"\0")

    changed, out = run(tmp_path, tree, "--check", "--diff")
    assert changed == 1, "check mode reported no drift"
    assert edited.read_text() == "# edited on the node\n" and stale.exists()
    assert stat.S_IMODE(remoded.stat().st_mode) == 0o600, "check mode changed a mode"

    assert run(tmp_path, tree)[0] == 1
    got = {k: v for k, v in library(tree.root).items() if not k.endswith("_site_local.py")}
    assert got == want
    assert stat.S_IMODE(remoded.stat().st_mode) == 0o644
    assert not stale.exists(), "a file the collection installed and no longer ships was kept"
    assert foreign.exists(), "a file the collection did not install was removed"
    assert cache.exists(), "the bytecode cache was removed"
    assert run(tmp_path, tree)[0] == 0
