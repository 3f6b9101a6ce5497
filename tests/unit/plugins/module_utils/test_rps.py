# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""RPS (issue 28 item 3): the rps_cpus mask format, plan/apply/rollback on generated sysfs trees, the shared
run_desired_state path, the boot CLI, and where the diagnosis suggests RPS."""

from __future__ import annotations

import errno
import io
import json
import os
import random

import pytest
import yaml

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli
from ansible_collections.gpunode.tuning.plugins.module_utils._report import preflight as _preflight
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import rps as _rps
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet import verdict as _softnet_verdict
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import release_rps, run_desired_state, verify_pins
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

PCI = "0000:42:01.0"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


@pytest.fixture
def lab(tmp_path):
    spec = treegen.lab_virtio()
    spec["irqbalance"]["running"] = False
    return treegen.build_tree(tmp_path / "lab", spec)


def rps_file(tree, queue, iface="enp66s1"):
    return os.path.join(tree.sys, "class/net", iface, "queues", "rx-%d" % queue, "rps_cpus")


def masks(tree, iface="enp66s1"):
    base = os.path.join(tree.sys, "class/net", iface, "queues")
    out = {}
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name, "rps_cpus")
        if name.startswith("rx-") and os.path.isfile(path):
            with open(path) as handle:
                out[name] = handle.read()
    return out


def set_mask(tree, queue, text, iface="enp66s1"):
    with open(rps_file(tree, queue, iface), "w") as handle:
        handle.write(text + "\n")


def desired(**kw):
    base = dict(pci_address=PCI, cpus="4-7", rps_cpus="2-3")
    base.update(kw)
    return base


# ------------------------------------------------------------ the format ---

@pytest.mark.parametrize("cpus,ncpus,text", [
    ([], 8, "00"),                                            # lab_virtio's rx queues as the kernel shows them
    ([2, 3], 8, "0c"),
    ([0], 1, "1"),
    ([0, 31], 32, "80000001"),
    ([32], 33, "1,00000000"),
    (list(range(72)), 72, "ff,ffffffff,ffffffff"),
    ([0, 1151], 1152, "80000000," + "00000000," * 34 + "00000001"),
    (list(range(1120, 1152)), 1152, "ffffffff," + ",".join(["00000000"] * 35)),
])
def test_the_mask_is_the_kernels_text_and_round_trips(cpus, ncpus, text):
    assert _rps.format_rps_mask(cpus, ncpus) == text
    assert _rps.parse_rps_mask(text, ncpus) == cpus
    assert text == treegen.cpumask(cpus, ncpus)              # an independent implementation agrees


def test_round_trip_on_random_sets_up_to_1152_cpus():
    rnd = random.Random(28)
    for dummy in range(200):
        ncpus = rnd.choice([1, 7, 8, 31, 32, 33, 64, 65, 176, 1152])
        cpus = sorted(rnd.sample(range(ncpus), rnd.randint(0, min(ncpus, 40))))
        text = _rps.format_rps_mask(cpus, ncpus)
        assert len(text.split(",")) == (ncpus + 31) // 32
        assert _rps.parse_rps_mask(text, ncpus) == cpus
        assert _rps.format_rps_mask(_rps.parse_rps_mask(text, ncpus), ncpus) == text


@pytest.mark.parametrize("text", ["zz", "1,2\nx", "100", "1,00000000,00000000"])
def test_a_mask_that_does_not_fit_is_refused_naming_it(text):
    with pytest.raises(_rps.RpsError) as exc:
        _rps.parse_rps_mask(text, 8)
    assert str(exc.value).startswith("rps_cpus %r: " % text) and exc.value.details["value"] == text


# ----------------------------------------------------------- validation ---

@pytest.mark.parametrize("spec_kw,value,message", [
    ({}, "9", "CPU 9 does not exist"),
    ({"offline": [3]}, "2-3", "CPU 3 is offline"),
    ({"isolated": [2, 3]}, "2-3", "isolcpus or nohz_full"),
    ({"nohz_full": [3]}, [2, 3], "isolcpus or nohz_full"),
    ({}, "3-1", "3-1"),
    ({}, "0-1:0/2", "selects no CPU"),
])
def test_bad_rps_cpus_are_refused_naming_the_value_before_any_write(tmp_path, spec_kw, value, message):
    spec = treegen.lab_virtio()
    spec["irqbalance"]["running"] = False
    spec.update(spec_kw)
    tree = treegen.build_tree(tmp_path / "t", spec)
    before, pins = masks(tree), tree.all_affinities()
    with pytest.raises(AffinityError) as exc:
        run_desired_state(desired(rps_cpus=value), procfs=tree.proc, sysfs=tree.sys)
    assert message in str(exc.value) and exc.value.details["value"] == value, (str(exc.value), exc.value.details)
    assert exc.value.details["option"] == "rps_cpus" and exc.value.details["expected"]
    assert masks(tree) == before and tree.all_affinities() == pins


def test_a_kernel_without_rps_files_is_named(lab):
    os.remove(rps_file(lab, 2))
    with pytest.raises(AffinityError) as exc:
        run_desired_state(desired(), check_mode=True, procfs=lab.proc, sysfs=lab.sys)
    assert "rx-2" in str(exc.value) and "CONFIG_RPS" in str(exc.value)


# ------------------------------------------------- plan, apply, rollback ---

def test_check_mode_is_the_exact_plan_and_writes_nothing(lab):
    before, pins = masks(lab), lab.all_affinities()
    res = run_desired_state(desired(), check_mode=True, procfs=lab.proc, sysfs=lab.sys)
    assert masks(lab) == before and lab.all_affinities() == pins
    assert res["changed"] is True
    assert res["rps"] == [{"queue": q, "before": "00", "after": "0c", "before_cpus": "", "after_cpus": "2-3",
                           "status": "would_change"} for q in range(6)]
    assert res["rps_diff"]["before_header"] == "enp66s1 (0000:42:01.0) RPS"
    assert "rx-5   00 (none)" in res["rps_diff"]["before"] and "rx-5   0c (2-3)" in res["rps_diff"]["after"]


def test_apply_sets_every_rx_queue_then_converges(lab):
    res = run_desired_state(desired(), procfs=lab.proc, sysfs=lab.sys)
    assert masks(lab) == dict(("rx-%d" % q, "0c\n") for q in range(6))
    assert [i["status"] for i in res["rps"]] == ["changed"] * 6 and res["changed"] is True
    assert verify_pins(res, procfs=lab.proc, sysfs=lab.sys)["mismatch"] == []
    again = run_desired_state(desired(), procfs=lab.proc, sysfs=lab.sys)
    assert again["changed"] is False and [i["status"] for i in again["rps"]] == ["unchanged"] * 6
    assert again["rps_diff"]["before"] == again["rps_diff"]["after"]
    # A queue moved by hand is drift, and the read-back names it.
    set_mask(lab, 4, "01")
    assert verify_pins(again, procfs=lab.proc, sysfs=lab.sys)["mismatch"] == ["enp66s1 rx-4 rps_cpus: 0, planned 2-3"]
    check = run_desired_state(desired(), check_mode=True, procfs=lab.proc, sysfs=lab.sys)
    assert [i["queue"] for i in check["rps"] if i["status"] == "would_change"] == [4]


def test_without_rps_cpus_rps_is_left_alone(lab):
    set_mask(lab, 1, "f0")
    before = masks(lab)
    for value in (None, "", []):
        res = run_desired_state(desired(rps_cpus=value), procfs=lab.proc, sysfs=lab.sys)
        assert res["rps"] == [] and res["rps_diff"] is None
    assert masks(lab) == before


def test_rps_cpus_on_the_irq_cpus_warn(lab):
    res = run_desired_state(desired(rps_cpus="3-4"), check_mode=True, procfs=lab.proc, sysfs=lab.sys)
    assert any("include the IRQ CPUs 4" in w for w in res["warnings"]), res["warnings"]


def refusing(queue):
    """The kernel's EINVAL for one queue's rps_cpus (as for a mask of isolated CPUs only), real writes otherwise."""
    def write(path, text):
        if path.endswith("/rx-%d/rps_cpus" % queue):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        with open(path, "w") as handle:
            handle.write(text)
    return write


def test_a_failed_write_halfway_puts_back_the_masks_and_the_pins(lab):
    pins = lab.all_affinities()
    set_mask(lab, 0, "01")
    before = masks(lab)
    with pytest.raises(AffinityError) as exc:
        run_desired_state(desired(), procfs=lab.proc, sysfs=lab.sys, write=refusing(3))
    details = exc.value.details
    assert "rx-3 failed: [EINVAL]" in str(exc.value) and "RPS of rx-2, rx-1, rx-0 put back" in str(exc.value), str(exc.value)
    assert "pins: restored IRQs" in str(exc.value)
    assert details["rps_rolled_back"] == [2, 1, 0] and details["rps_rollback_failed"] == []
    assert details["pins_rolled_back"] and details["pins_rollback_failed"] == [] and details["changed"] is False
    assert masks(lab) == before                                     # rx-0 back to 01, rx-1/rx-2 to 00
    assert lab.all_affinities() == pins                             # and every IRQ where it was


def test_an_rps_file_that_cannot_be_read_fails_the_plan_before_any_write(lab):
    pins, before = lab.all_affinities(), masks(lab)
    path = rps_file(lab, 3)
    os.remove(path)
    os.mkdir(path)
    del before["rx-3"]
    with pytest.raises(AffinityError) as exc:
        run_desired_state(desired(), procfs=lab.proc, sysfs=lab.sys)
    assert "rx-3" in str(exc.value) and "not readable" in str(exc.value)
    assert masks(lab) == before and lab.all_affinities() == pins


def test_release_resets_only_the_queues_that_carry_the_stored_mask(lab):
    run_desired_state(desired(), procfs=lab.proc, sysfs=lab.sys)
    set_mask(lab, 5, "f0")                                          # someone else's mask since
    check = run_desired_state(desired(rps_cpus=None), check_mode=True, procfs=lab.proc, sysfs=lab.sys,
                              rps_release=(PCI, "2-3"))
    assert [(i["queue"], i["status"], i["after"]) for i in check["rps"]] == [
        (0, "would_change", "00"), (1, "would_change", "00"), (2, "would_change", "00"), (3, "would_change", "00"),
        (4, "would_change", "00"), (5, "kept", "f0")]
    assert masks(lab)["rx-0"] == "0c\n"
    res = run_desired_state(desired(rps_cpus=None), procfs=lab.proc, sysfs=lab.sys, rps_release=(PCI, "2-3"))
    assert masks(lab) == dict([("rx-%d" % q, "00\n") for q in range(5)] + [("rx-5", "f0\n")])
    assert any("rx-5 (4-7)" in w and "not the mask this collection set" in w for w in res["warnings"]), res["warnings"]
    # Another NIC's stored mask is not this NIC's business: named, nothing written.
    other = run_desired_state(desired(rps_cpus=None), procfs=lab.proc, sysfs=lab.sys, rps_release=("0000:00:03.0", "1"))
    assert other["rps"] == [] and any("0000:00:03.0" in w for w in other["warnings"])
    # release_rps (state=absent) is the same plan through the PCI address alone.
    set_mask(lab, 0, "0c")
    out = release_rps(PCI, "2-3", procfs=lab.proc, sysfs=lab.sys)
    assert out["interface"] == "enp66s1" and [i["queue"] for i in out["rps"] if i["status"] == "changed"] == [0]
    assert masks(lab)["rx-0"] == "00\n"


def test_more_than_32_cpus_are_written_as_the_kernel_prints_them(tmp_path):
    tree = treegen.build_tree(tmp_path / "big", treegen.large_numa(ncpus=1152, nirqs=80, queues=4))
    want = [0, 1, 33, 600, 1151]
    res = run_desired_state({"pci_address": "0000:81:00.0", "cpus": "8-11", "rps_cpus": "0-1,33,600,1151"},
                            procfs=tree.proc, sysfs=tree.sys)
    text = treegen.cpumask(want, 1152)
    assert len(text.split(",")) == 36
    assert masks(tree, "eth0") == dict(("rx-%d" % q, text + "\n") for q in range(4))
    assert [i["after"] for i in res["rps"]] == [text] * 4 and res["rps"][0]["before"] == treegen.cpumask([], 1152)
    assert read_topology(tree.sys, tree.proc)["possible"][-1] + 1 == _rps.nr_cpu_ids(read_topology(tree.sys, tree.proc))


# ------------------------------------------------------------- boot CLI ---

def test_the_boot_cli_applies_rps_from_the_state_file_also_on_new_queues(lab, tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"pci_address": PCI, "cpus": "4-7", "rps_cpus": "2-3", "procfs_path": lab.proc,
                                "sysfs_path": lab.sys}))
    out = io.StringIO()
    assert _irq_pin_cli.main([str(path)], out=out) == 0
    assert masks(lab) == dict(("rx-%d" % q, "0c\n") for q in range(6))
    assert "enp66s1 rx-0 rps_cpus: 00 -> 0c (changed)" in out.getvalue()
    out = io.StringIO()
    assert _irq_pin_cli.main(["--quiet", str(path)], out=out) == 0 and out.getvalue() == ""
    # ethtool -L added a queue (RPS off on it): the re-check sets it, quietly only for what it changed.
    os.makedirs(os.path.dirname(rps_file(lab, 6)))
    set_mask(lab, 6, "00")
    out = io.StringIO()
    assert _irq_pin_cli.main(["--quiet", str(path)], out=out) == 0
    assert masks(lab)["rx-6"] == "0c\n" and "rx-6 rps_cpus: 00 -> 0c (changed)" in out.getvalue()


# ------------------------------------------------------------ diagnosis ---

def test_rps_is_suggested_only_for_packet_rate_saturation_and_names_the_role_variable():
    remedies = dict((name, remedy) for name, _title, _cond, remedy in _softnet_verdict.FINDINGS)
    assert [name for name, remedy in remedies.items() if "RPS" in remedy] == ["irq_cpus_saturated"]
    assert "nic_irq_pinning_rps_cpus" in remedies["irq_cpus_saturated"]
    assert "inter-CPU hop" in remedies["irq_cpus_saturated"]
    specs = yaml.safe_load(open(os.path.join(ROOT, "roles/nic_irq_pinning/meta/argument_specs.yml")))
    assert "nic_irq_pinning_rps_cpus" in specs["argument_specs"]["main"]["options"]
    # The contention fix of the preflight gate does not suggest it.
    contention = _preflight._softnet({"verdict": "contention", "reasons": ["x"], "findings": []})
    assert contention[0]["fix"] and "RPS" not in contention[0]["fix"] and "rps" not in contention[0]["fix"]
