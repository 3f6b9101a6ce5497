# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""irqbalance_state: the irqbalance role in one module run, on generated trees.

Two ways in: the module's main() on a tree (files written under the tree, the
systemctl actions only reported), and converge() with a fake systemctl on a
tree that has run/systemd/system, to prove the commands that run live and the
restart rule (which the lab scenario irqbalance_banned proves on a real guest).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import irqbalance_state as S
from ansible_collections.gpunode.tuning.plugins.modules import irqbalance_state

POLICY = "/usr/local/libexec/gpunode-irqbalance-policy"
CONFIG = "etc/default/irqbalance"
MASK, BANNED = "etc/gpunode/irqbalance-masked.json", "etc/gpunode/irqbalance-banned.json"
ROLE_LINES = ["IRQBALANCE_BANNED_CPULIST=2-7", 'IRQBALANCE_ARGS="--policyscript=%s"' % POLICY]
# The shape of Debian's /etc/default/irqbalance (every variable commented out).
PACKAGE_CONFIG = (
    "# irqbalance is a daemon process that distributes interrupts across\n"
    "# CPUs on SMP systems.\n#\n#IRQBALANCE_ONESHOT=\n\n"
    "#\n# IRQBALANCE_BANNED_CPUS\n#\n#IRQBALANCE_BANNED_CPUS=\n\n"
    "#\n# IRQBALANCE_BANNED_CPULIST\n#\n#IRQBALANCE_BANNED_CPULIST=\n\n"
    "#\n# IRQBALANCE_ARGS\n#    Append any args here to the irqbalance daemon.\n#\n#IRQBALANCE_ARGS=\n"
)


pytestmark = pytest.mark.usefixtures("fake_exits")


def make_tree(path, running=True, unit="enabled", installed=True, systemd=False, config=PACKAGE_CONFIG):
    """The lab's irqbalance_banned guest: isolcpus=2 nohz_full=3, irqbalance with the package's config."""
    spec = treegen.lab_virtio()
    spec.update(isolated=[2], nohz_full=[3])
    spec["irqbalance"] = dict(spec["irqbalance"], config=config, running=running, unit=unit, systemd=systemd)
    tree = treegen.build_tree(path, spec)
    if installed:
        os.makedirs(os.path.join(tree.root, "usr/sbin"), exist_ok=True)
        open(os.path.join(tree.root, "usr/sbin/irqbalance"), "w").close()
    return tree


@pytest.fixture
def lab(tmp_path):
    return make_tree(tmp_path / "tree")


def run(tree, check=False, diff=False, **args):
    args = dict(dict(mode="banned", banned_cpus="4-7", banned_devices=["42:01.0"], os_family="Debian"), **args)
    args.update(procfs_path=tree.proc, sysfs_path=tree.sys)
    return modharness.run(irqbalance_state, args, check=check, diff=diff)


