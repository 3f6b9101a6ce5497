# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""read_topology over generated trees of real machine shapes."""

from __future__ import annotations

import os

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology, sibling_map


@pytest.mark.parametrize("shape,online,groups,first_group,nodes", [
    (treegen.seed_vm, 176, 88, [0, 88], {0: 88, 1: 88}),
    (treegen.gpu_node, 192, 96, [0, 96], dict((n, 24) for n in range(8))),
    (treegen.lab_virtio, 8, 4, [0, 1], {0: 4, 1: 4}),
])
def test_siblings_and_nodes_come_from_sysfs_not_from_numbering(tmp_path, shape, online, groups, first_group, nodes):
    tree = treegen.build_tree(tmp_path, shape())
    topo = read_topology(tree.sys, tree.proc)
    assert len(topo["online"]) == online
    assert len(topo["siblings"]) == groups
    assert topo["siblings"][0] == first_group
    assert dict((n, len(c)) for n, c in topo["numa_nodes"].items()) == nodes
    assert sorted(c for g in topo["siblings"] for c in g) == topo["online"]


def test_irregular_sibling_numbering_is_read_as_is(tmp_path):
    spec = {"cpus": 6, "siblings": [[0, 3], [1, 5], [2, 4]], "numa": {0: [0, 1, 2, 3, 4, 5]}}
    tree = treegen.build_tree(tmp_path, spec)
    topo = read_topology(tree.sys, tree.proc)
    assert topo["siblings"] == [[0, 3], [1, 5], [2, 4]]
    assert sibling_map(topo)[4] == [2, 4]


def test_offline_cpus_isolated_nohz_and_default_affinity(tmp_path):
    spec = treegen.lab_virtio()
    spec.update(offline=[7], isolated=[2, 3], nohz_full=[2, 3], default_smp_affinity=[0, 1])
    tree = treegen.build_tree(tmp_path, spec)
    topo = read_topology(tree.sys, tree.proc)
    assert topo["online"] == [0, 1, 2, 3, 4, 5, 6]
    assert topo["possible"] == list(range(8)) and topo["nr_cpu_ids"] == 8
    assert [6] in topo["siblings"] or [6, 7] in topo["siblings"]
    assert topo["isolated"] == [2, 3] and topo["nohz_full"] == [2, 3]
    assert topo["default_smp_affinity"] == [0, 1]


def test_gpu_node_distances_are_read(tmp_path):
    tree = treegen.build_tree(tmp_path, treegen.gpu_node())
    topo = read_topology(tree.sys, tree.proc)
    assert topo["numa_distances"][5] == [32, 32, 32, 32, 12, 10, 12, 12]
    assert topo["cpu_node"][101] == 0 and topo["cpu_node"][160] == 5


def test_missing_files_give_notes_not_errors(tmp_path):
    cpu = tmp_path / "sys/devices/system/cpu"
    (cpu / "cpu0").mkdir(parents=True)
    (cpu / "cpu1").mkdir()
    (tmp_path / "proc").mkdir()
    (cpu / "nohz_full").write_text("(null)\n")
    topo = read_topology(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert topo["online"] == [0, 1]
    assert topo["siblings"] == [[0], [1]]
    assert topo["nohz_full"] == []
    assert topo["numa_nodes"] == {} and topo["default_smp_affinity"] is None
    assert any("online is unreadable" in n for n in topo["notes"])
    assert os.path.isdir(str(cpu))
