# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpuset_slices: housekeeping units confined, a workload slice, on generated trees.

Two ways in, as for irqbalance_state: the module's main() on a tree (files
written under the tree, systemctl only reported), and converge() with a fake
systemd on a tree that has run/systemd/system, which does on daemon-reload what
systemd v252 does (unit_deserialize() invalidates every realized unit, the
realize queue writes cpuset.cpus from AllowedCPUs= and writes nothing for a
unit without it), to prove the live apply, the read-back and the drift rules.
The real systemd is the lab's (molecule workload_fence).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
import yaml

from ansible.module_utils import basic

import modharness
import treegen
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import cpuset_slices as C
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import slice_cgroups as G
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import slice_units as U
from ansible_collections.gpunode.tuning.plugins.module_utils._host import files as _persist
from ansible_collections.gpunode.tuning.plugins.modules import cpuset_slices

pytestmark = pytest.mark.usefixtures("fake_exits", "warned")
WARNED = []

DROPIN = "50-gpunode-cpuset.conf"
SYSTEM = "etc/systemd/system/system.slice.d/%s" % DROPIN
USER = "etc/systemd/system/user.slice.d/%s" % DROPIN
INIT = "etc/systemd/system/init.scope.d/%s" % DROPIN
SLICE = "etc/systemd/system/gpunode-workload.slice"
AFFINITY = "etc/systemd/system.conf.d/%s" % DROPIN
OURS = [SLICE, INIT, SYSTEM, USER]
HEADER = "# Managed by gpunode.tuning (cpuset_slices module, 50-gpunode-cpuset.conf): local changes are overwritten.\n"


# ------------------------------------------------------------------ trees --

def make_tree(path, cpus=16, controllers="cpuset cpu io memory pids", systemd=False, units=("system.slice", "user.slice", "init.scope")):
    """A 16-CPU node on cgroup v2: the root cgroup, and a cgroup (with processes) for each unit, no cpuset files
    below the root yet (the cpuset controller is enabled only where a unit asks for it)."""
    tree = treegen.build_tree(path, {"cpus": cpus})
    cg = os.path.join(tree.sys, "fs/cgroup")
    os.makedirs(cg)
    if controllers is not None:
        write(os.path.join(cg, "cgroup.controllers"), controllers + "\n")
    write(os.path.join(cg, "cpuset.cpus.effective"), "0-%d\n" % (cpus - 1))
    for unit in units:
        make_cgroup(tree, U.slice_path(unit) if unit.endswith(".slice") else unit)
    if systemd:
        os.makedirs(os.path.join(tree.root, "run/systemd/system"))
    return tree


def make_cgroup(tree, rel, populated=True):
    write(os.path.join(tree.sys, "fs/cgroup", rel, "cgroup.events"), "populated %d\nfrozen 0\n" % populated)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def read(tree, rel):
    with open(os.path.join(tree.root, rel)) as handle:
        return handle.read()


def cgroup(tree, rel, name):
    path = os.path.join(tree.sys, "fs/cgroup", rel, name)
    return open(path).read().strip() if os.path.exists(path) else None


def snapshot(tree, inodes=True):
    """Every file, link and directory under the tree, with content hash, mode and inode (a rewrite shows;
    a rollback puts the bytes back in a new inode, so ``inodes=False`` there)."""
    out = {}
    for base, dirs, files in os.walk(tree.root):
        for name in dirs + files:
            path = os.path.join(base, name)
            st = os.lstat(path)
            if os.path.islink(path):
                out[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[path] = (hashlib.sha256(handle.read()).hexdigest(), st.st_mode, st.st_ino if inodes else None)
            else:
                out[path] = ("dir", st.st_mode)
    return out


@pytest.fixture
def warned(monkeypatch):
    """module.warn() collected, so run() can return the warnings the way Ansible shows them in the result."""
    del WARNED[:]
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning: WARNED.append(warning))


@pytest.fixture
def node(tmp_path):
    return make_tree(tmp_path / "tree")


def run(tree, check=False, diff=False, **args):
    """main() on the tree; irq_cpus 0-3 unless given, and an option given as None is left out."""
    args = dict((k, v) for k, v in dict(dict(irq_cpus="0-3"), **args).items() if v is not None)
    args.setdefault("root", tree.root)
    args.setdefault("sysfs_path", tree.sys)
    del WARNED[:]
    kind, result = modharness.run(cpuset_slices, args, check=check, diff=diff)
    if kind is Exit:
        assert "warnings" not in result       # through module.warn, not the deprecated exit_json(warnings=...)
        result["warnings"] = list(WARNED)
    return kind, result


# ---------------------------------------------------------------- present --

