# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The diagnose report's notes under a host are the same in cluster.md and cluster.html (issue 29, trip 7).

softnet_check runs for real on a generated tree whose counters advance while it samples (the background writer of
tests/unit/fixtures/softnet_load): a NIC with no link speed in sysfs (-1, as virtio and some VFs) and no NUMA hint from
the firmware (numa_node -1). Both renderers must say what to set for the speed and carry the numa_node note."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from modharness import patch_module_args

from ansible_collections.gpunode.tuning.plugins.module_utils._report.diagnose import (
    diagnose_collect, diagnose_html, diagnose_markdown)
from ansible_collections.gpunode.tuning.plugins.modules import softnet_check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402

ONLINE = list(range(8))
IRQ_CPUS = [0, 1, 2, 3]


@pytest.fixture
def result(tmp_path, capsys):
    pci = "0000:3b:00.0"
    tree = treegen.build_tree(tmp_path / "host", {
        "cpus": 8, "siblings": [[0, 4], [1, 5], [2, 6], [3, 7]], "numa": {0: ONLINE},
        "nics": [{"name": "ens7", "pci": pci, "driver": "mlx5_core", "numa_node": -1, "mac": "02:00:17:0a:0b:0c",
                  "speed": -1, "rx_queues": 4, "tx_queues": 4, "addresses": ["10.1.0.5/24"],
                  "irqs": treegen.mlx5_irqs(pci, 60, 4, IRQ_CPUS)}],
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [{"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0}],
    })
    profile = softnet_load.PROFILES["healthy"](ONLINE, IRQ_CPUS, "ens7", 25000)
    config = {"trees": [{"proc": tree.proc, "profile": profile}], "period": 0.05, "max_seconds": 60}
    process, stop_file = softnet_load.start_writer(config, tmp_path / "host")
    try:
        with patch_module_args({"procfs_path": tree.proc, "sysfs_path": tree.sys, "interval": 0.5}):
            with pytest.raises(SystemExit):
                softnet_check.main()
    finally:
        softnet_load.stop_writer(process, stop_file)
    return json.loads(capsys.readouterr().out)


def test_markdown_and_html_carry_the_same_notes_with_the_speed_hint_and_the_numa_note(result):
    assert result["link"]["speed_mbps"] is None
    report = diagnose_collect({"gpu-01": {"softnet": result, "nic": {}}}, "2026-12-03T17:00:00Z")
    markdown, page = diagnose_markdown(report), diagnose_html(report)
    notes = re.findall(r"(?m)^- note: (.*)$", markdown)
    assert any("numa_node -1" in note for note in notes), notes
    assert any(note.startswith("link speed of ens7 is unknown") and "diagnose_link_speed_mbps" in note
               for note in notes), notes
    html_notes = re.findall(r"<li>note: (.*?)</li>", page)
    assert html_notes == [n.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
                          .replace("'", "&#x27;") for n in notes]
