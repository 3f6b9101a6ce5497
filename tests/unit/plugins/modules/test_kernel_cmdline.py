# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kernel_cmdline: the module's main() on trees of real GRUB files (root= a tmp dir, so only /bin/sh runs), and
converge() with an injected run function for what runs on a live system only: update-grub (a recorded-output
stand-in, and where this machine allows it the real grub-mkconfig in a private mount namespace) and grubby (a
recorded-output runner replaying published grubby --info outputs). Fixtures: tests/unit/fixtures/kernel_cmdline/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible.module_utils import basic

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import tree_which
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import kernel_cmdline as K
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import KernelCmdlineError
from ansible_collections.gpunode.tuning.plugins.module_utils._host import module as _host_module
from ansible_collections.gpunode.tuning.plugins.modules import kernel_cmdline

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_cmdline"
DROPIN = "etc/default/grub.d/zz-gpunode-tuning.cfg"
MARKER = "var/lib/gpunode-tuning/kernel-cmdline.json"
RUNNING = "BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/vda1 ro quiet\n"
ISOL = ["isolcpus=domain,managed_irq,2-3", "nohz_full=2-3"]
ISOL_BOOT = ["root=/dev/vda1", "ro", "isolcpus=domain,managed_irq,2-3", "nohz_full=2-3", "quiet"]

pytestmark = pytest.mark.usefixtures("fake_exits")


@pytest.fixture
def warned(monkeypatch):
    """What the module passes to module.warn."""
    out = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg: out.append(msg))
    return out


def make(tmp_path, *sources, running=RUNNING, files=None):
    """A node's tree: the etc/ of the fixture directories (later ones add files), ``files``, and T/proc/cmdline."""
    root = tmp_path / "root"
    for source in sources:
        shutil.copytree(str(FIX / source / "etc"), str(root / "etc"), dirs_exist_ok=True)
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "cmdline").write_text(running)
    return str(root), str(proc)


def run(root, proc, check=False, diff=False, **args):
    args = dict(dict(parameters=ISOL, bootloader="grub_debian", root=root, procfs_path=proc), **args)
    return modharness.run(kernel_cmdline, args, check=check, diff=diff)