def test_present_writes_one_dropin_per_unit_and_the_workload_slice(node):
    kind, result = run(node, reserved_cpus="8")
    assert kind is Exit and result["changed"] is True, result
    assert (result["housekeeping_cpus"], result["workload_cpus"], result["unassigned_cpus"]) == ("0-3,8", "4-7,9-15", "")
    assert read(node, SYSTEM) == HEADER + (
        "# system.slice runs on the housekeeping CPUs (NIC IRQs, reserved CPUs); the workload\n"
        "# runs on the other CPUs, in gpunode-workload.slice.\n[Slice]\nAllowedCPUs=0-3,8\n")
    assert read(node, USER).endswith("[Slice]\nAllowedCPUs=0-3,8\n")
    assert read(node, INIT).endswith("[Scope]\nAllowedCPUs=0-3,8\n")
    assert read(node, SLICE) == HEADER + (
        "# The workload CPUs. Run work here: systemd-run --slice=gpunode-workload.slice ...,\n"
        "# or docker run --cgroup-parent=gpunode-workload.slice --cpuset-cpus=4-7,9-15 ...\n"
        "# A dash in a slice name means a parent slice: this one is in gpunode.slice.\n"
        "[Unit]\nDescription=Workload CPUs 4-7,9-15 (gpunode.tuning cpuset_slices)\n"
        "Documentation=man:systemd.slice(5) man:systemd.resource-control(5)\n\n"
        "[Slice]\nAllowedCPUs=4-7,9-15\n")
    for rel in OURS:
        st = os.stat(os.path.join(node.root, rel))
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o644, 0, 0), rel
    assert not os.path.exists(os.path.join(node.root, AFFINITY))
    assert [(f["path"], f["action"]) for f in result["files"]] == [("/" + p, "create") for p in OURS]
    assert result["reboot_required"] is False
    # on a tree: no systemctl, said so; the cgroups as found (no cpuset files below the root yet)
    assert result["systemd"] == ["daemon-reload (root %s is not /: not run)" % node.root]
    assert any("not /" in w and "no systemctl runs" in w for w in result["warnings"])
    assert result["effective"]["system.slice"] == {"cgroup": "system.slice", "cpus": None, "effective": "0-15"}
    assert result["effective"]["gpunode-workload.slice"] == {"cgroup": None, "cpus": None, "effective": None}
    assert [d["unit"] for d in result["drift"]] == ["init.scope", "system.slice", "user.slice"]


def test_second_run_changes_nothing_and_leaves_the_files_byte_identical(node):
    assert run(node)[1]["changed"] is True
    before = snapshot(node)
    kind, result = run(node)
    assert kind is Exit and result["changed"] is False, result
    assert {f["action"] for f in result["files"]} == {"unchanged"} and result["systemd"] == []
    assert snapshot(node) == before
    kind, result = run(node, check=True, diff=True)
    assert result["changed"] is False and result["diff"] == []     # drift on a tree is reported, not acted on
    assert snapshot(node) == before


def test_check_mode_reports_the_exact_plan_with_a_diff_and_writes_nothing(node):
    before = snapshot(node)
    kind, result = run(node, check=True, diff=True, cpu_affinity=True)
    assert kind is Exit and result["changed"] is True and result["reboot_required"] is True
    assert snapshot(node) == before
    assert [(f["path"], f["action"], f["reason"]) for f in result["files"]] == [
        ("/" + AFFINITY, "create", "missing")] + [("/" + p, "create", "missing") for p in OURS]
    files = result["diff"]
    assert [d["after_header"] for d in files] == ["/" + AFFINITY] + ["/" + p for p in OURS]
    assert files[0]["before"] == "" and files[0]["after"].endswith("[Manager]\nCPUAffinity=0-3\n")
    # the real run writes exactly what check mode showed
    kind, real = run(node, cpu_affinity=True)
    assert [(f["path"], f["action"]) for f in real["files"]] == [(f["path"], f["action"]) for f in result["files"]]
    for d in files:
        assert read(node, d["after_header"].lstrip("/")) == d["after"]


def test_cpu_affinity_sets_reboot_required_only_when_its_file_changes(node):
    kind, result = run(node, cpu_affinity=True)
    assert result["reboot_required"] is True and read(node, AFFINITY).endswith("[Manager]\nCPUAffinity=0-3\n")
    assert any("CPUAffinity=" in w and "daemon-reload" in w and "Reboot" in w for w in result["warnings"])
    assert run(node, cpu_affinity=True)[1]["reboot_required"] is False
    kind, result = run(node, cpu_affinity=True, reserved_cpus="15")
    assert result["reboot_required"] is True and read(node, AFFINITY).endswith("CPUAffinity=0-3,15\n")
    assert run(node, cpu_affinity=True, reserved_cpus="15")[1]["reboot_required"] is False
    kind, result = run(node, reserved_cpus="15")                                # cpu_affinity false: its file goes
    assert [(f["path"], f["action"]) for f in result["files"] if f["action"] != "unchanged"] == [("/" + AFFINITY, "remove")]
    assert result["reboot_required"] is True and result["changed"] is True
    assert not os.path.exists(os.path.join(node.root, "etc/systemd/system.conf.d"))
    assert run(node, reserved_cpus="15")[1]["reboot_required"] is False


def test_a_unit_dropped_from_the_list_loses_its_dropin_and_empty_dir(node):
    run(node)
    kind, result = run(node, housekeeping_units=["system.slice", "init.scope"])
    assert [(f["path"], f["action"]) for f in result["files"] if f["action"] != "unchanged"] == [("/" + USER, "remove")]
    assert not os.path.exists(os.path.join(node.root, os.path.dirname(USER)))
    assert "user.slice" in result["effective"]


def test_a_renamed_workload_slice_replaces_the_old_one(node):
    run(node)
    kind, result = run(node, workload_slice="training.slice")
    changes = [(f["path"], f["action"]) for f in result["files"] if f["action"] != "unchanged"]
    assert ("/etc/systemd/system/training.slice", "create") in changes and ("/" + SLICE, "remove") in changes
    assert "in training.slice" in read(node, SYSTEM)
    assert not os.path.exists(os.path.join(node.root, SLICE))


def test_explicit_split_reports_unassigned_cpus(node):
    kind, result = run(node, irq_cpus=None, housekeeping_cpus="0-1", workload_cpus="4-15")
    assert (result["housekeeping_cpus"], result["workload_cpus"], result["unassigned_cpus"]) == ("0-1", "4-15", "2-3")
    assert read(node, SLICE).endswith("AllowedCPUs=4-15\n")


# ----------------------------------------------------------------- absent --

