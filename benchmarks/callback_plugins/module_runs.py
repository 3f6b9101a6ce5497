# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper (not part of the collection): count the tasks that ran a module on each host.

Tasks whose action runs only on the controller (set_fact, debug, assert, include_role, the role argument check, ...)
are not counted. Prints one line ``MODULE_RUNS {"host": [action, ...]}`` at the end of the play run."""

from __future__ import annotations

import json

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: module_runs
type: aggregate
short_description: count module runs per host (gpunode.tuning benchmarks)
description: Counts tasks that executed a module on the host; controller-only actions are left out.
"""

CONTROLLER_ONLY = {"set_fact", "debug", "assert", "fail", "include_role", "include_tasks", "import_role",
                   "import_tasks", "validate_argument_spec", "meta", "include_vars", "set_stats", "add_host",
                   "group_by", "pause"}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.runs = {}

    def _record(self, result):
        action = result._task.action.rsplit(".", 1)[-1]
        if action not in CONTROLLER_ONLY:
            self.runs.setdefault(result._host.get_name(), []).append(result._task.action)

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result)

    def v2_playbook_on_stats(self, stats):
        self._display.display("MODULE_RUNS " + json.dumps(self.runs, sort_keys=True))