def snapshot(root):
    """Every file, link and directory under ``root`` with content hash and mode."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = (hashlib.sha256(handle.read()).hexdigest(), os.stat(path).st_mode)
            else:
                out[os.path.relpath(path, root)] = ("dir", os.stat(path).st_mode)
    return out


def read(root, rel):
    with open(os.path.join(root, rel)) as handle:
        return handle.read()


def dropin_text(params):
    return (K.grub.DROPIN_HEADER % "/var/lib/gpunode-tuning/kernel-cmdline.json"
            + 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX %s"\n' % " ".join(params))


def sh_run(argv):
    env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="surrogateescape", env=env, check=False)
    return proc.returncode, proc.stdout, proc.stderr


# ------------------------------------------------------------------ grub_debian on a tree --

def test_check_mode_gives_the_exact_plan_and_writes_nothing(tmp_path):
    root, proc = make(tmp_path, "debian12")
    before = snapshot(root)
    kind, result = run(root, proc, check=True, diff=True)
    assert kind is Exit and result["changed"] is True, result
    assert result["files"] == [
        {"path": "/etc/default/grub.d/zz-gpunode-tuning.cfg", "action": "create", "reason": "missing"},
        {"path": "/var/lib/gpunode-tuning/kernel-cmdline.json", "action": "create", "reason": "missing"}]
    assert (result["bootloader"], result["configured_before"], result["configured_after"]) == ("grub_debian", ["quiet"], ISOL + ["quiet"])
    assert result["running"] == RUNNING.split() and result["reboot_required"] is True
    assert (result["bootloader_updated"], result["commands"], result["next_boot_cmdline"]) == (False, [], None)
    assert [d["before_header"] for d in result["diff"]] == [f["path"] for f in result["files"]]
    assert result["diff"][0]["after"] == dropin_text(ISOL) and result["diff"][0]["before"] == ""
    assert "no bootloader command runs" in result["msg"]
    assert snapshot(root) == before                     # not even a directory


def test_present_writes_the_drop_in_then_a_second_run_changes_nothing(tmp_path):
    root, proc = make(tmp_path, "debian12")
    kind, result = run(root, proc)
    assert kind is Exit and result["changed"] is True
    assert read(root, DROPIN) == dropin_text(ISOL)
    assert os.stat(os.path.join(root, DROPIN)).st_mode & 0o7777 == 0o644
    marker = json.loads(read(root, MARKER))
    assert marker == {"managed_by": "gpunode.tuning.kernel_cmdline", "bootloader": "grub_debian", "parameters": ISOL, "edits": []}
    assert read(root, "etc/default/grub") == (FIX / "debian12/etc/default/grub").read_text()
    after = snapshot(root)
    for check in (False, True):
        kind, again = run(root, proc, check=check)
        assert kind is Exit and again["changed"] is False, again
        assert [f["action"] for f in again["files"]] == ["unchanged", "unchanged"]
        assert again["configured_before"] == again["configured_after"] == ISOL + ["quiet"]
        assert snapshot(root) == after                  # byte for byte, modes too


def test_present_adds_to_what_earlier_runs_manage_and_replaces_a_value(tmp_path):
    root, proc = make(tmp_path, "debian12")
    run(root, proc, parameters=["isolcpus=2-3", "nohz_full=2-3"])
    kind, result = run(root, proc, parameters=["rcu_nocbs=2-3", "isolcpus=domain,2-3"])
    assert kind is Exit and result["managed"] == ["isolcpus=domain,2-3", "nohz_full=2-3", "rcu_nocbs=2-3"]
    assert read(root, DROPIN) == dropin_text(result["managed"])


def test_a_value_in_an_earlier_drop_in_is_replaced_and_put_back_byte_for_byte(tmp_path):
    root, proc = make(tmp_path, "debian12", "salt-formula-linux")
    original = snapshot(root)
    kind, result = run(root, proc)
    assert kind is Exit and result["changed"] is True
    custom = "etc/default/grub.d/99-custom-settings.cfg"
    assert read(root, custom) == ('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT elevator=deadline '
                                  'transparent_hugepage=always pti=off spectre_v2=auto"\n')   # $VAR and quotes kept
    assert "isolcpus=1,2,3,4" in result["configured_before"] and "isolcpus=1,2,3,4" not in result["configured_after"]
    assert result["configured_after"].count("isolcpus=domain,managed_irq,2-3") == 1
    assert json.loads(read(root, MARKER))["edits"][0]["removed"] == ["isolcpus=1,2,3,4"]
    kind, result = run(root, proc, parameters=["isolcpus", "nohz_full"], state="absent")
    assert kind is Exit and result["changed"] is True and result["managed"] == []
    assert [f["action"] for f in result["files"]] == ["update", "remove", "remove"]
    assert "isolcpus=1,2,3,4" in result["configured_after"]
    now = snapshot(root)
    assert dict((k, v) for k, v in now.items() if v[0] != "dir") == dict((k, v) for k, v in original.items() if v[0] != "dir")
    kind, result = run(root, proc, parameters=["isolcpus"], state="absent")
    assert kind is Exit and result["changed"] is False


def test_single_quotes_export_and_var_references_survive_and_come_back(tmp_path):
    root, proc = make(tmp_path, "synthetic-single-quotes")
    original = read(root, "etc/default/grub")
    kind, result = run(root, proc, parameters=["isolcpus=2-3", "nohz_full=2-3"])
    assert kind is Exit
    edited = read(root, "etc/default/grub")
    assert "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash'   # hand-edited, see ticket 42\n" in edited
    assert 'export GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX:-console=ttyS0,115200n8}\tmitigations=off"\n' in edited
    # giving back one key puts back its line only
    kind, result = run(root, proc, parameters=["nohz_full"], state="absent")
    assert kind is Exit and result["managed"] == ["isolcpus=2-3"]
    assert read(root, "etc/default/grub") == original.replace(" isolcpus=1-3", "")
    assert read(root, DROPIN) == dropin_text(["isolcpus=2-3"])
    kind, result = run(root, proc, parameters=["isolcpus"], state="absent")
    assert read(root, "etc/default/grub") == original and not os.path.exists(os.path.join(root, DROPIN))
    assert not os.path.exists(os.path.join(root, MARKER))


def test_absent_leaves_a_line_changed_since_and_warns(tmp_path, warned):
    root, proc = make(tmp_path, "synthetic-single-quotes")
    run(root, proc, parameters=["isolcpus=2-3"])
    path = os.path.join(root, "etc/default/grub")
    text = read(root, "etc/default/grub").replace("mitigations=off", "mitigations=auto")
    with open(path, "w") as handle:
        handle.write(text)
    kind, result = run(root, proc, parameters=["isolcpus"], state="absent")
    assert kind is Exit and read(root, "etc/default/grub") == text
    assert len(warned) == 1 and "was changed since" in warned[0] and "isolcpus=1-3" in warned[0]


def test_absent_of_a_key_it_does_not_manage_changes_nothing_and_says_so(tmp_path, warned):
    root, proc = make(tmp_path, "debian12", "salt-formula-linux")
    before = snapshot(root)
    kind, result = run(root, proc, parameters=["isolcpus"], state="absent")
    assert kind is Exit and result["changed"] is False and snapshot(root) == before
    assert "not managed by this module" in warned[0]


def test_bootloader_auto_finds_update_grub_under_the_root(tmp_path):
    root, proc = make(tmp_path, "debian12", files={"usr/sbin/update-grub": "#!/bin/sh\nexit 1\n"})
    os.chmod(os.path.join(root, "usr/sbin/update-grub"), 0o755)
    kind, result = run(root, proc, check=True, bootloader="auto")
    assert kind is Exit and result["bootloader"] == "grub_debian" and result["commands"] == []


def test_next_boot_and_reboot_required_from_the_trees_grub_cfg(tmp_path):
    root, proc = make(tmp_path, "debian12", running=RUNNING)
    run(root, proc)
    os.makedirs(os.path.join(root, "boot/grub"))
    shutil.copy(str(FIX / "grub-cfg/debian12-isolcpus.cfg"), os.path.join(root, "boot/grub/grub.cfg"))
    kind, result = run(root, proc)
    assert kind is Exit and result["changed"] is False
    assert result["next_boot_cmdline"] == ISOL_BOOT and result["reboot_required"] is True
    with open(os.path.join(proc, "cmdline"), "w") as handle:
        handle.write("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 %s\n" % " ".join(ISOL_BOOT))
    kind, result = run(root, proc)
    assert result["reboot_required"] is False
    kind, result = run(root, proc, check=True)              # check mode: computed from configured_after
    assert result["reboot_required"] is False


# --------------------------------------------------------------------------- bad input --

def put(rel, text, mode=None):
    def apply(root):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
        if mode:
            os.chmod(path, mode)
    return apply


BAD = [
    ("blank", {"parameters": ["nohz_full=2-3 quiet"]}, None, ["parameters[0]", "blank"]),
    ("newline", {"parameters": ["a=1", "nohz_full=2\n"]}, None, ["parameters[1]", "blank"]),
    ("double-quote", {"parameters": ['a="x"']}, None, ["'\"'"]),
    ("single-quote", {"parameters": ["a='x'"]}, None, ["\"'\""]),
    ("dollar", {"parameters": ["memmap=1M$2M"]}, None, ["'$'"]),
    ("backtick", {"parameters": ["a=`id`"]}, None, ["'`'"]),
    ("backslash", {"parameters": ["a=\\x"]}, None, ["'\\\\'"]),
    ("semicolon", {"parameters": ["a=1;reboot"]}, None, ["';'"]),
    ("empty-key", {"parameters": ["=2-3"]}, None, ["key is empty"]),
    ("duplicate", {"parameters": ["nohz_full=2", "nohz-full=3"]}, None, ["already given by parameters[0]"]),
    ("isolcpus-flag", {"parameters": ["isolcpus=domain,io_queue,2-3"]}, None, ["'io_queue'", "managed_irq"]),
    ("isolcpus-cpulist", {"parameters": ["isolcpus=managed_irq,3-2"]}, None, ["'3-2'"]),
    ("nohz_full-cpulist", {"parameters": ["nohz_full=2-3,x"]}, None, ["'2-3,x'"]),
    ("rcu_nocbs-cpulist", {"parameters": ["rcu_nocbs=0-"]}, None, ["'0-'"]),
    ("irqaffinity-cpulist", {"parameters": ["irqaffinity=alll"]}, None, ["'alll'"]),
    ("grub-file-does-not-parse", {}, put("etc/default/grub.d/50-broken.cfg", 'GRUB_CMDLINE_LINUX="x\n'),
     ["50-broken.cfg does not parse"]),
    ("line-not-simple", {}, put("etc/default/grub.d/50-x.cfg", 'GRUB_CMDLINE_LINUX="`echo` isolcpus=1"\n'),
     ["50-x.cfg line 1", "command substitution", "never run"]),          # tree mode: refused before editing
    ("later-file-drops-the-line", {}, put("etc/default/grub.d/zz.cfg", 'GRUB_CMDLINE_LINUX="quiet"\n'), ["zz.cfg"]),
    ("no-bootloader-tool", {"bootloader": "auto"}, None, ["neither update-grub nor grubby found",
                                                          "isolcpus_bootloader", "cpu_power_bootloader"]),
    ("grubby-on-a-tree", {"bootloader": "auto"}, put("usr/sbin/grubby", "#!/bin/sh\n", 0o755), ["live system only"]),
    ("dropin-name", {"dropin_name": "99-gpunode"}, None, ["dropin_name", ".cfg"]),
    ("state-dir-relative", {"state_dir": "var/lib/x"}, None, ["state_dir", "absolute"]),
    ("marker-not-json", {}, put(MARKER, "{"), ["kernel-cmdline.json is not JSON"]),
    ("marker-of-another-bootloader", {}, put(MARKER, json.dumps({"managed_by": "gpunode.tuning.kernel_cmdline",
                                                                 "bootloader": "grubby", "parameters": []})),
     ["bootloader grubby", "this run uses grub_debian"]),
    ("marker-with-shell-characters", {}, put(MARKER, json.dumps({"managed_by": "gpunode.tuning.kernel_cmdline",
                                                                 "bootloader": "grub_debian", "parameters": ["a=$(reboot)"]})),
     ["kernel-cmdline.json", "'$'"]),
]


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("name,args,mutate,fragments", BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_names_it_and_changes_nothing(tmp_path, name, args, mutate, fragments, check):
    root, proc = make(tmp_path, "debian12")
    if mutate:
        mutate(root)
    before = snapshot(root)
    kind, result = run(root, proc, check=check, **args)
    assert kind is Fail, result
    assert all(f in result["msg"] for f in fragments), result["msg"]
    assert snapshot(root) == before


@pytest.mark.parametrize("args,fragments", [
    ({"root": "/nonexistent/root"}, ["root /nonexistent/root is not a directory"]),
    ({"procfs_path": "/nonexistent/proc"}, ["procfs_path /nonexistent/proc has no cmdline"]),
])
def test_bad_roots_fail_naming_them(tmp_path, args, fragments):
    root, proc = make(tmp_path, "debian12")
    before = snapshot(root)
    kind, result = modharness.run(kernel_cmdline, dict(dict(parameters=ISOL, bootloader="grub_debian", root=root,
                                                            procfs_path=proc), **args))
    assert kind is Fail and all(f in result["msg"] for f in fragments) and snapshot(root) == before


# --------------------------------------------------------------- applying, live paths --

def params(root, **extra):
    return dict(dict(parameters=ISOL, state="present", bootloader="grub_debian", root=root,
                     state_dir="/var/lib/gpunode-tuning", dropin_name="zz-gpunode-tuning.cfg"), **extra)


def test_a_failed_write_rolls_back_every_file(tmp_path):
    root, proc = make(tmp_path, "debian12", "salt-formula-linux")
    before = snapshot(root)
    from ansible_collections.gpunode.tuning.plugins.module_utils._host import files as _persist

    def write(path, data, mode):
        if path.endswith("kernel-cmdline.json"):
            raise OSError(28, "No space left on device")
        _persist.write_atomic(path, data, mode)

    with pytest.raises(KernelCmdlineError) as exc:
        K.converge(params(root), sh_run, False, False, tree_which(root), procfs=proc, write=write)
    assert "rolled back every file written before" in str(exc.value)
    assert dict((k, v) for k, v in snapshot(root).items() if v[0] != "dir") == \
        dict((k, v) for k, v in before.items() if v[0] != "dir")


class UpdateGrub(object):
    """Recorded-output stand-in for update-grub on a tree: /bin/sh runs for real; ``update-grub`` copies a grub.cfg
    generated by the real grub-mkconfig (grub-cfg/, see the README) into the tree, or fails."""

    def __init__(self, root, cfg=None, rc=0):
        self.root, self.cfg, self.rc, self.calls = root, cfg, rc, []

    def __call__(self, argv):
        if argv[0] == "/bin/sh":
            return sh_run(argv)
        self.calls.append(argv)
        assert argv == ["update-grub"], argv
        if self.rc:
            return self.rc, "", "/usr/sbin/grub-probe: error: failed to get canonical path of `overlay'.\n"
        os.makedirs(os.path.join(self.root, "boot/grub"), exist_ok=True)
        shutil.copy(str(FIX / "grub-cfg" / self.cfg), os.path.join(self.root, "boot/grub/grub.cfg"))
        return 0, "", "Generating grub configuration file ...\ndone\n"


def which_update_grub(name):
    return "/usr/sbin/update-grub" if name == "update-grub" else None


def test_update_grub_runs_after_the_writes_and_the_next_boot_is_read_back(tmp_path):
    root, proc = make(tmp_path, "debian12")
    runner = UpdateGrub(root, "debian12-isolcpus.cfg")
    result, _diff = K.converge(params(root), runner, False, True, which_update_grub, procfs=proc)
    assert runner.calls == [["update-grub"]] and result["commands"] == ["update-grub"]
    assert result["bootloader_updated"] is True and result["next_boot_cmdline"] == ISOL_BOOT
    assert result["reboot_required"] is True and result["warnings"] == []
    # rebooted into it: nothing to do, no update-grub, no reboot
    with open(os.path.join(proc, "cmdline"), "w") as handle:
        handle.write("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 %s\n" % " ".join(ISOL_BOOT))
    result, _diff = K.converge(params(root), runner, False, True, which_update_grub, procfs=proc)
    assert result["changed"] is False and runner.calls == [["update-grub"]] and result["reboot_required"] is False


def test_a_grub_cfg_without_the_parameters_is_a_warning(tmp_path):
    root, proc = make(tmp_path, "debian12")
    runner = UpdateGrub(root, "debian12-default.cfg")          # as if a custom entry were the default
    result, _diff = K.converge(params(root), runner, False, True, which_update_grub, procfs=proc)
    assert result["next_boot_cmdline"] == ["root=/dev/vda1", "ro", "quiet"]
    assert "does not carry isolcpus=domain,managed_irq,2-3 nohz_full=2-3 once" in result["warnings"][0]


def test_a_failed_update_grub_puts_the_files_back(tmp_path):
    root, proc = make(tmp_path, "debian12", "salt-formula-linux")
    before = snapshot(root)
    with pytest.raises(KernelCmdlineError) as exc:
        K.converge(params(root), UpdateGrub(root, rc=1), False, True, which_update_grub, procfs=proc)
    assert "update-grub failed (rc 1)" in str(exc.value) and "were put back" in str(exc.value)
    assert dict((k, v) for k, v in snapshot(root).items() if v[0] != "dir") == \
        dict((k, v) for k, v in before.items() if v[0] != "dir")


def test_check_mode_on_a_live_system_runs_no_update_grub(tmp_path):
    root, proc = make(tmp_path, "debian12")
    runner = UpdateGrub(root, "debian12-isolcpus.cfg")
    before = snapshot(root)
    result, _diff = K.converge(params(root), runner, True, True, which_update_grub, procfs=proc)
    assert result["commands"] == ["update-grub"] and runner.calls == [] and snapshot(root) == before
    assert result["bootloader_updated"] is False and result["reboot_required"] is True


def _sandbox_possible():
    if os.geteuid() != 0 or not shutil.which("grub-mkconfig") or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False).returncode == 0


PROBE = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    --target=device) echo /dev/vda1 ;;
    --target=fs_uuid) echo 2d0f8a5e-5f5c-4e4b-9c6e-3f0d2a7b9c11 ;;
    --target=fs) echo ext2 ;;
    --target=*) echo ;;
  esac
done
"""


