# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The input readers of slurm_cpuspec, result by result: lscpu -p/-e, topology dicts, ``scontrol show node``.

Issue 34 (mutation testing): survivors sat in ``_lscpu_table``, ``_from_groups``, ``topology_from_dict`` and
``parse_scontrol_nodes``. Each test here compares the WHOLE view ``build_view`` returns (every key) or the
whole parsed node, and every error's exact message and ``value``/``expected`` details.

Expected values are worked out by hand from the input: a view is written as its sockets in Slurm's order,
each a list of cores in Slurm's order, each core its Linux CPUs in thread order (lowest first); abstract id
= position in that flattening (the rule in tests/unit/fixtures/slurm/README.md). ``_view`` below only
flattens and counts what the test spells out; it orders nothing itself.

Real captures come from tests/unit/fixtures/slurm (provenance in its README). Tables made up for a test
are named ``SYNTHETIC_...``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.scontrol import parse_scontrol_nodes
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.topology import parse_lscpu, topology_from_dict, topology_view

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"

MULTI_NUMA = ("sockets %s hold more than one NUMA node: slurmd built with hwloc 1.x counts each NUMA node as a socket "
              "(socket_by=numa_node models that, and SlurmdParameters=numa_node_as_socket)")
PACKAGE_DROPPED = "package groups do not hold whole numa_node groups; left out of the ordering"
DICT_ENTRY = "{'cpu': 0, 'socket': 0, 'core': 0}"


def _text(*parts):
    return FIXTURES.joinpath(*parts).read_text(encoding="utf-8")


def _lscpu(name):
    return _text("lscpu", name)


def _block(name, index):
    """The index-th blank-line separated block of an lscpu capture (0: the summary, 1: --parse, 2: --parse --physical)."""
    return _lscpu(name).split("\n\n")[index]


def _view(source, sockets, socket_by="package", notes=(), excluded=None):
    """The whole view for ``sockets``: [[core, ...] per socket in Slurm order], a core = its CPUs in thread order."""
    cores = [core for socket in sockets for core in socket]
    (threads,) = set(len(core) for core in cores)
    (per_socket,) = set(len(socket) for socket in sockets)
    order = [cpu for core in cores for cpu in core]
    return {
        "source": source,
        "socket_by": socket_by,
        "sockets": len(sockets),
        "cores_per_socket": per_socket,
        "threads_per_core": threads,
        "cpus": len(order),
        "os_to_abstract": dict((cpu, index) for index, cpu in enumerate(order)),
        "abstract_to_os": order,
        "cores": cores,
        "socket_cpus": [sorted(cpu for core in socket for cpu in core) for socket in sockets],
        "excluded": dict(excluded or {}),
        "notes": list(notes),
    }


def _refused(call, *args, **kwargs):
    with pytest.raises(SlurmCpuError) as err:
        call(*args, **kwargs)
    return err.value


def _check(error, message, value, expected):
    assert str(error) == message
    assert error.details == {"value": value, "expected": expected}


# Hand-derived views of the real captures ------------------------------------------------------------------

# 2x AMD EPYC 7451: CPU k (0-47) is core k with sibling k+48; socket k//24, NUMA node k//6, L3 k//3 (both monotonic
# in k, so the depth-first walk keeps k's order).
EPYC_7451 = [[[k, k + 48] for k in range(s * 24, s * 24 + 24)] for s in range(2)]
# 4x Xeon X7550: socket s = CPUs s, s+4, ..., s+60; core (s+4c, s+4c+32); L3 = socket; NUMA node 0 = sockets 0 and 2.
X7550 = [[[s + 4 * c, s + 4 * c + 32] for c in range(8)] for s in range(4)]
# POWER7: 4 sockets x 1 core x 4 adjacent threads, one NUMA node, no L3 column.
POWER7 = [[[4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3]] for s in range(4)]
# Opteron 6328 guest: core c = CPUs 2c, 2c+1; socket = CPU // 8; NUMA node and L3 = CPU // 4.
VMWARE_FPE = [[[2 * c, 2 * c + 1] for c in range(4 * s, 4 * s + 4)] for s in range(2)]
# 2x Xeon E5410, no SMT: socket 0 = 0,2,4,6, socket 1 = 1,3,5,7; one NUMA node.
E5410 = [[[0], [2], [4], [6]], [[1], [3], [5], [7]]]


# --------------------------------------------------------------------------- lscpu -p, real captures


def test_epyc_7451_lscpu_p_whole_view_and_its_multi_numa_note():
    view = parse_lscpu(_lscpu("util-linux_lscpu-x86_64-epyc_7451.txt"))
    assert view == _view("lscpu -p", EPYC_7451, notes=[MULTI_NUMA % "0,1"])
    assert view["abstract_to_os"][:4] == [0, 48, 1, 49]
    assert view["os_to_abstract"][24] == 48


def test_epyc_7451_physical_ids_give_the_same_view_as_logical_ids():
    # --physical: Core restarts in every socket (0,1,2,4,5,6,8,...), so a core is the (Socket, Core) pair
    physical = parse_lscpu(_block("util-linux_lscpu-x86_64-epyc_7451.txt", 2))
    assert physical == _view("lscpu -p", EPYC_7451, notes=[MULTI_NUMA % "0,1"])


def test_epyc_7451_socket_by_numa_node_and_l3cache():
    text = _lscpu("util-linux_lscpu-x86_64-epyc_7451.txt")
    numa = [[[k, k + 48] for k in range(n * 6, n * 6 + 6)] for n in range(8)]
    assert parse_lscpu(text, socket_by="numa_node") == _view("lscpu -p", numa, socket_by="numa_node")
    l3 = [[[k, k + 48] for k in range(c * 3, c * 3 + 3)] for c in range(16)]
    assert parse_lscpu(text, socket_by="l3cache") == _view("lscpu -p", l3, socket_by="l3cache")


def test_epyc_7451_only_cpus_first_threads_and_ids_slurmd_cannot_number():
    # only the first threads (SMT off): 2 sockets of 24 one-thread cores
    view = parse_lscpu(_lscpu("util-linux_lscpu-x86_64-epyc_7451.txt"), only_cpus="0-47")
    assert view == _view("lscpu -p", [[[k] for k in range(s * 24, s * 24 + 24)] for s in range(2)],
                         excluded=dict((cpu, "not in only_cpus") for cpu in range(48, 96)), notes=[MULTI_NUMA % "0,1"])
    # NUMA nodes 0 and 4 with their siblings: 24 CPUs, but ids up to 77
    error = _refused(parse_lscpu, _lscpu("util-linux_lscpu-x86_64-epyc_7451.txt"), only_cpus="0-5,24-29,48-53,72-77")
    _check(error, "CPU 77 is not below the 24 CPUs slurmd sees (CPUs 0-5,24-29,48-53,72-77); slurmd's block map skips machine ids "
           "that high (xcpuinfo.c, 'physical or logical ID are out of range') so the abstract ids of this node are not a permutation "
           "of its CPUs", "0-5,24-29,48-53,72-77", "online CPU ids 0 to 23 (bring offline CPUs online)")
    error = _refused(parse_lscpu, _lscpu("util-linux_lscpu-x86_64-epyc_7451.txt"), only_cpus="90-100")
    _check(error, "only_cpus 96-100 are not online CPUs of this node (online: 0-95)", "90-100", "a subset of 0-95")