def test_absent_removes_exactly_its_files_and_the_dirs_left_empty(node):
    run(node, cpu_affinity=True)
    write(os.path.join(node.root, "etc/systemd/system/system.slice.d/10-local.conf"), "[Slice]\nMemoryAccounting=yes\n")
    write(os.path.join(node.root, "etc/systemd/system/other.slice"), "[Slice]\n")
    write(os.path.join(node.root, "etc/systemd/system.conf.d/10-local.conf"), "[Manager]\n")
    kind, result = run(node, state="absent")
    assert kind is Exit and result["changed"] is True and result["reboot_required"] is True
    assert sorted((f["path"], f["action"]) for f in result["files"]) == sorted(
        [("/" + p, "remove") for p in OURS + [AFFINITY]])
    for rel in OURS + [AFFINITY, "etc/systemd/system/user.slice.d", "etc/systemd/system/init.scope.d"]:
        assert not os.path.exists(os.path.join(node.root, rel)), rel
    for rel in ("etc/systemd/system/system.slice.d/10-local.conf", "etc/systemd/system/other.slice",
                "etc/systemd/system.conf.d/10-local.conf"):
        assert os.path.exists(os.path.join(node.root, rel)), rel
    assert (result["housekeeping_cpus"], result["workload_cpus"]) == ("", "")
    before = snapshot(node)
    kind, result = run(node, state="absent")
    assert result["changed"] is False and result["files"] == [] and snapshot(node) == before


def test_absent_leaves_a_file_it_did_not_write(node):
    write(os.path.join(node.root, SYSTEM), "[Slice]\nAllowedCPUs=0\n")
    before = snapshot(node)
    kind, result = run(node, state="absent")
    assert kind is Exit and result["changed"] is False and snapshot(node) == before
    assert any(SYSTEM in w and "left alone" in w for w in result["warnings"])


def test_absent_needs_no_cpu_options_and_no_cgroup_v2(tmp_path):
    tree = make_tree(tmp_path / "tree")
    run(tree)
    shutil.rmtree(os.path.join(tree.sys, "fs/cgroup"))
    kind, result = run(tree, irq_cpus=None, state="absent")
    assert kind is Exit and result["changed"] is True
    assert not any(os.path.exists(os.path.join(tree.root, p)) for p in OURS)


# --------------------------------------------------------------- rollback --

def test_a_failed_write_rolls_back_every_file_written_before(node):
    run(node)
    write(os.path.join(node.root, "etc/systemd/system/keep.txt"), "x")
    os.remove(os.path.join(node.root, USER))
    os.mkdir(os.path.join(node.root, USER))                # the last file of the plan cannot be written
    before = snapshot(node, inodes=False)
    kind, result = run(node, reserved_cpus="8", cpu_affinity=True)
    assert kind is Fail and USER in result["msg"] and "rolled back" in result["msg"], result
    assert snapshot(node, inodes=False) == before
    assert read(node, SYSTEM).endswith("AllowedCPUs=0-3\n")


def test_a_failed_first_write_leaves_no_directory_behind(node):
    os.makedirs(os.path.join(node.root, "etc/systemd/system"))
    os.mkdir(os.path.join(node.root, SLICE))
    os.mkdir(os.path.join(node.root, SLICE, "x"))
    before = snapshot(node)
    kind, result = run(node)
    assert kind is Fail and "rolled back" in result["msg"]
    assert snapshot(node) == before


# -------------------------------------------------------------- bad input --

@pytest.mark.parametrize("args,fragments", [
    ({"housekeeping_units": ["system.service"]}, ["system.service", ".slice or .scope"]),
    ({"housekeeping_units": ["system.slice", "bad name.slice"]}, ["'bad name.slice'", "characters"]),
    ({"housekeeping_units": ["-foo.slice"]}, ["-foo.slice", "dash"]),
    ({"housekeeping_units": ["foo-.slice"]}, ["foo-.slice", "dash"]),
    ({"housekeeping_units": ["a--b.slice"]}, ["a--b.slice", "dash"]),
    ({"housekeeping_units": ["x@y.slice"]}, ["x@y.slice", "@"]),
    ({"housekeeping_units": ["getty@.scope"]}, ["getty@.scope", "template"]),
    ({"housekeeping_units": [".slice"]}, ["'.slice'", "nothing before"]),
    ({"housekeeping_units": [""]}, ["''", "empty"]),
    ({"housekeeping_units": ["a" * 250 + ".slice"]}, ["longer than 255"]),
    ({"housekeeping_units": ["../../etc.slice"]}, ["../../etc.slice", "characters"]),
    ({"housekeeping_units": ["-.slice"]}, ["-.slice", "root slice"]),
    ({"housekeeping_units": []}, ["housekeeping_units is empty"]),
    ({"workload_slice": "work.scope"}, ["workload_slice", "work.scope", ".slice"]),
    ({"workload_slice": "work"}, ["workload_slice", "'work'"]),
    ({"workload_slice": "-.slice"}, ["workload_slice", "root slice"]),
    ({"workload_slice": "system.slice"}, ["system.slice", "also in housekeeping_units"]),
    ({"workload_slice": "system-work.slice"}, ["system-work.slice", "inside housekeeping unit system.slice",
                                               "system.slice/system-work.slice"]),
    ({"workload_slice": "gpu.slice", "housekeeping_units": ["gpu-svc.slice"]}, ["gpu-svc.slice", "inside workload_slice"]),
    ({"dropin_name": "../x.conf"}, ["dropin_name", "../x.conf", ".conf"]),
    ({"dropin_name": "50-x"}, ["dropin_name", "50-x"]),
    ({"dropin_name": ".hidden.conf"}, ["dropin_name"]),
    ({"irq_cpus": "0-3,16"}, ["irq_cpus", "CPU 16", "not online", "0-15"]),
    ({"irq_cpus": "0-x"}, ["irq_cpus", "0-x"]),
    ({"irq_cpus": "", "reserved_cpus": ""}, ["housekeeping CPUs are empty", "housekeeping_cpus"]),
    ({"irq_cpus": "0-15"}, ["no workload CPUs"]),
    ({"workload_cpus": "3-15"}, ["workload_cpus 3-15", "overlap", "CPU 3"]),
    ({"housekeeping_cpus": "0-3"}, ["mutually exclusive", "housekeeping_cpus", "irq_cpus"]),
    ({"irq_cpus": None, "housekeeping_cpus": "0", "reserved_cpus": "1"}, ["mutually exclusive", "reserved_cpus"]),
    ({"state": "gone"}, ["state", "gone"]),
])
def test_bad_input_fails_naming_the_value_and_changes_nothing(node, args, fragments):
    before = snapshot(node)
    kind, result = run(node, **args)
    assert kind is Fail, result
    assert [f for f in fragments if f not in result["msg"]] == [], result["msg"]
    assert snapshot(node) == before


