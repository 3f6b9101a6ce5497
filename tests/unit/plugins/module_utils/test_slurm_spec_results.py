# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What Slurm reserves, exactly: CoreSpecCount's abstract ids, a node's scontrol fields, and the Linux CPUs its
reported CPUSpecList means.

The expected ids are worked out by hand from Slurm's rule (``node_conf_select_spec_cores`` in
src/common/node_conf.c and slurmd's ``_select_spec_cores``: the last core of the last socket first, then the same
core of each lower socket, then the next-to-last cores; ``spec_cores_first`` from the first core of the first
socket). The scontrol node dicts are synthetic, in the fields ``scontrol show node -o`` prints (the real captures are
in test_slurm_cpus.py and test_slurm_inputs_results.py). Written for #34: exact results and messages, so that a
changed order, bound or default fails.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError, core_spec_abstract, core_spec_cpus
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.scontrol import node_spec, spec_os_cpus
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.topology import topology_from_dict


# ------------------------------------------------------------------ CoreSpecCount

@pytest.mark.parametrize("args, first, ids", [
    ((2, 4, 2, 0), False, []),
    ((2, 4, 2, 1), False, [14, 15]),
    ((2, 4, 2, 2), False, [6, 7, 14, 15]),
    ((2, 4, 2, 3), False, [6, 7, 12, 13, 14, 15]),
    ((2, 4, 2, 7), False, [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]),
    ((2, 4, 1, 3), False, [3, 6, 7]),
    ((3, 2, 1, 4), False, [1, 3, 4, 5]),
    ((1, 4, 4, 2), False, list(range(8, 16))),
    ((2, 4, 2, 1), True, [0, 1]),
    ((2, 4, 2, 3), True, [0, 1, 2, 3, 8, 9]),
    ((3, 2, 1, 4), True, [0, 1, 2, 4]),
    ((1, 1, 1, 0), False, []),
])
def test_core_spec_count_reserves_slurms_cores(args, first, ids):
    assert core_spec_abstract(*args, spec_cores_first=first) == ids


def test_core_spec_count_may_leave_one_core_and_no_less():
    assert core_spec_abstract(2, 4, 2, 7) == list(range(2, 16))
    with pytest.raises(SlurmCpuError) as err:
        core_spec_abstract(2, 4, 2, 8)
    assert str(err.value) == "CoreSpecCount=8 leaves no core of the 8 (Slurm resets it to 1)"
    assert err.value.details["value"] == 8
    assert err.value.details["expected"] == "at most 7"


@pytest.mark.parametrize("position, name", [(0, "sockets"), (1, "cores_per_socket"), (2, "threads_per_core")])
@pytest.mark.parametrize("bad", [0, -1, True, "2", 2.0, None])
def test_a_topology_number_that_is_not_a_positive_integer_is_refused_naming_it(position, name, bad):
    args = [2, 4, 2]
    args[position] = bad
    with pytest.raises(SlurmCpuError) as err:
        core_spec_abstract(*args, count=1)
    assert str(err.value) == "%s %r is not a positive integer" % (name, bad)
    assert err.value.details["value"] == bad
    assert err.value.details["expected"] == "an integer of at least 1"


@pytest.mark.parametrize("bad", [-1, True, False, "1", 1.0, None])
def test_a_core_spec_count_that_is_not_a_whole_number_is_refused(bad):
    with pytest.raises(SlurmCpuError) as err:
        core_spec_abstract(2, 4, 2, bad)
    assert str(err.value) == "CoreSpecCount %r is not a non-negative integer" % (bad,)
    assert err.value.details["value"] == bad
    assert err.value.details["expected"] == "an integer of at least 0"


def test_core_spec_cpus_maps_the_abstract_ids_to_linux_cpus():
    # Two sockets of four cores, siblings N and N+8 (the usual Intel numbering).
    view = topology_from_dict({"sockets": ["0-3,8-11", "4-7,12-15"], "cores": ["%d,%d" % (c, c + 8) for c in range(8)]})
    assert core_spec_cpus(view, 2) == {"cpu_spec_list": "6-7,14-15", "abstract": [6, 7, 14, 15], "os_cpus": [3, 7, 11, 15]}
    assert core_spec_cpus(view, 1, spec_cores_first=True) == {"cpu_spec_list": "0-1", "abstract": [0, 1], "os_cpus": [0, 8]}


# ------------------------------------------------------------------ scontrol's node fields

def _node(**fields):
    node = {"NodeName": "gpu01", "CPUTot": "16", "Sockets": "2", "CoresPerSocket": "4", "ThreadsPerCore": "2"}
    node.update(fields)
    return dict((k, v) for k, v in node.items() if v is not None)


def test_node_spec_reads_every_field_and_defaults_the_optional_ones():
    assert node_spec(_node()) == {
        "name": "gpu01", "cpu_tot": 16, "cpu_efctv": None, "sockets": 2, "boards": 1, "cores_per_socket": 4,
        "threads_per_core": 2, "core_spec_count": 0, "cpu_spec_list": [], "cpu_spec_list_text": None,
        "mem_spec_limit": 0, "spec_unit": "cpu",
    }
    full = node_spec(_node(CPUEfctv="12", Boards="2", CoreSpecCount="2", CPUSpecList="12-15", MemSpecLimit="2048"))
    assert full == {
        "name": "gpu01", "cpu_tot": 16, "cpu_efctv": 12, "sockets": 2, "boards": 2, "cores_per_socket": 4,
        "threads_per_core": 2, "core_spec_count": 2, "cpu_spec_list": [12, 13, 14, 15], "cpu_spec_list_text": "12-15",
        "mem_spec_limit": 2048, "spec_unit": "cpu",
    }


