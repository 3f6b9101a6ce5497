# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""slurm_cpuspec's sysfs reader, file by file: which file it takes when several say the same thing, and what it
does when one is missing, unreadable or names an offline CPU.

The trees are synthetic (built here, one file at a time, in the kernel's formats: ``Documentation/ABI/stable/
sysfs-devices-system-cpu`` and ``Documentation/ABI/testing/sysfs-devices-system-cpu``); the real topologies
(hwloc's captures) are in test_slurm_cpus.py. Written for #34: the mutation run left the readers' fallbacks
(``_online``, ``_cpu_record``, ``_l3_of``) unchecked; each test here states one fallback's outcome.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.sysfs import (
    _amd_compute_units, _cpu_record, _l3_of, _online, read_slurm_topology)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _cpu(tree, cpu, package=0, core_id=None, **topology):
    """cpuN/topology with physical_package_id and the given files (name -> text); an ``online`` file for N > 0."""
    base = tree / ("sys/devices/system/cpu/cpu%d" % cpu)
    base.mkdir(parents=True, exist_ok=True)
    if package is not None:
        _write(base / "topology/physical_package_id", str(package))
    else:
        (base / "topology").mkdir(parents=True, exist_ok=True)
    _write(base / "topology/core_id", str(cpu if core_id is None else core_id))
    for name, text in topology.items():
        _write(base / "topology" / name, text)
    return base


def _cache(base, index, level, shared_list=None, shared_map=None, kind="Unified"):
    cache = base / "cache" / ("index%d" % index)
    _write(cache / "level", str(level))
    if kind is not None:
        _write(cache / "type", kind)
    if shared_list is not None:
        _write(cache / "shared_cpu_list", shared_list)
    if shared_map is not None:
        _write(cache / "shared_cpu_map", shared_map)


def _cpu_dir(tree):
    return str(tree / "sys/devices/system/cpu")


# ------------------------------------------------------------------ online

def test_the_online_file_is_the_online_cpus_and_adds_no_note(tmp_path):
    for cpu in range(4):
        _cpu(tmp_path, cpu)
    _write(tmp_path / "sys/devices/system/cpu/online", "0-1,3")
    notes = []
    assert _online(_cpu_dir(tmp_path), "SYS", notes) == [0, 1, 3]
    assert notes == []


def test_without_the_online_file_the_cpu_directories_with_a_topology_that_are_not_offline(tmp_path):
    for cpu in (0, 1, 2, 3, 10):
        _cpu(tmp_path, cpu)
    _write(tmp_path / "sys/devices/system/cpu/cpu2/online", "0")
    _write(tmp_path / "sys/devices/system/cpu/cpu3/online", "1")
    (tmp_path / "sys/devices/system/cpu/cpu7").mkdir()  # no topology: not a present CPU
    (tmp_path / "sys/devices/system/cpu/cpufreq").mkdir()
    _write(tmp_path / "sys/devices/system/cpu/cpu9x/topology/core_id", "9")  # not cpuN
    notes = []
    assert _online(_cpu_dir(tmp_path), "SYS", notes) == [0, 1, 3, 10]
    assert notes == ["%s/online is unreadable; the cpuN directories with a topology were used" % _cpu_dir(tmp_path)]


def test_no_online_cpu_is_refused_naming_the_tree(tmp_path):
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    with pytest.raises(SlurmCpuError) as err:
        _online(_cpu_dir(tmp_path), "SYS", [])
    assert str(err.value) == "no online CPU under %s" % _cpu_dir(tmp_path)
    assert err.value.details["value"] == "SYS"
    assert err.value.details["expected"] == "a sysfs tree with online CPUs"


# ------------------------------------------------------------------ one CPU's record

def test_core_cpus_list_comes_before_thread_siblings_list_and_the_masks(tmp_path):
    _cpu(tmp_path, 0, core_cpus_list="0,2", thread_siblings_list="0-3", core_cpus="f", thread_siblings="f")
    record = _cpu_record(_cpu_dir(tmp_path), 0, {0, 1, 2, 3}, [])
    assert record["core"] == frozenset([0, 2])


@pytest.mark.parametrize("files, core", [
    ({"thread_siblings_list": "0,1", "core_cpus": "f", "thread_siblings": "f"}, [0, 1]),
    ({"core_cpus": "5", "thread_siblings": "f"}, [0, 2]),
    ({"thread_siblings": "0000000a,00000001"}, [0, 33, 35]),
    ({"core_cpus_list": "", "thread_siblings_list": "0,3"}, [0, 3]),
    ({"core_cpus": "zz", "thread_siblings": "3"}, [0, 1]),
])
def test_the_first_readable_sibling_file_wins(tmp_path, files, core):
    _cpu(tmp_path, 0, **files)
    notes = []
    record = _cpu_record(_cpu_dir(tmp_path), 0, set(range(64)), notes)
    assert sorted(record["core"]) == core
    assert notes == []


