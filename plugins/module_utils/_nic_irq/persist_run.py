# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The nic_irq_persist module's cycle: plan the pins, the RPS masks and the files that make them last, pin, write,
read back; a failed step after the pins takes back what the run did.

Standard library only; the module is its options, its documentation and :func:`converge`. Everything is planned
and checked before the first write; the boot/udev/if-up/re-check entry point (:mod:`_nic_irq.pin_cli`) waits for the
same lock (:func:`_nic_irq.affinity.pin_lock`). A failure after the pins is rolled back by :func:`_roll_back`:
systemd through :meth:`_host.systemd.Systemd.roll_back`, the files through :func:`_host.files.rollback_files`, the
RPS masks and the IRQs through :mod:`_nic_irq.affinity`.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import TreeError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import (
    UNIT_DIR, PersistError, apply_files, plan_files, rollback_files, rooted)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import PKG_DIR, installed_library
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import undo_disable_now, undo_enable_now
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import root_of
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import (
    DESIRED_KEYS, pin_lock, release_rps, restore_pins, restore_rps_masks, run_desired_state, stored_desired_state,
    verify_pins)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance_state import finish, prepare
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import NicError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.persist import HEADER, RECHECK_UNIT, TIMER, UDEV_RULE, UNIT, owned_paths, render
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.rps import rps_drift

SETTINGS = ("state_file", "lib_dir", "entry_point", "python", "timeout", "recheck_interval")


def check_params(params):
    """What the one validator (:func:`_host.validate.validate_module`, called first) cannot know:
    ranges, combinations, system directories. The characters of recheck_interval (a systemd time span) and of the paths are its rules."""
    if not 1 <= params["timeout"] <= 3600:
        raise PersistError("timeout %r: expected seconds from 1 to 3600" % params["timeout"], option="timeout",
                           value=params["timeout"])
    for key in ("state_file", "lib_dir", "entry_point", "python"):
        if params[key] in ("", "/"):
            raise PersistError("%s %r: expected an absolute path (of a file or directory of its own)"
                               % (key, params[key]), option=key, value=params[key])
    irqbalance = params["irqbalance"]
    if irqbalance is not None:
        allowed = ("absent",) if params["state"] == "absent" else ("disabled", "banned")
        if irqbalance["mode"] not in allowed:
            raise PersistError("irqbalance.mode %r with state=%s: expected %s" % (irqbalance["mode"], params["state"],
                               " or ".join(allowed)), option="irqbalance.mode", value=irqbalance["mode"])
    lib = params["lib_dir"].rstrip("/")
    if lib in ("/usr", "/usr/local", "/usr/lib", "/usr/local/lib", "/etc", "/opt", "/var", "/var/lib"):
        raise PersistError("lib_dir %r: expected a directory of its own (for example /usr/local/lib/gpunode-tuning), "
                           "not a system directory" % params["lib_dir"], option="lib_dir", value=params["lib_dir"])


def _stored_rps(settings, root):
    """``(pci_address, rps_cpus)`` of the desired state stored by an earlier run, or None when it set no RPS mask
    (no file, not this module's JSON, no ``rps_cpus``)."""
    try:
        with open(rooted(root, settings["state_file"]), "rb") as handle:
            data = handle.read()
        stored = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("rps_cpus"), str) or not stored["rps_cpus"]:
        return None
    return stored.get("pci_address"), stored["rps_cpus"]


def _is_state_file(data):
    """Whether ``data`` is a desired-state file this module wrote (a JSON object with the NIC's pci_address)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(parsed, dict) and "pci_address" in parsed


def _own_files(files, settings, root):
    """Refuse to overwrite what is not this module's: a file without its header (the state file: not its JSON), a
    symlink or a non-regular file at the entry point, the state file, a unit, the udev rule or a hook. The library
    under lib_dir is known by its manifest."""
    lib = settings["lib_dir"].rstrip("/") + "/"
    names = {settings["entry_point"]: "entry_point", settings["state_file"]: "state_file"}
    for path in sorted(files):
        if path.startswith(lib):
            continue
        marker = _is_state_file if path == settings["state_file"] else HEADER
        try:
            check_own_file(names.get(path, "persist"), rooted(root, path), marker)
        except InputError as exc:
            raise PersistError(str(exc), path=path, **exc.details)


def _irqbalance_prepare(target, params, root, sysfs, run, banned_cpus="", banned_devices=()):
    """Plan irqbalance's pass (params ``irqbalance``): every input checked, nothing changed yet."""
    settings = dict(params["irqbalance"], banned_cpus=banned_cpus, banned_devices=list(banned_devices))
    return prepare(settings, root, run, target.check, sysfs=sysfs,
                   detect=target.os_family if run is not None else None)