@pytest.mark.skipif(not _sandbox_possible(), reason="needs root, grub-mkconfig (grub-common) and unshare")
def test_the_real_grub_mkconfig_puts_the_drop_in_on_the_next_boot(tmp_path):
    """update-grub is the real grub-mkconfig, in a private mount namespace: the tree's /etc/default and /boot are
    bind-mounted over the host's (which stay untouched), grub-probe answers for the container root."""
    root, proc = make(tmp_path, "debian12", "salt-formula-linux")
    boot = os.path.join(root, "boot")
    os.makedirs(os.path.join(boot, "grub"))
    for name in ("vmlinuz-6.1.0-18-amd64", "initrd.img-6.1.0-18-amd64"):
        open(os.path.join(boot, name), "w").close()
    probe = tmp_path / "grub-probe"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    script = ('set -e; mount --bind "$1/etc/default" /etc/default; mount --bind "$1/boot" /boot; '
              'mount --bind "$2" /usr/sbin/grub-probe; grub-mkconfig -o /boot/grub/grub.cfg')

    def runner(argv):
        if argv[0] == "/bin/sh":
            return sh_run(argv)
        assert argv == ["update-grub"]
        return sh_run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", root, str(probe)])

    result, _diff = K.converge(params(root), runner, False, True, which_update_grub, procfs=proc)
    assert result["bootloader_updated"] is True and result["warnings"] == [], result
    assert result["next_boot_cmdline"][:3] == ["root=/dev/vda1", "ro", "isolcpus=domain,managed_irq,2-3"]
    assert result["next_boot_cmdline"].count("isolcpus=domain,managed_irq,2-3") == 1
    assert "isolcpus=1,2,3,4" not in result["next_boot_cmdline"] and "intel_iommu=on" in result["next_boot_cmdline"]


