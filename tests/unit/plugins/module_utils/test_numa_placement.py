# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_numa_placement over real numa_maps / numastat captures (tests/unit/fixtures/numa/README.md) and generated trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.numa_placement import (
    NumaPlacementError,
    judge_placement,
    numa_balancing,
    numastat_view,
    pages_by_node,
    parse_numa_maps,
    parse_numastat_p,
    process_placement,
    select_processes,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "numa"
KIB, MIB, GIB = 1024, 1024 * 1024, 1024 * 1024 * 1024


def fixture(name):
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------- numa_maps --

@pytest.mark.parametrize("name,mappings,by_node", [
    # 65 base pages on N0; 40 base pages and one 2 MiB hugetlb page on N3.
    ("numa_maps_kernel_doc_proc_rst.txt", 16, {0: 65 * 4 * KIB, 3: 40 * 4 * KIB + 2 * MIB}),
    ("numa_maps_tiexec_hugetlb_text_partial.txt", 3, {0: 41 * 2 * MIB + 411 * 4 * KIB}),
    ("numa_maps_weighted_interleave_set_mempolicy2_partial.txt", 6,
     {0: (54829 + 5461 + 2731 + 10924 + 2731 + 54615) * 4 * KIB, 1: (10965 + 27307 + 13653 + 54614 + 13653 + 10922) * 4 * KIB}),
    ("numa_maps_cpuset_rebind_lkml_after_partial.txt", 2, {1: GIB, 3: GIB}),
    ("numa_maps_sysstat_issue391_partial.txt", 11, {0: 37 * 4 * KIB}),
    # Linux 2.6.27: no kernelpagesize_kB, so the 4 KiB default applies.
    ("numa_maps_hwloc_devel_2627_swap_partial.txt", 3,
     {0: (1482914 + 256407 + 1083215) * 4 * KIB, 1: (7379 + 1594468 + 1401281) * 4 * KIB}),
])
def test_resident_bytes_per_node_use_each_mappings_page_size(name, mappings, by_node):
    parsed = parse_numa_maps(fixture(name))
    assert len(parsed) == mappings
    assert pages_by_node(parsed) == by_node


def test_kernel_doc_fields_huge_stack_file_and_empty_mapping():
    parsed = parse_numa_maps(fixture("numa_maps_kernel_doc_proc_rst.txt"))
    huge = parsed[13]
    assert (huge["address"], huge["huge"], huge["file"], huge["kernelpagesize_kB"], huge["pages"]) == (
        "7f4dc1200000", True, "/anon_hugepage\\040(deleted)", 2048, {3: 1})
    assert parsed[14]["stack"] and parsed[14]["counters"] == {"anon": 3, "dirty": 3}
    assert parsed[6]["counters"] == {"mapped": 59, "mapmax": 21, "active": 55} and parsed[6]["pages"] == {0: 41, 3: 18}
    empty = parsed[7]   # "320698b000 default file=/lib64/libc-2.12.so": nothing resident, no counters printed
    assert (empty["pages"], empty["kernelpagesize_kB"], empty["counters"]) == ({}, None, {})
    assert all(m["other"] == [] for m in parsed)


@pytest.mark.parametrize("line,policy,mode,flags,nodes", [
    ("007c0000 weighted interleave:0-1 heap anon=65794 N0=54829 N1=10965 kernelpagesize_kB=4",
     "weighted interleave:0-1", "weighted interleave", [], [0, 1]),
    ("7ff77e200000 bind:3 anon=262144 dirty=262144 active=0 N1=262144 kernelpagesize_kB=4", "bind:3", "bind", [], [3]),
    # The rest are the kernel's mpol_to_str() forms (mm/mempolicy.c), not captures: no public capture of them was found.
    ("7f00 prefer (many):0-1 anon=2 N0=2 kernelpagesize_kB=4", "prefer (many):0-1", "prefer (many)", [], [0, 1]),
    ("7f00 interleave=static|balancing:0,2 anon=2 N2=2 kernelpagesize_kB=4", "interleave=static|balancing:0,2", "interleave",
     ["static", "balancing"], [0, 2]),
    ("7f00 local anon=1 N0=1 kernelpagesize_kB=4", "local", "local", [], None),
    ("7f00 prefer:1 anon=1 N0=1 kernelpagesize_kB=4", "prefer:1", "prefer", [], [1]),
])
def test_policies_including_two_word_modes(line, policy, mode, flags, nodes):
    (mapping,) = parse_numa_maps(line)
    assert (mapping["policy"], mapping["mode"], mapping["policy_flags"], mapping["policy_nodes"]) == (policy, mode, flags, nodes)
    assert mapping["other"] == []