def test_x7550_interleaved_sockets_logical_and_physical_blocks():
    logical = parse_lscpu(_lscpu("util-linux_lscpu-x86_64-64cpu.txt"))
    assert logical == _view("lscpu -p", X7550)
    # --physical numbers the sockets 0,2,1,3 for CPUs 0,1,2,3: Slurm orders sockets by their lowest CPU, not the id
    physical = parse_lscpu(_block("util-linux_lscpu-x86_64-64cpu.txt", 2))
    assert physical == logical


def test_x7550_numa_node_0_spans_two_packages_so_numa_sockets_are_not_uniform():
    error = _refused(parse_lscpu, _lscpu("util-linux_lscpu-x86_64-64cpu.txt"), socket_by="numa_node")
    # NUMA node 0 = the even CPUs (sockets 0 and 2), node 2 = CPUs 1 mod 4, node 3 = CPUs 3 mod 4 (the summary's 0-62:2 etc.)
    even, one, three = (",".join(str(c) for c in range(start, 64, step)) for start, step in ((0, 2), (1, 4), (3, 4)))
    _check(error, "the topology is not uniform: the sockets have different core counts (socket 0 (CPUs " + even + "): 16, "
           "socket 1 (CPUs " + one + "): 8, socket 2 (CPUs " + three + "): 8); Slurm describes a node with one CoresPerSocket and numbers "
           "its abstract CPUs on that assumption", {0: 16, 1: 8, 2: 8}, "the same number of cores in every socket")


def test_power7_first_block_only_and_socket_by_variants():
    text = _lscpu("util-linux_lscpu-ppc64-POWER7.txt")
    assert parse_lscpu(text) == _view("lscpu -p", POWER7)
    # one NUMA node over the 4 packages: packages are dropped from the ordering, one socket of 4 cores
    assert parse_lscpu(text, socket_by="numa_node") == _view(
        "lscpu -p", [[core for (core,) in POWER7]], socket_by="numa_node", notes=[PACKAGE_DROPPED])
    error = _refused(parse_lscpu, text, socket_by="l3cache")
    _check(error, "socket_by=l3cache but CPUs 0-15 have no l3cache in the lscpu -p", "l3cache", "a l3cache for every CPU, or socket_by=package")


def test_power7_physical_block_has_no_socket_ids_so_no_cpu_is_placed():
    # the --physical block prints Socket '-' for every CPU
    error = _refused(parse_lscpu, _block("util-linux_lscpu-ppc64-POWER7.txt", 2))
    _check(error, "the topology has no CPU", "lscpu -p", "at least one online CPU")


def test_vmware_fpe_numa_and_l3_columns_nest_in_the_packages():
    text = _lscpu("util-linux_lscpu-vmware_fpe.txt")
    assert parse_lscpu(text) == _view("lscpu -p", VMWARE_FPE, notes=[MULTI_NUMA % "0,1"])
    quarters = [[[2 * c, 2 * c + 1] for c in range(2 * q, 2 * q + 2)] for q in range(4)]
    assert parse_lscpu(text, socket_by="numa_node") == _view("lscpu -p", quarters, socket_by="numa_node")
    assert parse_lscpu(text, socket_by="l3cache") == _view("lscpu -p", quarters, socket_by="l3cache")


def test_vmware_fpe_physical_core_ids_repeat_per_node_and_the_core_is_refused():
    # --physical: Core is 0-3 again in each NUMA node, so (Socket 0, Core 0) is CPUs 0 and 4 on two NUMA nodes
    error = _refused(parse_lscpu, _block("util-linux_lscpu-vmware_fpe.txt", 2))
    _check(error, "core 0,4 spans 2 numa_node groups; a core must lie in one numa_node", [0, 4], "SMT siblings in one socket")


def test_sparc64_sparse_ids_and_no_node_column_values():
    text = _lscpu("util-linux_lscpu-sparc64.txt")
    error = _refused(parse_lscpu, text)
    _check(error, "CPU 15 is not below the 6 CPUs slurmd sees (CPUs 6-7,10-11,14-15); slurmd's block map skips machine ids that high "
           "(xcpuinfo.c, 'physical or logical ID are out of range') so the abstract ids of this node are not a permutation of its CPUs",
           "6-7,10-11,14-15", "online CPU ids 0 to 5 (bring offline CPUs online)")
    # the Node column is empty: no NUMA node is known
    error = _refused(parse_lscpu, text, socket_by="numa_node")
    _check(error, "socket_by=numa_node but CPUs 6-7,10-11,14-15 have no numa node in the lscpu -p", "numa_node",
           "a numa node for every CPU, or socket_by=package")


