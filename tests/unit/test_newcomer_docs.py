# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a newcomer reads and installs says what the project does (issue 11, item 7)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_shellcheck_is_installed_with_the_test_packages():
    # ansible-test sanity skips its shellcheck test, with a warning only, when shellcheck is missing
    deb_test = subprocess.run(["bash", "-c", 'eval "$(grep "^DEB_TEST=" run.sh)"; printf "%s\\n" "${DEB_TEST[@]}"'],
                              cwd=str(ROOT), capture_output=True, text=True, check=True).stdout.split()
    assert "shellcheck" in deb_test
    bindep = (ROOT / "bindep.txt").read_text().splitlines()
    assert any(re.match(r"^shellcheck \[.*\btest\b.*platform:dpkg.*\]", line) for line in bindep)


def test_readme_claims_no_check_the_collection_does_not_have():
    """SMMU, C-states, NUMA and the NCCL topology have checks: the prose paragraph naming them names the module
    (and role), and those exist; SMMU is only checked, never changed, and the paragraph says so."""
    text = (ROOT / "README.md").read_text()
    assert "This collection checks them" not in text
    modules = set(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))
    roles = set(p.name for p in (ROOT / "roles").iterdir())
    for paragraph in text.split("\n\n"):
        if "SMMU" in paragraph and not paragraph.startswith("|"):
            assert "`platform_facts`" in paragraph and "not changed" in paragraph, paragraph
        if "NCCL topology" in paragraph and not paragraph.startswith("|"):
            assert "`nccl_topo_mount`" in paragraph and "`nccl_topology` role" in paragraph, paragraph
        if "C-states" in paragraph and not paragraph.startswith("|"):
            assert "`cpu_power_facts`" in paragraph and "`cpu_power` role" in paragraph, paragraph
    assert "cpu_power_facts" in modules and "cpu_power" in roles
    assert "nccl_topo_mount" in modules and "nccl_topology" in roles
    assert "platform_facts" in modules and "gpu_health" in modules


def test_role_metadata_claims_only_the_tested_platform():
    meta = yaml.safe_load((ROOT / "roles" / "nic_irq_pinning" / "meta" / "main.yml").read_text())["galaxy_info"]
    assert meta["platforms"] == [{"name": "Debian", "versions": ["bookworm"]}]
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=%s.0" % meta["min_ansible_version"]


def test_strict_is_described_as_what_the_module_does():
    spec = yaml.safe_load((ROOT / "roles" / "nic_irq_pinning" / "meta" / "argument_specs.yml").read_text())
    text = " ".join(spec["argument_specs"]["main"]["options"]["nic_irq_pinning_strict"]["description"])
    assert "refuses to move" in text and "EIO or EPERM" in text
    assert "Fail instead of warning when the plan cannot be met" not in text


def test_requirements_name_the_real_entry_point():
    text = (ROOT / "requirements-dev.txt").read_text()
    assert "make deps" not in text and "./run.sh deps" in text
    assert not (ROOT / "Makefile").exists()
