# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side nccl-tests filters. Documentation: the YAML files beside this one."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils._filters import detailed, filter_table
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nccl_busbw import compare_busbw, sweep_compare, sweep_markdown
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.nccl_tests import NcclTestsError, parse_nccl_tests


def nccl_tests_parse(value):
    return parse_nccl_tests(value)


def nccl_tests_compare(value, thresholds, placement="out_of_place", test=None, datatype=None, redop=None, aggregate="min"):
    return compare_busbw(value, thresholds, placement=placement, test=test, datatype=datatype, redop=redop, aggregate=aggregate)


def nccl_tests_sweep(value, baseline, sizes=None, margin_pct=5.0, placement="out_of_place", test=None, datatype=None, redop=None,
                     aggregate="median"):
    return sweep_compare(value, baseline, sizes=sizes, margin_pct=margin_pct, placement=placement, test=test, datatype=datatype,
                         redop=redop, aggregate=aggregate)


def nccl_tests_sweep_markdown(value):
    return sweep_markdown(value)


class FilterModule(object):
    def filters(self):
        return filter_table({
            "nccl_tests_parse": nccl_tests_parse,
            "nccl_tests_compare": nccl_tests_compare,
            "nccl_tests_sweep": nccl_tests_sweep,
            "nccl_tests_sweep_markdown": nccl_tests_sweep_markdown,
        }, [((NcclTestsError,), detailed)])
