# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""read_irqbalance from systemctl (recorded outputs) and from unit files, and its config parsing."""

from __future__ import annotations

import os

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._irqbalance import parse_config, read_irqbalance


def _tree(tmp_path, **irqb):
    spec = treegen.lab_virtio()
    spec["irqbalance"] = dict(spec["irqbalance"], **irqb) if irqb.get("present", True) else None
    spec["irqbalance"] and spec["irqbalance"].pop("present", None)
    return treegen.build_tree(tmp_path, spec)


@pytest.mark.parametrize("running,unit,systemd,expected", [
    (True, "enabled", True, {"active": True, "enabled": True, "masked": False, "source": "systemctl"}),
    (False, "masked", True, {"active": False, "enabled": False, "masked": True, "source": "systemctl"}),
    (True, "enabled", False, {"active": True, "enabled": True, "masked": False, "source": "unit-files"}),
    (False, "masked", False, {"active": False, "enabled": False, "masked": True, "source": "unit-files"}),
    (False, "disabled", False, {"active": False, "enabled": False, "masked": False, "source": "unit-files"}),
])
def test_state_from_systemctl_or_unit_files(tmp_path, running, unit, systemd, expected):
    tree = _tree(tmp_path, running=running, unit=unit, systemd=systemd)
    state = read_irqbalance(tree.root, run=tree.run)
    assert dict((k, state[k]) for k in expected) == expected
    assert state["installed"] is True
    if systemd:
        assert ["systemctl", "is-active", "irqbalance.service"] in tree.calls
    else:
        assert tree.calls == []


def test_not_installed(tmp_path):
    tree = _tree(tmp_path, present=False)
    state = read_irqbalance(tree.root, run=None)
    assert (state["installed"], state["active"], state["config_file"]) == (False, False, None)


@pytest.mark.parametrize("config,path,banned", [
    ('IRQBALANCE_BANNED_CPULIST="160-170"\n', "etc/default/irqbalance", list(range(160, 171))),
    ("# comment\nexport IRQBALANCE_BANNED_CPUS=00000f00\n", "etc/sysconfig/irqbalance", [8, 9, 10, 11]),
    ("IRQBALANCE_BANNED_CPUS=ff,00000000\nIRQBALANCE_BANNED_CPULIST=1\n", "etc/default/irqbalance", [1]),
    ("#IRQBALANCE_BANNED_CPULIST=\n", "etc/default/irqbalance", []),
])
def test_banned_cpus_from_either_config_file(tmp_path, config, path, banned):
    tree = _tree(tmp_path, config=config, path=path, systemd=False)
    state = read_irqbalance(tree.root)
    assert state["banned_cpus"] == banned
    assert state["config_file"] == os.path.join(tree.root, path)


def test_bad_banned_value_is_a_note(tmp_path):
    tree = _tree(tmp_path, config="IRQBALANCE_BANNED_CPULIST=zz\n", systemd=False)
    state = read_irqbalance(tree.root)
    assert state["banned_cpus"] == [] and "zz" in state["notes"][0]


def test_parse_config_handles_quotes_comments_and_export():
    text = "A=1\nexport B='x y'\nC=\"q\" # trailing\n# D=4\nnot a line\n"
    assert parse_config(text) == {"A": "1", "B": "x y", "C": "q"}
