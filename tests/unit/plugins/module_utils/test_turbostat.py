# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""turbostat parsing over real captures (tests/unit/fixtures/cpu_power/turbostat, see the README there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._turbostat import (
    TurbostatError,
    busy_frequency,
    deepest_cstates,
    parse_turbostat,
)

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cpu_power" / "turbostat"


def _load(name):
    return parse_turbostat((CAPTURES / name).read_text())


# file, intervals, CPUs in the last interval, last summary (Bzy_MHz, Busy%, Avg_MHz), first columns
CASES = [
    ("intel_srf_2s_224cpu_debug.txt", 1, 224, (800, 0.21, 2), ["Time_Of_Day_Seconds", "Package", "Die", "Core", "CPU"]),
    ("intel_bdw_4c8t_23_intervals.txt", 23, 8, (1017, 0.86, 9), ["Time_Of_Day_Seconds", "Core", "CPU", "Avg_MHz"]),
    ("intel_t410_node_minus1_debug_lkml.txt", 1, 4, (1493, 26.14, 395), ["Node", "Core", "CPU", "Avg_MHz"]),
    ("amd_milan_2s_128cpu_acpi_idle.txt", 1, 128, (1753, 0.08, 1), ["Time_Of_Day_Seconds", "Package", "Die", "Node", "Core", "CPU"]),
    ("amd_genoa_2s_128cpu_acpi_idle.txt", 1, 128, (1551, 0.16, 2), ["Time_Of_Day_Seconds", "Package", "Die", "Core", "CPU"]),
]


@pytest.mark.parametrize("name, intervals, ncpus, summary, first_columns", CASES)
def test_real_captures_parse_by_header(name, intervals, ncpus, summary, first_columns):
    parsed = _load(name)
    assert len(parsed["intervals"]) == intervals
    last = parsed["intervals"][-1]
    assert len(last["cpus"]) == ncpus
    assert (last["summary"]["Bzy_MHz"], last["summary"]["Busy%"], last["summary"]["Avg_MHz"]) == summary
    assert parsed["columns"][: len(first_columns)] == first_columns
    assert last["summary"]["CPU"] is None


def test_sierra_forest_server_rows_by_package_and_state_names():
    parsed = _load("intel_srf_2s_224cpu_debug.txt")
    cpus = parsed["intervals"][0]["cpus"]
    assert sorted(cpus) == list(range(224))
    assert cpus[0]["Package"] == 0 and cpus[223]["Package"] == 1 and cpus[223]["Core"] == 111
    # columns named by sysfs state (C6S, C6SP) and uncore columns with dots are kept by name
    assert cpus[0]["C6SP%"] == 93.88 and cpus[0]["Pkg%pc2"] == 52.25 and cpus[0]["UMHz0.0"] == 1300
    assert parsed["intervals"][0]["summary"]["PkgWatt"] == 119.38
    # a CPU that is not the first of its package stops before the package columns
    assert "PkgWatt" not in cpus[1] and cpus[1]["CoreTmp"] == 42


def test_broadwell_intervals_keep_order_and_secondary_threads_are_short():
    parsed = _load("intel_bdw_4c8t_23_intervals.txt")
    first, last = parsed["intervals"][0], parsed["intervals"][-1]
    assert first["summary"]["Time_Of_Day_Seconds"] == 1737461851.8532 and first["summary"]["Bzy_MHz"] == 2404
    assert last["summary"]["Time_Of_Day_Seconds"] == 1737461962.005107
    assert first["cpus"][3]["C3%"] == 45.15 and first["cpus"][3]["C6%"] == 49.58 and first["cpus"][3]["CPU%c6"] == 49.38
    # CPU 7 is the second thread of core 3: per-thread columns only, up to CPU%c1
    assert first["cpus"][7]["CPU%c1"] == 49.82 and "CPU%c6" not in first["cpus"][7]


def test_node_minus_one_and_debug_preamble():
    parsed = _load("intel_t410_node_minus1_debug_lkml.txt")
    cpus = parsed["intervals"][0]["cpus"]
    assert [cpus[c]["Node"] for c in (0, 1, 2, 3)] == [-1, -1, -1, -1]
    assert cpus[1]["Busy%"] == 50.12 and cpus[1]["Bzy_MHz"] == 1574
    assert cpus[0]["Pkg%pc6"] == 0.0 and "Pkg%pc6" not in cpus[2]