def test_e5410_lscpu_p_and_russian_lscpu_e_whole_views():
    p = parse_lscpu(_lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-p.txt"))
    e = parse_lscpu(_lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-e_ru.txt"))
    assert p == _view("lscpu -p", E5410)
    assert e == _view("lscpu -e", E5410)  # ONLINE 'да' is online
    flat = [[[cpu] for cpu in range(8)]]
    assert parse_lscpu(_lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-p.txt"), socket_by="numa_node") == \
        _view("lscpu -p", flat, socket_by="numa_node", notes=[PACKAGE_DROPPED])
    assert parse_lscpu(_lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-e_ru.txt"), socket_by="numa_node") == \
        _view("lscpu -e", flat, socket_by="numa_node", notes=[PACKAGE_DROPPED])


def test_e5410_lscpu_e_cache_column_without_l3_gives_no_l3():
    error = _refused(parse_lscpu, _lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-e_ru.txt"), socket_by="l3cache")
    _check(error, "socket_by=l3cache but CPUs 0-7 have no l3cache in the lscpu -e", "l3cache", "a l3cache for every CPU, or socket_by=package")
    error = _refused(parse_lscpu, _lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-p.txt"), socket_by="l3cache")
    _check(error, "socket_by=l3cache but CPUs 0-7 have no l3cache in the lscpu -p", "l3cache", "a l3cache for every CPU, or socket_by=package")


def test_e5410_russian_lscpu_e_with_localized_no_words_drops_those_cpus():
    # the same capture with CPUs 6 and 7 marked offline the way a localized lscpu prints it ('нет', upper case too)
    lines = _lscpu("netutils-linux_issue169_xeon_e5410_2s_lscpu-e_ru.txt").splitlines()
    lines[7] = lines[7].replace("да", "нет")
    lines[8] = lines[8].replace("да", "НЕТ")
    view = parse_lscpu("\n".join(lines) + "\n")
    assert view == _view("lscpu -e", [[[0], [2], [4]], [[1], [3], [5]]], notes=["offline CPUs left out: 6-7"])


# --------------------------------------------------------------------------- lscpu -p, synthetic tables

SYNTHETIC_P_NOSMT = """\
# CPU,Core,Socket,Node,Online
0,0,0,0,Y
1,1,0,0,Y
2,2,1,1,Y
3,3,1,1,Y
4,0,0,0,N
5,1,0,0, no
6,,,,
7,-,-,-,Y
"""


def test_synthetic_p_offline_and_unplaced_cpus_are_left_out_with_a_note():
    # 4 and 5 have ids but are offline ('N', ' no'); 6 (empty cells) and 7 ('-') have no socket/core
    view = parse_lscpu(SYNTHETIC_P_NOSMT)
    assert view == _view("lscpu -p", [[[0], [1]], [[2], [3]]], notes=["offline or unplaced CPUs left out: 4-7"])
    assert view["excluded"] == {}  # offline CPUs are only in the note


def test_synthetic_p_only_cpus_must_be_online_and_the_rest_is_excluded():
    view = parse_lscpu(SYNTHETIC_P_NOSMT, only_cpus="0-1")
    assert view == _view("lscpu -p", [[[0], [1]]], excluded={2: "not in only_cpus", 3: "not in only_cpus"},
                         notes=["offline or unplaced CPUs left out: 4-7"])
    error = _refused(parse_lscpu, SYNTHETIC_P_NOSMT, only_cpus="0,4")
    _check(error, "only_cpus 4 are not online CPUs of this node (online: 0-3)", "0,4", "a subset of 0-3")


def test_synthetic_p_socket_by_numa_node_and_unknown_socket_by():
    assert parse_lscpu(SYNTHETIC_P_NOSMT, socket_by="numa_node") == _view(
        "lscpu -p", [[[0], [1]], [[2], [3]]], socket_by="numa_node", notes=["offline or unplaced CPUs left out: 4-7"])
    error = _refused(parse_lscpu, SYNTHETIC_P_NOSMT, socket_by="socket")
    _check(error, "socket_by 'socket' is not known", "socket", "one of package, numa_node, l3cache")


SYNTHETIC_P_L3 = """\
# CPU,Core,Socket,Node,,L1d,L1i,L2,L3
0,0,0,0,,0,0,0,0
1,1,0,0,,1,1,1,1
2,2,0,0,,2,2,2,0
3,3,0,0,,3,3,3,1
4,0,0,0,,0,0,0,0
5,1,0,0,,1,1,1,1
6,2,0,0,,2,2,2,0
7,3,0,0,,3,3,3,1
"""


def test_synthetic_p_l3_column_orders_the_cores_and_can_be_the_socket():
    # L3 0 holds cores 0 and 2, L3 1 cores 1 and 3: hwloc walks L3 0 first, so core 2 comes second
    assert parse_lscpu(SYNTHETIC_P_L3) == _view("lscpu -p", [[[0, 4], [2, 6], [1, 5], [3, 7]]])
    assert parse_lscpu(SYNTHETIC_P_L3, socket_by="l3cache") == _view("lscpu -p", [[[0, 4], [2, 6]], [[1, 5], [3, 7]]], socket_by="l3cache")


def test_synthetic_p_l3_dash_means_no_l3_for_that_cpu():
    text = SYNTHETIC_P_L3.replace("3,3,0,0,,3,3,3,1\n", "3,3,0,0,,3,3,3,-\n")
    # L3 is no longer a level of every CPU, so it orders nothing
    assert parse_lscpu(text) == _view("lscpu -p", [[[0, 4], [1, 5], [2, 6], [3, 7]]])
    error = _refused(parse_lscpu, text, socket_by="l3cache")
    _check(error, "socket_by=l3cache but CPUs 3 have no l3cache in the lscpu -p", "l3cache", "a l3cache for every CPU, or socket_by=package")


def test_p_columns_are_found_by_name_with_spaces_and_any_order():
    # lscpu --parse=CPU,SOCKET,CORE prints the columns in the order asked for
    text = "#CPU, Socket ,Core\n0,0,0\n1,0,1\n2,1,0\n 3 , 1 , 1 \n"
    assert parse_lscpu(text) == _view("lscpu -p", [[[0], [1]], [[2], [3]]])


def test_p_only_the_first_table_is_read_and_comments_and_blank_lines_before_data_are_skipped():
    first = "# The following is the parsable format\n# CPU,Core,Socket\n\n# starting from zero\n0,0,0\n1,1,0\n"
    # a second header right after the data ends the table (a second table would repeat CPU 0)
    assert parse_lscpu(first + "# CPU,Core,Socket\n0,0,0\n") == _view("lscpu -p", [[[0], [1]]])
    assert parse_lscpu(first + "\n2,2,0\n") == _view("lscpu -p", [[[0], [1]]])
    # a comment inside the data does not end it
    assert parse_lscpu(first + "# more\n2,2,0\n3,3,0\n") == _view("lscpu -p", [[[0], [1], [2], [3]]])


@pytest.mark.parametrize("text,message,value,expected", [
    ("# CPU,Node\n0,0\n", "lscpu -p header '# CPU,Node' has no Core column", "# CPU,Node",
     "lscpu -p with at least CPU,Core,Socket (the default columns)"),
    ("# CPU,Core,Node\n0,0,0\n", "lscpu -p header '# CPU,Core,Node' has no Socket column", "# CPU,Core,Node",
     "lscpu -p with at least CPU,Core,Socket (the default columns)"),
    ("# CPU,Core,Socket\n0,0,0\n1,0\n", "lscpu -p row '1,0' has 2 fields, the header 3", "1,0",
     "rows with as many comma separated fields as the header"),
    ("# CPU,Core,Socket\n0,0,0\n1,1,0,0\n", "lscpu -p row '1,1,0,0' has 4 fields, the header 3", "1,1,0,0",
     "rows with as many comma separated fields as the header"),
    ("# CPU,Core,Socket\n0,0,0\n-,1,0\n", "lscpu -p row '-,1,0' has no CPU number", "-,1,0", "a CPU number in the first column"),
    ("# CPU,Core,Socket\n,1,0\n", "lscpu -p row ',1,0' has no CPU number", ",1,0", "a CPU number in the first column"),
    ("# CPU,Core,Socket\n0,0,0\n1,1,0\n0,1,0\n", "CPU 0 appears twice in the lscpu output", "0,1,0", "one row per CPU"),
    ("# CPU,Core,Socket\ncpu0,0,0\n", "lscpu column CPU of CPU ? is 'cpu0'", "cpu0", "a number, '-' or nothing"),
    ("# CPU,Core,Socket\n0,0,0\n3,1,s1\n", "lscpu column Socket of CPU 3 is 's1'", "s1", "a number, '-' or nothing"),
    ("# CPU,Core,Socket\n0,-1,0\n", "lscpu column Core of CPU 0 is '-1'", "-1", "a number, '-' or nothing"),
    ("# CPU,Core,Socket,Node\n0,0,0,n0\n", "lscpu column Node of CPU 0 is 'n0'", "n0", "a number, '-' or nothing"),
    ("# CPU,Core,Socket,Node,,L1d,L1i,L2,L3\n0,0,0,0,,0,0,0, x \n", "lscpu column L3 of CPU 0 is 'x'", "x", "a number, '-' or nothing"),
])
def test_bad_lscpu_p_tables(text, message, value, expected):
    _check(_refused(parse_lscpu, text), message, value, expected)


def test_text_that_is_no_lscpu_table():
    text = "Architecture: x86_64\n" + "x" * 300
    _check(_refused(parse_lscpu, text), "no lscpu -p header ('# CPU,Core,Socket,...') nor lscpu -e header ('CPU NODE SOCKET CORE ...') in the text",
           text[:200], "the output of lscpu -p or lscpu -e")
    # the -e header needs CPU first and both SOCKET and CORE; lower-case -p headers are not lscpu's
    for other in ("CPU NODE CORE\n0 0 0\n", "NODE CPU SOCKET CORE\n0 0 0 0\n", "# cpu,core,socket\n0,0,0\n"):
        assert str(_refused(parse_lscpu, other)).startswith("no lscpu -p header")
    _check(_refused(parse_lscpu, b"# CPU,Core,Socket\n0,0,0\n"), "lscpu output must be text, not bytes", b"# CPU,Core,Socket\n0,0,0\n",
           "lscpu -p or lscpu -e output")


# --------------------------------------------------------------------------- lscpu -e, synthetic tables

SYNTHETIC_E_L3 = """\
$ lscpu -e
CPU NODE SOCKET CORE L1d:L1i:L2:L3 ONLINE    MAXMHZ   MINMHZ
  0    0      0    0 0:0:0:0          yes 3500.0000 800.0000
  1    0      0    1 1:1:1:1          yes 3500.0000 800.0000
  2    0      0    2 2:2:2:0          yes 3500.0000 800.0000
  3    0      0    3 3:3:3:1          yes 3500.0000 800.0000
  4    0      0    0 0:0:0:0          yes 3500.0000 800.0000
  5    0      0    1 1:1:1:1          yes 3500.0000 800.0000
  6    0      0    2 2:2:2:0          yes 3500.0000 800.0000
  7    0      0    3 3:3:3:1          yes 3500.0000 800.0000
  8    -      -    - -                 no         -        -
  9    0      0    3 3:3:3:1           NO 3500.0000 800.0000
"""


def test_synthetic_e_cache_column_l3_part_orders_cores_and_offline_rows_are_noted():
    # L3 is the 4th part of L1d:L1i:L2:L3 (0,1,0,1 for cores 0-3; L2 is the core): cores 0,2 share L3 0
    view = parse_lscpu(SYNTHETIC_E_L3)
    assert view == _view("lscpu -e", [[[0, 4], [2, 6], [1, 5], [3, 7]]], notes=["offline CPUs left out: 8-9"])
    assert parse_lscpu(SYNTHETIC_E_L3, socket_by="l3cache") == _view(
        "lscpu -e", [[[0, 4], [2, 6]], [[1, 5], [3, 7]]], socket_by="l3cache", notes=["offline CPUs left out: 8-9"])


def test_e_cache_values_that_do_not_match_the_parts_give_no_l3():
    text = "CPU SOCKET CORE L1d:L1i:L2:L3\n0 0 0 0:0:0:0\n1 0 1 1:1:1\n"
    assert parse_lscpu(text) == _view("lscpu -e", [[[0], [1]]])
    _check(_refused(parse_lscpu, text, socket_by="l3cache"), "socket_by=l3cache but CPUs 1 have no l3cache in the lscpu -e", "l3cache",
           "a l3cache for every CPU, or socket_by=package")


def test_e_without_cache_node_or_online_columns():
    text = "CPU SOCKET CORE\n0 0 0\n1 0 1\n2 1 0\n3 1 1\n"
    assert parse_lscpu(text) == _view("lscpu -e", [[[0], [1]], [[2], [3]]])
    _check(_refused(parse_lscpu, text, socket_by="numa_node"), "socket_by=numa_node but CPUs 0-3 have no numa node in the lscpu -e",
           "numa_node", "a numa node for every CPU, or socket_by=package")


@pytest.mark.parametrize("word", ["no", "non", "nein", "нет", "否", "nie", "não", "nao", "nej", "ei", "ne", "NEIN", "Nej"])
def test_e_localized_no_words_mean_offline(word):
    text = "CPU SOCKET CORE ONLINE\n0 0 0 yes\n1 0 1 ja\n2 0 0 %s\n" % word
    # CPU 2 would otherwise be a second thread of core 0 and make the node non-uniform
    assert parse_lscpu(text) == _view("lscpu -e", [[[0], [1]]], notes=["offline CPUs left out: 2"])


def test_p_offline_words_are_y_n_only():
    # lscpu -p prints Online as Y/N; 'N' in any case and 'no' are offline
    for word in ("N", "n", "no", " NO "):
        text = "# CPU,Core,Socket,Online\n0,0,0,Y\n1,1,0,Y\n2,0,0,%s\n" % word
        assert parse_lscpu(text) == _view("lscpu -p", [[[0], [1]]], notes=["offline or unplaced CPUs left out: 2"])


def test_e_only_the_first_table_is_read():
    table = "CPU SOCKET CORE\n0 0 0\n1 0 1\n"
    assert parse_lscpu(table + table) == _view("lscpu -e", [[[0], [1]]])
    assert parse_lscpu("\n" + table + "\n2 0 2\n") == _view("lscpu -e", [[[0], [1]]])


@pytest.mark.parametrize("text,message,value,expected", [
    ("CPU NODE SOCKET CORE ONLINE\n  0    0      0    0  yes\n  1    0      0    1\n",
     "lscpu -e row '  1    0      0    1' has 4 fields, the header 5", "  1    0      0    1", "rows with one field per header column"),
    ("CPU SOCKET CORE\n- 0 0\n", "lscpu -e row '- 0 0' has no CPU number", "- 0 0", "a CPU number in the CPU column"),
    ("CPU SOCKET CORE\n0 0 0\n0 0 1\n", "CPU 0 appears twice in the lscpu output", "0 0 1", "one row per CPU"),
    ("CPU SOCKET CORE\n0 0 0\n1 x 1\n", "lscpu column SOCKET of CPU 1 is 'x'", "x", "a number, '-' or nothing"),
    ("CPU SOCKET CORE\n0 0 0.5\n", "lscpu column CORE of CPU 0 is '0.5'", "0.5", "a number, '-' or nothing"),
    ("CPU NODE SOCKET CORE\n0 n 0 0\n", "lscpu column NODE of CPU 0 is 'n'", "n", "a number, '-' or nothing"),
    ("CPU SOCKET CORE L1d:L1i:L2:L3\n0 0 0 0:0:0:x\n", "lscpu column L3 of CPU 0 is 'x'", "x", "a number, '-' or nothing"),
])
def test_bad_lscpu_e_tables(text, message, value, expected):
    _check(_refused(parse_lscpu, text), message, value, expected)


def test_topology_view_lscpu_errors_name_the_node_and_keep_the_details():
    error = _refused(topology_view, {"lscpu": "CPU SOCKET CORE\n0 0 0\n0 0 1\n"}, name="gpu001")
    _check(error, "node gpu001: CPU 0 appears twice in the lscpu output", "0 0 1", "one row per CPU")
    # the first threads only: the L3 sockets hold CPUs 0,2 and 1,3
    assert topology_view({"lscpu": SYNTHETIC_P_L3}, socket_by="l3cache", only_cpus="0-3") == _view(
        "lscpu -p", [[[0], [2]], [[1], [3]]], socket_by="l3cache", excluded=dict((c, "not in only_cpus") for c in range(4, 8)))


# --------------------------------------------------------------------------- topology dicts: groups


def test_groups_whole_view_with_numa_and_l3_lists():
    data = {"sockets": ["0-3,8-11", "4-7,12-15"], "cores": ["%d,%d" % (c, c + 8) for c in range(8)],
            "numa_nodes": ["0-3,8-11", "4-7,12-15"], "l3cache": ["0,2,8,10", "1,3,9,11", "4-7,12-15"]}
    # socket 0: L3 0 = cores 0,2; L3 1 = cores 1,3 -> 0,2,1,3; socket 1 is one L3 -> 4,5,6,7
    assert topology_from_dict(data) == _view("topology", [[[0, 8], [2, 10], [1, 9], [3, 11]], [[4, 12], [5, 13], [6, 14], [7, 15]]])
    assert topology_from_dict(data, socket_by="numa_node") == _view(
        "topology", [[[0, 8], [2, 10], [1, 9], [3, 11]], [[4, 12], [5, 13], [6, 14], [7, 15]]], socket_by="numa_node")


def test_groups_siblings_alias_lists_of_ints_and_ignored_extra_cpus():
    # "siblings" is read as "cores"; CPU 100 of the NUMA list is in no socket and is ignored; "l3cache": None is no list
    data = {"sockets": [[0, 1, 2, 3]], "siblings": [[0, 2], [1, 3]], "numa_nodes": [[0, 1, 2, 3, 100]], "l3cache": None}
    assert topology_from_dict(data) == _view("topology", [[[0, 2], [1, 3]]])
    assert topology_from_dict(data, socket_by="numa_node") == _view("topology", [[[0, 2], [1, 3]]], socket_by="numa_node")
    # "cores" wins over "siblings"
    both = {"sockets": ["0-3"], "cores": ["0-1", "2-3"], "siblings": ["0", "1", "2", "3"]}
    assert topology_from_dict(both) == _view("topology", [[[0, 1], [2, 3]]])


def test_groups_only_cpus():
    data = {"sockets": ["0-3", "4-7"], "cores": ["0,1", "2,3", "4,5", "6,7"]}
    assert topology_from_dict(data, only_cpus="0-3") == _view(
        "topology", [[[0, 1], [2, 3]]], excluded=dict((c, "not in only_cpus") for c in range(4, 8)))
    # what is left must still be numbered 0 to n-1 by slurmd
    error = _refused(topology_from_dict, data, only_cpus="4-7")
    assert str(error).startswith("CPU 7 is not below the 4 CPUs slurmd sees (CPUs 4-7); ")
    assert error.details == {"value": "4-7", "expected": "online CPU ids 0 to 3 (bring offline CPUs online)"}


GROUPS_EXPECTED = "{'sockets': ['0-23,48-71', '24-47,72-95'], 'cores': ['0,48', '1,49', ...]}"


@pytest.mark.parametrize("data", [
    {"sockets": [], "cores": ["0"]},
    {"sockets": ["0"], "cores": []},
    {"sockets": ["0"]},
    {"cores": ["0"]},
    {"sockets": "0-3", "cores": ["0"]},
    {"sockets": ["0-3"], "cores": "0,1"},
    {"siblings": [[0, 1]]},
])
def test_groups_need_non_empty_socket_and_core_lists(data):
    _check(_refused(topology_from_dict, data), "a grouped topology needs non-empty 'sockets' and 'cores' lists", data, GROUPS_EXPECTED)


def test_groups_errors_name_the_group():
    error = _refused(topology_from_dict, {"sockets": ["0-3", "4-x"], "cores": ["0"]})
    assert str(error).startswith("socket 1 '4-x' is not a CPU list: ")
    assert error.value == "4-x"
    _check(_refused(topology_from_dict, {"sockets": ["0-3", "3-7"], "cores": ["0"]}), "CPU 3 is in two sockets", ["0-3", "3-7"],
           "disjoint CPU lists, one per socket")
    _check(_refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-1", ""]}), "empty core in the topology", "",
           "a non-empty CPU list per core")
    _check(_refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-1", "2-3", "4-5"]}), "core 4-5 has CPU 4 that is in no socket", "4-5",
           "cores made of the sockets' CPUs")
    _check(_refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-1", "1-3"]}), "CPU 1 is in two cores", "1-3",
           "disjoint CPU lists, one per core (SMT sibling group)")
    _check(_refused(topology_from_dict, {"sockets": ["0-3", "4-7"], "cores": ["0-3", "4,5"]}), "CPUs 6-7 are in a socket but in no core", [6, 7],
           "every socket CPU in one core")
    error = _refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-3"], "numa_nodes": ["0-3", "x"]})
    assert str(error).startswith("numa_nodes 1 'x' is not a CPU list: ")
    error = _refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-3"], "l3cache": ["y"]})
    assert str(error).startswith("l3cache 0 'y' is not a CPU list: ")
    error = _refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-1", "2-3"]}, socket_by="l3cache")
    _check(error, "socket_by=l3cache but CPUs 0-3 have no l3cache in the topology", "l3cache", "a l3cache for every CPU, or socket_by=package")
    error = _refused(topology_from_dict, {"sockets": ["0-3"], "cores": ["0-1", "2-3"], "numa_nodes": ["0-1"]}, socket_by="numa_node")
    _check(error, "socket_by=numa_node but CPUs 2-3 have no numa node in the topology", "numa_node",
           "a numa node for every CPU, or socket_by=package")


def test_groups_a_numa_node_that_splits_a_core_is_refused():
    data = {"sockets": [[0, 1, 4, 5]], "siblings": [[0, 4], [1, 5]], "numa_nodes": ["0-1", "4-5"]}
    _check(_refused(topology_from_dict, data, socket_by="numa_node"), "core 0,4 spans 2 numa_node groups; a core must lie in one numa_node",
           [0, 4], "SMT siblings in one socket")


# --------------------------------------------------------------------------- topology dicts: per-CPU entries


def test_per_cpu_whole_view_with_aliases_and_levels():
    entries = [{"cpu": c, "package": c % 2, "core_id": (c % 8) // 2, "node": c % 2, "l3": c % 2} for c in range(16)]
    # socket s = CPUs of parity s; core (s, k) = CPUs 2k+s and 2k+s+8
    sockets = [[[2 * k + s, 2 * k + s + 8] for k in range(4)] for s in range(2)]
    assert topology_from_dict(entries) == _view("topology", sockets)
    assert topology_from_dict({"cpus": entries}, socket_by="numa_node") == _view("topology", sockets, socket_by="numa_node")
    assert topology_from_dict(tuple(entries), socket_by="l3cache") == _view("topology", sockets, socket_by="l3cache")


def test_per_cpu_levels_order_cores_and_none_values_are_absent():
    entries = [{"cpu": c, "socket": 0, "core": c, "l3cache": c % 2, "numa_node": None} for c in range(4)]
    assert topology_from_dict(entries) == _view("topology", [[[0], [2], [1], [3]]])
    _check(_refused(topology_from_dict, entries, socket_by="numa_node"), "socket_by=numa_node but CPUs 0-3 have no numa node in the topology",
           "numa_node", "a numa node for every CPU, or socket_by=package")
    # a None under the first name falls through to the alias
    entries = [{"cpu": c, "socket": 0, "core": c, "numa_node": None, "node": c // 2} for c in range(4)]
    assert topology_from_dict(entries, socket_by="numa_node") == _view("topology", [[[0], [1]], [[2], [3]]], socket_by="numa_node")


def test_per_cpu_core_ids_are_per_socket_and_the_first_name_wins():
    # core 0 of socket 0 and core 0 of socket 1 are different cores
    entries = [{"cpu": 0, "socket": 0, "core": 0}, {"cpu": 1, "socket": 1, "core": 0}]
    assert topology_from_dict(entries) == _view("topology", [[[0]], [[1]]])
    # "socket" before "package": one socket of two cores, not two sockets
    entries = [{"cpu": 0, "socket": 0, "package": 0, "core": 0}, {"cpu": 1, "socket": 0, "package": 1, "core": 1}]
    assert topology_from_dict(entries) == _view("topology", [[[0], [1]]])
    # "core" before "core_id": one core of two threads, not two cores
    entries = [{"cpu": 0, "socket": 0, "core": 0, "core_id": 0}, {"cpu": 1, "socket": 0, "core": 0, "core_id": 1}]
    assert topology_from_dict(entries) == _view("topology", [[[0, 1]]])
    # "numa_node" before "node", "l3cache" before "l3"
    entries = [{"cpu": c, "socket": 0, "core": c, "numa_node": c // 2, "node": 0} for c in range(4)]
    assert topology_from_dict(entries, socket_by="numa_node") == _view("topology", [[[0], [1]], [[2], [3]]], socket_by="numa_node")
    entries = [{"cpu": c, "socket": 0, "core": c, "l3cache": c % 2, "l3": 0} for c in range(4)]
    assert topology_from_dict(entries, socket_by="l3cache") == _view("topology", [[[0], [2]], [[1], [3]]], socket_by="l3cache")


def test_per_cpu_levels_that_do_not_nest_are_left_out_with_a_note():
    # NUMA nodes {0,1},{2,3} and L3s {0,2},{1,3}: the L3s cross the NUMA nodes, so they order nothing
    entries = [{"cpu": c, "socket": 0, "core": c, "node": c // 2, "l3": c % 2} for c in range(4)]
    assert topology_from_dict(entries) == _view("topology", [[[0], [1], [2], [3]]],
                                                notes=["l3cache groups do not nest in package/numa_node; left out of the ordering",
                                                       MULTI_NUMA % "0"])


def test_per_cpu_only_cpus_and_topology_view_cores_form():
    entries = [{"cpu": c, "package": 0, "core_id": c % 2} for c in range(4)]
    # cores {0,2} and {1,3}; keeping 0 and 1 leaves two one-thread cores
    assert topology_view({"cores": entries}) == _view("topology", [[[0, 2], [1, 3]]])
    assert topology_view({"cores": entries}, only_cpus=[0, 1]) == _view(
        "topology", [[[0], [1]]], excluded={2: "not in only_cpus", 3: "not in only_cpus"})


@pytest.mark.parametrize("data", [[], (), {}, {"cpus": []}, "0-3", None, 4, {"cpus": "0-3"}])
def test_per_cpu_needs_a_non_empty_list(data):
    value = data["cpus"] if isinstance(data, dict) and "cpus" in data else data
    _check(_refused(topology_from_dict, data), "the topology must be a non-empty list of CPUs or a dict with sockets and cores", value,
           "{'sockets': ['0-23,48-71', ...], 'cores': ['0,48', ...]} or [{'cpu': 0, 'socket': 0, 'core': 0}, ...]")


@pytest.mark.parametrize("entry,key", [
    ({"socket": 0, "core": 0}, "cpu"),
    ({"cpu": -1, "socket": 0, "core": 0}, "cpu"),
    ({"cpu": "0", "socket": 0, "core": 0}, "cpu"),
    ({"cpu": True, "socket": 0, "core": 0}, "cpu"),
    ({"cpu": 0.0, "socket": 0, "core": 0}, "cpu"),
    ({"cpu": 0, "core": 0}, "socket"),
    ({"cpu": 0, "socket": None, "core": 0}, "socket"),
    ({"cpu": 0, "package": False, "core": 0}, "socket"),
    ({"cpu": 0, "socket": -2, "package": 0, "core": 0}, "socket"),
    ({"cpu": 0, "socket": 0}, "core"),
    ({"cpu": 0, "socket": 0, "core_id": -1}, "core"),
    ({"cpu": 0, "package": 0, "core": "1"}, "core"),
])
def test_per_cpu_entries_need_non_negative_integers(entry, key):
    entries = [{"cpu": 9, "socket": 0, "core": 9}, entry]
    _check(_refused(topology_from_dict, entries), "topology entry %r has no non-negative integer %s" % (entry, key), entry, DICT_ENTRY)


def test_per_cpu_other_errors():
    _check(_refused(topology_from_dict, [{"cpu": 0, "socket": 0, "core": 0}, [1, 0, 0]]), "topology entry [1, 0, 0] is not a dict", [1, 0, 0],
           DICT_ENTRY)
    _check(_refused(topology_from_dict, [5]), "topology entry 5 is not a dict", 5, DICT_ENTRY)
    entries = [{"cpu": 1, "socket": 0, "core": 0}, {"cpu": 1, "socket": 0, "core": 1}]
    _check(_refused(topology_from_dict, entries), "CPU 1 appears twice in the topology", entries[1], "one entry per CPU")
    # zero is a valid id everywhere
    assert topology_from_dict([{"cpu": 0, "socket": 0, "core": 0}]) == _view("topology", [[[0]]])


def test_topology_view_counts_and_their_errors():
    assert topology_view({"sockets": 2, "cores_per_socket": 2, "threads_per_core": 2}) == _view(
        "counts", [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    _check(_refused(topology_view, {"sockets": 1, "cores_per_socket": 0, "threads_per_core": 1}), "cores_per_socket=0 is not positive", 0,
           "an integer of at least 1")
    _check(_refused(topology_view, {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 1}, socket_by="l3cache", name="n1"),
           "node n1: socket_by=l3cache needs the node's NUMA nodes or L3 caches; counts only describe packages", "l3cache",
           "socket_by=package, or a topology with CPU lists")
    _check(_refused(topology_view, {"siblings": [[0, 1]]}), "the topology has SMT sibling groups but no sockets: Slurm numbers CPUs by socket first",
           ["siblings"], "lscpu, sockets/cores lists, per-CPU socket and core, or the sockets/cores_per_socket/threads_per_core counts")


# --------------------------------------------------------------------------- scontrol show node, real captures

GPU010 = {
    "NodeName": "gpu010", "Arch": "x86_64", "CoresPerSocket": "24",
    "CPUAlloc": "0", "CPUEfctv": "94", "CPUTot": "96", "CPULoad": "0.01",
    "AvailableFeatures": "EPYC-9654,V12,COMPUTE_CAPABILITY_12_0,COMPUTE_TYPE_BLACKWELL,nvidia_geforce_rtx_5090",
    "ActiveFeatures": "EPYC-9654,V12,COMPUTE_CAPABILITY_12_0,COMPUTE_TYPE_BLACKWELL,nvidia_geforce_rtx_5090",
    "Gres": "gpu:nvidia_geforce_rtx_5090:4(S:0-3),VramPerGpu:no_consume:32G",
    "NodeAddr": "gpu010", "NodeHostName": "gpu010", "Version": "25.11.3",
    "OS": "Linux 5.14.0-570.58.1.el9_6.x86_64 #1 SMP PREEMPT_DYNAMIC Fri Oct 31 13:55:05 UTC 2025",
    "RealMemory": "384000", "AllocMem": "0", "FreeMem": "155290", "Sockets": "4", "Boards": "1",
    "CoreSpecCount": "2", "CPUSpecList": "71,95",
    "State": "IDLE+DRAIN", "ThreadsPerCore": "1", "TmpDisk": "7123000", "Weight": "10", "Owner": "N/A", "MCS_label": "N/A",
    "Partitions": "private-kalousis-gpu,shared-gpu",
    "BootTime": "2026-02-26T09:43:05", "SlurmdStartTime": "2026-03-31T13:59:26",
    "LastBusyTime": "2026-04-29T12:48:47", "ResumeAfterTime": "None",
    "CfgTRES": "cpu=94,mem=375G,billing=231,gres/gpu=4,gres/gpu:nvidia_geforce_rtx_5090=4",
    "AllocTRES": "",
    "CurrentWatts": "n/a", "AveWatts": "n/a",
    "Reason": "health_ps___blocked [root@2026-04-29T03:06:18]",
}
GPU009 = dict(GPU010, NodeName="gpu009", NodeAddr="gpu009", NodeHostName="gpu009", FreeMem="185260", BootTime="2026-02-26T09:43:06",
              SlurmdStartTime="2026-03-31T13:59:24", Reason="health_ps___blocked [root@2026-04-29T03:00:18]")

DCCN_C083 = {
    "NodeName": "dccn-c083", "Arch": "x86_64", "CoresPerSocket": "32",
    "CPUAlloc": "2", "CPUEfctv": "63", "CPUTot": "64", "CPULoad": "3.00",
    "AvailableFeatures": "(null)", "ActiveFeatures": "(null)",
    "Gres": "cpu:amd:1,gpu:nvidia_a100-sxm4-40gb:4(S:0-1)",
    "NodeAddr": "dccn-c083", "NodeHostName": "dccn-c083", "Version": "22.05.10",
    "OS": "Linux 4.18.0-553.8.1.el8_10.x86_64 #1 SMP Tue Jul 2 07:26:33 EDT 2024",
    "RealMemory": "515578", "AllocMem": "106496", "FreeMem": "80395", "Sockets": "2", "Boards": "1",
    "CoreSpecCount": "1", "CPUSpecList": "63", "MemSpecLimit": "4096",
    "State": "MIXED", "ThreadsPerCore": "1", "TmpDisk": "3604221", "Weight": "1", "Owner": "N/A", "MCS_label": "N/A",
    "Partitions": "gpu,batch",
    "BootTime": "2024-11-14T17:10:50", "SlurmdStartTime": "2024-11-14T17:11:52",
    "LastBusyTime": "2024-11-20T17:22:56",
    "CfgTRES": "cpu=63,mem=515578M,billing=63,gres/gpu=4,gres/gpu:nvidia_a100-sxm4-40gb=4",
    "AllocTRES": "cpu=2,mem=104G,gres/gpu=1,gres/gpu:nvidia_a100-sxm4-40gb=1",
    "CapWatts": "n/a",
    "CurrentWatts": "0", "AveWatts": "0",
    "ExtSensorsJoules": "n/s", "ExtSensorsWatts": "0", "ExtSensorsTemp": "n/s",
}
DCCN_C084 = dict(DCCN_C083, NodeName="dccn-c084", NodeAddr="dccn-c084", NodeHostName="dccn-c084", CPUAlloc="10", CPULoad="0.01",
                 AllocMem="128000", FreeMem="375161", State="IDLE", BootTime="2024-11-19T13:53:34", SlurmdStartTime="2024-11-19T13:54:41",
                 LastBusyTime="2024-11-20T15:16:28", AllocTRES="")

RCL_NV2 = {
    "NodeName": "rcl-nv2.ece.ubc.ca", "Arch": "x86_64", "CoresPerSocket": "56",
    "CPUAlloc": "88", "CPUEfctv": "192", "CPUTot": "224", "CPULoad": "18.41",
    "RealMemory": "2060000", "AllocMem": "706560", "FreeMem": "224124", "Sockets": "2", "Boards": "1",
    "CoreSpecCount": "16", "CPUSpecList": "96-111,208-223", "MemSpecLimit": "65536",
    "State": "MIXED", "ThreadsPerCore": "2", "TmpDisk": "0", "Weight": "1",
    "CfgTRES": "cpu=192,mem=2060000M,billing=448,gres/gpu=16,gres/gpu:nvidia_b200=4",
    "AllocTRES": "cpu=88,mem=690G,gres/gpu=8,gres/gpu:nvidia_b200=3",
}

NVML_MASTER = {
    "NodeName": "master", "Arch": "x86_64", "CoresPerSocket": "10",
    "CPUAlloc": "0", "CPUEfctv": "20", "CPUTot": "20", "CPULoad": "0.04",
    "AvailableFeatures": "(null)", "ActiveFeatures": "(null)",
    "Gres": "gpu:quadro_p1000:1(S:0)",
    "GresDrain": "N/A", "GresUsed": "gpu:quadro_p1000:0(IDX:N/A)",
    "NodeAddr": "master", "NodeHostName": "master", "Version": "23.11.3",
    "OS": "Linux 5.14.0-611.20.1.el9_7.x86_64 #1 SMP PREEMPT_DYNAMIC Thu Jan 15 13:21:39 UTC 2026",
    "RealMemory": "62715", "AllocMem": "0", "FreeMem": "56761", "Sockets": "1", "Boards": "1",
    "State": "IDLE", "ThreadsPerCore": "2", "TmpDisk": "0", "Weight": "1", "Owner": "N/A", "MCS_label": "N/A",
    "Partitions": "debug",
    "BootTime": "2026-01-23T11:37:06", "SlurmdStartTime": "2026-01-24T11:08:56",
    "LastBusyTime": "2026-01-24T11:08:56", "ResumeAfterTime": "None",
    "CfgTRES": "cpu=20,mem=62715M,billing=20",
    "AllocTRES": "",
    "CapWatts": "n/a",
    "CurrentWatts": "0", "AveWatts": "0",
    "ExtSensorsJoules": "n/a", "ExtSensorsWatts": "0", "ExtSensorsTemp": "n/a",
}
NVML_WORKER1 = dict(NVML_MASTER, NodeName="worker1", NodeAddr="worker1", NodeHostName="worker1", CPULoad="0.01", FreeMem="60823",
                    Partitions="debug,gpu", BootTime="2026-01-23T12:37:22", SlurmdStartTime="2026-01-24T11:35:30",
                    LastBusyTime="2026-01-24T11:29:05")
NVML_WORKER2 = dict(NVML_MASTER, NodeName="worker2", NodeAddr="worker2", NodeHostName="worker2", CPULoad="0.00", FreeMem="61448",
                    Partitions="debug,gpu", BootTime="2026-01-21T17:48:15", SlurmdStartTime="2026-01-24T11:35:30",
                    LastBusyTime="2026-01-24T11:29:22")


def _without_detail(node):
    return dict((k, v) for k, v in node.items() if k not in ("GresDrain", "GresUsed"))


@pytest.mark.parametrize("name,expected", [
    ("show_node_gpu010_25.11.3_unige_bamboo_noindent.txt", [GPU010]),
    ("show_node_gpu009_25.11.3_unige_bamboo_noindent.txt", [GPU009]),
    ("show_node_dccn-c083_22.05.10.txt", [DCCN_C083]),
    ("show_node_dccn-c084_22.05.10.txt", [DCCN_C084]),
    ("show_node_rcl-nv2_b200_partial.txt", [RCL_NV2]),
    ("show_node_d_3nodes_23.11.3_nvml_report.txt", [NVML_MASTER, NVML_WORKER1, NVML_WORKER2]),
    ("show_node_o_3nodes_23.11.3_nvml_report.txt", [_without_detail(NVML_MASTER), _without_detail(NVML_WORKER1), _without_detail(NVML_WORKER2)]),
])
def test_scontrol_captures_every_field_of_every_node(name, expected):
    nodes = parse_scontrol_nodes(_text("scontrol", name))
    assert nodes == expected
    # the fields keep scontrol's order
    assert [list(node) for node in nodes] == [list(node) for node in expected]


def test_scontrol_two_captures_joined_and_indented_node_lines():
    text = _text("scontrol", "show_node_dccn-c083_22.05.10.txt") + "\n" + _text("scontrol", "show_node_dccn-c084_22.05.10.txt")
    assert parse_scontrol_nodes(text) == [DCCN_C083, DCCN_C084]
    # the same with the NodeName= lines indented and no blank line between the nodes
    indented = "\n".join("   " + line.lstrip() for line in text.splitlines() if line.strip())
    assert parse_scontrol_nodes(indented) == [DCCN_C083, DCCN_C084]


def test_scontrol_empty_outputs():
    for text in ("", "  \n\n", "No nodes in the system", "\nNo nodes in the system\n"):
        assert parse_scontrol_nodes(text) == []


def test_scontrol_free_text_and_continuation_lines():
    text = ("NodeName=n1 Arch=x86_64\n"
            "   OS=Linux 6.1 a=b #1 SMP\n"
            "   Foo=bar baz\n"
            "   Reason=moved to NodeName=n2 by admin Arch=arm [root@2026-01-01]\n"
            "   wrapped tail\n"
            "   TmpDisk=0 Weight=1\n")
    (node,) = parse_scontrol_nodes(text)
    # an unknown key inside OS is text; a new line starts afresh, so Foo= is a field; inside Reason a NodeName= and a key
    # already seen are text; a line without Key= continues the last value
    assert node == {"NodeName": "n1", "Arch": "x86_64", "OS": "Linux 6.1 a=b #1 SMP", "Foo": "bar baz",
                    "Reason": "moved to NodeName=n2 by admin Arch=arm [root@2026-01-01] wrapped tail", "TmpDisk": "0", "Weight": "1"}
    # in a free-text value a known key not yet seen starts a field (scontrol prints Reason last on its line)
    (node,) = parse_scontrol_nodes("NodeName=n1 Reason=down Weight=1\n")
    assert node == {"NodeName": "n1", "Reason": "down", "Weight": "1"}


def test_scontrol_errors():
    _check(_refused(parse_scontrol_nodes, None), "scontrol output must be text, not NoneType", None, "scontrol show node output")
    _check(_refused(parse_scontrol_nodes, b"NodeName=n1\n"), "scontrol output must be text, not bytes", b"NodeName=n1\n", "scontrol show node output")
    _check(_refused(parse_scontrol_nodes, "\n$ scontrol show node\nNodeName=n1 CPUTot=4\n"),
           "line 2 '$ scontrol show node' comes before any NodeName=", "$ scontrol show node",
           "scontrol show node output, starting with NodeName=")
    _check(_refused(parse_scontrol_nodes, "NodeName=n1 CPUTot=4 Arch=x CPUTot=8\n"), "key CPUTot appears twice for node n1 (line 1)",
           "NodeName=n1 CPUTot=4 Arch=x CPUTot=8", "scontrol show node output, each Key= once per node")
    _check(_refused(parse_scontrol_nodes, "NodeName=n1 CPUTot=4\n   Arch=x\n   CPUTot=8\n"), "key CPUTot appears twice for node n1 (line 3)",
           "   CPUTot=8", "scontrol show node output, each Key= once per node")
    # a key of the node before does not count for the next node
    assert parse_scontrol_nodes("NodeName=a CPUTot=1\nNodeName=b CPUTot=2\n") == [{"NodeName": "a", "CPUTot": "1"}, {"NodeName": "b", "CPUTot": "2"}]
