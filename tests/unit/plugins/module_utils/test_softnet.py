# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parsers, deltas, mpstat arithmetic and the verdict of softnet_check (_softnet_procfs, _softnet_signals,
_softnet_verdict, and the option checks of _softnet): pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import irq_cpus_from_nic, validate_options
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import (
    SoftnetError,
    mpstat_percentages,
    parse_net_dev,
    parse_proc_stat,
    parse_softirqs,
    parse_softnet_stat,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.signals import (
    compute_signals,
    delta_counter,
    delta_u32,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    judge,
    validate_thresholds,
)

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "softnet_captures"


def capture(name):
    return (CAPTURES / name).read_text()


# ---------------------------------------------------------------- softnet_stat


@pytest.mark.parametrize(
    "name, online, width, mapping, cpus, spot",
    [
        # spot: (cpu, field, value)
        ("w09_chinaunix_2013_4cpu.txt", [0, 1, 2, 3], 9, "online_order", [0, 1, 2, 3], (0, "time_squeeze", 1)),
        ("w09_chinaunix_2013_4cpu.txt", [0, 1, 2, 3], 9, "online_order", [0, 1, 2, 3], (3, "processed", 0x1143)),
        ("w10_insights_core_rhel7_4cpu.txt", [0, 1, 2, 3], 10, "online_order", [0, 1, 2, 3], (3, "dropped", 1)),
        ("w10_insights_core_rhel7_4cpu.txt", [0, 1, 2, 3], 10, "online_order", [0, 1, 2, 3], (0, "received_rps", 0)),
        # rows follow the online list, not 0..n-1: CPU 1 offline on a 3-CPU box
        ("w11_xsos_issue108_2cpu.txt", [0, 2], 11, "online_order", [0, 2], (2, "processed", 0x028AD20A)),
        ("w13_insights_core_rhel8_5cpu.txt", None, 13, "index_column", [0, 1, 2, 3, 4], (4, "dropped", 0x2DB94)),
        ("w13_insights_core_rhel8_5cpu.txt", None, 13, "index_column", [0, 1, 2, 3, 4], (2, "received_rps", 0x2328493)),
        # rows 0,1,2,3 carry CPU ids 0,1,3,4: mapped by column 13, online list not needed
        ("w13_derived_cpu2_offline.txt", None, 13, "index_column", [0, 1, 3, 4], (3, "dropped", 0x7E2E)),
        ("w13_derived_cpu2_offline.txt", [0, 1, 3, 4], 13, "index_column", [0, 1, 3, 4], (4, "time_squeeze", 1)),
        ("w15_this_host_linux_6.18_2cpu.txt", None, 15, "index_column", [0, 1], (1, "processed", 0x11A4)),
        ("w15_this_host_linux_6.18_2cpu.txt", None, 15, "index_column", [0, 1], (1, "process_qlen", 0)),
    ],
)
def test_real_captures_map_rows_to_the_right_cpus(name, online, width, mapping, cpus, spot):
    parsed = parse_softnet_stat(capture(name), online)
    assert parsed["width"] == width
    assert parsed["cpu_mapping"] == mapping
    assert sorted(parsed["cpus"]) == cpus
    cpu, field, value = spot
    assert parsed["cpus"][cpu][field] == value


@pytest.mark.parametrize(
    "width, present, absent",
    [
        (9, ["processed", "dropped", "time_squeeze", "cpu_collision"], ["received_rps", "flow_limit_count"]),
        (10, ["received_rps"], ["flow_limit_count", "backlog_len"]),
        (11, ["flow_limit_count"], ["backlog_len"]),
        (13, ["backlog_len"], ["input_qlen"]),
        (15, ["input_qlen", "process_qlen"], []),
    ],
)
def test_each_width_exposes_only_the_columns_it_has(width, present, absent):
    row = " ".join(["00000001"] * 12 + ["00000000"] + ["00000002"] * (width - 13)) if width >= 13 else " ".join(
        ["00000001"] * width
    )
    parsed = parse_softnet_stat(row + "\n", online=[0])
    fields = parsed["cpus"][0]
    assert all(name in fields for name in present)
    assert not any(name in fields for name in absent)


def test_wider_future_layout_keeps_first_columns_and_cpu_index():
    row = " ".join(["0000000a", "00000000", "00000005"] + ["00000000"] * 9 + ["00000007", "1", "2", "3", "4"])
    parsed = parse_softnet_stat(row, online=None)
    assert parsed["width"] == 17
    assert list(parsed["cpus"]) == [7]
    assert parsed["cpus"][7]["time_squeeze"] == 5
    assert "newer than 6.4" in parsed["layout"]


@pytest.mark.parametrize(
    "text, online, fragment",
    [
        ("", [0], "empty"),
        ("00000001 00000002\n", [0], "2 columns"),
        (capture("w10_insights_core_rhel7_4cpu.txt") + "00000001 " * 11 + "\n", [0, 1, 2, 3, 4], "different widths"),
        ("0000zz01" + " 00000000" * 8 + "\n", [0], "not hex"),
        (capture("w10_insights_core_rhel7_4cpu.txt"), [0, 1, 2], "4 rows but 3 CPUs are online"),
        (capture("w10_insights_core_rhel7_4cpu.txt"), None, "online CPU list is unknown"),
        (capture("w13_insights_core_rhel8_5cpu.txt").replace("00000000 00000001\n", "00000000 00000000\n"), None,
         "twice"),
    ],
)
def test_unusable_softnet_stat_is_a_clear_error(text, online, fragment):
    with pytest.raises(SoftnetError) as info:
        parse_softnet_stat(text, online)
    assert fragment in str(info.value)
    assert info.value.details["path"] == "/proc/net/softnet_stat"


# ---------------------------------------------------------------- counters


@pytest.mark.parametrize(
    "before, after, expected",
    [
        (0, 0, 0),
        (5, 105, 100),
        (0xFFFFFFF0, 0x00000010, 0x20),  # one wrap of the u32
        (0xFFFFFFFF, 0x00000000, 1),
        (0x80000000, 0x7FFFFFFF, 0xFFFFFFFF),  # largest possible step
    ],
)
def test_delta_u32_handles_wrap(before, after, expected):
    assert delta_u32(before, after) == expected


@pytest.mark.parametrize(
    "before, after, expected",
    [
        (100, 250, 150),
        (0xFFFFFF00, 0x100, 0x200),  # 32-bit kernel: unsigned long wrapped
        (2**40, 5, None),  # a 64-bit counter going back is a reset, not a wrap
    ],
)
def test_delta_counter_wraps_at_u32_only(before, after, expected):
    assert delta_counter(before, after) == expected


# ---------------------------------------------------------------- /proc/stat like mpstat


def stat(user=0, nice=0, system=0, idle=0, iowait=0, irq=0, softirq=0, steal=0, guest=0, guest_nice=0):
    return dict(
        user=user, nice=nice, system=system, idle=idle, iowait=iowait, irq=irq, softirq=softirq, steal=steal,
        guest=guest, guest_nice=guest_nice,
    )


@pytest.mark.parametrize(
    "before, after, expected",
    [
        # seed 000: a CPU at 60 % user, 12 % softirq
        (stat(), stat(user=60, system=5, softirq=12, idle=23), {"usr": 60.0, "sys": 5.0, "soft": 12.0, "idle": 23.0}),
        # guest time is inside user: %usr = user - guest, and the interval does not count guest twice
        (stat(), stat(user=50, guest=20, idle=50), {"usr": 30.0, "guest": 20.0, "idle": 50.0, "ticks": 100}),
        (stat(), stat(nice=30, guest_nice=10, idle=70), {"nice": 20.0, "gnice": 10.0, "ticks": 100}),
        # guest counter ahead of user (mpstat's ishift): %usr is 0 and the shift widens the interval
        (stat(user=100, guest=0), stat(user=100, guest=5, idle=95), {"usr": 0.0, "guest": 5.0, "ticks": 100}),
        # hard irq and steal are their own columns
        (stat(), stat(irq=3, steal=7, idle=90), {"irq": 3.0, "steal": 7.0, "idle": 90.0}),
        # tickless CPU: no tick in the interval -> 100 % idle, like mpstat
        (stat(user=5, idle=9), stat(user=5, idle=9), {"idle": 100.0, "usr": 0.0, "ticks": 0}),
        # CPU came back online: idle restarted from zero
        (stat(user=10, idle=5000), stat(user=20, idle=90), {"usr": 10.0, "idle": 90.0}),
        # thirds round to 2 decimals like mpstat prints them
        (stat(), stat(user=1, system=1, idle=1), {"usr": 33.33, "sys": 33.33, "idle": 33.33}),
    ],
)
def test_mpstat_percentages(before, after, expected):
    result = mpstat_percentages(before, after)
    for key, value in expected.items():
        assert result[key] == value, key


def test_real_proc_stat_percentages_add_up_to_100():
    first = parse_proc_stat(capture("this_host_proc_stat_1.txt"))
    second = parse_proc_stat(capture("this_host_proc_stat_2.txt"))
    assert sorted(first) == [0, 1]
    for cpu in first:
        result = mpstat_percentages(first[cpu], second[cpu])
        total = sum(result[key] for key in ("usr", "nice", "sys", "iowait", "irq", "soft", "steal", "idle"))
        assert abs(total - 100.0) < 0.05
        assert result["ticks"] > 90  # USER_HZ 100, 1 s apart


def test_proc_stat_skips_offline_cpus_and_old_short_lines():
    text = "cpu  1 2 3 4\ncpu0 10 0 5 85\ncpu2 1 1 1 1 1 1 1\nintr 5\n"
    parsed = parse_proc_stat(text)
    assert sorted(parsed) == [0, 2]
    assert parsed[0]["steal"] == 0 and parsed[0]["idle"] == 85
    assert parsed[2]["softirq"] == 1


# ---------------------------------------------------------------- softirqs and net/dev


def test_real_softirqs_net_rx_per_cpu():
    parsed = parse_softirqs(capture("this_host_softirqs_1.txt"))
    assert parsed["cpus"] == [0, 1]
    assert set(parsed["counts"]["NET_RX"]) == {0, 1}
    assert "TIMER" in parsed["counts"]


def test_softirqs_header_lists_possible_cpus_with_gaps():
    text = "                    CPU0       CPU4\n      NET_RX:         10         20\n"
    assert parse_softirqs(text)["counts"]["NET_RX"] == {0: 10, 4: 20}


def test_real_net_dev_and_alias_names():
    parsed = parse_net_dev(capture("this_host_net_dev_1.txt"))
    assert "eth0" in parsed and "lo" in parsed
    alias = "ibr10:30:       0       0    0    0    0     0          0         0      648       8    0    0    0     0       0          0\n"
    assert parse_net_dev(alias)["ibr10:30"]["tx_bytes"] == 648


# ---------------------------------------------------------------- two samples


def softnet_row(processed, dropped, squeeze, cpu=None):
    values = [processed, dropped, squeeze] + [0] * 6
    if cpu is not None:
        values += [0, 0, 0, cpu]
    return " ".join("%08x" % value for value in values)


def sample(time_s, softnet_rows, stats, net_rx=None, rx_bytes=0, tx_bytes=0):
    stat_text = "cpu  0 0 0 0 0 0 0 0 0 0\n" + "".join(
        "cpu%d %s\n" % (cpu, " ".join(str(v) for v in values)) for cpu, values in sorted(stats.items())
    )
    cpus = sorted(stats)
    softirqs = None
    if net_rx is not None:
        softirqs = " " * 12 + " ".join("CPU%d" % cpu for cpu in cpus) + "\n      NET_RX: " + " ".join(
            str(net_rx.get(cpu, 0)) for cpu in cpus
        ) + "\n"
    net_dev = (
        "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n"
        "  ens7: %d 1000 0 0 0 0 0 0 %d 500 0 0 0 0 0 0\n" % (rx_bytes, tx_bytes)
    )
    return {
        "time": time_s,
        "softnet_stat": "\n".join(softnet_rows) + "\n",
        "stat": stat_text,
        "softirqs": softirqs,
        "net_dev": net_dev,
    }


def test_signals_across_a_u32_wrap_of_time_squeeze():
    first = sample(0.0, [softnet_row(0xFFFFFF00, 0, 0xFFFFFFF0, 0), softnet_row(5, 0, 0, 1)],
                   {0: [0] * 10, 1: [0] * 10}, net_rx={0: 0xFFFFFFFF, 1: 0})
    second = sample(10.0, [softnet_row(0x100, 0, 0x120, 0), softnet_row(5, 0, 0, 1)],
                    {0: [60, 0, 5, 23, 0, 0, 12, 0, 0, 0], 1: [0, 0, 0, 100, 0, 0, 0, 0, 0, 0]},
                    net_rx={0: 99, 1: 0}, rx_bytes=8750000000, tx_bytes=0)
    signals = compute_signals(first, second, [0, 1], interface="ens7", speed_mbps=200000)
    cpu0 = signals["cpus"][0]
    assert cpu0["time_squeeze"] == 0x130  # 0x10 up to the wrap + 0x120 after it
    assert cpu0["processed"] == 0x200
    assert cpu0["net_rx"] == 100
    assert cpu0["usr"] == 60.0 and cpu0["soft"] == 12.0
    assert signals["link"]["rx_mbps"] == 7000.0  # 8.75 GB in 10 s
    assert signals["link"]["utilisation_pct"] == 3.5


def test_offline_cpu_rows_follow_the_online_list_without_index_column():
    # 11 columns, CPU 1 offline: the second row is CPU 2
    rows = [" ".join(["00000001", "00000000", "00000000"] + ["00000000"] * 8)] * 2
    later = [" ".join(["00000001", "00000000", "00000000"] + ["00000000"] * 8),
             " ".join(["00000001", "00000000", "00000064"] + ["00000000"] * 8)]
    stats = {0: [0] * 10, 2: [0] * 10}
    signals = compute_signals(sample(0, rows, stats), sample(10, later, stats), [0, 2])
    by_cpu = dict((row["cpu"], row) for row in signals["cpus"])
    assert sorted(by_cpu) == [0, 2]
    assert by_cpu[2]["time_squeeze"] == 100
    assert signals["softnet"]["cpu_mapping"] == "online_order"


def test_cpu_going_offline_mid_sample_is_noted_and_has_no_deltas():
    first = sample(0, [softnet_row(1, 0, 0, 0), softnet_row(1, 0, 0, 1)], {0: [0] * 10, 1: [0] * 10})
    second = sample(10, [softnet_row(1, 0, 0, 0)], {0: [0, 0, 0, 100, 0, 0, 0, 0, 0, 0]})
    signals = compute_signals(first, second, [0, 1])
    by_cpu = dict((row["cpu"], row) for row in signals["cpus"])
    assert by_cpu[1]["time_squeeze"] is None and by_cpu[1]["usr"] is None
    assert any("went online or offline" in note for note in signals["notes"])


def test_unknown_link_speed_is_unknown_not_zero():
    first = sample(0, [softnet_row(1, 0, 0, 0)], {0: [0] * 10}, rx_bytes=0)
    second = sample(10, [softnet_row(1, 0, 0, 0)], {0: [0, 0, 0, 100, 0, 0, 0, 0, 0, 0]}, rx_bytes=10**6)
    link = compute_signals(first, second, [0], interface="ens7", speed_mbps=None)["link"]
    assert link["speed_mbps"] is None and link["utilisation_pct"] is None
    assert link["rx_mbps"] == 0.8


# ---------------------------------------------------------------- verdict


def cpu_row(cpu, squeeze=0, usr=0.0, soft=0.0, dropped=0):
    return {"cpu": cpu, "time_squeeze": squeeze, "dropped": dropped, "usr": usr, "soft": soft}


def signals_for(rows, elapsed=10.0, util=3.5, speed=200000, rx_packets=100000):
    link = None
    if util is not None or speed is None:
        link = {"interface": "ens7", "speed_mbps": speed, "rx_mbps": 7000.0, "tx_mbps": 120.0,
                "utilisation_pct": util, "rx_packets": rx_packets, "tx_packets": 0}
    return {"elapsed": elapsed, "cpus": rows, "link": link}


SEED = dict(usr=60.0, soft=12.0)  # seed 000: usr 55-65 %, softirq 8-17 %


@pytest.mark.parametrize(
    "case, rows, irq_cpus, elapsed, util, speed, verdict, fragment",
    [
        ("seed pattern", [cpu_row(0, 150, **SEED), cpu_row(1, 0, 20.0, 0.1)], [0], 10, 3.5, 200000,
         "contention", "far from saturated"),
        ("healthy: +0 everywhere", [cpu_row(0, 0, **SEED), cpu_row(1)], [0], 10, 3.5, 200000,
         "no_contention", "packets do not wait"),
        ("rate boundary: 4 in 10 s is 0.4 per s", [cpu_row(0, 4, **SEED)], [0], 10, 3.5, 200000,
         "no_contention", "CPU 0 4 in 10 s (0.4 per s)"),
        ("rate boundary: 5 in 10 s is 0.5 per s", [cpu_row(0, 5, **SEED)], [0], 10, 3.5, 200000,
         "contention", "at or above 0.5 per s: CPU 0 5 in 10 s (0.5 per s)"),
        ("the rate is per second of the measured interval: 10 in 20 s", [cpu_row(0, 10, **SEED)], [0], 20, 3.5,
         200000, "contention", "(0.5 per s)"),
        ("the rate is per second of the measured interval: 9 in 20 s", [cpu_row(0, 9, **SEED)], [0], 20, 3.5,
         200000, "no_contention", "(0.45 per s)"),
        ("seed 000's lowest reading: 100 per 10 s over its 11 IRQ CPUs, 9 on each",
         [cpu_row(cpu, 9 + (cpu == 0), **SEED) for cpu in range(11)], list(range(11)), 10, 3.5, 200000,
         "contention", "CPU 10 9 in 10 s (0.9 per s)"),
        ("softirq boundary 4.99 %", [cpu_row(0, 500, usr=60.0, soft=4.99)], [0], 10, 3.5, 200000,
         "no_contention", "have at most 4.99 % softirq"),
        ("softirq boundary 5 % and usr 40 %", [cpu_row(0, 500, usr=40.0, soft=5.0)], [0], 10, 3.5, 200000,
         "contention", "usr 40-40 %"),
        ("usr boundary 39.99 %", [cpu_row(0, 500, usr=39.99, soft=12.0), cpu_row(1, usr=90.0)], [0], 10, 3.5,
         200000, "no_contention", "highest usr 39.99 %, below 40 %"),
        ("flood on an idle IRQ CPU (lab: +1000 per 20 s)",
         [cpu_row(4, 1000, usr=1.0, soft=45.0), cpu_row(2, usr=99.0)], [4], 20, 3.5, 200000,
         "no_contention", "whatever the squeezes"),
        ("squeezes mostly off the shared CPU", [cpu_row(0, 20, **SEED), cpu_row(5, 300)], [0], 10, 3.5, 200000,
         "inconclusive", "carry 6.2 % of all squeezes (20 of 320), below 50 %"),
        ("link boundary 9.99 %", [cpu_row(0, 500, **SEED)], [0], 10, 9.99, 200000, "contention", "below 10 %"),
        ("link boundary 10 %", [cpu_row(0, 500, **SEED)], [0], 10, 10.0, 200000, "inconclusive", "busy"),
        ("link speed unknown", [cpu_row(0, 500, **SEED)], [0], 10, None, None, "inconclusive", "link_speed_mbps"),
        ("no IRQ CPUs known", [cpu_row(0, 500, **SEED)], [], 10, 3.5, 200000, "inconclusive", "pass irq_cpus"),
        ("squeezes only off the IRQ CPUs", [cpu_row(0, 0, **SEED), cpu_row(5, 300)], [0], 10, 3.5, 200000,
         "no_contention", "carry no NIC queue IRQ: CPU 5 +300"),
    ],
)
def test_verdict_table(case, rows, irq_cpus, elapsed, util, speed, verdict, fragment):
    result = judge(signals_for(rows, elapsed=elapsed, util=util, speed=speed), irq_cpus)
    assert result["verdict"] == verdict, (case, result["reasons"])
    assert any(fragment in reason for reason in result["reasons"]), (case, result["reasons"])


def test_contention_flags_hot_and_non_irq_cpus_with_numbers():
    rows = [cpu_row(cpu, 150, **SEED) for cpu in range(11)] + [cpu_row(11, 40), cpu_row(12)]
    result = judge(signals_for(rows), list(range(11)))
    assert result["verdict"] == "contention"
    assert result["hot_cpus"] == list(range(12))  # 4 per s on CPU 11 is at or above squeeze_rate
    assert result["contended_cpus"] == list(range(11))
    assert result["non_irq_squeeze_cpus"] == [11]
    assert result["totals"]["time_squeeze_irq_cpus"] == 1650
    assert result["totals"]["time_squeeze_shared_share_pct"] == 97.6  # 1650 of 1690
    assert any("CPU 0 150 in 10 s (15 per s)" in reason for reason in result["reasons"])
    assert any("CPU 11 +40" in reason for reason in result["reasons"])
    assert result["findings"] == []


def test_idle_host_is_idle_and_says_nothing_can_be_judged():
    result = judge(signals_for([cpu_row(0, usr=3.0, soft=0.2), cpu_row(1, usr=39.0)], rx_packets=20), [0])
    assert result["verdict"] == "idle" and result["verdict_rule"] == "idle"
    assert "nothing can be judged until the job runs" in result["reasons"][0]
    assert "2 packets/s (ens7 rx + tx), below 100 packets/s" in result["reasons"][0]
    assert result["totals"]["packets_per_s"] == 2.0


def test_idle_needs_both_no_user_work_and_no_traffic():
    # traffic but no user work: the NIC works, nothing competes with it
    busy_nic = judge(signals_for([cpu_row(0, 0, usr=1.0, soft=20.0)], rx_packets=5000), [0])
    assert busy_nic["verdict"] == "no_contention" and busy_nic["verdict_rule"] == "irq_cpus_no_user_work"
    # user work but no traffic: the job runs without storage traffic; judged, with a note to repeat under load
    no_traffic = judge(signals_for([cpu_row(0, 0, usr=90.0, soft=0.1)], rx_packets=20), [0])
    assert no_traffic["verdict"] == "no_contention" and no_traffic["verdict_rule"] == "no_shared_cpu"
    assert any("repeat under training load" in reason for reason in no_traffic["reasons"])
    # no interface: the packets every CPU processed stand for the traffic
    rows = [dict(cpu_row(0), processed=50), dict(cpu_row(1), processed=40)]
    result = judge({"elapsed": 10.0, "cpus": rows, "link": None}, [0])
    assert result["verdict"] == "idle" and "9 packets/s (packets processed by all CPUs)" in result["reasons"][0]


def test_saturated_irq_cpu_is_a_finding_beside_the_verdict_never_contention():
    rows = [cpu_row(2, 135, usr=12.93, soft=28.91), cpu_row(4, 0, usr=98.5, soft=0.96)]
    result = judge(signals_for(rows, elapsed=10.058), [2])
    assert result["verdict"] == "no_contention"
    (finding,) = result["findings"]
    assert finding["name"] == "irq_cpus_saturated" and finding["cpus"] == [2]
    assert finding["title"] == "IRQ CPUs saturated by packet rate"
    assert "CPU 2 135 in 10.06 s (13.42 per s), usr 12.93 %" in finding["reason"]
    assert "RPS" in finding["remedy"] and "More queues do not help" in finding["remedy"]
    # below squeeze_rate it is not reported
    assert judge(signals_for([cpu_row(2, 4, usr=1.0, soft=30.0)]), [2])["findings"] == []


def test_backlog_drops_are_reported():
    result = judge(signals_for([cpu_row(0, 0, dropped=7)]), [0])
    assert any("backlog drops: 7" in reason for reason in result["reasons"])


def test_custom_thresholds_change_the_boundary():
    rows = [cpu_row(0, 3, usr=20.0, soft=3.0), cpu_row(1, usr=50.0)]
    assert judge(signals_for(rows), [0])["verdict"] == "no_contention"
    loose = dict(squeeze_rate=0.3, user_pct=20.0, softirq_pct=3.0)
    result = judge(signals_for(rows), [0], loose)
    assert result["verdict"] == "contention"
    assert result["thresholds"] == dict(DEFAULT_THRESHOLDS, **loose)


# ---------------------------------------------------------------- IRQ CPUs and options


@pytest.mark.parametrize(
    "irqs, cpus, source",
    [
        ([], [], "none"),
        ([{"kind": "control", "affinity": [0], "effective_affinity": [0]}], [], "none"),
        ([{"kind": "queue", "affinity": [0, 1, 2, 3], "effective_affinity": [2]},
          {"kind": "queue", "affinity": [0, 1, 2, 3], "effective_affinity": [3]}], [2, 3], "effective_affinity"),
        ([{"kind": "queue", "affinity": [4, 5], "effective_affinity": None}], [4, 5], "affinity"),
        ([{"kind": "queue", "affinity": [4, 5], "effective_affinity": []},
          {"kind": "queue", "affinity": [0, 1], "effective_affinity": [1]}], [1, 4, 5], "mixed"),
    ],
)
def test_irq_cpus_come_from_effective_affinity_of_queue_irqs(irqs, cpus, source):
    result = irq_cpus_from_nic({"interface": "ens7", "irqs": irqs})
    assert result[0] == cpus
    assert result[1] == source


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"interval": 0}, "interval 0 is not"),
        ({"interval": -1.5}, "interval -1.5"),
        ({"interval": 7200}, "interval 7200"),
        ({"irq_cpus": "0-x"}, "irq_cpus"),
        ({"irq_cpus": "  "}, None),
        ({"squeeze_rate": -1}, "squeeze_rate=-1"),
        ({"idle_pps": -5}, "idle_pps=-5"),
        ({"link_speed_mbps": 0}, "link_speed_mbps 0"),
    ],
)
def test_bad_options_are_rejected_before_reading_anything(options, fragment):
    if fragment is None:
        with pytest.raises(SoftnetError) as info:
            validate_options(options)
        assert "empty" in str(info.value)
        return
    with pytest.raises(SoftnetError) as info:
        validate_options(options)
    assert fragment in str(info.value)
    assert "expected" in info.value.details


def test_good_options_validate():
    interval, irq_cpus, thresholds, speed = validate_options({"interval": 0.5, "irq_cpus": "0-10", "user_pct": 30})
    assert interval == 0.5 and irq_cpus == list(range(11)) and speed is None
    assert thresholds["user_pct"] == 30.0
    assert validate_thresholds({}) == DEFAULT_THRESHOLDS
