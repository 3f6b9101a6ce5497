# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""House rules of the irqbalance and nic_irq_pinning roles, checked on the files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = ["checkpoint_staging", "cpu_power", "cpusets", "irqbalance", "isolcpus", "nic_irq_pinning"]


def _spec(role):
    data = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return data["argument_specs"]["main"]["options"]


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_declared_with_the_same_default(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    spec = _spec(role)
    assert sorted(defaults) == sorted(spec)
    for name, value in defaults.items():
        assert spec[name]["default"] == value, name


@pytest.mark.parametrize("role", ROLES)
def test_every_public_option_is_prefixed_typed_and_described(role):
    for name, option in _spec(role).items():
        assert name.startswith(role + "_"), name
        assert option.get("type"), name
        assert option.get("description"), name
        if option["type"] == "list":
            assert option.get("elements"), name


@pytest.mark.parametrize("role", ROLES)
def test_every_variable_the_role_reads_is_public_or_internal(role):
    """A variable named like the role must be declared; helpers must start with __."""
    import re

    declared = set(_spec(role))
    used = set()
    for path in (ROOT / "roles" / role).rglob("*"):
        if path.suffix in (".yml", ".j2") and path.is_file():
            used |= set(re.findall(r"(?<![_\w.])(%s_[a-z0-9_]+)" % role, path.read_text()))  # not gpunode.tuning.<module>
    status_facts = {"irqbalance_status", "nic_irq_pinning_report", "irqbalance_mode", "irqbalance_banned_cpus",
                    "cpusets_report", "isolcpus_report", "isolcpus_reboot_required", "cpu_power_report", "cpu_power_reboot_required",
                    "irqbalance_banned_devices", "checkpoint_staging_report"}
    undeclared = used - declared - status_facts
    assert not undeclared, sorted(undeclared)


def test_templates_and_rendered_files_start_with_ansible_managed():
    """The roles' templates (none left: the modules render the files) and the files the modules render in their place."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance_state import policy_script

    for template in sorted(p for role in ROLES for p in (ROOT / "roles" / role / "templates").glob("*.j2")):
        lines = template.read_text().splitlines()
        first = lines[1] if lines[0].startswith("#!") else lines[0]
        assert first == "{{ ansible_managed | comment }}", template
    # irqbalance's policy script, as the removed template rendered it with the default ansible_managed.
    assert policy_script(["0000:42:01.0"]).splitlines()[:4] == ["#!/bin/sh", "#", "# Ansible managed", "#"]


@pytest.mark.parametrize("role", ROLES)
def test_every_internal_variable_is_prefixed_with_the_role(role):
    """Internals are __<role>_*, as linux-system-roles name them, so two roles' helpers never collide."""
    import re

    dunder = {"__init__", "__pycache__", "__name__", "__main__", "__file__"}
    bare = set()
    for path in (ROOT / "roles" / role).rglob("*"):
        if path.suffix in (".yml", ".j2") and path.is_file():
            for name in re.findall(r"(?<![\w.])(__[A-Za-z]\w*)", path.read_text()):
                if name not in dunder and not name.startswith("__%s_" % role):
                    bare.add("%s: %s" % (path.relative_to(ROOT), name))
    assert not bare, sorted(bare)
