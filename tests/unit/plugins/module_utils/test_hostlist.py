# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm hostlist expressions, compared with the PyPI package python-hostlist (test-only, requirements-dev.txt)."""

from __future__ import annotations

import random
import sys

import pytest

import hostlist as reference

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.hostlist import (
    MAX_NAMES,
    HostlistError,
    compress,
    contains,
    count,
    expand,
    split,
)

PREFIXES = ["gpu", "node", "n", "rack", "c1n", "tux-", "x.y", "", "a_b", "login", "dev1", " sp ace"]
JOINS = ["", "-", "n", "-node", "s", "0", "."]
SUFFIXES = ["", "", "", "-ib", ".mgmt", "a", "7"]
MAX_ITEM = 2000


def _random_range(rng):
    width = rng.choice([1, 1, 1, 2, 3, 4])
    low = rng.randint(0, 120)
    if rng.random() < 0.3:
        return "%0*d" % (width, low)
    high = low + rng.choice([0, 1, 2, 5, 20, 60])
    high_text = rng.choice(["%d" % high, "%0*d" % (width, high), "%0*d" % (width + 1, high)])
    return "%0*d-%s" % (width, low, high_text)


def _random_item(rng, max_size=MAX_ITEM):
    if rng.random() < 0.15:
        return rng.choice(PREFIXES[:7]) + str(rng.randint(0, 30)) + rng.choice(SUFFIXES)
    while True:
        text = rng.choice(PREFIXES)
        size = 1
        for index in range(rng.choice([1, 1, 1, 2, 2, 3])):
            if index:
                text += rng.choice(JOINS)
            ranges = [_random_range(rng) for dummy in range(rng.choice([1, 1, 2, 3, 4]))]
            text += "[" + ",".join(ranges) + "]"
            size *= len(reference.expand_hostlist("x[%s]" % ",".join(ranges), allow_duplicates=True))
        text += rng.choice(SUFFIXES)
        if size <= max_size:
            return text


def _random_expr(rng):
    items = []
    for dummy in range(rng.choice([1, 1, 2, 3, 4])):
        if items and rng.random() < 0.15:
            items.append(rng.choice(items))  # duplicates across items
        else:
            items.append(_random_item(rng))
    return ",".join(items)


EXPRS = [_random_expr(random.Random(seed)) for seed in range(1200)]


def _random_names(rng):
    """A set of names: a sample of some expansions plus loose names, shuffled, with duplicates and blanks."""
    names = []
    for dummy in range(rng.choice([0, 1, 2, 3])):
        expanded = reference.expand_hostlist(_random_item(rng, max_size=400))
        names.extend(rng.sample(expanded, rng.randint(0, len(expanded))))
    for dummy in range(rng.randint(0, 40)):
        name = rng.choice(PREFIXES)
        for part in range(rng.choice([0, 1, 1, 1, 2, 3])):
            if part:
                name += rng.choice(JOINS)
            name += "%0*d" % (rng.choice([1, 1, 2, 3]), rng.randint(0, 40))
        names.append(name + rng.choice(SUFFIXES))
    if names:
        names.extend(rng.choice(names) for dummy in range(rng.randint(0, 5)))
    if rng.random() < 0.2:
        names += ["", "  ", " padded7 "]
    rng.shuffle(names)
    return names


NAME_SETS = [_random_names(random.Random(100000 + seed)) for seed in range(1200)]


def _unique(names):
    seen = set()
    return [name for name in names if not (name in seen or seen.add(name))]


# ---- hand cases (Slurm's documentation and python-hostlist's README) ----------------------------------------------