def test_siblings_are_only_the_online_ones_and_a_group_of_offline_cpus_is_the_cpu_itself(tmp_path):
    _cpu(tmp_path, 0, core_cpus_list="0-3")
    _cpu(tmp_path, 4, core_cpus_list="5-7")
    assert _cpu_record(_cpu_dir(tmp_path), 0, {0, 2, 4}, [])["core"] == frozenset([0, 2])
    assert _cpu_record(_cpu_dir(tmp_path), 4, {0, 2, 4}, [])["core"] == frozenset([4])


def test_no_sibling_file_makes_the_cpu_its_own_core_and_says_so(tmp_path):
    _cpu(tmp_path, 3, package=1, core_id=7)
    notes = []
    record = _cpu_record(_cpu_dir(tmp_path), 3, {3}, notes)
    assert record == {"core": frozenset([3]), "levels": {"package": 1}, "core_id": 7}
    assert notes == ["cpu3 has no readable sibling list; treated as its own core"]


def test_die_cluster_and_l3_levels_from_their_lists_or_masks(tmp_path):
    base = _cpu(tmp_path, 1, package=0, core_id=1, core_cpus_list="1,5", die_cpus_list="0-7", cluster_cpus="22")
    _cache(base, 0, 1, shared_list="1,5", kind="Data")
    _cache(base, 3, 3, shared_list="0-3")
    record = _cpu_record(_cpu_dir(tmp_path), 1, set(range(8)), [])
    assert record == {
        "core": frozenset([1, 5]),
        "levels": {"package": 0, "die": frozenset(range(8)), "cluster": frozenset([1, 5]),
                   "l3cache": frozenset([0, 1, 2, 3])},
        "core_id": 1,
    }


def test_die_and_cluster_masks_are_read_when_their_lists_are_missing_and_left_out_when_neither_is(tmp_path):
    _cpu(tmp_path, 0, core_cpus_list="0", die_cpus="3")
    record = _cpu_record(_cpu_dir(tmp_path), 0, {0, 1}, [])
    assert record["levels"] == {"package": 0, "die": frozenset([0, 1])}


@pytest.mark.parametrize("package, shown", [(None, "missing"), ("-1", "-1")])
def test_a_cpu_without_a_package_id_is_refused_naming_it(tmp_path, package, shown):
    base = _cpu(tmp_path, 2, package=None, core_cpus_list="2")
    if package is not None:
        _write(base / "topology/physical_package_id", package)
    with pytest.raises(SlurmCpuError) as err:
        _cpu_record(_cpu_dir(tmp_path), 2, {2}, [])
    assert str(err.value) == ("cpu2 has no package id (topology/physical_package_id is %s); slurmd would see no sockets "
                              "and map CPUs linearly" % shown)
    assert err.value.details["value"] == 2
    assert err.value.details["expected"] == "a physical_package_id for every online CPU"


def test_package_zero_is_a_package(tmp_path):
    _cpu(tmp_path, 0, package=0, core_cpus_list="0")
    assert _cpu_record(_cpu_dir(tmp_path), 0, {0}, [])["levels"]["package"] == 0


# ------------------------------------------------------------------ the L3 cache

def test_l3_is_the_level_3_unified_cache_not_l1_or_l2(tmp_path):
    base = _cpu(tmp_path, 0)
    _cache(base, 0, 1, shared_list="0", kind="Data")
    _cache(base, 1, 1, shared_list="0", kind="Instruction")
    _cache(base, 2, 2, shared_list="0-1")
    _cache(base, 3, 3, shared_list="0-7")
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(16))) == frozenset(range(8))


@pytest.mark.parametrize("kind, found", [("Unified", True), ("Data", True), ("Instruction", False), (None, True)])
def test_a_level_3_cache_counts_unless_it_is_an_instruction_cache(tmp_path, kind, found):
    base = _cpu(tmp_path, 0)
    _cache(base, 3, 3, shared_list="0-3", kind=kind)
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(4))) == (frozenset(range(4)) if found else None)


def test_l3_shared_cpu_map_is_read_when_the_list_is_missing(tmp_path):
    base = _cpu(tmp_path, 0)
    _cache(base, 3, 3, shared_map="00000000,000000f0")
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(8))) == frozenset([4, 5, 6, 7])


