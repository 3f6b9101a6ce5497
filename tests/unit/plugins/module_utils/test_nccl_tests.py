# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests output parsing, gating and sweep comparison over real captures (tests/unit/fixtures/nccl_tests, see the README there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nccl_busbw import busbw_by_size, compare_busbw, parse_size, sweep_compare
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.nccl_tests import NcclTestsError, collective_name, parse_nccl_tests

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_tests"
GIB = 1024 ** 3
MIB = 1024 ** 2


def _text(name):
    return (CAPTURES / name).read_text(encoding="utf-8")


def _load(name):
    return parse_nccl_tests(_text(name))


def _row(run, size):
    rows = [row for row in run["rows"] if row["size"] == size]
    assert len(rows) == 1, rows
    return rows[0]


def _busbw(run, size, placement="out_of_place"):
    return _row(run, size)[placement]["busbw_gbps"]


# ---------------------------------------------------------------- real captures


def test_one_node_8_gpus_five_tests_in_one_log():
    parsed = _load("h100_1node_8gpu_five_tests_v2.17.8.log")
    runs = parsed["runs"]
    assert [run["test"] for run in runs] == ["all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf", "sendrecv_perf"]
    assert [run["collective"] for run in runs] == ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"]
    assert [run["avg_busbw_gbps"] for run in runs] == [437.957, 328.618, 330.721, 313.838, 279.874]
    assert [(run["line"], run["end_line"]) for run in runs] == [(1, 33), (36, 68), (71, 103), (106, 138), (141, 173)]
    assert parsed["skipped"] == [] and parsed["line_count"] == 175
    all_reduce, dummy, reduce_scatter, alltoall = runs[0], runs[1], runs[2], runs[3]
    assert all(len(run["rows"]) == 10 and run["nranks"] == 8 and run["complete"] and run["test_source"] == "banner" for run in runs)
    assert all(run["out_of_bounds"] == {"count": 0, "ok": True} for run in runs)
    assert all_reduce["version"] == {"program": "nccl-tests", "version": "2.17.8", "nccl_headers": 22902, "nccl_library": 22902}
    assert all_reduce["params"] == {
        "nthread": 1, "ngpus": 1, "min_bytes": 33554432, "max_bytes": 68719476736, "step": 2, "step_kind": "factor",
        "warmup_iters": 5, "iters": 20, "agg_iters": 1, "validation": 1, "graph": 0, "max_bytes_effective": 26549638485,
    }
    assert all_reduce["notes"] == ["Reducing maxBytes to 26549638485 due to memory limitation"]
    assert all_reduce["devices"][7] == {
        "rank": 7, "group": 0, "pid": 4180135, "host": "cnode3-002", "device": 7, "bus_id": "0000:df:00", "name": "NVIDIA H100 80GB HBM3",
    }
    assert all_reduce["columns"] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]
    assert all_reduce["rows"][0] == {
        "line": 20, "size": 33554432, "count": 4194304, "type": "double", "redop": "sum", "root": -1,
        "out_of_place": {"time_us": 182.87, "algbw_gbps": 183.49, "busbw_gbps": 321.10, "wrong": 0},
        "in_place": {"time_us": 182.88, "algbw_gbps": 183.48, "busbw_gbps": 321.08, "wrong": 0},
    }
    assert _busbw(all_reduce, GIB) == 469.67 and _busbw(all_reduce, 16 * GIB, "in_place") == 482.12
    assert _row(reduce_scatter, 16 * GIB) == {
        "line": 99, "size": 17179869184, "count": 268435456, "type": "double", "redop": "sum", "root": -1,
        "out_of_place": {"time_us": 41211.4, "algbw_gbps": 416.87, "busbw_gbps": 364.76, "wrong": 0},
        "in_place": {"time_us": 41174.3, "algbw_gbps": 417.25, "busbw_gbps": 365.09, "wrong": 0},
    }
    assert runs[1]["rows"][0]["redop"] == "none" and _busbw(runs[1], 16 * GIB) == 361.86
    # alltoall and sendrecv print N/A in the in-place #wrong.
    assert _row(alltoall, 32 * MIB)["in_place"] == {"time_us": 123.64, "algbw_gbps": 271.39, "busbw_gbps": 237.47, "wrong": None}
    assert all(row["out_of_place"]["wrong"] == 0 and row["in_place"]["wrong"] is None for row in runs[4]["rows"])


