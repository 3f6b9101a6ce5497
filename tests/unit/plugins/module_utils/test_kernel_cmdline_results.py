# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kernel_cmdline's whole results, written out in full, run after run.

Mutation testing (benchmarks/mutation_results.md, area kernel_cmdline) found the planning and its refusals tested
by outcome and a few fields (75.1 % of 4,222 mutants killed): the exact warnings, refusal messages and details, the
marker's edit records, the files and diffs of a run, the grubby calls and the next boot's line were not held. Each
case below runs ``_boot.kernel_cmdline.converge`` over a sequence of steps on one node and records, per step, the whole
result and diff (or the error's message and details) and the files the step left; the sequences are compared with
``fixtures/kernel_cmdline/expected/converge_results.json``.

The nodes: the real /etc/default/grub trees of fixtures/kernel_cmdline (provenance in its README) planned as a
captured tree (no command runs: the files are evaluated in Python); the same trees as a live system whose /bin/sh is
the real one and whose update-grub is a stand-in (succeeds, or fails to show the put-back); and grubby, replayed
from the published ``grubby --info=ALL`` captures by a small simulator that edits the args of its entries as
``--update-kernel``/``--args``/``--remove-args`` do (a simulator that ignores the edits shows the read-back
refusal). The parsers of grub.cfg and grubenv are held on the grub.cfg files the real grub-mkconfig generated.

The expected file was generated from the code and reviewed by hand (warnings and refusals read one by one).
Regenerate after a deliberate change with GPUNODE_REGENERATE=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._boot import kernel_cmdline as K
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grub_cfg as GC
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grub_eval as GE
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import tree_which
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import param_key, split_cmdline

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_cmdline"
EXPECTED = FIX / "expected" / "converge_results.json"
RUNNING = "BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/vda1 ro quiet\n"
RHEL_RUNNING = ("BOOT_IMAGE=(hd0,msdos1)/vmlinuz-4.18.0-372.9.1.el8.x86_64 root=/dev/mapper/rhel-root ro crashkernel=auto "
                "resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root rd.lvm.lv=rhel/swap rhgb quiet zswap.enabled=1\n")
ISOL = ["isolcpus=domain,managed_irq,2-3", "nohz_full=2-3"]
TREES = ["debian12", "salt-formula-linux", "synthetic-single-quotes", "ubuntu1804-rwv-blog"]


def sh_run(argv):
    """The real /bin/sh; nothing else runs here."""
    env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="surrogateescape", env=env, check=False)
    return proc.returncode, proc.stdout, proc.stderr


