# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_health's whole result on the real nvidia-smi and dcgmi captures, written out in full.

Mutation testing (benchmarks/mutation_results.md, area gpu_findings) found the parsers' values and the findings'
messages, evidence and fixes tested by status and a few fields only (60.3 %). Each case below runs
``_gpu.health.gpu_health`` on a generated sysfs tree (N NVIDIA GPUs on the bus) with a real capture
(fixtures/gpu_health, provenance in its README) or a runner that answers as the tools do (``nvidia-smi`` and
``dcgmi`` do not run here; the answers are the real captures, an exit 127, or a failure), and compares the whole
result (PCI GPUs, parsed nvidia-smi and dcgmi, every finding, sources) with
``fixtures/gpu_health/expected/gpu_health_results.json``. That file was generated from the code and its findings
were reviewed by hand; the parsed values are also checked field by field against the captures by
test_nvidia_smi.py and test_dcgmi.py. Regenerate after a deliberate change with GPUNODE_REGENERATE=1 and review
the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import health as _gpu_health

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_health"
EXPECTED = FIXTURES / "expected" / "gpu_health_results.json"
XML = ["telegraf_a100-sxm4-v12.xml", "telegraf_quadro-p400.xml", "telegraf_rtx-4000-sff-ada-v13.xml",
       "telegraf_tesla-t4.xml"]
DCGMI = sorted(p.name for p in (FIXTURES / "dcgmi").iterdir())

# name -> (GPUs on the bus, nvidia-smi XML capture or None, dcgm_level, dcgmi capture or None, runner answers)
CASES = {}
for xml in XML:
    CASES["smi_" + xml[:-4]] = (1, xml, 0, None, None)
for dcgmi in DCGMI:
    CASES["dcgmi_" + dcgmi[:-4]] = (1, "telegraf_a100-sxm4-v12.xml", 1, dcgmi, None)
