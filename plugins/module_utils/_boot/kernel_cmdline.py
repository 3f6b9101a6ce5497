# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel parameters for the next boot in one module run: read, plan, apply (the kernel_cmdline module).

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

* :func:`prepare` checks every option, reads /proc/cmdline, the marker and the
  bootloader's configuration, and plans everything (``grub_debian``: the
  drop-in, the edited assignment lines and the marker, evaluated as
  grub-mkconfig would: with /bin/sh on the live system, in Python on a tree;
  ``grubby``: the grubby calls). Nothing is written before every check passed;
* :func:`finish` applies the plan (not in check mode): the files through
  ``_host.files.apply_files`` (atomic, all or nothing), then update-grub (the
  files are put back when it fails) or grubby, and reads the next boot's
  command line back.

Commands come in as ``run(argv) -> (rc, out, err)``; on a tree (``live`` False)
no command runs at all: the tree's GRUB files are evaluated in Python
(``_boot.grub_eval.evaluate_tree``), never by a shell of this host.
"""

from __future__ import annotations

import collections
import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grub
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grub_cfg
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grub_eval
from ansible_collections.gpunode.tuning.plugins.module_utils._boot import grubby
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpu_partition import (
    ISOLATION_KEYS,
    PartitionError,
    isolation_parameters,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_raw, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import (
    MANAGED_BY,
    KernelCmdlineError,
    comparable,
    merge,
    is_removal,
    norm,
    param_key,
    parse_parameters,
    parse_removals,
    split_cmdline,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import (
    PersistError,
    apply_files,
    marker_bytes,
    plan_files,
    rollback_files,
    rooted,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file

STATES = ("present", "absent")
BOOTLOADERS = ("auto", "grub_debian", "grubby")
MARKER = "kernel-cmdline.json"
STATE_DIR = "/var/lib/gpunode-tuning"
DROPIN = "zz-gpunode-tuning.cfg"
# Every command the module may run, on the live system only.
COMMANDS = (grub_eval.SH, "update-grub", "grub-mkconfig", grubby.GRUBBY)
TREE_COMMANDS = ()             # a captured tree's files never reach a shell of this host

ARGUMENT_SPEC = dict(
    parameters=dict(type="list", elements="str"),
    remove=dict(type="list", elements="str"),
    isolate=dict(type="dict", options=dict(
        cpus=dict(type="str", required=True),
        flags=dict(type="list", elements="str", default=["domain"]),
        nohz_full=dict(type="bool", default=False),
        rcu_nocbs=dict(type="bool", default=False),
        allow_cpu0=dict(type="bool", default=False),
    )),
    state=dict(type="str", choices=list(STATES), default="present"),
    bootloader=dict(type="str", choices=list(BOOTLOADERS), default="auto"),
    state_dir=dict(type="path", default=STATE_DIR),
    dropin_name=dict(type="str", default=DROPIN),
    **target_spec("root", "procfs_path", "sysfs_path")
)
MUTUALLY_EXCLUSIVE = [("parameters", "isolate"), ("remove", "isolate")]
REQUIRED_ONE_OF = [("parameters", "isolate", "remove")]


# ------------------------------------------------------------------ read --


def check_options(params):
    """Raise KernelCmdlineError naming the first option that cannot work."""
    root = params["root"]
    if not root or not os.path.isdir(root):
        raise KernelCmdlineError("root %s is not a directory" % root, option="root", value=root, expected="an existing directory")
    value = params["state_dir"]
    if not value or not os.path.isabs(value) or any(c in value for c in "\n\"'$`\\ "):
        raise KernelCmdlineError("state_dir %r: expected an absolute path without spaces, quotes or shell characters"
                                 % (value,), option="state_dir", value=value)
    name = params["dropin_name"]
    if not grub.DROPIN_NAME.match(name or ""):
        raise KernelCmdlineError(
            "dropin_name %r: expected a file name ending in .cfg (letters, digits, . _ + -), as grub-mkconfig sources "
            "only %s/*.cfg" % (name, grub.GRUB_DROPIN_DIR), option="dropin_name", value=name, expected="NAME.cfg")


def read_running(procfs):
    path = join(procfs, "cmdline")
    text = read_raw(path)
    if text is None:
        raise KernelCmdlineError("procfs_path %s has no cmdline file: expected a procfs root" % procfs,
                                 option="procfs_path", value=procfs, path=path)
    return split_cmdline(text.replace("\0", " "))


def detect(choice, root, which, live):
    """The bootloader to use: ``choice``, or for ``auto`` grub_debian where update-grub (or grub-mkconfig) and
    /etc/default/grub exist, else grubby where it exists."""
    grub_tool = which("update-grub") or which("grub-mkconfig")
    if choice == "auto":
        if grub_tool and os.path.isfile(rooted(root, grub.GRUB_DEFAULTS)):
            return "grub_debian"
        if not which(grubby.GRUBBY):
            raise KernelCmdlineError(
                "bootloader auto: neither update-grub nor grubby found%s (grub_debian needs update-grub or grub-mkconfig "
                "and %s, grubby needs grubby); set the bootloader option to grub_debian or grubby (the variable "
                "isolcpus_bootloader in the isolcpus role, cpu_power_bootloader in the cpu_power role) and install "
                "its tool" % ("" if live else " under root %s" % root, grub.GRUB_DEFAULTS),
                option="bootloader", value=choice, expected="update-grub or grubby on the target")
        choice = "grubby"
    if choice == "grubby":
        if not live:
            raise KernelCmdlineError("bootloader grubby works on the live system only (root /): grubby edits the boot "
                                     "entries of the running system; root is %s" % root, option="root", value=root)
        if not which(grubby.GRUBBY):
            raise KernelCmdlineError("bootloader grubby: grubby not found", option="bootloader", value=choice)
    if choice == "grub_debian" and live and not grub_tool:
        raise KernelCmdlineError("bootloader grub_debian: neither update-grub nor grub-mkconfig found", option="bootloader",
                                 value=choice, expected="update-grub or grub-mkconfig on the target")
    return choice


def read_marker(root, path):
    """The marker's data ({} when there is none); a marker that is not this module's fails, naming it."""
    try:
        with open(rooted(root, path), "rb") as handle:
            data = handle.read()
    except (IOError, OSError):
        return {}
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise KernelCmdlineError("marker %s is not JSON (%s): fix or remove it" % (path, exc), path=path)
    if not isinstance(parsed, dict) or parsed.get("managed_by") != MANAGED_BY or \
            not isinstance(parsed.get("parameters"), list) or parsed.get("bootloader") not in BOOTLOADERS[1:]:
        raise KernelCmdlineError("marker %s is not a record of this module (managed_by %s, bootloader, parameters): "
                                 "fix or remove it" % (path, MANAGED_BY), path=path, value=parsed)
    try:
        parse_parameters(parsed["parameters"], check_values=False)
    except KernelCmdlineError as exc:
        raise KernelCmdlineError("marker %s: %s: fix or remove it" % (path, exc), path=path, value=parsed["parameters"])
    return parsed


def _mode(root, path, default=0o644):
    try:
        return os.stat(rooted(root, path)).st_mode & 0o7777
    except OSError:
        return default


# --------------------------------------------------------- reboot_required --

def reboot_computed(running, configured, keys):
    """Whether the running kernel differs from ``configured`` in a parameter with one of ``keys``."""
    have = comparable(running)
    want = [norm(t) for t in configured if param_key(t) in keys]
    return any(t not in have for t in want) or any(param_key(t) in keys and t not in want for t in have)


def reboot_readback(running, next_boot, keys):
    """Whether /proc/cmdline differs from the next boot's parameters (BOOT_IMAGE= and initrd= left out).

    A GRUB variable in the next boot's line (``$vt_handoff``, ``$tuned_params``)
    is known only when GRUB runs: each may stand for one running parameter,
    never for one with a key in ``keys``.
    """
    nxt, have = comparable(next_boot), collections.Counter(comparable(running))
    literal = collections.Counter(t for t in nxt if not t.startswith("$"))
    variables = len(nxt) - sum(literal.values())
    missing, extra = literal - have, have - literal
    if missing or any(param_key(t) in keys for t in extra):
        return True
    return sum(extra.values()) > variables


# ------------------------------------------------------------------ plan --

def _isolation(params, state, previous):
    """(wanted, dropped) for the ``isolate`` option: the isolation parameters from module_utils/_parse/cpu_partition, checked
    against the node's present CPUs; with state=absent, the isolation keys the marker has."""
    had = set(param_key(t) for t in previous.get("parameters", []))
    if state == "absent":
        return parse_parameters([k for k in ISOLATION_KEYS if k in had] or ["isolcpus"], check_values=False), []
    path = join(params.get("sysfs_path") or "/sys", "devices/system/cpu/present")
    present = read_text(path)
    if not present:
        raise KernelCmdlineError("sysfs_path %s has no devices/system/cpu/present: expected a sysfs root"
                                 % params.get("sysfs_path"), option="sysfs_path", value=params.get("sysfs_path"), path=path)
    try:
        values, drop = isolation_parameters(params["isolate"], present)
    except PartitionError as exc:
        raise KernelCmdlineError(str(exc), **exc.details)
    return parse_parameters(values), parse_parameters([k for k in drop if k in had], check_values=False)


