# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which NIC a tuning run pins when none is named (issue 29, trip 6), on generated trees.

The lab's gpu-node has a management NIC (ens3, the default route) and the data NIC (enp66s1): a run that pins IRQs
and masks irqbalance refuses to choose and names both and the variable to set; the read-only facts still report the
default-route NIC. A bare-metal node with one Ethernet NIC (and eight InfiniBand ports) pins that NIC."""

from __future__ import annotations

import hashlib
import os

import pytest

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_affinity, nic_irq_facts, nic_irq_persist

pytestmark = pytest.mark.usefixtures("fake_exits_json")


def snapshot(root):
    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = ("link", os.readlink(path))
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return out


@pytest.mark.parametrize("module", [nic_irq_persist, nic_irq_affinity], ids=["nic_irq_persist", "nic_irq_affinity"])
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_several_ethernet_nics_and_none_named_is_refused_naming_them_and_the_variable(tmp_path, module, check):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    before = snapshot(tree.root)
    kind, res = modharness.run(module, dict(count=2, allow_irqbalance=True, procfs_path=tree.proc, sysfs_path=tree.sys),
                               check=check)
    assert kind is Fail and res["changed"] is False, res
    assert res["option"] == "interface" and res["candidates"] == ["enp66s1", "ens3"], res
    assert "ens3 (0000:00:03.0)" in res["msg"] and "enp66s1 (0000:42:01.0)" in res["msg"], res["msg"]
    assert "nic_irq_pinning_interface" in res["msg"], res["msg"]
    assert "the default route (ens3) is often the management NIC" in res["msg"], res["msg"]
    assert snapshot(tree.root) == before                       # nothing pinned, nothing written


def test_naming_the_nic_on_that_node_pins_it(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    kind, res = modharness.run(nic_irq_affinity, dict(interface="enp66s1", count=2, allow_irqbalance=True,
                                                      procfs_path=tree.proc, sysfs_path=tree.sys), check=True)
    assert kind is Exit and res["interface"] == "enp66s1", res


def test_the_read_only_facts_still_report_the_default_route_nic(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    kind, res = modharness.run(nic_irq_facts, dict(procfs_path=tree.proc, sysfs_path=tree.sys))
    assert kind is Exit and res["ansible_facts"]["nic_irq"]["interface"] == "ens3", res


def test_one_ethernet_nic_beside_infiniband_ports_is_the_default(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.gpu_node())
    before = snapshot(tree.root)
    kind, res = modharness.run(nic_irq_persist, dict(count=4, allow_irqbalance=True, procfs_path=tree.proc,
                                                     sysfs_path=tree.sys), check=True)
    assert kind is Exit and res["interface"] == "ens21f0np0" and res["pci_address"] == "0000:c1:00.0", res
    assert res["changed"] is True and snapshot(tree.root) == before
