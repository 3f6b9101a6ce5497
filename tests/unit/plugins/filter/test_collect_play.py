# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""collect_play: each host's inputs to a cluster report from the variables its play left (the one loop over hostvars
of diagnose.yml, preflight.yml and tune.yml). The playbooks themselves run it in tests/integration (diagnose,
preflight, against local hosts) and in the lab (tune.yml's drift report in every scenario that tunes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.cluster_report import FilterModule
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import sampling_result

ROOT = Path(__file__).resolve().parents[4]
collect_play = FilterModule().filters()["collect_play"]

DONE = {"verdict": "no_contention", "changed": False}
JOB = {"ansible_job_id": "j1", "started": 1, "finished": 0}
STATUS = dict(DONE, finished=1)
NIC = {"ansible_facts": {"nic_irq": {"interface": "eth0", "irqs": []}}}
HOSTVARS = {
    # sampled asynchronously: the job, its async_status and the NIC read
    "a": {"__diagnose_job": JOB, "__diagnose_softnet": STATUS, "__diagnose_nic": NIC,
          "__preflight_platform": {"p": 1}, "__preflight_gpu": {"g": 1}, "__preflight_cpu_power": {"c": 1},
          "__nccl_topology_result": {"n": 1}, "__checkpoint_staging_result": {"state": "present"},
          "nic_irq_pinning_report": {"r": 1}, "cpusets_report": {"r": 2}, "unrelated_report": {"r": 3}},
    # sequential run, a stricter checkpoint policy, no NIC facts
    "b": {"__diagnose_job": DONE, "__diagnose_nic": {"changed": False},
          "__checkpoint_staging_result": {"state": "present"}, "preflight_checkpoint_max_pending_seconds": 60},
    # unreachable: the play set nothing but the failed NIC read
    "c": {"__diagnose_nic": {"unreachable": True, "msg": "ssh: connect to host c port 22: Connection refused"}},
}


def test_diagnose_inputs_resolve_the_sampling_and_take_the_nic_facts():
    got = collect_play(HOSTVARS, "diagnose", ["a", "b", "c"], ["a", "b"])
    assert list(got) == ["a", "b", "c"]
    assert got["a"] == {"softnet": STATUS, "nic": {"interface": "eth0", "irqs": []}}
    assert got["b"] == {"softnet": dict(DONE, finished=1), "nic": {}}
    assert got["c"] == {"softnet": {"failed": True, "msg": "ssh: connect to host c port 22: Connection refused"}, "nic": {}}
    for host in "abc":
        hv = HOSTVARS[host]
        assert got[host]["softnet"] == sampling_result(hv.get("__diagnose_job", {}), hv.get("__diagnose_softnet", {}),
                                                       hv.get("__diagnose_nic", {}))


def test_preflight_inputs_carry_every_check_and_say_which_host_failed():
    got = collect_play(HOSTVARS, "preflight", ["a", "b", "c"], ["a", "b"])
    assert got["a"] == {"error": None, "results": {
        "platform": {"p": 1}, "gpu": {"g": 1}, "cpu_power": {"c": 1}, "nic": NIC, "softnet": STATUS, "nccl": {"n": 1},
        "checkpoint": {"state": "present", "preflight_max_pending_seconds": 900}}}
    assert got["b"]["results"]["checkpoint"] == {"state": "present", "preflight_max_pending_seconds": 60}
    assert got["b"]["results"]["platform"] is None and got["b"]["error"] is None
    assert got["c"]["error"] == "the host failed or was unreachable before its checks ran"
    assert got["c"]["results"]["checkpoint"] is None and got["c"]["results"]["softnet"]["failed"] is True


def test_drift_inputs_take_the_reports_of_the_tune_roles_only():
    got = collect_play(HOSTVARS, "drift", ["a", "c"], ["a"])
    assert got == {"a": {"reports": {"nic_irq_pinning": {"r": 1}, "cpusets": {"r": 2}}, "error": None},
                   "c": {"reports": {}, "error": "the host failed or was unreachable: its roles did not finish"}}


@pytest.mark.parametrize("args,fragment", [
    (("gate", ["a"], ["a"]), "collect_play kind 'gate': expected one of diagnose, preflight, drift"),
    (("drift", "a", ["a"]), "collect_play hosts is 'a': expected a list of host names"),
    (("drift", ["a"], {"a": 1}), "collect_play running_hosts is {'a': 1}"),
])
def test_bad_arguments_fail_naming_them(args, fragment):
    with pytest.raises(AnsibleFilterError) as exc:
        collect_play(HOSTVARS, *args)
    assert fragment in str(exc.value)


def test_no_playbook_holds_jinja_statements():
    """Logic lives in Python (collect_play, the report filters); a playbook that grows a {% %} loop again (over
    hostvars, or to render a table) is caught here. Expressions ({{ }}) with filters are fine."""
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        assert "{%" not in path.read_text(), path.name