# ----------------------------------------------------------------------------- grubby --

def info(name):
    return (FIX / "grubby" / name).read_text()


RHEL = info("rhel8.6-info-all.txt")
K0 = "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64"
K1 = "/boot/vmlinuz-0-rescue-67db13ba8cdb420794ef3ee0a8313205"
# Derived, not captured: the RHEL 8.6 capture with the args grubby --update-kernel=ALL --args=... leaves.
RHEL_AFTER = RHEL.replace('zswap.enabled=1"', 'zswap.enabled=1 isolcpus=domain,managed_irq,2-3 nohz_full=2-3"').replace(
    'rhgb quiet"', 'rhgb quiet isolcpus=domain,managed_irq,2-3 nohz_full=2-3"')
UPDATE = ["grubby", "--update-kernel=ALL", "--args=isolcpus=domain,managed_irq,2-3 nohz_full=2-3"]


class Recorded(object):
    """Recorded-output runner: each call must be the next argv of ``steps``, and gets its (rc, out, err)."""

    def __init__(self, steps):
        self.steps, self.calls = list(steps), []

    def __call__(self, argv):
        assert self.steps, "unexpected call %r" % (argv,)
        want, answer = self.steps.pop(0)
        assert argv == want, (argv, want)
        self.calls.append(argv)
        return answer

    def done(self):
        return not self.steps


