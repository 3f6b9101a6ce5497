# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nic_irq_persist (and nic_irq_affinity) with rps_cpus on a generated tree of the lab's gpu-node (issue 28 item 3):
check mode and --diff, the stored state, drift, a failed write or a later failed step putting back RPS masks and
pins, the option removed later, and state=absent."""

from __future__ import annotations

import errno
import json
import os

import pytest
from ansible.module_utils import basic

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
from ansible_collections.gpunode.tuning.plugins.module_utils._host import files as _persist
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_affinity, nic_irq_persist

pytestmark = pytest.mark.usefixtures("fake_exits_json")

STATE = "/etc/gpunode/nic-irq-affinity.json"
QUEUES = ["rx-%d" % q for q in range(6)]


def run(args, check=False, diff=False, module=nic_irq_persist):
    return modharness.run(module, args, check=check, diff=diff)


@pytest.fixture
def lab(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    os.makedirs(os.path.join(tree.root, "etc/network/if-up.d"))
    return tree


def args(tree, **kw):
    base = dict(pci_address="0000:42:01.0", count=4, rps_cpus="2-3", allow_irqbalance=True, recheck_interval="1min",
                procfs_path=tree.proc, sysfs_path=tree.sys)
    base.update(kw)
    return base


def under(tree, path):
    return os.path.join(tree.root, path.lstrip("/"))


def masks(tree):
    base = os.path.join(tree.sys, "class/net/enp66s1/queues")
    out = {}
    for name in QUEUES:
        with open(os.path.join(base, name, "rps_cpus")) as handle:
            out[name] = handle.read().strip()
    return out


def set_mask(tree, queue, text):
    with open(os.path.join(tree.sys, "class/net/enp66s1/queues/rx-%d/rps_cpus" % queue), "w") as handle:
        handle.write(text + "\n")


snapshot = treegen.snapshot_tree


def stored(tree):
    with open(under(tree, STATE)) as handle:
        return json.load(handle)


def test_check_mode_reports_every_queue_and_the_diff_and_writes_nothing(lab):
    before = snapshot(lab.root)
    kind, res = run(args(lab), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    assert snapshot(lab.root) == before
    assert res["rps"] == [{"queue": q, "before": "00", "after": "0c", "before_cpus": "", "after_cpus": "2-3",
                           "status": "would_change"} for q in range(6)]
    assert res["drift"][-6:] == ["rx-%d rps_cpus: none -> 2-3" % q for q in range(6)]
    rps_diff = [d for d in res["diff"] if d.get("before_header") == "enp66s1 (0000:42:01.0) RPS"]
    assert len(rps_diff) == 1 and "rx-0   00 (none)" in rps_diff[0]["before"] and "rx-0   0c (2-3)" in rps_diff[0]["after"]
    state = [d for d in res["diff"] if d.get("after_header") == STATE][0]
    assert json.loads(state["after"])["rps_cpus"] == "2-3"


def test_converge_stores_rps_then_idempotent_and_check_clean(lab):
    kind, res = run(args(lab))
    assert kind is Exit and res["changed"] is True and res["verified"] is True, res
    assert masks(lab) == dict((q, "0c") for q in QUEUES)
    assert [i["status"] for i in res["rps"]] == ["changed"] * 6
    assert stored(lab)["rps_cpus"] == "2-3" and "interface" not in stored(lab)
    kind, res = run(args(lab))
    assert kind is Exit and res["changed"] is False and [i["status"] for i in res["rps"]] == ["unchanged"] * 6
    set_mask(lab, 2, "00")                                  # a queue lost its mask (driver reset): drift
    kind, res = run(args(lab), check=True)
    assert kind is Exit and res["changed"] is True and res["drift"] == ["rx-2 rps_cpus: none -> 2-3"]


def test_a_failed_rps_write_puts_back_masks_and_pins_and_writes_no_file(lab, monkeypatch):
    before, pins, files = masks(lab), lab.all_affinities(), snapshot(lab.root)
    real = _irq_affinity.write_kernel_file

    def refuse_rx3(path, text):
        if path.endswith("/rx-3/rps_cpus"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real(path, text)

    monkeypatch.setattr(_irq_affinity, "write_kernel_file", refuse_rx3)
    kind, res = run(args(lab))
    assert kind is Fail and "rx-3 failed: [EINVAL]" in res["msg"] and "put back" in res["msg"], res["msg"]
    assert res["rps_rolled_back"] == [2, 1, 0] and res["pins_rolled_back"] and res["changed"] is False
    assert masks(lab) == before and lab.all_affinities() == pins and snapshot(lab.root) == files


def test_a_failed_file_write_after_rps_puts_the_masks_back_too(lab, monkeypatch):
    before, pins = masks(lab), lab.all_affinities()
    real = _persist.write_atomic

    def full_disk(path, data, mode):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_persist, "write_atomic", full_disk)
    kind, res = run(args(lab))
    monkeypatch.setattr(_persist, "write_atomic", real)
    assert kind is Fail and "No space left" in res["msg"] and "RPS: RPS of rx-5" in res["msg"], res["msg"]
    assert res["rps_rolled_back"] == [5, 4, 3, 2, 1, 0] and res["rps_rollback_failed"] == [] and res["changed"] is False
    assert masks(lab) == before and lab.all_affinities() == pins


def test_the_option_left_out_later_sets_our_queues_back_to_0(lab, monkeypatch):
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    run(args(lab))
    set_mask(lab, 5, "f0")                                  # someone else's since
    kind, res = run(args(lab, rps_cpus=""), check=True)
    assert kind is Exit and res["changed"] is True and masks(lab)["rx-0"] == "0c"
    assert [i["status"] for i in res["rps"]] == ["would_change"] * 5 + ["kept"]
    kind, res = run(args(lab, rps_cpus=""))
    assert kind is Exit and res["changed"] is True, res
    assert masks(lab) == dict([(q, "00") for q in QUEUES[:5]] + [("rx-5", "f0")])
    assert "rps_cpus" not in stored(lab)
    assert any("rx-5 (4-7)" in w and "not the mask this collection set" in w for w in warned), warned
    kind, res = run(args(lab, rps_cpus=""))                 # nothing stored any more: RPS is not ours
    assert kind is Exit and res["changed"] is False and res["rps"] == [] and masks(lab)["rx-5"] == "f0"


def test_absent_sets_our_queues_back_to_0_check_mode_first(lab):
    run(args(lab))
    kind, res = run(dict(state="absent", procfs_path=lab.proc, sysfs_path=lab.sys), check=True, diff=True)
    assert kind is Exit and res["changed"] is True and masks(lab) == dict((q, "0c") for q in QUEUES)
    assert [(i["queue"], i["before"], i["after"], i["status"]) for i in res["rps"]] == [
        (q, "0c", "00", "would_change") for q in range(6)]
    assert any(d.get("before_header") == "enp66s1 (0000:42:01.0) RPS" for d in res["diff"])
    kind, res = run(dict(state="absent", procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is True
    assert masks(lab) == dict((q, "00") for q in QUEUES) and not os.path.exists(under(lab, STATE))
    kind, res = run(dict(state="absent", procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is False and res["rps"] == []


def test_absent_whose_file_removal_fails_puts_the_masks_back(lab, monkeypatch):
    run(args(lab))

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_persist.os, "unlink", refuse)
    kind, res = run(dict(state="absent", procfs_path=lab.proc, sysfs_path=lab.sys))
    monkeypatch.undo()
    assert kind is Fail and "RPS: RPS of rx-5" in res["msg"] and res["rps_rolled_back"] == [5, 4, 3, 2, 1, 0], res
    assert masks(lab) == dict((q, "0c") for q in QUEUES) and stored(lab)["rps_cpus"] == "2-3"


@pytest.mark.parametrize("value,word", [("2-3;reboot", "is not a CPU list"), ("2-3\n0", "control character"),
                                        ("9", "CPU 9 does not exist"), (["2", "x"], "rps_cpus")])
def test_bad_rps_cpus_fail_naming_the_value_and_change_nothing(lab, value, word):
    before = snapshot(lab.root)
    affinity_args = dict(pci_address="0000:42:01.0", cpus="4-7", rps_cpus=value, allow_irqbalance=True,
                         procfs_path=lab.proc, sysfs_path=lab.sys)
    for module, module_args in ((nic_irq_persist, args(lab, rps_cpus=value)), (nic_irq_affinity, affinity_args)):
        kind, res = run(module_args, module=module)
        assert kind is Fail and word in res["msg"] and res["changed"] is False, res
        assert res.get("option", "").startswith("rps_cpus"), res
    assert snapshot(lab.root) == before


def test_nic_irq_affinity_takes_rps_cpus_through_the_same_code(lab):
    kind, res = run(dict(pci_address="0000:42:01.0", cpus="4-7", rps_cpus=[2, 3], allow_irqbalance=True,
                         procfs_path=lab.proc, sysfs_path=lab.sys), diff=True, module=nic_irq_affinity)
    assert kind is Exit and res["changed"] is True and masks(lab) == dict((q, "0c") for q in QUEUES)
    assert [d["before_header"] for d in res["diff"]] == ["enp66s1 (0000:42:01.0) IRQ affinity",
                                                         "enp66s1 (0000:42:01.0) RPS"]
    assert "rps_diff" not in res
