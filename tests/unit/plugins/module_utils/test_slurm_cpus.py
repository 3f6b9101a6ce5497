# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Linux CPU ids <-> Slurm abstract CPU ids over real captures (tests/unit/fixtures/slurm, provenance in its README).

Expected values are worked out by hand from the rule in the README ("What Slurm's source says"):
abstract = ((socket * cores_per_socket) + core) * threads_per_core + thread, sockets and the cores in
a socket in hwloc logical order (lowest CPU first, through Die/L3/Group; L1/L2 are filtered by slurmd),
thread = rank of the Linux id in its core.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import (
    SlurmCpuError,
    abstract_to_os,
    core_spec_abstract,
    core_spec_cpus,
    cpu_spec_list,
    os_to_abstract,
    whole_cores,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.scontrol import node_spec, parse_scontrol_nodes, spec_os_cpus
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.sysfs import read_slurm_topology
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.topology import parse_lscpu, topology_from_dict, topology_view

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def _text(*parts):
    return FIXTURES.joinpath(*parts).read_text(encoding="utf-8")


def _hwloc_tree(tmp_path, name):
    """Extract the CPU part of an hwloc sysfs dump (regular files and directories only); return its sys path."""
    wanted = re.compile(r"^[^/]+/(sys/devices/system/(cpu|node)(/.*)?|sys/devices/cpu_(core|atom)(/.*)?|proc(/cpuinfo)?|sys|sys/devices)$")
    with tarfile.open(FIXTURES / "sysfs" / ("hwloc_%s.tar.bz2" % name)) as archive:
        members = [m for m in archive.getmembers()
                   if (m.isfile() or m.isdir()) and wanted.match(m.name) and ".." not in m.name and not m.name.startswith("/")]
        archive.extractall(tmp_path, members=members)  # nosec - members filtered above
    (top,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return str(top / "sys")


def _console_pus(name):
    """hwloc's own lstopo output for the dump: Linux ids of the PUs in logical (L#) order."""
    pus = re.findall(r"PU L#(\d+) \(P#(\d+)\)", _text("sysfs", "hwloc_%s.console" % name))
    return [int(p) for dummy, p in sorted((int(index), p) for index, p in pus)]


def _roundtrip(view):
    every = sorted(view["os_to_abstract"])
    assert abstract_to_os(view, os_to_abstract(view, every)) == every
    assert os_to_abstract(view, abstract_to_os(view, list(range(view["cpus"])))) == list(range(view["cpus"]))
    assert sorted(view["abstract_to_os"]) == every


# --------------------------------------------------------------------------- sysfs dumps of real machines


def test_two_socket_xeon_i_i_plus_16_from_sysfs(tmp_path):
    # Supermicro X11DPG, 2x Xeon Silver 4108: socket 0 = 0-7,16-23, socket 1 = 8-15,24-31, core k = (k, k+16).
    view = read_slurm_topology(_hwloc_tree(tmp_path, "32intel64-2p8co2t+8ve"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"], view["cpus"]) == (2, 8, 2, 32)
    # OS k -> 2k, k+16 -> 2k+1 (socket 0); 8+j -> 16+2j, 24+j -> 17+2j (socket 1)
    assert os_to_abstract(view, [0]) == [0]
    assert os_to_abstract(view, [16]) == [1]
    assert os_to_abstract(view, [1]) == [2]
    assert os_to_abstract(view, [7, 23]) == [14, 15]
    assert os_to_abstract(view, [8]) == [16]
    assert os_to_abstract(view, [24]) == [17]
    assert os_to_abstract(view, "15,31") == [30, 31]
    assert abstract_to_os(view, "0-3") == [0, 1, 16, 17]
    assert abstract_to_os(view, [16, 17]) == [8, 24]
    # hwloc's own logical order for this dump agrees (L1/L2 here are per core, so slurmd's filtering changes nothing)
    assert view["abstract_to_os"] == _console_pus("32intel64-2p8co2t+8ve")
    _roundtrip(view)


def test_irq_cpus_to_cpu_spec_list_and_the_siblings_whole_cores_add(tmp_path):
    view = read_slurm_topology(_hwloc_tree(tmp_path, "32intel64-2p8co2t+8ve"))
    every, extra = whole_cores(view, "0-3")
    assert every == [0, 1, 2, 3, 16, 17, 18, 19]
    assert extra == [16, 17, 18, 19]
    spec = cpu_spec_list(view, "0-3")
    assert spec["cpu_spec_list"] == "0-7"  # abstract 0,2,4,6 and their siblings 1,3,5,7
    assert spec["abstract"] == [0, 2, 4, 6]
    assert spec["os_cpus"] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert spec["extra_os_cpus"] == [16, 17, 18, 19]
    assert (spec["cores"], spec["cpus_effective"]) == (4, 24)
    # IRQs on the second socket: 8,9 are abstract 16,18
    spec = cpu_spec_list(view, [8, 9])
    assert spec["cpu_spec_list"] == "16-19"
    assert spec["extra_os_cpus"] == [24, 25]
    # both threads given: nothing extra
    assert whole_cores(view, [0, 16]) == ([0, 16], [])
    # CPUs=16 (cores only) on this SMT node: the ids are core indices
    spec = cpu_spec_list(view, "0-3", cpus_are_cores=True)
    assert (spec["cpu_spec_list"], spec["cpus_effective"]) == ("0-3", 12)


def test_core_spec_count_on_a_real_topology_takes_the_last_cores_of_the_last_sockets(tmp_path):
    view = read_slurm_topology(_hwloc_tree(tmp_path, "32intel64-2p8co2t+8ve"))
    # socket 1 core 7 = abstract 30,31 = OS 15,31; socket 0 core 7 = abstract 14,15 = OS 7,23
    reserved = core_spec_cpus(view, 2)
    assert reserved["abstract"] == [14, 15, 30, 31]
    assert reserved["cpu_spec_list"] == "14-15,30-31"
    assert reserved["os_cpus"] == [7, 15, 23, 31]
    first = core_spec_cpus(view, 3, spec_cores_first=True)
    assert first["abstract"] == [0, 1, 2, 3, 16, 17]
    assert first["os_cpus"] == [0, 1, 8, 16, 17, 24]


def test_four_socket_interleaved_with_mask_only_siblings(tmp_path):
    # 4x Xeon 2.6 GHz (old kernel: thread_siblings mask, no _list, no online file): package = cpu % 4,
    # core of socket s = (s, s+8) then (s+4, s+12). OS s -> 4s, s+8 -> 4s+1, s+4 -> 4s+2, s+12 -> 4s+3.
    view = read_slurm_topology(_hwloc_tree(tmp_path, "16em64t-4s2c2t"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (4, 2, 2)
    assert os_to_abstract(view, [1]) == [4]
    assert os_to_abstract(view, [9]) == [5]
    assert os_to_abstract(view, [5]) == [6]
    assert os_to_abstract(view, [13]) == [7]
    assert os_to_abstract(view, [3, 15]) == [12, 15]
    assert view["abstract_to_os"] == _console_pus("16em64t-4s2c2t")
    assert any("online is unreadable" in note for note in view["notes"])
    _roundtrip(view)


def test_cores_follow_the_lowest_cpu_not_core_id_nor_lstopo_l2_order(tmp_path):
    # Dell PowerEdge 2950, 2x Xeon E5345 (no SMT): package = cpu % 2; socket 0 CPUs 0,2,4,6 with core_id 0,2,1,3,
    # two cores per L2. slurmd filters L2, so socket 0's cores are ordered 0,2,4,6 (lstopo, which keeps L2, shows 0,4,2,6).
    view = read_slurm_topology(_hwloc_tree(tmp_path, "8em64t-2s2ca2c"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (2, 4, 1)
    assert view["abstract_to_os"] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert os_to_abstract(view, [4]) == [2]
    assert _console_pus("8em64t-2s2ca2c") == [0, 4, 2, 6, 1, 5, 3, 7]
    assert core_spec_cpus(view, 2)["os_cpus"] == [6, 7]


def test_amd_compute_units_are_separate_cores_as_hwloc_counts_them(tmp_path):
    # Dell C6145, 4x Opteron 6276 (family 21): sysfs pairs 0-1 as siblings with core_id 0 and 1.
    sys_dir = _hwloc_tree(tmp_path, "64amd64-4s2n4ca2co")
    view = read_slurm_topology(sys_dir)
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (4, 16, 1)
    assert view["abstract_to_os"] == list(range(64)) == _console_pus("64amd64-4s2n4ca2co")
    assert whole_cores(view, [0]) == ([0], [])
    assert any("compute units" in note for note in view["notes"])
    assert any("more than one NUMA node" in note for note in view["notes"])
    # without /proc/cpuinfo the pairs read as SMT siblings, as lscpu shows them
    empty = tmp_path / "noproc"
    empty.mkdir()
    smt = read_slurm_topology(sys_dir, procfs=str(empty))
    assert (smt["sockets"], smt["cores_per_socket"], smt["threads_per_core"]) == (4, 8, 2)
    assert whole_cores(smt, [0]) == ([0, 1], [1])
    # NUMA nodes as sockets (SlurmdParameters=numa_node_as_socket, or hwloc 1.x): 8 sockets of 8 cores
    numa = read_slurm_topology(sys_dir, socket_by="numa_node")
    assert (numa["sockets"], numa["cores_per_socket"], numa["threads_per_core"]) == (8, 8, 1)
    assert numa["socket_cpus"][1] == list(range(8, 16))


def test_offline_cpus_make_the_node_not_uniform(tmp_path):
    # Dell R630, CPUs 0-3 and 21-23 offline: socket 0 keeps 9 cores, socket 1 keeps 8.
    with pytest.raises(SlurmCpuError) as err:
        read_slurm_topology(_hwloc_tree(tmp_path, "offline-cpu0-node0"))
    assert "not uniform" in str(err.value)
    assert "socket 0 (CPUs 4,6,8,10,12,14,16,18,20): 9" in str(err.value)
    assert isinstance(err.value, DetailedError)
    assert err.value.expected == "the same number of cores in every socket"


def test_hybrid_cpu_is_refused_until_restricted_to_its_p_cores(tmp_path):
    # Core i7-1370P: 6 P-cores with SMT (0-11, siblings adjacent) and 8 E-cores (12-19)
    sys_dir = _hwloc_tree(tmp_path, "20em64t-hybrid-1p6c2t+2ca4co1t")
    with pytest.raises(SlurmCpuError) as err:
        read_slurm_topology(sys_dir)
    assert "cores have 1 and 2 threads" in str(err.value)
    view = read_slurm_topology(sys_dir, only_cpus="0-11")
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (1, 6, 2)
    assert view["abstract_to_os"] == list(range(12))
    with pytest.raises(SlurmCpuError) as err:
        os_to_abstract(view, [12])
    assert "CPU 12 is not in only_cpus" in str(err.value)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def test_e_cores_marked_in_sysfs_are_dropped_as_slurmd_does(tmp_path):
    # inline tree: 2 P-cores with SMT (0-1, 2-3) and 2 E-cores (4, 5), marked by devices/cpu_core and cpu_atom
    root = tmp_path / "sys"
    cpu_dir = str(root / "devices/system/cpu")
    _write(os.path.join(cpu_dir, "online"), "0-5")
    for cpu, siblings in ((0, "0-1"), (1, "0-1"), (2, "2-3"), (3, "2-3"), (4, "4"), (5, "5")):
        _write(os.path.join(cpu_dir, "cpu%d/topology/physical_package_id" % cpu), "0")
        _write(os.path.join(cpu_dir, "cpu%d/topology/core_id" % cpu), str(cpu // 2 if cpu < 4 else cpu))
        _write(os.path.join(cpu_dir, "cpu%d/topology/thread_siblings_list" % cpu), siblings)
    _write(str(root / "devices/cpu_core/cpus"), "0-3")
    _write(str(root / "devices/cpu_atom/cpus"), "4-5")
    view = read_slurm_topology(str(root))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (1, 2, 2)
    assert sorted(view["excluded"]) == [4, 5]
    with pytest.raises(SlurmCpuError) as err:
        os_to_abstract(view, [5])
    assert "E-core" in str(err.value) and "allow_ecores" in str(err.value)
    with pytest.raises(SlurmCpuError):
        read_slurm_topology(str(root), allow_ecores=True)


def test_missing_sysfs_and_package_id_are_errors(tmp_path):
    with pytest.raises(SlurmCpuError) as err:
        read_slurm_topology(str(tmp_path / "nope"))
    assert err.value.expected == "a sysfs root with devices/system/cpu"
    cpu_dir = str(tmp_path / "sys/devices/system/cpu")
    _write(os.path.join(cpu_dir, "online"), "0")
    _write(os.path.join(cpu_dir, "cpu0/topology/physical_package_id"), "-1")
    with pytest.raises(SlurmCpuError) as err:
        read_slurm_topology(str(tmp_path / "sys"))
    assert "cpu0 has no package id" in str(err.value)


# --------------------------------------------------------------------------- lscpu captures


def test_two_socket_epyc_lscpu_p_i_i_plus_48():
    # AMD EPYC 7451 x2 (util-linux test dump): socket 0 = 0-23,48-71, socket 1 = 24-47,72-95, core k = (k, k+48)
    view = parse_lscpu(_text("lscpu", "util-linux_lscpu-x86_64-epyc_7451.txt"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (2, 24, 2)
    assert os_to_abstract(view, [0, 48]) == [0, 1]
    assert os_to_abstract(view, [23]) == [46]
    assert os_to_abstract(view, [71]) == [47]
    assert os_to_abstract(view, [24]) == [48]
    assert os_to_abstract(view, [72]) == [49]
    assert os_to_abstract(view, [95]) == [95]
    # a NIC on NUMA node 4 (CPUs 24-29,72-77), IRQs on 24-27
    spec = cpu_spec_list(view, "24-27")
    assert spec["abstract"] == [48, 50, 52, 54]
    assert spec["cpu_spec_list"] == "48-55"
    assert spec["extra_os_cpus"] == [72, 73, 74, 75]
    _roundtrip(view)


def test_socket_by_changes_what_core_spec_count_takes_on_the_epyc():
    text = _text("lscpu", "util-linux_lscpu-x86_64-epyc_7451.txt")
    package = parse_lscpu(text)
    numa = parse_lscpu(text, socket_by="numa_node")
    l3 = parse_lscpu(text, socket_by="l3cache")
    assert (numa["sockets"], numa["cores_per_socket"], numa["threads_per_core"]) == (8, 6, 2)
    assert (l3["sockets"], l3["cores_per_socket"], l3["threads_per_core"]) == (16, 3, 2)
    # the NUMA nodes and L3s are runs of the first-thread numbering, so the ids themselves do not move here
    assert numa["abstract_to_os"] == package["abstract_to_os"] == l3["abstract_to_os"]
    # but CoreSpecCount=2 does: package -> last core of sockets 1 and 0 (OS 47,95 and 23,71);
    # NUMA sockets -> last core of NUMA nodes 7 and 6 (abstract 94,95 and 82,83 = OS 47,95 and 41,89)
    assert core_spec_cpus(package, 2)["os_cpus"] == [23, 47, 71, 95]
    assert core_spec_cpus(numa, 2)["os_cpus"] == [41, 47, 89, 95]
    assert core_spec_cpus(numa, 2)["cpu_spec_list"] == "82-83,94-95"


def test_four_socket_xeon_x7550_interleaved_lscpu_p():
    # 4x Xeon X7550: socket s = CPUs s, s+4, ..., s+60; core (s+4c, s+4c+32). OS s+4c -> ((8s)+c)*2
    view = parse_lscpu(_text("lscpu", "util-linux_lscpu-x86_64-64cpu.txt"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (4, 8, 2)
    assert os_to_abstract(view, [1]) == [16]
    assert os_to_abstract(view, [33]) == [17]
    assert os_to_abstract(view, [5]) == [18]
    assert os_to_abstract(view, [62]) == [47]
    assert os_to_abstract(view, [63]) == [63]
    assert abstract_to_os(view, "0-3") == [0, 4, 32, 36]
    _roundtrip(view)


def test_adjacent_smt4_numbering_is_the_identity():
    # POWER7, 4 sockets of 1 core with 4 threads numbered 0-3, 4-7, ...
    view = parse_lscpu(_text("lscpu", "util-linux_lscpu-ppc64-POWER7.txt"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (4, 1, 4)
    assert view["abstract_to_os"] == list(range(16))
    assert whole_cores(view, [1]) == ([0, 1, 2, 3], [0, 2, 3])
    assert cpu_spec_list(view, [5])["cpu_spec_list"] == "4-7"


def test_lscpu_e_russian_and_lscpu_p_of_the_same_two_socket_node_agree():
    # 2x Xeon E5410 (no SMT), sockets interleaved: socket 0 = 0,2,4,6 -> 0-3, socket 1 = 1,3,5,7 -> 4-7
    e = parse_lscpu(_text("lscpu", "netutils-linux_issue169_xeon_e5410_2s_lscpu-e_ru.txt"))
    p = parse_lscpu(_text("lscpu", "netutils-linux_issue169_xeon_e5410_2s_lscpu-p.txt"))
    assert e["abstract_to_os"] == p["abstract_to_os"] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert (e["sockets"], e["cores_per_socket"], e["threads_per_core"]) == (2, 4, 1)
    assert os_to_abstract(e, [1]) == [4]


def test_sparse_cpu_ids_are_refused():
    # UltraSparc II with CPUs 6,7,10,11,14,15: slurmd's block map skips machine ids >= the CPU count
    with pytest.raises(SlurmCpuError) as err:
        parse_lscpu(_text("lscpu", "util-linux_lscpu-sparc64.txt"))
    assert "CPU 15 is not below the 6 CPUs" in str(err.value)
    assert err.value.value == "6-7,10-11,14-15"


def test_lscpu_of_amd_compute_units_reads_as_smt():
    # Opteron 6328 guest: lscpu -p pairs 0,1 on a core; hwloc would split them (see the sysfs test above)
    view = parse_lscpu(_text("lscpu", "util-linux_lscpu-vmware_fpe.txt"))
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (2, 4, 2)
    assert view["abstract_to_os"] == list(range(16))


@pytest.mark.parametrize("text,message", [
    ("", "no lscpu -p header"),
    ("# CPU,Node\n0,0\n", "has no Core column"),
    ("# CPU,Core,Socket\n0,0\n", "has 2 fields, the header 3"),
    ("# CPU,Core,Socket\n0,0,0\n0,1,0\n", "CPU 0 appears twice"),
    ("# CPU,Core,Socket\n0,x,0\n", "is 'x'"),
    ("CPU SOCKET CORE\n0 0\n", "has 2 fields, the header 3"),
])
def test_bad_lscpu_text_names_the_value(text, message):
    with pytest.raises(SlurmCpuError) as err:
        parse_lscpu(text)
    assert message in str(err.value)


# --------------------------------------------------------------------------- topologies given as data


def test_dict_topology_groups_and_per_cpu_forms():
    grouped = topology_from_dict({"sockets": ["0-3,8-11", "4-7,12-15"], "cores": ["%d,%d" % (c, c + 8) for c in range(8)]})
    per_cpu = topology_from_dict([{"cpu": c, "socket": (c % 8) // 4, "core": c % 8} for c in range(16)])
    assert grouped["abstract_to_os"] == per_cpu["abstract_to_os"] == [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
    assert os_to_abstract(grouped, [4, 12]) == [8, 9]


def test_l3_groups_order_the_cores_of_a_socket():
    # one socket whose L3 caches hold cores {0,2} and {1,3}: hwloc walks L3 #0 (lowest CPU 0) first
    view = topology_from_dict({"sockets": ["0-3"], "cores": ["0", "1", "2", "3"], "l3cache": ["0,2", "1,3"]})
    assert view["abstract_to_os"] == [0, 2, 1, 3]
    flat = topology_from_dict({"sockets": ["0-3"], "cores": ["0", "1", "2", "3"]})
    assert flat["abstract_to_os"] == [0, 1, 2, 3]


@pytest.mark.parametrize("data,message", [
    ({"sockets": ["0-3", "4-9"], "cores": ["%d" % c for c in range(10)]}, "not uniform: the sockets have different core counts"),
    ({"sockets": ["0-3"], "cores": ["0-1", "1-3"]}, "CPU 1 is in two cores"),
    ({"sockets": ["0-3"], "cores": ["0-1"]}, "CPUs 2-3 are in a socket but in no core"),
    ({"sockets": ["0-1", "2-3"], "cores": ["0,2", "1,3"]}, "spans 2 package groups"),
    ({"sockets": ["0-x"], "cores": ["0"]}, "is not a CPU list"),
    ([], "non-empty list"),
    ([{"cpu": 0, "socket": 0}], "no non-negative integer core"),
])
def test_bad_topologies_are_refused(data, message):
    with pytest.raises(SlurmCpuError) as err:
        topology_from_dict(data)
    assert message in str(err.value)


def test_cpus_the_node_does_not_have_are_named():
    view = topology_from_dict({"sockets": ["0-47,96-143", "48-95,144-191"], "cores": ["%d,%d" % (c, c + 96) for c in range(96)]})
    with pytest.raises(SlurmCpuError) as err:
        os_to_abstract(view, "190-200")
    assert str(err.value) == "CPU 192 is not an online CPU of this node (online: 0-191)"
    assert err.value.value == 192
    with pytest.raises(SlurmCpuError) as err:
        abstract_to_os(view, [192])
    assert "abstract CPU id 192 is not below the node's 192 CPUs" in str(err.value)
    with pytest.raises(SlurmCpuError) as err:
        whole_cores(view, "1-")
    assert "is not a CPU list" in str(err.value)


def test_published_cpu_spec_list_0_31_means_16_cores_with_their_siblings():
    # NCCLab amax-a100 (2 sockets x 64 cores x 2 threads, CPUs=256) reserves CPUSpecList=0-31 and publishes TRES cpu=224.
    text = _text("slurm_conf", "ncclab_amax-a100_excerpt.conf")
    value = re.search(r"CPUSpecList=(\S+)", text).group(1)
    tres = int(re.search(r"TRES=cpu=(\d+)", text).group(1))
    # assuming the usual EPYC numbering (sibling of k is k+128, socket 0 = 0-63,128-191)
    view = topology_from_dict({"sockets": ["0-63,128-191", "64-127,192-255"], "cores": ["%d,%d" % (c, c + 128) for c in range(128)]})
    reserved = abstract_to_os(view, value)
    assert reserved == list(range(0, 16)) + list(range(128, 144))  # not Linux CPUs 0-31
    assert view["cpus"] - len(reserved) == tres
    assert cpu_spec_list(view, reserved)["cpu_spec_list"] == "0-31"


# --------------------------------------------------------------------------- scontrol show node


def test_multi_line_and_one_line_forms_parse_alike():
    long_form = parse_scontrol_nodes(_text("scontrol", "show_node_d_3nodes_23.11.3_nvml_report.txt"))
    one_line = parse_scontrol_nodes(_text("scontrol", "show_node_o_3nodes_23.11.3_nvml_report.txt"))
    assert [n["NodeName"] for n in long_form] == [n["NodeName"] for n in one_line] == ["master", "worker1", "worker2"]
    for a, b in zip(long_form, one_line):
        assert a.pop("GresDrain") == "N/A"  # -d only
        assert a.pop("GresUsed") == "gpu:quadro_p1000:0(IDX:N/A)"
        assert a == b
    worker1 = one_line[1]
    assert worker1["OS"] == "Linux 5.14.0-611.20.1.el9_7.x86_64 #1 SMP PREEMPT_DYNAMIC Thu Jan 15 13:21:39 UTC 2026"
    assert worker1["Partitions"] == "debug,gpu"
    assert worker1["CfgTRES"] == "cpu=20,mem=62715M,billing=20"
    assert worker1["AllocTRES"] == ""
    assert worker1["Gres"] == "gpu:quadro_p1000:1(S:0)"
    assert worker1["ExtSensorsTemp"] == "n/a"
    spec = node_spec(worker1)
    assert (spec["cpu_tot"], spec["cpu_efctv"], spec["sockets"], spec["cores_per_socket"], spec["threads_per_core"]) == (20, 20, 1, 10, 2)
    assert (spec["core_spec_count"], spec["cpu_spec_list"], spec["cpu_spec_list_text"], spec["mem_spec_limit"]) == (0, [], None, 0)


def test_core_spec_count_2_reported_as_71_95_is_reproduced():
    # unige bamboo gpu010 (EPYC 9654, Slurm 25.11.3): Sockets=4 CoresPerSocket=24 ThreadsPerCore=1, CoreSpecCount=2
    (node,) = parse_scontrol_nodes(_text("scontrol", "show_node_gpu010_25.11.3_unige_bamboo_noindent.txt"))
    assert node["Reason"] == "health_ps___blocked [root@2026-04-29T03:06:18]"
    assert node["OS"] == "Linux 5.14.0-570.58.1.el9_6.x86_64 #1 SMP PREEMPT_DYNAMIC Fri Oct 31 13:55:05 UTC 2025"
    assert node["Gres"] == "gpu:nvidia_geforce_rtx_5090:4(S:0-3),VramPerGpu:no_consume:32G"
    spec = node_spec(node)
    assert spec["cpu_spec_list"] == [71, 95]
    assert (spec["core_spec_count"], spec["cpu_tot"], spec["cpu_efctv"]) == (2, 96, 94)
    # last core (23) of socket 3 = ((3*24)+23)*1 = 95, then last core of socket 2 = ((2*24)+23) = 71: abstract ids
    picked = core_spec_abstract(spec["sockets"], spec["cores_per_socket"], spec["threads_per_core"], spec["core_spec_count"])
    assert picked == spec["cpu_spec_list"]
    assert spec["cpu_tot"] - len(picked) == spec["cpu_efctv"]
    # with the topology known (here: 4 NUMA-node sockets of 24 contiguous CPUs, SMT off) the Linux CPUs are 71 and 95
    view = topology_from_dict({"sockets": ["0-23", "24-47", "48-71", "72-95"], "cores": [str(c) for c in range(96)]})
    assert core_spec_cpus(view, 2) == {"cpu_spec_list": "71,95", "abstract": [71, 95], "os_cpus": [71, 95]}
    assert spec_os_cpus(view, spec) == [71, 95]


def test_core_spec_count_16_on_a_two_socket_smt_node_reports_abstract_ids():
    (node,) = parse_scontrol_nodes(_text("scontrol", "show_node_rcl-nv2_b200_partial.txt"))
    spec = node_spec(node)
    assert spec["cpu_spec_list_text"] == "96-111,208-223"
    assert (spec["core_spec_count"], spec["mem_spec_limit"], spec["spec_unit"]) == (16, 65536, "cpu")
    # 8 last cores of each socket, both threads: socket 0 cores 48-55 = abstract 96-111, socket 1 = 208-223
    picked = core_spec_abstract(2, 56, 2, 16)
    assert format_cpulist(picked) == "96-111,208-223"
    assert spec["cpu_tot"] - len(picked) == spec["cpu_efctv"] == 192
    # on the usual i/i+112 numbering of 2x 56-core Xeons those are Linux CPUs 48-55,104-111 and their siblings
    view = topology_from_dict({"sockets": ["0-55,112-167", "56-111,168-223"], "cores": ["%d,%d" % (c, c + 112) for c in range(112)]})
    reserved = spec_os_cpus(view, spec)
    assert format_cpulist(reserved) == "48-55,104-111,160-167,216-223"
    assert set(reserved) != set(parse_cpulist("96-111,208-223"))


def test_22_05_nodes_with_core_spec_count_1():
    nodes = parse_scontrol_nodes(_text("scontrol", "show_node_dccn-c083_22.05.10.txt") + "\n" + _text("scontrol", "show_node_dccn-c084_22.05.10.txt"))
    assert [n["NodeName"] for n in nodes] == ["dccn-c083", "dccn-c084"]
    assert nodes[0]["Version"] == "22.05.10"
    assert nodes[1]["AllocTRES"] == ""
    assert nodes[0]["AllocTRES"] == "cpu=2,mem=104G,gres/gpu=1,gres/gpu:nvidia_a100-sxm4-40gb=1"
    spec = node_spec(nodes[0])
    assert (spec["sockets"], spec["cores_per_socket"], spec["threads_per_core"]) == (2, 32, 1)
    assert (spec["core_spec_count"], spec["cpu_spec_list"], spec["mem_spec_limit"]) == (1, [63], 4096)
    assert core_spec_abstract(2, 32, 1, 1) == [63]


def test_gpu009_of_the_same_thread_parses_too():
    (node,) = parse_scontrol_nodes(_text("scontrol", "show_node_gpu009_25.11.3_unige_bamboo_noindent.txt"))
    assert node["NodeName"] == "gpu009"
    assert node["FreeMem"] == "185260"
    assert node["LastBusyTime"] == "2026-04-29T12:48:47"
    assert node["ResumeAfterTime"] == "None"


def test_free_text_values_keep_known_keys_already_seen_as_text():
    # inline text in scontrol's layout: a Reason that quotes a field name and an unknown future key
    text = ("NodeName=n1 CPUTot=4 State=DOWN+DRAIN ThreadsPerCore=1 NewField=x y Sockets=1 CoresPerSocket=4 "
            "Reason=State=ALLOCATED seen, CPUTot=8 wanted [root@2026-01-01T00:00:00]\n")
    (node,) = parse_scontrol_nodes(text)
    assert node["State"] == "DOWN+DRAIN"
    assert node["NewField"] == "x y"
    assert node["Reason"] == "State=ALLOCATED seen, CPUTot=8 wanted [root@2026-01-01T00:00:00]"
    assert node_spec(node)["cpu_tot"] == 4


def test_cores_only_node_reports_core_ids():
    text = "NodeName=n1 CPUTot=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=2 CoreSpecCount=2 CPUSpecList=6-7\n"
    spec = node_spec(parse_scontrol_nodes(text)[0])
    assert spec["spec_unit"] == "core"
    view = topology_from_dict({"sockets": ["0-15"], "cores": ["%d,%d" % (c, c + 8) for c in range(8)]})
    assert spec_os_cpus(view, spec) == [6, 7, 14, 15]


@pytest.mark.parametrize("text,message", [
    ("$ scontrol show node\nNodeName=n1 CPUTot=4\n", "comes before any NodeName="),
    ("NodeName=n1 CPUTot=4 CPUTot=8\n", "key CPUTot appears twice for node n1"),
])
def test_bad_scontrol_text_is_refused(text, message):
    with pytest.raises(SlurmCpuError) as err:
        parse_scontrol_nodes(text)
    assert message in str(err.value)


def test_empty_outputs_and_bad_numbers():
    assert parse_scontrol_nodes("") == []
    assert parse_scontrol_nodes("No nodes in the system\n") == []
    with pytest.raises(SlurmCpuError) as err:
        node_spec(parse_scontrol_nodes("NodeName=n1 CPUTot=four\n")[0])
    assert "CPUTot=four of node n1 is not a whole number" in str(err.value)


def test_reported_topology_must_match():
    view = topology_from_dict({"sockets": ["0-3"], "cores": ["0", "1", "2", "3"]})
    spec = node_spec(parse_scontrol_nodes("NodeName=n1 CPUTot=4 Sockets=2 CoresPerSocket=2 ThreadsPerCore=1 CPUSpecList=3\n")[0])
    with pytest.raises(SlurmCpuError) as err:
        spec_os_cpus(view, spec)
    assert "reports Sockets=2 CoresPerSocket=2 ThreadsPerCore=1 but the topology has 1 sockets, 4 cores per socket" in str(err.value)


@pytest.mark.parametrize("args,message", [
    ((2, 8, 2, 16), "CoreSpecCount=16 leaves no core of the 16"),
    ((2, 8, 0, 1), "threads_per_core 0 is not a positive integer"),
    ((2, 8, 2, -1), "CoreSpecCount -1 is not"),
])
def test_bad_core_spec_counts(args, message):
    with pytest.raises(SlurmCpuError) as err:
        core_spec_abstract(*args)
    assert message in str(err.value)


# --------------------------------------------------------------------------- the forms the slurm_cpuspec module passes


def test_topology_view_takes_lscpu_parse_cpu_core_socket():
    # what the role runs: lscpu --parse=CPU,CORE,SOCKET; here the first three columns of the EPYC 7451 capture
    full = _text("lscpu", "util-linux_lscpu-x86_64-epyc_7451.txt").split("\n\n")[1]
    rows = [line.split(",")[:3] for line in full.splitlines() if line and not line.startswith("#")]
    text = "# CPU,Core,Socket\n" + "".join(",".join(r) + "\n" for r in rows)
    view = topology_view({"lscpu": text}, name="epyc")
    assert (view["sockets"], view["cores_per_socket"], view["threads_per_core"]) == (2, 24, 2)
    assert os_to_abstract(view, [24, 72]) == [48, 49]
    assert whole_cores(view, "24-27") == ([24, 25, 26, 27, 72, 73, 74, 75], [72, 73, 74, 75])
    spec = cpu_spec_list(view, "24-27")
    assert spec["os_cpus"] == [24, 25, 26, 27, 72, 73, 74, 75]
    assert spec["extra_os_cpus"] == [72, 73, 74, 75]
    assert spec["cpu_spec_list"] == "48-55"
    assert spec["cores"] == 4


def test_topology_view_counts_mean_slurm_numbering_and_errors_name_the_node(tmp_path):
    view = topology_view({"sockets": 2, "cores_per_socket": 2, "threads_per_core": 2})
    assert view["abstract_to_os"] == list(range(8))
    assert whole_cores(view, [4]) == ([4, 5], [5])
    assert topology_view({"sysfs": _hwloc_tree(tmp_path, "8em64t-2s2ca2c")})["abstract_to_os"] == [0, 2, 4, 6, 1, 3, 5, 7]
    per_cpu = topology_view({"cores": [{"cpu": c, "package": c % 2, "core_id": c // 2} for c in range(4)]})
    assert per_cpu["abstract_to_os"] == [0, 2, 1, 3]
    with pytest.raises(SlurmCpuError) as err:
        topology_view({"siblings": [[0, 1]], "online": [0, 1]}, name="gpu001")
    assert str(err.value).startswith("node gpu001: the topology has SMT sibling groups but no sockets")
    with pytest.raises(SlurmCpuError) as err:
        topology_view({"lscpu": "garbage"}, name="gpu002")
    assert str(err.value).startswith("node gpu002: no lscpu -p header")
    assert err.value.expected == "the output of lscpu -p or lscpu -e"