def _plan_grub(params, root, run, managed, previous, marker, warnings, out):
    """grub_debian's plan: the drop-in, the edited assignment lines and the marker's data; ``out`` gets the configured
    line before and after. ``run`` is None on a tree: its GRUB files reach no shell. Returns (files, remove, data)."""
    decided = grub.plan(root, run, managed, previous.get("edits") or [], params["dropin_name"],
                        marker, warnings)
    files = dict((p, (text.encode("utf-8", "surrogateescape"), _mode(root, p))) for p, text in decided["files"].items())
    dropin = grub.dropin_path(params["dropin_name"])
    if dropin in files:
        files[dropin] = (files[dropin][0], 0o644)
    remove = list(decided["remove"])
    if dropin in files or dropin in remove:
        # Written or removed as the module's own (issue 27): a distribution's drop-in of that name is refused.
        try:
            check_own_file("dropin_name", rooted(root, dropin), grub.DROPIN_HEADER.split(":", 1)[0])
        except InputError as exc:
            raise KernelCmdlineError(str(exc), **exc.details)
    data = {"edits": decided["edits"]} if managed or decided["edits"] else None
    out.update(before=decided["before"], after=decided["after"])
    return files, remove, data


def prepare(params, run, check, live, which, procfs="/proc"):
    """Check every input and plan the run; raises KernelCmdlineError before anything changes."""
    check_options(params)
    root, state = params["root"], params["state"]
    if state not in STATES:
        raise KernelCmdlineError("state %r: expected present or absent" % (state,), option="state", value=state)
    if params.get("isolate") is None:
        wanted = parse_parameters(params.get("parameters") or [], check_values=(state == "present"))
        removals = parse_removals(params.get("remove") or [])
        both = sorted(set(p.key for p in wanted) & set(p.key for p in removals))
        if both:
            raise KernelCmdlineError("%s is in both parameters and remove: expected each key in one of them"
                                     % ", ".join(both), option="remove", value=both)
        wanted += removals
    running = read_running(procfs)
    bootloader = detect(params["bootloader"], root, which, live)
    marker = join(params["state_dir"], MARKER)
    previous = read_marker(root, marker)
    dropped = []
    if params.get("isolate") is not None:
        wanted, dropped = _isolation(params, state, previous)
    if previous and previous["bootloader"] != bootloader:
        raise KernelCmdlineError(
            "marker %s records changes made with bootloader %s, this run uses %s: run state=absent with bootloader=%s "
            "first" % (marker, previous["bootloader"], bootloader, previous["bootloader"]), path=marker, value=bootloader)
    set_before = dict((param_key(t), t) for t in previous.get("parameters", []))
    managed, released = merge(previous.get("parameters", []), wanted, state)
    if dropped:                    # isolation keys no longer asked for (nohz_full switched off): given back
        managed, given_back = merge(list(managed.values()), dropped, "absent")
        released += given_back
    warnings = []
    if state == "absent":
        for param in wanted:
            if param.key not in released:
                warnings.append("%s is not managed by this module (marker %s): nothing to remove" % (param.name, marker))
    out = {"params": params, "root": root, "check": check, "live": live, "run": run, "which": which,
           "bootloader": bootloader, "marker": marker, "managed": managed, "released": released,
           "running": running, "warnings": warnings, "commands": [], "argvs": []}
    if bootloader == "grub_debian":
        files, remove, data = _plan_grub(params, root, run if live else None, managed, previous, marker, warnings, out)
    else:
        entries, default = grubby.read(run)
        old = previous.get("previous") or {}
        if not isinstance(old, dict) or not all(isinstance(v, dict) for v in old.values()):
            raise KernelCmdlineError("marker %s: previous is not a map of kernels: fix or remove it" % marker, path=marker)
        old = dict((k, v) for k, v in old.items() if any(e["kernel"] == k for e in entries))
        if state == "present":
            commands, kept, after = grubby.plan_present(entries, managed, old)
        else:
            commands, kept, after = grubby.plan_absent(entries, released, set_before, old, warnings)
        kept = dict((k, dict((key, v) for key, v in rec.items() if key in managed)) for k, rec in kept.items())
        kept = dict((k, v) for k, v in kept.items() if v)
        files, remove = {}, []
        data = {"previous": kept} if managed or kept else None
        out.update(before=grubby.entry_tokens(default), after=after[default["kernel"]], entries=entries, default=default,
                   planned=after, commands=[" ".join(c) for c in commands], argvs=commands)
    if data is not None:
        data.update(managed_by=MANAGED_BY, bootloader=bootloader, parameters=list(managed.values()))
        files[marker] = (marker_bytes(data), 0o644)
    else:
        remove.append(marker)
    actions = plan_files(files, remove, root)
    out.update(files=files, actions=actions, changes=[a for a in actions if a["action"] != "unchanged"])
    if bootloader == "grub_debian" and out["changes"] and live:
        tool = "update-grub" if which("update-grub") else "grub-mkconfig"
        out["argvs"] = [[tool] + ([] if tool == "update-grub" else ["-o", grub_cfg.GRUB_CFG])]
        out["commands"] = [" ".join(out["argvs"][0])]
    return out