def test_amd_acpi_idle_columns():
    parsed = _load("amd_milan_2s_128cpu_acpi_idle.txt")
    interval = parsed["intervals"][0]
    assert [c for c in interval["columns"] if c.endswith("%") and c != "Busy%"] == ["POLL%", "C1%", "C2%"]
    assert interval["cpus"][65]["Busy%"] == 5.09 and interval["cpus"][65]["C2"] == 22602
    assert interval["summary"]["PkgWatt"] == 115.27


def test_busy_frequency_of_last_interval():
    result = busy_frequency(_load("intel_t410_node_minus1_debug_lkml.txt"), busy_threshold=20.0)
    assert result == {"summary_bzy_mhz": 1493, "summary_busy_pct": 26.14, "busy_cpus": {1: 1574, 3: 1319}}
    bdw = busy_frequency(_load("intel_bdw_4c8t_23_intervals.txt"), busy_threshold=4.0)
    assert bdw == {"summary_bzy_mhz": 1017, "summary_busy_pct": 0.86, "busy_cpus": {2: 839}}


def test_deepest_cstates_intel_and_amd():
    bdw = deepest_cstates(_load("intel_bdw_4c8t_23_intervals.txt"))
    assert (bdw["core"], bdw["package"], bdw["requested"], bdw["module"]) == ("CPU%c7", "Pkg%pc7", "C6%", None)
    # CPU%c7 never reached on this Broadwell: 0 on every core (core counters only on first threads 0-3)
    assert bdw["residency"]["CPU%c7"]["cpus"] == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert bdw["residency"]["C6%"]["cpus"][2] == 49.13
    srf = deepest_cstates(_load("intel_srf_2s_224cpu_debug.txt"))
    assert (srf["core"], srf["module"], srf["package"], srf["requested"]) == ("CPU%c6", "Mod%c6", "Pkg%pc6", "C6SP%")
    assert srf["residency"]["Pkg%pc6"]["summary"] == 0.0
    amd = deepest_cstates(_load("amd_genoa_2s_128cpu_acpi_idle.txt"))
    assert (amd["core"], amd["package"], amd["requested"]) == (None, None, "C2%")
    assert amd["residency"]["C2%"]["cpus"][81] == 17.84


def test_quiet_output_and_space_separated_copy():
    text = (CAPTURES / "intel_t410_node_minus1_debug_lkml.txt").read_text()
    table = text[text.index("Node\tCore"):]  # what --quiet prints: the table only
    spaced = table.replace("\t", "    ")  # as a terminal or web page copies it
    for variant in (table, spaced):
        parsed = parse_turbostat(variant)
        assert parsed["intervals"][0]["cpus"][2]["CoreTmp"] == 63
        assert busy_frequency(parsed, 0.0)["busy_cpus"] == {0: 1473, 1: 1574, 2: 1598, 3: 1319}


def test_summary_only_rows_are_intervals():
    text = "Avg_MHz\tBusy%\tBzy_MHz\n120\t5.00\t2400\n130\t6.00\t2200\n"
    parsed = parse_turbostat(text)
    assert [i["summary"]["Bzy_MHz"] for i in parsed["intervals"]] == [2400, 2200]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no turbostat table"),
        ("turbostat version 2024.12.03 - Len Brown\ncpu0: MSR_IA32_MISC_ENABLE: 0x00850089\n", "no turbostat table"),
        ("Core\tCPU\tAvg_MHz\n", "no turbostat table"),
        ("Core\tCPU\tBusy%\n0\t0\t1.0\t2.0\n", "has 4 cells but its header has 3"),
        ("Core\tCPU\tBusy%\n0\t-3\t1.0\n", "is not a CPU number"),
    ],
)
def test_bad_input_raises_turbostat_error(text, message):
    with pytest.raises(TurbostatError, match=message):
        parse_turbostat(text)


def test_non_text_and_helpers_without_columns():
    with pytest.raises(TurbostatError, match="must be text"):
        parse_turbostat(b"Core CPU")
    parsed = parse_turbostat("Core\tCPU\tAvg_MHz\n-\t-\t10\n0\t0\t10\n")
    with pytest.raises(TurbostatError, match="no Busy% or Bzy_MHz column"):
        busy_frequency(parsed)
    with pytest.raises(TurbostatError, match="no interval"):
        deepest_cstates({"intervals": []})
    assert issubclass(TurbostatError, ValueError)