def reads(text, default=K0):
    return [(["grubby", "--info=ALL"], (0, text, "")), (["grubby", "--default-kernel"], (0, default + "\n", ""))]


def default_info(text):
    return [(["grubby", "--info=DEFAULT"], (0, text.split("index=1")[0], ""))]


@pytest.fixture
def grubby_host(monkeypatch, tmp_path):
    """main() on the "live" system with the recorded runner injected (grubby only) and a tmp state_dir."""
    holder = {}
    monkeypatch.setattr(_host_module, "module_runner", lambda module, commands: holder["runner"])
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                        lambda self, name, required=False, opt_dirs=None: "/usr/bin/grubby" if name == "grubby" else None)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cmdline").write_text("BOOT_IMAGE=(hd0,msdos1)/vmlinuz-4.18.0-372.9.1.el8.x86_64 root=/dev/mapper/rhel-root ro "
                                  "crashkernel=auto resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root rd.lvm.lv=rhel/swap rhgb quiet "
                                  "zswap.enabled=1\n")

    def go(steps, check=False, **args):
        holder["runner"] = Recorded(steps)
        args = dict(dict(parameters=ISOL, procfs_path=str(proc), state_dir=str(tmp_path / "state")), **args)
        kind, result = modharness.run(kernel_cmdline, args, check=check, diff=True)
        assert holder["runner"].done(), holder["runner"].steps
        return kind, result
    go.marker = tmp_path / "state" / "kernel-cmdline.json"
    return go


def test_grubby_check_mode_only_reads(grubby_host):
    kind, result = grubby_host(reads(RHEL), check=True)
    assert kind is Exit and result["changed"] is True and result["bootloader"] == "grubby"
    assert result["commands"] == [" ".join(UPDATE)] and result["bootloader_updated"] is False
    assert result["configured_after"][-2:] == ISOL and result["reboot_required"] is True
    assert result["next_boot_cmdline"][0] == "root=/dev/mapper/rhel-root"
    assert [d["before_header"] for d in result["diff"]] == [str(grubby_host.marker), "grubby %s args" % K0, "grubby %s args" % K1]
    assert not grubby_host.marker.exists()


