# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side CPU list filters. Documentation: the YAML files beside this one."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils._filters import detailed, filter_table
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import (
    CpuListError,
    cpulist_difference,
    cpulist_intersection,
    cpulist_union,
    format_cpulist,
    format_cpumask,
    parse_cpulist,
    parse_cpumask,
)


def cpulist_expand(value):
    return parse_cpulist(value)


def cpulist_compress(value):
    return format_cpulist(parse_cpulist(value))


def cpulist_difference_filter(value, other):
    return format_cpulist(cpulist_difference(value, other))


def cpulist_union_filter(value, other):
    return format_cpulist(cpulist_union(value, other))


def cpulist_intersect(value, other):
    return format_cpulist(cpulist_intersection(value, other))


def cpulist_to_mask(value, ncpus):
    return format_cpumask(parse_cpulist(value), int(ncpus))


def cpumask_to_cpulist(value, ncpus=None):
    return format_cpulist(parse_cpumask(value, None if ncpus is None else int(ncpus)))


class FilterModule(object):
    def filters(self):
        return filter_table({
            "cpulist_expand": cpulist_expand,
            "cpulist_compress": cpulist_compress,
            "cpulist_difference": cpulist_difference_filter,
            "cpulist_union": cpulist_union_filter,
            "cpulist_intersect": cpulist_intersect,
            "cpulist_to_mask": cpulist_to_mask,
            "cpumask_to_cpulist": cpumask_to_cpulist,
        }, [((CpuListError,), detailed)])
