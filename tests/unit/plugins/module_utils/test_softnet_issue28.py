# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 28: where the queue IRQs really fire, and verdicts that answer the question on the recorded runs.

1. ``run_check`` over a generated tree of the lab's gpu-node (virtio_net enp66s1, 6 queue pairs): the queue IRQs
   were pinned to CPUs 2-3 a second before the window, ``effective_affinity_list`` still says 2-7, and the
   ``/proc/interrupts`` counts grow on CPUs 2-3 between the two samples. The IRQ CPUs are 2-3; the affinity files
   are reported beside them and are the fallback when no queue IRQ fired.
2. ``judge`` over the per-CPU numbers that the closed-loop benchmark recorded (benchmarks/closed_loop_before and
   closed_loop_after, cluster.json: the diagnose report of each phase): before tuning (78 squeezes in 10.03 s on
   CPU 4, which also runs a worker) is contention; after it (135 squeezes in 10.06 s on the dedicated IRQ CPU 2,
   without user work) is no contention with the finding "IRQ CPUs saturated by packet rate". Both were
   inconclusive before issue 28.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import irq_cpus_fired, run_check
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import judge

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402

ONLINE = list(range(8))


def grow(text, irqs, by_cpu):
    """``/proc/interrupts`` text with the counts of ``irqs`` raised by ``by_cpu`` ({cpu: n}), columns kept."""
    lines = text.splitlines(True)
    cpus = [int(token[3:]) for token in lines[0].split()]
    row = re.compile(r"^(\s*(\d+):)((?:\s+\d+){%d})(.*)$" % len(cpus), re.S)
    out = [lines[0]]
    for line in lines[1:]:
        match = row.match(line)
        if match and int(match.group(2)) in irqs:
            counts = [int(value) for value in match.group(3).split()]
            counts = [count + by_cpu.get(cpu, 0) for cpu, count in zip(cpus, counts)]
            line = match.group(1) + "".join(" %10u" % count for count in counts) + match.group(4)
        out.append(line)
    return "".join(out)


@pytest.fixture
def lab_node(tmp_path):
    """The lab's gpu-node a second after the queue IRQs of enp66s1 were pinned to CPUs 2-3: smp_affinity_list
    says 2-3, effective_affinity_list still says where each IRQ last fired (2-7 over the 12 queue IRQs)."""
    tree = treegen.build_tree(tmp_path, treegen.lab_virtio())
    queue_irqs = [irq["irq"] for irq in tree.spec["nics"][1]["irqs"] if "-input." in irq["name"] or "-output." in
                  irq["name"]]
    for index, irq in enumerate(queue_irqs):
        tree.set_affinity(irq, [2, 3], effective=[2 + index % 6])
    profile = softnet_load.seed_contention(ONLINE, [2, 3], "enp66s1", 10000)
    softnet_load.write_counters(tree.proc, profile, 0.0)
    return tree, queue_irqs, profile


def sample_over(tree, profile, second_interrupts):
    """run_check with the window's second half written by the sleep: counters 10 s on, /proc/interrupts as given."""
    now = {"t": 1000.0}

    def sleep(seconds):
        softnet_load.write_counters(tree.proc, profile, seconds)
        with open(os.path.join(tree.proc, "interrupts"), "w") as handle:
            handle.write(second_interrupts)
        now["t"] += seconds

    options = {"interface": "enp66s1", "interval": 10.0, "link_speed_mbps": 10000}
    return run_check(options, procfs=tree.proc, sysfs=tree.sys, run=tree.run, sleep=sleep, clock=lambda: now["t"])


def test_irq_cpus_are_where_the_queue_irqs_fired_not_the_lagging_effective_affinity(lab_node):
    tree, queue_irqs, profile = lab_node
    before = Path(tree.proc, "interrupts").read_text()
    assert [tree.affinity(irq) for irq in queue_irqs] == ["2-3"] * 12
    result = sample_over(tree, profile, grow(before, set(queue_irqs), {2: 40000, 3: 1200}))
    assert result["irq_cpus"] == [2, 3] and result["irq_cpulist"] == "2-3"
    assert result["irq_cpus_source"] == "interrupts"
    assert result["irq_cpus_fired"] == [2, 3]
    # the affinity files are reported beside them
    assert result["irq_cpus_affinity"] == [2, 3, 4, 5, 6, 7]
    assert result["irq_cpus_affinity_source"] == "effective_affinity"
    assert any("fired on CPUs 2-3 during the sample; their affinity files say 2-7" in note for note in result["notes"])
    by_cpu = dict((row["cpu"], row) for row in result["cpus"])
    assert [cpu for cpu in ONLINE if by_cpu[cpu]["irq_cpu"]] == [2, 3]
    # the workload shares CPUs 2-3 with the IRQs in this profile: judged on the CPUs where they fire
    assert result["verdict"] == "contention", result["reasons"]
    assert result["contended_cpus"] == [2, 3]