class Grubby(object):
    """grubby as its --info=ALL shows it: a published capture, edited by --update-kernel as grubby edits the args
    (a removed key goes wherever it stands; an added one goes to the end). ``obey=False``: the edits are accepted
    (rc 0) and not made, as a grubby that does not do what it was asked."""

    def __init__(self, capture, default, obey=True, fail=None):
        self.blocks = [b for b in ("\n" + (FIX / "grubby" / capture).read_text()).split("\nindex=") if b.strip()]
        self.default, self.obey, self.fail, self.calls = default, obey, fail, []
        # obey: True, False (no edit made), "first" (only the first entry edited), "no_removals" (--remove-args
        # ignored); fail: the stderr of a failing --update-kernel, or "info" / "default" for a failing read

    def text(self):
        return "".join("index=%s\n" % block.rstrip("\n") + "\n" for block in self.blocks)

    def _edit(self, target, remove, add):
        out = []
        for block in self.blocks:
            lines = block.split("\n")
            kernel = next((line.split("=", 1)[1].strip('"') for line in lines if line.startswith("kernel=")), None)
            if target in ("ALL", kernel):
                for n, line in enumerate(lines):
                    if line.startswith("args="):
                        tokens = split_cmdline(line.split("=", 1)[1].strip('"'))
                        gone = set(param_key(t) for t in remove + add)
                        tokens = [t for t in tokens if param_key(t) not in gone] + add
                        lines[n] = 'args="%s"' % " ".join(tokens)
            out.append("\n".join(lines))
        self.blocks = out

    def __call__(self, argv):
        self.calls.append(list(argv))
        assert argv[0] == "grubby", argv
        if argv[1] == "--info=ALL":
            return (1, "", "grubby: error: cannot open /boot/loader/entries\n") if self.fail == "info" else (0, self.text(), "")
        if argv[1] == "--default-kernel":
            return (1, "", "") if self.fail == "default" else (0, self.default + "\n", "")
        if argv[1] == "--info=DEFAULT":
            return 0, next("index=%s\n" % b for b in self.blocks if 'kernel="%s"' % self.default in b), ""
        if argv[1].startswith("--update-kernel="):
            if self.fail:
                return 1, "", self.fail
            remove = [t for a in argv[2:] if a.startswith("--remove-args=") for t in a.split("=", 1)[1].split()]
            add = [t for a in argv[2:] if a.startswith("--args=") for t in a.split("=", 1)[1].split()]
            target = argv[1].split("=", 1)[1]
            if self.obey == "first" and target == "ALL":
                target = next(line.split("=", 1)[1].strip('"') for line in self.blocks[0].split("\n")
                              if line.startswith("kernel="))
            if self.obey == "no_removals":
                remove = []
            if self.obey:
                self._edit(target, remove, add)
            return 0, "", ""
        raise AssertionError("unexpected grubby call %r" % (argv,))


def live_grub(fail_update=False):
    """The live system's runner: the real /bin/sh, and an update-grub that succeeds (or fails with its message)."""
    calls = []

    def run(argv):
        calls.append(list(argv))
        if argv[0] == GE.SH:
            return sh_run(argv)
        if argv[0] == "update-grub":
            return (1, "", "/usr/sbin/grub-probe: error: failed to get canonical path of `overlay'.\n") if fail_update \
                else (0, "", "Generating grub configuration file ...\ndone\n")
        raise AssertionError("unexpected command %r" % (argv,))
    run.calls = calls
    return run


def node(tmp_path, source, running=RUNNING, grub_cfg=None, files=None, present="0-7"):
    """A node's tree: T/root (the fixture's etc/, ``grub_cfg`` as boot/grub/grub.cfg, ``files``), T/proc/cmdline and
    T/sys/devices/system/cpu/present."""
    root = tmp_path / "root"
    if source:
        shutil.copytree(str(FIX / source / "etc"), str(root / "etc"), dirs_exist_ok=True)
    (root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
    if grub_cfg:
        (root / "boot/grub").mkdir(parents=True, exist_ok=True)
        shutil.copy(str(FIX / "grub-cfg" / grub_cfg), str(root / "boot/grub/grub.cfg"))
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        if rel.startswith("usr/sbin/"):
            (root / rel).chmod(0o755)
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "cmdline").write_text(running)
    cpu = tmp_path / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "present").write_text(present + "\n")
    return root


def texts(root):
    """Every file under ``root``'s etc/default and var/lib (what a run writes), with its mode."""
    out = {}
    for top in ("etc/default", "var/lib"):
        for base, dummy, names in os.walk(str(root / top)):
            for name in sorted(names):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                    out[os.path.relpath(path, str(root))] = [oct(os.stat(path).st_mode & 0o7777), handle.read()]
    return dict(sorted(out.items()))


def scrub(value, tmp):
    """``value`` with the test's temporary directory written as <T> (JSON round trip: tuples become lists)."""
    return json.loads(json.dumps(value, default=sorted).replace(str(tmp), "<T>"))


