# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi -q -x parsing over real captures (tests/unit/fixtures/gpu_health/nvidia_smi, see the README there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nvidia_smi import NvidiaSmiError, gpu_findings, parse_nvidia_smi, to_number

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_health" / "nvidia_smi"


def _text(name):
    return (CAPTURES / name).read_text()


CASES = [
    ("telegraf_a100-sxm4-v12.xml", "v12", "535.54.03", "NVIDIA A100-SXM4-80GB", "clocks_event_reasons", (1275, 1410), (67.03, 500.0), (27, 89)),
    ("telegraf_tesla-t4.xml", "v11", "515.105.01", "Tesla T4", "clocks_throttle_reasons", (585, 1590), (26.78, 70.0), (40, 93)),
    ("telegraf_quadro-p400.xml", None, "418.43", "Quadro P400", "clocks_throttle_reasons", (139, 1252), (None, None), (33, 100)),
    ("telegraf_rtx-4000-sff-ada-v13.xml", "v13", "595.84", "NVIDIA RTX 4000 SFF Ada Generation", "clocks_event_reasons",
     (None, None), (8.44, 70.0), (38, None)),
]


@pytest.mark.parametrize("name, dtd, driver, product, source, clocks, power, temp", CASES)
def test_real_captures(name, dtd, driver, product, source, clocks, power, temp):
    parsed = parse_nvidia_smi(_text(name))
    assert (parsed["dtd_version"], parsed["driver_version"]) == (dtd, driver)
    gpu = parsed["gpus"][0]
    assert gpu["product_name"] == product
    assert gpu["throttle_source"] == source
    if clocks[0] is not None:
        assert (gpu["clocks"]["graphics"], gpu["max_clocks"]["graphics"]) == clocks
    assert (gpu["power"]["draw"], gpu["power"]["limit"]) == power
    assert (gpu["temperature"]["gpu"], gpu["temperature"]["slowdown"]) == temp
    statuses = {f["check"]: f["status"] for f in gpu_findings(parsed)}
    assert statuses["ecc_uncorrectable"] in ("pass", "not_applicable")
    assert statuses["clock_event_reasons"] == "pass"


def test_a100_mig_file_details():
    gpu = parse_nvidia_smi(_text("telegraf_a100-sxm4-v12.xml"))["gpus"][0]
    assert gpu["pci_bus_id"] == "00000000:01:00.0" and gpu["uuid"].startswith("GPU-513536b6")
    assert gpu["remapped_rows"] is None and gpu["retired_pages"]["pending"] is None
    assert gpu["ecc"]["aggregate"]["dram_uncorrectable"] == 0
    statuses = {f["check"]: f["status"] for f in gpu_findings({"gpus": [gpu]})}
    assert statuses == {"remapped_rows": "not_applicable", "retired_pages": "not_applicable", "ecc_uncorrectable": "pass",
                        "clock_event_reasons": "pass", "persistence_mode": "warn", "temperature": "pass",
                        "power_limit": "pass", "fabric": "not_applicable", "applications_clocks": "pass"}


def test_old_layout_single_double_bit_and_idle_is_benign():
    gpu = parse_nvidia_smi(_text("telegraf_quadro-p400.xml"))["gpus"][0]
    assert gpu["ecc"]["volatile"] == {"single_bit": None, "double_bit": None}
    assert gpu["active_throttle_reasons"] == ["gpu_idle"]


def test_v13_remapped_rows_and_tlimit_only_temperature():
    gpu = parse_nvidia_smi(_text("telegraf_rtx-4000-sff-ada-v13.xml"))["gpus"][0]
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["persistence_mode"] is True
    statuses = {f["check"]: f["status"] for f in gpu_findings({"gpus": [gpu]})}
    assert statuses["remapped_rows"] == "pass" and statuses["temperature"] == "pass"
    assert gpu["temperature"]["tlimit"] == 49 and gpu["temperature"]["slowdown_tlimit"] == -2


# Issue 29, class 2: a driver that reports only the T.Limit form (DTD v13, the telegraf RTX 4000 Ada capture) is judged
# on the margin; before, the check said not_applicable and an overheating GPU never failed.
@pytest.mark.parametrize("margin,status", [("49 C", "pass"), ("0 C", "warn"), ("-2 C", "fail"), ("-5 C", "fail")])
def test_tlimit_only_temperature_is_judged(margin, status):
    found = _derived([("<gpu_temp_tlimit>49 C</gpu_temp_tlimit>", "<gpu_temp_tlimit>%s</gpu_temp_tlimit>" % margin)])
    assert found["temperature"]["status"] == status, found["temperature"]
    if status == "fail":
        assert "slowdown margin -2 C" in found["temperature"]["message"] and found["temperature"]["fix"]


