# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpupower idle-info / frequency-info parsing over real captures (tests/unit/fixtures/cpu_power/cpupower), and the cpuidle tree helper."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpupower_capture import (
    CpupowerError,
    parse_frequency_info,
    parse_idle_info,
    to_khz,
)
from cpuidle_tree import sysfs_from_idle_info

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cpu_power" / "cpupower"


def _text(name):
    return (CAPTURES / name).read_text()


# file, driver, governor, cpu, [(name, latency, usage, duration, disabled)]
IDLE_CASES = [
    ("idle_intel_idle_server_c6.txt", "intel_idle", "menu", 0,
     [("POLL", 0, 9375, 77522, False), ("C1", 1, 7186, 505079, False), ("C1E", 4, 5839301, 3199827482, False), ("C6", 170, 5214705, 3710485901, False)]),
    ("idle_intel_idle_c6_disabled.txt", "intel_idle", "menu", 0,
     [("POLL", 0, 540710, 15742526, False), ("C1", 1, 1883513, 269397652, False), ("C1E", 2, 502712325, 2523210382346, False), ("C6", 190, 0, 0, True)]),
    ("idle_amd_acpi_idle_c2.txt", "acpi_idle", "menu", 9,
     [("POLL", 0, 62, 3330, False), ("C1", 1, 4404, 1675915, False), ("C2", 400, 16537, 1645628548, False)]),
    ("idle_amd_acpi_idle_max_cstate1_poll_c1.txt", "acpi_idle", "menu", 30,
     [("POLL", 0, 1355, 58461, False), ("C1", 1, 285497, 7742516699, False)]),
    ("idle_driver_none_idle_poll.txt", "none", "menu", 11, []),
    ("SYNTHETIC_idle_kvm_guest_haltpoll.txt", "haltpoll", "haltpoll", 0,
     [("POLL", 0, 1523, 91022, False), ("haltpoll", 1, 884213, 912837465, False)]),
]


@pytest.mark.parametrize("name, driver, governor, cpu, states", IDLE_CASES)
def test_idle_info_captures(name, driver, governor, cpu, states):
    parsed = parse_idle_info(_text(name))
    assert (parsed["driver"], parsed["governor"], parsed["cpu"]) == (driver, governor, cpu)
    assert parsed["number_of_states"] == len(states)
    assert [(s["name"], s["latency"], s["usage"], s["duration"], s["disabled"]) for s in parsed["states"]] == states
    assert [s["index"] for s in parsed["states"]] == list(range(len(states)))
    assert list(parsed["cpus"]) == [cpu]


def test_idle_info_descriptions_and_client_c10():
    parsed = parse_idle_info(_text("idle_intel_idle_client_c10.txt"))
    assert parsed["available_states"] == ["POLL", "C1", "C1E", "C3", "C6", "C7s", "C8", "C9", "C10"]
    assert parsed["states"][-1]["description"] == "MWAIT 0x60" and parsed["states"][-1]["latency"] == 890
    assert parse_idle_info(_text("idle_amd_acpi_idle_c2.txt"))["states"][2]["description"] == "ACPI IOPORT 0x414"


def test_idle_info_several_cpus_and_old_flags_key():
    text = _text("idle_amd_acpi_idle_max_cstate1_poll_c1.txt") + _text("idle_amd_acpi_idle_max_cstate1_poll_c1.txt").split("\n", 2)[2].replace(
        "analyzing CPU 30:", "analyzing CPU 31:").replace("Flags/Description", "Flags/Desc")
    parsed = parse_idle_info(text)
    assert sorted(parsed["cpus"]) == [30, 31] and parsed["cpu"] == 30
    assert parsed["cpus"][31]["states"][1]["description"] == "ACPI FFH MWAIT 0x0"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "not cpupower idle-info output"),
        (_text("freq_intel_pstate_turbo.txt"), "not cpupower idle-info output"),
        ("CPUidle driver: intel_idle\nanalyzing CPU 0:\nNumber of idle states: 3\nAvailable idle states: POLL C1 C6\nPOLL:\nLatency: 0\nC1:\nLatency: 1\n",
         "'Number of idle states: 3' but 2 state blocks"),
        ("CPUidle driver: intel_idle\nanalyzing CPU 0:\nNumber of idle states: 2\nAvailable idle states: POLL C6\nPOLL:\nLatency: 0\nC1:\nLatency: 1\n",
         "differ from 'Available idle states: POLL C6'"),
        ("CPUidle driver: intel_idle\nanalyzing CPU 0:\nNumber of idle states: 1\nPOLL:\nLatency: zero\n", "'zero' is not a number"),
    ],
)
def test_idle_info_bad_input(text, message):
    with pytest.raises(CpupowerError, match=message):
        parse_idle_info(text)


# file, driver, (hw min, hw max), (policy min, policy max), governor, current kHz, boost (supported, active), latency us
FREQ_CASES = [
    ("freq_intel_pstate_turbo.txt", "intel_pstate", (800000, 3900000), (800000, 3900000), "performance", 3900000, (True, True), None),
    ("freq_intel_pstate_old_format.txt", "intel_pstate", (1000000, 3100000), (1000000, 3100000), "powersave", 2700000, (True, True), 970.0),
    ("freq_acpi_cpufreq_intel_turbo_ratios.txt", "acpi-cpufreq", (1200000, 2100000), (1200000, 2100000), "schedutil", 2090000, (True, True), 10.0),
    ("freq_acpi_cpufreq_amd_pstates.txt", "acpi-cpufreq", (2200000, 4850000), (2200000, 3800000), "schedutil", 3800000, (True, True), None),
    ("freq_amd_pstate.txt", "amd-pstate", (400000, 4330000), (400000, 4330000), "conservative", 1100000, (True, True), 131.0),
]


