# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Mutation guards (issue 34): the IRQ CPU choice prefers the NIC's NUMA-local CPUs, not only the nearest node.

The NUMA-local preference and the node distance agree whenever the NIC's ``local_cpulist`` is its whole node and
the node distance table is there (the local node is the only one at distance 10). They differ on two topologies,
tested here on generated sysfs trees: a ``local_cpulist`` narrower than the node (all of the node is at distance
10, only part of it is local), and a node without a readable ``distance`` file (every distance unknown). A NIC
without a NUMA hint (``numa_node`` -1) is the same either way: no locality and no distance row, the policy takes
the highest cores (``test_policy_on_seed_vm_takes_whole_cores_highest_first_and_rounds_up``). The last test pins
the node distance itself (remote CPUs from the nearest node, not the highest-numbered).
"""

from __future__ import annotations

import glob
import os

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import plan_affinity
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology


def gpu_tree(root, local_cpulist=None):
    """The 8-GPU node of treegen, its Ethernet NIC (node 5: CPUs 60-71,156-167) with ``local_cpulist``."""
    spec = treegen.gpu_node()
    if local_cpulist is not None:
        spec["nics"][0]["local_cpulist"] = parse_cpulist(local_cpulist)
    return treegen.build_tree(str(root), spec)


def plan(tree, **kwargs):
    nic = read_nic({"interface": "ens21f0np0"}, procfs=tree.proc, sysfs=tree.sys)
    return plan_affinity(nic, read_topology(tree.sys, tree.proc), **kwargs)


def test_a_local_cpulist_narrower_than_the_node_is_preferred_over_the_rest_of_the_node(tmp_path):
    tree = gpu_tree(tmp_path / "t", local_cpulist="60-65,156-161")
    result = plan(tree, count=8)
    # Highest local cores first, all inside local_cpulist; node distance alone would take 68-71,164-167 (node 5 too).
    assert result.cpus == [62, 63, 64, 65, 158, 159, 160, 161]
    assert not any("not NUMA-local" in w for w in result.warnings)
    # Queues land on the local CPUs, written as such in the plan.
    assert all(set(i.after) <= set(result.cpus) for i in result.items if i.kind == "queue")


def test_local_cpus_come_first_when_the_node_distance_table_is_unreadable(tmp_path):
    tree = gpu_tree(tmp_path / "t")
    for path in glob.glob(os.path.join(tree.sys, "devices/system/node/node*/distance")):
        os.remove(path)
    result = plan(tree, count=8)
    # Without distances every node is "distance unknown"; locality still picks node 5, not the machine's highest cores.
    assert result.cpus == [68, 69, 70, 71, 164, 165, 166, 167]
    assert not any("not NUMA-local" in w for w in result.warnings)


def test_remote_cpus_come_from_the_nearest_nodes_not_the_highest_numbered(tmp_path):
    """Found by ./run.sh mutants irq_placement: no test told node distance from "highest cores first" (the NIC sat
    on node 5, whose socket also holds the highest-numbered node 7)."""
    spec = treegen.gpu_node()
    spec["nics"][0]["numa_node"] = 1  # socket 0 (nodes 0-3 at distance 12); nodes 4-7 are at 32
    tree = treegen.build_tree(str(tmp_path / "t"), spec)
    nic = read_nic({"interface": "ens21f0np0"}, procfs=tree.proc, sysfs=tree.sys)
    topology = read_topology(tree.sys, tree.proc)
    result = plan_affinity(nic, topology, count=30)
    local = set(topology["numa_nodes"][1])
    assert len(set(result.cpus) & local) == 24
    # 6 more CPUs (3 cores): the highest cores of the nearest node with the highest CPUs (node 3), never socket 1.
    assert sorted(set(result.cpus) - local) == [45, 46, 47, 141, 142, 143]