def test_grubby_present_then_converged_then_absent(grubby_host):
    kind, result = grubby_host(reads(RHEL) + [(UPDATE, (0, "", ""))] + reads(RHEL_AFTER) + default_info(RHEL_AFTER))
    assert kind is Exit and result["changed"] is True and result["bootloader_updated"] is True, result
    assert result["next_boot_cmdline"] == ["root=/dev/mapper/rhel-root"] + RHEL_AFTER.split('args="')[1].split('"')[0].split()
    assert result["reboot_required"] is True
    marker = json.loads(grubby_host.marker.read_text())
    assert marker["previous"] == {K0: {"isolcpus": [], "nohz_full": []}, K1: {"isolcpus": [], "nohz_full": []}}
    kind, result = grubby_host(reads(RHEL_AFTER))
    assert kind is Exit and result["changed"] is False and result["commands"] == []
    remove = ["grubby", "--update-kernel=ALL", "--remove-args=isolcpus=domain,managed_irq,2-3 nohz_full=2-3"]
    kind, result = grubby_host(reads(RHEL_AFTER) + [(remove, (0, "", ""))] + reads(RHEL) + default_info(RHEL),
                               parameters=["isolcpus", "nohz_full"], state="absent")
    assert kind is Exit and result["changed"] is True and result["managed"] == []
    assert not grubby_host.marker.exists() and result["reboot_required"] is False


def test_grubby_gives_back_the_values_it_replaced(grubby_host):
    before = RHEL.replace("rhgb quiet $tuned_params", "rhgb quiet isolcpus=1 $tuned_params")
    after = before.replace("isolcpus=1 $tuned_params zswap.enabled=1", "$tuned_params zswap.enabled=1 isolcpus=2-3").replace(
        'rhgb quiet"', 'rhgb quiet isolcpus=2-3"')
    update = ["grubby", "--update-kernel=ALL", "--remove-args=isolcpus=1", "--args=isolcpus=2-3"]
    kind, result = grubby_host(reads(before) + [(update, (0, "", ""))] + reads(after) + default_info(after),
                               parameters=["isolcpus=2-3"])
    recorded = json.loads(grubby_host.marker.read_text())["previous"]
    assert kind is Exit and recorded == {K0: {"isolcpus": ["isolcpus=1"]}, K1: {"isolcpus": []}}
    back0 = ["grubby", "--update-kernel=%s" % K0, "--remove-args=isolcpus=2-3", "--args=isolcpus=1"]
    back1 = ["grubby", "--update-kernel=%s" % K1, "--remove-args=isolcpus=2-3"]
    restored = before   # derived: what the two calls leave
    kind, result = grubby_host(reads(after) + [(back0, (0, "", "")), (back1, (0, "", ""))] + reads(restored)
                               + default_info(restored), parameters=["isolcpus"], state="absent")
    assert kind is Exit and result["changed"] is True, result
    assert "isolcpus=1" in result["next_boot_cmdline"]


def test_grubby_that_does_not_do_what_was_planned_fails_naming_the_entry(grubby_host):
    kind, result = grubby_host(reads(RHEL) + [(UPDATE, (0, "", ""))] + reads(RHEL))
    assert kind is Fail and "grubby did not leave what was planned" in result["msg"] and K0 in result["msg"]


def test_grubby_failing_fails_with_its_output(grubby_host):
    kind, result = grubby_host(reads(RHEL) + [(UPDATE, (1, "", "grubby: error: cannot write"))])
    assert kind is Fail and "cannot write" in result["msg"] and "failed (rc 1)" in result["msg"]


# ---------------------------------------------------------------- isolate --
# The isolcpus role's option: the parameters from module_utils/_parse/cpu_partition, checked against the node's present
# CPUs (a generated sysfs tree: only devices/system/cpu/present is read).

def sysfs(tmp_path, present="0-7"):
    cpu = tmp_path / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "present").write_text(present + "\n")
    return str(tmp_path / "sys")


def run_isolate(root, proc, sys_path, check=False, state="present", **isolate):
    args = dict(isolate=dict(dict(cpus="4-5"), **isolate), bootloader="grub_debian", root=root, procfs_path=proc,
                sysfs_path=sys_path, state=state)
    return modharness.run(kernel_cmdline, args, check=check)


def test_isolate_builds_the_parameters_and_drops_a_key_no_longer_asked_for(tmp_path):
    root, proc = make(tmp_path, "debian12")
    sys_path = sysfs(tmp_path)
    kind, result = run_isolate(root, proc, sys_path, nohz_full=True)
    assert kind is Exit and result["changed"] is True, result
    assert result["configured_after"] == ["isolcpus=domain,4-5", "nohz_full=4-5", "quiet"]
    assert read(root, DROPIN) == dropin_text(["isolcpus=domain,4-5", "nohz_full=4-5"])
    kind, again = run_isolate(root, proc, sys_path, nohz_full=True)
    assert kind is Exit and again["changed"] is False, again
    kind, fewer = run_isolate(root, proc, sys_path, flags=["domain", "managed_irq"])
    assert kind is Exit and fewer["changed"] is True
    assert fewer["configured_after"] == ["isolcpus=domain,managed_irq,4-5", "quiet"]
    assert json.loads(read(root, MARKER))["parameters"] == ["isolcpus=domain,managed_irq,4-5"]
    kind, gone = run_isolate(root, proc, sys_path, state="absent")
    assert kind is Exit and gone["changed"] is True and gone["configured_after"] == ["quiet"], gone
    assert not os.path.exists(os.path.join(root, DROPIN)) and not os.path.exists(os.path.join(root, MARKER))
    assert read(root, "etc/default/grub") == (FIX / "debian12/etc/default/grub").read_text()


