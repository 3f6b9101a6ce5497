# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""dcgmi diag parsing over real captures (tests/unit/fixtures/gpu_health/dcgmi, see the README there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.dcgmi import DcgmiError, dcgm_findings, parse_dcgmi_diag

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_health" / "dcgmi"


def _load(name):
    return parse_dcgmi_diag((CAPTURES / name).read_text())


def test_4x_per_plugin_layout_with_wrapped_warnings():
    parsed = _load("dcgm_4.2.3_pcie_fail_internal_error_issue253.txt")
    assert parsed["layout"] == "4.x"
    assert parsed["metadata"]["DCGM Version"] == "4.2.3"
    assert [(t["name"], t["category"], t["result"]) for t in parsed["tests"]] == [
        ("software", "Deployment", "Pass"), ("memory", "Hardware", "Pass"), ("pcie", "Integration", "Fail")]
    pcie = parsed["tests"][2]
    assert pcie["gpus"] == {0: "Pass", 1: "Pass", 2: "Pass", 3: "Pass"}
    assert len(pcie["details"]) == 4
    assert pcie["details"][0]["text"] == ("There was an internal error during the test: 'A child process (152) exited with non-zero status 1'"
                                          " Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics.")
    assert pcie["details"][2]["text"].endswith("Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics.")
    findings = dcgm_findings(parsed)
    assert [f["status"] for f in findings] == ["pass", "pass", "fail"]
    assert findings[2]["gpu"] is None and "exited with non-zero status 1" in findings[2]["message"]


def test_4x_b200_eight_gpus():
    parsed = _load("dcgm_4.4.1_b200_8gpu_pcie_fail_issue253_comment.txt")
    assert parsed["metadata"]["GPU Device IDs Detected"].count("2901") == 8
    pcie = parsed["tests"][-1]
    assert pcie["result"] == "Fail" and len(pcie["gpus"]) == 8
    assert pcie["details"][0]["text"].startswith("There was an internal error during the test: 'Output of child process (11167) couldn't be parsed")
    assert "Restart DCGM. Rerun diagnostics." in pcie["details"][0]["text"]


def test_2x_layout_skip_is_not_a_pass():
    parsed = _load("dcgm_p100_level2_skip_all_ornl_doc.txt")
    assert parsed["layout"] == "2.x/3.x" and parsed["metadata"] == {}
    tests = {t["name"]: t for t in parsed["tests"]}
    assert len(tests) == 15
    assert (tests["GPU Memory"]["category"], tests["GPU Memory"]["result"], tests["GPU Memory"]["scope"]) == ("Hardware", "Pass", "All")
    assert tests["Targeted Power"]["category"] == "Performance"
    findings = {f["check"]: f for f in dcgm_findings(parsed)}
    assert findings["dcgm:Targeted Power"]["status"] == "not_applicable"
    assert "skipped is not a pass" in findings["dcgm:CUDA Toolkit Libraries"]["message"]
    assert findings["dcgm:PCIe"]["status"] == "pass"


def test_level1_all_pass():
    parsed = _load("dcgm_level1_deployment_prolog_uber_prof.txt")
    assert len(parsed["tests"]) == 9 and {t["category"] for t in parsed["tests"]} == {"Deployment"}
    assert {f["status"] for f in dcgm_findings(parsed)} == {"pass"}


def test_warn_result():
    text = (CAPTURES / "dcgm_level1_deployment_prolog_uber_prof.txt").read_text().replace(
        "| Persistence Mode          | Pass   ", "| Persistence Mode          | Warn   ")
    findings = {f["check"]: f["status"] for f in dcgm_findings(parse_dcgmi_diag(text))}
    assert findings["dcgm:Persistence Mode"] == "warn"


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", None])
def test_bad_input(text):
    with pytest.raises(DcgmiError) as err:
        parse_dcgmi_diag(text)
    assert err.value.expected


def test_unknown_result_word():
    text = (CAPTURES / "dcgm_level1_deployment_prolog_uber_prof.txt").read_text()
    text = text.replace("| Inforom                   | Pass", "| Inforom                   | Okay")
    with pytest.raises(DcgmiError) as err:
        parse_dcgmi_diag(text)
    assert "Okay" in err.value.value