def test_weighted_interleave_heap_is_marked_and_split_five_to_one():
    parsed = parse_numa_maps(fixture("numa_maps_weighted_interleave_set_mempolicy2_partial.txt"))
    assert parsed[0]["heap"] and not parsed[1]["heap"]
    assert round(100.0 * parsed[0]["pages"][1] / parsed[0]["counters"]["anon"], 2) == 16.67


def test_a_line_without_an_address_names_the_line():
    with pytest.raises(NumaPlacementError, match=r"line 2 .*'\.\.\. \.\.\.'"):
        parse_numa_maps("00400000 default N0=1 kernelpagesize_kB=4\n... ...\n")


# ----------------------------------------------------------------- numastat --

@pytest.mark.parametrize("name,pid,pname,nodes,private,total", [
    ("numastat_p_numa_allocator_2node.txt", 54261, "numa", [0, 1], {0: 100.52, 1: 51.58}, 152.11),
    ("numastat_p_qemu_hugepages_weiborao.txt", 4391, "qemu-system-x86", [0, 1], {0: 170.70, 1: 0.15}, 8372.88),
    ("numastat_p_numa_bench_4node.txt", 17959, "numa_bench", [0, 1, 2, 3], {0: 0.51, 1: 0.0, 2: 0.0, 3: 15.20}, 2065.86),
    ("numastat_m_p_ik_llama_pr278_partial.txt", 3635, "llama-server", [0, 1], {0: 3096.67, 1: 5.54}, 388832.16),
    ("this_host_python3_bytearray_numastat_p.txt", 16692, "python3", [0], {0: 61.72}, 63.26),
    ("this_host_numastat_p_width32_folded.txt", 18838, "python3", [0], {0: 61.75}, 63.29),
])
def test_numastat_detailed_tables(name, pid, pname, nodes, private, total):
    (table,) = parse_numastat_p(fixture(name))
    assert (table["pid"], table["name"], table["nodes"]) == (pid, pname, nodes)
    assert sorted(table["categories"]) == ["Heap", "Huge", "Private", "Stack"]
    assert table["categories"]["Private"]["nodes"] == private
    assert table["total"]["total"] == total
    assert table["processes"] == []


def test_numastat_folded_sections_merge_into_one_row_per_category():
    (table,) = parse_numastat_p(fixture("this_host_numastat_p_width32_folded.txt"))
    assert table["categories"]["Heap"] == {"nodes": {0: 1.50}, "total": 1.50}
    assert table["total"] == {"nodes": {0: 63.29}, "total": 63.29}


def test_numastat_system_table_after_the_process_table_is_not_read_as_rows():
    (table,) = parse_numastat_p(fixture("numastat_m_p_ik_llama_pr278_partial.txt"))
    assert "MemTotal" not in table["categories"] and table["categories"]["Huge"]["nodes"][0] == 385692.00


