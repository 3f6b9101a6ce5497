# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plan_affinity / apply_plan / run_desired_state / the boot CLI, writing real files of generated trees."""

from __future__ import annotations

import errno
import io
import json
import os

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import (
    apply_plan,
    run_desired_state,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError, plan_affinity
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology


def state(tree, **selector):
    return read_nic(selector or {}, procfs=tree.proc, sysfs=tree.sys), read_topology(tree.sys, tree.proc)


@pytest.fixture
def lab(tmp_path):
    spec = treegen.lab_virtio()
    spec["irqbalance"]["running"] = False
    return treegen.build_tree(tmp_path / "lab", spec)


def plan_map(plan):
    return dict((i.irq, (i.before, i.after, i.status)) for i in plan.items)


# ------------------------------------------------------------------ plan ---

def test_seed_article_explicit_cpus_one_queue_per_cpu_in_queue_order(seed):
    nic, topo = state(seed)
    plan = plan_affinity(nic, topo, cpus="160-170", exclude_cpus="0-159")
    assert [(i.irq, i.after) for i in plan.items if i.kind == "queue"] == [(60 + q, [160 + q]) for q in range(11)]
    assert [i.irq for i in plan.changes] == list(range(60, 71))
    assert plan_map(plan)[59] == ([0], [0], "unchanged")
    assert any("control IRQs left where they are: 59 mlx5_async0" in w for w in plan.warnings)
    # 160-170 split the sibling groups 160/72 ... : warned, not refused
    assert any("split SMT sibling groups" in w for w in plan.warnings)


def test_policy_on_seed_vm_takes_whole_cores_highest_first_and_rounds_up(seed):
    nic, topo = state(seed)
    plan = plan_affinity(nic, topo, exclude_cpus="0-81,88-169")
    assert plan.cpus == [82, 83, 84, 85, 86, 87, 170, 171, 172, 173, 174, 175]
    # core-first order: first threads 82..87, then their siblings 170..
    assert [i.after[0] for i in plan.items if i.kind == "queue"] == [82, 83, 84, 85, 86, 87, 170, 171, 172, 173, 174]
    assert any("rounded up to 12" in w for w in plan.warnings)
    assert any("no NUMA locality" in w for w in plan.warnings)


def test_policy_on_gpu_node_is_numa_local_then_nearest_node(gpu):
    nic, topo = state(gpu)
    plan = plan_affinity(nic, topo, count=8)
    assert plan.cpus == [68, 69, 70, 71, 164, 165, 166, 167]
    assert set(plan.cpus) <= set(topo["numa_nodes"][5])
    plan = plan_affinity(nic, topo, count=30, exclude_cpus="60-65,156-161")
    local = set(topo["numa_nodes"][5])
    assert len([c for c in plan.cpus if c in local]) == 12
    remote_nodes = set(topo["cpu_node"][c] for c in plan.cpus if c not in local)
    assert remote_nodes <= {4, 6, 7}                                     # same socket (distance 12), never 0-3
    assert any("not NUMA-local" in w for w in plan.warnings)
    # queues go to local CPUs first
    assert all(i.after[0] in local for i in plan.items if i.kind == "queue" and i.queue < 12)


def test_virtio_input_and_output_of_a_queue_share_one_cpu(lab):
    nic, topo = state(lab, interface="enp66s1")
    plan = plan_affinity(nic, topo, cpus="4-7")
    by_queue = {}
    for item in plan.items:
        if item.kind == "queue":
            by_queue.setdefault(item.queue, set()).add(item.after[0])
    assert all(len(v) == 1 for v in by_queue.values())
    # 6 queues on 4 CPUs ordered core-first (4, 6, 5, 7): round-robin with a warning
    assert [by_queue[q].pop() for q in range(6)] == [4, 6, 5, 7, 4, 6]
    assert any("6 queues but 4 CPUs" in w for w in plan.warnings)


def test_same_inputs_same_plan(gpu):
    nic, topo = state(gpu)
    first = plan_affinity(nic, topo, count=16, exclude_cpus="0-59").as_list()
    assert all(plan_affinity(nic, topo, count=16, exclude_cpus="0-59").as_list() == first for dummy in range(3))


@pytest.mark.parametrize("kwargs,message,value", [
    ({"cpus": "176"}, "CPU 176 does not exist", 176),
    ({"cpus": "5,9000"}, "beyond the limit", "5,9000"),
    ({"cpus": "160-170", "exclude_cpus": "165"}, "CPU 165 is in exclude_cpus", 165),
    ({"cpus": ""}, "cpus is empty", []),
    ({"cpus": [3, "x"]}, "is not a CPU number", "x"),
    ({"cpus": "3", "count": 2}, "give cpus or count", 2),
    ({"count": 0}, "not a positive integer", 0),
    ({"count": 200}, "only 176 CPUs are available", 200),
    ({"count": 20, "exclude_cpus": "0-81,88-169"}, "only 12 CPUs are available", 20),
    ({"count": 1, "exclude_cpus": "0-170"}, "only 0 CPUs are available", 1),     # whole cores: 171-175's siblings are excluded
    ({"exclude_cpus": "a-b"}, "exclude_cpus", "a-b"),
])
def test_bad_input_is_refused_naming_value(seed, kwargs, message, value):
    nic, topo = state(seed)
    with pytest.raises(AffinityError) as exc:
        plan_affinity(nic, topo, **kwargs)
    assert message in str(exc.value)
    assert exc.value.details["value"] == value
    assert exc.value.details["expected"]


def test_offline_cpu_is_refused(tmp_path):
    spec = treegen.lab_virtio()
    spec["offline"] = [6]
    tree = treegen.build_tree(tmp_path, spec)
    nic, topo = state(tree, interface="enp66s1")
    with pytest.raises(AffinityError) as exc:
        plan_affinity(nic, topo, cpus="4-7")
    assert "CPU 6 is offline" in str(exc.value) and exc.value.details["expected"].startswith("an online CPU in 0-5,7")


def test_no_queue_irqs_is_an_error(tmp_path):
    spec = treegen.lab_virtio()
    spec["nics"][1]["irqs"] = spec["nics"][1]["irqs"][:1]      # only virtio2-config
    tree = treegen.build_tree(tmp_path, spec)
    nic, topo = state(tree, interface="enp66s1")
    with pytest.raises(AffinityError) as exc:
        plan_affinity(nic, topo, cpus="4")
    assert exc.value.details["value"] == ["virtio2-config"]


@pytest.mark.parametrize("cmdline", ["root=/dev/vda isolcpus=managed_irq,domain,6-7", "root=/dev/vda isolcpus=6-7"])
def test_cpus_isolated_with_managed_irq_or_nohz_full_are_avoided_by_policy_and_warned_when_explicit(tmp_path, cmdline):
    spec = treegen.lab_virtio()
    spec["isolated"] = [6, 7]
    if "managed_irq" not in cmdline:
        spec["nohz_full"] = [6, 7]
    spec["cmdline"] = cmdline
    tree = treegen.build_tree(tmp_path, spec)
    nic, topo = state(tree, interface="enp66s1")
    assert plan_affinity(nic, topo, count=2).cpus == [4, 5]
    assert any("nohz_full or isolated with managed_irq" in w for w in plan_affinity(nic, topo, cpus="6-7").warnings)


def test_cpus_isolated_from_the_scheduler_only_stay_irq_candidates(tmp_path):
    """Seed 000's isolcpus recipe isolates the IRQ CPUs themselves (isolcpus=domain): the policy's plan before that
    boot (6-7, the highest local core) must be its plan after it, or the boot-time re-plan moves the pins (the lab's
    workload_fence scenario found it)."""
    spec = treegen.lab_virtio()
    tree = treegen.build_tree(tmp_path / "before", spec)
    before = plan_affinity(*state(tree, interface="enp66s1"), count=2)
    spec.update(isolated=[6, 7], cmdline="BOOT_IMAGE=/boot/vmlinuz root=UUID=x ro isolcpus=domain,6-7")
    tree = treegen.build_tree(tmp_path / "after", spec)
    after = plan_affinity(*state(tree, interface="enp66s1"), count=2)
    assert before.cpus == after.cpus == [6, 7]
    assert not any("isolated" in w for w in after.warnings)


def test_diff_is_a_readable_table(seed):
    nic, topo = state(seed)
    diff = plan_affinity(nic, topo, cpus="160-170").diff()
    assert diff["before"].splitlines()[2].split() == ["60", "mlx5_comp0@pci:0000:00:07.0", "0", "0"]
    assert diff["after"].splitlines()[2].split() == ["60", "mlx5_comp0@pci:0000:00:07.0", "0", "160"]
    assert diff["before"].splitlines()[1].split()[2] == "-"          # control IRQ has no queue


# ----------------------------------------------------------------- apply ---

def test_apply_writes_only_differences_then_is_idempotent(seed):
    seed.set_affinity(62, [162])                         # queue 2 already right
    nic, topo = state(seed)
    plan = plan_affinity(nic, topo, cpus="160-170")
    assert 62 not in [i.irq for i in plan.changes]
    untouched = os.stat(os.path.join(seed.irq_dir(62), "smp_affinity_list")).st_mtime_ns
    apply_plan(plan, procfs=seed.proc)
    assert [seed.affinity(60 + q) for q in range(11)] == [str(160 + q) for q in range(11)]
    assert seed.affinity(59) == "0"
    assert os.stat(os.path.join(seed.irq_dir(62), "smp_affinity_list")).st_mtime_ns == untouched
    assert set(i.status for i in plan.items if i.kind == "queue") == {"changed", "pending"}
    again = plan_affinity(*state(seed), cpus="160-170")
    assert again.changes == []
    # effective_affinity_list still shows the old CPUs: pending, not rewritten
    assert set(i.status for i in again.items if i.kind == "queue") == {"pending"}


def test_check_mode_writes_nothing(seed):
    before = seed.all_affinities()
    result = run_desired_state({"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)
    assert seed.all_affinities() == before
    assert result["changed"] is True
    assert [(i["irq"], i["before"], i["after"], i["status"]) for i in result["irqs"]][:3] == [
        (59, "0", "0", "unchanged"), (60, "0", "160", "would_change"), (61, "1", "161", "would_change")]


def test_failed_write_restores_what_this_run_changed(seed):
    seed.break_irq(65)                                       # writing it fails with EISDIR, even as root
    before = seed.all_affinities()
    with pytest.raises(AffinityError) as exc:
        run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    details = exc.value.details
    assert (details["irq"], details["value"], details["errno"]) == (65, "165", errno.EISDIR)
    assert details["rolled_back"] == [64, 63, 62, 61, 60]
    assert "IRQ 65" in str(exc.value) and "165" in str(exc.value)
    assert seed.all_affinities() == before


@pytest.mark.parametrize("code", [errno.EIO, errno.EPERM])
def test_managed_irq_refusal_is_unchangeable_not_an_error(seed, code):
    def write(path, text):
        if "/irq/63/" in path:
            raise OSError(code, os.strerror(code))
        with open(path, "w") as handle:
            handle.write(text)

    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys, write=write)
    status = dict((i["irq"], i["status"]) for i in result["irqs"])
    assert status[63] == "unchangeable" and status[64] == "changed"
    assert seed.affinity(63) == "3" and seed.affinity(64) == "164"
    assert any("kernel-managed" in w for w in result["warnings"])


def test_strict_turns_a_managed_irq_into_rollback_and_error(seed):
    def write(path, text):
        if "/irq/63/" in path:
            raise OSError(errno.EIO, "Input/output error")
        with open(path, "w") as handle:
            handle.write(text)

    before = seed.all_affinities()
    with pytest.raises(AffinityError) as exc:
        run_desired_state({"cpus": "160-170", "strict": True}, procfs=seed.proc, sysfs=seed.sys, write=write)
    assert exc.value.details["irq"] == 63
    assert seed.all_affinities() == before


def test_active_irqbalance_blocks_unless_allowed(tmp_path):
    tree = treegen.build_tree(tmp_path, treegen.lab_virtio())       # irqbalance running, systemd present
    before = tree.all_affinities()
    with pytest.raises(AffinityError) as exc:
        run_desired_state({"interface": "enp66s1", "cpus": "4-7"}, procfs=tree.proc, sysfs=tree.sys, run=tree.run)
    assert "irqbalance is active" in str(exc.value)
    assert tree.all_affinities() == before
    result = run_desired_state({"interface": "enp66s1", "cpus": "4-7", "allow_irqbalance": True},
                               procfs=tree.proc, sysfs=tree.sys, run=tree.run)
    assert result["changed"] and any("irqbalance is active (allowed)" in w for w in result["warnings"])


def test_unknown_desired_key_is_refused(lab):
    with pytest.raises(AffinityError) as exc:
        run_desired_state({"interfce": "x"}, procfs=lab.proc, sysfs=lab.sys)
    assert exc.value.details["value"] == ["interfce"]


# ------------------------------------------------------------------- CLI ---

def test_boot_cli_applies_then_reports_no_change(lab, tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"pci_address": "0000:42:01.0", "cpus": "4-7", "procfs_path": lab.proc, "sysfs_path": lab.sys}))
    out = io.StringIO()
    assert _irq_pin_cli.main([str(path)], out=out) == 0
    assert "enp66s1 (0000:42:01.0): changed, target CPUs 4-7" in out.getvalue()
    assert lab.affinity(41) == "4" and lab.affinity(42) == "4" and lab.affinity(43) == "6"
    out = io.StringIO()
    assert _irq_pin_cli.main(["--check", str(path)], out=out) == 0
    assert "no change" in out.getvalue()


