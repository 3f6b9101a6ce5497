# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nic_irq_facts and nic_irq_affinity module glue: exit_json/fail_json raise, trees are real files."""

from __future__ import annotations

import json

import pytest

import treegen
from modharness import Exit, Fail, run
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_affinity, nic_irq_facts


pytestmark = pytest.mark.usefixtures("fake_exits")


@pytest.fixture
def seed(tmp_path):
    return treegen.build_tree(tmp_path, treegen.seed_vm())


def roots(tree, **kw):
    kw.update(procfs_path=tree.proc, sysfs_path=tree.sys)
    return kw


def test_facts_for_the_default_route_nic(seed):
    kind, result = run(nic_irq_facts, roots(seed))
    assert kind is Exit and result["changed"] is False
    facts = result["ansible_facts"]["nic_irq"]
    assert (facts["interface"], facts["pci_address"], facts["driver"]) == ("ens7", "0000:00:07.0", "mlx5_core")
    assert len([i for i in facts["irqs"] if i["kind"] == "queue"]) == 11
    assert facts["topology"]["siblings"][0] == [0, 88]
    assert facts["topology"]["numa_nodes"]["1"][0] == 44                 # JSON keys are strings
    assert facts["irqbalance"]["installed"] is False
    assert facts["queues"]["sysfs_rx"] == 11 and facts["queues"]["combined_current"] is None   # no ethtool on a tree


def test_facts_give_every_cpu_set_as_a_kernel_style_cpu_list_string(seed):
    facts = run(nic_irq_facts, roots(seed))[1]["ansible_facts"]["nic_irq"]
    irq = dict((i["irq"], i) for i in facts["irqs"])
    assert (irq[61]["affinity_list"], irq[61]["effective_affinity_list"]) == ("1", "1")
    assert "affinity" not in irq[61] and "effective_affinity" not in irq[61]   # the compact form is the default
    asked = run(nic_irq_facts, roots(seed, irq_affinity_format="both"))[1]["ansible_facts"]["nic_irq"]
    irq = dict((i["irq"], i) for i in asked["irqs"])
    assert (irq[61]["affinity"], irq[61]["affinity_list"], irq[61]["effective_affinity_list"]) == ([1], "1", "1")
    assert facts["topology"]["online_list"] == "0-175" and facts["topology"]["online"] == list(range(176))
    assert facts["topology"]["isolated_list"] == "" and facts["topology"]["default_smp_affinity_list"] == "0-175"
    assert facts["local_cpus_list"] == "0-175"
    assert irq[61]["managed"] is None                                   # no debugfs in the tree: unknown


def test_facts_on_1152_cpus_before_tuning_are_compact_by_default(tmp_path):
    """Issue 29 class 8: on an untuned 1,152-CPU node the default output is the compact one (CPU list strings for the
    IRQs); the integer lists come only when asked for (irq_affinity_format: both)."""
    spec = treegen.large_numa(1152, 100, 64)
    for irq in spec["nics"][0]["irqs"]:
        irq["affinity"] = irq["effective"] = list(range(1152))          # the kernel's default before tuning
    tree = treegen.build_tree(tmp_path, spec)
    args = {"interface": "eth0", "procfs_path": tree.proc, "sysfs_path": tree.sys}
    both = run(nic_irq_facts, dict(args, irq_affinity_format="both"))[1]
    strings = run(nic_irq_facts, args)[1]
    assert strings == run(nic_irq_facts, dict(args, irq_affinity_format="string"))[1]
    for result in (both, strings):
        irqs = result["ansible_facts"]["nic_irq"]["irqs"]
        assert len(irqs) == 65 and set(i["affinity_list"] for i in irqs) == {"0-1151"}
        assert set(i["effective_affinity_list"] for i in irqs) == {"0-1151"}
    assert all(len(i["affinity"]) == 1152 for i in both["ansible_facts"]["nic_irq"]["irqs"])
    assert not [i for i in strings["ansible_facts"]["nic_irq"]["irqs"] if "affinity" in i or "effective_affinity" in i]
    assert strings["ansible_facts"]["nic_irq"]["topology"]["online"] == list(range(1152))   # kept for the roles
    size = dict((name, len(json.dumps(r))) for name, r in (("both", both), ("string", strings)))
    assert size["both"] > 600000 and size["string"] < 60000, size


def test_facts_bad_irq_affinity_format_fails(seed):
    kind, result = run(nic_irq_facts, roots(seed, irq_affinity_format="ints"))
    assert kind is Fail and "irq_affinity_format" in result["msg"] and "ints" in result["msg"]