@pytest.mark.parametrize("name,processes,total", [
    ("numastat_c_qemu_weiborao.txt", [(4391, "qemu-syste", {0: 8373.0, 1: 0.0}, 8373.0), (5891, "sudo", {0: 4.0, 1: 1.0}, 5.0)],
     {"nodes": {0: 8377.0, 1: 1.0}, "total": 8377.0}),
    ("numastat_c_qemu_kvm_list_3proc.txt", [(24463, "qemu_hotr", {0: 6.0, 1: 6.0}, 12.0), (24479, "qemu_tls_", {0: 0.0, 1: 8.0}, 8.0),
                                            (70718, "qemu-syst", {0: 58.0, 1: 539.0}, 597.0)],
     {"nodes": {0: 64.0, 1: 553.0}, "total": 616.0}),
    ("numastat_c_p_damos_migrate_hot_lkml.txt", [(701, "hot_cold", {0: 501.0, 1: 0.0, 2: 601.0}, 1101.0)], None),
])
def test_numastat_summary_tables_one_row_per_process(name, processes, total):
    (table,) = parse_numastat_p(fixture(name))
    assert table["pid"] is None and table["categories"] == {}
    assert [(p["pid"], p["name"], p["nodes"], p["total"]) for p in table["processes"]] == processes
    assert table["total"] == total


def test_numa_maps_arithmetic_matches_numastat_of_the_same_process():
    # Both files taken from one python3 process on this machine, a second apart (README).
    view = numastat_view(parse_numa_maps(fixture("this_host_numastat_p_width32_folded_numa_maps.txt")))
    (table,) = parse_numastat_p(fixture("this_host_numastat_p_width32_folded.txt"))
    for category in ("Huge", "Heap", "Stack", "Private"):
        assert round(view["categories"][category]["total"], 2) == table["categories"][category]["total"], category
    assert round(view["total"]["total"], 2) == table["total"]["total"] == 63.29


def test_numastat_before_pr149_multiplied_2m_pages_by_the_1g_default():
    # numactl issue #147: 20 MiB of 2 MiB pages (5 per node) shown as 5 x 1024 MB per node.
    (table,) = parse_numastat_p(fixture("numastat_p_numactl_issue147_hugepagesz_partial.txt"))
    assert table["total"] is None   # the capture ends before the Total row
    huge = table["categories"]["Huge"]
    pages_per_node = dict((node, mb / 1024.0) for node, mb in huge["nodes"].items())
    assert pages_per_node == {0: 5.0, 1: 5.0}
    view = numastat_view(parse_numa_maps("7f00 default file=/anon_hugepage\\040(deleted) huge anon=10 dirty=10 N0=5 N1=5 kernelpagesize_kB=2048"))
    assert view["categories"]["Huge"]["nodes"] == {0: 10.0, 1: 10.0} and view["total"]["total"] == 20.0


def test_numastat_row_that_does_not_fit_the_header_raises():
    with pytest.raises(NumaPlacementError, match="cannot read numastat row 'Heap 1.00'"):
        parse_numastat_p("Per-node process memory usage (in MBs) for PID 1 (x)\n   Node 0  Node 1  Total\nHeap 1.00\n")


# ------------------------------------------------------- process placement --

def two_node_tree(tmp_path):
    """8 CPUs, node 0 = CPUs 0-3, node 1 = CPUs 4-7 (treegen writes sys/devices/system/{cpu,node})."""
    return treegen.build_tree(tmp_path, {"cpus": 8, "numa": {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}})


def add_process(tree, pid, name, cpus, numa_maps, cmdline=None, state="S (sleeping)", mems="0-1"):
    base = Path(tree.proc) / str(pid)
    base.mkdir(parents=True)
    (base / "status").write_text("Name:\t%s\nState:\t%s\nPid:\t%d\nCpus_allowed_list:\t%s\nMems_allowed_list:\t%s\n"
                                 % (name, state, pid, cpus, mems))
    (base / "comm").write_text(name + "\n")
    (base / "cmdline").write_text(("/usr/bin/%s\0--serve\0" % name) if cmdline is None else cmdline)
    if numa_maps is not None:
        (base / "numa_maps").write_text(numa_maps)
    return base


# hwloc-devel capture, process 435 (numactl --membind=1) after swap-in put 256407 of its pages on node 0.
SWAPPED_BIND1 = fixture("numa_maps_hwloc_devel_2627_swap_partial.txt").splitlines()[1] + "\n"


