"""Table-driven tests for the CPU list and CPU mask helpers."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import (
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
        ("1,,2", "empty item", "1,,2"),
        ("1,", "empty item", "1,"),
        (",", "empty item", ","),
        ("abc", "cannot parse", "abc"),
        ("1-2-3", "cannot parse", "1-2-3"),
        ("0x3", "cannot parse", "0x3"),
        ("1.5", "cannot parse", "1.5"),
        ("8192", "beyond the limit", "8192"),
        ("0-9000", "beyond the limit", "0-9000"),
        ("0-7:3/2", "bad group", "0-7:3/2"),
        ("0-7:0/2", "bad group", "0-7:0/2"),
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
        ("", 8, "empty CPU mask"),
        ("  ", 8, "empty CPU mask"),
        ("1ff", 8, "wider than the 8 CPUs"),
        ("01,00000000", 32, "wider than the 32 CPUs"),
        ("xyz", 8, "bad word"),
        ("ff,,ff", 64, "bad word"),
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
