# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nic_irq_persist on a generated tree of the lab's gpu-node: the pins, every file of the
persistence (written under the tree's root, never the host's), check mode, drift,
idempotence, a failed write rolled back, a shared lib dir, and state=absent.

The installed entry point is then run in an isolated Python against the same tree,
so a library file missing from the import closure fails here."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from ansible.module_utils import basic

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host import files as _persist
from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import PIN_LOCK
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_persist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import PersistError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import Systemd
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import Target
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import persist_run
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.persist import TIMER, UNIT


pytestmark = pytest.mark.usefixtures("fake_exits_json")


def run(args, check=False, diff=False):
    return modharness.run(nic_irq_persist, args, check=check, diff=diff)


@pytest.fixture
def lab(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    os.makedirs(os.path.join(tree.root, "etc/network/if-up.d"))      # an ifupdown node
    return tree


def args(tree, **kw):
    base = dict(pci_address="0000:42:01.0", count=4, allow_irqbalance=True, recheck_interval="1min",
                procfs_path=tree.proc, sysfs_path=tree.sys)
    base.update(kw)
    return base


def snapshot(root):
    """Every file under ``root`` with its hash and mode, but the pin lock: a runtime lock under /run that every
    run leaves in place, empty, by design (see _fileio.exclusive_lock)."""
    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.relpath(path, root) == PIN_LOCK:
                continue
            st = os.lstat(path)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = ("link", os.readlink(path))
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = (hashlib.sha256(handle.read()).hexdigest(), st.st_mode & 0o7777)
    return out


def under(tree, path):
    return os.path.join(tree.root, path.lstrip("/"))


def test_fresh_check_is_the_exact_plan_and_writes_nothing(lab):
    before = snapshot(lab.root)
    kind, res = run(args(lab), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    assert snapshot(lab.root) == before
    paths = {f["path"]: f["action"] for f in res["files"]}
    for path in ("/etc/gpunode/nic-irq-affinity.json", "/usr/local/sbin/gpunode-nic-irq-pin",
                 "/etc/systemd/system/gpunode-nic-irq-affinity.service", "/etc/systemd/system/gpunode-nic-irq-affinity.timer",
                 "/etc/systemd/system/gpunode-nic-irq-affinity-recheck.service",
                 "/etc/udev/rules.d/70-gpunode-nic-irq-affinity.rules", "/etc/network/if-up.d/gpunode-nic-irq-pin",
                 "/usr/local/lib/gpunode-tuning/" + _payload.MANIFEST):
        assert paths.get(path) == "create", (path, paths)
    # No NetworkManager or networkd-dispatcher on this node: no hook for them.
    assert not [p for p in paths if "NetworkManager" in p or "networkd" in p]
    moved = ["%s %s: %s -> %s" % (i["irq"], i["name"], i["before"], i["after"])
             for i in res["irqs"] if i["kind"] == "queue" and i["before"] != i["after"]]
    assert res["drift"] == moved and len(moved) == 6 and res["cpulist"] == "4-7"
    # The diff shows the unit and the state file, not the library source.
    headers = [d.get("before_header") for d in res["diff"][1:]]
    assert "/etc/gpunode/nic-irq-affinity.json" in headers
    assert not [h for h in headers if h and "/module_utils/" in h]
    # Captured tree: systemd actions are only reported.
    assert res["systemd"] == ["daemon-reload (captured tree: not run)", "udevadm control --reload (captured tree: not run)"]


def test_converge_then_idempotent_and_check_clean(lab):
    kind, res = run(args(lab))
    assert kind is Exit and res["changed"] is True and res["verified"] is True
    queue = [i for i in res["irqs"] if i["kind"] == "queue"]
    assert sorted(set(lab.affinity(i["irq"]) for i in queue)) == ["4", "5", "6", "7"]
    state = json.loads(open(under(lab, "/etc/gpunode/nic-irq-affinity.json")).read())
    assert state == {"pci_address": "0000:42:01.0", "count": 4, "numa_local": True, "whole_cores": True,
                     "allow_irqbalance": True, "strict": False}
    assert os.stat(under(lab, "/usr/local/sbin/gpunode-nic-irq-pin")).st_mode & 0o777 == 0o755
    after = snapshot(lab.root)
    kind, res2 = run(args(lab))
    assert kind is Exit and res2["changed"] is False, [f for f in res2["files"] if f["action"] != "unchanged"]
    kind, res3 = run(args(lab), check=True)
    assert kind is Exit and res3["changed"] is False and res3["drift"] == []
    assert snapshot(lab.root) == after


def test_installed_entry_point_runs_from_the_library_alone(lab):
    run(args(lab))
    # The IRQs drift (as after a driver reset); the installed entry point, in an isolated
    # Python with only the installed library, puts them back.
    irqs = lab.irqs("enp66s1")[1:]
    for irq in irqs:
        lab.set_affinity(irq, [0])
    state = json.loads(open(under(lab, "/etc/gpunode/nic-irq-affinity.json")).read())
    state.update(procfs_path=lab.proc, sysfs_path=lab.sys)
    alt = os.path.join(lab.root, "state-with-roots.json")
    with open(alt, "w") as handle:
        json.dump(state, handle)
    entry = under(lab, "/usr/local/sbin/gpunode-nic-irq-pin")
    text = open(entry).read().replace('"/usr/local/lib/gpunode-tuning"', json.dumps(under(lab, "/usr/local/lib/gpunode-tuning")))
    text = text.replace("#!/usr/bin/python3", "#!" + sys.executable)
    with open(entry, "w") as handle:
        handle.write(text)
    res = subprocess.run([sys.executable, "-I", entry, alt], capture_output=True, text=True, cwd="/", timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(set(lab.affinity(i) for i in irqs)) == ["4", "5", "6", "7"], res.stdout


def test_hand_edited_unit_is_drift_and_is_repaired(lab):
    run(args(lab))
    unit = under(lab, "/etc/systemd/system/gpunode-nic-irq-affinity.service")
    with open(unit, "a") as handle:
        handle.write("# local edit\n")
    kind, res = run(args(lab), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    assert [f["path"] for f in res["files"] if f["action"] != "unchanged"] == ["/etc/systemd/system/gpunode-nic-irq-affinity.service"]
    assert "# local edit" in open(unit).read()
    assert any("# local edit" in d.get("before", "") for d in res["diff"][1:])
    kind, res = run(args(lab))
    assert kind is Exit and res["changed"] is True and "# local edit" not in open(unit).read()


def test_a_failed_write_rolls_back_every_file(lab, monkeypatch):
    run(args(lab, recheck_interval=""))
    before = snapshot(lab.root)
    calls = []
    real = _persist.write_atomic

    def flaky(path, data, mode):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(_persist, "write_atomic", flaky)
    kind, res = run(args(lab, recheck_interval="1min", timeout=45))
    assert kind is Fail and "rolled back" in res["msg"] and "No space left" in res["msg"], res["msg"]
    monkeypatch.setattr(_persist, "write_atomic", real)
    assert snapshot(lab.root) == before


def test_shared_lib_dir_keeps_foreign_files_and_absent_removes_only_ours(lab):
    shared = "/usr/local/lib/site-tools"
    foreign = under(lab, shared + "/vendor-tool.py")
    os.makedirs(os.path.dirname(foreign))
    with open(foreign, "w") as handle:
        handle.write("print('not ours')\n")
    kind, res = run(args(lab, lib_dir=shared))
    assert kind is Exit and res["changed"] is True
    assert os.path.exists(under(lab, shared + "/ansible_collections/gpunode/tuning/plugins/module_utils/_nic_irq/pin_cli.py"))
    kind, res = run(args(lab, lib_dir=shared))
    assert kind is Exit and res["changed"] is False and os.path.exists(foreign)
    kind, res = run(dict(state="absent", lib_dir=shared, procfs_path=lab.proc, sysfs_path=lab.sys), check=True)
    assert kind is Exit and res["changed"] is True and os.path.exists(under(lab, "/etc/gpunode/nic-irq-affinity.json"))
    kind, res = run(dict(state="absent", lib_dir=shared, procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is True
    assert os.path.exists(foreign), "state=absent removed a file the collection did not install"
    assert not os.path.exists(under(lab, shared + "/ansible_collections"))
    for path in ("/etc/gpunode/nic-irq-affinity.json", "/usr/local/sbin/gpunode-nic-irq-pin",
                 "/etc/systemd/system/gpunode-nic-irq-affinity.service", "/etc/network/if-up.d/gpunode-nic-irq-pin"):
        assert not os.path.exists(under(lab, path)), path
    kind, res = run(dict(state="absent", lib_dir=shared, procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is False


def test_empty_interval_removes_the_timer(lab):
    run(args(lab))
    kind, res = run(args(lab, recheck_interval=""))
    assert kind is Exit and res["changed"] is True
    assert {f["path"]: f["action"] for f in res["files"]}["/etc/systemd/system/gpunode-nic-irq-affinity.timer"] == "remove"
    assert not os.path.exists(under(lab, "/etc/systemd/system/gpunode-nic-irq-affinity.timer"))


@pytest.mark.parametrize("key,value,word", [
    ("recheck_interval", "5 minutes please", "time span"),
    ("recheck_interval", "5min; rm -rf /", "time span"),
    ("timeout", 0, "1 to 3600"),
    ("lib_dir", "/usr/local/lib", "system directory"),
    ("lib_dir", "relative/lib", "absolute path"),
    ("entry_point", "/usr/local/sbin/pin me", "absolute path"),
    ("state_file", "/etc/gpunode/$(x).json", "absolute path"),
])
def test_bad_settings_fail_naming_the_value_and_change_nothing(lab, key, value, word):
    before = snapshot(lab.root)
    kind, res = run(args(lab, **{key: value}))
    assert kind is Fail and word in res["msg"] and repr(value) in res["msg"], res["msg"]
    assert snapshot(lab.root) == before


# Verification (formerly the role's verify.yml, now in the module) ---------------

SEED_PCI = "0000:00:07.0"


@pytest.fixture
def seed_managed(tmp_path):
    spec = treegen.seed_vm()
    for irq in spec["nics"][0]["irqs"]:
        irq["managed"] = irq["irq"] == 63                  # debugfs: only mlx5_comp3 is kernel-managed
    return treegen.build_tree(tmp_path / "seed", spec)


def test_verify_leaves_the_kernel_managed_irq_out_and_names_it(seed_managed):
    tree = seed_managed
    kind, res = run(dict(pci_address=SEED_PCI, cpus="160-170", persist=False,
                         procfs_path=tree.proc, sysfs_path=tree.sys))
    assert kind is Exit, res
    assert tree.affinity(63) == "3"                              # never written
    assert [tree.affinity(60 + q) for q in range(11) if q != 3] == [str(160 + q) for q in range(11) if q != 3]
    assert res["verified"] is True
    assert res["unchangeable"] == ["63 mlx5_comp3@pci:%s: kernel-managed, left at 3" % SEED_PCI]
    # Converged: check mode shows no drift for the managed IRQ either.
    kind, res = run(dict(pci_address=SEED_PCI, cpus="160-170", persist=False,
                         procfs_path=tree.proc, sysfs_path=tree.sys), check=True)
    assert kind is Exit and res["changed"] is False and res["drift"] == []


def test_verify_fails_when_a_pinned_irq_is_moved_before_the_read_back(seed_managed, monkeypatch):
    tree = seed_managed
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    real = _irq_affinity.apply_plan

    def apply_then_someone_moves_queue_4(plan, **kw):
        out = real(plan, **kw)
        tree.set_affinity(64, [5])                           # irqbalance, a driver reset...
        return out

    monkeypatch.setattr(_irq_affinity, "apply_plan", apply_then_someone_moves_queue_4)
    kind, res = run(dict(pci_address=SEED_PCI, cpus="160-170", persist=False,
                         procfs_path=tree.proc, sysfs_path=tree.sys))
    assert kind is Fail and res["verified"] is False
    assert "64 mlx5_comp4@pci:%s: 5, planned 164" % SEED_PCI in res["msg"], res["msg"]
    assert "63 mlx5_comp3" not in res["msg"]


def test_check_mode_that_assumes_irqbalance_stopped_never_changes_the_stored_state(lab):
    """The role's check mode plans before irqbalance is really stopped; that must not show as state-file drift."""
    kind, res = run(args(lab, allow_irqbalance=False), check=True)
    assert kind is Fail and "irqbalance is active" in res["msg"], res   # the tree's irqbalance is enabled and running
    kind, res = run(args(lab, allow_irqbalance=False, assume_irqbalance_stopped=True), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    state = [d for d in res["diff"][1:] if d["after_header"] == "/etc/gpunode/nic-irq-affinity.json"][0]
    assert json.loads(state["after"])["allow_irqbalance"] is False
    # Converged with irqbalance allowed (as banned mode does), check mode assuming it stopped reports nothing.
    run(args(lab))
    kind, res = run(args(lab, assume_irqbalance_stopped=True), check=True)
    assert kind is Exit and res["changed"] is False, [f for f in res["files"] if f["action"] != "unchanged"]


def test_absent_removes_the_default_lib_dir_with_the_bytecode_python_wrote(lab):
    run(args(lab))
    pkg = under(lab, "/usr/local/lib/gpunode-tuning/" + _payload.PKG_DIR + "/_nic_irq")
    os.makedirs(os.path.join(pkg, "__pycache__"))
    for name in ("nic.cpython-311.pyc", "pin_cli.cpython-311.pyc"):
        with open(os.path.join(pkg, "__pycache__", name), "wb") as handle:
            handle.write(b"\0")
    kind, res = run(dict(state="absent", procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is True
    assert not os.path.exists(under(lab, "/usr/local/lib/gpunode-tuning")), "the lib dir the collection made is left"
    assert os.path.isdir(under(lab, "/usr/local/lib")), "a directory above the lib dir was removed"


# irqbalance handled in the same run (the nic_irq_pinning role's one task) -----------------------------------------


def with_irqbalance(tree, mode, **kw):
    """The tree's irqbalance is enabled and running, with the package's commented-out config."""
    os.makedirs(under(tree, "/usr/sbin"), exist_ok=True)
    open(under(tree, "/usr/sbin/irqbalance"), "w").close()
    return args(tree, allow_irqbalance=False, irqbalance=dict(dict(mode=mode, os_family="Debian"), **kw))


def test_disabled_irqbalance_is_planned_stopped_and_masked_before_the_pins_in_one_run(lab):
    settings = with_irqbalance(lab, "disabled")
    before = snapshot(lab.root)
    kind, res = run(settings, check=True, diff=True)
    assert kind is Exit and res["changed"] is True, res
    assert snapshot(lab.root) == before
    ib = res["irqbalance_state"]
    assert ib["status"]["active"] is True and ib["status"]["mode"] == "disabled"
    assert [a.split(" ")[0] for a in ib["systemd"]] == ["mask", "disable", "stop"], ib["systemd"]
    assert res["cpulist"] == "4-7" and res["drift"]
    # The stored state says irqbalance is gone (the boot-time run refuses a running one), whatever was passed.
    kind, res = run(dict(with_irqbalance(lab, "disabled"), allow_irqbalance=True))
    assert kind is Exit and res["changed"] is True and res["verified"] is True
    with open(under(lab, "/etc/gpunode/nic-irq-affinity.json")) as handle:
        assert json.load(handle)["allow_irqbalance"] is False
    assert os.path.exists(under(lab, "/etc/gpunode/irqbalance-masked.json"))
    # Converged: pins and files unchanged. (No systemctl runs on a captured tree, so the tree's irqbalance still
    # looks active and its stop is planned again; the lab proves the live node converges to changed=0.)
    kind, res = run(with_irqbalance(lab, "disabled"), check=True)
    assert kind is Exit and res["drift"] == [] and [f for f in res["files"] if f["action"] != "unchanged"] == []
    assert [f for f in res["irqbalance_state"]["files"] if f["action"] != "unchanged"] == []
    assert all(a.endswith("(captured tree: not run)") for a in res["irqbalance_state"]["systemd"])


def test_banned_irqbalance_bans_the_planned_cpus_and_this_nic_and_the_stored_state_allows_it(lab):
    kind, res = run(with_irqbalance(lab, "banned"), diff=True)
    assert kind is Exit and res["changed"] is True, res
    ib = res["irqbalance_state"]
    assert ib["plan"]["banned_cpulist"] == res["cpulist"] == "4-7"
    assert ib["plan"]["banned_devices"] == ["0000:42:01.0"]
    with open(under(lab, "/etc/default/irqbalance")) as handle:
        assert "IRQBALANCE_BANNED_CPULIST=4-7\n" in handle.read()
    with open(under(lab, "/usr/local/libexec/gpunode-irqbalance-policy")) as handle:
        assert "0000:42:01.0" in handle.read()
    with open(under(lab, "/etc/gpunode/nic-irq-affinity.json")) as handle:
        assert json.load(handle)["allow_irqbalance"] is True
    headers = [d["before_header"] for d in res["diff"]]
    assert "/etc/default/irqbalance" in headers and "/etc/gpunode/nic-irq-affinity.json" in headers
    kind, res = run(with_irqbalance(lab, "banned"), check=True)
    assert kind is Exit and res["changed"] is False
    # state=absent gives irqbalance back (the package's bytes) after removing the persistence.
    kind, res = run(dict(state="absent", irqbalance=dict(mode="absent", os_family="Debian"),
                         procfs_path=lab.proc, sysfs_path=lab.sys))
    assert kind is Exit and res["changed"] is True
    with open(under(lab, "/etc/default/irqbalance")) as handle:
        assert handle.read() == "#IRQBALANCE_ONESHOT=\n#IRQBALANCE_BANNED_CPULIST=\n"
    assert not os.path.exists(under(lab, "/etc/gpunode/nic-irq-affinity.json"))
    assert not os.path.exists(under(lab, "/usr/local/libexec/gpunode-irqbalance-policy"))


@pytest.mark.parametrize("state, mode", [("present", "absent"), ("absent", "disabled"), ("absent", "banned")])
def test_an_irqbalance_mode_that_does_not_fit_the_state_fails_and_changes_nothing(lab, state, mode):
    settings = dict(with_irqbalance(lab, mode), state=state)
    before = snapshot(lab.root)
    kind, res = run(settings)
    assert kind is Fail and res["option"] == "irqbalance.mode" and res["value"] == mode, res
    assert repr(mode) in res["msg"] and "expected" in res["msg"]
    assert snapshot(lab.root) == before


def test_bad_irqbalance_input_fails_before_any_pin_or_file_is_written(lab):
    settings = with_irqbalance(lab, "banned", policy_script="relative/policy")
    before = snapshot(lab.root)
    affinity = {p: open(p).read() for p in (os.path.join(lab.proc, "irq", i, "smp_affinity_list")
                                            for i in os.listdir(os.path.join(lab.proc, "irq")) if i.isdigit())}
    kind, res = run(settings)
    assert kind is Fail and res["option"] == "irqbalance.policy_script" and res["value"] == "relative/policy", res
    assert res["changed"] is False
    assert snapshot(lab.root) == before
    assert {p: open(p).read() for p in affinity} == affinity


class _ShowRun(object):
    """What ``systemctl show --property=Id,UnitFileState,ActiveState A B`` printed on the lab's Debian 12 guest."""

    def __init__(self, out, rc=0):
        self.out, self.rc, self.calls = out, rc, []

    def __call__(self, argv):
        self.calls.append(argv)
        return self.rc, self.out, ""


@pytest.mark.parametrize("out, unit_state, timer_state", [
    ("Id=gpunode-nic-irq-affinity.service\nActiveState=inactive\nUnitFileState=enabled\n\n"
     "Id=gpunode-nic-irq-affinity.timer\nActiveState=active\nUnitFileState=enabled\n", "enabled", ("enabled", "active")),
    ("Id=gpunode-nic-irq-affinity.service\nActiveState=inactive\nUnitFileState=\n\n"
     "Id=gpunode-nic-irq-affinity.timer\nActiveState=inactive\nUnitFileState=\n", "", ("", "inactive")),
])
def test_unit_states_are_read_in_one_systemctl_call(out, unit_state, timer_state):
    fake = _ShowRun(out)
    found = Systemd(fake, False).show([UNIT, TIMER])
    assert len(fake.calls) == 1 and fake.calls[0][:2] == ["systemctl", "show"]
    assert found[UNIT]["UnitFileState"] == unit_state
    assert (found[TIMER]["UnitFileState"], found[TIMER]["ActiveState"]) == timer_state
    # systemctl failing reads as "not enabled" (the run then enables), never as enabled.
    assert Systemd(_ShowRun("", rc=1), False).show([UNIT]).get(UNIT, {}).get("UnitFileState") is None


@pytest.mark.parametrize("failing_call", [1, 3], ids=["first-file", "third-file"])
def test_a_failed_file_write_puts_the_pins_back_too(lab, monkeypatch, failing_call):
    """Issue 27 section 6: the files were rolled back but the IRQs the run had already moved stayed moved."""
    before = lab.all_affinities()
    files = snapshot(lab.root)
    calls = []
    real = _persist.write_atomic

    def flaky(path, data, mode):
        calls.append(path)
        if len(calls) == failing_call:
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(_persist, "write_atomic", flaky)
    kind, res = run(args(lab))
    monkeypatch.setattr(_persist, "write_atomic", real)
    assert kind is Fail and "No space left" in res["msg"] and "rolled back" in res["msg"], res
    assert res["pins_rolled_back"] and res["pins_rollback_failed"] == [] and res["changed"] is False
    assert "restored IRQs" in res["msg"]
    assert lab.all_affinities() == before                           # every IRQ where it was
    assert snapshot(lab.root) == files                              # and every file
    kind, res = run(args(lab))                                      # a clean run after it converges as usual
    assert kind is Exit and res["changed"] is True and lab.all_affinities() != before


def test_a_pin_that_cannot_be_put_back_is_named_and_the_run_reports_changed(lab, monkeypatch):
    before = lab.all_affinities()
    real = _persist.write_atomic
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    real_pin = _irq_affinity.run_desired_state
    broken = []

    def pin_then_break_one(*a, **kw):
        out = real_pin(*a, **kw)
        moved = [i["irq"] for i in out["irqs"] if i["status"] == "changed"]
        if not kw.get("check_mode") and moved:
            broken.append(moved[0])
            lab.break_irq(moved[0])                                 # the file is now a directory: EISDIR
        return out

    def failing(path, data, mode):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist_run, "run_desired_state", pin_then_break_one)
    monkeypatch.setattr(_persist, "write_atomic", failing)
    kind, res = run(args(lab))
    monkeypatch.setattr(_persist, "write_atomic", real)
    assert kind is Fail and res["changed"] is True, res
    assert [f["irq"] for f in res["pins_rollback_failed"]] == broken and "rollback FAILED" in res["msg"]
    assert dict((k, v) for k, v in lab.all_affinities().items() if k not in broken) == \
        dict((k, v) for k, v in before.items() if k not in broken)


# A failed systemctl step or read-back rolls back everything this run did (issue 27, rollback) ---------------------

STAND_IN = """#!%(python)s
# A stand-in for systemctl and udevadm that keeps each unit's enablement and activity as files, logs every call and
# fails each call named (one per line) in the fail file once.
import os
import sys

args = sys.argv[1:]
line = " ".join([os.path.basename(sys.argv[0])] + args)
with open(%(log)r, "a") as handle:
    handle.write(line + "\\n")
failing = open(%(fail)r).read().splitlines() if os.path.exists(%(fail)r) else []
if line in failing:
    failing.remove(line)
    with open(%(fail)r, "w") as handle:
        handle.write("".join(f + "\\n" for f in failing))
    sys.stderr.write("Failed: stand-in failure\\n")
    sys.exit(1)
units = [a for a in args[1:] if not a.startswith("--")]
flag = lambda unit, kind: os.path.join(%(state)r, unit + "." + kind)
if args and args[0] == "show":
    print("\\n".join("Id=%%s\\nActiveState=%%s\\nUnitFileState=%%s\\n" %% (
        u, "active" if os.path.exists(flag(u, "active")) else "inactive",
        "enabled" if os.path.exists(flag(u, "enabled")) else "disabled") for u in units))
elif args and args[0] in ("enable", "disable", "start", "stop"):
    for unit in units:
        kinds = {"enable": ["enabled"], "disable": ["enabled"], "start": ["active"], "stop": ["active"]}[args[0]]
        if "--now" in args:
            kinds.append("active")
        for kind in kinds:
            if args[0] in ("enable", "start"):
                open(flag(unit, kind), "w").close()
            elif os.path.exists(flag(unit, kind)):
                os.unlink(flag(unit, kind))
"""
UNIT_NAME, TIMER_NAME = "gpunode-nic-irq-affinity.service", "gpunode-nic-irq-affinity.timer"


def _path_runner(argv):
    """systemctl/udevadm from PATH (the stand-ins), as the module's runner runs them."""
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    """systemctl and udevadm as stand-ins on PATH, and the module's Systemd live as on a node (the tree's IRQs and
    files stay the tree's). Returns {"log", "fail", "state"}; ``units()`` reads what is enabled and active."""
    paths = dict(log=str(tmp_path / "calls.log"), fail=str(tmp_path / "fail"), state=str(tmp_path / "units"),
                 python=sys.executable)
    os.makedirs(paths["state"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("systemctl", "udevadm"):
        (bin_dir / name).write_text(STAND_IN % paths)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ.get("PATH", "/usr/bin:/bin")))
    # The tree's target has no runner (no command runs on a tree): its systemd alone gets the stand-ins' runner.
    monkeypatch.setattr(Target, "systemd", lambda target, error=None, why=None: Systemd(
        _path_runner, target.check, error=error or PersistError))
    return paths


def unit_states(systemd):
    return sorted(os.listdir(systemd["state"]))


def log_of(systemd):
    if not os.path.exists(systemd["log"]):
        return []
    with open(systemd["log"]) as handle:
        return handle.read().splitlines()


def fail_on(systemd, *lines):
    with open(systemd["fail"], "w") as handle:
        handle.write("".join(line + "\n" for line in lines))
    with open(systemd["log"], "w"):
        pass


@pytest.mark.parametrize("step", ["systemctl daemon-reload", "udevadm control --reload",
                                  "systemctl enable %s" % UNIT_NAME, "systemctl enable --now %s" % TIMER_NAME])
def test_a_failed_systemd_step_puts_back_files_units_and_pins(lab, systemd, step):
    """An earlier install without the timer; this run changes the unit and the udev rule, adds the timer, enables the
    unit and fails at ``step``: every file (bytes and mode, or absence), every unit's enablement and activity, every
    pin as before, and systemd and udev re-read the files put back."""
    kind, res = run(args(lab, recheck_interval="", count=2))
    assert kind is Exit and res["verified"] is True, res
    os.unlink(os.path.join(systemd["state"], UNIT_NAME + ".enabled"))   # the boot unit disabled by hand since,
    with open(under(lab, "/etc/udev/rules.d/70-gpunode-nic-irq-affinity.rules"), "a") as handle:
        handle.write("# local edit\n")                                   # and the udev rule edited
    files, pins, units = snapshot(lab.root), lab.all_affinities(), unit_states(systemd)
    fail_on(systemd, step)
    kind, res = run(args(lab, timeout=45))
    assert kind is Fail and "stand-in failure" in res["msg"] and "rolled back" in res["msg"], res
    assert res["changed"] is False and res["rollback_failed"] == [] and res["systemd_rollback_failed"] == []
    assert res["pins_rolled_back"] and res["pins_rollback_failed"] == []
    assert snapshot(lab.root) == files
    assert lab.all_affinities() == pins
    assert unit_states(systemd) == units
    calls = log_of(systemd)
    assert calls[calls.index(step) + 1:][-2:] == ["systemctl daemon-reload", "udevadm control --reload"], calls
    kind, res = run(args(lab, timeout=45))                     # nothing left half done: a clean run converges
    assert kind is Exit and res["verified"] is True
    assert unit_states(systemd) == sorted([UNIT_NAME + ".enabled", TIMER_NAME + ".active", TIMER_NAME + ".enabled"])


def test_a_failed_read_back_puts_back_files_units_and_pins(lab, systemd, monkeypatch):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    files, pins = snapshot(lab.root), lab.all_affinities()
    real = _irq_affinity.apply_plan
    moved = []

    def apply_then_someone_moves_one(plan, **kw):     # every time: the pinning again is undone too
        out = real(plan, **kw)
        irq = ([i.irq for i in plan.items if i.status == "changed"] or moved)[0]
        lab.set_affinity(irq, [0])
        moved.append(irq)
        return out

    monkeypatch.setattr(_irq_affinity, "apply_plan", apply_then_someone_moves_one)
    kind, res = run(args(lab))
    assert kind is Fail and res["verified"] is False and "not on their planned CPUs" in res["msg"], res
    assert res["changed"] is False and "pins: restored IRQs" in res["msg"]
    assert len(res["files_rolled_back"]) > 10 and res["systemd_rolled_back"] == [
        "disable --now %s" % TIMER_NAME, "disable %s" % UNIT_NAME, "daemon-reload", "udevadm control --reload"]
    assert snapshot(lab.root) == files
    assert lab.all_affinities() == pins and moved
    assert unit_states(systemd) == []


def test_a_pin_moved_once_after_the_write_is_pinned_again_and_said(lab, systemd, monkeypatch):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    real = _irq_affinity.apply_plan
    moved = []

    def apply_then_someone_moves_one_once(plan, **kw):
        out = real(plan, **kw)
        if not moved:
            irq = [i.irq for i in plan.items if i.status == "changed"][0]
            lab.set_affinity(irq, [0])
            moved.append(irq)
        return out

    monkeypatch.setattr(_irq_affinity, "apply_plan", apply_then_someone_moves_one_once)
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    kind, res = run(args(lab))
    assert kind is Exit and res["verified"] is True and res["changed"] is True, res
    planned = dict((i["irq"], i["after"]) for i in res["irqs"])
    assert moved and lab.all_affinities()[moved[0]] == planned[moved[0]] != "0"
    assert [w for w in warned if "something moved queue IRQs" in w and "%d " % moved[0] in w], res
    kind, res = run(args(lab))                                # and it is converged: nothing to do on the next run
    assert kind is Exit and res["changed"] is False and res["verified"] is True, res


def test_a_timer_the_run_disabled_is_enabled_and_started_again(lab, systemd):
    kind, res = run(args(lab))
    assert kind is Exit and TIMER_NAME + ".active" in unit_states(systemd)
    files, pins, units = snapshot(lab.root), lab.all_affinities(), unit_states(systemd)
    fail_on(systemd, "systemctl daemon-reload")
    kind, res = run(args(lab, recheck_interval="", count=2))   # removes the timer (disable --now first), then fails
    assert kind is Fail and res["changed"] is False, res
    assert log_of(systemd)[:2] == ["systemctl show --property=Id --property=UnitFileState --property=ActiveState %s"
                                   % TIMER_NAME, "systemctl disable --now %s" % TIMER_NAME]
    assert log_of(systemd)[-1] == "systemctl enable --now %s" % TIMER_NAME
    assert res["systemd_rolled_back"][-1] == "enable --now %s" % TIMER_NAME
    assert snapshot(lab.root) == files and lab.all_affinities() == pins and unit_states(systemd) == units


def test_a_step_that_cannot_be_taken_back_is_named_and_the_run_reports_changed(lab, systemd):
    fail_on(systemd, "systemctl enable --now %s" % TIMER_NAME, "systemctl disable %s" % UNIT_NAME)
    files, pins = snapshot(lab.root), lab.all_affinities()
    kind, res = run(args(lab))
    assert kind is Fail and res["changed"] is True, res
    assert res["systemd_rollback_failed"] == ["disable %s" % UNIT_NAME] and "FAILED: disable" in res["msg"]
    assert unit_states(systemd) == [UNIT_NAME + ".enabled"]      # said, not hidden
    assert snapshot(lab.root) == files and lab.all_affinities() == pins


def _pin_lock_is_held(tree):
    """True when another open file description holds the tree's pin lock."""
    return treegen.flock_held(os.path.join(tree.root, PIN_LOCK))


def test_the_pin_lock_is_held_from_the_pins_through_the_state_file_to_the_read_back(lab, systemd, monkeypatch):
    """The boot/re-check entry point takes the same lock per pass: it can never apply the old state file between
    this run's pins and its state file write, or move a pin between the write and the read-back."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    held = []

    def watch(name, real):
        def wrapper(*a, **kw):
            held.append((name, _pin_lock_is_held(lab)))
            return real(*a, **kw)
        return wrapper

    monkeypatch.setattr(_irq_affinity, "apply_plan", watch("pins", _irq_affinity.apply_plan))
    monkeypatch.setattr(persist_run, "apply_files", watch("files", persist_run.apply_files))
    monkeypatch.setattr(persist_run, "verify_pins", watch("read-back", persist_run.verify_pins))
    kind, res = run(args(lab))
    assert kind is Exit and res["changed"] is True and res["verified"] is True, res
    assert [name for name, locked in held] == ["pins", "files", "read-back"], held
    assert all(locked for name, locked in held), held
    assert not _pin_lock_is_held(lab)                                  # released when the run ends


def test_a_pin_lock_held_by_another_run_fails_naming_it_and_changes_nothing(lab, systemd, monkeypatch):
    import fcntl
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import affinity as _irq_affinity
    monkeypatch.setattr(_irq_affinity, "PIN_LOCK_WAIT", 0.3)
    files, pins = snapshot(lab.root), lab.all_affinities()
    path = os.path.join(lab.root, PIN_LOCK)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)                                     # a boot-time pass in progress
    try:
        kind, res = run(args(lab))
        assert kind is Fail and res["changed"] is False, res
        assert "another run holds the lock" in res["msg"] and PIN_LOCK in res["msg"], res["msg"]
        assert snapshot(lab.root) == files and lab.all_affinities() == pins
        assert log_of(systemd) == []
        kind, res = run(args(lab), check=True)                         # check mode reads only: no lock, no wait
        assert kind is Exit and res["changed"] is True, res
    finally:
        os.close(fd)
