# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only callback: when each task started and ended on each host, as JSON lines in $GPUNODE_TASK_TIMES.

tests/integration/test_diagnose_playbook.py uses it to check that no task of diagnose.yml runs on a host inside
that host's sampling window (issue 28). Enabled only by the test (ANSIBLE_CALLBACK_PLUGINS, ANSIBLE_CALLBACKS_ENABLED).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: task_times
type: aggregate
short_description: per-host task start and end times (tests only)
description: Writes one JSON line per task and host to the file named by E(GPUNODE_TASK_TIMES).
requirements:
  - enabled in callbacks_enabled
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super(CallbackModule, self).__init__(*args, **kwargs)
        self._started = {}
        self._path = os.environ.get("GPUNODE_TASK_TIMES")

    def v2_runner_on_start(self, host, task):
        self._started[(host.get_name(), task._uuid)] = time.time()

    def _end(self, result, status):
        host, task = result._host.get_name(), result._task
        start = self._started.pop((host, task._uuid), None)
        if not self._path or start is None:
            return
        with open(self._path, "a") as out:
            out.write(json.dumps({"host": host, "task": task.get_name(), "action": task.action,
                                  "start": start, "end": time.time(), "status": status}) + "\n")

    def v2_runner_on_ok(self, result):
        self._end(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._end(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._end(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._end(result, "unreachable")