def step(tmp_path, root, mode, args, check=False, run=None):
    """One converge() on the node; ``mode``: tree (no command), live (root is the live system) or grubby."""
    params = dict(parameters=None, remove=None, isolate=None, sysfs_path=str(tmp_path / "sys"), state="present",
                  bootloader="grub_debian" if mode != "grubby" else "grubby", root=str(root),
                  procfs_path=str(tmp_path / "proc"), state_dir=K.STATE_DIR, dropin_name=K.DROPIN)
    params.update(args)
    if mode == "tree":
        which, live = tree_which(str(root)), False
    else:
        tool, live = ("update-grub" if mode == "live" else "grubby"), True
        if run is not None and getattr(run, "no_tool", False):
            tool = None

        def which(name):
            return "/usr/sbin/" + name if name == tool else None
        if mode == "grubby":
            params["state_dir"] = str(tmp_path / "state")
    try:
        result, diff = K.converge(params, run, check, live, which, procfs=str(tmp_path / "proc"))
        out = {"result": result, "diff": diff}
    except DetailedError as exc:
        out = {"error": str(exc), "details": exc.details}
    if mode == "grubby":
        out["grubby_calls"] = [" ".join(c) for c in run.calls if c[1].startswith("--update-kernel=")]
        out["grubby_args"] = dict((b.split("kernel=", 1)[1].split("\n", 1)[0], b.split('args="', 1)[1].split('"', 1)[0])
                                  for b in run.blocks if "args=" in b)
        marker = tmp_path / "state" / K.MARKER
        out["marker"] = marker.read_text() if marker.exists() else None
    elif run is not None:
        out["commands_run"] = [c[0] for c in run.calls if c[0] != GE.SH]
    out["files"] = texts(root)
    return out


def tree_steps(source):
    """A captured tree: present (check, apply, again), another set, remove, absent of each, a key it never managed."""
    return [
        ({"parameters": ISOL}, True), ({"parameters": ISOL}, False), ({"parameters": ISOL}, True),
        ({"parameters": ["rcu_nocbs=2-3", "isolcpus=domain,2-3", "quiet"]}, False),
        ({"remove": ["quiet", "splash", "intel_iommu"]}, False),
        ({"parameters": ["isolcpus", "nohz_full", "rcu_nocbs", "mitigations"], "state": "absent"}, False),
        ({"remove": ["quiet", "splash", "intel_iommu"], "state": "absent"}, False),
        ({"parameters": ["quiet"], "state": "absent"}, True),
    ]


CASES = {}
for name in TREES:
    CASES["tree_" + name] = (name, "tree", {}, tree_steps(name), None)