def _present(target, params, procfs, sysfs, run):
    desired = dict((key, params[key]) for key in DESIRED_KEYS)
    settings = dict((key, params[key]) for key in SETTINGS)
    root = root_of(procfs)
    irqbalance = params["irqbalance"]
    if irqbalance is not None:
        # Stored as the boot-time run needs it: a banned irqbalance keeps running, a disabled one is gone.
        desired["allow_irqbalance"] = irqbalance["mode"] == "banned"
    # Planned as if irqbalance were already stopped when this run (or the play, before this task) stops it.
    stopped_first = params["assume_irqbalance_stopped"] or irqbalance is not None
    run_desired = dict(desired, allow_irqbalance=True) if stopped_first else desired
    # rps_cpus left out while the stored state set a mask: the queues that still carry it go back to 0.
    rps_release = _stored_rps(settings, root) if params["persist"] and not desired["rps_cpus"] else None
    # Validate and plan everything (IRQs, RPS and files) before the first write.
    plan = run_desired_state(run_desired, check_mode=True, procfs=procfs, sysfs=sysfs, run=run, rps_release=rps_release)
    if not plan["pci_address"]:
        raise AffinityError("%s has no PCI function: expected a PCI network function, whose address finds it again "
                            "at boot" % plan["interface"], value=plan["interface"], expected="a PCI network function")
    files, actions = {}, []
    if params["persist"]:
        stored = stored_desired_state(desired, plan["pci_address"])
        files = render(stored, settings, root)
        _own_files(files, settings, root)
        remove = [p for p in installed_library(settings["lib_dir"], root) if p not in files]
        if not settings["recheck_interval"]:
            remove += ["%s/%s" % (UNIT_DIR, RECHECK_UNIT), "%s/%s" % (UNIT_DIR, TIMER)]
        actions = plan_files(files, remove, root, diff_skip=("%s/%s/" % (settings["lib_dir"].rstrip("/"), PKG_DIR),))
    # Everything is planned and checked: from here to the read-back, one pass of pins at a time on the system. The
    # boot/udev/if-up/re-check entry point waits for this lock, then applies the state file this run wrote.
    with pin_lock(procfs, take=not target.check):
        irqbalance_result, irqbalance_diff = None, []
        if irqbalance is not None:
            prepared = _irqbalance_prepare(target, params, root, sysfs, run, plan["cpulist"], [plan["pci_address"]])
            irqbalance_result, irqbalance_diff = finish(prepared)
        try:
            out, warnings, diff = _pin_and_persist(target, params, procfs, sysfs, run, plan, run_desired, desired,
                                                   files, actions, settings, root, irqbalance_result, rps_release)
        except (AffinityError, NicError, TreeError, PersistError) as exc:
            if irqbalance_result is not None:   # irqbalance's pass is done: say so in the failure
                exc.details.update(irqbalance_state=irqbalance_result,
                                   changed=bool(irqbalance_result["changed"] or exc.details.get("changed")))
            raise
    return out, warnings, irqbalance_diff + diff


def _read_back(result, pin_desired, procfs, sysfs, run, rps_release, warnings):
    """verify_pins after the pins. IRQs moved between the write and the read-back are pinned once more and read back
    again: a one-off mover (a process that read the old state a moment before) is then said in ``warnings``; a mover
    that keeps moving them (irqbalance started again, a second tool) moves them again, and the mismatch stays."""
    check = verify_pins(result, procfs=procfs, sysfs=sysfs, run=run)
    if check["mismatch"]:
        moved = check["mismatch"]
        try:
            run_desired_state(pin_desired, check_mode=False, procfs=procfs, sysfs=sysfs, run=run,
                              rps_release=rps_release)
        except (AffinityError, NicError, TreeError) as exc:
            check["mismatch"] = moved + ["pinning again failed: %s" % exc]
        else:
            check = verify_pins(result, procfs=procfs, sysfs=sysfs, run=run)
            if not check["mismatch"]:
                warnings.append("after pinning, something moved queue IRQs of %s (%s); they were pinned again "
                                "and held" % (result["pci_address"], "; ".join(moved)))
    return check


