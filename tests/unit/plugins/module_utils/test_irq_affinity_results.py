# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pin writer's failure paths and the check after a run, exactly: what a failed write says and puts back, what
restore_pins does with a run's result, the refusal record, verify_pins' three lists, and the refusals and warnings
of explicit CPUs.

Synthetic trees from ``treegen`` (the seed article's VM and the 8-GPU node). A write that fails is a real failed
write (the file replaced by a directory: EISDIR as root) or, for the kernel's EIO/EPERM on a managed IRQ, the
``write`` seam raising that errno. Written for #34: the mutation run left these paths' messages, orders and
details without exact assertions.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import (
    apply_plan, record_refusals, restore_pins, run_desired_state, stored_desired_state, verify_pins)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError, PlanItem, plan_affinity
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

SEED_NAME = "mlx5_comp%d@pci:0000:00:07.0"


def _state(tree, **selector):
    return read_nic(selector or {}, procfs=tree.proc, sysfs=tree.sys), read_topology(tree.sys, tree.proc)


# ------------------------------------------------------------------ a failed write

def test_a_failed_write_names_irq_value_and_error_and_puts_back_the_earlier_ones_newest_first(seed):
    seed.break_irq(65)
    before = seed.all_affinities()
    plan = plan_affinity(*_state(seed), cpus="160-170")
    with pytest.raises(AffinityError) as err:
        apply_plan(plan, procfs=seed.proc)
    path = os.path.join(seed.proc, "irq", "65", "smp_affinity_list")
    assert str(err.value) == ("writing 165 to IRQ 65 (%s) failed: [EISDIR] Is a directory; restored IRQs 64, 63, 62, 61, 60 "
                              "to their previous affinity" % (SEED_NAME % 5))
    details = err.value.details
    assert (details["irq"], details["value"], details["path"], details["errno"]) == (65, "165", path, errno.EISDIR)
    assert details["error"] == "[Errno 21] Is a directory: '%s'" % path
    assert (details["rolled_back"], details["rollback_failed"]) == ([64, 63, 62, 61, 60], [])
    assert seed.all_affinities() == before
    statuses = dict((i.irq, i.status) for i in plan.items)
    assert [statuses[60 + q] for q in range(5)] == ["unchanged"] * 5
    assert [i.after for i in plan.items if i.irq in (60, 61)] == [[0], [1]]


def test_a_first_write_that_fails_has_changed_nothing(seed):
    seed.break_irq(60)
    with pytest.raises(AffinityError) as err:
        apply_plan(plan_affinity(*_state(seed), cpus="160-170"), procfs=seed.proc)
    assert str(err.value).endswith("failed: [EISDIR] Is a directory; nothing had been changed")
    assert err.value.details["rolled_back"] == []


def test_a_rollback_write_that_fails_is_named_with_the_value_it_could_not_put_back(seed):
    plan = plan_affinity(*_state(seed), cpus="160-170")
    calls = []

    def write(path, text):
        calls.append((path.split("/irq/")[1].split("/")[0], text))
        if "/irq/62/" in path or ("/irq/61/" in path and text == "1\n"):
            raise OSError(errno.EIO if "/62/" not in path else errno.ENOSPC, "refused")
        with open(path, "w") as handle:
            handle.write(text)

    with pytest.raises(AffinityError) as err:
        apply_plan(plan, procfs=seed.proc, write=write)
    assert calls == [("60", "160\n"), ("61", "161\n"), ("62", "162\n"), ("61", "1\n"), ("60", "0\n")]
    assert err.value.details["rolled_back"] == [60]
    assert err.value.details["rollback_failed"] == [{"irq": 61, "value": "1", "error": "[Errno 5] refused"}]
    assert str(err.value).endswith("; rollback FAILED for IRQs 61 ([Errno 5] refused)")
    assert seed.affinity(61) == "161" and seed.affinity(60) == "0"


def test_managed_refusals_are_warned_with_the_value_read_back_and_recorded_for_this_boot(seed):
    def write(path, text):
        if "/irq/63/" in path or "/irq/66/" in path:
            raise OSError(errno.EPERM if "/63/" in path else errno.EIO, "no")
        with open(path, "w") as handle:
            handle.write(text)

    plan = apply_plan(plan_affinity(*_state(seed), cpus="160-170"), procfs=seed.proc, write=write)
    assert [w for w in plan.warnings if "kernel-managed" in w] == [
        "IRQ 63 (%s) is kernel-managed: writing 163 failed with EPERM; it reads back 3" % (SEED_NAME % 3),
        "IRQ 66 (%s) is kernel-managed: writing 166 failed with EIO; it reads back 6" % (SEED_NAME % 6),
    ]
    record = json.load(open(os.path.join(seed.root, "run/gpunode/irq-affinity-refused.json")))
    assert record == {"boot_id": None, "irqs": {
        "63": {"name": SEED_NAME % 3, "value": "163", "errno": "EPERM"},
        "66": {"name": SEED_NAME % 6, "value": "166", "errno": "EIO"}}}


# ------------------------------------------------------------------ the refusal record

def test_the_record_adds_to_this_boots_entries_sorted_with_modes(seed):
    os.makedirs(os.path.join(seed.proc, "sys/kernel/random"))
    with open(os.path.join(seed.proc, "sys/kernel/random/boot_id"), "w") as handle:
        handle.write("b1\n")
    assert record_refusals([(70, "q10", "170", "EIO")], procfs=seed.proc) is None
    assert record_refusals([(9, "q0", "1", "EPERM"), (70, "q10b", "171", "EPERM")], procfs=seed.proc) is None
    path = os.path.join(seed.root, "run/gpunode/irq-affinity-refused.json")
    text = open(path).read()
    assert json.loads(text) == {"boot_id": "b1", "irqs": {
        "70": {"name": "q10b", "value": "171", "errno": "EPERM"}, "9": {"name": "q0", "value": "1", "errno": "EPERM"}}}
    assert text.index('"70"') < text.index('"9"') and text.endswith("}\n")   # keys sorted as text, one newline
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o755"
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")] == []


def test_a_record_that_cannot_be_written_is_a_warning_and_leaves_no_temporary_file(seed, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be\n")
    path = str(blocked / "refused.json")
    warning = record_refusals([(63, "q3", "163", "EIO")], procfs=seed.proc, path=path)
    assert warning.startswith("could not remember the refused IRQs in %s (" % path)
    assert warning.endswith("): check mode will plan them again")
    target_dir = tmp_path / "ro"
    target_dir.mkdir()
    os.mkdir(str(target_dir / "refused.json"))                       # rename onto a directory fails
    warning = record_refusals([(63, "q3", "163", "EIO")], procfs=seed.proc, path=str(target_dir / "refused.json"))
    assert warning is not None and "Is a directory" in warning
    assert sorted(os.listdir(str(target_dir))) == ["refused.json"]


# ------------------------------------------------------------------ restore_pins

def test_restore_pins_puts_back_what_a_run_moved_newest_first_and_updates_the_result(seed):
    seed.set_affinity(62, [162])
    before = seed.all_affinities()
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    moved = [i["irq"] for i in result["irqs"] if i["status"] == "changed"]
    assert moved == [60, 61, 63, 64, 65, 66, 67, 68, 69, 70]
    back = restore_pins(result["irqs"], procfs=seed.proc)
    assert back == {"restored": moved[::-1], "failed": [],
                    "summary": "restored IRQs %s to their previous affinity" % ", ".join(str(i) for i in moved[::-1])}
    assert seed.all_affinities() == before
    items = dict((i["irq"], i) for i in result["irqs"])
    assert (items[60]["status"], items[60]["after"]) == ("unchanged", "0")
    assert items[62]["status"] != "changed" and seed.affinity(62) == "162"
    assert items[59]["status"] == "unchanged"


def test_restore_pins_names_what_it_could_not_put_back_and_leaves_its_status(seed):
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    items = dict((i["irq"], i) for i in result["irqs"])
    items[61]["before"] = None                                      # unreadable before: never written back
    seed.break_irq(64)
    back = restore_pins(result["irqs"], procfs=seed.proc)
    failed = dict((f["irq"], f) for f in back["failed"])
    assert sorted(failed) == [61, 64]
    assert failed[61] == {"irq": 61, "value": None, "error": "its previous affinity could not be read; left at 161"}
    assert failed[64]["value"] == "4" and "Is a directory" in failed[64]["error"]
    assert back["summary"].startswith("rollback FAILED for IRQs 64 (")
    assert 61 not in back["restored"] and 60 in back["restored"]
    assert (items[61]["status"], items[61]["after"]) == ("changed", "161")
    assert (items[60]["status"], items[60]["after"]) == ("unchanged", "0")


def test_restore_pins_with_nothing_moved(seed):
    assert restore_pins([{"irq": 60, "name": "x", "status": "unchanged", "before": "0", "after": "0"}],
                        procfs=seed.proc) == {"restored": [], "failed": [], "summary": "nothing had been changed"}


# ------------------------------------------------------------------ verify_pins

def test_verify_after_a_run_finds_nothing_and_names_each_kind_of_difference(seed):
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    for q in range(11):
        seed.set_affinity(60 + q, [160 + q], effective=[160 + q])
    assert verify_pins(result, procfs=seed.proc, sysfs=seed.sys) == {"mismatch": [], "unchangeable": [], "lagging": []}
    seed.set_affinity(61, [5], effective=[5])                           # moved back by someone
    seed.set_affinity(62, [162], effective=[0, 162])                    # effective not followed yet
    items = dict((i["irq"], i) for i in result["irqs"])
    items[63]["status"] = "unchangeable"
    seed.set_affinity(63, [3], effective=[3])
    del items[64]
    result["irqs"] = [i for i in result["irqs"] if i["irq"] != 64]
    out = verify_pins(result, procfs=seed.proc, sysfs=seed.sys)
    assert out == {
        "mismatch": ["61 %s: 5, planned 161" % (SEED_NAME % 1), "64 %s: not in the plan" % (SEED_NAME % 4)],
        "unchangeable": ["63 %s: kernel-managed, left at 3" % (SEED_NAME % 3)],
        "lagging": ["62 %s: effective 0,162, set 162" % (SEED_NAME % 2)],
    }


def test_verify_leaves_out_control_irqs_and_an_effective_inside_the_set_is_not_lagging(seed):
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    for q in range(11):
        seed.set_affinity(60 + q, [160 + q], effective=[160 + q])
    seed.set_affinity(59, [7], effective=[7])                           # the async IRQ is not a queue
    seed.set_affinity(65, [165], effective=[165])
    assert verify_pins(result, procfs=seed.proc, sysfs=seed.sys)["mismatch"] == []
    assert verify_pins(result, procfs=seed.proc, sysfs=seed.sys)["lagging"] == []


# ------------------------------------------------------------------ explicit CPUs

@pytest.mark.parametrize("cpus, message, expected", [
    ("176", "CPU 176 does not exist on this machine", "a CPU in 0-175"),
    ("160,999", "CPU 999 does not exist on this machine", "a CPU in 0-175"),
])
def test_explicit_cpus_that_do_not_exist_are_refused(seed, cpus, message, expected):
    with pytest.raises(AffinityError) as err:
        plan_affinity(*_state(seed), cpus=cpus)
    assert str(err.value) == message
    assert err.value.details["option"] == "cpus"
    assert err.value.details["expected"] == expected


def test_explicit_cpus_in_exclude_cpus_are_refused_naming_both(seed):
    with pytest.raises(AffinityError) as err:
        plan_affinity(*_state(seed), cpus="160-170", exclude_cpus="165,3")
    assert str(err.value) == "CPU 165 is in exclude_cpus (3,165)"
    assert (err.value.details["option"], err.value.details["value"], err.value.details["expected"]) == (
        "cpus", 165, "CPUs outside exclude_cpus")


def test_an_offline_explicit_cpu_is_refused_naming_the_online_ones(tmp_path):
    spec = treegen.seed_vm()
    spec["offline"] = [170]
    tree = treegen.build_tree(tmp_path, spec)
    with pytest.raises(AffinityError) as err:
        plan_affinity(*_state(tree), cpus="160-170")
    assert str(err.value) == "CPU 170 is offline"
    assert (err.value.details["option"], err.value.details["value"], err.value.details["expected"]) == (
        "cpus", 170, "an online CPU in 0-169,171-175")


def test_explicit_cpus_off_the_nics_node_and_split_siblings_are_warned(gpu):
    # The NIC is on node 5: cores 60-71 and their siblings 156-167.
    plan = plan_affinity(*_state(gpu), cpus="60-63,10")
    assert "CPUs 10 are not NUMA-local to ens21f0np0 (local: 60-71,156-167)" in plan.warnings
    assert ("cpus split SMT sibling groups 10,106, 60,156, 61,157, 62,158, 63,159: their other threads can run "
            "workload next to the IRQs") in plan.warnings
    whole = plan_affinity(*_state(gpu), cpus="60-63,156-159")
    assert [w for w in whole.warnings if "NUMA-local" in w or "split SMT" in w] == []


def test_explicit_cpus_that_are_nohz_full_are_warned(tmp_path):
    spec = treegen.gpu_node()
    spec["nohz_full"] = [62, 63, 158, 159]
    spec["cmdline"] = "BOOT_IMAGE=/vmlinuz nohz_full=62-63,158-159"
    tree = treegen.build_tree(tmp_path, spec)
    plan = plan_affinity(*_state(tree), cpus="60-63,156-159")
    assert ("CPUs 62-63,158-159 are nohz_full or isolated with managed_irq: IRQs there disturb the isolated work"
            in plan.warnings)


# ------------------------------------------------------------------ what is stored and shown

@pytest.mark.parametrize("desired, stored", [
    ({"cpus": "160-170"}, {"cpus": "160-170"}),
    ({"cpus": [4, 5, 7]}, {"cpus": "4,5,7"}),
    ({"cpus": "4-7", "count": 3}, {"cpus": "4-7"}),
    ({"count": "3"}, {"count": 3}),
    ({"count": 0}, {}),
    ({"cpus": "", "count": 2, "exclude_cpus": [0, 1]}, {"count": 2, "exclude_cpus": "0,1"}),
    ({"cpus": [], "exclude_cpus": ""}, {}),
    ({"rps_cpus": "8-11"}, {"rps_cpus": "8-11"}),
    ({"rps_cpus": []}, {}),
])
def test_the_stored_desired_state_names_the_nic_by_address_and_keeps_only_what_was_asked(desired, stored):
    expected = {"pci_address": "0000:00:07.0", "numa_local": True, "whole_cores": True, "allow_irqbalance": False,
                "strict": False}
    expected.update(stored)
    assert stored_desired_state(desired, "0000:00:07.0") == expected


def test_the_stored_policy_flags_are_booleans_and_none_takes_the_default():
    stored = stored_desired_state({"numa_local": 0, "whole_cores": None, "allow_irqbalance": "yes", "strict": 1},
                                  "0000:c1:00.0")
    assert stored == {"pci_address": "0000:c1:00.0", "numa_local": False, "whole_cores": True,
                      "allow_irqbalance": True, "strict": True}


def test_the_plan_diff_is_an_aligned_table_per_irq_with_unknown_shown_as_a_question_mark(seed):
    plan = plan_affinity(*_state(seed), cpus="160-170")
    plan.items[1].before = None
    diff = plan.diff()
    width = len(SEED_NAME % 10)
    before, after = diff["before"].splitlines(), diff["after"].splitlines()
    assert before[0] == "%-6s %-*s %-6s %s" % ("IRQ", width, "NAME", "QUEUE", "smp_affinity_list")
    assert before[1] == "59     %-*s -      0" % (width, "mlx5_async0@pci:0000:00:07.0")
    assert before[2] == "60     %-*s 0      ?" % (width, SEED_NAME % 0)
    assert after[2] == "60     %-*s 0      160" % (width, SEED_NAME % 0)
    assert after[12] == "70     %-*s 10     170" % (width, SEED_NAME % 10)
    assert len(before) == len(after) == 13
    assert diff["before_header"] == diff["after_header"] == "ens7 (0000:00:07.0) IRQ affinity"


def test_a_plan_item_as_a_dict_has_cpu_lists_or_none():
    item = PlanItem(61, "q1", "queue", 1, "rx", [1], [161, 162], None, "would_change")
    assert item.as_dict() == {"irq": 61, "name": "q1", "kind": "queue", "queue": 1, "before": "1",
                              "after": "161-162", "effective": None, "status": "would_change"}
    item = PlanItem(59, "async", "control", None, None, None, None, [0, 2], "unchanged")
    assert item.as_dict() == {"irq": 59, "name": "async", "kind": "control", "queue": None, "before": None,
                              "after": None, "effective": "0,2", "status": "unchanged"}