CASES.update({
    # the drop-in already present with other content, a grub.cfg to read the next boot from
    "tree_debian12_with_grub_cfg": ("debian12", "tree", {"grub_cfg": "debian12-isolcpus.cfg"},
                                    [({"parameters": ISOL}, False), ({"parameters": ["isolcpus=4-5"]}, True)], None),
    "tree_isolate": ("debian12", "tree", {}, [
        ({"isolate": {"cpus": "4-7", "flags": ["domain", "managed_irq"], "nohz_full": True, "rcu_nocbs": True,
                      "allow_cpu0": False}}, False),
        ({"isolate": {"cpus": "4-7", "flags": ["domain"], "nohz_full": False, "rcu_nocbs": False,
                      "allow_cpu0": False}}, False),
        ({"isolate": {"cpus": "4-7", "flags": ["domain"], "nohz_full": False, "rcu_nocbs": False,
                      "allow_cpu0": False}, "state": "absent"}, False)], None),
    "tree_a_line_changed_since": ("debian12", "tree", {"files": {
        "etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nohz_full=1 quiet"\n'}}, [
        ({"parameters": ["nohz_full=2-3"]}, False),
        ("edit", "etc/default/grub.d/10-site.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT splash"\n'),
        ({"parameters": ["nohz_full"], "state": "absent"}, False)], None),
    "tree_an_edited_file_gone": ("debian12", "tree", {"files": {
        "etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="isolcpus=1 $GRUB_CMDLINE_LINUX"\n'}}, [
        ({"parameters": ["isolcpus=2-3"]}, False),
        ("remove", "etc/default/grub.d/10-site.cfg"),
        ({"parameters": ["isolcpus"], "state": "absent"}, False)], None),
    "live_update_grub": ("debian12", "live", {"grub_cfg": "debian12-default.cfg"}, [
        ({"parameters": ISOL}, True), ({"parameters": ISOL}, False), ({"parameters": ISOL}, False)], "ok"),
    "live_update_grub_fails": ("ubuntu1804-rwv-blog", "live", {}, [({"parameters": ISOL}, False)], "fail"),
    "grubby_rhel": (None, "grubby", {"running": RHEL_RUNNING}, [
        ({"parameters": ISOL}, True), ({"parameters": ISOL}, False), ({"parameters": ISOL}, False),
        ({"parameters": ["isolcpus=4-5", "rcu_nocbs=4-5"]}, False), ({"remove": ["rhgb", "quiet"]}, False),
        ({"parameters": ["isolcpus", "nohz_full", "rcu_nocbs"], "state": "absent"}, False),
        ({"remove": ["rhgb", "quiet"], "state": "absent"}, False)],
        ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", True, None)),
    "grubby_fedora_replaces_a_value": (None, "grubby", {"running": RHEL_RUNNING}, [
        ({"parameters": ["rhgb", "quiet=1", "mitigations=off"]}, False),
        ({"parameters": ["mitigations"], "state": "absent"}, False)],
        ("fedora41-asahi-info.txt", None, True, None)),
    "grubby_does_not_do_it": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, False)],
                              ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", False, None)),
    "grubby_fails": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, False)],
                     ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", True,
                      "grubby: error: cannot write /boot/loader/entries\n")),
    "grubby_edits_the_first_entry_only": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, False)],
                                          ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", "first", None)),
    "grubby_keeps_what_it_was_told_to_remove": (None, "grubby", {"running": RHEL_RUNNING}, [
        ({"parameters": ["quiet=1"]}, False), ({"remove": ["rhgb"]}, False),
        ({"parameters": ["quiet"], "state": "absent"}, False)],
        ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", "no_removals", None)),
    "grubby_info_fails": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, True)],
                          ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", True, "info")),
    "grubby_default_kernel_fails": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, True)],
                                    ("rhel8.6-info-all.txt", "/boot/vmlinuz-4.18.0-372.9.1.el8.x86_64", True, "default")),
    "grubby_default_kernel_unknown": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, True)],
                                      ("rhel8.6-info-all.txt", "/boot/vmlinuz-9.9", True, None)),
    "grubby_memdisk_entries": (None, "grubby", {"running": RHEL_RUNNING}, [({"parameters": ISOL}, True)],
                               ("c-grubby-memdisk-info.txt", "/boot/memdisk", True, None)),
    # the shell forms a hand-edited /etc/default/grub takes, evaluated without a shell on a tree
    "tree_shell_forms": ("debian12", "tree", {"files": {"etc/default/grub.d/10-site.cfg": (
        'A=nohz_full=1\nB="${A} ${UNSET:-quiet} ${A:+rcu_nocbs=1} $A"\n'
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX ${B} \\$literal \'single $A\'"\n')}},
        [({"parameters": ["nohz_full=2-3"]}, True), ({"remove": ["rcu_nocbs"]}, True)], None),
    # a key removed here and set again by drop-ins sourced after the module's: taken out of those lines too
    "tree_later_files_set_a_removed_key": ("debian12", "tree", {"files": {
        "etc/default/grub.d/zzz-a.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX quiet"\n',
        "etc/default/grub.d/zzz-b.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT quiet=2"\n'}},
        [({"remove": ["quiet"]}, False), ({"remove": ["quiet"], "state": "absent"}, False)], None),
    # bootloader auto on a tree: update-grub under the tree's root decides grub_debian; grubby alone is refused there
    "tree_auto_finds_update_grub": ("debian12", "tree", {"files": {"usr/sbin/update-grub": "#!/bin/sh\n"}},
                                    [({"parameters": ISOL, "bootloader": "auto"}, True)], None),
    "tree_auto_finds_only_grubby": ("debian12", "tree", {"files": {"usr/sbin/grubby": "#!/bin/sh\n"}},
                                    [({"parameters": ISOL, "bootloader": "auto"}, True)], None),
    "live_grub_debian_without_update_grub": ("debian12", "live", {}, [({"parameters": ISOL, "bootloader": "grub_debian"},
                                                                      True)], "none"),
    "live_absent_of_everything_removes_the_marker": ("ubuntu1804-rwv-blog", "live", {"grub_cfg": "debian12-isolcpus.cfg"}, [
        ({"parameters": ISOL}, False), ({"parameters": ["isolcpus", "nohz_full"], "state": "absent"}, False)], "ok"),
})

