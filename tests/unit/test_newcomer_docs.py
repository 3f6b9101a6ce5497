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


def test_the_declared_ansible_core_range_is_the_tested_one():
    """requires_ansible, every role's min_ansible_version and the README name the core CI tests as the oldest
    (requirements-oldest.txt); the newest is requirements-dev.txt's."""
    def pinned(name):
        text = (ROOT / name).read_text()
        return re.search(r"^ansible-core==(\d+)\.(\d+)\.(\d+)", text, re.M).groups()
    oldest, newest = pinned("requirements-oldest.txt"), pinned("requirements-dev.txt")
    assert oldest < newest
    floor = "%s.%s" % oldest[:2]
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=%s.0" % floor
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        assert yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"] == floor, meta
    readme = (ROOT / "README.md").read_text()
    assert "Needs ansible-core %s or later" % floor in readme
    assert ".".join(oldest) in readme and ".".join(newest) in readme
    assert "run_steps unit oldest sanity lint molecule" in (ROOT / "run.sh").read_text()


def test_strict_is_described_as_what_the_module_does():
    spec = yaml.safe_load((ROOT / "roles" / "nic_irq_pinning" / "meta" / "argument_specs.yml").read_text())
    text = " ".join(spec["argument_specs"]["main"]["options"]["nic_irq_pinning_strict"]["description"])
    assert "refuses to move" in text and "EIO or EPERM" in text
    assert "Fail instead of warning when the plan cannot be met" not in text


def test_requirements_name_the_real_entry_point():
    text = (ROOT / "requirements-dev.txt").read_text()
    assert "make deps" not in text and "./run.sh deps" in text
    assert not (ROOT / "Makefile").exists()


# ------------------------------------------------ the README for a cluster engineer (issue 29) --

def _section(text, heading):
    """The lines under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    lines = text.splitlines()
    start = lines.index(heading) + 1
    out, fenced = [], False
    for line in lines[start:]:
        fenced = fenced != line.startswith("```")
        marks = line.split(" ", 1)[0]
        if not fenced and marks and marks.strip("#") == "" and len(marks) <= len(level):
            break
        out.append(line)
    return out


def _first_column(lines):
    return [m.group(1) for m in (re.match(r"^\| `([\w-]+)` \|", line) for line in lines) if m]


def test_no_readme_line_is_over_200_characters():
    long = [(number, len(line)) for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
            if len(line) > 200]
    assert long == []


def test_the_readme_lists_every_verdict_diagnose_can_emit_and_no_other():
    from ansible_collections.gpunode.tuning.plugins.module_utils._report.diagnose import VERDICT_ORDER
    from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import RULES, VERDICTS
    listed = _first_column(_section((ROOT / "README.md").read_text(), "### Diagnose verdicts"))
    assert len(listed) == len(set(listed))
    assert set(listed) == set(VERDICT_ORDER) and set(VERDICTS) <= set(listed)
    assert set(rule.verdict for rule in RULES) <= set(listed)


def test_the_readme_explains_every_finding_status():
    from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import STATUSES
    listed = _first_column(_section((ROOT / "README.md").read_text(), "### Finding statuses"))
    assert sorted(listed) == sorted(STATUSES)


def test_the_readme_quick_start_and_the_empty_inventory():
    text = (ROOT / "README.md").read_text()
    quick = "\n".join(_section(text, "## Quick start (five minutes)"))
    assert "ansible-galaxy collection build --force && ansible-galaxy collection install --force" in quick
    steps = [quick.index("gpunode.tuning.%s" % name) for name in ("preflight", "diagnose", "tune --check --diff")]
    assert steps == sorted(steps) and re.search(r"(?m)^ansible-playbook -i inventory.yml gpunode.tuning.tune$", quick)
    empty = "\n".join(_section(text, "## What tune.yml does with no variables"))
    assert "masks irqbalance" in empty.replace("*", "") and "default-route NIC" in empty
    assert "nic_irq_pinning_interface" in empty and "several" in empty
    testing = "\n".join(_section(text, "## Testing"))
    assert "./run.sh test" in testing and not re.search(r"\b\d+ s\b", testing)      # no timing history here


def test_the_unit_step_installs_grub_common_for_the_real_grub_mkconfig_test():
    deb_test = subprocess.run(["bash", "-c", 'eval "$(grep "^DEB_TEST=" run.sh)"; printf "%s\\n" "${DEB_TEST[@]}"'],
                              cwd=str(ROOT), capture_output=True, text=True, check=True).stdout.split()
    assert "grub-common" in deb_test


def test_the_readme_maps_each_softnet_verdict_to_its_preflight_status():
    from ansible_collections.gpunode.tuning.plugins.module_utils._report.preflight import SOFTNET_STATUS
    text = " ".join((ROOT / "README.md").read_text().split())
    for verdict, status in SOFTNET_STATUS.items():
        assert "`%s` for `%s`" % (status, verdict) in text, (verdict, status)
