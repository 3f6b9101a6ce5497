# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi topo -m parsing over real captures (tests/unit/fixtures/cpu_power/nvidia_topo, see the README there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.nvidia_topo import (
    TopoError,
    gpu_local_cpus,
    nic_paths,
    parse_topo_matrix,
    path_rank,
)

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cpu_power" / "nvidia_topo"


def _load(name):
    return parse_topo_matrix((CAPTURES / name).read_text())


def _cpus(text):
    return set(parse_cpulist(text))


def test_a100_epyc_8gpu_with_nic_legend():
    parsed = _load("a100_sxm4_8gpu_10nic_epyc7742.txt")
    assert sorted(parsed["gpus"]) == list(range(8))
    gpu3 = parsed["gpus"][3]
    assert gpu3["cpu_affinity"] == _cpus("16-31,144-159") and gpu3["numa_affinity"] == 1 and gpu3["gpu_numa_id"] is None
    assert gpu3["links"]["GPU0"] == "NV12" and gpu3["links"]["NIC3"] == "PXB" and gpu3["links"]["NIC9"] == "SYS"
    assert "GPU3" not in gpu3["links"]
    assert parsed["nic_legend"]["NIC9"] == "mlx5_9" and parsed["nics"]["NIC8"]["links"]["NIC9"] == "PIX"
    assert parsed["legend"]["NV#"] == "Connection traversing a bonded set of # NVLinks"
    paths = nic_paths(parsed)
    assert paths[6] == {
        "links": dict(("mlx5_%d" % n, "PXB" if n in (6, 7) else "SYS") for n in range(10)),
        "best_class": "PXB",
        "best_nics": ["mlx5_6", "mlx5_7"],
    }
    assert gpu_local_cpus(parsed)[4] == _cpus("112-127,240-255")


def test_hopper_gpu_numa_id_column_and_extra_empty_cell():
    parsed = _load("hgx_nv18_8gpu_12nic_gpu_numa_id.txt")
    assert parsed["devices"][-1] == "NIC11"
    for gpu in parsed["gpus"].values():
        assert gpu["cpu_affinity"] == set(range(192)) and gpu["numa_affinity"] == 0 and gpu["gpu_numa_id"] is None
    assert {i: p["best_nics"] for i, p in nic_paths(parsed).items()} == {
        0: ["mlx5_0"], 1: ["mlx5_1"], 2: ["mlx5_2"], 3: ["mlx5_5"], 4: ["mlx5_6"], 5: ["mlx5_7"], 6: ["mlx5_8"], 7: ["mlx5_11"],
    }
    assert parsed["nics"]["NIC3"]["links"]["NIC4"] == "PIX"


def test_copy_damaged_cells_are_split_back():
    damaged = _load("hgx_nv18_8gpu_12nic_merged_cells.txt")  # "PIXNODE" in GPU5, " X NODE" in NIC7
    clean = _load("hgx_nv18_8gpu_12nic_gpu_numa_id.txt")
    assert damaged["gpus"][5]["links"]["NIC7"] == "PIX" and damaged["gpus"][5]["links"]["NIC8"] == "NODE"
    assert damaged["gpus"] == clean["gpus"] and damaged["nics"] == clean["nics"]