def test_placement_of_a_process_on_node_1_cpus_with_pages_on_node_0(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 435, "memory_grabber", "4-7", SWAPPED_BIND1)
    placement = process_placement(tree.proc, tree.sys, 435)
    assert placement["local_nodes"] == [1] and placement["cpus_allowed"] == [4, 5, 6, 7]
    assert placement["resident_bytes"] == {0: 256407 * 4096, 1: 1594468 * 4096}
    assert placement["remote_nodes"] == [0] and placement["remote_bytes"] == 256407 * 4096
    assert placement["remote_pct"] == 13.9   # 256407 / 1850875
    assert placement["cmdline"] == "/usr/bin/memory_grabber --serve" and placement["policies"] == {"bind": 1}
    assert not placement["kernel_thread"] and placement["readable"]


def test_cpus_on_both_nodes_make_all_memory_local(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 435, "memory_grabber", "3-4", SWAPPED_BIND1)
    placement = process_placement(tree.proc, tree.sys, 435)
    assert placement["local_nodes"] == [0, 1] and placement["remote_pct"] == 0.0 and placement["remote_nodes"] == []


def test_kernel_thread_has_no_memory_and_no_share(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 2, "kthreadd", "0-7", "", cmdline="")
    placement = process_placement(tree.proc, tree.sys, 2)
    assert placement["kernel_thread"] and placement["total_bytes"] == 0 and placement["remote_pct"] is None
    assert judge_placement([placement], 10)[0]["flagged"] is False


def test_gone_and_zombie_processes_read_as_none(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 77, "defunct", "0", "", cmdline="", state="Z (zombie)")
    assert process_placement(tree.proc, tree.sys, 4242) is None
    assert process_placement(tree.proc, tree.sys, 77) is None


def test_unreadable_numa_maps_is_reported_not_guessed(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 500, "postgres", "0-3", None)   # no numa_maps file: what EACCES looks like to read_raw
    placement = process_placement(tree.proc, tree.sys, 500)
    assert placement["readable"] is False and placement["resident_bytes"] is None and placement["remote_pct"] is None
    assert "unreadable" in placement["notes"][0]
    (finding,) = judge_placement([placement], 10, irq_cpus="2")
    assert finding["judged"] is False and finding["rules"] == ["irq_cpus"]
    assert finding["reasons"] == ["allowed CPUs 0-3 include 1 CPU(s) carrying NIC IRQs: 2",
                                  "numa_maps unreadable: memory placement not judged"]


def test_process_that_exits_while_read_reads_as_none(tmp_path, monkeypatch):
    tree = two_node_tree(tmp_path)
    base = add_process(tree, 600, "short", "0", SWAPPED_BIND1)
    from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import numa_placement as _numa_placement

    real = _numa_placement.read_raw

    def read_and_exit(path, default=None):
        text = real(path, default)
        if path.endswith("numa_maps"):
            for name in os.listdir(str(base)):
                os.unlink(os.path.join(str(base), name))
        return text
    monkeypatch.setattr(_numa_placement, "read_raw", read_and_exit)
    assert process_placement(tree.proc, tree.sys, 600) is None


# ------------------------------------------------------------------ verdict --

def test_judge_quotes_share_size_nodes_and_cpus(tmp_path):
    tree = two_node_tree(tmp_path)
    # 18 % of 2 GiB on node 1 for a process allowed on node 0's CPUs.
    maps = "7f0000000000 default anon=524288 dirty=524288 N0=429916 N1=94372 kernelpagesize_kB=4\n"
    add_process(tree, 900, "trainer", "0-3", maps)
    add_process(tree, 901, "local", "0-3", "7f00 bind:0 anon=10 N0=10 kernelpagesize_kB=4\n")
    placements = [process_placement(tree.proc, tree.sys, 900), None, process_placement(tree.proc, tree.sys, 901)]
    findings = judge_placement(placements, 10.0, irq_cpus={3, 8})
    assert [f["pid"] for f in findings] == [900, 901]
    assert findings[0]["rules"] == ["remote_memory", "irq_cpus"]
    assert findings[0]["reasons"] == [
        "18.0 % of 2.0 GiB resident on node 1, remote to CPUs 0-3 (node 0)",
        "allowed CPUs 0-3 include 1 CPU(s) carrying NIC IRQs: 3",
    ]
    assert findings[1]["flagged"] is True and findings[1]["rules"] == ["irq_cpus"]
    assert judge_placement(placements, 18.0)[0]["flagged"] is False   # above, not at, the threshold
    assert judge_placement(placements, 17.9)[0]["rules"] == ["remote_memory"]