@pytest.mark.parametrize("rel", [
    "etc/systemd/system/system.slice.d/90-site.conf",
    "etc/systemd/system.control/system.slice.d/60-AllowedCPUs.conf",
    "run/systemd/system/slice.d/99-all-slices.conf",
    "usr/lib/systemd/system/system.slice.d/zz.conf",
    "etc/systemd/system/gpunode-.slice.d/10-any.conf",          # a dash prefix: applies to gpunode-workload.slice
    "etc/systemd/system/gpunode-workload.slice.d/10-any.conf",  # any drop-in overrides the slice's own file
])
def test_an_allowed_cpus_that_would_override_ours_is_refused_before_writing(node, rel):
    write(os.path.join(node.root, rel), "[Slice]\nAllowedCPUs=\n")
    before = snapshot(node)
    kind, result = run(node)
    assert kind is Fail and "/" + rel in result["msg"] and "file-name order" in result["msg"], result
    assert result["path"] == "/" + rel and snapshot(node) == before


def test_an_allowed_cpus_that_sorts_before_ours_is_fine(node):
    write(os.path.join(node.root, "etc/systemd/system/system.slice.d/10-site.conf"), "[Slice]\nAllowedCPUs=0-15\n")
    write(os.path.join(node.root, "etc/systemd/system/system.slice.d/90-site.conf"), "[Slice]\nMemoryMax=1G\n")
    assert run(node)[0] is Exit


def test_cgroup_v1_is_refused(tmp_path):
    tree = make_tree(tmp_path / "tree", controllers=None)
    kind, result = run(tree)
    assert kind is Fail and "cgroup v2 is required" in result["msg"] and "cgroup.controllers" in result["msg"]
    assert result["path"].endswith("fs/cgroup/cgroup.controllers")
    assert not os.path.exists(os.path.join(tree.root, "etc/systemd"))


def test_no_cpuset_controller_is_refused(tmp_path):
    tree = make_tree(tmp_path / "tree", controllers="cpu io memory pids")
    kind, result = run(tree)
    assert kind is Fail and "cpuset controller is not available" in result["msg"] and "cpu io memory pids" in result["msg"]
    assert not os.path.exists(os.path.join(tree.root, "etc/systemd"))


@pytest.mark.parametrize("which", ["root", "sysfs_path"])
def test_the_live_host_and_a_tree_are_never_mixed(node, which):
    args = {"root": "/"} if which == "root" else {"sysfs_path": "/sys"}
    kind, result = run(node, **args)
    assert kind is Fail and "not the same system" in result["msg"], result


def test_missing_roots_are_named(node, tmp_path):
    kind, result = run(node, root=str(tmp_path / "nowhere"))
    assert kind is Fail and "nowhere" in result["msg"] and result["option"] == "root"
    kind, result = run(node, sysfs_path=node.etc)
    assert kind is Fail and "devices/system/cpu" in result["msg"] and result["option"] == "sysfs_path"


def test_the_online_cpus_come_from_sysfs(tmp_path):
    tree = make_tree(tmp_path / "tree", cpus=8)
    write(os.path.join(tree.sys, "devices/system/cpu/online"), "0-5\n")
    kind, result = run(tree, irq_cpus="0-1")
    assert result["workload_cpus"] == "2-5"
    kind, result = run(tree, irq_cpus="0-1", workload_cpus="2-7")
    assert kind is Fail and "CPUs 6-7" in result["msg"] and "0-5" in result["msg"]


# -------------------------------------------------------- cgroup layout --

@pytest.mark.parametrize("unit,path", [
    ("system.slice", "system.slice"),
    ("gpunode-workload.slice", "gpunode.slice/gpunode-workload.slice"),
    ("a-b-c.slice", "a.slice/a-b.slice/a-b-c.slice"),
])
def test_a_dash_in_a_slice_name_is_a_parent_slice(unit, path):
    assert U.slice_path(unit) == path


def test_scopes_are_found_in_the_slice_they_run_in(node):
    cg = os.path.join(node.sys, "fs/cgroup")
    make_cgroup(node, "system.slice/slurmstepd.scope")
    assert G.cgroup_of(cg, "init.scope") == "init.scope"
    assert G.cgroup_of(cg, "slurmstepd.scope") == "system.slice/slurmstepd.scope"
    assert G.cgroup_of(cg, "gone.scope") is None and G.cgroup_of(cg, "gone.slice") is None
    write(os.path.join(cg, "system.slice/cpuset.cpus.effective"), "0-3\n")
    assert G.read_live(cg, "slurmstepd.scope")["effective"] == "0-3"     # inherited from the nearest cpuset


