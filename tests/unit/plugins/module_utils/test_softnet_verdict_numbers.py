# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verdict's numbers as a reader of the report sees them (issue 34: the survivors of the softnet_verdict
area, benchmarks/mutation_results.md).

Every reason quotes the thresholds in force, not the defaults; rates are per second and per 10 s of the real
window (3 s here, so a factor of 10 or 1 cannot hide); packets per second count what was received and sent;
each boundary (a value exactly at its threshold) falls on the documented side; the signal flags say which rules
passed; the idle-traffic note follows a no-contention verdict only.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import SoftnetError
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    describe_findings,
    format_number,
    judge,
    validate_thresholds,
)

# Thresholds unlike the defaults in every key, so a reason that quotes a default (or nothing) is caught.
LIMITS = {"user_pct": 33.0, "softirq_pct": 7.0, "squeeze_rate": 0.75, "squeeze_share_pct": 61.0,
          "max_link_util_pct": 12.0, "idle_pps": 77.0}
assert all(LIMITS[key] != DEFAULT_THRESHOLDS[key] for key in DEFAULT_THRESHOLDS)
ELAPSED = 3.0


def row(cpu, squeeze=0, usr=0.0, soft=0.0, dropped=0):
    return {"cpu": cpu, "time_squeeze": squeeze, "dropped": dropped, "usr": usr, "soft": soft}


def signals(rows, util=3.5, speed=200000, rx_packets=300000, tx_packets=0, link=True):
    data = {"elapsed": ELAPSED, "cpus": rows, "link": None}
    if link:
        data["link"] = {"interface": "ens7", "speed_mbps": speed, "rx_mbps": 7000.0, "tx_mbps": 120.0,
                        "utilisation_pct": util, "rx_packets": rx_packets, "tx_packets": tx_packets}
    return data


SHARED = dict(usr=50.0, soft=12.0)


# ------------------------------------------------------------------ every reason quotes the thresholds in force

def test_idle_quotes_the_highest_usr_the_rate_and_both_thresholds():
    # 20 received + 21 sent in 3 s: 13.67 packets/s, printed to one decimal
    result = judge(signals([row(0, usr=2.5, soft=0.1), row(1, usr=None, soft=None)], rx_packets=20, tx_packets=21),
                   [0], LIMITS)
    assert result["verdict"] == "idle"
    assert result["reasons"][0].startswith(
        "idle: no CPU has usr >= 33 % (highest usr 2.5 %) and the NIC moves 13.7 packets/s (ens7 rx + tx), "
        "below 77 packets/s: nothing can be judged")
    assert result["totals"]["packets_per_s"] == 13.7


def test_idle_without_any_measured_cpu_says_highest_usr_0():
    result = judge(signals([row(0, usr=None, soft=None)], rx_packets=3), [0], LIMITS)
    assert result["verdict"] == "idle"
    assert "(highest usr 0 %)" in result["reasons"][0]


def test_packets_per_second_add_received_and_sent():
    for rx, tx, expected in ((30, 30, 20.0), (0, 60, 20.0), (60, None, 20.0), (0, 0, 0.0)):
        result = judge(signals([row(0, usr=1.0)], rx_packets=rx, tx_packets=tx), [0], LIMITS)
        assert result["totals"]["packets_per_s"] == expected, (rx, tx, result["totals"])


def test_without_interface_or_processed_counts_the_rate_is_unknown():
    result = judge(signals([row(0, 500, **SHARED)], link=False), [0], LIMITS)
    assert result["totals"]["packets_per_s"] is None
    assert result["verdict_rule"] == "link_unknown"
    assert "cannot rule out a saturated link: no interface known" in result["reasons"]


@pytest.mark.parametrize("why, text", [
    (None, "no NIC queue IRQ CPUs known: squeezes cannot be attributed"),
    ("ens7 has no queue IRQs", "no NIC queue IRQ CPUs known (ens7 has no queue IRQs): squeezes cannot be attributed"),
])
def test_no_irq_cpus_says_why_when_told(why, text):
    result = judge(signals([row(0, 7, **SHARED)]), [], LIMITS, irq_cpus_why=why)
    assert result["verdict_rule"] == "no_irq_cpus"
    assert result["reasons"][0] == text + "; pass irq_cpus to say where the NIC's interrupts are handled"
    assert result["reasons"][1] == "time_squeeze on all CPUs: 7 in 3 s (2.33 per s)"