@pytest.mark.parametrize("threshold", [-0.1, 100.5, "10", True, None])
def test_threshold_outside_0_to_100_names_the_value(threshold):
    with pytest.raises(NumaPlacementError, match="threshold_pct %s is not" % repr(threshold).replace("(", r"\(")):
        judge_placement([], threshold)


def test_bad_irq_cpus_raise():
    with pytest.raises(NumaPlacementError, match="irq_cpus '3-1'"):
        judge_placement([], 10, irq_cpus="3-1")


# ------------------------------------------------------------------ selection --

def test_select_by_pid_and_by_comm_or_cmdline_regex(tmp_path):
    tree = two_node_tree(tmp_path)
    add_process(tree, 10, "nginx", "0", "")
    add_process(tree, 11, "python3", "0", "", cmdline="python3\0/opt/vllm/serve.py\0")
    add_process(tree, 12, "bash", "0", "")
    assert select_processes(tree.proc, pids=[12]) == [12]
    assert select_processes(tree.proc, name_patterns=["^ngin", r"vllm/serve"]) == [10, 11]
    assert select_processes(tree.proc, pids=["12"], name_patterns=["^nginx$"]) == [10, 12]
    assert select_processes(tree.proc, name_patterns=["^nomatch$"]) == []


def test_missing_pid_and_bad_regex_are_named(tmp_path):
    tree = two_node_tree(tmp_path)
    with pytest.raises(NumaPlacementError, match="pid 4242 does not exist"):
        select_processes(tree.proc, pids=[4242])
    with pytest.raises(NumaPlacementError, match=r"pid 0 is not a positive integer"):
        select_processes(tree.proc, pids=[0])
    with pytest.raises(NumaPlacementError, match=r"invalid regular expression '\(unclosed': missing \)"):
        select_processes(tree.proc, pids=[4242], name_patterns=["ok", "(unclosed"])


def test_live_selection_leaves_out_the_caller():
    own = os.getpid()
    assert own not in select_processes("/proc", name_patterns=["."])
    assert select_processes("/proc", pids=[own]) == [own]


# ------------------------------------------------------------- numa_balancing --

@pytest.mark.parametrize("text,expected", [
    ("0\n", {"value": 0, "name": "disabled"}), ("1\n", {"value": 1, "name": "normal"}),
    ("2\n", {"value": 2, "name": "memory_tiering"}), ("3\n", {"value": 3, "name": "normal+memory_tiering"}),
    ("7\n", {"value": 7, "name": "unknown"}), (None, None),
])
def test_numa_balancing_values(tmp_path, text, expected):
    if text is not None:
        (tmp_path / "sys/kernel").mkdir(parents=True)
        (tmp_path / "sys/kernel/numa_balancing").write_text(text)
    assert numa_balancing(str(tmp_path)) == expected


# ---------------------------------------------------------------- live /proc --

def test_live_process_with_50_mib_resident():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; x = bytearray(50 << 20); print('ready', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(0.2)
        placement = process_placement("/proc", "/sys", child.pid)
        assert placement["pid"] == child.pid and placement["readable"] and not placement["kernel_thread"]
        assert placement["total_bytes"] >= 50 * MIB
        assert placement["total_bytes"] < 200 * MIB
        assert sorted(placement["cpus_allowed"]) == sorted(os.sched_getaffinity(child.pid))
        nodes = sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit() and n.startswith("node"))
        if nodes == [0]:   # this machine: one node, so nothing is remote
            assert placement["resident_bytes"].keys() == {0} and placement["remote_pct"] == 0.0
        assert child.pid in select_processes("/proc", name_patterns=[r"bytearray\(50 << 20\)"])
    finally:
        child.kill()
        child.wait()
    assert process_placement("/proc", "/sys", child.pid) is None
