"""Table-driven tests for the CPU list and CPU mask helpers."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import (
    MAX_CPUS,
    CpuListError,
    cpulist_difference,
    cpulist_intersection,
    cpulist_union,
    format_cpulist,
    format_cpumask,
    parse_cpulist,
    parse_cpumask,
)


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("", []),
        ("\n", []),
        ("0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
        (" 4 , 5-6 ", [4, 5, 6]),
        ("7,3,3,1-2", [1, 2, 3, 7]),
        ("5-5", [5]),
        ("160-170", list(range(160, 171))),
        ("0-15:2/4", [0, 1, 4, 5, 8, 9, 12, 13]),
        ("0-9:1/3", [0, 3, 6, 9]),
        ("8191", [8191]),
        (3, [3]),
        ([3, 1, 2], [1, 2, 3]),
        (["4", 5], [4, 5]),
    ],
)
def test_parse_cpulist_accepts_kernel_forms(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    "text, fragment, value",
    [
        ("3-1", "reversed range", "3-1"),
        ("0-3,10-8", "reversed range", "10-8"),
        ("-1", "negative CPU number", "-1"),
        ("0,-2", "negative CPU number", "-2"),
        ("5:1/2", "cannot parse", "5:1/2"),
        ("0-", "cannot parse", "0-"),
        ("1-N", "CPU count is not known", "1-N"),
        ("all", "CPU count is not known", "all"),
        ("0-3\n4-7", "after a newline", "0-3\n4-7"),
        ("abc", "cannot parse", "abc"),
        ("1-2-3", "cannot parse", "1-2-3"),
        ("0x3", "cannot parse", "0x3"),
        ("1.5", "cannot parse", "1.5"),
        ("8192", "beyond the limit", "8192"),
        ("0-9000", "beyond the limit", "0-9000"),
        ("0-7:3/2", "bad group", "0-7:3/2"),
        ("0-7:1/0", "bad group", "0-7:1/0"),
        ([1, -1], "negative CPU number", -1),
        ([1, "x"], "is not a CPU number", "x"),
        (True, "is not a CPU list", True),
        (None, "is not a CPU list", None),
        (1.5, "is not a CPU list", 1.5),
    ],
)
def test_parse_cpulist_rejects_malformed_input_naming_the_value(text, fragment, value):
    with pytest.raises(CpuListError) as info:
        parse_cpulist(text)
    assert fragment in str(info.value)
    assert info.value.value == value
    assert info.value.expected
    assert set(info.value.details) == {"value", "expected"}


def test_parse_cpulist_honours_a_smaller_limit():
    with pytest.raises(CpuListError, match="limit of 8 CPUs"):
        parse_cpulist("0-8", max_cpus=8)


@pytest.mark.parametrize(
    "cpus, text",
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0-1"),
        ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
        ([11, 10, 8, 3, 2, 1, 0], "0-3,8,10-11"),
        ([1, 3, 5], "1,3,5"),
        ([5, 5, 6], "5-6"),
        (list(range(0, 176, 2)), ",".join(str(c) for c in range(0, 176, 2))),
    ],
)
def test_format_cpulist_is_compact_and_sorted(cpus, text):
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("text", ["0-3,8,10-11", "0", "1,3,5-9,4000-4095", "", "0-8191"])
def test_cpulist_round_trip(text):
    assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize(
    "mask, ncpus, cpus",
    [
        ("ff", 8, list(range(8))),
        ("01", 8, [0]),
        ("80", 8, [7]),
        ("ff,ffffffff", 40, list(range(40))),
        ("01,00000000", 40, [32]),
        ("0000,00000000,00000000,00000000,00000000,000007ff", 176, list(range(11))),
        ("00000000,00000001\n", 64, [0]),
        ("f", None, [0, 1, 2, 3]),
        ("0", 8, []),
        ("FF", 8, list(range(8))),
    ],
)
def test_parse_cpumask(mask, ncpus, cpus):
    assert parse_cpumask(mask, ncpus) == cpus


@pytest.mark.parametrize(
    "mask, ncpus, fragment",
    [
        ("0,00000000,00000000", 64, "more than the 64 CPUs of this machine need"),
        ("ff\nff", 64, "after a newline"),
        ("1ff", 8, "wider than the 8 CPUs"),
        ("01,00000000", 32, "wider than the 32 CPUs"),
        ("xyz", 8, "bad word"),
        ("ff;ff", 64, "bad word"),
        ("123456789", 64, "bad word"),
        ("0xff", 8, "bad word"),
        (",".join(["ffffffff"] * 258), None, "more than 8192 CPUs"),
    ],
)
def test_parse_cpumask_rejects_malformed_masks(mask, ncpus, fragment):
    with pytest.raises(CpuListError, match=fragment):
        parse_cpumask(mask, ncpus)


@pytest.mark.parametrize(
    "cpus, ncpus, mask",
    [
        (list(range(8)), 8, "ff"),
        ([0], 4, "1"),
        ([0], 1, "1"),
        ([32], 40, "01,00000000"),
        (list(range(40)), 40, "ff,ffffffff"),
        ([], 64, "00000000,00000000"),
        (list(range(160, 171)), 176, "07ff,00000000,00000000,00000000,00000000,00000000"),
        ([8191], 8192, "80000000" + ",00000000" * 255),
    ],
)
def test_format_cpumask_matches_kernel_padding(cpus, ncpus, mask):
    assert format_cpumask(cpus, ncpus) == mask


@pytest.mark.parametrize("cpus, ncpus", [([8], 8), ([0], 0), ([0], 8193), ([0], True)])
def test_format_cpumask_rejects_cpus_outside_the_mask(cpus, ncpus):
    with pytest.raises(CpuListError):
        format_cpumask(cpus, ncpus)


@pytest.mark.parametrize("ncpus", [1, 7, 8, 31, 32, 33, 64, 176, 1152, 8192])
def test_mask_and_list_convert_both_ways_for_any_width(ncpus):
    cpus = sorted({0, ncpus - 1, ncpus // 2, ncpus // 3})
    assert parse_cpumask(format_cpumask(cpus, ncpus), ncpus) == cpus


def test_max_cpus_is_8192():
    assert MAX_CPUS == 8192
    assert parse_cpulist("0-8191")[-1] == 8191


@pytest.mark.parametrize(
    "func, left, right, result",
    [
        (cpulist_difference, "0-15", "12-15", list(range(12))),
        (cpulist_difference, "0-3", "", [0, 1, 2, 3]),
        (cpulist_union, "0-3", [8, 9], [0, 1, 2, 3, 8, 9]),
        (cpulist_intersection, "0-7", "4-11", [4, 5, 6, 7]),
        (cpulist_intersection, "0-3", "4-7", []),
    ],
)
def test_set_operations(func, left, right, result):
    assert func(left, right) == result


# ---- the kernel's own test vectors (issue 29, class 4) ---------------------------------------------------------
# lib/test_bitmap.c, repository torvalds/linux, commit f5675ed7346513eaf28f498f18257ac2f89ac6f9 (GPL-2.0-only; the
# vectors are quoted as test data): parselist_tests[] and parse_tests[], each (errno, input, expected, nbits). The
# expected bitmaps are exp1[] / exp2 / parse_test[] / parse_test2[] of that file, written here as integers.
EXP1 = [1, 2, 0x0000FFFF, 0xFFFF0000, 0x55555555, 0xAAAAAAAA, 0x11111111, 0x22222222, 0xFFFFFFFF, 0xFFFFFFFE,
        0x3333333311111111, 0xFFFFFFFF77777777, 0, 0x00008000, 0x80000000]
EXP2 = 0xFFFFFFFF77777777 << 64 | 0x3333333311111111


def _bits(value):
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


PARSELIST_OK = [
    ("0", EXP1[0], 8), ("1", EXP1[1], 8), ("0-15", EXP1[2], 32), ("16-31", EXP1[3], 32), ("0-31:1/2", EXP1[4], 32),
    ("1-31:1/2", EXP1[5], 32), ("0-31:1/4", EXP1[6], 32), ("1-31:1/4", EXP1[7], 32), ("0-31:4/4", EXP1[8], 32),
    ("1-31:4/4", EXP1[9], 32), ("0-31:1/4,32-63:2/4", EXP1[10], 64), ("0-31:3/4,32-63:4/4", EXP1[11], 64),
    ("  ,,  0-31:3/4  ,, 32-63:4/4  ,,  ", EXP1[11], 64),
    ("0-31:1/4,32-63:2/4,64-95:3/4,96-127:4/4", EXP2, 128),
    ("", EXP1[12], 8), ("\n", EXP1[12], 8), (",,  ,,  , ,  ,", EXP1[12], 8), (" ,  ,,  , ,   ", EXP1[12], 8),
    (" ,  ,,  , ,   \n", EXP1[12], 8),
    ("0-0", EXP1[0], 32), ("1-1", EXP1[1], 32), ("15-15", EXP1[13], 32), ("31-31", EXP1[14], 32),
    ("0-0:0/1", EXP1[12], 32), ("0-0:1/1", EXP1[0], 32), ("0-0:1/31", EXP1[0], 32), ("0-0:31/31", EXP1[0], 32),
    ("1-1:1/1", EXP1[1], 32), ("0-15:16/31", EXP1[2], 32), ("15-15:1/2", EXP1[13], 32), ("15-15:31/31", EXP1[13], 32),
    ("15-31:1/31", EXP1[13], 32), ("16-31:16/31", EXP1[3], 32), ("31-31:31/31", EXP1[14], 32),
    ("N-N", EXP1[14], 32), ("0-0:1/N", EXP1[0], 32), ("0-0:N/N", EXP1[0], 32), ("0-15:16/N", EXP1[2], 32),
    ("15-15:N/N", EXP1[13], 32), ("15-N:1/N", EXP1[13], 32), ("16-N:16/N", EXP1[3], 32), ("N-N:N/N", EXP1[14], 32),
    ("0-N:1/3,1-N:1/3,2-N:1/3", EXP1[8], 32), ("0-31:1/3,1-31:1/3,2-31:1/3", EXP1[8], 32),
    ("1-10:8/12,8-31:24/29,0-31:0/3", EXP1[9], 32),
    ("all", EXP1[8], 32), ("0, 1, all,  ", EXP1[8], 32), ("all:1/2", EXP1[4], 32), ("ALL:1/2", EXP1[4], 32),
]
PARSELIST_ERR = [
    ("al", 8), ("alll", 8), ("-1", 8), ("-0", 8), ("10-1", 8), ("8-8", 8), ("0-31", 8), ("0-31:", 32), ("0-31:0", 32),
    ("0-31:0/", 32), ("0-31:0/0", 32), ("0-31:1/0", 32), ("0-31:10/1", 32), ("0-98765432123456789:10/1", 8),
    ("a-31", 8), ("0-a1", 8), ("a-31:10/1", 8), ("0-31:a/1", 8), ("0-\n", 8),
]


@pytest.mark.parametrize("text, expected, nbits", PARSELIST_OK)
def test_kernel_parselist_vectors_accepted(text, expected, nbits):
    assert parse_cpulist(text, ncpus=nbits) == _bits(expected)


@pytest.mark.parametrize("text, nbits", PARSELIST_ERR)
def test_kernel_parselist_vectors_refused(text, nbits):
    with pytest.raises(CpuListError) as info:
        parse_cpulist(text, ncpus=nbits)
    assert info.value.value is not None and info.value.expected


def test_kernel_parselist_timing_vector_and_node_count():
    # {0, "0-2047:128/256", NULL, 2048, PARSE_TIME}: 128 of every 256 CPUs.
    assert len(parse_cpulist("0-2047:128/256", ncpus=2048)) == 1024
    # nohz_full=1-N / rcu_nocbs=all on a 1,152-CPU node.
    assert parse_cpulist("1-N", ncpus=1152) == list(range(1, 1152))
    assert parse_cpulist("all", ncpus=1152) == list(range(1152))


PARSE_TEST2 = [0xDEADBEEF << 64 | 0x100000000, 0xBAADF00DDEADBEEF << 64 | 0x100000000,
               0x0BADF00DDEADBEEF << 64 | 0x100000000]
PARSE_OK = [
    ("", 0, 32), (" ", 0, 32), ("0", 0, 32), ("0\n", 0, 32), ("1", 1, 32), ("deadbeef", 0xDEADBEEF, 32),
    ("1,0", 0x100000000, 33), ("deadbeef,1,0", PARSE_TEST2[0], 96), ("baadf00d,deadbeef,1,0", PARSE_TEST2[1], 128),
    ("badf00d,deadbeef,1,0", PARSE_TEST2[2], 124), ("  badf00d,deadbeef,1,0  ", PARSE_TEST2[2], 124),
    (" , badf00d,deadbeef,1,0 , ", PARSE_TEST2[2], 124), (" , badf00d, ,, ,,deadbeef,1,0 , ", PARSE_TEST2[2], 124),
]
PARSE_ERR = [("goodfood,deadbeef,1,0", 128), ("3,0", 33), ("123badf00d,deadbeef,1,0", 128),
             ("badf00d,deadbeef,1,0", 90), ("fbadf00d,deadbeef,1,0", 95), ("badf00d,deadbeef,1,0", 100)]


@pytest.mark.parametrize("text, expected, nbits", PARSE_OK)
def test_kernel_parse_vectors_accepted(text, expected, nbits):
    assert parse_cpumask(text, nbits) == _bits(expected)


@pytest.mark.parametrize("text, nbits", PARSE_ERR)
def test_kernel_parse_vectors_refused(text, nbits):
    with pytest.raises(CpuListError):
        parse_cpumask(text, nbits)


def test_kernel_vector_with_text_after_a_newline_is_refused_on_purpose():
    # {0, "deadbeef,\n,0,1", &parse_test[2], 96}: the kernel reads "deadbeef" and ignores the rest. Here the rest
    # is refused, so a value that carries a second line never reaches a file (issue 27); a trailing newline is fine.
    with pytest.raises(CpuListError, match="after a newline"):
        parse_cpumask("deadbeef,\n,0,1", 96)
    assert parse_cpumask("deadbeef,\n", 96) == _bits(0xDEADBEEF)