# ------------------------------------------------------ systemd-analyze --

@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed on this machine")
def test_the_rendered_units_pass_systemd_analyze_verify(node, tmp_path):
    run(node, reserved_cpus="8", cpu_affinity=True)
    units = tmp_path / "units"
    shutil.copytree(os.path.join(node.root, "etc/systemd/system"), str(units))
    for unit in ("system.slice", "user.slice"):          # the units the drop-ins belong to, as systemd ships them
        (units / unit).write_text("[Unit]\nDescription=%s\n" % unit)
    # Scopes cannot be loaded from files (src/core/scope.c scope_load() refuses non-transient scopes), so
    # init.scope's drop-in is verified as a slice's: [Scope] and [Slice] take the same cgroup settings.
    (units / "scope-as.slice").write_text("[Unit]\nDescription=init.scope drop-in\n")
    (units / "scope-as.slice.d").mkdir()
    (units / "scope-as.slice.d" / DROPIN).write_text(read(node, INIT).replace("[Scope]", "[Slice]"))
    for name in ("gpunode-workload.slice", "system.slice", "user.slice", "scope-as.slice"):
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", str(units / name)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and str(units) not in proc.stderr, (name, proc.stdout, proc.stderr)
    # and a bad value is caught, so the check is real
    (units / "bad.slice").write_text("[Slice]\nAllowedCPUs=0-x\n")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", str(units / "bad.slice")],
                          capture_output=True, text=True, check=False)
    assert "bad.slice" in proc.stderr


# ------------------------------------------------------- docs and spec --

def test_documented_options_and_defaults_are_the_argument_spec():
    options = yaml.safe_load(cpuset_slices.DOCUMENTATION)["options"]
    assert set(options) == set(C.ARGUMENT_SPEC)
    for name, spec in C.ARGUMENT_SPEC.items():
        assert options[name]["type"] == spec["type"], name
        assert options[name].get("default") == spec.get("default"), name
    assert C.ARGUMENT_SPEC["housekeeping_units"]["default"] == C.DEFAULT_UNITS
    returned = set(yaml.safe_load(cpuset_slices.RETURN))
    assert returned == {"housekeeping_cpus", "workload_cpus", "unassigned_cpus", "files", "effective", "drift",
                        "systemd", "reboot_required", "system_slice", "warnings"}


def test_the_notes_carry_the_recipes():
    notes = " ".join(yaml.safe_load(cpuset_slices.DOCUMENTATION)["notes"])
    for recipe in ("taskset -c", "numactl --physcpubind=", "systemd-run --slice=", "podman run --cpuset-cpus=",
                   "docker run --cgroup-parent=", "reservedSystemCPUs"):
        assert recipe in notes, recipe


# ------------------------------------------------- live: a fake systemd --

class FakeSystemd(object):
    """systemctl on a tree as systemd v252 does it: daemon-reload re-applies AllowedCPUs= (from the tree's unit
    files) to every unit with a cgroup, and writes nothing for a unit without it; stop removes a unit's cgroup."""

    def __init__(self, tree, applies=True):
        self.tree, self.applies, self.calls = tree, applies, []

    def allowed(self, unit):
        base = os.path.join(self.tree.root, "etc/systemd/system")
        value = ""
        top = os.path.join(base, "service.d")                 # the top-level drop-ins of every service (v244+)
        if unit.endswith(".service") and os.path.isdir(top):
            for name in sorted(os.listdir(top)):
                for line in open(os.path.join(top, name)):
                    if line.startswith("AllowedCPUs="):
                        value = line.split("=", 1)[1].strip()
        for path in [os.path.join(base, unit)] + sorted(
                os.path.join(base, unit + ".d", n) for n in os.listdir(os.path.join(base, unit + ".d"))
                if n.endswith(".conf")) if os.path.isdir(os.path.join(base, unit + ".d")) else [os.path.join(base, unit)]:
            if os.path.isfile(path):
                for line in open(path):
                    if line.startswith("AllowedCPUs="):
                        value = line.split("=", 1)[1].strip()
        return value

    def __call__(self, argv):
        self.calls.append(list(argv))
        assert argv[0] == "systemctl", argv
        cg = os.path.join(self.tree.sys, "fs/cgroup")
        if argv[1] == "daemon-reload":
            if self.applies:
                for unit in self.units():
                    rel = G.cgroup_of(cg, unit)
                    value = self.allowed(unit)
                    if rel and value:
                        write(os.path.join(cg, rel, "cpuset.cpus"), value + "\n")
                        write(os.path.join(cg, rel, "cpuset.cpus.effective"), value + "\n")
            return 0, "", ""
        if argv[1] == "stop":
            shutil.rmtree(os.path.join(cg, G.cgroup_of(cg, argv[2])))
            return 0, "", ""
        if argv[1] == "show" and argv[2] == "--property=AllowedCPUs":
            return 0, "\n\n".join("AllowedCPUs=%s" % self.allowed(u) for u in argv[3:]) + "\n", ""
        return 1, "", "unexpected %s" % argv

    def units(self):
        cg = os.path.join(self.tree.sys, "fs/cgroup")
        for base, dirs, _files in os.walk(cg):
            for name in dirs:
                if name.endswith((".slice", ".scope", ".service")):
                    yield name

    def actions(self):
        return [" ".join(c[1:]) for c in self.calls if c[1] != "show"]