CASES.update({
    "bus_has_more_gpus_than_smi": (2, "telegraf_tesla-t4.xml", 0, None, None),
    "no_gpu_no_smi_captured_tree": (0, None, 0, None, None),
    "gpus_but_no_smi_captured_tree": (2, None, 0, None, None),
    "captured_tree_dcgm_level_without_capture": (1, "telegraf_tesla-t4.xml", 2, None, None),
    "live_smi_not_installed": (2, None, 1, None, {"nvidia-smi": [127, "", ""], "dcgmi": [127, "", ""]}),
    "live_smi_fails_dcgmi_no_table": (1, None, 3, None, {
        "nvidia-smi": [9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"],
        "dcgmi": [255, "", "Error: unable to establish a connection to the specified host: localhost\n"]}),
    "live_no_gpu_no_dcgmi": (0, None, 1, None, {"nvidia-smi": [127, "", ""], "dcgmi": [127, "", ""]}),
    "live_smi_and_dcgmi_answer": (1, None, 1, None, {"nvidia-smi": [0, "@telegraf_tesla-t4.xml", ""],
                                                     "dcgmi": [0, "@" + DCGMI[0], ""]}),
    "live_outputs_that_are_not_tables": (1, None, 1, None, {"nvidia-smi": [0, "<nvidia_smi_log><bogus/>", ""],
                                                            "dcgmi": [0, "Successfully ran diagnostic? no\n", ""]}),
})

# Real captures with named edits (DERIVED, not captures): the states a healthy capture does not show. Each edit is
# (capture, [(text in the capture, replacement), ...]); the test asserts every old text is there.
V13, T4, A100 = "telegraf_rtx-4000-sff-ada-v13.xml", "telegraf_tesla-t4.xml", "telegraf_a100-sxm4-v12.xml"
DERIVED = {
    "derived_v13_row_remap_pending_and_hw_slowdown": (V13, [
        ("<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>"),
        ("<clocks_event_reason_hw_slowdown>Not Active", "<clocks_event_reason_hw_slowdown>Active")]),
    "derived_v13_row_remap_failure_and_hot": (V13, [
        ("<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>"),
        ("<remapped_row_unc>0</remapped_row_unc>", "<remapped_row_unc>3</remapped_row_unc>"),
        ("<gpu_temp>38 C</gpu_temp>", "<gpu_temp>101 C</gpu_temp>")]),
    "derived_v13_tlimit_without_threshold": (V13, [
        ("<gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>",
         "<gpu_temp_slow_tlimit_threshold>N/A</gpu_temp_slow_tlimit_threshold>")]),
    "derived_t4_power_cap_hot_retirement_pending": (T4, [
        ("<clocks_throttle_reason_sw_power_cap>Not Active", "<clocks_throttle_reason_sw_power_cap>Active"),
        ("<gpu_temp>40 C</gpu_temp>", "<gpu_temp>93 C</gpu_temp>"),
        ("<pending_retirement>No", "<pending_retirement>Yes")]),
    "derived_t4_uncorrectable_ecc": (T4, [("<dram_uncorrectable>0</dram_uncorrectable>",
                                          "<dram_uncorrectable>2</dram_uncorrectable>")]),
    "derived_a100_tuned_but_capped_clocked_down_and_fabric_pending": (A100, [
        ("<persistence_mode>Disabled</persistence_mode>", "<persistence_mode>Enabled</persistence_mode>"),
        ("<current_power_limit>500.00 W</current_power_limit>", "<current_power_limit>400.00 W</current_power_limit>"),
        ("<applications_clocks>\n            <graphics_clock>1275 MHz",
         "<applications_clocks>\n            <graphics_clock>900 MHz"),
        ("<fabric>\n            <state>N/A</state>\n            <status>N/A</status>",
         "<fabric>\n            <state>In Progress</state>\n            <status>N/A</status>"),
        ("<clocks_event_reason_hw_thermal_slowdown>Not Active", "<clocks_event_reason_hw_thermal_slowdown>Active"),
        ("<gpu_temp>27 C</gpu_temp>", "<gpu_temp>90 C</gpu_temp>")]),
    "derived_a100_fabric_failed": (A100, [
        ("<fabric>\n            <state>N/A</state>\n            <status>N/A</status>",
         "<fabric>\n            <state>Completed</state>\n            <status>Failure</status>")]),
    "derived_a100_fabric_completed": (A100, [
        ("<fabric>\n            <state>N/A</state>\n            <status>N/A</status>",
         "<fabric>\n            <state>Completed</state>\n            <status>Success</status>")]),
}
for _name, (_xml, _edits) in DERIVED.items():
    CASES[_name] = (1, _xml, 0, None, None)

# The same for dcgmi: every test skipped; every test past the Deployment checks skipped; a warning row.
P100 = "dcgm_p100_level2_skip_all_ornl_doc.txt"
DERIVED_DCGMI = {
    "derived_dcgmi_every_test_skipped": (P100, [("| Pass  ", "| Skip  ")] * 8 + [("| Pass - All", "| Skip - All")] * 2),
    "derived_dcgmi_gpu_tests_skipped": (P100, [("| GPU Memory                | Pass - All",
                                                "| GPU Memory                | Skip - All"),
                                               ("| PCIe                      | Pass - All",
                                                "| PCIe                      | Skip - All")]),
    "derived_dcgmi_warn_row": (P100, [("| PCIe                      | Pass - All        ",
                                       "| PCIe                      | Warn - All        ")]),
}
for _name, (_capture, _edits) in DERIVED_DCGMI.items():
    CASES[_name] = (1, "telegraf_tesla-t4.xml", 2, _capture, None)


def _tree(root, gpus):
    base = root / "bus" / "pci" / "devices"
    base.mkdir(parents=True)
    for index in range(gpus):
        dev = base / ("0000:%02x:00.0" % (0x17 + index))
        dev.mkdir()
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text("0x030200\n" if index % 2 == 0 else "0x030000\n")
    other = base / "0000:00:1f.0"                       # an Intel device: never a GPU
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x030000\n")
    return str(root)


def _answer(text):
    if text.startswith("@"):
        name = text[1:]
        return ((FIXTURES / "nvidia_smi" / name) if name.endswith(".xml") else (FIXTURES / "dcgmi" / name)).read_text()
    return text


def _edited(capture, edits, out):
    """A real capture with the named edits (each old text must be in it), written to ``out``; its path."""
    text = capture.read_text()
    for old, replacement in edits:
        assert old in text, (capture.name, old)
        text = text.replace(old, replacement, 1)
    out.write_text(text)
    return str(out)


def _run_case(tmp_path, name):
    gpus, xml, level, dcgmi, answers = CASES[name]
    run = None
    if answers is not None:
        commands = {"nvidia-smi": ["nvidia-smi", "-q", "-x"], "dcgmi": ["dcgmi", "diag", "-r", str(level)]}

        def run(argv):
            assert argv == commands[argv[0]], argv          # the exact command the node would run
            rc, out, err = answers[argv[0]]
            return rc, _answer(out), err
    xml_path = str(FIXTURES / "nvidia_smi" / xml) if xml else None
    if name in DERIVED:
        xml_path = _edited(FIXTURES / "nvidia_smi" / xml, DERIVED[name][1], tmp_path / name)
    dcgmi_path = str(FIXTURES / "dcgmi" / dcgmi) if dcgmi else None
    if name in DERIVED_DCGMI:
        dcgmi_path = _edited(FIXTURES / "dcgmi" / dcgmi, DERIVED_DCGMI[name][1], tmp_path / name)
    result = _gpu_health.gpu_health(
        sysfs=_tree(tmp_path / "sys", gpus), run=run, nvidia_smi_xml_path=xml_path, dcgm_level=level,
        dcgmi_output_path=dcgmi_path)
    # Paths of the captures as the fixture names them (this checkout's location is not part of the result).
    text = json.dumps(result).replace(str(FIXTURES) + "/", "<fixtures>/")
    return json.loads(text.replace(str(tmp_path) + "/", "<derived>/"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_whole_result_on_real_captures(tmp_path, name):
    got = _run_case(tmp_path, name)
    if os.environ.get("GPUNODE_REGENERATE"):
        data = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
        data[name] = got
        EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        pytest.skip("regenerated")
    expected = json.loads(EXPECTED.read_text())
    assert got == expected[name]


def test_the_expected_file_holds_exactly_the_cases():
    assert sorted(json.loads(EXPECTED.read_text())) == sorted(CASES)


@pytest.mark.parametrize("kwargs,message,details", [
    ({"dcgm_level": 5}, "dcgm_level 5 is not a dcgmi diag run level",
     {"option": "dcgm_level", "value": 5, "expected": "0 (do not run) or 1-4 (dcgmi diag -r)"}),
    ({"dcgm_level": True}, "dcgm_level True is not a dcgmi diag run level",
     {"option": "dcgm_level", "value": True, "expected": "0 (do not run) or 1-4 (dcgmi diag -r)"}),
    ({"sysfs": "<empty>"}, "sysfs_path <empty> has no bus directory",
     {"option": "sysfs_path", "value": "<empty>", "expected": "a sysfs root"}),
    ({"nvidia_smi_xml_path": "<empty>/smi.xml"}, "nvidia_smi_xml_path <empty>/smi.xml cannot be read",
     {"option": "nvidia_smi_xml_path", "value": "<empty>/smi.xml", "expected": "a readable file"}),
    ({"dcgmi_output_path": "<empty>/diag.txt", "dcgm_level": 1}, "dcgmi_output_path <empty>/diag.txt cannot be read",
     {"option": "dcgmi_output_path", "value": "<empty>/diag.txt", "expected": "a readable file"}),
])
def test_bad_options_are_refused_naming_the_option_value_and_expected(tmp_path, kwargs, message, details):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = {"sysfs": _tree(tmp_path / "sys", 1)}
    args.update(dict((k, v.replace("<empty>", str(empty)) if isinstance(v, str) else v) for k, v in kwargs.items()))
    with pytest.raises(_gpu_health.GpuHealthError) as exc:
        _gpu_health.gpu_health(**args)
    assert str(exc.value) == message.replace("<empty>", str(empty))
    assert exc.value.details == json.loads(json.dumps(details).replace("<empty>", str(empty)))


# Every value the parser reads, made unreadable in a real capture (the n-th element of that name): the refusal names
# the XML path of the value (checked by hand against each capture's layout), the bad text and what was expected.
BAD_VALUE_FIELDS = [
    ("a100-sxm4-v12", "graphics_clock", 2, "applications_clocks.graphics_clock"),
    ("a100-sxm4-v12", "mem_clock", 2, "applications_clocks.mem_clock"),
    ("a100-sxm4-v12", "attached_gpus", 1, "attached_gpus"),
    ("a100-sxm4-v12", "graphics_clock", 1, "clocks.graphics_clock"),
    ("a100-sxm4-v12", "mem_clock", 1, "clocks.mem_clock"),
    ("a100-sxm4-v12", "sm_clock", 1, "clocks.sm_clock"),
    ("a100-sxm4-v12", "clocks_event_reason_applications_clocks_setting", 1, "clocks_event_reasons.clocks_event_reason_applications_clocks_setting"),
    ("a100-sxm4-v12", "clocks_event_reason_display_clocks_setting", 1, "clocks_event_reasons.clocks_event_reason_display_clocks_setting"),
    ("a100-sxm4-v12", "clocks_event_reason_gpu_idle", 1, "clocks_event_reasons.clocks_event_reason_gpu_idle"),
    ("a100-sxm4-v12", "clocks_event_reason_hw_power_brake_slowdown", 1, "clocks_event_reasons.clocks_event_reason_hw_power_brake_slowdown"),
    ("a100-sxm4-v12", "clocks_event_reason_hw_slowdown", 1, "clocks_event_reasons.clocks_event_reason_hw_slowdown"),
    ("a100-sxm4-v12", "clocks_event_reason_hw_thermal_slowdown", 1, "clocks_event_reasons.clocks_event_reason_hw_thermal_slowdown"),
    ("a100-sxm4-v12", "clocks_event_reason_sw_power_cap", 1, "clocks_event_reasons.clocks_event_reason_sw_power_cap"),
    ("a100-sxm4-v12", "clocks_event_reason_sw_thermal_slowdown", 1, "clocks_event_reasons.clocks_event_reason_sw_thermal_slowdown"),
    ("a100-sxm4-v12", "clocks_event_reason_sync_boost", 1, "clocks_event_reasons.clocks_event_reason_sync_boost"),
    ("tesla-t4", "clocks_throttle_reason_applications_clocks_setting", 1, "clocks_throttle_reasons.clocks_throttle_reason_applications_clocks_setting"),
    ("tesla-t4", "clocks_throttle_reason_display_clocks_setting", 1, "clocks_throttle_reasons.clocks_throttle_reason_display_clocks_setting"),
    ("tesla-t4", "clocks_throttle_reason_gpu_idle", 1, "clocks_throttle_reasons.clocks_throttle_reason_gpu_idle"),
    ("tesla-t4", "clocks_throttle_reason_hw_power_brake_slowdown", 1, "clocks_throttle_reasons.clocks_throttle_reason_hw_power_brake_slowdown"),
    ("tesla-t4", "clocks_throttle_reason_hw_slowdown", 1, "clocks_throttle_reasons.clocks_throttle_reason_hw_slowdown"),
    ("tesla-t4", "clocks_throttle_reason_hw_thermal_slowdown", 1, "clocks_throttle_reasons.clocks_throttle_reason_hw_thermal_slowdown"),
    ("tesla-t4", "clocks_throttle_reason_sw_power_cap", 1, "clocks_throttle_reasons.clocks_throttle_reason_sw_power_cap"),
    ("tesla-t4", "clocks_throttle_reason_sw_thermal_slowdown", 1, "clocks_throttle_reasons.clocks_throttle_reason_sw_thermal_slowdown"),
    ("tesla-t4", "clocks_throttle_reason_sync_boost", 1, "clocks_throttle_reasons.clocks_throttle_reason_sync_boost"),
    ("a100-sxm4-v12", "graphics_clock", 3, "default_applications_clocks.graphics_clock"),
    ("a100-sxm4-v12", "mem_clock", 3, "default_applications_clocks.mem_clock"),
    ("quadro-p400", "total", 6, "ecc_errors.aggregate.double_bit.total"),
    ("a100-sxm4-v12", "dram_correctable", 2, "ecc_errors.aggregate.dram_correctable"),
    ("a100-sxm4-v12", "dram_uncorrectable", 2, "ecc_errors.aggregate.dram_uncorrectable"),
    ("quadro-p400", "total", 5, "ecc_errors.aggregate.single_bit.total"),
    ("a100-sxm4-v12", "sram_correctable", 2, "ecc_errors.aggregate.sram_correctable"),
    ("rtx-4000-sff-ada-v13", "sram_threshold_exceeded", 1, "ecc_errors.aggregate.sram_threshold_exceeded"),
    ("a100-sxm4-v12", "sram_uncorrectable", 6, "ecc_errors.aggregate.sram_uncorrectable"),
    ("rtx-4000-sff-ada-v13", "sram_uncorrectable_parity", 2, "ecc_errors.aggregate.sram_uncorrectable_parity"),
    ("rtx-4000-sff-ada-v13", "sram_uncorrectable_secded", 2, "ecc_errors.aggregate.sram_uncorrectable_secded"),
    ("quadro-p400", "total", 4, "ecc_errors.volatile.double_bit.total"),
    ("a100-sxm4-v12", "dram_correctable", 1, "ecc_errors.volatile.dram_correctable"),
    ("a100-sxm4-v12", "dram_uncorrectable", 1, "ecc_errors.volatile.dram_uncorrectable"),
    ("quadro-p400", "total", 3, "ecc_errors.volatile.single_bit.total"),
    ("a100-sxm4-v12", "sram_correctable", 1, "ecc_errors.volatile.sram_correctable"),
    ("a100-sxm4-v12", "sram_uncorrectable", 5, "ecc_errors.volatile.sram_uncorrectable"),
    ("rtx-4000-sff-ada-v13", "sram_uncorrectable_parity", 1, "ecc_errors.volatile.sram_uncorrectable_parity"),
    ("rtx-4000-sff-ada-v13", "sram_uncorrectable_secded", 1, "ecc_errors.volatile.sram_uncorrectable_secded"),
    ("a100-sxm4-v12", "graphics_clock", 4, "max_clocks.graphics_clock"),
    ("a100-sxm4-v12", "mem_clock", 5, "max_clocks.mem_clock"),
    ("a100-sxm4-v12", "sm_clock", 2, "max_clocks.sm_clock"),
    ("a100-sxm4-v12", "persistence_mode", 1, "persistence_mode"),
    ("a100-sxm4-v12", "current_power_limit", 1, "power.current_power_limit"),
    ("quadro-p400", "enforced_power_limit", 1, "power.enforced_power_limit"),
    ("rtx-4000-sff-ada-v13", "instant_power_draw", 1, "power.instant_power_draw"),
    ("a100-sxm4-v12", "max_power_limit", 1, "power.max_power_limit"),
    ("a100-sxm4-v12", "power_draw", 1, "power.power_draw"),
    ("tesla-t4", "power_limit", 1, "power.power_limit"),
    ("rtx-4000-sff-ada-v13", "remapped_row_corr", 1, "remapped_rows.remapped_row_corr"),
    ("rtx-4000-sff-ada-v13", "remapped_row_failure", 1, "remapped_rows.remapped_row_failure"),
    ("rtx-4000-sff-ada-v13", "remapped_row_pending", 1, "remapped_rows.remapped_row_pending"),
    ("rtx-4000-sff-ada-v13", "remapped_row_unc", 1, "remapped_rows.remapped_row_unc"),
    ("a100-sxm4-v12", "retired_count", 2, "retired_pages.double_bit"),
    ("a100-sxm4-v12", "pending_retirement", 1, "retired_pages.pending_retirement"),
    ("a100-sxm4-v12", "retired_count", 1, "retired_pages.single_bit"),
    ("a100-sxm4-v12", "gpu_temp", 1, "temperature.gpu_temp"),
    ("rtx-4000-sff-ada-v13", "gpu_temp_max_gpu_tlimit_threshold", 1, "temperature.gpu_temp_max_gpu_tlimit_threshold"),
    ("a100-sxm4-v12", "gpu_temp_max_threshold", 1, "temperature.gpu_temp_max_threshold"),
    ("rtx-4000-sff-ada-v13", "gpu_temp_max_tlimit_threshold", 1, "temperature.gpu_temp_max_tlimit_threshold"),
    ("a100-sxm4-v12", "gpu_temp_slow_threshold", 1, "temperature.gpu_temp_slow_threshold"),
    ("rtx-4000-sff-ada-v13", "gpu_temp_slow_tlimit_threshold", 1, "temperature.gpu_temp_slow_tlimit_threshold"),
    ("a100-sxm4-v12", "gpu_temp_tlimit", 1, "temperature.gpu_temp_tlimit"),
]


@pytest.mark.parametrize("capture,tag,nth,field", BAD_VALUE_FIELDS)
def test_an_unreadable_value_is_refused_naming_its_xml_path(capture, tag, nth, field):
    import re

    from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nvidia_smi import NvidiaSmiError, parse_nvidia_smi

    text = (FIXTURES / "nvidia_smi" / ("telegraf_%s.xml" % capture)).read_text()
    match = list(re.finditer(r"<%s>([^<]*?)</%s>" % (tag, tag), text))[nth - 1]
    bad = "bogus MHz" if re.search(r"\d", match.group(1)) else "Maybe"
    with pytest.raises(NvidiaSmiError) as exc:
        parse_nvidia_smi(text[:match.start()] + "<%s>%s</%s>" % (tag, bad, tag) + text[match.end():])
    assert exc.value.details["field"] == field and exc.value.details["value"] == bad
    assert ("nvidia-smi %s is %r" % (field, bad)) in str(exc.value) and exc.value.details["expected"]