@pytest.mark.parametrize("text, ids, shown", [
    (None, [], None), ("(null)", [], None), ("", [], ""), ("0,8", [0, 8], "0,8"), ("3-5", [3, 4, 5], "3-5"),
])
def test_node_spec_cpu_spec_list_as_printed_and_as_ids(text, ids, shown):
    spec = node_spec(_node(CPUSpecList=text))
    assert spec["cpu_spec_list"] == ids
    assert spec["cpu_spec_list_text"] == shown


@pytest.mark.parametrize("value", ["", "N/A"])
def test_an_empty_or_na_field_takes_its_default(value):
    spec = node_spec(_node(CPUEfctv=value, Boards=value, CoreSpecCount=value, MemSpecLimit=value))
    assert (spec["cpu_efctv"], spec["boards"], spec["core_spec_count"], spec["mem_spec_limit"]) == (None, 1, 0, 0)


@pytest.mark.parametrize("key", ["CPUTot", "CPUEfctv", "Sockets", "Boards", "CoresPerSocket", "ThreadsPerCore",
                                 "CoreSpecCount", "MemSpecLimit"])
@pytest.mark.parametrize("value", ["abc", "-1", "1.5", " 2"])
def test_a_field_that_is_not_a_whole_number_is_refused_naming_field_node_and_value(key, value):
    with pytest.raises(SlurmCpuError) as err:
        node_spec(_node(**{key: value}))
    assert str(err.value) == "%s=%s of node gpu01 is not a whole number" % (key, value)
    assert err.value.details["value"] == value
    assert err.value.details["expected"] == "a whole number"


@pytest.mark.parametrize("bad", [None, "gpu01", ["NodeName"], {"CPUTot": "4"}])
def test_something_that_is_not_a_parsed_node_is_refused(bad):
    with pytest.raises(SlurmCpuError) as err:
        node_spec(bad)
    assert str(err.value) == "not a parsed scontrol node: %r" % (bad,)
    assert err.value.details["value"] == bad
    assert err.value.details["expected"] == "a dict from parse_scontrol_nodes"


@pytest.mark.parametrize("fields, unit", [
    ({}, "cpu"),                                                   # 16 CPUs, 8 cores: threads are scheduled
    ({"CPUTot": "8"}, "core"),                                     # CPUs= the core count: ids are cores
    ({"CPUTot": "7"}, "core"),
    ({"CPUTot": "9"}, "cpu"),
    ({"CPUTot": "8", "ThreadsPerCore": "1"}, "cpu"),               # no SMT: cores and CPUs are one
    ({"CPUTot": "8", "ThreadsPerCore": None}, "cpu"),
    ({"CPUTot": None}, "cpu"),
    ({"CPUTot": "8", "Sockets": None}, "cpu"),                     # no sockets known: no core count
    ({"CPUTot": "8", "CoresPerSocket": None}, "cpu"),
])
def test_spec_unit_is_core_only_when_the_node_schedules_whole_cores(fields, unit):
    assert node_spec(_node(**fields))["spec_unit"] == unit


# ------------------------------------------------------------------ a reported CPUSpecList on this topology

def _view():
    return topology_from_dict({"sockets": ["0-3,8-11", "4-7,12-15"], "cores": ["%d,%d" % (c, c + 8) for c in range(8)]})


def test_a_reported_cpu_spec_list_in_cpus_is_the_linux_cpus_with_their_siblings():
    spec = node_spec(_node(CPUSpecList="14-15"))
    assert spec_os_cpus(_view(), spec) == [7, 15]
    spec = node_spec(_node(CPUSpecList="14"))
    assert spec_os_cpus(_view(), spec) == [7, 15]
    assert spec_os_cpus(_view(), node_spec(_node())) == []


def test_a_reported_cpu_spec_list_in_cores_is_widened_to_each_cores_threads():
    spec = node_spec(_node(CPUTot="8", CPUSpecList="7"))
    assert spec["spec_unit"] == "core"
    assert spec_os_cpus(_view(), spec) == [7, 15]
    spec = node_spec(_node(CPUTot="8", CPUSpecList="0,3"))
    assert spec_os_cpus(_view(), spec) == [0, 3, 8, 11]


def test_a_node_whose_counts_are_not_the_topologys_is_refused_naming_both():
    spec = node_spec(_node(Sockets="1", CoresPerSocket="8", CPUSpecList="0"))
    with pytest.raises(SlurmCpuError) as err:
        spec_os_cpus(_view(), spec)
    assert str(err.value) == ("node gpu01 reports Sockets=1 CoresPerSocket=8 ThreadsPerCore=2 but the topology has 2 sockets, "
                              "4 cores per socket, 2 threads per core")
    assert err.value.details["value"] == {"Sockets": 1, "CoresPerSocket": 8, "ThreadsPerCore": 2}
    assert err.value.details["expected"] == {"Sockets": 2, "CoresPerSocket": 4, "ThreadsPerCore": 2}
