# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Mutation guards for _cpulist (issue 34): what ``./run.sh mutants cpulist`` found the tests did not pin.

The node's CPU count (``ncpus``) bounds a list of integers as it bounds a string, a bad count is refused by every
function that takes one, and the refusals carry the value and what was expected.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import (
    MAX_CPUS,
    CpuListError,
    format_cpumask,
    parse_cpulist,
    parse_cpumask,
)


def test_ncpus_bounds_a_list_of_integers_like_a_string():
    assert parse_cpulist([0, 3], ncpus=4) == [0, 3]
    for value in ([0, 4], "0,4"):
        with pytest.raises(CpuListError):
            parse_cpulist(value, ncpus=4)


@pytest.mark.parametrize("ncpus", [True, 0, -1, MAX_CPUS + 1, "8", 4.0])
def test_a_bad_cpu_count_is_refused_naming_it(ncpus):
    expected = "an integer from 1 to %d" % MAX_CPUS
    for call in (lambda: parse_cpulist("0", ncpus=ncpus), lambda: format_cpumask([0], ncpus)):
        with pytest.raises(CpuListError) as exc:
            call()
        assert exc.value.details == {"value": ncpus, "expected": expected}
        assert "bad CPU count %r" % (ncpus,) in str(exc.value)


def test_cpu_count_bounds_are_inclusive():
    assert format_cpumask([0], 1) == "1" and parse_cpulist("0", ncpus=1) == [0]
    assert format_cpumask([MAX_CPUS - 1], MAX_CPUS).startswith("80000000,")


def test_mask_refusals_carry_the_value_and_what_was_expected():
    with pytest.raises(CpuListError) as exc:
        format_cpumask([8], 8)
    assert exc.value.details == {"value": 8, "expected": "CPUs 0 to 7"}
    assert "CPU 8 does not fit a mask of 8 CPUs" in str(exc.value)
    with pytest.raises(CpuListError) as exc:
        parse_cpumask("zz")
    assert exc.value.details == {"value": "zz", "expected": "1 to 8 hex digits per comma separated 32-bit word"}
    with pytest.raises(CpuListError) as exc:
        parse_cpumask("1,00000000,00000000", ncpus=40)
    assert exc.value.details == {"value": "1,00000000,00000000", "expected": "bits only for CPUs 0 to 39"}
    with pytest.raises(CpuListError) as exc:
        parse_cpumask("0,00000000,00000001", ncpus=64)
    assert exc.value.details == {"value": "0,00000000,00000001",
                                 "expected": "at most 2 comma separated 32-bit words"}