@pytest.mark.parametrize("isolate, present, fragments", [
    (dict(cpus=""), "0-7", ["isolate.cpus is empty"]),
    (dict(cpus="4-9"), "0-7", ["CPUs 8-9", "does not have", "0-7"]),
    (dict(cpus="1-7"), "1-7", ["every CPU", "no housekeeping CPU"]),
    (dict(cpus="0-1"), "0-7", ["CPU 0", "allow_cpu0"]),
    (dict(cpus="4-5", flags=["domain", "nohz_full"]), "0-7", ["isolate.flags", "managed_irq"]),
    (dict(cpus="four"), "0-7", ["isolate.cpus 'four'", "is not a CPU list", "expected a CPU list"]),
], ids=["empty", "absent-cpus", "every-cpu", "cpu0", "bad-flag", "not-a-list"])
def test_isolate_refuses_a_bad_set_names_it_and_writes_nothing(tmp_path, isolate, present, fragments):
    root, proc = make(tmp_path, "debian12")
    sys_path = sysfs(tmp_path, present)
    before = snapshot(root)
    for check in (True, False):
        kind, result = run_isolate(root, proc, sys_path, check=check, **isolate)
        assert kind is Fail, result
        for fragment in fragments:
            assert fragment in result["msg"], (fragment, result["msg"])
    assert snapshot(root) == before


def test_isolate_allows_cpu0_when_asked(tmp_path):
    root, proc = make(tmp_path, "debian12")
    kind, result = run_isolate(root, proc, sysfs(tmp_path), check=True, cpus="0-1", allow_cpu0=True)
    assert kind is Exit and result["configured_after"][0] == "isolcpus=domain,0-1", result


def test_parameters_and_isolate_are_one_or_the_other(tmp_path):
    root, proc = make(tmp_path, "debian12")
    kind, result = modharness.run(kernel_cmdline, dict(parameters=ISOL, isolate=dict(cpus="4-5"), root=root,
                                                       procfs_path=proc, bootloader="grub_debian"))
    assert kind is Fail and "mutually exclusive" in result["msg"], result
    kind, result = modharness.run(kernel_cmdline, dict(root=root, procfs_path=proc, bootloader="grub_debian"))
    assert kind is Fail and "one of the following is required" in result["msg"], result


def test_the_default_drop_in_sorts_after_unnumbered_drop_ins_and_99_does_not(tmp_path):
    """Found in the lab: the Debian guest's own grub.d/gpunode-lab.cfg sets GRUB_CMDLINE_LINUX outright and sorts
    after a 99- name (C locale: digits before letters). The default name comes after it; 99- is refused, unchanged."""
    later = {"etc/default/grub.d/gpunode-lab.cfg": 'GRUB_CMDLINE_LINUX="console=ttyS0 mitigations=off"\n'}
    root, proc = make(tmp_path, "debian12", files=later)
    before = snapshot(root)
    kind, result = run(root, proc, dropin_name="99-gpunode-tuning.cfg")
    assert kind is Fail and "gpunode-lab.cfg" in result["msg"] and snapshot(root) == before, result
    kind, result = run(root, proc)
    assert kind is Exit and result["configured_after"][:4] == ["console=ttyS0", "mitigations=off"] + ISOL, result


# ------------------------------------------------------------------ remove: keys kept off the command line --

LIMITED = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=1 intel_idle.max_cstate=0"\n'


def limited_tree(tmp_path):
    """The Debian 12 GRUB files with the C-state limits a cloud image or an old tuning guide left in /etc/default/grub."""
    root, proc = make(tmp_path, "debian12", running=RUNNING.replace("quiet", "quiet processor.max_cstate=1 intel_idle.max_cstate=0"))
    path = os.path.join(root, "etc/default/grub")
    text = read(root, "etc/default/grub").replace('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n', LIMITED)
    assert LIMITED in text
    with open(path, "w") as handle:
        handle.write(text)
    return root, proc


def test_remove_takes_the_keys_out_of_the_line_that_sets_them_and_absent_puts_them_back(tmp_path):
    root, proc = limited_tree(tmp_path)
    original = snapshot(root)
    args = dict(parameters=None, remove=["processor.max_cstate", "intel_idle.max_cstate", "idle"])
    kind, plan = run(root, proc, check=True, **args)
    assert kind is Exit and plan["changed"] is True and snapshot(root) == original
    kind, result = run(root, proc, **args)
    assert kind is Exit and result["changed"] is True
    assert read(root, "etc/default/grub").count('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n') == 1
    assert not os.path.exists(os.path.join(root, DROPIN))          # nothing to add: no drop-in
    assert "processor.max_cstate=1" in result["configured_before"]
    assert [t for t in result["configured_after"] if "max_cstate" in t] == []
    assert result["managed"] == ["!processor.max_cstate", "!intel_idle.max_cstate", "!idle"]
    assert result["reboot_required"] is True and plan["configured_after"] == result["configured_after"]
    assert json.loads(read(root, MARKER))["edits"][0]["removed"] == ["processor.max_cstate=1", "intel_idle.max_cstate=0"]
    kind, again = run(root, proc, **args)
    assert kind is Exit and again["changed"] is False
    kind, back = run(root, proc, parameters=None, remove=["processor.max_cstate", "intel_idle.max_cstate", "idle"],
                     state="absent")
    assert kind is Exit and back["changed"] is True and back["managed"] == []
    now = snapshot(root)
    assert dict((k, v) for k, v in now.items() if v[0] != "dir") == dict((k, v) for k, v in original.items() if v[0] != "dir")