def test_no_user_work_and_saturated_finding_quote_the_thresholds():
    result = judge(signals([row(0, 9, usr=1.0, soft=45.0), row(1, usr=90.0)]), [0], LIMITS)
    assert result["verdict_rule"] == "irq_cpus_no_user_work"
    assert result["reasons"][0] == (
        "no IRQ CPU (0) runs user work: highest usr 1 %, below 33 %: the workload does not compete with the "
        "NIC's interrupt work, whatever the squeezes (time_squeeze on IRQ CPUs: 9 in 3 s (3 per s))")
    (finding,) = result["findings"]
    assert finding["reason"] == (
        "IRQ CPUs 0 squeeze at or above 0.75 per s with usr below 33 %: CPU 0 9 in 3 s (3 per s), usr 1 %, soft 45 %")


def test_a_finding_on_two_cpus_lists_each():
    result = judge(signals([row(0, 9, usr=1.0, soft=45.0), row(1, 6, usr=2.0, soft=30.0), row(2, usr=90.0)]), [0, 1],
                   LIMITS)
    (finding,) = result["findings"]
    assert finding["reason"].endswith(
        ": CPU 0 9 in 3 s (3 per s), usr 1 %, soft 45 %, CPU 1 6 in 3 s (2 per s), usr 2 %, soft 30 %")


def test_no_joint_quotes_both_thresholds_and_the_highest_softirq():
    result = judge(signals([row(0, 500, usr=90.0, soft=2.5)]), [0], LIMITS)
    assert result["verdict_rule"] == "no_shared_cpu"
    assert result["reasons"] == [
        "IRQ CPUs 0 run user work (usr >= 33 %)",
        "no IRQ CPU has both softirq >= 7 % and usr >= 33 %: the user-busy IRQ CPUs 0 have at most 2.5 % "
        "softirq: the NIC's work there is light; contention would show if traffic on them rose",
    ]


def test_busy_gives_the_ranges_and_thresholds_and_squeezes_low_its_rate():
    # 2 squeezes in 3 s on each shared CPU: 0.67 per s, below 0.75
    result = judge(signals([row(0, 2, usr=40.0, soft=8.0), row(1, 2, usr=50.0, soft=12.0)]), [0, 1], LIMITS)
    assert result["verdict_rule"] == "squeezes_low"
    assert result["reasons"] == [
        "IRQ CPUs 0-1 run user work (usr >= 33 %)",
        "IRQ CPUs 0-1 also run user work: usr 40-50 %, soft 8-12 % (thresholds usr >= 33 %, soft >= 7 %)",
        "the shared CPUs 0-1 squeeze below 0.75 per s (CPU 0 2 in 3 s (0.67 per s), CPU 1 2 in 3 s (0.67 per s)): "
        "packets do not wait; repinning will not make anything faster",
    ]
    assert result["signals"] == {"irq_cpus_busy": True, "squeezes_on_irq_cpus": False, "link_not_saturated": None}


def test_share_and_link_reasons_quote_their_thresholds_and_the_link_numbers():
    result = judge(signals([row(0, 30, **SHARED), row(5, 10)], util=50.0), [0], LIMITS)
    assert result["verdict_rule"] == "link_busy"
    assert "the shared CPUs carry 75 % of all squeezes (30 of 40), at or above 61 %" in result["reasons"]
    assert ("link ens7 is busy: 50 % of 200000 Mbit/s (rx 7000, tx 120 Mbit/s), at or above 12 %: squeezes are "
            "explained by rate") in result["reasons"]
    assert result["signals"] == {"irq_cpus_busy": True, "squeezes_on_irq_cpus": True, "link_not_saturated": False}
    idle_link = judge(signals([row(0, 30, **SHARED)], util=3.5), [0], LIMITS)
    assert idle_link["verdict"] == "contention"
    assert "link ens7 far from saturated: 3.5 % of 200000 Mbit/s (rx 7000, tx 120 Mbit/s), below 12 %" in \
        idle_link["reasons"]
    assert idle_link["signals"] == {"irq_cpus_busy": True, "squeezes_on_irq_cpus": True, "link_not_saturated": True}