@pytest.fixture
def live_node(tmp_path):
    return make_tree(tmp_path / "tree", systemd=True)


def live(tree, fake, check=False, **args):
    params = dict((k, v.get("default")) for k, v in C.ARGUMENT_SPEC.items())
    params.update(irq_cpus="0-3", root=tree.root, sysfs_path=tree.sys)
    params.update(args)
    fake.calls = []
    return C.converge(params, fake, check, sleep=lambda s: None)


def test_live_apply_reloads_once_and_reads_the_cgroups_back(live_node):
    fake = FakeSystemd(live_node)
    result, _diff = live(live_node, fake)
    assert fake.actions() == ["daemon-reload"] and result["systemd"] == ["daemon-reload"] and result["changed"] is True
    for unit in ("system.slice", "user.slice", "init.scope"):
        assert result["effective"][unit] == {"cgroup": unit, "cpus": "0-3", "effective": "0-3"}, unit
    assert result["effective"]["gpunode-workload.slice"]["cgroup"] is None       # started by its first unit
    assert not any("not /" in w for w in result["warnings"])
    result, _diff = live(live_node, fake)
    assert fake.calls == [] and result["changed"] is False and result["drift"] == []
    result, _diff = live(live_node, fake, check=True)
    assert fake.calls == [] and result["changed"] is False


def test_live_check_mode_runs_nothing_and_reports_the_plan(live_node):
    fake = FakeSystemd(live_node)
    before = snapshot(live_node)
    result, diff = live(live_node, fake, check=True)
    assert fake.calls == [] and snapshot(live_node) == before
    assert result["changed"] is True and result["systemd"] == ["daemon-reload"]
    assert [d["reason"] for d in result["drift"]] == ["no cpuset.cpus (the cpuset controller is not enabled for it), want 0-3"] * 3


def test_live_drift_with_right_files_is_reported_in_check_mode_and_fixed_by_a_reload(live_node):
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    make_cgroup(live_node, "gpunode.slice/gpunode-workload.slice")               # a unit ran in it
    live(live_node, fake)
    cg = os.path.join(live_node.sys, "fs/cgroup")
    write(os.path.join(cg, "system.slice/cpuset.cpus"), "0-15\n")              # systemctl set-property by hand
    write(os.path.join(cg, "system.slice/cpuset.cpus.effective"), "0-15\n")
    result, diff = live(live_node, fake, check=True)
    assert fake.calls == [] and result["changed"] is True and {f["action"] for f in result["files"]} == {"unchanged"}
    assert result["drift"] == [{"unit": "system.slice", "cgroup": "system.slice", "reason": "cpuset.cpus is 0-15, want 0-3",
                                "cpus": "0-15", "effective": "0-15", "want": "0-3"}]
    assert diff == [{"before_header": "%s/system.slice/cpuset.cpus (live)" % cg,
                     "after_header": "%s/system.slice/cpuset.cpus (after apply)" % cg, "before": "0-15\n", "after": "0-3\n"}]
    result, _diff = live(live_node, fake)
    assert fake.actions() == ["daemon-reload"] and result["changed"] is True
    assert result["effective"]["system.slice"]["cpus"] == "0-3"
    assert result["effective"]["gpunode-workload.slice"] == {"cgroup": "gpunode.slice/gpunode-workload.slice",
                                                             "cpus": "4-15", "effective": "4-15"}
    assert live(live_node, fake)[0]["changed"] is False


def test_live_apply_fails_with_what_it_found_when_the_cgroups_do_not_follow(live_node):
    fake = FakeSystemd(live_node, applies=False)
    with pytest.raises(C.SliceError) as exc:
        live(live_node, fake)
    message = str(exc.value)
    assert "after systemctl daemon-reload" in message and "system.slice (system.slice): no cpuset.cpus" in message
    assert exc.value.details["expected"]["system.slice"] == "0-3"
    assert exc.value.details["effective"]["system.slice"]["effective"] == "0-15"
    assert os.path.exists(os.path.join(live_node.root, SYSTEM))                 # the files are what was asked


def test_live_absent_clears_what_systemd_leaves_and_stops_the_empty_workload_slice(live_node):
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    make_cgroup(live_node, "gpunode.slice/gpunode-workload.slice", populated=False)
    live(live_node, fake)
    cg = os.path.join(live_node.sys, "fs/cgroup")
    result, _diff = live(live_node, fake, check=True, state="absent")
    assert fake.calls == [] and result["systemd"] == [
        "daemon-reload", "stop gpunode-workload.slice", "reset init.scope cpuset.cpus (write an empty list)",
        "reset system.slice cpuset.cpus (write an empty list)", "reset user.slice cpuset.cpus (write an empty list)"]
    result, _diff = live(live_node, fake, state="absent")
    assert fake.actions() == ["daemon-reload", "stop gpunode-workload.slice"]
    assert [c for c in fake.calls if c[1] == "show"] == [
        ["systemctl", "show", "--property=AllowedCPUs", "init.scope", "system.slice", "user.slice"]]
    assert result["systemd"][-3:] == ["reset init.scope cpuset.cpus", "reset system.slice cpuset.cpus", "reset user.slice cpuset.cpus"]
    for unit in ("system.slice", "user.slice", "init.scope"):
        assert cgroup(live_node, unit, "cpuset.cpus") == "" and result["effective"][unit]["cpus"] == "", unit
    assert not os.path.exists(os.path.join(cg, "gpunode.slice/gpunode-workload.slice"))
    result, _diff = live(live_node, fake, state="absent")
    assert fake.calls == [] and result["changed"] is False