def test_l3_shared_only_by_offline_cpus_is_the_cpu_itself_and_no_readable_share_is_none(tmp_path):
    base = _cpu(tmp_path, 0)
    _cache(base, 3, 3, shared_list="8-15")
    assert _l3_of(_cpu_dir(tmp_path), 0, {0, 1}) == frozenset([0])
    other = _cpu(tmp_path, 1)
    _cache(other, 3, 3)
    assert _l3_of(_cpu_dir(tmp_path), 1, {0, 1}) is None


def test_only_index_directories_are_caches(tmp_path):
    base = _cpu(tmp_path, 0)
    _write(base / "cache/uevent", "")
    stray = base / "cache/power"
    _write(stray / "level", "3")
    _write(stray / "shared_cpu_list", "0-63")
    _cache(base, 3, 3, shared_list="0-1")
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(64))) == frozenset([0, 1])


def test_the_first_l3_index_in_name_order_that_reads_wins(tmp_path):
    base = _cpu(tmp_path, 0)
    _cache(base, 1, 3)  # level 3 with nothing readable is passed over
    _cache(base, 2, 3, shared_list="0-1")
    _cache(base, 3, 3, shared_list="0-3")
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(4))) == frozenset([0, 1])
    _cache(base, 2, 2, shared_list="0-1")
    assert _l3_of(_cpu_dir(tmp_path), 0, set(range(4))) == frozenset(range(4))


# ------------------------------------------------------------------ the whole tree

def _node(tmp_path, node, cpulist):
    _write(tmp_path / ("sys/devices/system/node/node%d/cpulist" % node), cpulist)


def test_numa_nodes_go_to_the_records_of_their_cpus_only(tmp_path):
    for cpu in range(4):
        base = _cpu(tmp_path, cpu, package=cpu // 2, core_cpus_list=str(cpu))
        _cache(base, 3, 3, shared_list="0-1" if cpu < 2 else "2-3")
    _write(tmp_path / "sys/devices/system/cpu/online", "0-3")
    _node(tmp_path, 0, "0-1")
    _node(tmp_path, 1, "2-3,8")   # CPU 8 is not online: ignored
    _write(tmp_path / "sys/devices/system/node/has_cpu", "0-1")  # not nodeN
    view = read_slurm_topology(str(tmp_path / "sys"), procfs=str(tmp_path / "proc"))
    assert view["sockets"] == 2 and view["cores_per_socket"] == 2 and view["threads_per_core"] == 1
    assert view["notes"] == []


def test_a_sysfs_root_without_a_cpu_directory_is_refused_naming_it(tmp_path):
    with pytest.raises(SlurmCpuError) as err:
        read_slurm_topology(str(tmp_path))
    assert str(err.value) == "%s/devices/system/cpu is not a sysfs CPU directory" % tmp_path
    assert err.value.details["value"] == str(tmp_path)
    assert err.value.details["expected"] == "a sysfs root with devices/system/cpu"


@pytest.mark.parametrize("cpuinfo, amd", [
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 21\n", True),
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 22\n", True),
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 23\n", False),
    ("vendor_id\t: GenuineIntel\ncpu family\t: 21\n", False),
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 21\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n"
     "cpu family\t: 6\n", True),
    ("no colon here\nvendor_id : AuthenticAMD\ncpu family : 21\n", True),
    ("", False),
])
def test_amd_compute_units_are_family_15h_and_16h_of_the_first_cpu(tmp_path, cpuinfo, amd):
    _write(tmp_path / "cpuinfo", cpuinfo)
    assert _amd_compute_units(str(tmp_path)) is amd


def test_procfs_defaults_to_the_proc_beside_sysfs(tmp_path):
    for cpu in range(2):
        _cpu(tmp_path, cpu, core_id=cpu, core_cpus_list="0-1")
    _write(tmp_path / "sys/devices/system/cpu/online", "0-1")
    _write(tmp_path / "proc/cpuinfo", "vendor_id\t: AuthenticAMD\ncpu family\t: 21\n")
    view = read_slurm_topology(str(tmp_path / "sys"))
    assert view["threads_per_core"] == 1 and view["cores_per_socket"] == 2
    assert any("AMD compute units" in note for note in view["notes"])
    intel = read_slurm_topology(str(tmp_path / "sys"), procfs=str(tmp_path / "elsewhere"))
    assert intel["threads_per_core"] == 2 and intel["cores_per_socket"] == 1
