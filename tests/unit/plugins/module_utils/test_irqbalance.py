# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""read_irqbalance from systemctl (recorded outputs) and from unit files, and its config parsing."""

from __future__ import annotations

import os

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance import IrqbalanceError, parse_config, plan_ban, read_irqbalance


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


def _ban_tree(tmp_path, config, isolated="", nohz_full="", path="etc/default/irqbalance"):
    """A tree whose isolated/nohz_full files hold exactly the given raw text (the kernel's own forms)."""
    tree = _tree(tmp_path, config=config, path=path, systemd=False) if config is not None else _tree(tmp_path, present=False)
    cpu = os.path.join(tree.sys, "devices/system/cpu")
    for name, text in (("isolated", isolated), ("nohz_full", nohz_full)):
        if text is None:
            os.remove(os.path.join(cpu, name))          # kernel without CONFIG_NO_HZ_FULL has no nohz_full file
        else:
            with open(os.path.join(cpu, name), "w") as handle:
                handle.write(text + "\n")
    return tree


# irqbalance 1.8/1.9 cputree.c setup_banned_cpus(): a non-empty IRQBALANCE_BANNED_CPUS wins, then a non-empty
# IRQBALANCE_BANNED_CPULIST, each alone; only with neither are the isolated and nohz_full CPUs banned.
@pytest.mark.parametrize("config,path,isolated,nohz_full,banned,banned_by", [
    ('IRQBALANCE_BANNED_CPULIST="160-170"\n', "etc/default/irqbalance", "", "", list(range(160, 171)), "IRQBALANCE_BANNED_CPULIST"),
    ("# comment\nexport IRQBALANCE_BANNED_CPUS=00000f00\n", "etc/sysconfig/irqbalance", "", "", [8, 9, 10, 11], "IRQBALANCE_BANNED_CPUS"),
    # both set: the hex mask is read first and wins (the list is not even looked at)
    ("IRQBALANCE_BANNED_CPUS=ff,00000000\nIRQBALANCE_BANNED_CPULIST=1\n", "etc/default/irqbalance", "", "",
     list(range(32, 40)), "IRQBALANCE_BANNED_CPUS"),
    ("IRQBALANCE_BANNED_CPULIST=1\nIRQBALANCE_BANNED_CPUS=1\n", "etc/default/irqbalance", "", "", [0], "IRQBALANCE_BANNED_CPUS"),
    # an empty hex mask is "not set": the list is used
    ('IRQBALANCE_BANNED_CPUS=""\nIRQBALANCE_BANNED_CPULIST=4\n', "etc/default/irqbalance", "2", "3", [4], "IRQBALANCE_BANNED_CPULIST"),
    # a set variable replaces the isolated/nohz_full ban, it does not add to it
    ("IRQBALANCE_BANNED_CPULIST=4-5\n", "etc/default/irqbalance", "2", "3", [4, 5], "IRQBALANCE_BANNED_CPULIST"),
    ("IRQBALANCE_BANNED_CPUS=0\n", "etc/default/irqbalance", "2", "3", [], "IRQBALANCE_BANNED_CPUS"),
    # neither set: isolated plus nohz_full
    ("#IRQBALANCE_BANNED_CPULIST=\n", "etc/default/irqbalance", "2", "3", [2, 3], "isolated+nohz_full"),
    ("IRQBALANCE_BANNED_CPULIST=\n", "etc/default/irqbalance", "1-2", "2-3", [1, 2, 3], "isolated+nohz_full"),
    (None, None, "", "3", [3], "isolated+nohz_full"),
    ("", "etc/sysconfig/irqbalance", "", "(null)", [], "isolated+nohz_full"),       # RHEL without nohz_full=
    ("", "etc/sysconfig/irqbalance", "5", None, [5], "isolated+nohz_full"),
])
def test_banned_cpus_follow_irqbalance_precedence(tmp_path, config, path, isolated, nohz_full, banned, banned_by):
    tree = _ban_tree(tmp_path, config, isolated, nohz_full, path=path or "etc/default/irqbalance")
    state = read_irqbalance(tree.root)
    assert (state["banned_cpus"], state["banned_by"]) == (banned, banned_by)
    assert state["config_file"] == (os.path.join(tree.root, path) if path else None)