def test_affinity_files_are_the_fallback_when_no_queue_irq_fired(lab_node):
    tree, queue_irqs, profile = lab_node
    before = Path(tree.proc, "interrupts").read_text()
    # only the management NIC's IRQ 25 (virtio0-input.0) fired
    result = sample_over(tree, profile, grow(before, {25}, {0: 500}))
    assert result["irq_cpus_fired"] == []
    assert result["irq_cpus"] == [2, 3, 4, 5, 6, 7] and result["irq_cpus_source"] == "effective_affinity"
    assert any("no queue IRQ of enp66s1 fired during the sample" in note for note in result["notes"])


def test_fired_cpus_handle_a_u32_wrap_hotplug_and_unknowns():
    nic = {"interface": "ens7", "irqs": [{"irq": 60, "kind": "queue"}, {"irq": 61, "kind": "queue"},
                                         {"irq": 59, "kind": "control"}]}
    first = ("           CPU0       CPU1       CPU2\n"
             " 59:          0          0          0   PCI-MSIX  0-edge  mlx5_async0\n"
             " 60: 4294967290          7          0   PCI-MSIX  1-edge  mlx5_comp0\n"
             " 61:          0          0          5   PCI-MSIX  2-edge  mlx5_comp1\n")
    # CPU 0 wrapped (+10), CPU 1 went offline, the control IRQ 59 fired on CPU 2 (not a queue: ignored)
    second = ("           CPU0       CPU2\n"
              " 59:          0          9   PCI-MSIX  0-edge  mlx5_async0\n"
              " 60:          4          0   PCI-MSIX  1-edge  mlx5_comp0\n"
              " 61:          0          5   PCI-MSIX  2-edge  mlx5_comp1\n")
    assert irq_cpus_fired(nic, first, second) == ([0], [])
    assert irq_cpus_fired(nic, first, first) == ([], [])
    assert irq_cpus_fired({"irqs": []}, first, second) == (None, [])
    cpus, notes = irq_cpus_fired(nic, first, None)
    assert cpus is None and "could not be read" in notes[0]


# ------------------------------------------------------------------ the recorded closed-loop runs

RECORDED = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "softnet_captures" /
                       "closed_loop_2026-12-02.json").read_text())


def recorded(phase):
    """signals and IRQ CPUs of the diagnose report the closed-loop benchmark wrote for ``phase``."""
    data = RECORDED[phase]
    return {"elapsed": data["interval"], "cpus": data["cpus"], "link": data["link"]}, data["irq_cpus"]


def test_recorded_before_run_is_contention():
    signals, irq_cpus = recorded("before")
    # then: inconclusive, 78 squeezes per 10 s being under the absolute threshold of 100
    assert RECORDED["before"]["verdict_rule_then"] == "irq_squeezes_low"
    assert irq_cpus == [4, 5, 6, 7]
    # the IRQ CPUs the report used (the driver's spread) and CPU 4 alone, where the queue IRQs fired (net_rx)
    for cpus in (irq_cpus, [4]):
        result = judge(signals, cpus)
        assert result["verdict"] == "contention" and result["verdict_rule"] == "contention", result["reasons"]
        assert result["contended_cpus"] == [4]
        assert any("CPU 4 78 in 10.03 s (7.78 per s)" in reason for reason in result["reasons"])
        assert any("carry 98.7 % of all squeezes (78 of 79)" in reason for reason in result["reasons"])
        assert result["findings"] == []