# ----------------------------------------------------------------- apply --

def _write(prepared, write):
    """The planned files, all or nothing; returns the undo record (:func:`_host.files.rollback_files`)."""
    try:
        return apply_files(prepared["files"], prepared["changes"], prepared["root"], write=write)
    except PersistError as exc:
        raise KernelCmdlineError(str(exc), **exc.details)


def _run(run, argv, done):
    rc, out, err = run(argv)
    if rc != 0:
        raise KernelCmdlineError("%s failed (rc %d): %s; done before it: %s" % (
            " ".join(argv), rc, (err or out or "").strip() or "no output", ", ".join(done) or "nothing"), command=" ".join(argv))
    done.append(" ".join(argv))


def _finish_grub(prepared, write):
    root, run, managed, warnings = prepared["root"], prepared["run"], prepared["managed"], prepared["warnings"]
    updated = False
    if prepared["changes"] and not prepared["check"]:
        undo = _write(prepared, write)
        if prepared["live"]:
            try:
                _run(run, prepared["argvs"][0], [])
            except KernelCmdlineError as exc:
                failed = rollback_files(undo)["failed"]
                why = ("the configuration files were put back" if not failed
                       else "putting the configuration files back failed too (%s)" % ", ".join(failed))
                raise KernelCmdlineError("%s; %s" % (exc, why), **exc.details)
            updated = True
    next_boot = None
    if prepared["live"] or os.path.exists(rooted(root, grub_cfg.GRUB_CFG)):
        next_boot, _title = grub_cfg.next_boot(root, warnings)
    pending = prepared["changes"] and not updated
    if next_boot is not None and not pending:
        have = [norm(t) for t in next_boot]
        missing = [t for t in managed.values() if not is_removal(t) and have.count(norm(t)) != 1]
        if missing:
            warnings.append("the next boot's command line (the default entry of %s) does not carry %s once: %s"
                            % (grub_cfg.GRUB_CFG, " ".join(missing), " ".join(next_boot)))
        left = [t for t in next_boot if any(is_removal(m) and param_key(m) == param_key(t) for m in managed.values())]
        if left:
            warnings.append("the next boot's command line (the default entry of %s) still has %s, which this module "
                            "removes: %s" % (grub_cfg.GRUB_CFG, " ".join(left), " ".join(next_boot)))
    return updated, next_boot, prepared["after"], pending