def test_ten_nodes_80_ranks():
    runs = _load("h100_10node_80gpu_five_tests_v2.17.8.log")["runs"]
    assert [run["collective"] for run in runs] == ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"]
    assert [run["nranks"] for run in runs] == [80] * 5
    assert len(set(device["host"] for device in runs[0]["devices"])) == 10
    assert [run["avg_busbw_gbps"] for run in runs] == [265.631, 218.677, 216.683, 47.1472, 15.1671]
    assert [len(run["rows"]) for run in runs] == [10] * 5
    assert _busbw(runs[0], 16 * GIB) == 320.54
    # all_gather sizes are whole multiples of 80 ranks x 8 bytes: 33553920, not 32 MiB.
    assert runs[1]["rows"][0]["size"] == 33553920 and runs[1]["rows"][0]["count"] == 52428


def test_mpirun_tag_output_repeated_inside_rows():
    parsed = _load("h100_eks_2node_16gpu_tag_output_v2.22.3.log")
    assert parsed["skipped"] == [] and len(parsed["runs"]) == 1
    run = parsed["runs"][0]
    assert run["stream"] == "[1,0]<stdout>:" and run["line"] == 17 and run["end_line"] == 2938
    assert run["test"] is None and run["nccl_version"] is None
    assert run["nranks"] == 16 and sorted(set(d["host"] for d in run["devices"])) == ["test-nccl-worker-0", "test-nccl-worker-1"]
    assert run["params"]["iters"] == 100 and run["params"]["max_bytes"] == 16 * GIB
    assert len(run["rows"]) == 32 and run["rows"][0]["size"] == 8 and run["rows"][0]["out_of_place"]["time_us"] == 85.70
    assert run["rows"][-1] == {
        "line": 2936, "size": 17179869184, "count": 4294967296, "type": "float", "redop": "sum", "root": -1,
        "out_of_place": {"time_us": 66023.0, "algbw_gbps": 260.21, "busbw_gbps": 487.90, "wrong": 0},
        "in_place": {"time_us": 65990.0, "algbw_gbps": 260.34, "busbw_gbps": 488.14, "wrong": 0},
    }
    assert _busbw(run, GIB) == 440.04
    assert run["avg_busbw_gbps"] == 124.584 and run["complete"]