def test_recorded_after_run_is_no_contention_with_the_saturated_irq_cpu_as_a_finding():
    signals, irq_cpus = recorded("after")
    # then: inconclusive (irq_cpus_not_busy), squeezes on the dedicated IRQ CPU without user work
    assert RECORDED["after"]["verdict_rule_then"] == "irq_cpus_not_busy"
    assert irq_cpus == [2, 3, 4, 5, 6, 7]  # effective_affinity_list lagging behind the pin to 2-3
    expected = {
        tuple(irq_cpus): "no_shared_cpu",     # CPUs 3-7 run user work, none of them with softirq >= 5 %
        (2, 3): "no_shared_cpu",              # where the pins put the IRQs
        (2,): "irq_cpus_no_user_work",        # where they fired (net_rx)
    }
    for cpus, rule in expected.items():
        result = judge(signals, list(cpus))
        assert result["verdict"] == "no_contention" and result["verdict_rule"] == rule, (cpus, result["reasons"])
        (finding,) = result["findings"]
        assert finding["name"] == "irq_cpus_saturated" and finding["cpus"] == [2]
        assert "CPU 2 135 in 10.06 s (13.42 per s), usr 12.93 %" in finding["reason"]
        assert "More queues do not help" in finding["remedy"]


# ------------------------------------------------------------------ the pinned closed loop of 2026-12-04

PINNED = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "softnet_captures" /
                     "closed_loop_2026-12-04.json").read_text())


@pytest.mark.parametrize("phase, verdict, rule", [
    ("before", "contention", "contention"),
    ("after", "no_contention", "irq_cpus_no_user_work"),
])
def test_recorded_pinned_run_gives_the_same_verdict_and_reasons(phase, verdict, rule):
    """The last pair of the 5-pair run with QEMU's vCPUs pinned (benchmarks/closed_loop_results.json): before
    tuning CPU 4 runs a worker and the NIC's softirq (usr 46 %, soft 47 %, 224 squeezes in 10.02 s), after it the
    dedicated IRQ CPU 2 runs no user work (usr 14 %) and squeezes (2.69 per s). Judged again from the report's numbers, the verdict, the
    rule and every reason are the ones the diagnose of that run wrote."""
    data = PINNED[phase]
    result = judge({"elapsed": data["interval"], "cpus": data["cpus"], "link": data["link"]}, data["irq_cpus"])
    assert (result["verdict"], result["verdict_rule"]) == (verdict, rule) == (data["verdict_then"],
                                                                              data["verdict_rule_then"])
    assert result["reasons"] == data["reasons_then"]
    if phase == "before":
        assert result["contended_cpus"] == [4]
        assert "CPU 4 224 in 10.02 s (22.36 per s)" in result["reasons"][2]
    else:
        # 27 squeezes in 10.03 s on the dedicated IRQ CPU without user work: the packet-rate finding, not contention
        assert result["contended_cpus"] == []
        assert [(f["name"], f["cpus"]) for f in result["findings"]] == [("irq_cpus_saturated", [2])]


def test_recorded_2026_12_05_before_run_counts_a_user_busy_irq_cpus_squeezes_as_shared():
    """CPU 5 runs a worker (usr 81.7 %) and takes queue IRQs; its softirq share sampled at 4.17 %, under 5 %. Its
    42 squeezes are the same contention as CPU 4's 23, not "elsewhere (another NIC, RPS, IRQs moved)"."""
    data = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "softnet_captures" /
                       "closed_loop_2026-12-05.json").read_text())["before"]
    assert data["verdict_rule_then"] == "squeezes_elsewhere"
    result = judge({"elapsed": data["interval"], "cpus": data["cpus"], "link": data["link"]}, data["irq_cpus"])
    assert result["verdict"] == "contention" and result["verdict_rule"] == "contention", result["reasons"]
    assert result["busy_irq_cpus"] == [4] and result["contended_cpus"] == [4]
    assert "the shared CPUs carry 100 % of all squeezes (65 of 65), at or above 50 %" in result["reasons"]
    # one IRQ CPU without user work taking the other squeezes would still be elsewhere
    cpus = [dict(row, usr=1.0) if row["cpu"] == 5 else row for row in data["cpus"]]
    result = judge({"elapsed": data["interval"], "cpus": cpus, "link": data["link"]}, data["irq_cpus"])
    assert result["verdict_rule"] == "squeezes_elsewhere", result["reasons"]
