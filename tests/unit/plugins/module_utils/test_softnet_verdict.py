# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verdict as a table of rules: every rule is reachable, names itself, and reads as the report prints it."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    FINDINGS,
    RULES,
    describe_findings,
    describe_rules,
    format_number,
    judge,
)

SEED = dict(usr=60.0, soft=12.0)


def row(cpu, squeeze=0, usr=0.0, soft=0.0):
    return {"cpu": cpu, "time_squeeze": squeeze, "dropped": 0, "usr": usr, "soft": soft}


def signals(rows, util=3.5, speed=200000, rx_packets=100000):
    link = {"interface": "ens7", "speed_mbps": speed, "rx_mbps": 7000.0, "tx_mbps": 120.0, "utilisation_pct": util,
            "rx_packets": rx_packets, "tx_packets": 0}
    return {"elapsed": 10.0, "cpus": rows, "link": link}


CASES = {
    "idle": (signals([row(0, 0, usr=2.0, soft=0.1)], rx_packets=40), [0]),
    "no_irq_cpus": (signals([row(0, 500, **SEED)]), []),
    "irq_cpus_no_user_work": (signals([row(0, 500, usr=1.0, soft=45.0), row(1, usr=90.0)]), [0]),
    "no_shared_cpu": (signals([row(0, 500, usr=90.0, soft=1.0)]), [0]),
    "squeezes_low": (signals([row(0, 4, **SEED)]), [0]),
    "squeezes_elsewhere": (signals([row(0, 50, **SEED), row(5, 300)]), [0]),
    "link_unknown": (signals([row(0, 500, **SEED)], util=None, speed=None), [0]),
    "link_busy": (signals([row(0, 500, **SEED)], util=50.0), [0]),
    "contention": (signals([row(0, 500, **SEED)]), [0]),
}


def test_every_rule_has_a_case():
    assert list(CASES) == [rule.name for rule in RULES]


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_each_rule_decides_with_its_own_verdict_and_names_itself(rule):
    result = judge(*CASES[rule.name])
    assert result["verdict_rule"] == rule.name
    assert result["verdict"] == rule.verdict


def test_describe_rules_quotes_the_thresholds_like_the_reasons_do():
    rules = describe_rules()
    assert [(r["number"], r["name"], r["verdict"]) for r in rules] == [
        (number, rule.name, rule.verdict) for number, rule in enumerate(RULES, 1)
    ]
    assert rules[0]["condition"] == "no CPU has usr >= 40 % and the NIC moves less than 100 packets/s"
    assert rules[3]["condition"] == "no IRQ CPU has both softirq >= 5 % and usr >= 40 %"
    assert rules[4]["condition"] == "no such shared CPU squeezes 0.5 times per second or more"
    assert describe_rules({"max_link_util_pct": 12.5})[7]["condition"] == "the link is at or above 12.5 % of its speed"
    assert "O(squeeze_share_pct)" in describe_rules(placeholder="O(%s)")[5]["condition"]
    conditions = [rule.condition for rule in RULES] + [condition for _n, _t, condition, _r in FINDINGS]
    assert set(DEFAULT_THRESHOLDS) == set(
        key for condition in conditions for key in DEFAULT_THRESHOLDS if "{%s}" % key in condition
    )
    (finding,) = describe_findings()
    assert finding["condition"] == "an IRQ CPU with usr below 40 % squeezes 0.5 times per second or more"
    assert "RPS" in finding["remedy"] and "More queues do not help" in finding["remedy"]


@pytest.mark.parametrize(
    "number, digits, text",
    [(50.0, 0, "50"), (100.0, 0, "100"), (100, 1, "100"), (12.25, 1, "12.2"), (0.0, 0, "0"), (3.5, 2, "3.5"),
     (1650.0, 2, "1650"), (None, 2, "unknown"), (2 ** 60, 2, "%d" % 2 ** 60)],
)
def test_format_number_keeps_the_zeros_of_whole_numbers(number, digits, text):
    assert format_number(number, digits) == text