def test_both_forms_absolute_wins_and_tlimit_without_threshold_is_not_applicable():
    # Both forms present (a v12 capture with the absolute thresholds plus a T.Limit margin): the absolute one decides.
    found = _derived([("<gpu_temp_tlimit>N/A</gpu_temp_tlimit>", "<gpu_temp_tlimit>-3 C</gpu_temp_tlimit>")],
                     "telegraf_a100-sxm4-v12.xml")
    assert found["temperature"]["status"] == "pass" and "slowdown threshold 89 C" in found["temperature"]["message"]
    found = _derived([("<gpu_temp>27 C</gpu_temp>", "<gpu_temp>89 C</gpu_temp>")], "telegraf_a100-sxm4-v12.xml")
    assert found["temperature"]["status"] == "fail"
    # A margin with no threshold to compare it with cannot be judged.
    found = _derived([("<gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>",
                       "<gpu_temp_slow_tlimit_threshold>N/A</gpu_temp_slow_tlimit_threshold>")])
    assert found["temperature"]["status"] == "not_applicable"


def _derived(replacements, name="telegraf_rtx-4000-sff-ada-v13.xml"):
    text = _text(name)
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new, 1)
    return {f["check"]: f for f in gpu_findings(parse_nvidia_smi(text))}


def test_derived_failures():
    found = _derived([
        ("<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>"),
        ("<clocks_event_reason_hw_slowdown>Not Active", "<clocks_event_reason_hw_slowdown>Active"),
    ])
    assert found["remapped_rows"]["status"] == "fail" and found["clock_event_reasons"]["status"] == "fail"
    found = _derived([("<clocks_throttle_reason_sw_power_cap>Not Active", "<clocks_throttle_reason_sw_power_cap>Active"),
                      ("<gpu_temp>40 C</gpu_temp>", "<gpu_temp>93 C</gpu_temp>"),
                      ("<pending_retirement>No", "<pending_retirement>Yes")], "telegraf_tesla-t4.xml")
    assert found["clock_event_reasons"]["status"] == "warn"
    assert found["temperature"]["status"] == "fail" and found["retired_pages"]["status"] == "fail"


def test_uncorrectable_ecc_fails():
    found = _derived([("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>")], "telegraf_tesla-t4.xml")
    assert found["ecc_uncorrectable"]["status"] == "fail" and "2 volatile" in found["ecc_uncorrectable"]["message"]


@pytest.mark.parametrize("text, value", [("", ""), ("not xml <", "not xml <"), ("<foo/>", "foo")])
def test_bad_input(text, value):
    with pytest.raises(NvidiaSmiError) as err:
        parse_nvidia_smi(text)
    assert err.value.expected
    if value == "foo":
        assert err.value.value == "foo"


def test_values():
    assert to_number("1410 MHz") == 1410 and to_number("67.04 W") == 67.04 and to_number("[N/A]") is None
    with pytest.raises(NvidiaSmiError) as err:
        to_number("fast MHz", "clocks.sm_clock")
    assert err.value.value == "fast MHz"


def _gpu_with(**changes):
    gpu = parse_nvidia_smi(_text("telegraf_a100-sxm4-v12.xml"))["gpus"][0]
    gpu.update(changes)
    return {f["check"]: f for f in gpu_findings({"gpus": [gpu]})}


def test_power_cap_below_maximum_warns_and_names_the_maximum():
    found = _gpu_with(power={"draw": 80.0, "limit": 400.0, "max_limit": 500.0})["power_limit"]
    assert found["status"] == "warn" and "500.0" in found["fix"]
    assert _gpu_with(power={"draw": 80.0, "limit": None, "max_limit": 500.0})["power_limit"]["status"] == "not_applicable"


@pytest.mark.parametrize("state,status,expected", [
    ("Completed", "Success", "pass"),
    ("In Progress", "N/A", "fail"),
    ("Completed", "Failure", "fail"),
    ("N/A", None, "not_applicable"),
])
def test_fabric_states(state, status, expected):
    assert _gpu_with(fabric={"state": state, "status": status})["fabric"]["status"] == expected


def test_application_clocks_lowered_below_their_defaults_warn():
    gpu = parse_nvidia_smi(_text("telegraf_a100-sxm4-v12.xml"))["gpus"][0]
    # The real A100 capture: application clocks at their default (1275 MHz), below the 1410 MHz maximum: a pass.
    assert (gpu["applications_clocks"]["graphics"], gpu["default_applications_clocks"]["graphics"], gpu["max_clocks"]["graphics"]) == (
        1275, 1275, 1410)
    found = _gpu_with(applications_clocks=dict(gpu["applications_clocks"], graphics=900))["applications_clocks"]
    assert found["status"] == "warn" and "graphics 900 < 1275 MHz" in found["message"] and "-rac" in found["fix"]
