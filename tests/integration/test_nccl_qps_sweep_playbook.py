# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/nccl_qps_sweep.yml run with ansible-playbook on localhost.

Recorded mode reads the real three-point sweep in tests/unit/fixtures/nccl_tests
(rtx5090 all_reduce, NCCL_SOCKET_NTHREADS default / 4 / 8, three repeats each);
the expected numbers come from the parser and sweep_compare called here, not
from constants. Live mode is run on this machine, which has no GPU and no
nccl-tests: the play must refuse before running anything or writing a report.
"""

from __future__ import annotations

import json
import os
import sys
import statistics
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import nccl_busbw as _nccl_busbw
from ansible_collections.gpunode.tuning.plugins.module_utils._parse import nccl_tests as _nccl_tests

ROOT = Path(__file__).resolve().parents[2]
# The Ansible of the interpreter that runs the tests (the CI matrix runs them on each supported ansible-core).
VENV_BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "nccl_tests"
LOGS = dict(
    (label, FIXTURES / ("rtx5090_2rank_all_reduce_socket_%s_3reps_tag_output.md" % label))
    for label in ("default", "nthreads4", "nthreads8")
)
SIZES = ["16M", "32M", "128M"]

pytestmark = pytest.mark.playbook


def run_playbook(tmp_path, extra_vars, path_first=None):
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
    if path_first:
        env["PATH"] = "%s:%s" % (path_first, env["PATH"])
    env["ANSIBLE_COLLECTIONS_PATH"] = os.environ["ANSIBLE_COLLECTIONS_PATH"]  # set by tests/conftest.py
    env["ANSIBLE_NOCOLOR"] = "1"
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(extra_vars))
    argv = [
        str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
        "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python"),
        str(ROOT / "playbooks" / "nccl_qps_sweep.yml"), "-e", "@%s" % vars_file,
    ]
    return subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120, check=False)


def recorded_vars(report_dir, **extra):
    data = {
        "nccl_sweep_recorded": dict((label, str(path)) for label, path in LOGS.items()),
        "nccl_sweep_baseline": "default",
        "nccl_sweep_sizes": SIZES,
        "nccl_sweep_report_dir": str(report_dir),
    }
    data.update(extra)
    return data


def texts():
    return dict((label, path.read_text()) for label, path in LOGS.items())


def parser_busbw(text, size):
    """Median out-of-place busbw of the rows of ``size`` over the runs, straight from parse_nccl_tests."""
    samples = [
        row["out_of_place"]["busbw_gbps"]
        for run in _nccl_tests.parse_nccl_tests(text)["runs"]
        for row in run["rows"]
        if row["size"] == size
    ]
    assert len(samples) == 3  # three repeats per label
    return statistics.median(samples)


def output(result):
    return result.stdout[-6000:] + result.stderr[-3000:]


def test_recorded_sweep_reports_the_parsed_busbw_and_the_sweep_recommendation(tmp_path):
    report_dir = tmp_path / "report"
    result = run_playbook(tmp_path, recorded_vars(report_dir))
    assert result.returncode == 0, output(result)

    report = json.loads((report_dir / "localhost.json").read_text())
    assert report["mode"] == "recorded" and report["host"] == "localhost"
    assert report["variable"] == "NCCL_IB_QPS_PER_CONNECTION"
    assert report["labels"] == ["default", "nthreads4", "nthreads8"]
    by_size = dict((row["size"], row) for row in report["table"])
    for size_text in SIZES:
        size = _nccl_busbw.parse_size(size_text)
        assert by_size[size]["named"]
        for label, text in texts().items():
            assert by_size[size]["busbw_gbps"][label] == pytest.approx(parser_busbw(text, size)), (label, size)

    direct = _nccl_busbw.sweep_compare(texts(), "default", sizes=SIZES, margin_pct=5)
    for key in ("recommended", "changed", "reason", "sizes", "candidates", "table"):
        assert report[key] == direct[key], key
    assert report["recommended"] == "default" and not report["changed"]

    markdown = (report_dir / "localhost.md").read_text()
    assert "| size (bytes) | default | nthreads4 | nthreads8 |" in markdown
    assert "| 16777216 * | %s |" % direct["table"][4]["busbw_gbps"]["default"] in markdown
    assert "`NCCL_IB_QPS_PER_CONNECTION=default`" in markdown and "keep the baseline" in markdown
    assert direct["reason"] in markdown
    assert direct["reason"] in result.stdout


def test_a_winner_is_recommended_and_a_high_margin_keeps_the_baseline(tmp_path):
    # Against nthreads8 the default settings win by more than 5 % at 16M and 32M ...
    sizes = ["16M", "32M"]
    win_dir = tmp_path / "win"
    result = run_playbook(tmp_path, recorded_vars(win_dir, nccl_sweep_baseline="nthreads8", nccl_sweep_sizes=sizes))
    assert result.returncode == 0, output(result)
    report = json.loads((win_dir / "localhost.json").read_text())
    direct = _nccl_busbw.sweep_compare(texts(), "nthreads8", sizes=sizes, margin_pct=5)
    assert direct["changed"] and report["recommended"] == direct["recommended"] == "default"
    assert report["reason"] == direct["reason"]
    assert "(change from nthreads8)" in (win_dir / "localhost.md").read_text()

    # ... but not by 50 %: keep the baseline, and say why each value fell short.
    keep_dir = tmp_path / "keep"
    result = run_playbook(tmp_path, recorded_vars(keep_dir, nccl_sweep_baseline="nthreads8", nccl_sweep_sizes=sizes,
                                                  nccl_sweep_margin_pct=50))
    assert result.returncode == 0, output(result)
    report = json.loads((keep_dir / "localhost.json").read_text())
    assert report["recommended"] == "nthreads8" and not report["changed"]
    assert report["reason"].startswith("keep baseline nthreads8: no label beats it by +50.0%")
    assert "default: " in report["reason"] and "nthreads4: " in report["reason"]
    assert report["reason"] == _nccl_busbw.sweep_compare(texts(), "nthreads8", sizes=sizes, margin_pct=50)["reason"]
    assert "keep the baseline" in (keep_dir / "localhost.md").read_text()


def test_a_baseline_that_is_not_a_value_fails_naming_it(tmp_path):
    report_dir = tmp_path / "report"
    result = run_playbook(tmp_path, recorded_vars(report_dir, nccl_sweep_values=["default", "nthreads4"], nccl_sweep_baseline="3"))
    assert result.returncode != 0
    assert "nccl_sweep_baseline 3 is not one of nccl_sweep_values (default, nthreads4)" in result.stdout, output(result)
    assert not report_dir.exists()


def test_live_mode_refuses_a_host_without_gpu_or_nccl_tests(tmp_path):
    report_dir = tmp_path / "report"
    binary_dir = tmp_path / "no-nccl-tests"
    result = run_playbook(tmp_path, {
        "nccl_sweep_values": [1, 2, 4], "nccl_sweep_baseline": 1, "nccl_sweep_sizes": ["16M", "256M", "1G"],
        "nccl_sweep_binary_dir": str(binary_dir), "nccl_sweep_report_dir": str(report_dir),
    })
    assert result.returncode != 0
    assert "localhost cannot run the sweep:" in result.stdout, output(result)
    assert "no GPU (nvidia-smi -L failed, rc " in result.stdout, output(result)
    assert "no executable %s/all_reduce_perf" % binary_dir in result.stdout, output(result)
    assert "Run the test once per value" not in result.stdout
    assert not report_dir.exists()


def write_script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_live_mode_runs_once_per_value_with_the_variable_set(tmp_path):
    # Stand-ins for nvidia-smi and the nccl-tests binary: the binary prints the recorded log chosen by the swept
    # variable and notes its argv and environment, so the plumbing (launcher + binary + args, environment) is checked.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_script(bin_dir / "nvidia-smi", 'echo "GPU 0: NVIDIA RTX 5090 (UUID: GPU-00000000)"\n')
    calls = tmp_path / "calls.log"
    write_script(bin_dir / "all_reduce_perf", (
        'echo "$NCCL_IB_QPS_PER_CONNECTION $NCCL_DEBUG $*" >> %s\n'
        'case "$NCCL_IB_QPS_PER_CONNECTION" in 1) f=%s ;; 2) f=%s ;; *) f=%s ;; esac\n'
        'cat "$f"\n') % (calls, LOGS["default"], LOGS["nthreads4"], LOGS["nthreads8"]))
    report_dir = tmp_path / "report"
    result = run_playbook(tmp_path, {
        "nccl_sweep_values": [1, 2, 4], "nccl_sweep_baseline": 4, "nccl_sweep_sizes": ["16M", "32M"],
        "nccl_sweep_binary_dir": str(bin_dir), "nccl_sweep_launcher": ["env", "NCCL_DEBUG=WARN"],
        "nccl_sweep_args": "-b 1M -e 128M -f 2 -g 1", "nccl_sweep_report_dir": str(report_dir),
    }, path_first=bin_dir)
    assert result.returncode == 0, output(result)
    assert calls.read_text().splitlines() == ["%s WARN -b 1M -e 128M -f 2 -g 1" % value for value in (1, 2, 4)]
    report = json.loads((report_dir / "localhost.json").read_text())
    assert report["mode"] == "live" and report["test"] == "all_reduce_perf"
    direct = _nccl_busbw.sweep_compare(dict(zip(["1", "2", "4"], texts().values())), "4", sizes=["16M", "32M"], margin_pct=5)
    assert report["recommended"] == direct["recommended"] == "1" and report["reason"] == direct["reason"]