def snapshot(tree):
    """Every file and link under the tree outside proc/sys, with content hash and mode."""
    out = {}
    for base, dirs, files in os.walk(tree.root):
        rel = os.path.relpath(base, tree.root)
        if rel.split(os.sep)[0] in ("proc", "sys"):
            continue
        for name in dirs + files:
            path = os.path.join(base, name)
            if os.path.islink(path):
                out[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[path] = (hashlib.sha256(handle.read()).hexdigest(), os.stat(path).st_mode)
            else:
                out[path] = ("dir", os.stat(path).st_mode)
    return out


def read(tree, rel):
    with open(os.path.join(tree.root, rel)) as handle:
        return handle.read()


def lines(tree):
    return [ln.strip() for ln in read(tree, CONFIG).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def tree_actions(result):
    return [a.replace(" (captured tree: not run)", "") for a in result["systemd"]]


# ------------------------------------------------------------------ banned --

def test_banned_writes_the_two_lines_the_policy_script_and_the_marker_and_restarts_once(lab):
    kind, result = run(lab)
    assert kind is Exit and result["changed"] is True, result
    assert result["status"] == {"installed": True, "active": True, "enabled": True, "masked": False,
                                "masked_by_role": False, "mode": "banned"}
    assert result["plan"] == {"banned_cpus": [2, 3, 4, 5, 6, 7], "banned_cpulist": "2-7", "banned_devices": ["0000:42:01.0"]}
    assert result["ansible_facts"]["irqbalance"]["banned_by"] == "isolated+nohz_full"
    assert lines(lab) == ROLE_LINES
    # Inserted after the commented lines, as lineinfile's insertafter did.
    text = read(lab, CONFIG)
    assert "#IRQBALANCE_BANNED_CPULIST=\nIRQBALANCE_BANNED_CPULIST=2-7\n" in text
    assert '#IRQBALANCE_ARGS=\nIRQBALANCE_ARGS="--policyscript=%s"\n' % POLICY in text
    assert oct(os.stat(os.path.join(lab.root, CONFIG)).st_mode & 0o7777) == "0o644"
    marker = json.loads(read(lab, BANNED))
    assert marker == {"managed_by": "gpunode.tuning.irqbalance",
                      "previous": {"IRQBALANCE_BANNED_CPULIST": None, "IRQBALANCE_BANNED_CPUS": None, "IRQBALANCE_ARGS": None}}
    assert read(lab, BANNED) == json.dumps(marker, indent=4, sort_keys=True) + "\n"      # to_nice_json, as the copy task wrote it
    script = os.path.join(lab.root, POLICY.lstrip("/"))
    assert os.stat(script).st_mode & 0o7777 == 0o755
    assert read(lab, POLICY.lstrip("/")).startswith("#!/bin/sh\n#\n# Ansible managed\n#\n")
    assert tree_actions(result) == ["restart"] and result["restarted"] is True
    assert not os.path.exists(os.path.join(lab.root, MASK))


def test_policy_script_bans_exactly_the_named_function(lab):
    run(lab)
    script = os.path.join(lab.root, POLICY.lstrip("/"))

    def ask(path):
        return subprocess.run(["/bin/sh", script, path, "42"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    assert ask("/sys/bus/pci/devices/0000:42:01.0") == "ban=true"       # the short form was normalised
    assert ask("/sys/bus/pci/devices/0000:42:01.1") == ""
    assert ask("/sys") == ""


def test_banned_is_idempotent_and_check_mode_on_the_converged_tree_reports_nothing(lab):
    run(lab)
    before = snapshot(lab)
    for check in (False, True):
        kind, result = run(lab, check=check, diff=True)
        assert kind is Exit and result["changed"] is False, result
        assert result["systemd"] == [] and result["restarted"] is False and result["diff"] == []
    assert snapshot(lab) == before


def test_fresh_check_mode_reports_the_plan_with_a_diff_and_writes_nothing(lab):
    before = snapshot(lab)
    kind, result = run(lab, check=True, diff=True)
    assert kind is Exit and result["changed"] is True
    assert snapshot(lab) == before
    config = [d for d in result["diff"] if d["before_header"] == "/" + CONFIG][0]
    assert config["before"] == PACKAGE_CONFIG and "IRQBALANCE_BANNED_CPULIST=2-7" in config["after"]
    assert tree_actions(result) == ["restart"]
    # The same plan as the real run.
    assert {a["path"]: a["action"] for a in result["files"]} == {a["path"]: a["action"] for a in run(lab)[1]["files"]}


def test_hand_edited_config_is_drift_check_reports_it_converge_restores_and_restarts_once(lab):
    run(lab)
    path = os.path.join(lab.root, CONFIG)
    edited = read(lab, CONFIG).replace("IRQBALANCE_BANNED_CPULIST=2-7", "IRQBALANCE_BANNED_CPULIST=7")
    edited = "".join(ln for ln in edited.splitlines(True) if not ln.startswith("IRQBALANCE_ARGS="))
    with open(path, "w") as handle:
        handle.write(edited)
    before = snapshot(lab)
    kind, result = run(lab, check=True, diff=True)
    assert kind is Exit and result["changed"] is True
    assert snapshot(lab) == before
    (config,) = result["diff"]
    assert "IRQBALANCE_BANNED_CPULIST=7\n" in config["before"] and "IRQBALANCE_BANNED_CPULIST=2-7\n" in config["after"]
    kind, result = run(lab)
    assert lines(lab) == ROLE_LINES and tree_actions(result) == ["restart"]
    # The marker keeps what the package had, not the hand edit.
    assert json.loads(read(lab, BANNED))["previous"]["IRQBALANCE_BANNED_CPULIST"] is None


def test_a_config_line_there_before_is_replaced_and_put_back(tmp_path):
    tree = make_tree(tmp_path / "t", config="IRQBALANCE_ONESHOT=0\n  IRQBALANCE_BANNED_CPUS=f0\nIRQBALANCE_ARGS=--debug\n")
    run(tree)
    assert lines(tree) == ["IRQBALANCE_ONESHOT=0", 'IRQBALANCE_ARGS="--policyscript=%s"' % POLICY, "IRQBALANCE_BANNED_CPULIST=2-7"]
    assert json.loads(read(tree, BANNED))["previous"] == {
        "IRQBALANCE_BANNED_CPULIST": None, "IRQBALANCE_BANNED_CPUS": "  IRQBALANCE_BANNED_CPUS=f0", "IRQBALANCE_ARGS": "IRQBALANCE_ARGS=--debug"}
    run(tree, mode="absent")
    # Replaced lines come back in place or at the end, as lineinfile put them back.
    assert lines(tree) == ["IRQBALANCE_ONESHOT=0", "IRQBALANCE_ARGS=--debug", "IRQBALANCE_BANNED_CPUS=f0"]


def test_without_devices_the_args_line_is_not_the_roles(tmp_path):
    tree = make_tree(tmp_path / "t", config="IRQBALANCE_ARGS=--debug\n")
    kind, result = run(tree, banned_devices=[])
    assert lines(tree) == ["IRQBALANCE_ARGS=--debug", "IRQBALANCE_BANNED_CPULIST=2-7"]
    assert not os.path.exists(os.path.join(tree.root, POLICY.lstrip("/")))
    assert set(json.loads(read(tree, BANNED))["previous"]) == {"IRQBALANCE_BANNED_CPULIST", "IRQBALANCE_BANNED_CPUS"}


# --------------------------------------------------------- disabled / absent --

def test_banned_to_disabled_restores_the_package_bytes_and_masks_without_a_restart(lab):
    run(lab)
    kind, result = run(lab, mode="disabled")
    assert kind is Exit and result["changed"] is True
    assert read(lab, CONFIG) == PACKAGE_CONFIG
    for rel in (POLICY.lstrip("/"), BANNED):
        assert not os.path.exists(os.path.join(lab.root, rel)), rel
    assert json.loads(read(lab, MASK)) == {"masked_by": "gpunode.tuning.irqbalance", "previous": {"enabled": True, "active": True}}
    # systemd_service's check-mode report (mask, then the enablement read before the mask, then stop); no restart.
    assert tree_actions(result) == ["mask", "disable", "stop"] and result["restarted"] is False


def test_a_unit_masked_by_someone_else_gets_no_marker(tmp_path):
    tree = make_tree(tmp_path / "t", running=False, unit="masked")
    kind, result = run(tree, mode="disabled")
    assert kind is Exit and result["changed"] is False and result["systemd"] == []
    assert not os.path.exists(os.path.join(tree.root, MASK)) and not os.path.exists(os.path.join(tree.root, "etc/gpunode"))
    kind, result = run(tree, mode="absent")
    assert result["changed"] is False and result["status"]["masked"] is True


@pytest.mark.parametrize("mode", ["disabled", "banned", "absent"])
def test_not_installed_is_a_fine_state_nothing_changes(tmp_path, mode):
    tree = make_tree(tmp_path / "t", installed=False, running=False, unit="disabled")
    before = snapshot(tree)
    kind, result = run(tree, mode=mode)
    assert kind is Exit and result["changed"] is False and "not installed" in result["msg"]
    assert result["status"]["installed"] is False and result["status"]["mode"] == mode
    assert snapshot(tree) == before


# ------------------------------------------------------------- bad input --

@pytest.mark.parametrize("args,value", [
    ({"banned_devices": ["*"]}, "*"),
    ({"banned_devices": ["0000:42:01.0", "0000:42:0[0-9].0"]}, "0000:42:0[0-9].0"),
    ({"banned_devices": ["42:01"]}, "42:01"),
    ({"banned_devices": ["0000:42:01.0) echo ban=true ;; x"]}, "0000:42:01.0) echo ban=true ;; x"),
    ({"banned_cpus": "4-x"}, "4-x"),
    ({"banned_cpus": ",3"}, ",3"),
    ({"policy_script": "/usr/local/bin/a b"}, "/usr/local/bin/a b"),
])
def test_bad_input_fails_naming_the_value_and_changes_nothing(lab, args, value):
    run(lab, mode="disabled")              # a state with a marker, so a failure would have something to undo
    before = snapshot(lab)
    kind, result = run(lab, **args)
    assert kind is Fail and repr(value) in result["msg"] and result["value"] == value, result
    assert snapshot(lab) == before


def test_a_ban_of_nothing_fails(lab):
    kind, result = run(lab, banned_cpus=[], ban_isolated=False)
    assert kind is Fail and "irqbalance_mode=banned needs CPUs to ban" in result["msg"]
    assert "irqbalance_ban_isolated is false" in result["msg"] and not os.path.exists(os.path.join(lab.root, BANNED))


def test_a_corrupt_marker_fails_naming_it(lab):
    os.makedirs(os.path.join(lab.root, "etc/gpunode"))
    with open(os.path.join(lab.root, MASK), "w") as handle:
        handle.write("{not json")
    before = snapshot(lab)
    kind, result = run(lab, mode="absent")
    assert kind is Fail and result["path"] == "/" + MASK and snapshot(lab) == before


@pytest.mark.parametrize("family,config", [("RedHat", "/etc/sysconfig/irqbalance"), ("Suse", "/etc/sysconfig/irqbalance"),
                                           ("Debian", "/etc/default/irqbalance")])
def test_the_config_file_follows_the_os_family(lab, family, config):
    kind, result = run(lab, check=True, os_family=family)
    assert kind is Exit and result["config_file"] == config


def test_an_unknown_os_family_fails_instead_of_guessing(lab):
    before = snapshot(lab)
    kind, result = run(lab, os_family="Gentoo")
    assert kind is Fail and 'no config file is known for OS family "Gentoo"' in result["msg"]
    assert snapshot(lab) == before


def test_on_a_tree_without_family_or_config_file_nothing_is_guessed(lab):
    kind, result = run(lab, os_family=None)
    assert kind is Fail and "(not gathered)" in result["msg"]
    kind, result = run(lab, os_family=None, config_file="/etc/irqbalance.env", check=True)
    assert kind is Exit and result["config_file"] == "/etc/irqbalance.env"


def test_disabled_needs_no_config_file_and_no_family(lab):
    kind, result = run(lab, mode="disabled", os_family=None)
    assert kind is Exit and result["config_file"] is None


# ----------------------------------------------- live: systemctl through run --

class FakeSystemd(object):
    """systemctl for irqbalance.service: masking, wants symlink and running state, as systemd keeps them."""

    def __init__(self, enabled=True, active=True, masked=False):
        self.enabled, self.active, self.masked = enabled, active, masked
        self.calls, self.starts = [], 0

    def __call__(self, argv):
        self.calls.append(argv[1:])
        assert argv[0] == "systemctl" and argv[-1] == "irqbalance.service", argv
        verb = argv[1]
        if verb == "show":
            ufs = "masked" if self.masked else ("enabled" if self.enabled else "disabled")
            return 0, "LoadState=%s\nActiveState=%s\nUnitFileState=%s\n" % (
                "masked" if self.masked else "loaded", "active" if self.active else "inactive", ufs), ""
        if verb == "is-active":                                     # read_irqbalance, for the banned-mode facts
            return (0, "active\n", "") if self.active else (3, "inactive\n", "")
        if verb == "is-enabled":
            state = "masked" if self.masked else ("enabled" if self.enabled else "disabled")
            return (0 if state == "enabled" else 1), state + "\n", ""
        if verb in ("mask", "unmask"):
            self.masked = verb == "mask"
        elif verb in ("enable", "disable"):
            self.enabled = verb == "enable"
        elif verb in ("start", "restart"):
            assert not self.masked, "start of a masked unit"
            self.active, self.starts = True, self.starts + 1
        elif verb == "stop":
            self.active = False
        else:
            raise AssertionError(argv)
        return 0, "", ""

    def actions(self):
        return [c[0] for c in self.calls if c[0] not in ("show", "is-enabled", "is-active")]


def live(tree, fake, check=False, **args):
    params = dict(mode="banned", banned_cpus="4-7", ban_isolated=True, banned_devices=["42:01.0"], config_file="",
                  os_family="Debian", state_dir="/etc/gpunode", policy_script=POLICY)
    params.update(args)
    fake.calls = []
    return S.converge(params, tree.root, fake, check, sysfs=tree.sys)[0]


@pytest.fixture
def systemd_tree(tmp_path):
    return make_tree(tmp_path / "live", systemd=True)


def test_live_banned_restarts_once_and_never_again(systemd_tree):
    fake = FakeSystemd()
    result = live(systemd_tree, fake)
    assert fake.actions() == ["restart"] and fake.starts == 1 and result["systemd"] == ["restart"]
    live(systemd_tree, fake)
    live(systemd_tree, fake, check=True)
    assert fake.starts == 1 and fake.actions() == []


def test_live_check_mode_runs_only_probes(systemd_tree):
    fake = FakeSystemd()
    before = snapshot(systemd_tree)
    result = live(systemd_tree, fake, check=True)
    assert fake.actions() == [] and result["systemd"] == ["restart"] and result["changed"] is True
    assert snapshot(systemd_tree) == before


def test_live_disabled_then_absent_gives_irqbalance_back_as_it_was(systemd_tree):
    fake = FakeSystemd()
    live(systemd_tree, fake)                                         # banned first
    result = live(systemd_tree, fake, mode="disabled")
    # The restored config does not restart irqbalance on its way to being masked.
    assert fake.actions() == ["mask", "stop"] and fake.starts == 1 and result["restarted"] is False
    assert read(systemd_tree, CONFIG) == PACKAGE_CONFIG
    assert json.loads(read(systemd_tree, MASK))["previous"] == {"enabled": True, "active": True}
    assert live(systemd_tree, fake, mode="disabled")["changed"] is False and fake.actions() == []
    result = live(systemd_tree, fake, mode="absent")
    assert fake.actions() == ["unmask", "start"] and (fake.masked, fake.enabled, fake.active) == (False, True, True)
    assert result["status"]["masked_by_role"] is True and not os.path.exists(os.path.join(systemd_tree.root, MASK))
    assert live(systemd_tree, fake, mode="absent")["changed"] is False and fake.actions() == []


def test_live_banned_from_a_role_mask_unmasks_enables_starts_once(systemd_tree):
    fake = FakeSystemd()
    live(systemd_tree, fake, mode="disabled")
    fake.enabled = False                                              # as if disabled by hand since
    result = live(systemd_tree, fake)
    assert fake.actions() == ["unmask", "enable", "start"] and result["restarted"] is False
    assert not os.path.exists(os.path.join(systemd_tree.root, MASK))
    assert lines(systemd_tree) == ROLE_LINES


def test_live_absent_straight_from_banned_restores_and_restarts_the_running_daemon(systemd_tree):
    fake = FakeSystemd()
    live(systemd_tree, fake)
    result = live(systemd_tree, fake, mode="absent")
    assert fake.actions() == ["restart"] and result["restarted"] is True
    assert read(systemd_tree, CONFIG) == PACKAGE_CONFIG
    assert not os.path.exists(os.path.join(systemd_tree.root, BANNED))


def test_live_absent_after_disabled_of_a_stopped_disabled_unit_leaves_it_so(systemd_tree):
    fake = FakeSystemd(enabled=False, active=False)
    live(systemd_tree, fake, mode="disabled")
    assert json.loads(read(systemd_tree, MASK))["previous"] == {"enabled": False, "active": False}
    live(systemd_tree, fake, mode="absent")
    assert fake.actions() == ["unmask"] and (fake.masked, fake.enabled, fake.active) == (False, False, False)


def test_a_failing_systemctl_is_named(systemd_tree):
    fake = FakeSystemd()

    def broken(argv):
        if argv[1] == "restart":
            return 1, "", "Job for irqbalance.service failed.\n"
        return fake(argv)

    with pytest.raises(S.StateError) as exc:
        live(systemd_tree, broken)
    assert "systemctl restart irqbalance.service failed (rc 1)" in str(exc.value)


# --------------------------------------------------------------- lineinfile --

@pytest.mark.parametrize("before,after", [
    ("", "K=1\n"),
    ("#K=\n", "#K=\nK=1\n"),
    ("#K=\nx\n#K=\ny\n", "#K=\nx\n#K=\nK=1\ny\n"),            # after the last commented line
    ("K=0\nx\n K=2\n", "K=0\nx\nK=1\n"),                     # the last match is replaced
    ("x", "x\nK=1\n"),
    ("K=1\n", "K=1\n"),
])
def test_line_present_edits_as_lineinfile(before, after):
    assert b"".join(S.line_present(before.encode().splitlines(True), "K", "K=1")) == after.encode()


def test_line_absent_removes_every_match():
    assert b"".join(S.line_absent(b"K=1\n#K=\n  K=2\nKK=3\n".splitlines(True), "K")) == b"#K=\nKK=3\n"