def test_facts_in_check_mode_are_the_same(seed):
    assert run(nic_irq_facts, roots(seed), check=True)[1] == run(nic_irq_facts, roots(seed))[1]


def test_facts_selector_errors_fail_with_candidates(seed):
    kind, result = run(nic_irq_facts, roots(seed, interface="ibp17s0"))
    assert kind is Fail and "InfiniBand" in result["msg"] and result["candidates"] == ["ens7"]


def test_facts_mutually_exclusive_selectors(seed):
    kind, result = run(nic_irq_facts, roots(seed, interface="ens7", mac="02:00:17:0a:0b:0c"))
    assert kind is Fail and "mutually exclusive" in result["msg"]


def test_affinity_check_mode_gives_exact_plan_and_diff_and_writes_nothing(seed):
    before = seed.all_affinities()
    kind, result = run(nic_irq_affinity, roots(seed, cpus="160-170", exclude_cpus="0-159"), check=True, diff=True)
    assert kind is Exit and result["changed"] is True
    assert seed.all_affinities() == before
    assert [(i["irq"], i["after"], i["status"]) for i in result["irqs"] if i["kind"] == "queue"] == [
        (60 + q, str(160 + q), "would_change") for q in range(11)]
    assert "160" in result["diff"]["after"] and "160" not in result["diff"]["before"]
    assert result["cpulist"] == "160-170"


def test_affinity_converges_then_is_idempotent_and_check_reports_no_change(seed):
    kind, result = run(nic_irq_affinity, roots(seed, cpus=list(range(160, 171))))
    assert kind is Exit and result["changed"] is True
    assert [seed.affinity(60 + q) for q in range(11)] == [str(160 + q) for q in range(11)]
    assert "diff" not in result
    kind, again = run(nic_irq_affinity, roots(seed, cpus="160-170"))
    assert again["changed"] is False
    assert set(i["status"] for i in again["irqs"] if i["kind"] == "queue") == {"pending"}
    kind, check = run(nic_irq_affinity, roots(seed, cpus="160-170"), check=True)
    assert check["changed"] is False


def test_affinity_bad_cpu_fails_naming_it_and_changes_nothing(seed):
    before = seed.all_affinities()
    kind, result = run(nic_irq_affinity, roots(seed, cpus="170-180"))
    assert kind is Fail and result["value"] == 176 and "does not exist" in result["msg"]
    assert seed.all_affinities() == before


def test_affinity_cpus_and_count_are_exclusive(seed):
    kind, result = run(nic_irq_affinity, roots(seed, cpus="1", count=1))
    assert kind is Fail and "mutually exclusive" in result["msg"]


def test_affinity_rollback_failure_reaches_fail_json(seed):
    seed.break_irq(64)
    before = seed.all_affinities()
    kind, result = run(nic_irq_affinity, roots(seed, cpus="160-170"))
    assert kind is Fail and result["irq"] == 64 and result["rolled_back"] == [63, 62, 61, 60]
    assert seed.all_affinities() == before


@pytest.mark.playbook
def test_real_ansible_run_against_localhost_with_a_generated_tree(tmp_path):
    """The modules load by FQCN through AnsiballZ: check mode + diff, then apply, then no change."""
    import os
    import subprocess
    import sys

    tree = treegen.build_tree(tmp_path / "tree", treegen.lab_virtio())
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    args = "pci_address=0000:42:01.0 cpus=4-7 allow_irqbalance=true procfs_path=%s sysfs_path=%s" % (tree.proc, tree.sys)

    def adhoc(*extra):
        proc = subprocess.run([ansible, "localhost", "-m", "gpunode.tuning.nic_irq_affinity", "-a", args] + list(extra),
                              env=env, capture_output=True, text=True, check=False, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # minimal callback: "localhost | CHANGED => {...}" (warnings go to stderr)
        return json.loads(proc.stdout[proc.stdout.index("=>") + 2:])

    before = tree.all_affinities()
    planned = adhoc("--check", "--diff")
    assert planned["changed"] and tree.all_affinities() == before
    assert [i["after"] for i in planned["irqs"] if i["kind"] == "queue"][:4] == ["4", "4", "6", "6"]
    applied = adhoc()
    assert applied["changed"] and tree.affinity(41) == "4" and tree.affinity(44) == "6"
    assert not adhoc()["changed"]