def test_live_absent_leaves_a_busy_workload_slice_running(live_node):
    fake = FakeSystemd(live_node)
    make_cgroup(live_node, "gpunode.slice/gpunode-workload.slice", populated=True)
    live(live_node, fake)
    result, _diff = live(live_node, fake, state="absent")
    assert "stop gpunode-workload.slice" not in fake.actions()
    assert any("gpunode-workload.slice still has processes" in w for w in result["warnings"])
    assert cgroup(live_node, "gpunode.slice/gpunode-workload.slice", "cpuset.cpus") == ""   # its CPUs given back


def test_live_absent_keeps_allowed_cpus_that_another_file_sets(live_node):
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    write(os.path.join(live_node.root, "etc/systemd/system/user.slice.d/10-site.conf"), "[Slice]\nAllowedCPUs=0-7\n")
    assert live(live_node, fake)[0]["changed"] is False            # ours sorts after it: ours holds
    result, _diff = live(live_node, fake, state="absent")
    assert cgroup(live_node, "user.slice", "cpuset.cpus") == "0-7"
    assert any("user.slice has AllowedCPUs= from /etc/systemd/system/user.slice.d/10-site.conf" in w for w in result["warnings"])
    assert live(live_node, fake, state="absent")[0]["changed"] is False


def test_live_without_systemd_fails_before_writing(node):
    before = snapshot(node)
    with pytest.raises(C.SliceError, match="systemd is not running"):
        live(node, FakeSystemd(node))
    assert snapshot(node) == before


def test_a_failed_systemctl_is_named(live_node):
    def broken(argv):
        return 1, "", "Failed to reload daemon: Access denied"
    params = dict((k, v.get("default")) for k, v in C.ARGUMENT_SPEC.items())
    params.update(irq_cpus="0-3", root=live_node.root, sysfs_path=live_node.sys)
    with pytest.raises(C.SliceError, match="systemctl daemon-reload failed .rc 1.: Failed to reload daemon: Access denied") as exc:
        C.converge(params, broken, False)
    assert "the files are written" in str(exc.value) and "/" + SYSTEM in exc.value.details["files"]


def test_the_persist_writer_is_the_one_used():
    assert C.apply_files is _persist.apply_files and C.plan_files is _persist.plan_files


# ------------------------------------------ system.slice, Slurm's job steps, podman --

SERVICES = "etc/systemd/system/service.d/%s" % DROPIN
MACHINE = "etc/systemd/system/machine.slice.d/%s" % DROPIN


def install_slurmd(tree, where="lib/systemd/system"):
    write(os.path.join(tree.root, where, "slurmd.service"), "[Service]\nExecStart=/usr/sbin/slurmd -D\nDelegate=yes\n")


def test_auto_without_slurm_confines_system_slice_itself(node):
    kind, result = run(node)
    assert result["system_slice"] == {"mode": "slice", "why": "no Slurm job steps in system.slice (slurmd not installed)"}
    assert os.path.exists(os.path.join(node.root, SYSTEM)) and not os.path.exists(os.path.join(node.root, SERVICES))


@pytest.mark.parametrize("where", ["lib/systemd/system", "etc/systemd/system", "usr/lib/systemd/system"])
def test_auto_with_slurmd_installed_confines_every_service_and_leaves_system_slice_free(node, where):
    install_slurmd(node, where)
    kind, result = run(node, reserved_cpus="8")
    assert kind is Exit and result["system_slice"]["mode"] == "services", result
    assert "slurmd is installed (/%s/slurmd.service)" % where in result["system_slice"]["why"]
    assert not os.path.exists(os.path.join(node.root, SYSTEM))
    text = read(node, SERVICES)
    assert text.startswith(HEADER) and text.endswith("[Service]\nAllowedCPUs=0-3,8\n"), text
    assert "slurmd is installed" in text                    # the file says why system.slice is free
    assert "system.slice" not in result["effective"] and "user.slice" in result["effective"]
    assert {(f["path"], f["action"]) for f in result["files"]} == {
        ("/" + SERVICES, "create"), ("/" + USER, "create"), ("/" + INIT, "create"), ("/" + SLICE, "create")}
    assert run(node, reserved_cpus="8")[1]["changed"] is False       # idempotent


def test_a_running_slurmstepd_scope_is_enough_for_auto(node):
    make_cgroup(node, "system.slice/slurmstepd.scope")
    kind, result = run(node)
    assert result["system_slice"] == {"mode": "services",
                                      "why": "Slurm's slurmstepd.scope, which holds the job steps, runs in system.slice"}


def test_system_slice_slice_is_kept_on_request_and_services_forced_without_slurm(node):
    install_slurmd(node)
    kind, result = run(node, system_slice="slice")
    assert result["system_slice"] == {"mode": "slice", "why": "system_slice=slice"}
    assert os.path.exists(os.path.join(node.root, SYSTEM)) and not os.path.exists(os.path.join(node.root, SERVICES))
    os.remove(os.path.join(node.root, "lib/systemd/system/slurmd.service"))
    kind, result = run(node, system_slice="services")
    assert result["system_slice"] == {"mode": "services", "why": "system_slice=services"}
    # switching modes removes the system.slice drop-in and writes the services one, in one run
    assert {(f["path"], f["action"]) for f in result["files"] if f["action"] != "unchanged"} == {
        ("/" + SYSTEM, "remove"), ("/" + SERVICES, "create")}


def test_system_slice_not_in_the_units_has_no_mode(node):
    install_slurmd(node)
    kind, result = run(node, housekeeping_units=["user.slice"])
    assert result["system_slice"]["mode"] is None and not os.path.exists(os.path.join(node.root, SERVICES))