def _pin_and_persist(target, params, procfs, sysfs, run, plan, run_desired, desired, files, actions, settings, root,
                     irqbalance_result, rps_release=None):
    # irqbalance (when this run handles it) is stopped or bans these CPUs by now: pin with the stored setting,
    # so a disabled irqbalance that is still running is refused, not raced.
    # (On a captured tree no systemctl ran, so the tree's irqbalance still looks as it was: plan as for check mode.)
    pin_desired = desired if (params["irqbalance"] is not None and run is not None) else run_desired
    if target.check or not (plan["changed"] or (irqbalance_result or {}).get("changed")):
        # Nothing to pin and irqbalance as it was: the plan is the outcome (the read-back below still reads the IRQs).
        result = plan
    else:
        result = run_desired_state(pin_desired, check_mode=False, procfs=procfs, sysfs=sysfs, run=run,
                                   rps_release=rps_release)
    systemd = target.systemd(error=PersistError)
    changed_files = [a for a in actions if a["action"] != "unchanged"]
    undo_files = None
    if params["persist"]:
        timer_path = rooted(root, "%s/%s" % (UNIT_DIR, TIMER))
        try:
            if not settings["recheck_interval"] and os.path.exists(timer_path):
                timer = systemd.show([TIMER]).get(TIMER, {}) if not target.check else {}
                systemd.do(["systemctl", "disable", "--now", TIMER], "disable --now %s" % TIMER,
                           undo=undo_disable_now(TIMER, timer))
            if not target.check:
                undo_files = apply_files(files, changed_files, root, prune_within=settings["lib_dir"])
            units = [a for a in changed_files if a["path"].startswith(UNIT_DIR + "/")]
            if units:
                systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
            if any(a["path"] == UDEV_RULE for a in changed_files):
                systemd.do(["udevadm", "control", "--reload"], "udevadm control --reload")
            # Enablement is read from systemd itself, so only on the live system.
            if systemd.live:
                found = systemd.show([UNIT, TIMER])
                if found.get(UNIT, {}).get("UnitFileState") != "enabled":
                    systemd.do(["systemctl", "enable", UNIT], "enable %s" % UNIT, undo=[["systemctl", "disable", UNIT]])
                timer = found.get(TIMER, {})
                if settings["recheck_interval"] and (timer.get("UnitFileState") != "enabled"
                                                     or timer.get("ActiveState") != "active"):
                    systemd.do(["systemctl", "enable", "--now", TIMER], "enable --now %s" % TIMER,
                               undo=undo_enable_now(TIMER, timer))
        except PersistError as exc:
            raise _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs)
    out = dict(
        changed=bool(result["changed"] or changed_files or systemd.actions),
        interface=result["interface"], pci_address=result["pci_address"], cpulist=result["cpulist"], cpus=result["cpus"],
        irqs=result["irqs"], rps=result["rps"], irqbalance=result["irqbalance"],
        drift=["%s %s: %s -> %s" % (i["irq"], i["name"], i["before"], i["after"])
               for i in result["irqs"] if i["status"] in ("changed", "would_change")] + rps_drift(result["rps"]),
        files=[dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions],
        systemd=systemd.actions, verified=None, unchangeable=[], effective_lagging=[],
    )
    if irqbalance_result is not None:
        out.update(irqbalance_state=irqbalance_result, changed=bool(out["changed"] or irqbalance_result["changed"]))
    warnings = list(result["warnings"])
    if params["verify"] and not target.check:
        check = _read_back(result, pin_desired, procfs, sysfs, run, rps_release, warnings)
        out.update(verified=not check["mismatch"], unchangeable=check["unchangeable"],
                   effective_lagging=check["lagging"])
        if check["mismatch"]:
            exc = PersistError("after pinning, queue IRQs of %s are not on their planned CPUs (something moved them: "
                               "is irqbalance running?): %s" % (result["pci_address"], "; ".join(check["mismatch"])),
                               **out)
            raise _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs)
    diff = [result["diff"]] + ([result["rps_diff"]] if result["rps_diff"] else []) + [
        {"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]}
        for a in changed_files if a["before"] or a["after"]]
    return out, warnings, diff


def _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs):
    """A step after the pins failed (a file, systemctl, the read-back): put back what this run did, so a failed run
    leaves the node as it found it - the units it enabled or started stopped and disabled, the files (bytes, mode,
    owner, or absence; after a failed write ``apply_files`` has already put them back), systemd and udev reloaded,
    what it disabled enabled again, the RPS masks it wrote, the IRQs it moved. irqbalance's pass, which ran before the pins, is not undone (it
    is reported with the failure). Returns the error to raise: what was put back, what could not be, and ``changed``
    true only when something could not."""
    files = {"restored": [], "failed": list(exc.details.get("rollback_failed") or [])}

    def restore_files():
        if undo_files is not None:
            back = rollback_files(undo_files)
            files["restored"], files["failed"] = back["restored"], files["failed"] + back["failed"]

    paths = [a["path"] for a in changed_files]
    restored, failed = systemd.roll_back(restore_files, undo_files is not None and any(
        p.startswith(UNIT_DIR + "/") for p in paths), undo_files is not None and UDEV_RULE in paths)
    rps = restore_rps_masks(result, sysfs=sysfs)
    pins = {"restored": [], "failed": [], "summary": "none moved"}
    if any(item["status"] == "changed" for item in result["irqs"]):
        pins = restore_pins(result["irqs"], procfs=procfs)
    parts = []
    if undo_files is not None:
        parts.append("files: %d put back%s" % (len(files["restored"]), "; rollback FAILED for %s" % ", ".join(
            files["failed"]) if files["failed"] else ""))
    if restored or failed:
        parts.append("systemd: %s%s" % (", ".join(restored) or "nothing", "; FAILED: %s" % ", ".join(failed)
                                        if failed else ""))
    if rps["restored"] or rps["failed"]:
        parts.append("RPS: %s" % rps["summary"])
    parts.append("pins: %s" % pins["summary"])
    details = dict(exc.details, files_rolled_back=files["restored"], rollback_failed=files["failed"],
                   systemd_rolled_back=restored, systemd_rollback_failed=failed, pins_rolled_back=pins["restored"],
                   pins_rollback_failed=pins["failed"], rps_rolled_back=rps["restored"], rps_rollback_failed=rps["failed"],
                   changed=bool(files["failed"] or failed or pins["failed"] or rps["failed"]))
    return PersistError("%s; rolled back: %s" % (exc, "; ".join(parts)), **details)