def test_boot_cli_waits_a_bounded_time_for_a_missing_nic_then_fails(lab, tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"interface": "eth7", "cpus": "4", "procfs_path": lab.proc, "sysfs_path": lab.sys}))
    clock = iter(range(100))
    sleeps = []
    out = io.StringIO()
    code = _irq_pin_cli.main(["--wait", "3", str(path)], out=out, sleep=sleeps.append, clock=lambda: next(clock))
    assert code == 1 and "eth7" in out.getvalue() and len(sleeps) == 2      # clock 0 -> deadline 3: retried at 1 and 2


@pytest.mark.parametrize("argv,code", [(["--bogus"], 2), (["/nonexistent.json"], 1), (["--wait", "x"], 2)])
def test_boot_cli_usage_errors(argv, code):
    assert _irq_pin_cli.main(argv, out=io.StringIO()) == code


# ------------------------------------------ writes the kernel refuses ---

CAPTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "captures", "debugfs_irq")


def refusing(code, irqs):
    """The kernel's answer for managed IRQs (EIO before 6.12, EPERM since), real writes for the others."""
    def write(path, text):
        if any("/irq/%d/" % irq in path for irq in irqs):
            raise OSError(code, os.strerror(code))
        with open(path, "w") as handle:
            handle.write(text)
    return write