# Refusals: one step each on a debian12 tree (mode tree unless said), the error message and details in full.
REFUSALS = {
    "state_unknown": {"parameters": ISOL, "state": "gone"},
    "parameter_with_blank": {"parameters": ["nohz_full=2-3 quiet"]},
    "parameter_twice": {"parameters": ["nohz_full=2-3", "nohz-full=4"]},
    "isolcpus_bad_flag": {"parameters": ["isolcpus=domain,bogus,2-3"]},
    "isolcpus_no_list": {"parameters": ["isolcpus=domain"]},
    "isolcpus_reversed": {"parameters": ["isolcpus=domain,3-2"]},
    "nohz_full_no_value": {"parameters": ["nohz_full"]},
    "nohz_full_empty": {"parameters": ["nohz_full="]},
    "rcu_nocbs_bad": {"parameters": ["rcu_nocbs=alll"]},
    "quote_in_value": {"parameters": ['a="x"']},
    "dollar": {"parameters": ["memmap=100M$0x10000"]},
    "empty_key": {"parameters": ["=2-3"]},
    "key_in_both": {"parameters": ["quiet=1"], "remove": ["quiet"]},
    "remove_with_value": {"remove": ["quiet=1"]},
    "remove_empty": {"remove": [""]},
    "remove_twice": {"remove": ["quiet", "quiet"]},
    "remove_blank": {"remove": ["a b"]},
    "state_dir_relative": {"parameters": ISOL, "state_dir": "var/lib/x"},
    "state_dir_quote": {"parameters": ISOL, "state_dir": "/var/lib/x'y"},
    "dropin_not_cfg": {"parameters": ISOL, "dropin_name": "zz.conf"},
    "dropin_path": {"parameters": ISOL, "dropin_name": "../grub"},
    "bootloader_grubby_on_a_tree": {"parameters": ISOL, "bootloader": "grubby"},
    "bootloader_auto_without_tools": {"parameters": ISOL, "bootloader": "auto"},
    "isolate_cpu0": {"isolate": {"cpus": "0-3", "flags": ["domain"], "nohz_full": False, "rcu_nocbs": False,
                                 "allow_cpu0": False}},
    "isolate_all_cpus": {"isolate": {"cpus": "0-7", "flags": ["domain"], "nohz_full": False, "rcu_nocbs": False,
                                     "allow_cpu0": True}},
    "isolate_beyond_present": {"isolate": {"cpus": "6-9", "flags": ["domain"], "nohz_full": False, "rcu_nocbs": False,
                                           "allow_cpu0": False}},
    "isolate_bad_flag": {"isolate": {"cpus": "4-5", "flags": ["domain", "bogus"], "nohz_full": False,
                                     "rcu_nocbs": False, "allow_cpu0": False}},
}
REFUSAL_FILES = {
    "marker_not_json": {"var/lib/gpunode-tuning/kernel-cmdline.json": "{not json"},
    "marker_of_someone_else": {"var/lib/gpunode-tuning/kernel-cmdline.json": json.dumps(
        {"managed_by": "someone", "bootloader": "grub_debian", "parameters": []})},
    "marker_other_bootloader": {"var/lib/gpunode-tuning/kernel-cmdline.json": json.dumps(
        {"managed_by": "gpunode.tuning.kernel_cmdline", "bootloader": "grubby", "parameters": ["quiet"]})},
    "marker_bad_parameters": {"var/lib/gpunode-tuning/kernel-cmdline.json": json.dumps(
        {"managed_by": "gpunode.tuning.kernel_cmdline", "bootloader": "grub_debian", "parameters": ["a b"]})},
    "marker_bad_edit_record": {"var/lib/gpunode-tuning/kernel-cmdline.json": json.dumps(
        {"managed_by": "gpunode.tuning.kernel_cmdline", "bootloader": "grub_debian", "parameters": ["quiet"],
         "edits": [{"file": "/etc/default/grub", "variable": 3}]})},
    "dropin_of_the_distribution": {"etc/default/grub.d/zz-gpunode-tuning.cfg": 'GRUB_CMDLINE_LINUX="vendor"\n'},
    "continued_line_sets_a_managed_key": {
        "etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="a \\\n nohz_full=1"\n'},
    "assignment_form_it_cannot_edit": {
        "etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="nohz_full=1 "$GRUB_CMDLINE_LINUX\n'},
    "assignment_it_cannot_edit": {"etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="$(echo nohz_full=1)"\n'},
    "a_later_file_overrides_the_line": {"etc/default/grub.d/zzz-late.cfg": 'GRUB_CMDLINE_LINUX=""\n'},
    "no_proc_cmdline": {},
    "special_parameter": {"etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX $1"\n'},
    "unterminated_brace": {"etc/default/grub.d/10-site.cfg": 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX"\n'},
}


def run_case(tmp_path, case):
    source, mode, shape, steps, runner = case
    root = node(tmp_path, source, **shape)
    if mode == "grubby":
        capture, default, obey, fail = runner
        if default is None:
            default = next(line.split("=", 1)[1].strip('"') for line in (FIX / "grubby" / capture).read_text().splitlines()
                           if line.startswith("kernel="))
        run = Grubby(capture, default, obey, fail)
    else:
        run = live_grub(fail_update=runner == "fail") if mode == "live" else None
        if mode == "live" and runner == "none":
            run.no_tool = True
    out = []
    for item in steps:
        if item[0] == "edit":
            (root / item[1]).write_text(item[2])
            out.append({"edited": item[1]})
            continue
        if item[0] == "remove":
            (root / item[1]).unlink()
            out.append({"removed": item[1]})
            continue
        args, check = item
        if mode == "live":
            run.calls.clear()
        out.append(dict(step(tmp_path, root, mode, args, check=check, run=run), args=args, check=check))
    return scrub(out, tmp_path)


def run_refusal(tmp_path, name):
    files = REFUSAL_FILES.get(name)
    args = REFUSALS.get(name) or {"parameters": ISOL}
    root = node(tmp_path, "debian12", files=files)
    if name == "no_proc_cmdline":
        (tmp_path / "proc" / "cmdline").unlink()
    if name == "bootloader_auto_without_tools":
        out = step(tmp_path, root, "tree", args)
    else:
        out = step(tmp_path, root, "tree", dict({"bootloader": "grub_debian"}, **args))
    return scrub(out, tmp_path)


def grub_cfg_results():
    """The grub.cfg parser and the default entry on every real grub.cfg (and the saved-entry grubenv)."""
    out = {}
    env = GC.parse_grubenv((FIX / "grub-cfg" / "debian12-saved.grubenv").read_text())
    out["grubenv"] = env
    for path in sorted((FIX / "grub-cfg").glob("*.cfg")):
        cfg = GC.parse_grub_cfg(path.read_text())
        warnings = []
        entry = GC.default_entry(cfg, env if "saved" in path.name else {}, warnings)
        out[path.name] = {"parsed": cfg, "default": entry, "warnings": warnings}
    for name, text in (("missing_default", "set default=\"7\"\nmenuentry 'a' {\n linux /vmlinuz root=/dev/vda1 ro\n}\n"),
                       ("title_not_found", "set default=\"no such title\"\nmenuentry 'a' {\n linux /vmlinuz ro\n}\n"),
                       ("env_saved_missing", "set default=\"${saved_entry}\"\nmenuentry 'a' {\n linux /vmlinuz ro\n}\n"),
                       ("submenu_path", "set default=\"1>0\"\nmenuentry 'a' {\n linux /vmlinuz ro\n}\nsubmenu 'more' {\n"
                                        " menuentry 'b' --id b-id {\n  linux /vmlinuz-b root=/dev/sda1 ro quiet\n }\n}\n")):
        cfg = GC.parse_grub_cfg(text)
        warnings = []
        entry = GC.default_entry(cfg, {}, warnings)
        out[name] = {"parsed": cfg, "default": entry, "warnings": warnings}
    return json.loads(json.dumps(out, default=sorted))


def grub_words_results():
    """grub_words on the lines of every real grub.cfg that carry a linux command, and on quoting and variables."""
    lines = []
    for path in sorted((FIX / "grub-cfg").glob("*.cfg")):
        lines += [line for line in path.read_text().splitlines() if line.strip().startswith(("linux", "set ", "menuentry"))]
    lines += ["linux /vmlinuz root=UUID=x ro $vt_handoff \"a b\" 'c d' e\\ f ${x}y $z_1 \\$literal",
              "linux\t/vmlinuz  a=\"b c\"d 'e'\"f\"", "set a=\"1\"; set b='2'", "linux /v ${unterminated", "linux /v \"open"]
    out = {}
    for line in lines:
        try:
            out[line] = GC.grub_words(line)
        except DetailedError as exc:
            out[line] = {"error": str(exc), "details": exc.details}
    return json.loads(json.dumps(out, default=sorted))


def all_results(tmp_path_factory):
    out = {"cases": {}, "refusals": {}}
    for name, case in CASES.items():
        out["cases"][name] = run_case(tmp_path_factory.mktemp(name), case)
    for name in list(REFUSALS) + [n for n in REFUSAL_FILES if n not in REFUSALS]:
        out["refusals"][name] = run_refusal(tmp_path_factory.mktemp(name), name)
    out["grub_cfg"] = grub_cfg_results()
    out["grub_words"] = grub_words_results()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    got = all_results(tmp_path_factory)
    if os.environ.get("GPUNODE_REGENERATE") == "1":
        EXPECTED.parent.mkdir(parents=True, exist_ok=True)
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    return got


@pytest.fixture(scope="module")
def expected():
    return json.loads(EXPECTED.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_run_of_each_case_gives_its_whole_result(results, expected, name):
    got, want = results["cases"][name], expected["cases"][name]
    assert len(got) == len(want), name
    for number, (mine, theirs) in enumerate(zip(got, want), 1):
        assert mine == theirs, "%s step %d (%s)" % (name, number, mine.get("args"))


@pytest.mark.parametrize("name", sorted(set(REFUSALS) | set(REFUSAL_FILES)))
def test_each_refusal_names_the_value_and_writes_nothing(results, expected, name):
    got = results["refusals"][name]
    assert got == expected["refusals"][name], name
    assert "error" in got, got.get("result")
    assert "var/lib/gpunode-tuning/kernel-cmdline.json" not in got["files"] or name.startswith("marker_"), got["files"]


def test_grub_cfg_default_entries_and_words(results, expected):
    assert results["grub_cfg"] == expected["grub_cfg"]
    assert results["grub_words"] == expected["grub_words"]


def test_the_expected_file_holds_every_case():
    """A case added without regenerating, or one dropped, is caught here rather than as a KeyError."""
    want = json.loads(EXPECTED.read_text())
    assert sorted(want["cases"]) == sorted(CASES)
    assert sorted(want["refusals"]) == sorted(set(REFUSALS) | set(REFUSAL_FILES))