@pytest.mark.parametrize("link, why", [
    ({"util": None, "speed": None}, "link speed of ens7 is unknown (set link_speed_mbps)"),
    ({"util": None, "speed": 100000}, "throughput of ens7 is unknown"),
])
def test_link_unknown_says_which_number_is_missing(link, why):
    result = judge(signals([row(0, 30, **SHARED)], **link), [0], LIMITS)
    assert result["verdict_rule"] == "link_unknown"
    assert result["reasons"][-1] == "cannot rule out a saturated link: %s" % why


def test_signals_stay_unset_for_rules_never_reached():
    assert judge(signals([row(0, 500, usr=90.0, soft=1.0)]), [0], LIMITS)["signals"] == {
        "irq_cpus_busy": False, "squeezes_on_irq_cpus": None, "link_not_saturated": None}
    assert judge(signals([row(0, usr=1.0)], rx_packets=3), [0], LIMITS)["signals"] == {
        "irq_cpus_busy": None, "squeezes_on_irq_cpus": None, "link_not_saturated": None}


# ------------------------------------------------------------------ totals: per 10 s of the real window

def test_totals_are_per_10_s_of_the_window_to_one_decimal():
    # 7 squeezes in 3 s on all CPUs (23.33 per 10 s), 4 of them on the IRQ CPU (13.33 per 10 s)
    result = judge(signals([row(0, 4, **SHARED), row(1, 3)], rx_packets=41), [0], LIMITS)
    totals = result["totals"]
    assert totals["time_squeeze_per_10s"] == 23.3
    assert totals["time_squeeze_irq_cpus_per_10s"] == 13.3
    assert totals["time_squeeze_shared_share_pct"] == 57.1
    assert totals["packets_per_s"] == 13.7
    assert result["non_irq_squeeze_cpus"] == [1]


def test_no_squeezes_at_all_is_a_share_of_0():
    totals = judge(signals([row(0, 0, **SHARED)]), [0], LIMITS)["totals"]
    assert totals["time_squeeze"] == 0 and totals["time_squeeze_shared_share_pct"] == 0.0


def test_one_squeeze_on_a_cpu_without_irq_is_reported():
    result = judge(signals([row(0, 30, **SHARED), row(3, 1), row(1, 4)]), [0], LIMITS)
    assert result["non_irq_squeeze_cpus"] == [1, 3]
    assert result["totals"]["time_squeeze_other_cpus"] == 5
    assert ("squeezes on CPUs that carry no NIC queue IRQ: CPU 1 +4, CPU 3 +1 (RPS/RFS, another NIC, or IRQs moved "
            "during the sample)") in result["reasons"]


def test_squeezes_elsewhere_and_backlog_drops_read_as_the_report_prints_them():
    result = judge(signals([row(0, 10, dropped=2, **SHARED), row(5, 30, dropped=1)]), [0], LIMITS)
    assert result["verdict_rule"] == "squeezes_elsewhere"
    assert ("the shared CPUs 0 carry 25 % of all squeezes (10 of 40), below 61 %: most squeezes are elsewhere "
            "(another NIC, RPS, IRQs moved during the sample)") in result["reasons"]
    assert "softnet backlog drops: 3 in 3 s (netdev_max_backlog exceeded)" in result["reasons"]


def test_unknown_drop_counts_are_not_drops():
    result = judge(signals([row(0, 30, dropped=None, **SHARED), row(1, dropped=None)]), [0], LIMITS)
    assert result["totals"]["dropped"] == 0
    assert not any("backlog drops" in reason for reason in result["reasons"])


# ------------------------------------------------------------------ boundaries: at the threshold counts

def test_usr_exactly_at_the_threshold_is_user_work():
    # not idle (a CPU has usr >= 33 %), and the IRQ CPU at 33 % is not "saturated without user work"
    result = judge(signals([row(0, 9, usr=33.0, soft=1.0)], rx_packets=3), [0], LIMITS)
    assert result["verdict_rule"] == "no_shared_cpu"
    assert result["findings"] == []