@pytest.mark.parametrize("name, driver, hw, policy, governor, current, boost, latency", FREQ_CASES)
def test_frequency_info_captures(name, driver, hw, policy, governor, current, boost, latency):
    parsed = parse_frequency_info(_text(name))
    assert parsed["driver"] == driver
    assert (parsed["hw_min_khz"], parsed["hw_max_khz"]) == hw
    assert (parsed["policy_min_khz"], parsed["policy_max_khz"]) == policy
    assert parsed["governor"] == governor and parsed["current_khz"] == current
    assert (parsed["boost_supported"], parsed["boost_active"]) == boost
    assert parsed["max_transition_latency_us"] == latency


def test_frequency_info_details():
    acpi = parse_frequency_info(_text("freq_acpi_cpufreq_intel_turbo_ratios.txt"))
    assert acpi["available_frequencies_khz"][:3] == [2100000, 2100000, 2000000] and acpi["available_frequencies_khz"][-1] == 1200000
    assert acpi["available_governors"] == ["conservative", "ondemand", "userspace", "powersave", "performance", "schedutil"]
    assert acpi["current_hardware_khz"] is None and acpi["current_kernel_khz"] == 2090000
    assert acpi["boost_details"][0] == "25500 MHz max turbo 4 active cores"
    amd = parse_frequency_info(_text("freq_acpi_cpufreq_amd_pstates.txt"))
    assert amd["cpu"] == 10 and amd["related_cpus"] == [10] and amd["affected_cpus"] == [10]
    assert amd["current_hardware_khz"] == 3800000 and amd["boost_details"][-1] == "Pstate-P2:  2200MHz"
    old = parse_frequency_info(_text("freq_intel_pstate_old_format.txt"))
    assert old["available_governors"] == ["performance", "powersave"] and old["current_hardware_khz"] == 2700000


def test_frequency_info_vm_without_cpufreq_driver():
    # the line cpupower prints when no cpufreq driver is loaded (cpufreq-info.c)
    text = "analyzing CPU 0:\n  no or unknown cpufreq driver is active on this CPU\n  CPUs which run at the same hardware frequency: Not Available\n"
    parsed = parse_frequency_info(text)
    assert parsed["driver"] is None and parsed["related_cpus"] is None and parsed["hw_max_khz"] is None


@pytest.mark.parametrize(
    "value, khz",
    [("1.20 GHz", 1200000), ("800 MHz", 800000), ("3.80 GHz", 3800000), ("4.33 GHz", 4330000), ("759 MHz", 759000), ("2.095 GHz", 2095000), ("1000 kHz", 1000)],
)
def test_to_khz(value, khz):
    assert to_khz(value) == khz


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "not cpupower frequency-info output"),
        (_text("idle_intel_idle_server_c6.txt"), "not cpupower frequency-info output"),
        ("analyzing CPU 0:\n  driver: intel_pstate\n  hardware limits: 800 MHz to 3.9 GHz\n", "cannot read hardware limits"),
        ("analyzing CPU 0:\n  driver: intel_pstate\n  current policy: frequency should be somewhere\n", "cannot read the policy limits"),
        ("analyzing CPU 0:\n  driver: intel_pstate\n  current CPU frequency: fast\n", "cannot read the current frequency"),
        ("analyzing CPU 0:\n  driver: intel_pstate\n  hardware limits: 800 MHz - lots\n", "'lots' is not a frequency"),
    ],
)
def test_frequency_info_bad_input(text, message):
    with pytest.raises(CpupowerError, match=message):
        parse_frequency_info(text)
    assert issubclass(CpupowerError, ValueError)


def _read(path):
    return path.read_text().rstrip("\n")


def test_cpuidle_tree_from_real_state_table(tmp_path):
    parsed = parse_idle_info(_text("idle_intel_idle_c6_disabled.txt"))
    root = sysfs_from_idle_info(parsed, "0-3", tmp_path / "sys", residency={"C6": 600})
    cpu = root / "devices" / "system" / "cpu"
    assert [_read(cpu / n) for n in ("online", "present", "possible")] == ["0-3"] * 3
    assert [_read(cpu / "cpuidle" / n) for n in ("current_driver", "current_governor", "current_governor_ro")] == ["intel_idle", "menu", "menu"]
    state3 = cpu / "cpu3" / "cpuidle" / "state3"
    assert [_read(state3 / n) for n in ("name", "desc", "latency", "residency", "usage", "time", "disable", "default_status")] == [
        "C6", "MWAIT 0x20", "190", "600", "0", "0", "1", "enabled",
    ]
    state2 = cpu / "cpu0" / "cpuidle" / "state2"
    assert [_read(state2 / n) for n in ("name", "latency", "residency", "time", "disable")] == ["C1E", "2", "2", "2523210382346", "0"]
    assert sorted(p.name for p in (cpu / "cpu1" / "cpuidle").iterdir()) == ["state0", "state1", "state2", "state3"]


def test_cpuidle_tree_without_states(tmp_path):
    parsed = parse_idle_info(_text("idle_driver_none_idle_poll.txt"))
    root = sysfs_from_idle_info(parsed, [0, 1, 2, 5], tmp_path)
    cpu = root / "devices" / "system" / "cpu"
    assert _read(cpu / "online") == "0-2,5" and _read(cpu / "cpuidle" / "current_driver") == "none"
    assert not (cpu / "cpu0" / "cpuidle").exists()