@pytest.mark.parametrize(
    "expr, names",
    [
        ("gpu[001-128]", ["gpu%03d" % i for i in range(1, 129)]),
        ("node[01,05-09]", ["node01", "node05", "node06", "node07", "node08", "node09"]),
        ("tux[0-3,7]", ["tux0", "tux1", "tux2", "tux3", "tux7"]),
        ("rack[0-1]-node[0-3]", ["rack%d-node%d" % (r, n) for r in range(2) for n in range(4)]),
        ("linux[0-3],dev1", ["linux0", "linux1", "linux2", "linux3", "dev1"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("n[9-11],d[01-02]", ["n9", "n10", "n11", "d01", "d02"]),
        ("n[001-010]", ["n%03d" % i for i in range(1, 11)]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[1-010]", ["n%d" % i for i in range(1, 11)]),
        ("n[007]", ["n007"]),
        ("[1-3]", ["1", "2", "3"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("login1", ["login1"]),
        ("n1,n1,n[1-2]", ["n1", "n2"]),
        ("a, b", ["a", " b"]),
        ("", []),
    ],
)
def test_expand_hand_cases(expr, names):
    assert expand(expr) == names
    assert expand(expr) == reference.expand_hostlist(expr)


def test_expand_allow_duplicates():
    assert expand("n1,n[1-2],n1", allow_duplicates=True) == ["n1", "n1", "n2", "n1"]
    assert expand("n1,n[1-2],n1") == ["n1", "n2"]


@pytest.mark.parametrize(
    "names, expr",
    [
        (["gpu%03d" % i for i in range(1, 129)], "gpu[001-128]"),
        (["node01", "node05", "node06", "node07", "node08", "node09"], "node[01,05-09]"),
        (["tux3", "tux0", "tux7", "tux1", "tux2"], "tux[0-3,7]"),
        (["rack%d-node%d" % (r, n) for r in range(2) for n in range(4)], "rack[0-1]-node[0-3]"),
        (["n1", "n2", "n3", "n7", "n7", " n8 ", ""], "n[1-3,7-8]"),
        (["n9", "n10", "n11", "d01", "d02"], "d[01-02],n[9-11]"),
        (["n1", "n01"], "n[1,01]"),
        (["login", "gpu1"], "gpu1,login"),
        ([], ""),
    ],
)
def test_compress_hand_cases(names, expr):
    assert compress(names) == expr
    assert compress(names) == reference.collect_hostlist(names)


@pytest.mark.parametrize(
    "expr, items",
    [
        ("gpu[001-128]", ["gpu[001-128]"]),
        ("linux[0-3],dev1", ["linux[0-3]", "dev1"]),
        ("node[01,05-09],rack[0-1]-node[0-3],login1", ["node[01,05-09]", "rack[0-1]-node[0-3]", "login1"]),
        ("a, b", ["a", " b"]),
        ("", []),
    ],
)
def test_split(expr, items):
    assert split(expr) == items


def test_contains_hand_cases():
    assert contains("gpu[001-128]", "gpu017")
    assert not contains("gpu[001-128]", "gpu17")
    assert not contains("gpu[001-128]", "gpu129")
    assert contains("rack[0-1]-node[0-3],login1", "login1")
    assert contains("rack[0-1]-node[0-3],login1", "rack1-node3")
    assert not contains("rack[0-1]-node[0-3],login1", "rack2-node3")
    assert contains("a[1-20][1-5]", "a155")  # a15 + 5
    assert not contains("a[1-20][1-5]", "a156")
    assert contains("n[098-100]", "n100") and not contains("n[098-100]", "n0100")
    assert not contains("", "n1")


# ---- against python-hostlist, generated --------------------------------------------------------------------------

def test_expand_matches_python_hostlist():
    for expr in EXPRS:
        assert expand(expr) == reference.expand_hostlist(expr), expr
        everything = expand(expr, allow_duplicates=True)
        assert everything == reference.expand_hostlist(expr, allow_duplicates=True), expr
        assert count(expr) == len(everything), expr


def test_split_gives_the_items_back():
    for expr in EXPRS:
        items = split(expr)
        assert ",".join(items) == expr
        assert [name for item in items for name in expand(item, allow_duplicates=True)] == expand(expr, allow_duplicates=True)


def test_contains_matches_membership():
    rng = random.Random(7)
    for expr in EXPRS:
        names = set(expand(expr))
        members = rng.sample(sorted(names), min(len(names), 5))
        candidates = list(members)
        for name in members:
            candidates += [name + "0", name[:-1], "0" + name, name.replace("0", "", 1), name.replace("1", "2", 1), name + "-ib"]
        for name in candidates:
            assert contains(expr, name) == (name in names), (expr, name)


def test_compress_matches_python_hostlist():
    for names in NAME_SETS:
        assert compress(names) == reference.collect_hostlist(names), names


def test_compress_round_trip():
    for names in NAME_SETS:
        wanted = _unique(name.strip() for name in names if name.strip())
        expr = compress(names)
        back = expand(expr)
        assert sorted(back) == sorted(wanted), names
        assert len(back) == len(expand(expr, allow_duplicates=True))  # compress never repeats a name
        assert compress(back) == expr  # a fixed point


def test_compress_of_expand_covers_the_same_names():
    for expr in EXPRS:
        wanted = set(name.strip() for name in expand(expr))  # compress strips names, as collect_hostlist does
        assert sorted(expand(compress(expand(expr)))) == sorted(wanted), expr
    for expr in EXPRS[::4]:
        assert compress(expand(expr)) == reference.collect_hostlist(expand(expr)), expr


def test_round_trip_keeps_numeric_order():
    rng = random.Random(11)
    for dummy in range(300):
        names = []
        for prefix in rng.sample(["gpu", "node", "n", "rack7-node", "x.y"], rng.randint(1, 3)):
            width = rng.choice([1, 2, 3])
            names += ["%s%0*d%s" % (prefix, width, number, "-ib") for number in rng.sample(range(200), rng.randint(1, 60))]
        rng.shuffle(names)
        assert expand(compress(names)) == reference.numerically_sorted(names)


def test_ten_thousand_nodes():
    names = ["gpu%05d" % i for i in range(1, 10001)]
    assert expand("gpu[00001-10000]") == names
    assert compress(names) == "gpu[00001-10000]"
    odd = ["n%d" % i for i in range(1, 20000, 2)]
    listed = ",".join(odd)
    assert expand(listed) == odd == reference.expand_hostlist(listed)
    assert compress(odd) == reference.collect_hostlist(odd)
    assert contains("gpu[00001-10000]", "gpu09999") and contains(listed, "n19999") and not contains(listed, "n2")


def test_the_cap():
    assert count("n[1-1000][1-1000]") == MAX_NAMES
    assert contains("n[1-1000][1-1000]", "n1000999")  # matched, not built
    with pytest.raises(HostlistError, match="cap of %d names" % MAX_NAMES):
        count("n[1-1000][1-1000],n0")


# ---- bad input ---------------------------------------------------------------------------------------------------

# expression, what the message says, whether python-hostlist rejects it too
BAD = [
    ("gpu[1-", "unclosed '['", True),
    ("gpu[1-2", "unclosed '['", True),
    ("gpu1]", "']' without a '['", True),
    ("gpu[1-2]]", "']' without a '['", True),
    ("a[1[2]]", "nested brackets", True),
    ("a[[1]]", "nested brackets", True),
    ("a,,b", "empty item", False),
    ("a,", "empty item", False),
    (",a", "empty item", False),
    ("a, ,b", "empty item", False),
    (" ", "empty item", False),
    ("a[]", "empty range", True),
    ("a[1,,2]", "empty range", True),
    ("a[1-3,]", "empty range", True),
    ("a[5-3]", "ends below its start", True),
    ("a[010-9]", "ends below its start", True),
    ("a[x]", "not a number or LO-HI", True),
    ("a[1-b]", "not a number or LO-HI", True),
    ("a[1 - 2]", "not a number or LO-HI", True),
    ("a[ 1]", "not a number or LO-HI", True),
    ("a[1-2-3]", "not a number or LO-HI", True),
    ("a[-1]", "not a number or LO-HI", True),
    ("a[1\n]", "not a number or LO-HI", False),
    ("n[0-99999999999]", "cap of 1000000 names", True),
    ("n[0-999999],m[0-1]", "cap of 1000000 names", True),
    ("a[1-1000][1-1001]", "cap of 1000000 names", True),
]


@pytest.mark.parametrize("expr, says, reference_rejects", BAD)
def test_bad_expressions(expr, says, reference_rejects):
    for call in (expand, split, count, lambda text: contains(text, "a1")):
        with pytest.raises(HostlistError) as caught:
            call(expr)
        message = str(caught.value)
        assert says in message
        assert repr(expr) in message
        assert ": expected " in message
        assert caught.value.value == expr
        assert caught.value.expected
        assert isinstance(caught.value, DetailedError)
    if reference_rejects:
        with pytest.raises(reference.BadHostlist):
            reference.expand_hostlist(expr)
    else:
        reference.expand_hostlist(expr)  # python-hostlist lets these through (see the module docstring)


@pytest.mark.parametrize("expr", [None, 5, ["n1"], b"n[1-2]"])
def test_expression_not_a_string(expr):
    with pytest.raises(HostlistError, match="not a string"):
        expand(expr)


@pytest.mark.parametrize(
    "names, says",
    [
        (["n1", "n[2]"], "'n[2]'"),
        (["n1,n2"], "'n1,n2'"),
        (["n]"], "'n]'"),
        (["n1", 2], "2 is of type int"),
        (["n1", None], "None is of type NoneType"),
        ("n[1-2]", "not the string 'n[1-2]'"),
    ],
)
def test_bad_names(names, says):
    with pytest.raises(HostlistError) as caught:
        compress(names)
    assert says in str(caught.value)
    assert caught.value.expected


def test_contains_name_not_a_string():
    with pytest.raises(HostlistError, match="not a string"):
        contains("n[1-2]", 1)


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="Python reads ints of any length before 3.11")
def test_number_too_long_to_read():
    with pytest.raises(HostlistError) as caught:
        expand("n[%s]" % ("1" * 5000))
    assert "'n[1111" in str(caught.value) and "too long" in str(caught.value)
    with pytest.raises(HostlistError, match="too long"):
        compress(["x" + "1" * 5000])
