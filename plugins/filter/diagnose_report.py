# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The diagnose_* filters: thin wrappers over ``module_utils/_report/diagnose``. Documentation: the YAML files
beside this one."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils._filters import filter_table, malformed, plain
from ansible_collections.gpunode.tuning.plugins.module_utils._report.diagnose import (
    DiagnoseReportError,
    diagnose_collect,
    diagnose_html,
    diagnose_lines,
    diagnose_markdown,
    diagnose_summary,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import sampling_result


class FilterModule(object):
    def filters(self):
        return filter_table({
            "diagnose_collect": diagnose_collect,
            "diagnose_markdown": diagnose_markdown,
            "diagnose_html": diagnose_html,
            "diagnose_summary": diagnose_summary,
            "diagnose_lines": diagnose_lines,
            "softnet_sampling_result": sampling_result,
        }, [((DiagnoseReportError,), plain), ((KeyError, TypeError), malformed("diagnose data", with_type=False))])