def test_another_services_dropin_that_overrides_ours_is_refused(node):
    install_slurmd(node)
    write(os.path.join(node.root, "etc/systemd/system/service.d/99-local.conf"), "[Service]\nAllowedCPUs=0-15\n")
    before = snapshot(node)
    kind, result = run(node)
    assert kind is Fail and "99-local.conf sets AllowedCPUs= for every service" in result["msg"], result
    assert snapshot(node) == before


def test_workload_units_get_the_workload_cpus_and_absent_removes_them(node):
    kind, result = run(node, workload_units=["machine.slice"])
    assert read(node, MACHINE) == HEADER + (
        "# machine.slice holds workload (containers): it runs on the workload CPUs, as gpunode-workload.slice does.\n"
        "[Slice]\nAllowedCPUs=4-15\n")
    assert result["effective"]["machine.slice"] == {"cgroup": None, "cpus": None, "effective": None}
    kind, result = run(node, state="absent")
    assert not os.path.exists(os.path.join(node.root, MACHINE))
    assert ("/" + MACHINE, "remove") in [(f["path"], f["action"]) for f in result["files"]]


@pytest.mark.parametrize("unit,why", [
    ("system.slice", "housekeeping unit"), ("gpunode-workload.slice", "workload slice itself"),
    ("gpunode.slice", "parent of the workload slice"), ("system-docker.slice", "inside) a housekeeping unit"),
    ("-.slice", "root slice"), ("docker.service", "does not end in .slice or .scope"), ("a;b.slice", "letters, digits")])
def test_bad_workload_units_are_refused_naming_the_entry(node, unit, why):
    before = snapshot(node)
    kind, result = run(node, workload_units=[unit])
    # the one validator (_validate) refuses what is no unit name at all, before the module's own rules
    assert kind is Fail and result["option"].startswith("workload_units"), result
    assert unit in result["msg"], result["msg"]
    assert why in result["msg"], result["msg"]
    assert snapshot(node) == before


def test_live_services_mode_confines_services_not_slurms_scope(live_node):
    install_slurmd(live_node)
    make_cgroup(live_node, "system.slice/ssh.service")
    make_cgroup(live_node, "system.slice/slurmstepd.scope")
    fake = FakeSystemd(live_node)
    result, _diff = live(live_node, fake)
    assert result["system_slice"]["mode"] == "services" and fake.actions() == ["daemon-reload"]
    assert cgroup(live_node, "system.slice/ssh.service", "cpuset.cpus") == "0-3"
    assert cgroup(live_node, "system.slice", "cpuset.cpus") is None                 # free: Slurm's scope can get 4-15
    assert cgroup(live_node, "system.slice/slurmstepd.scope", "cpuset.cpus") is None
    assert live(live_node, fake)[0]["changed"] is False


def test_live_switch_to_services_clears_system_slices_old_cpuset(live_node):
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    assert cgroup(live_node, "system.slice", "cpuset.cpus") == "0-3"
    install_slurmd(live_node)
    result, _diff = live(live_node, fake)
    # systemd writes nothing for a unit whose AllowedCPUs= went away (Slurm keeps the controller on there): reset
    assert "reset system.slice cpuset.cpus" in result["systemd"]
    assert cgroup(live_node, "system.slice", "cpuset.cpus") == ""


def test_live_absent_clears_the_services_old_cpusets(live_node):
    install_slurmd(live_node)
    make_cgroup(live_node, "system.slice/ssh.service")
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    assert cgroup(live_node, "system.slice/ssh.service", "cpuset.cpus") == "0-3"
    result, _diff = live(live_node, fake, check=True, state="absent")
    assert "reset ssh.service cpuset.cpus (write an empty list)" in result["systemd"] and fake.calls == []
    result, _diff = live(live_node, fake, state="absent")
    assert not os.path.exists(os.path.join(live_node.root, SERVICES))
    assert "reset ssh.service cpuset.cpus" in result["systemd"]
    assert cgroup(live_node, "system.slice/ssh.service", "cpuset.cpus") == ""
    assert live(live_node, fake, state="absent")[0]["changed"] is False


def test_live_absent_where_the_kernel_refuses_an_empty_list_writes_the_parents_cpus(live_node, monkeypatch):
    """kernel/cgroup/cpuset.c validate_change(): a populated cgroup whose cpuset.cpus is not empty cannot be given an
    empty one (ENOSPC) - seen in the lab for dbus.service once Slurm kept the controller on in system.slice. The
    reset then writes the parent's effective CPUs (the same CPUs), and that is no drift. The rule is the kernel's,
    played by the tree's writer here; the lab's workload_fence absent step meets the real one."""
    install_slurmd(live_node)
    make_cgroup(live_node, "system.slice/dbus.service")
    fake = FakeSystemd(live_node)
    live(live_node, fake)
    write(os.path.join(live_node.sys, "fs/cgroup/system.slice/cpuset.cpus.effective"), "0-15\n")
    real = C._write_cpus

    def kernel(cgroot, rel, text):
        current = open(os.path.join(cgroot, rel, "cpuset.cpus")).read().strip()
        if not text and current and cgroup(live_node, rel, "cgroup.events").startswith("populated 1"):
            raise OSError(28, "No space left on device")
        real(cgroot, rel, text)
    monkeypatch.setattr(C, "_write_cpus", kernel)
    result, _diff = live(live_node, fake, state="absent")
    assert "reset dbus.service cpuset.cpus to its parent's 0-15" in result["systemd"], result["systemd"]
    assert cgroup(live_node, "system.slice/dbus.service", "cpuset.cpus") == "0-15"
    result, _diff = live(live_node, fake, state="absent")
    assert result["changed"] is False and result["drift"] == [], result
