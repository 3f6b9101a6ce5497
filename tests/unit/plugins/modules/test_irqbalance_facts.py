# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""irqbalance_facts module glue: exit_json/fail_json raise, trees are real files."""

from __future__ import annotations

import os

import pytest

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.modules import irqbalance_facts


pytestmark = pytest.mark.usefixtures("fake_exits")


def run(args, check=False):
    return modharness.run(irqbalance_facts, args, check=check)


@pytest.fixture
def lab(tmp_path):
    """The lab's irqbalance_banned guest: isolcpus=2 nohz_full=3, irqbalance running with a commented config."""
    spec = treegen.lab_virtio()
    spec.update(isolated=[2], nohz_full=[3])
    spec["irqbalance"] = dict(spec["irqbalance"], systemd=False)
    return treegen.build_tree(tmp_path, spec)


def roots(tree, **kw):
    kw.update(procfs_path=tree.proc, sysfs_path=tree.sys)
    return kw


def test_facts_and_plan_for_the_nic_cpus_plus_isolated_and_nohz_full(lab):
    kind, result = run(roots(lab, banned_cpus="4-7", banned_devices=["42:01.0"]))
    assert kind is Exit and result["changed"] is False
    facts = result["ansible_facts"]["irqbalance"]
    assert (facts["installed"], facts["active"], facts["source"]) == (True, True, "unit-files")
    assert (facts["banned_cpus"], facts["banned_by"]) == ([2, 3], "isolated+nohz_full")
    assert facts["config_file"] == os.path.join(lab.root, "etc/default/irqbalance")
    assert result["plan"] == {"banned_cpus": [2, 3, 4, 5, 6, 7], "banned_cpulist": "2-7", "banned_devices": ["0000:42:01.0"]}


def test_check_mode_returns_the_same(lab):
    args = roots(lab, banned_cpus=[4, 5])
    assert run(args, check=True) == run(args)


def test_config_file_is_read_under_the_tree_root(lab):
    with open(os.path.join(lab.root, "etc/default/irqbalance"), "w") as handle:
        handle.write("IRQBALANCE_BANNED_CPULIST=0-1\n")
    os.makedirs(os.path.join(lab.root, "etc/sysconfig"))
    with open(os.path.join(lab.root, "etc/sysconfig/irqbalance"), "w") as handle:
        handle.write("IRQBALANCE_BANNED_CPUS=f0\n")
    facts = run(roots(lab, config_file="/etc/sysconfig/irqbalance"))[1]["ansible_facts"]["irqbalance"]
    assert (facts["banned_cpus"], facts["config_file"]) == ([4, 5, 6, 7], os.path.join(lab.root, "etc/sysconfig/irqbalance"))
    assert run(roots(lab))[1]["ansible_facts"]["irqbalance"]["banned_cpus"] == [0, 1]


@pytest.mark.parametrize("args,value", [
    ({"banned_devices": ["*"]}, "*"),
    ({"banned_devices": ["0000:42:01.0", "0000:42:0?.0"]}, "0000:42:0?.0"),
    ({"banned_cpus": "4-x"}, "4-x"),
    ({"banned_cpus": ",3"}, ",3"),
])
def test_bad_input_fails_naming_the_value(lab, args, value):
    kind, result = run(roots(lab, **args))
    assert kind is Fail and repr(value) in result["msg"] and result["value"] == value


@pytest.mark.parametrize("option", ["procfs_path", "sysfs_path"])
def test_a_missing_root_is_named(lab, tmp_path, option):
    missing = str(tmp_path / "nowhere")
    args = roots(lab)
    args[option] = missing
    kind, result = run(args)
    assert kind is Fail and result["option"] == option and missing in result["msg"]