def test_squeeze_rate_exactly_at_the_threshold_squeezes():
    # 3 squeezes in 4 s = 0.75 per s: contended, hot, and a saturated finding on an IRQ CPU without user work
    data = signals([row(0, 3, **SHARED)])
    data["elapsed"] = 4.0
    result = judge(data, [0], LIMITS)
    assert result["verdict"] == "contention" and result["contended_cpus"] == [0] and result["hot_cpus"] == [0]
    data = signals([row(0, 3, usr=1.0, soft=40.0), row(1, usr=90.0)])
    data["elapsed"] = 4.0
    result = judge(data, [0], LIMITS)
    assert [f["cpus"] for f in result["findings"]] == [[0]]
    assert result["hot_cpus"] == [0]        # by its squeeze rate alone: usr 1 % is no user work


def test_hot_cpus_are_the_squeezing_or_shared_ones_only():
    limits = dict(LIMITS, squeeze_rate=0.0)
    rows = [row(0, 0), row(1, 1), row(2, None), row(3, usr=50.0, soft=12.0)]
    # squeeze_rate 0: CPU 1's one squeeze makes it hot, CPU 0 and 2 with none do not; CPU 3 shares work
    assert judge(signals(rows), [1], limits)["hot_cpus"] == [1, 3]
    # 1 squeeze in 1 s against a rate of 0.5: hot; a single squeeze in 3 s (0.33 per s): not hot
    data = signals([row(0, 1), row(1, 1)])
    data["elapsed"] = 1.0
    assert judge(data, [0], dict(LIMITS, squeeze_rate=0.5))["hot_cpus"] == [0, 1]
    assert judge(signals([row(0, 1)]), [0], LIMITS)["hot_cpus"] == []


def test_idle_pps_exactly_at_the_threshold_is_traffic():
    # 231 packets in 3 s = 77 per s: not below 77, so no "little traffic" note after a no-contention verdict
    at = judge(signals([row(0, usr=1.0), row(1, usr=90.0)], rx_packets=231), [0], LIMITS)
    assert at["verdict"] == "no_contention"
    assert not any(reason.startswith("little traffic") for reason in at["reasons"])
    below = judge(signals([row(0, usr=1.0), row(1, usr=90.0)], rx_packets=230), [0], LIMITS)
    assert below["reasons"][-1] == (
        "little traffic during the sample (76.7 packets/s (ens7 rx + tx), below 77): repeat under training load to "
        "rule the problem out")


def test_little_traffic_note_follows_no_contention_only():
    result = judge(signals([row(0, 30, **SHARED)], rx_packets=30), [0], LIMITS)
    assert result["verdict"] == "contention"
    assert not any(reason.startswith("little traffic") for reason in result["reasons"])


# ------------------------------------------------------------------ thresholds, findings text, numbers

def test_unknown_threshold_names_itself_and_the_known_ones():
    with pytest.raises(SoftnetError) as err:
        validate_thresholds({"squeezes": 3})
    assert str(err.value) == "unknown threshold 'squeezes'"
    assert err.value.details["value"] == "squeezes"
    assert err.value.details["expected"] == sorted(DEFAULT_THRESHOLDS)


def test_bad_threshold_value_names_itself_and_what_is_expected():
    with pytest.raises(SoftnetError) as err:
        validate_thresholds({"user_pct": -1})
    assert str(err.value) == "threshold user_pct=-1 is not a number >= 0"
    assert err.value.details["value"] == -1 and err.value.details["expected"] == "a number >= 0"


@pytest.mark.parametrize("value", [True, "5", [5]])
def test_a_threshold_that_is_not_a_number_is_refused_not_crashed_on(value):
    with pytest.raises(SoftnetError) as err:
        validate_thresholds({"user_pct": value})
    assert err.value.details["value"] == value


def test_describe_findings_quotes_given_thresholds_or_placeholders():
    (finding,) = describe_findings({"user_pct": 33, "squeeze_rate": 0.75})
    assert (finding["name"], finding["title"]) == ("irq_cpus_saturated", "IRQ CPUs saturated by packet rate")
    assert finding["condition"] == "an IRQ CPU with usr below 33 % squeezes 0.75 times per second or more"
    (finding,) = describe_findings(placeholder="O(%s)")
    assert finding["condition"] == "an IRQ CPU with usr below O(user_pct) % squeezes O(squeeze_rate) times per second or more"


def test_format_number_keeps_every_digit_of_large_counters():
    # packet and byte counters are 64-bit: a float would round this one
    assert format_number(10 ** 17 + 1) == "100000000000000001"
