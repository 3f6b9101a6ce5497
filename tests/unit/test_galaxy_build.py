# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Galaxy tarball ships the collection, not the project's test and build machinery (issue 29, trip 7)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GALAXY = shutil.which("ansible-galaxy", path=os.path.dirname(sys.executable)) or shutil.which("ansible-galaxy")


@pytest.mark.skipif(GALAXY is None, reason="ansible-galaxy is not installed")
def test_the_built_tarball_holds_the_collection_and_no_tests_or_tooling(tmp_path):
    proc = subprocess.run([GALAXY, "collection", "build", "--output-path", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = tmp_path.glob("gpunode-tuning-*.tar.gz")
    with tarfile.open(tarball) as handle:
        names = handle.getnames()
    tops = set(name.split("/", 1)[0] for name in names)
    assert {"plugins", "roles", "playbooks", "meta", "README.md", "MANIFEST.json", "FILES.json"} <= tops, tops
    shipped_tooling = tops & {"tests", "molecule", "run.sh", ".ci", "build", "benchmarks", ".venv", "reports",
                              "requirements-dev.txt", "requirements-mutants.txt", "pytest.ini"}
    assert not shipped_tooling, shipped_tooling
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert "plugins/modules/nic_irq_persist.py" in names and "roles/nic_irq_pinning/tasks/main.yml" in names
