# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""#30: one resolver of the sampling job's result for diagnose.yml and preflight.yml (it was Jinja, copied and drifted).

The registered task results below are synthetic, in the shapes ansible-core registers: async with poll 0
(``ansible_job_id``, ``results_file``, ``started``), async_status (``finished``), a skipped task, a failed one.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import sampling_result

ROOT = Path(__file__).resolve().parents[4]
STARTED = {"ansible_job_id": "j1.2", "results_file": "/root/.ansible_async/j1.2", "started": 1, "finished": 0, "changed": False}
DONE = {"verdict": "no_contention", "reasons": ["r"], "finished": 1, "ansible_job_id": "j1.2"}


def test_the_collected_result_is_returned():
    assert sampling_result(STARTED, DONE, {"changed": False}) == DONE


def test_a_sequential_run_holds_the_result_in_the_launch():
    launch = {"verdict": "contention", "reasons": ["x"], "changed": False}
    assert sampling_result(launch, {"skipped": True}) == dict(launch, finished=1)


def test_a_job_that_failed_to_start_keeps_its_own_error():
    launch = {"failed": True, "msg": "async_wrapper: could not write the job file"}
    assert sampling_result(launch, None, {"msg": "other"}) == dict(launch, finished=1)


def test_an_unreachable_host_reports_the_nic_read_error():
    nic = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection refused"}
    assert sampling_result({}, {}, nic) == {"failed": True, "msg": nic["msg"]}
    assert sampling_result({}, {"skipped": True}, {}) == {"failed": True, "msg": "the sampling job did not start (host unreachable?)"}


def test_a_job_still_running_did_not_finish_in_time():
    assert sampling_result(STARTED, {"finished": 0, "ansible_job_id": "j1.2"}) == {
        "failed": True, "msg": "the sampling job did not finish in time"}


def test_no_playbook_resolves_the_job_in_jinja_any_more():
    """diagnose.yml and preflight.yml resolve the sampling job through collect_play, which calls sampling_result."""
    for name in ("diagnose.yml", "preflight.yml"):
        text = (ROOT / "playbooks" / name).read_text()
        assert "gpunode.tuning.collect_play(" in text
        assert ".finished" not in text and "ansible_job_id is not defined" not in text, name
    source = (ROOT / "plugins" / "module_utils" / "_report" / "play_collect.py").read_text()
    assert "sampling_result(" in source
