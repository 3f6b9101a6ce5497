# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check module glue, run for real over generated trees whose counters advance while it sleeps.

A background writer (tests/unit/fixtures/softnet_load) rewrites proc/stat,
proc/net/softnet_stat, proc/softirqs and proc/net/dev of each tree every 0.1 s
from per-CPU rates, so the module's two samples, 0.5 s apart, see real deltas.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest

from modharness import patch_module_args

from ansible_collections.gpunode.tuning.plugins.modules import softnet_check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402

ONLINE = list(range(8))
IRQ_CPUS = [0, 1, 2, 3]


def spec(speed=25000, irqs=True):
    pci = "0000:3b:00.0"
    return {
        "cpus": 8,
        "siblings": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "numa": {0: ONLINE},
        "nics": [{
            "name": "ens7", "pci": pci, "driver": "mlx5_core", "numa_node": 0, "mac": "02:00:17:0a:0b:0c",
            "speed": speed, "rx_queues": 4, "tx_queues": 4, "addresses": ["10.1.0.5/24"],
            "irqs": treegen.mlx5_irqs(pci, 60, 4, IRQ_CPUS) if irqs else [],
        }],
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [{"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0}],
    }


@pytest.fixture
def host(tmp_path):
    """Build a tree and start the counter writer for it; yields a function(profile_name, **spec_kwargs)."""
    writers = []

    def make(profile, **kwargs):
        root = tmp_path / ("host%d" % len(writers))
        tree = treegen.build_tree(root, spec(**kwargs))
        speed = kwargs.get("speed", 25000)
        config = {"trees": [{"proc": tree.proc, "profile": softnet_load.PROFILES[profile](
            ONLINE, IRQ_CPUS, "ens7", speed if speed > 0 else 25000)}], "period": 0.05, "max_seconds": 120}
        writers.append(softnet_load.start_writer(config, root))
        return tree

    yield make
    for process, stop_file in writers:
        softnet_load.stop_writer(process, stop_file)


def run_module(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as info:
            softnet_check.main()
    result = json.loads(capsys.readouterr().out)
    return info.value.code, result


def base_args(tree, **extra):
    args = {"procfs_path": tree.proc, "sysfs_path": tree.sys, "interval": 0.5}
    args.update(extra)
    return args


def test_seed_pattern_is_contention_with_irq_cpus_from_effective_affinity(host, capsys):
    tree = host("seed_contention")
    rc, result = run_module(capsys, base_args(tree))
    assert rc == 0, result
    assert result["verdict"] == "contention", result["reasons"]
    assert result["changed"] is False
    assert result["interface"] == "ens7" and result["pci_address"] == "0000:3b:00.0"
    assert result["irq_cpus"] == IRQ_CPUS and result["irq_cpus_source"] == "effective_affinity"
    assert result["busy_irq_cpus"] == IRQ_CPUS
    by_cpu = dict((row["cpu"], row) for row in result["cpus"])
    # 150 per 10 s per IRQ CPU in the profile; the writer's write instants and the module's read instants differ
    # by scheduling jitter (tens of ms in a 0.5 s window, more on a loaded machine)
    assert 75 <= by_cpu[0]["squeeze_per_10s"] <= 300
    assert 50 <= by_cpu[0]["usr"] <= 70 and 5 <= by_cpu[0]["soft"] <= 20
    assert by_cpu[5]["time_squeeze"] == 0 and by_cpu[5]["irq_cpu"] is False
    assert 1.75 <= result["link"]["utilisation_pct"] <= 7
    assert result["softnet"]["width"] == 13


def test_check_mode_samples_the_same_way_and_changes_nothing(host, capsys):
    tree = host("seed_contention")
    before = dict((name, os.path.getmtime(os.path.join(tree.proc, "irq", "61", name)))
                  for name in ("smp_affinity_list", "effective_affinity_list"))
    rc, result = run_module(capsys, base_args(tree, _ansible_check_mode=True))
    assert rc == 0 and result["verdict"] == "contention" and result["changed"] is False
    assert result["interval"] >= 0.5
    after = dict((name, os.path.getmtime(os.path.join(tree.proc, "irq", "61", name))) for name in before)
    assert before == after


def test_healthy_host_is_no_contention(host, capsys):
    tree = host("healthy")
    rc, result = run_module(capsys, base_args(tree))
    assert rc == 0 and result["verdict"] == "no_contention", result["reasons"]
    assert result["hot_cpus"] == []


def test_rate_without_user_work_is_no_contention_with_the_saturation_finding(host, capsys):
    tree = host("rate_flood")
    rc, result = run_module(capsys, base_args(tree))
    assert result["verdict"] == "no_contention", result["reasons"]
    assert result["verdict_rule"] == "irq_cpus_no_user_work"
    assert any("whatever the squeezes" in reason for reason in result["reasons"])
    (finding,) = result["findings"]
    assert finding["name"] == "irq_cpus_saturated" and finding["cpus"] == IRQ_CPUS
    assert result["totals"]["dropped"] > 0


def test_fail_on_contention_fails_the_task_and_still_returns_everything(host, capsys):
    tree = host("seed_contention")
    rc, result = run_module(capsys, base_args(tree, fail_on_contention=True))
    assert rc == 1 and result["failed"] is True
    assert result["msg"].startswith("contention: IRQ CPUs 0-3 run user work")
    assert result["verdict"] == "contention" and len(result["cpus"]) == 8


def test_irq_cpus_option_overrides_the_nic(host, capsys):
    tree = host("seed_contention")
    rc, result = run_module(capsys, base_args(tree, irq_cpus="4-7"))
    assert result["irq_cpus"] == [4, 5, 6, 7] and result["irq_cpus_source"] == "option"
    # user work on 4-7 without softirq there: the NIC's work does not compete with it on those CPUs
    assert result["verdict"] == "no_contention" and result["verdict_rule"] == "no_shared_cpu"
    assert result["irq_cpus_affinity"] == IRQ_CPUS
    assert result["non_irq_squeeze_cpus"] == IRQ_CPUS


def test_nic_without_queue_irqs_degrades_to_inconclusive(host, capsys):
    tree = host("seed_contention", irqs=False)
    rc, result = run_module(capsys, base_args(tree))
    assert rc == 0 and result["verdict"] == "inconclusive"
    assert result["irq_cpus"] == [] and result["irq_cpus_source"] == "none"
    assert "ens7 (mlx5_core) shows 0 queue IRQs" in result["reasons"][0]


def test_unknown_speed_is_reported_unknown_and_can_be_given(host, capsys):
    tree = host("seed_contention", speed=-1)
    rc, result = run_module(capsys, base_args(tree))
    assert result["link"]["speed_mbps"] is None and result["link"]["speed_source"] == "unknown"
    assert result["verdict"] == "inconclusive"
    rc, result = run_module(capsys, base_args(tree, link_speed_mbps=25000))
    assert result["link"]["speed_source"] == "option" and result["verdict"] == "contention"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"interval": 0}, "interval 0.0 is not"),
        ({"irq_cpus": "3-1"}, "irq_cpus"),
        ({"squeeze_share_pct": 150}, "squeeze_share_pct 150.0 is not a percentage from 0 to 100"),
        ({"squeeze_quiet": 5}, "Unsupported parameters"),
        ({"interface": "ens9"}, "interface 'ens9' does not exist"),
        ({"interface": "ens7", "mac": "02:00:17:0a:0b:0c"}, "mutually exclusive"),
    ],
)
def test_bad_input_fails_with_a_clear_message(tmp_path, capsys, extra, fragment):
    tree = treegen.build_tree(tmp_path, spec())
    softnet_load.write_counters(tree.proc, softnet_load.healthy(ONLINE, IRQ_CPUS, "ens7", 25000), 0.0)
    rc, result = run_module(capsys, base_args(tree, **extra))
    assert rc == 1 and result["failed"] is True
    assert fragment in result["msg"]


def test_missing_softnet_stat_is_an_error_naming_the_file(tmp_path, capsys):
    tree = treegen.build_tree(tmp_path, copy.deepcopy(spec()))
    rc, result = run_module(capsys, base_args(tree))
    assert rc == 1 and "softnet_stat" in result["msg"] and result["path"].endswith("net/softnet_stat")
