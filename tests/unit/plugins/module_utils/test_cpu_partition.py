# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_cpu_partition.split: every rule of the housekeeping/workload split and every error, table-driven."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpu_partition import (
    PartitionError, as_cpulists, split, unassigned)
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist

ONLINE = list(range(16))


@pytest.mark.parametrize("kwargs,house,work", [
    # housekeeping = irq_cpus | reserved, workload = online - housekeeping
    ({"irq_cpus": "0-3"}, "0-3", "4-15"),
    ({"irq_cpus": "0-3", "reserved": "8"}, "0-3,8", "4-7,9-15"),
    ({"reserved": "15"}, "15", "0-14"),
    ({"irq_cpus": "2,3", "reserved": "3-4"}, "2-4", "0-1,5-15"),            # overlapping IRQ and reserved CPUs: a union
    ({"irq_cpus": [0, 1], "reserved": 9}, "0-1,9", "2-8,10-15"),            # lists and integers, as inventory gives them
    # explicit housekeeping wins; IRQ and reserved CPUs inside it are fine
    ({"housekeeping": "0-1"}, "0-1", "2-15"),
    ({"housekeeping": "0-3", "irq_cpus": "0-1", "reserved": "3"}, "0-3", "4-15"),
    # explicit workload; the CPUs in neither are unassigned
    ({"irq_cpus": "0-3", "workload": "8-15"}, "0-3", "8-15"),
    ({"housekeeping": "0", "workload": "1"}, "0", "1"),
    # blank and None mean "not given"
    ({"housekeeping": "  ", "irq_cpus": "0"}, "0", "1-15"),
    ({"irq_cpus": "0-1", "workload": ""}, "0-1", "2-15"),
    ({"irq_cpus": "0-1", "workload": None, "reserved": []}, "0-1", "2-15"),
])
def test_split_rules(kwargs, house, work):
    got_house, got_work = split(ONLINE, **kwargs)
    assert (format_cpulist(got_house), format_cpulist(got_work)) == (house, work)
    assert isinstance(got_house, set) and isinstance(got_work, set)


def test_online_may_be_a_cpu_list_string_with_holes():
    house, work = split("0-3,8-11", irq_cpus="0")
    assert format_cpulist(work) == "1-3,8-11"


def test_unassigned_cpus_are_reported_not_refused():
    house, work = split(ONLINE, irq_cpus="0-3", workload="8-15")
    assert unassigned(ONLINE, house, work) == [4, 5, 6, 7]
    assert as_cpulists(ONLINE, house, work) == {"housekeeping_cpus": "0-3", "workload_cpus": "8-15", "unassigned_cpus": "4-7"}
    house, work = split(ONLINE, irq_cpus="0-3")
    assert as_cpulists(ONLINE, house, work)["unassigned_cpus"] == ""


@pytest.mark.parametrize("kwargs,fragments,details", [
    # housekeeping and workload overlap: the CPUs are named
    ({"irq_cpus": "0-3", "workload": "2-15"}, ["overlap", "CPUs 2-3", "workload 2-15", "irq_cpus + reserved"],
     {"option": "workload", "cpus": "2-3"}),
    ({"housekeeping": "0-7", "workload": "7"}, ["overlap", "CPU 7", "housekeeping"], {"option": "workload", "cpus": "7"}),
    # empty workload
    ({"irq_cpus": "0-15"}, ["no workload CPUs", "0-15"], {"option": "workload", "online": "0-15"}),
    ({"housekeeping": "0-7", "reserved": "8-15"}, ["leaves out", "8-15"], {"option": "housekeeping", "cpus": "8-15"}),
    # empty housekeeping
    ({}, ["housekeeping CPUs are empty", "housekeeping", "irq_cpus", "reserved"], {"option": "housekeeping"}),
    ({"irq_cpus": "", "reserved": ""}, ["housekeeping CPUs are empty"], {"option": "housekeeping"}),
    ({"housekeeping": []}, ["housekeeping CPUs are empty"], {"option": "housekeeping"}),
    # CPUs that are not online: named, with the online list
    ({"irq_cpus": "0-3,16"}, ["irq_cpus", "CPU 16", "not online", "0-15"], {"option": "irq_cpus", "cpus": "16", "online": "0-15"}),
    ({"irq_cpus": "0", "reserved": "20-21"}, ["reserved", "CPUs 20-21", "0-15"], {"option": "reserved", "cpus": "20-21"}),
    ({"housekeeping": "0,99"}, ["housekeeping", "CPU 99"], {"option": "housekeeping", "cpus": "99"}),
    ({"irq_cpus": "0", "workload": "1-16"}, ["workload", "CPU 16"], {"option": "workload", "cpus": "16"}),
    # IRQ CPUs outside an explicit housekeeping set are never the workload's
    ({"housekeeping": "0-1", "irq_cpus": "0-3"}, ["housekeeping 0-1", "leaves out", "CPUs 2-3", "irq_cpus"],
     {"option": "housekeeping", "cpus": "2-3"}),
    # values that are not CPU lists: the option and the value
    ({"irq_cpus": "0-x"}, ["irq_cpus", "'0-x'", "not a CPU list"], {"option": "irq_cpus", "value": "0-x"}),
    ({"irq_cpus": "3-1"}, ["irq_cpus", "reversed range"], {"option": "irq_cpus"}),
    ({"housekeeping": "0", "workload": "a"}, ["workload", "'a'"], {"option": "workload", "value": "a"}),
])
def test_split_errors_name_the_cpus_and_what_was_expected(kwargs, fragments, details):
    with pytest.raises(PartitionError) as exc:
        split(ONLINE, **kwargs)
    message = str(exc.value)
    assert [f for f in fragments if f not in message] == [], message
    for key, value in details.items():
        assert exc.value.details[key] == value, (key, exc.value.details)
    assert exc.value.details.get("expected"), exc.value.details
    assert isinstance(exc.value, ValueError)


def test_no_online_cpus_is_an_error():
    with pytest.raises(PartitionError, match="no online CPUs"):
        split([], irq_cpus="0")


def test_labels_name_the_callers_options():
    labels = {"housekeeping": "housekeeping_cpus", "irq_cpus": "irq_cpus", "reserved": "reserved_cpus", "workload": "workload_cpus"}
    with pytest.raises(PartitionError) as exc:
        split(ONLINE, irq_cpus="0-3", workload="3-15", labels=labels)
    assert "workload_cpus 3-15" in str(exc.value) and "irq_cpus + reserved_cpus" in str(exc.value)
    assert exc.value.details["option"] == "workload_cpus"
    with pytest.raises(PartitionError) as exc:
        split(ONLINE, reserved="17", labels=labels)
    assert exc.value.details["option"] == "reserved_cpus" and "reserved_cpus names CPU 17" in str(exc.value)


def test_n_and_all_resolve_with_the_node_cpu_count():
    """Issue 29, class 4: 2-N means up to the node's last CPU, as the kernel reads it (was: refused)."""
    house, work = split(ONLINE, irq_cpus="0-1", workload="2-N")
    assert (format_cpulist(house), format_cpulist(work)) == ("0-1", "2-15")
    house, work = split(ONLINE, housekeeping="1,,3", workload="all:1/2")
    assert format_cpulist(house) == "1,3" and format_cpulist(work) == ",".join(str(c) for c in range(0, 16, 2))