def _absent(target, params, procfs, sysfs, run):
    # The entry point's passes wait (a running one is stopped by disable --now: its wait for the lock ends).
    with pin_lock(procfs, take=not target.check):
        return _remove(target, params, procfs, sysfs, run)


def _remove(target, params, procfs, sysfs, run):
    settings = dict((key, params[key]) for key in SETTINGS)
    root = root_of(procfs)
    actions = plan_files({}, owned_paths(settings, root), root,
                         diff_skip=("%s/%s/" % (settings["lib_dir"].rstrip("/"), PKG_DIR),))
    prepared = _irqbalance_prepare(target, params, root, sysfs, run) if params["irqbalance"] is not None else None
    # The RPS masks the stored state set go back to 0 (planned and checked here, written after the units stop, so
    # no re-check sets them again; a failed removal of the files puts them back).
    stored, rps, warnings = _stored_rps(settings, root), None, []
    if stored is not None:
        try:
            rps = release_rps(stored[0], stored[1], check_mode=True, procfs=procfs, sysfs=sysfs, run=run)
        except NicError as exc:
            warnings.append("the RPS masks the stored state set (%s) are left as they are: %s" % (stored[1], exc))
    systemd = target.systemd(error=PersistError)
    for unit in (TIMER, UNIT):
        if os.path.exists(rooted(root, "%s/%s" % (UNIT_DIR, unit))):
            systemd.do(["systemctl", "disable", "--now", unit], "disable --now %s" % unit)
    if rps is not None and rps["changed"] and not target.check:
        rps = release_rps(stored[0], stored[1], check_mode=False, procfs=procfs, sysfs=sysfs, run=run)
    if not target.check:
        try:
            apply_files({}, actions, root, prune_within=settings["lib_dir"])
        except PersistError as exc:
            if rps is None:
                raise
            back = restore_rps_masks(rps, sysfs=sysfs)
            raise PersistError("%s; RPS: %s" % (exc, back["summary"]), rps_rolled_back=back["restored"],
                               rps_rollback_failed=back["failed"], changed=bool(back["failed"]), **exc.details)
    if any(a["path"].startswith(UNIT_DIR + "/") for a in actions):
        systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
    if any(a["path"] == UDEV_RULE for a in actions):
        systemd.do(["udevadm", "control", "--reload"], "udevadm control --reload")
    out = dict(changed=bool(actions or systemd.actions or (rps and rps["changed"])),
               files=[dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions],
               systemd=systemd.actions, rps=rps["rps"] if rps else [])
    diff = ([rps["diff"]] if rps and rps["diff"] else []) + [
        {"before_header": a["path"], "after_header": "(absent)", "before": a["before"], "after": ""}
        for a in actions if a["before"]]
    warnings += rps["warnings"] if rps else []
    if prepared is not None:
        # After the persistence is gone, so nothing of the collection pins behind the irqbalance given back.
        irqbalance_result, irqbalance_diff = finish(prepared)
        out.update(irqbalance_state=irqbalance_result, changed=bool(out["changed"] or irqbalance_result["changed"]))
        diff += irqbalance_diff
    return out, warnings, diff


def converge(params, target):
    """One run of the module: ``params`` as its options (checked by :func:`check_params`), ``target`` the live node
    or a captured tree (:class:`_host.target.Target`). Returns (result, warnings, diff)."""
    check_params(params)
    step = _absent if params["state"] == "absent" else _present
    return step(target, params, target.procfs, target.sysfs, target.run)