def _finish_grubby(prepared, write):
    run, managed, released = prepared["run"], prepared["managed"], prepared["released"]
    after, next_boot, updated = prepared["after"], grubby.boot_tokens(prepared["default"]), False
    if not prepared["check"]:
        _write(prepared, write)
        done = []
        for argv in prepared["argvs"]:
            _run(run, argv, done)
        if prepared["argvs"]:
            updated = True
            entries, default = grubby.read(run)
            problems = grubby.verify(entries, managed, released, prepared["planned"], prepared["warnings"])
            if problems:
                raise KernelCmdlineError("grubby did not leave what was planned: %s (ran: %s)" % ("; ".join(problems), ", ".join(done)),
                                         problems=problems)
            after = grubby.entry_tokens(default)
            rc, out, err = run([grubby.GRUBBY, "--info=DEFAULT"])
            shown = [e for e in grubby.parse_info(out) if e["linux"]] if rc == 0 else []
            next_boot = grubby.boot_tokens(shown[0] if shown else default)
    pending = bool(prepared["argvs"]) and not updated
    return updated, next_boot, after, pending


def finish(prepared, write=None):
    """Apply a :func:`prepare`'d run. Returns the module's result (without ``diff``) and the diff list."""
    if prepared["bootloader"] == "grub_debian":
        updated, next_boot, after, pending = _finish_grub(prepared, write)
    else:
        updated, next_boot, after, pending = _finish_grubby(prepared, write)
    keys = set(prepared["managed"]) | set(prepared["released"])
    if prepared["check"] or pending or next_boot is None:
        reboot = reboot_computed(prepared["running"], after, keys)
    else:
        reboot = reboot_readback(prepared["running"], next_boot, keys)
    changes = prepared["changes"]
    changed = bool(changes) or (bool(prepared["argvs"]) if prepared["bootloader"] == "grubby" else False)
    result = {
        "changed": changed,
        "bootloader": prepared["bootloader"],
        "managed": list(prepared["managed"].values()),
        "configured_before": prepared["before"],
        "configured_after": after,
        "running": prepared["running"],
        "next_boot_cmdline": next_boot,
        "reboot_required": reboot,
        "bootloader_updated": updated,
        "commands": prepared["commands"],
        "files": [{k: a[k] for k in ("path", "action", "reason")} for a in prepared["actions"]],
        "marker": prepared["marker"],
        "warnings": prepared["warnings"],
    }
    if not prepared["live"]:
        result["msg"] = "root is %s: files are planned and written under it only; no bootloader command runs" % prepared["root"]
    diff = [{"before_header": a["path"], "after_header": a["path"] if a["action"] != "remove" else "(absent)",
             "before": a["before"], "after": a["after"]} for a in changes]
    if prepared["bootloader"] == "grubby":
        for entry in prepared["entries"]:
            old, new = grubby.entry_tokens(entry), prepared["planned"][entry["kernel"]]
            if old != new:
                diff.append({"before_header": "grubby %s args" % entry["kernel"], "after_header": "grubby %s args" % entry["kernel"],
                             "before": " ".join(old) + "\n", "after": " ".join(new) + "\n"})
    return result, diff


def converge(params, run, check, live, which, procfs="/proc", write=None):
    """One run: check, plan, apply. Returns the module's result (without ``diff``) and the diff list."""
    return finish(prepare(params, run, check, live, which, procfs=procfs), write=write)