def test_empty_cpulist_is_a_note_about_the_version_difference(tmp_path):
    tree = _ban_tree(tmp_path, "IRQBALANCE_BANNED_CPULIST=\n", "2", "")
    state = read_irqbalance(tree.root)
    assert state["banned_cpus"] == [2]
    assert any("IRQBALANCE_BANNED_CPULIST is set but empty" in n for n in state["notes"])


def test_isolated_and_nohz_full_are_reported_from_the_kernel_text(tmp_path):
    tree = _ban_tree(tmp_path, "IRQBALANCE_BANNED_CPULIST=7\n", "", "(null)")
    state = read_irqbalance(tree.root)
    assert (state["isolated"], state["nohz_full"]) == ([], [])


def test_sysfs_root_is_a_parameter(tmp_path):
    tree = _ban_tree(tmp_path, None, "", "")
    other = treegen.build_tree(tmp_path / "other", dict(treegen.lab_virtio(), isolated=[6], nohz_full=[7]))
    assert read_irqbalance(tree.root, sysfs=other.sys)["banned_cpus"] == [6, 7]


@pytest.mark.parametrize("config,value", [
    ("IRQBALANCE_BANNED_CPULIST=zz\n", "zz"),
    ("IRQBALANCE_BANNED_CPUS=xyz\nIRQBALANCE_BANNED_CPULIST=1\n", "xyz"),
])
def test_bad_banned_value_is_a_note(tmp_path, config, value):
    tree = _tree(tmp_path, config=config, systemd=False)
    state = read_irqbalance(tree.root)
    assert state["banned_cpus"] == [] and value in state["notes"][0]


def test_parse_config_handles_quotes_comments_and_export():
    text = "A=1\nexport B='x y'\nC=\"q\" # trailing\n# D=4\nnot a line\n"
    assert parse_config(text) == {"A": "1", "B": "x y", "C": "q"}


# --- plan_ban: what the irqbalance role writes in banned mode -------------------------------------------------

@pytest.mark.parametrize("isolated,nohz_full,banned,ban_isolated,expected", [
    ("", "3", "4-7", True, "3-7"),             # the YAML join made ",3" of these and the cpulist filter crashed
    ("", "(null)", [4, 5], True, "4-5"),      # RHEL without nohz_full=
    ("2", "3", "4-7", True, "2-7"),           # the lab's isolcpus=2 nohz_full=3 guest
    ("2", "3", "4-7", False, "4-7"),
    ("1-2", "2-3", [], True, "1-3"),
    ("", None, "", True, ""),
])
def test_plan_ban_adds_isolated_and_nohz_full_from_kernel_text(tmp_path, isolated, nohz_full, banned, ban_isolated, expected):
    tree = _ban_tree(tmp_path, "", isolated, nohz_full)
    plan = plan_ban(read_irqbalance(tree.root), banned, ban_isolated=ban_isolated)
    assert plan["banned_cpulist"] == expected


@pytest.mark.parametrize("devices,expected", [
    (["0000:42:01.0"], ["0000:42:01.0"]),
    (["42:01.0", "0000:42:01.0", "0000:3B:00.1"], ["0000:42:01.0", "0000:3b:00.1"]),   # short form gets its domain
    ([], []),
])
def test_plan_ban_normalises_devices(devices, expected):
    state = {"isolated": [], "nohz_full": []}
    assert plan_ban(state, "4", banned_devices=devices)["banned_devices"] == expected


@pytest.mark.parametrize("devices,bad", [
    (["*"], "*"),
    (["0000:42:01.0", "0000:42:*"], "0000:42:*"),
    (["42:01"], "42:01"),
    (["0000:42:01.0) echo ban=true ;; *"], "0000:42:01.0) echo ban=true ;; *"),
    ([""], ""),
    (["0000:42:01.8"], "0000:42:01.8"),
    ([42], 42),
])
def test_plan_ban_refuses_a_device_that_is_not_a_pci_address(devices, bad):
    with pytest.raises(IrqbalanceError) as exc:
        plan_ban({"isolated": [], "nohz_full": []}, "4", banned_devices=devices)
    assert repr(bad) in str(exc.value) and exc.value.details["value"] == bad


@pytest.mark.parametrize("cpus", ["4-x", "3-1", [4, -1], True, {"a": 1}])
def test_plan_ban_refuses_a_bad_cpu_list(cpus):
    with pytest.raises(IrqbalanceError) as exc:
        plan_ban({"isolated": [], "nohz_full": []}, cpus)
    assert repr(cpus) in str(exc.value)
