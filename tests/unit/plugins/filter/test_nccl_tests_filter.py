# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The nccl-tests filters: what a playbook gets from nccl_tests_parse / _compare / _sweep, and their errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.nccl_tests import FilterModule

FILTERS = FilterModule().filters()
CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_tests"


def _text(name):
    return (CAPTURES / name).read_text(encoding="utf-8")


def test_filter_names():
    assert sorted(FILTERS) == ["nccl_tests_compare", "nccl_tests_parse", "nccl_tests_sweep", "nccl_tests_sweep_markdown"]


def test_parse_compare_and_sweep():
    parsed = FILTERS["nccl_tests_parse"](_text("h100_1node_8gpu_five_tests_v2.17.8.log"))
    assert [run["collective"] for run in parsed["runs"]] == ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"]
    gate = FILTERS["nccl_tests_compare"](parsed, {"1G": 300, "16G": 360}, test="reduce_scatter")
    assert gate["passed"] and [entry["busbw_gbps"] for entry in gate["results"]] == [342.70, 364.76]
    assert FILTERS["nccl_tests_compare"](parsed, {"16G": 370}, "in_place", "reduce_scatter")["failed_sizes"] == [17179869184]
    sweep = FILTERS["nccl_tests_sweep"](
        {"default": _text("rtx5090_2rank_all_gather_default_3reps.txt"), "simple": _text("rtx5090_2rank_all_gather_proto_simple_3reps.txt")},
        "default", sizes=["64M", "128M"], margin_pct=10,
    )
    assert sweep["recommended"] == "simple" and sweep["changed"]
    json.dumps(parsed)
    json.dumps(sweep)
    page = FILTERS["nccl_tests_sweep_markdown"](dict(sweep, variable="NCCL_PROTO", host="gpu-a", mode="recorded", test=None))
    lines = page.splitlines()
    assert lines[0] == "# NCCL_PROTO sweep on gpu-a"
    assert lines[2] == ("nccl-tests, out-of-place busbw in GB/s per value of NCCL_PROTO (median of the repeats; gain over "
                        "baseline default in brackets), recorded runs. Sizes marked * are those the recommendation is "
                        "judged at (margin 10.0 %).")
    assert lines[4:6] == ["| size (bytes) | default | simple |", "|---:|---:|---:|"]
    rows = [line for line in lines if line.startswith("| 67108864 ")]
    row = next(r for r in sweep["table"] if r["size"] == 67108864)
    cells = (row["busbw_gbps"]["default"], row["busbw_gbps"]["simple"], row["gain_pct"]["simple"])
    assert rows == ["| 67108864 * | %s | %s (%+.1f%%) |" % cells]
    assert len([line for line in lines if line.startswith("| ") and line[2].isdigit()]) == len(sweep["table"])
    assert lines[-3:] == ["**Recommendation:** `NCCL_PROTO=simple` (change from default).", "", sweep["reason"]]


@pytest.mark.parametrize(
    "name, args, fragment",
    [
        ("nccl_tests_parse", ("bash: all_reduce_perf: command not found\n",), "no nccl-tests result table"),
        ("nccl_tests_parse", (None,), "must be text"),
        ("nccl_tests_compare", (None, {"1G": 1}), "not nccl-tests output"),
        ("nccl_tests_compare", ("h100_oci_2node_16gpu_shell_prompt.txt", {"512M": 400}), "no row of size 536870912 bytes"),
        ("nccl_tests_compare", ("h100_oci_2node_16gpu_shell_prompt.txt", "1G"), "non-empty mapping"),
        ("nccl_tests_sweep", ({"1": "h100_oci_2node_16gpu_shell_prompt.txt"}, "2"), "baseline '2' is not one of the labels"),
        ("nccl_tests_sweep_markdown", (["not", "a", "report"],), "sweep report lacks variable, host, mode"),
    ],
)
def test_errors_become_ansible_filter_errors_naming_the_filter(name, args, fragment):
    args = tuple(_text(arg) if isinstance(arg, str) and arg.endswith(".txt") else arg for arg in args)
    if isinstance(args[0], dict):
        args = ({label: _text(value) for label, value in args[0].items()},) + args[1:]
    with pytest.raises(AnsibleFilterError) as info:
        FILTERS[name](*args)
    assert fragment in str(info.value)
    assert name in str(info.value) and "expected" in str(info.value)


def test_filters_run_in_a_playbook_template(tmp_path):
    """The filters resolve by FQCN in a real ansible run against localhost."""
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    log = CAPTURES / "h100_oci_2node_16gpu_shell_prompt.txt"
    expr = (
        "{%% set log = lookup('file', '%s') %%}"
        "{{ (log | gpunode.tuning.nccl_tests_parse).runs[0].avg_busbw_gbps }}|"
        "{{ (log | gpunode.tuning.nccl_tests_compare({'8G': 460, '16G': 470})).failed_sizes }}|"
        "{{ ({'a': log, 'b': log} | gpunode.tuning.nccl_tests_sweep('a')).recommended }}" % log
    )
    proc = subprocess.run(
        [ansible, "localhost", "-m", "ansible.builtin.debug", "-a", "msg=%s" % expr],
        env=env, capture_output=True, text=True, check=False, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "458.452|[17179869184]|a" in proc.stdout