def converge_except(tree, irqs, cpus="160-170"):
    """Pin every queue IRQ of the seed NIC as the plan wants, except ``irqs``: a converged host with managed IRQs."""
    for q in range(11):
        if 60 + q not in irqs:
            tree.set_affinity(60 + q, [160 + q], effective=[160 + q])


@pytest.mark.parametrize("code", [errno.EIO, errno.EPERM])
def test_refused_write_reports_the_value_read_back_not_the_plan(seed, code):
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys, write=refusing(code, [63]))
    item = dict((i["irq"], i) for i in result["irqs"])[63]
    assert (item["status"], item["before"], item["after"]) == ("unchangeable", "3", "3")
    assert seed.affinity(63) == "3"
    assert any("IRQ 63" in w and "reads back 3" in w for w in result["warnings"])


def test_refusal_is_remembered_so_check_mode_on_a_converged_host_shows_no_drift(seed):
    record = os.path.join(seed.root, "run", "gpunode", "irq-affinity-refused.json")
    first = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys, write=refusing(errno.EIO, [63]))
    assert first["changed"] is True
    saved = json.load(open(record))
    assert saved["irqs"]["63"] == {"name": "mlx5_comp3@pci:0000:00:07.0", "value": "163", "errno": "EIO"}
    assert oct(os.stat(record).st_mode & 0o777) == "0o644"
    check = run_desired_state({"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)
    assert check["changed"] is False
    assert dict((i["irq"], i["status"]) for i in check["irqs"])[63] == "unchangeable"
    assert any("refused writing 163 to it earlier in this boot (EIO)" in w for w in check["warnings"])
    # a real run plans the same and does not try the refused IRQ again
    again = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys, write=refusing(errno.EIO, []))
    assert again["changed"] is False and seed.affinity(63) == "3"


def test_refusal_record_is_per_boot_and_per_irq_name(seed):
    os.makedirs(os.path.join(seed.proc, "sys/kernel/random"))
    boot_id = os.path.join(seed.proc, "sys/kernel/random/boot_id")
    with open(boot_id, "w") as handle:
        handle.write("1111\n")
    run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys, write=refusing(errno.EPERM, [63, 64]))
    assert sorted(_irq_affinity_refusals(seed)) == [63, 64]
    # IRQ 64 was refused while another action held that number (before a driver rebind): not this IRQ's record
    record = os.path.join(seed.root, "run", "gpunode", "irq-affinity-refused.json")
    saved = json.load(open(record))
    saved["irqs"]["64"]["name"] = "nvme0q3"
    json.dump(saved, open(record, "w"))
    statuses = dict((i["irq"], i["status"]) for i in run_desired_state(
        {"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)["irqs"])
    assert (statuses[63], statuses[64]) == ("unchangeable", "would_change")
    # after a reboot (new boot_id) nothing is remembered
    with open(boot_id, "w") as handle:
        handle.write("2222\n")
    statuses = dict((i["irq"], i["status"]) for i in run_desired_state(
        {"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)["irqs"])
    assert statuses[63] == "would_change"


def _irq_affinity_refusals(tree):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import read_refusals
    return read_refusals(tree.proc)


def test_check_mode_never_writes_the_refusal_record(seed):
    run_desired_state({"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)
    assert not os.path.exists(os.path.join(seed.root, "run", "gpunode"))


def managed_seed(tmp_path, managed, unmanaged=()):
    spec = treegen.seed_vm()
    for irq in spec["nics"][0]["irqs"]:
        if irq["irq"] in managed:
            irq["managed"] = True
        elif irq["irq"] in unmanaged:
            irq["managed"] = False
    return treegen.build_tree(tmp_path / "managed", spec)


def test_debugfs_managed_irq_is_unchangeable_before_any_write_in_check_and_real_runs(tmp_path):
    tree = managed_seed(tmp_path, managed=[63], unmanaged=[59, 60, 61, 62, 64, 65, 66, 67, 68, 69, 70])
    converge_except(tree, [63])
    written = []

    def write(path, text):
        written.append(path)
        with open(path, "w") as handle:
            handle.write(text)

    check = run_desired_state({"cpus": "160-170"}, check_mode=True, procfs=tree.proc, sysfs=tree.sys)
    assert check["changed"] is False
    item = dict((i["irq"], i) for i in check["irqs"])[63]
    assert (item["status"], item["before"], item["after"]) == ("unchangeable", "3", "3")
    assert any("IRQ 63" in w and "IRQD_AFFINITY_MANAGED" in w for w in check["warnings"])
    real = run_desired_state({"cpus": "160-170"}, procfs=tree.proc, sysfs=tree.sys, write=write)
    assert real["changed"] is False and written == [] and tree.affinity(63) == "3"
    assert real["irqs"] == check["irqs"]


def test_strict_refuses_a_debugfs_managed_irq_before_writing_anything(tmp_path):
    tree = managed_seed(tmp_path, managed=[65])
    before = tree.all_affinities()
    with pytest.raises(AffinityError) as exc:
        run_desired_state({"cpus": "160-170", "strict": True}, procfs=tree.proc, sysfs=tree.sys)
    assert exc.value.details["irq"] == 65 and exc.value.details["value"] == "165"
    assert "IRQD_AFFINITY_MANAGED" in str(exc.value) and "nothing was written" in str(exc.value)
    assert tree.all_affinities() == before


def test_missing_debugfs_is_unknown_and_does_not_stop_the_writes(seed):
    nic, dummy = state(seed)
    assert set(e["managed"] for e in nic["irqs"]) == {None}
    result = run_desired_state({"cpus": "160-170"}, procfs=seed.proc, sysfs=seed.sys)
    assert seed.affinity(63) == "163" and result["changed"] is True


@pytest.mark.parametrize("name,managed", [
    ("qemu_pci_msix_managed_58.txt", True),
    ("nvme_ir_msix_managed_138.txt", True),
    ("ioapic_unmanaged_8.txt", False),
])
def test_read_managed_on_captured_debugfs_files(tmp_path, name, managed):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_managed
    irqs = tmp_path / "sys" / "kernel" / "debug" / "irq" / "irqs"
    irqs.mkdir(parents=True)
    with open(os.path.join(CAPTURES, name)) as handle:
        (irqs / "42").write_text(handle.read())
    assert read_managed(str(tmp_path / "sys"), 42) is managed
    assert read_managed(str(tmp_path / "sys"), 43) is None               # no such IRQ file: unknown
    (irqs / "44").write_text("garbage\n")
    assert read_managed(str(tmp_path / "sys"), 44) is None               # not the debugfs layout: unknown


def test_rollback_never_writes_an_unknown_old_value(seed):
    nic, topo = state(seed)
    plan = plan_affinity(nic, topo, cpus="160-170")
    item = [i for i in plan.items if i.irq == 61][0]
    item.before = None                              # as read_irq_state returns for an unreadable or empty file
    seed.break_irq(65)
    written = []

    def write(path, text):
        written.append((path, text))
        with open(path, "w") as handle:
            handle.write(text)

    with pytest.raises(AffinityError) as exc:
        apply_plan(plan, procfs=seed.proc, write=write)
    assert not [t for p, t in written if t.strip() == ""]
    assert [f["irq"] for f in exc.value.details["rollback_failed"]] == [61]
    assert "previous affinity could not be read" in str(exc.value)
    assert exc.value.details["rolled_back"] == [64, 63, 62, 60]


def test_empty_or_unreadable_affinity_reads_as_unknown(seed):
    with open(os.path.join(seed.irq_dir(61), "smp_affinity_list"), "w") as handle:
        handle.write("\n")
    os.remove(os.path.join(seed.irq_dir(62), "smp_affinity_list"))
    nic, dummy = state(seed)
    affinity = dict((e["irq"], e["affinity"]) for e in nic["irqs"])
    assert affinity[61] is None and affinity[62] is None and affinity[63] == [3]
    result = run_desired_state({"cpus": "160-170"}, check_mode=True, procfs=seed.proc, sysfs=seed.sys)
    item = dict((i["irq"], i) for i in result["irqs"])[61]
    assert (item["before"], item["after"], item["status"]) == (None, "161", "would_change")