def test_remove_and_set_share_the_marker_with_other_callers(tmp_path):
    root, proc = limited_tree(tmp_path)
    kind, first = run(root, proc)                                   # the isolcpus role's keys
    assert kind is Exit and first["changed"] is True
    kind, second = run(root, proc, parameters=None, remove=["processor.max_cstate"])
    assert kind is Exit and second["managed"] == ISOL + ["!processor.max_cstate"]
    assert read(root, DROPIN) == dropin_text(ISOL)
    assert "intel_idle.max_cstate=0" in second["configured_after"] and "processor.max_cstate=1" not in second["configured_after"]


@pytest.mark.parametrize("args, fragment", [
    (dict(remove=["processor.max_cstate=1"]), "remove[0] \"processor.max_cstate=1\": remove takes keys only"),
    (dict(parameters=["idle=poll"], remove=["idle"]), "idle is in both parameters and remove"),
    (dict(parameters=None, remove=["a b"]), "remove[0]"),
])
def test_remove_bad_input_names_it_and_changes_nothing(tmp_path, args, fragment):
    root, proc = limited_tree(tmp_path)
    original = snapshot(root)
    kind, result = run(root, proc, **args)
    assert kind is Fail and fragment in result["msg"], result
    assert snapshot(root) == original


def test_grubby_remove_then_absent_gives_the_tokens_back(grubby_host):
    before = RHEL.replace("rhgb quiet $tuned_params", "rhgb quiet processor.max_cstate=1 $tuned_params")
    after = RHEL
    update = ["grubby", "--update-kernel=ALL", "--remove-args=processor.max_cstate=1"]
    kind, result = grubby_host(reads(before) + [(update, (0, "", ""))] + reads(after) + default_info(after),
                               parameters=None, remove=["processor.max_cstate"])
    assert kind is Exit and result["changed"] is True, result
    recorded = json.loads(grubby_host.marker.read_text())["previous"]
    assert recorded == {K0: {"processor.max_cstate": ["processor.max_cstate=1"]}, K1: {"processor.max_cstate": []}}
    kind, result = grubby_host(reads(after), parameters=None, remove=["processor.max_cstate"])
    assert kind is Exit and result["changed"] is False and result["commands"] == []
    back = ["grubby", "--update-kernel=%s" % K0, "--args=processor.max_cstate=1"]
    kind, result = grubby_host(reads(after) + [(back, (0, "", ""))] + reads(before) + default_info(before),
                               parameters=None, remove=["processor.max_cstate"], state="absent")
    assert kind is Exit and result["changed"] is True and "processor.max_cstate=1" in result["next_boot_cmdline"]
    assert not grubby_host.marker.exists()


# ------------------------------------------------------- tree mode runs nothing of the tree --

def _with_payload(root, rel, line):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        handle.write(line)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("rel,payload", [
    ("etc/default/grub", 'GRUB_DISABLE_OS_PROBER="$(touch @M@; echo true)"\n'),
    ("etc/default/grub", "GRUB_DISABLE_OS_PROBER=`touch @M@; echo true`\n"),
    ("etc/default/grub.d/50-probe.cfg", 'GRUB_DISABLE_OS_PROBER="$(touch @M@; echo true)"\n'),
], ids=["dollar-paren", "backtick", "grub.d"])
def test_a_trees_command_substitution_never_runs_on_the_host(tmp_path, rel, payload, check):
    """Issue 27 section 5: the tree's files used to be sourced with this host's /bin/sh. A variable the command line
    does not depend on is left unknown, never run; the plan is what it is without it."""
    marker = str(tmp_path / "MARKER")
    root, proc = make(tmp_path, "debian12")
    _with_payload(root, rel, payload.replace("@M@", marker))
    kind, result = run(root, proc, check=check)
    assert kind is Exit and result["configured_after"] == ISOL + ["quiet"], result
    assert not os.path.exists(marker)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("rel,payload,line", [
    ("etc/default/grub", 'GRUB_CMDLINE_LINUX="$(touch @M@; echo quiet)"\n', None),
    ("etc/default/grub", "GRUB_CMDLINE_LINUX_DEFAULT=`touch @M@; echo quiet`\n", None),
    ("etc/default/grub.d/50-probe.cfg", "X=1\ntouch @M@\n", 2),
    ("etc/default/grub.d/50-probe.cfg", 'if [ -e / ]; then GRUB_CMDLINE_LINUX="$(touch @M@)"; fi\n', 1),
], ids=["cmdline-from-dollar-paren", "cmdline-from-backtick", "a-command", "an-if"])
def test_a_tree_whose_command_line_needs_its_code_fails_naming_file_and_line(tmp_path, rel, payload, line, check):
    marker = str(tmp_path / "MARKER")
    root, proc = make(tmp_path, "debian12")
    _with_payload(root, rel, payload.replace("@M@", marker))
    line = line or read(root, rel).count("\n")                # None: the payload, the file's last line
    before = snapshot(root)
    kind, result = run(root, proc, check=check)
    assert kind is Fail and "/%s line %d" % (rel, line) in result["msg"], result
    assert result["path"] == "/" + rel and result["line"] == line
    assert not os.path.exists(marker) and snapshot(root) == before