def test_old_driver_mlx5_columns_without_nic_legend():
    parsed = _load("traverse_power9_v100_4gpu_mlx5_columns.txt")
    assert parsed["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert parsed["nic_legend"] == {}
    assert parsed["gpus"][2]["numa_affinity"] == 8 and parsed["gpus"][2]["cpu_affinity"] == _cpus("64-127")
    assert parsed["gpus"][0]["links"]["GPU1"] == "NV3" and parsed["nics"]["mlx5_2"] == {
        "name": "mlx5_2", "links": {"GPU0": "SYS", "GPU1": "SYS", "GPU2": "NODE", "GPU3": "NODE", "mlx5_0": "SYS", "mlx5_1": "SYS", "mlx5_3": "PIX"},
    }
    assert nic_paths(parsed)[3]["best_nics"] == ["mlx5_2", "mlx5_3"]
    della = _load("della_a100_2gpu_mlx5_columns.txt")
    assert gpu_local_cpus(della) == {0: _cpus("0-63"), 1: _cpus("64-127")}
    assert nic_paths(della)[1] == {"links": {"mlx5_0": "SYS", "mlx5_1": "NODE"}, "best_class": "NODE", "best_nics": ["mlx5_1"]}


def test_mangled_doubled_tabs_and_spaced_header():
    parsed = _load("v100_sxm2_8gpu_mlx5_columns_mangled_tabs.txt")
    assert parsed["gpus"][5]["links"]["GPU0"] == "SYS" and parsed["gpus"][5]["links"]["GPU2"] == "NV1"
    assert parsed["gpus"][7]["cpu_affinity"] == _cpus("24-47,72-95") and parsed["gpus"][7]["numa_affinity"] == 1
    assert nic_paths(parsed)[2]["best_class"] == "PIX" and nic_paths(parsed)[0]["best_class"] == "NODE"


def test_workstation_and_ansi_underlined_header():
    plain = _load("rtx3090_2gpu_nvlink_workstation.txt")
    assert plain["gpus"][0] == {"name": "GPU0", "links": {"GPU1": "NV4"}, "cpu_affinity": set(range(24)), "numa_affinity": 0,
                                "gpu_numa_id": None, "unreadable": {}}
    assert plain["nics"] == {} and nic_paths(plain)[1] == {"links": {}, "best_class": None, "best_nics": []}
    assert _load("SYNTHETIC_ansi_underline_header_rtx3090.txt")["gpus"] == plain["gpus"]


def test_path_rank_orders_closest_first():
    assert [path_rank(c) for c in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS")] == sorted(path_rank(c) for c in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS"))
    assert path_rank("PIX") < path_rank("SYS") < path_rank("WHAT") == path_rank(None)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no nvidia-smi topo matrix"),
        ("No devices were found\n", "no nvidia-smi topo matrix"),
        ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-23\t0\n", "no row for GPU1"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tNV4\t X \t0-23\nGPU1\tNV4\t X \t0-23\n", "not X, in its own column"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tNV4\t X \t0-23\n", "has 1 link cells for 2"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0-23\nGPU1\tNV4\t X \t0-23\n", "'FOO' where a link code"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\t1\t2\n", "has 3 cells after its links for the 1 columns"),
    ],
)
def test_bad_input_raises_topo_error(text, message):
    with pytest.raises(TopoError, match=message):
        parse_topo_matrix(text)
    assert issubclass(TopoError, ValueError)


def test_non_text_is_refused():
    with pytest.raises(TopoError, match="must be text"):
        parse_topo_matrix(None)


def _clip(text, row, cell, clipped):
    """The real capture with one cell of one row replaced, as a terminal or a web page clips it."""
    lines = text.splitlines(True)
    for number, line in enumerate(lines):
        if line.startswith(row + "\t") or line.startswith(row + " "):
            assert cell in line
            lines[number] = line.replace(cell, clipped, 1)
            return "".join(lines)
    raise AssertionError("no row %s" % row)


def test_a_clipped_cpu_affinity_cell_keeps_the_matrix():
    """Issue 29 class 6: one unreadable CPU Affinity cell (GPU3's 16-31,144-159 clipped to 16-31,144-) used to lose
    the whole matrix; now every link is kept and only GPU3's affinity is unknown."""
    text = _clip((CAPTURES / "a100_sxm4_8gpu_10nic_epyc7742.txt").read_text(), "GPU3", "16-31,144-159", "16-31,144-")
    parsed = parse_topo_matrix(text)
    whole = _load("a100_sxm4_8gpu_10nic_epyc7742.txt")
    gpu3 = parsed["gpus"][3]
    assert gpu3["cpu_affinity"] is None and gpu3["unreadable"] == {"CPU Affinity": "16-31,144-"}
    assert gpu3["numa_affinity"] == 1 and gpu3["links"] == whole["gpus"][3]["links"]
    assert nic_paths(parsed) == nic_paths(whole)
    local = gpu_local_cpus(parsed)
    assert local[3] is None and local[4] == _cpus("112-127,240-255")
    assert [n for n in parsed["notes"] if "CPU Affinity of GPU3 is '16-31,144-'" in n and "unknown" in n]
    assert whole["notes"] == [] and whole["gpus"][3]["unreadable"] == {}


def test_a_damaged_numa_cell_is_unknown_not_fatal():
    text = _clip((CAPTURES / "traverse_power9_v100_4gpu_mlx5_columns.txt").read_text(), "GPU2", "\t8", "\t8x")
    parsed = parse_topo_matrix(text)
    gpu2 = parsed["gpus"][2]
    assert gpu2["numa_affinity"] is None and gpu2["unreadable"] == {"NUMA Affinity": "8x"}
    assert gpu2["cpu_affinity"] == _load("traverse_power9_v100_4gpu_mlx5_columns.txt")["gpus"][2]["cpu_affinity"]
    assert [n for n in parsed["notes"] if "NUMA Affinity of GPU2 is '8x'" in n]
