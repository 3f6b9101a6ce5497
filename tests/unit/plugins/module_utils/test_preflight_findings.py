# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight adapters' findings written out in full, and the refusals' details.

Mutation testing (benchmarks/mutation_results.md, area preflight) found the adapters of nccl_topo_mount,
nic_irq_facts and checkpoint_staging results tested by status only, and some branches (nccl:topology unknown,
irqbalance with unreadable IRQ CPUs) not at all: a finding with the wrong status, message, evidence or fix went
unnoticed. Each case of ``fixtures/preflight/synthetic_adapter_findings.json`` (SYNTHETIC module results, see its
``about``) gives every finding a user sees for those results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._report import preflight as P
from ansible_collections.gpunode.tuning.plugins.module_utils._report.preflight import PreflightError

FIXTURE = json.loads((Path(__file__).resolve().parents[3] / "unit" / "fixtures" / "preflight"
                      / "synthetic_adapter_findings.json").read_text())
CASES = FIXTURE["cases"]
DRIFT = FIXTURE["drift"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_finding_of_the_adapters_in_full(case):
    found = P.host_findings(case["results"])
    if case["checks"]:
        found = [f for f in found if f["check"] in case["checks"]]
    assert found == case["findings"]


@pytest.mark.parametrize("case", DRIFT, ids=[c["name"] for c in DRIFT])
def test_every_drift_finding_in_full(case):
    """The drift report's rows (preflight's drift gate): every kind of planned change in its order, the library in one
    line, "not tuned yet" only when every change is a create of a missing file, nothing is drift once applied."""
    assert P.drift_findings(case["reports"], case["applied"]) == case["findings"]


def test_the_cases_cover_every_status_branch_of_the_adapters():
    """The fixture is not a sample: each adapter's outcomes are all in it."""
    seen = set((f["check"], f["status"]) for c in CASES for f in c["findings"])
    assert {("nccl:topology", s) for s in ("fail", "pass", "unknown")} <= seen
    assert {("nccl:container_hcas", s) for s in ("pass", "not_applicable")} <= seen
    assert {("irq:layout", s) for s in ("pass", "warn")} <= seen
    assert {("irq:irqbalance", s) for s in ("pass", "warn", "unknown")} <= seen
    assert {("checkpoint:copier", s) for s in ("pass", "fail", "not_applicable")} <= seen
    assert {("checkpoint:durable", s) for s in ("pass", "fail")} <= seen
    assert {("checkpoint:target", s) for s in ("pass", "fail")} <= seen
    assert {("checkpoint:staging_usage", s) for s in ("pass", "fail", "unknown")} <= seen
    assert {("softnet:contention", s) for s in ("fail", "unknown", "not_applicable")} <= seen
    assert ("softnet:irq_saturation", "warn") in seen and ("platform:check", "fail") in seen
    assert {("cpu_power:" + c, s) for c, s in (("cstates", "pass"), ("governor", "not_applicable"), ("turbo", "unknown"))} <= seen
    messages = [f["message"] for c in DRIFT for f in c["findings"]]
    assert [m for m in messages if m.startswith("drift:")] and [m for m in messages if m.startswith("not tuned yet:")]
    assert [m for m in messages if m.startswith("tuned:")] and "in sync" in messages


def test_irqbalance_with_unreadable_irq_cpus_is_unknown_not_a_pass():
    """irqbalance runs and bans nothing, and no queue IRQ's CPUs could be read: before, "bans the IRQ CPUs"
    (an empty set of used CPUs is a subset of any ban)."""
    case = next(c for c in CASES if c["name"] == "nic_unknown_cpus")
    balance = [f for f in case["findings"] if f["check"] == "irq:irqbalance"]
    assert [f["status"] for f in balance] == ["unknown"]


POLICY_SHAPE = "{rules: [{check: PATTERN, fatal: [STATUS, ...]}, ...]}"
RULE_SHAPE = "{check: PATTERN, fatal: [STATUS, ...]}"
STATUSES = "a list drawn from fail, warn, unknown, not_applicable"


@pytest.mark.parametrize("policy,details", [
    ([], {"value": [], "expected": POLICY_SHAPE}),
    ({"rules": [], "x": 1}, {"value": {"rules": [], "x": 1}, "expected": POLICY_SHAPE}),
    ({"rules": [{"check": "gpu:*", "fatal": []}, {"check": "*"}]},
     {"rule": "rules[1]", "value": {"check": "*"}, "expected": RULE_SHAPE}),
    ({"rules": [{"check": "  ", "fatal": []}]},
     {"rule": "rules[0]", "value": "  ", "expected": "a check id or fnmatch pattern such as gpu:* or platform:thp"}),
    ({"rules": [{"check": 7, "fatal": []}]},
     {"rule": "rules[0]", "value": 7, "expected": "a check id or fnmatch pattern such as gpu:* or platform:thp"}),
    ({"rules": [{"check": "gpu:*", "fatal": "fail"}]}, {"rule": "rules[0]", "value": "fail", "expected": STATUSES}),
    ({"rules": [{"check": "gpu:*", "fatal": ["fail", "pass", "ok"]}]}, {"rule": "rules[0]", "value": "pass", "expected": STATUSES}),
])
def test_a_bad_policy_names_the_rule_the_value_and_the_shape_expected(policy, details):
    with pytest.raises(PreflightError) as exc:
        P.check_policy(policy)
    assert exc.value.details == details


def test_a_policy_check_is_stripped_and_its_statuses_copied():
    fatal = ["warn"]
    policy = P.check_policy({"rules": [{"check": " gpu:* ", "fatal": fatal}]})
    assert policy == {"rules": [{"check": "gpu:*", "fatal": ["warn"]}]}
    fatal.append("fail")
    assert policy["rules"][0]["fatal"] == ["warn"]


@pytest.mark.parametrize("value", ["soon", -0.5, "-1", True, float("nan"), "nan", [900]])
def test_a_bad_checkpoint_threshold_names_the_variable_value_and_expected(value):
    with pytest.raises(PreflightError) as exc:
        P._max_pending({"preflight_max_pending_seconds": value})
    assert "preflight_checkpoint_max_pending_seconds %r is not a number of seconds" % (value,) in str(exc.value)
    details = dict(exc.value.details)
    assert details.pop("option") == "preflight_checkpoint_max_pending_seconds"
    assert details.pop("expected") == "seconds, 0 or more"
    assert set(details) == {"value"}


@pytest.mark.parametrize("value,seconds", [(None, 900), (0, 0), ("0", 0.0), (0.5, 0.5), ("1500.5", 1500.5), (7200, 7200)])
def test_the_checkpoint_threshold_accepts_zero_fractions_and_text(value, seconds):
    result = {} if value is None else {"preflight_max_pending_seconds": value}
    assert P._max_pending(result) == seconds


@pytest.mark.parametrize("call,message,details", [
    (lambda: P.host_findings(["gpu"]), "a host's results are not a mapping",
     {"value": ["gpu"], "expected": "{source: module result}"}),
    (lambda: P.host_findings({"gpu": "ok"}), "the gpu result is not a mapping",
     {"source": "gpu", "value": "ok", "expected": "a module result"}),
    (lambda: P.host_findings({"nic": {}, "gpus": {}, "cpu": {}}), "unknown preflight sources cpu, gpus",
     {"value": ["cpu", "gpus"], "expected": list(P.SOURCES)}),
    (lambda: P.collect({"node1": None}, {"rules": []}), "host node1 has no results mapping",
     {"host": "node1", "value": None, "expected": "{results, error}"}),
    (lambda: P.drift_collect_hosts({"node2": []}), "host node2 has no reports mapping",
     {"host": "node2", "value": [], "expected": "{reports, error}"}),
])
def test_results_of_the_wrong_shape_are_refused_naming_the_host_source_and_value(call, message, details):
    with pytest.raises(PreflightError) as exc:
        call()
    assert str(exc.value) == message and exc.value.details == details


def test_collect_applies_the_policy_per_host_and_keeps_the_error():
    hosts = P.collect({"a": {"results": {"platform": {"failed": True, "msg": "boom"}}, "error": None},
                       "b": {"error": "unreachable"}},
                      {"rules": [{"check": "platform:*", "fatal": []}]})
    assert hosts == {"a": {"findings": [dict(P.host_findings({"platform": {"failed": True, "msg": "boom"}})[0],
                                             fatal=False)], "error": None},
                     "b": {"findings": [], "error": "unreachable"}}


def test_drift_collect_hosts_passes_applied_on():
    reports = {"cpusets": {"files": [{"path": "/etc/x", "action": "update", "reason": "content"}]}}
    checked = P.drift_collect_hosts({"n": {"reports": reports, "error": None}})
    applied = P.drift_collect_hosts({"n": {"reports": reports, "error": None}}, applied=True)
    assert checked["n"]["findings"] == P.drift_findings(reports) and checked["n"]["findings"][0]["fatal"] is True
    assert applied["n"]["findings"] == P.drift_findings(reports, True) and applied["n"]["findings"][0]["fatal"] is False
    assert P.drift_collect_hosts({"n": {"error": "down"}}) == {"n": {"findings": [], "error": "down"}}