def test_oci_two_nodes_with_shell_prompt():
    runs = _load("h100_oci_2node_16gpu_shell_prompt.txt")["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert run["test"] == "all_reduce_perf" and run["test_source"] == "command" and run["collective"] == "all_reduce"
    assert run["nranks"] == 16 and len(run["rows"]) == 5 and run["skipped"] == []
    assert [row["size"] for row in run["rows"]] == [GIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB]
    assert _busbw(run, 8 * GIB) == 463.90 and run["rows"][2]["out_of_place"]["time_us"] == 17437.0
    assert run["avg_busbw_gbps"] == 458.452 and run["avg_busbw_check"] is None


def test_skypilot_ray_prefix_before_the_mpirun_tag():
    runs = _load("h200_gke_2node_16gpu_all_gather_skypilot_ray_prefix.txt")["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert run["stream"] == "(head, rank=0, pid=3808) [1,0]<stdout>:"
    assert run["nranks"] == 16 and run["devices"][15]["host"] == "nc-d87e1263-worker1" and run["devices"][15]["name"] == "NVIDIA H200"
    assert len(run["rows"]) == 24 and {row["redop"] for row in run["rows"]} == {"none"}
    assert _busbw(run, 8 * GIB) == 325.72 and _busbw(run, 8 * GIB, "in_place") == 332.58
    assert run["avg_busbw_gbps"] == 122.073


def test_old_layout_error_column_without_root():
    run = _load("v100_2node_16gpu_error_column_pkb2019.txt")["runs"][0]
    assert run["columns"] == ["size", "count", "type", "redop", "time", "algbw", "busbw", "error", "time", "algbw", "busbw", "error"]
    assert run["nccl_version"] == "2.4.6+cuda10.0"
    assert run["devices"][8] == {
        "rank": 8, "group": None, "pid": 25655, "host": "ip-172-31-26-32", "device": 0, "bus_id": "0x00", "name": "Tesla V100-SXM2-32GB",
    }
    assert run["params"] == {"nthread": 1, "ngpus": 1, "min_bytes": 8, "max_bytes": 8589934592, "step": 2, "step_kind": "factor",
                             "warmup_iters": 5, "iters": 100, "validation": 1}
    assert len(run["rows"]) == 31 and run["nranks"] == 16
    first = run["rows"][0]
    assert "root" not in first and first["out_of_place"] == {"time_us": 58.10, "algbw_gbps": 0.0, "busbw_gbps": 0.0, "error": 4e-07}
    assert _busbw(run, 8 * GIB) == 9.93 and _busbw(run, 4 * GIB) == 15.80
    assert run["avg_busbw_gbps"] == 5.16186


def test_check_disabled_prints_na_in_wrong():
    run = _load("k80_2node_validation0_na_pkb2022.txt")["runs"][0]
    assert run["params"]["validation"] == 0 and run["nranks"] == 2
    assert len(run["rows"]) == 11
    assert all(row["out_of_place"]["wrong"] is None and row["in_place"]["wrong"] is None for row in run["rows"])
    assert _row(run, 8 * MIB)["out_of_place"] == {"time_us": 14868.0, "algbw_gbps": 0.56, "busbw_gbps": 0.56, "wrong": None}
    assert run["avg_busbw_gbps"] == 0.565546


def test_older_per_test_layouts_in_one_log():
    runs = _load("v100_dgx2_12gpu_five_tests_old_layout.txt")["runs"]
    assert [(run["test"], run["test_source"]) for run in runs] == [
        ("all_gather_perf", "command"), ("all_reduce_perf", "command"), ("broadcast_perf", "command"),
        ("reduce_perf", "command"), ("reduce_scatter_perf", "command"),
    ]
    assert [run["columns"][:5] for run in runs] == [
        ["size", "count", "type", "time", "algbw"],
        ["size", "count", "type", "redop", "time"],
        ["size", "count", "type", "root", "time"],
        ["size", "count", "type", "redop", "root"],
        ["size", "count", "type", "redop", "time"],
    ]
    assert [len(run["rows"]) for run in runs] == [31] * 5 and [run["nranks"] for run in runs] == [12] * 5
    all_gather, all_reduce, broadcast, reduce_op, reduce_scatter = runs
    assert "redop" not in all_gather["rows"][0] and "root" not in all_gather["rows"][0]
    assert broadcast["rows"][0]["root"] == 0 and "redop" not in broadcast["rows"][0]
    assert reduce_op["rows"][0]["redop"] == "sum" and reduce_op["rows"][0]["root"] == 0
    assert all_gather["out_of_bounds"] == {"count": 4, "ok": False}
    assert _row(all_gather, 4294967280)["out_of_place"]["error"] == 1.0
    assert _busbw(all_reduce, 8 * GIB) == 123.56 and _busbw(broadcast, 8 * GIB) == 122.15
    assert _row(reduce_scatter, 8589934560)["in_place"] == {"time_us": 123574.0, "algbw_gbps": 63.72, "busbw_gbps": 63.72, "error": 2e-07}
    assert [run["avg_busbw_gbps"] for run in runs] == [30.2993, 42.5578, 41.2456, 41.3386, 20.3609]


def test_three_repeats_separated_by_noise():
    runs = _load("rtx5090_2rank_all_gather_default_3reps.txt")["runs"]
    assert [run["line"] for run in runs] == [10, 44, 78]
    assert [run["avg_busbw_gbps"] for run in runs] == [1.27827, 0.669677, 1.54607]
    assert all(run["test"] == "all_gather_perf_mpi" and run["collective"] == "all_gather" and len(run["rows"]) == 8 for run in runs)
    assert [_busbw(run, 128 * MIB) for run in runs] == [1.04, 1.06, 2.30]


def test_markdown_published_sweep_point_with_tag_output():
    parsed = _load("rtx5090_2rank_all_reduce_socket_default_3reps_tag_output.md")
    runs = parsed["runs"]
    assert len(runs) == 3 and parsed["skipped"] == []
    assert all(run["stream"] == "[1,0]<stdout>:" and run["test"] == "all_reduce_perf_mpi" for run in runs)
    assert [run["avg_busbw_gbps"] for run in runs] == [1.57614, 1.58183, 1.58058]
    assert runs[0]["version"]["version"] == "2.18.0" and runs[0]["params"]["iters"] == 50
    assert [(d["rank"], d["device"], d["bus_id"]) for d in runs[0]["devices"]] == [(0, 0, "0000:02:00"), (1, 0, "0000:02:00")]
    assert _busbw(runs[2], 128 * MIB) == 2.30 and _busbw(runs[1], 64 * MIB) == 2.31


# ---------------------------------------------------------------- layouts written from the source


def test_cputime_column():
    run = _load("SYNTHETIC_cputime_h100_1node_all_reduce.log")["runs"][0]
    assert run["time_kind"] == "cputime" and "cputime" in run["columns"]
    assert run["rows"][-1]["out_of_place"] == {"cputime_us": 62340.7, "algbw_gbps": 275.58, "busbw_gbps": 482.27, "wrong": 0}
    assert compare_busbw(run, {"16G": 480})["passed"]


def test_killed_job_row_cut_in_half_is_skipped_with_its_line():
    parsed = _load("SYNTHETIC_killed_mid_row_h100_all_reduce.log")
    run = parsed["runs"][0]
    assert len(run["rows"]) == 5 and not run["complete"] and run["avg_busbw_gbps"] is None
    assert run["skipped"] == [{
        "line": 25, "text": "1073741824     134217728    double     sum      -1  4000.82  268.38",
        "reason": "truncated: 7 fields where the header has 13 (size count type redop root time_us algbw_gbps busbw_gbps wrong"
                  " time_us algbw_gbps busbw_gbps wrong)",
    }]
    assert parsed["skipped"] == [dict(run["skipped"][0], run=0)]
    with pytest.raises(NcclTestsError, match="no row of size 1073741824"):
        compare_busbw(parsed, {"1G": 400})


def test_per_iteration_and_timestamp_columns():
    run = _load("SYNTHETIC_per_iteration_timestamp_h100_all_reduce.log")["runs"][0]
    assert run["version"]["version"] == "2.19.6" and run["params"]["unalign"] == 0
    assert run["notes"] == ["Per-Iteration Report: CUDA event timing; i_* uses max over process rows"]
    assert len(run["rows"]) == 2 and run["skipped"] == []
    last = run["rows"][-1]
    assert last["timestamp"] == "2026-07-09 16:03:22"
    assert last["out_of_place"] == {"time_us": 313.66, "algbw_gbps": 213.95, "busbw_gbps": 374.42, "wrong": 0,
                                    "i_min_us": 311.2, "i_max_us": 322.75, "i_p99_us": 322.75, "i_cv_pct": 0.84}
    assert last["in_place"]["i_cv_pct"] == 0.77 and last["in_place"]["busbw_gbps"] == 374.58


# ---------------------------------------------------------------- launchers and noise (lines from public pastes)

# NVIDIA/nccl issue #1453 (MPICH, -prepend-rank): "[0]" before the line and again wherever nccl-tests flushed.
HYDRA = """\
[0] # nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
[0] #
[0] #                                                              out-of-place                       in-place
[0] #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[0] #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[0]      1048576        262144     float     sum      -1[0]    1626.5    0.64    1.24      0[0]    2302.3    0.46    0.87      0
[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2097152 Bytes -> Algo 0 proto 0 time 25.229528
[0]      2097152        524288     float     sum      -1[0]    2325.3    0.90    1.73      0[0]     416.7    5.03    9.65      0
[0] # Out of bounds values : 0 OK
[0] # Avg bus bandwidth    : 3.3725
"""

# srun --label (a Slurm capture of all_gather / all_reduce on GKE, NVIDIA/nccl-tests discussions).
SLURM = """\
 0: #                                                              out-of-place                       in-place
 0: #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
 0: #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
 0:        65536         16384     float     sum      -1    78.91    0.83    1.61      0    77.42    0.85    1.64      0
 0: # Out of bounds values : 0 OK
 0: # Avg bus bandwidth    : 37.9868
"""


def test_mpich_rank_prefix_repeated_inside_rows():
    run = parse_nccl_tests(HYDRA)["runs"][0]
    assert run["stream"] == "[0]"
    assert [row["size"] for row in run["rows"]] == [1048576, 2097152]
    assert run["rows"][1]["out_of_place"]["busbw_gbps"] == 1.73 and run["rows"][1]["in_place"]["busbw_gbps"] == 9.65
    assert run["avg_busbw_gbps"] == 3.3725 and run["skipped"] == []


def test_slurm_label_and_table_without_banner():
    run = parse_nccl_tests(SLURM)["runs"][0]
    assert run["stream"] == "0:" and run["params"] == {} and run["devices"] == [] and run["nranks"] is None
    assert run["rows"][0]["out_of_place"]["busbw_gbps"] == 1.61 and run["avg_busbw_gbps"] == 37.9868


def test_kubectl_timestamps_and_crlf():
    text = "".join("2024-05-22T07:36:17.123456789Z %s\r\n" % line for line in _text("k80_2node_validation0_na_pkb2022.txt").splitlines())
    run = parse_nccl_tests(text)["runs"][0]
    assert len(run["rows"]) == 11 and run["avg_busbw_gbps"] == 0.565546


def test_two_processes_each_printing_a_whole_run_stay_apart():
    """A non-MPI build under mpirun: every process prints its own run, lines interleaved (NVIDIA/nccl-tests issue #107)."""
    lines = _text("k80_2node_validation0_na_pkb2022.txt").splitlines()
    text = "".join("[1,0]<stdout>:%s\n[1,1]<stdout>:%s\n" % (line, line) for line in lines)
    parsed = parse_nccl_tests(text)
    assert [run["stream"] for run in parsed["runs"]] == ["[1,0]<stdout>:", "[1,1]<stdout>:"]
    assert [len(run["rows"]) for run in parsed["runs"]] == [11, 11] and parsed["skipped"] == []


def test_same_header_twice_is_read_once_and_odd_rows_are_skipped():
    lines = _text("k80_2node_validation0_na_pkb2022.txt").splitlines()
    header = lines[6:9]
    odd = [
        "     1048576        262144     float     sum      -1   2410.0    0.44    fast    N/A   2709.7    0.39    0.39    N/A",
        "     2097152        524288     float     sum      -1   4710.4    0.45    0.45    N/A   4587.9    0.46    0.46    N/A   extra",
        "8 more processes have sent help message help-mtl-ofi.txt / OFI call fail",
    ]
    text = "\n".join(lines[:9] + header + odd + lines[11:]) + "\n"
    run = parse_nccl_tests(text)["runs"][0]
    assert len(run["rows"]) == 9
    assert [(entry["line"], entry["reason"].split(":")[0]) for entry in run["skipped"]] == [(13, "out_of_place busbw_gbps 'fast'"), (14, "too many fields")]


# ---------------------------------------------------------------- bad input


def test_text_without_a_table_raises_naming_what_was_expected():
    header_only = "\n".join(_text("h100_eks_2node_16gpu_tag_output_v2.22.3.log").splitlines()[:36])
    for text in (header_only, "", "$ ./build/all_reduce_perf -b 8 -e 128M\nbash: ./build/all_reduce_perf: No such file or directory\n"):
        with pytest.raises(NcclTestsError) as info:
            parse_nccl_tests(text)
        assert isinstance(info.value, DetailedError)
        assert "no nccl-tests result table" in str(info.value)
        assert "size         count" in info.value.expected and len(info.value.value) <= 123


def test_not_text_raises_and_bytes_are_read():
    with pytest.raises(NcclTestsError, match="must be text"):
        parse_nccl_tests(12)
    assert len(parse_nccl_tests(_text("k80_2node_validation0_na_pkb2022.txt").encode())["runs"][0]["rows"]) == 11


def test_header_with_unknown_layout_raises():
    text = "#  size  count  type  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong\n"
    with pytest.raises(NcclTestsError, match="not an nccl-tests layout"):
        parse_nccl_tests(text)


# ---------------------------------------------------------------- compare


def test_compare_passes_and_fails_per_size():
    parsed = _load("h100_1node_8gpu_five_tests_v2.17.8.log")
    result = compare_busbw(parsed, {"1G": 450, 17179869184: 480, "256M": 430}, test="all_reduce")
    assert result["passed"] and result["failed_sizes"] == [] and result["runs"] == [0] and result["test"] == "all_reduce"
    assert [(entry["size"], entry["busbw_gbps"], entry["passed"]) for entry in result["results"]] == [
        (256 * MIB, 434.51, True), (GIB, 469.67, True), (16 * GIB, 482.27, True)]
    result = compare_busbw(parsed, {"256M": 440, "1G": 450}, test="all_reduce_perf")
    assert not result["passed"] and result["failed_sizes"] == [256 * MIB]
    assert result["results"][0] == {"size": 268435456, "min_busbw_gbps": 440.0, "busbw_gbps": 434.51, "samples_gbps": [434.51],
                                    "type": "double", "redop": "sum", "passed": False}
    assert result["summary"] == "1 of 2 sizes meet their minimum busbw (out-of-place)"
    in_place = compare_busbw(parsed, {"16G": 365}, test="reduce_scatter", placement="in_place")
    assert in_place["passed"] and in_place["results"][0]["busbw_gbps"] == 365.09


def test_compare_reads_text_one_run_or_a_list():
    text = _text("h100_oci_2node_16gpu_shell_prompt.txt")
    parsed = parse_nccl_tests(text)
    for data in (text, parsed, parsed["runs"][0], parsed["runs"], [parsed]):
        assert compare_busbw(data, {"8G": 460})["results"][0]["busbw_gbps"] == 463.90


def test_compare_names_the_missing_size():
    with pytest.raises(NcclTestsError) as info:
        compare_busbw(_load("h100_oci_2node_16gpu_shell_prompt.txt"), {"512M": 400})
    assert "no row of size 536870912 bytes" in str(info.value) and info.value.value == 536870912
    assert "1073741824" in info.value.expected


def test_compare_asks_for_the_test_when_the_log_has_several():
    with pytest.raises(NcclTestsError, match="several tests .*all_gather, all_reduce, alltoall, reduce_scatter, sendrecv"):
        compare_busbw(_load("h100_1node_8gpu_five_tests_v2.17.8.log"), {"1G": 1})
    with pytest.raises(NcclTestsError, match="no broadcast run"):
        compare_busbw(_load("h100_1node_8gpu_five_tests_v2.17.8.log"), {"1G": 1}, test="broadcast")


def test_compare_repeats_take_the_worst_unless_told():
    runs = _load("rtx5090_2rank_all_gather_default_3reps.txt")
    worst = compare_busbw(runs, {"128M": 1.0})
    assert worst["results"][0]["samples_gbps"] == [1.04, 1.06, 2.30] and worst["results"][0]["busbw_gbps"] == 1.04
    assert worst["runs"] == [0, 1, 2] and worst["passed"]
    assert compare_busbw(runs, {"128M": 2.0}, aggregate="median")["results"][0]["busbw_gbps"] == 1.06
    assert compare_busbw(runs, {"128M": 2.0}, aggregate="max")["passed"]


@pytest.mark.parametrize(
    "thresholds, fragment",
    [
        ([1, 2], "non-empty mapping"),
        ({}, "non-empty mapping"),
        ({"1G": -3}, "finite number >= 0"),
        ({"1G": "fast"}, "is not a number"),
        ({"one gig": 1}, "not a size"),
        ({True: 1}, "not a size"),
    ],
)
def test_compare_rejects_bad_thresholds(thresholds, fragment):
    with pytest.raises(NcclTestsError, match=fragment):
        compare_busbw(_load("h100_oci_2node_16gpu_shell_prompt.txt"), thresholds)


def test_compare_rejects_bad_choices_and_data():
    parsed = _load("h100_oci_2node_16gpu_shell_prompt.txt")
    with pytest.raises(NcclTestsError, match="placement 'both'"):
        compare_busbw(parsed, {"1G": 1}, placement="both")
    with pytest.raises(NcclTestsError, match="aggregate 'p99'"):
        compare_busbw(parsed, {"1G": 1}, aggregate="p99")
    with pytest.raises(NcclTestsError, match="not nccl-tests output"):
        compare_busbw(42, {"1G": 1})


# The 2017 broadcast table (nccl-tests b188a15, src/broadcast.cu print_header): one half, no in-place.
OLD_BROADCAST = """\
#                                  out-of-place
#      bytes             N    type    root     time  algbw  busbw      res
     8388608       2097152   float       0    133.4  62.88  62.88    0e+00
"""

# -d all: the same size in several data types in one table.
ALL_TYPES = """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
     1048576        262144     float     sum      -1    30.10   34.84   60.97      0    30.23   34.68   60.69      0
     1048576        524288      half     sum      -1    28.40   36.92   64.61      0    28.20   37.18   65.07      0
"""


def test_one_half_table_has_no_in_place():
    run = parse_nccl_tests(OLD_BROADCAST)["runs"][0]
    assert run["has_in_place"] is False and run["rows"][0]["in_place"] is None
    assert run["rows"][0]["out_of_place"] == {"time_us": 133.4, "algbw_gbps": 62.88, "busbw_gbps": 62.88, "error": 0.0}
    assert compare_busbw(run, {"8M": 60})["passed"]
    with pytest.raises(NcclTestsError, match="no in_place measurement at size 8388608"):
        compare_busbw(run, {"8M": 60}, placement="in_place")


def test_several_data_types_need_a_choice():
    with pytest.raises(NcclTestsError, match="several data types / reduction ops .*float/sum, half/sum"):
        compare_busbw(ALL_TYPES, {"1M": 60})
    assert compare_busbw(ALL_TYPES, {"1M": 60}, datatype="half")["results"][0]["busbw_gbps"] == 64.61
    assert busbw_by_size(ALL_TYPES, datatype="float", redop="sum")[1048576]["busbw_gbps"] == 60.97


# ---------------------------------------------------------------- sweep


def _socket_sweep():
    return {label: _load("rtx5090_2rank_all_reduce_socket_%s_3reps_tag_output.md" % label) for label in ("default", "nthreads4", "nthreads8")}


def test_sweep_keeps_the_baseline_when_no_label_beats_it_everywhere():
    result = sweep_compare(_socket_sweep(), "default", sizes=["16M", "128M"])
    assert result["recommended"] == "default" and not result["changed"]
    assert result["labels"] == ["default", "nthreads4", "nthreads8"] and result["sizes"] == [16 * MIB, 128 * MIB]
    assert result["reason"] == (
        "keep baseline default: no label beats it by +5.0% at every named size "
        "(nthreads4: +0.5% at 16777216 B (needs +5.0%); nthreads8: -7.3% at 16777216 B (needs +5.0%))"
    )
    last = result["table"][-1]
    assert last["size"] == 128 * MIB and last["named"]
    assert last["busbw_gbps"] == {"default": 2.30, "nthreads4": 2.08, "nthreads8": 2.26}
    assert round(last["gain_pct"]["nthreads4"], 2) == -9.57 and last["gain_pct"]["default"] == 0.0
    assert [row["size"] for row in result["table"]] == [MIB << shift for shift in range(8)]
    assert result["candidates"]["nthreads8"]["qualifies"] is False


def test_sweep_recommends_a_label_that_beats_the_baseline_at_every_named_size():
    labelled = {"default": _load("rtx5090_2rank_all_gather_default_3reps.txt"), "simple": _load("rtx5090_2rank_all_gather_proto_simple_3reps.txt")}
    result = sweep_compare(labelled, "default", sizes=["64M", "128M"], margin_pct=10)
    assert result["recommended"] == "simple" and result["changed"]
    assert result["reason"] == "simple beats baseline default by at least 10.0% at every named size (smallest gain +58.0% at 67108864 B)"
    assert result["candidates"]["simple"]["worst_size"] == 64 * MIB
    # Median of the three repeats: DEFAULT 1.06 at 128 MiB (1.04, 1.06, 2.30), Simple 2.31.
    assert result["table"][-1]["busbw_gbps"] == {"default": 1.06, "simple": 2.31}
    kept = sweep_compare(labelled, "default", sizes=["8M", "128M"])
    assert kept["recommended"] == "default" and "simple: -0.5% at 8388608 B (needs +5.0%)" in kept["reason"]


def test_sweep_labels_may_be_numbers_and_a_label_missing_a_size_does_not_qualify():
    full = _load("h100_1node_8gpu_five_tests_v2.17.8.log")["runs"][0]
    short = dict(full, rows=[row for row in full["rows"] if row["size"] != 16 * GIB])
    faster = dict(full, rows=[dict(row, out_of_place=dict(row["out_of_place"], busbw_gbps=row["out_of_place"]["busbw_gbps"] * 1.2))
                              for row in full["rows"]])
    result = sweep_compare({1: full, 2: short, 4: faster}, 1, sizes=["1G", "16G"])
    assert result["recommended"] == "4" and result["baseline"] == "1"
    assert result["candidates"]["2"] == {"qualifies": False, "min_gain_pct": None, "worst_size": 16 * GIB, "why": "no row of size 17179869184"}
    assert round(result["candidates"]["4"]["min_gain_pct"], 6) == 20.0
    default_sizes = sweep_compare({1: full, 2: short}, 1)
    assert 16 * GIB not in default_sizes["sizes"] and len(default_sizes["sizes"]) == 9


def test_sweep_errors_name_the_label_or_size():
    labelled = _socket_sweep()
    with pytest.raises(NcclTestsError, match="baseline 'qps_1' is not one of the labels"):
        sweep_compare(labelled, "qps_1")
    with pytest.raises(NcclTestsError, match="baseline 'default' has no row of size 1073741824"):
        sweep_compare(labelled, "default", sizes=["1G"])
    with pytest.raises(NcclTestsError, match="margin_pct -1"):
        sweep_compare(labelled, "default", margin_pct=-1)
    with pytest.raises(NcclTestsError, match="mapping of label"):
        sweep_compare("not a mapping", "default")
    with pytest.raises(NcclTestsError, match="label 'nthreads4' has runs of several tests"):
        sweep_compare(dict(labelled, nthreads4=_load("h100_1node_8gpu_five_tests_v2.17.8.log")), "default")


def test_sweep_with_only_the_baseline():
    result = sweep_compare({"default": _socket_sweep()["default"]}, "default")
    assert result["recommended"] == "default" and result["reason"] == "keep baseline default: it is the only label"


# ---------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "value, size",
    [(1073741824, GIB), ("1073741824", GIB), ("1G", GIB), ("512M", 512 * MIB), ("64K", 65536), ("64KiB", 65536), ("1.5K", 1536), (8.0, 8)],
)
def test_parse_size(value, size):
    assert parse_size(value) == size


def test_collective_name():
    assert collective_name("all_reduce_perf_mpi") == "all_reduce"
    assert collective_name("alltoall") == "alltoall"
    assert collective_name(None) is None
