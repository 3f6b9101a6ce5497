# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Apply NIC queue IRQ affinity, verify it and roll it back: read -> validate -> plan -> apply.

Private module_utils of gpunode.tuning, standard library only.

* The plan is ``_nic_irq.pin_plan.plan_affinity`` (pure: which CPUs, which IRQ
  goes where; its error, ``AffinityError``, is the one this raises too).
* :func:`apply_plan` is the only code that writes. It writes
  ``/proc/irq/N/smp_affinity_list`` only where the plan changes it, reports
  EIO/EPERM refusals (managed IRQs) as ``unchangeable`` with the value read
  back and, on any other error, restores what it already changed before
  raising; an IRQ whose previous value could not be read is never written
  back (an empty write resets the IRQ): the error says so instead.
* Kernel-managed IRQs are known before writing where the kernel tells
  (``IRQD_AFFINITY_MANAGED`` in ``/sys/kernel/debug/irq/irqs/N``, see
  ``_nic_irq.nic_irqs.read_managed``), and a refusal is remembered for the rest of the boot
  in ``/run/gpunode/irq-affinity-refused.json`` (:func:`read_refusals`,
  :func:`record_refusals`), so a check-mode run on a converged host plans no
  change for them.
* :func:`run_desired_state` chains them for the ``nic_irq_affinity`` module
  and for the boot-time CLI in ``_nic_irq.pin_cli``; with ``rps_cpus`` in the
  desired state it also sets every RX queue's RPS mask (``_nic_irq.rps``), after the
  pins, and a failed RPS write puts back the RPS masks and the pins.
* :func:`verify_pins` reads the NIC again and compares; :func:`restore_pins`
  and :func:`restore_rps_masks` put back what a run changed when a later step
  fails; :func:`pin_lock` holds one pass of pins at a time.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exclusive_lock, join, read_raw, read_text, write_kernel_file
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import check_roots, root_of
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance import read_irqbalance
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import (
    SELECTOR_KEYS, NicError, require_named_nic, select_interface)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_irq_state, read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import (
    AffinityError, PlanItem, cpus_text, plan_affinity)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.rps import (
    RpsError, apply_rps, check_rps_cpus, plan_rps, restore_rps, rps_diff, verify_rps)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

DESIRED_KEYS = SELECTOR_KEYS + ("cpus", "count", "exclude_cpus", "numa_local", "whole_cores", "allow_irqbalance", "strict",
                                "rps_cpus")
MANAGED_ERRNOS = (errno.EIO, errno.EPERM)
# Refusals seen in this boot, under the system root (root_of(procfs)): IRQ
# numbers and their managed state are valid for one boot, and /run is emptied
# at every boot.
REFUSALS_FILE = "run/gpunode/irq-affinity-refused.json"
# One pass of pins at a time, under the system root: the nic_irq_persist module holds it across its pins, state
# file and read-back; the boot/udev/if-up/re-check entry point across each pass (see _fileio.exclusive_lock).
PIN_LOCK = "run/gpunode/nic-irq-pin.lock"
PIN_LOCK_WAIT = 25.0


def apply_plan(plan, procfs="/proc", strict=False, write=None, refusals=None):
    """Write the plan's changes; return the plan with statuses updated.

    ``write(path, text)`` defaults to a single ``write(2)`` without O_CREAT.
    EIO/EPERM (the kernel refusing a managed IRQ) gives ``unchangeable`` with
    ``after`` read back from the file, and is remembered in ``refusals``
    (default: :data:`REFUSALS_FILE` under ``root_of(procfs)``); with
    ``strict`` it is a rollback and an error. Any other error restores the
    IRQs changed so far (newest first) and raises AffinityError naming IRQ,
    value and error.
    """
    write = write or write_kernel_file
    done = []
    refused = []
    for item in plan.items:
        if item.status != "would_change":
            continue
        path = join(procfs, "irq", str(item.irq), "smp_affinity_list")
        value = format_cpulist(item.after)
        try:
            write(path, value + "\n")
        except OSError as exc:
            if exc.errno in MANAGED_ERRNOS and not strict:
                item.status = "unchangeable"
                refused.append((item, value, errno.errorcode.get(exc.errno, str(exc.errno))))
                continue
            restored = _rollback(done, procfs, write)
            raise AffinityError(
                "writing %s to IRQ %d (%s) failed: [%s] %s; %s"
                % (value, item.irq, item.name, errno.errorcode.get(exc.errno, exc.errno), exc.strerror or exc, restored["summary"]),
                irq=item.irq, value=value, path=path, error=str(exc), errno=exc.errno, rolled_back=restored["restored"],
                rollback_failed=restored["failed"],
            )
        done.append(item)
        item.status = "changed"
    for item in done + [r[0] for r in refused]:
        after, item.effective = read_irq_state(procfs, item.irq)
        item.after = after if after is not None else item.before
    for item, value, code in refused:
        plan.warnings.append(
            "IRQ %d (%s) is kernel-managed: writing %s failed with %s; it reads back %s"
            % (item.irq, item.name, value, code, cpus_text(item.after))
        )
    if refused:
        problem = record_refusals([(item.irq, item.name, value, code) for item, value, code in refused], procfs=procfs,
                                  path=refusals)
        if problem:
            plan.warnings.append(problem)
    return plan


def _refusals_path(procfs, path=None):
    return path or join(root_of(procfs), REFUSALS_FILE)


def _boot_id(procfs):
    return read_text(join(procfs, "sys/kernel/random/boot_id"))


def read_refusals(procfs="/proc", path=None):
    """IRQs whose affinity write the kernel refused in this boot: ``{irq: {"name", "value", "errno"}}``.

    Empty when there is no record, it cannot be parsed, or it is from another
    boot (``/proc/sys/kernel/random/boot_id`` differs).
    """
    try:
        data = json.loads(read_raw(_refusals_path(procfs, path)) or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("boot_id") != _boot_id(procfs) or not isinstance(data.get("irqs"), dict):
        return {}
    return dict((int(k), v) for k, v in data["irqs"].items() if k.isdigit() and isinstance(v, dict))


def record_refusals(entries, procfs="/proc", path=None):
    """Add ``(irq, name, value, errno)`` refusals to the record of this boot; return None or a warning text.

    Written through a temporary file in the same directory and renamed (mode
    0644, directory 0755), so a reader never sees half a file.
    """
    target = _refusals_path(procfs, path)
    irqs = read_refusals(procfs, path)
    for irq, name, value, code in entries:
        irqs[irq] = {"name": name, "value": value, "errno": code}
    text = json.dumps({"boot_id": _boot_id(procfs), "irqs": dict((str(k), irqs[k]) for k in sorted(irqs))},
                      indent=1, sort_keys=True) + "\n"
    tmp = None
    try:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".irq-affinity-refused.", dir=os.path.dirname(target))
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.rename(tmp, target)
    except OSError as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        return "could not remember the refused IRQs in %s (%s): check mode will plan them again" % (target, exc)
    return None


def _rollback(done, procfs, write):
    restored, failed = [], []
    for item in reversed(done):
        path = join(procfs, "irq", str(item.irq), "smp_affinity_list")
        if not item.before:
            # Never write an unknown (empty) value: on a real kernel that resets the IRQ.
            failed.append({"irq": item.irq, "value": None, "error": "its previous affinity could not be read; left at %s"
                           % format_cpulist(item.after)})
            continue
        try:
            write(path, format_cpulist(item.before) + "\n")
            restored.append(item.irq)
            item.status = "unchanged"
            item.after = item.before
        except OSError as exc:
            failed.append({"irq": item.irq, "value": format_cpulist(item.before), "error": str(exc)})
    return _rollback_summary(restored, failed)


def restore_pins(irqs, procfs="/proc", write=None):
    """Put every IRQ that a :func:`run_desired_state` result moved (``irqs``, status ``changed``) back to its
    ``before`` smp_affinity_list, newest first, as a failed write of :func:`apply_plan` does; for a run whose later
    steps (the persistence files) failed. Updates ``irqs`` in place; returns ``restored``, ``failed``, ``summary``."""
    write = write or write_kernel_file
    moved = [item for item in irqs if item.get("status") == "changed"]
    done = []
    for item in moved:
        before = parse_cpulist(item["before"]) if item.get("before") else None
        done.append(PlanItem(item["irq"], item["name"], item.get("kind"), item.get("queue"), None, before,
                             parse_cpulist(item["after"]) if item.get("after") else [], None, "changed"))
    back = _rollback(done, procfs, write)
    for item, planned in zip(moved, done):
        if planned.status == "unchanged":
            item.update(status="unchanged", after=item["before"])
    return back


def _rollback_summary(restored, failed):
    if failed:
        summary = "rollback FAILED for IRQs %s" % "; ".join("%d (%s)" % (f["irq"], f["error"]) for f in failed)
    elif restored:
        summary = "restored IRQs %s to their previous affinity" % ", ".join(str(i) for i in restored)
    else:
        summary = "nothing had been changed"
    return {"restored": restored, "failed": failed, "summary": summary}


def pin_lock(procfs, take=True, wait=None, stop=None, sleep=None, clock=None):
    """The exclusive lock of the system that holds ``procfs`` for one pass of NIC IRQ pins (:data:`PIN_LOCK`);
    with ``take`` false (check mode) a lock that takes nothing."""
    path = join(root_of(procfs), PIN_LOCK) if take else None
    return exclusive_lock(path, PIN_LOCK_WAIT if wait is None else wait, sleep=sleep, clock=clock, stop=stop)


def _rps_error(exc):
    return AffinityError(str(exc), **exc.details)


def _plan_rps(nic, topology, plan, rps_cpus, rps_release, sysfs):
    """The RPS plan of ``nic`` (``_nic_irq.rps.plan_rps``), or None when RPS is not managed: ``rps_cpus`` sets every RX
    queue; without it, ``rps_release`` (``(pci_address, cpulist)``: the mask a stored desired state had set) puts the
    queues that still carry that mask back to 0 when it is this NIC."""
    rps_text = _cpulist_text(rps_cpus)
    try:
        if rps_text:
            cpus = check_rps_cpus(rps_cpus, topology)
            rps = plan_rps(sysfs, nic["interface"], topology, cpus=cpus)
            shared = sorted(set(cpus) & set(plan.cpus))
            if shared:
                rps["warnings"].append("rps_cpus %s include the IRQ CPUs %s: receive work steered there stays on the "
                                       "CPUs that take the interrupts" % (format_cpulist(cpus), format_cpulist(shared)))
            return rps
        if rps_release and rps_release[1]:
            if rps_release[0] != nic["pci_address"]:
                plan.warnings.append("the previous desired state set RPS (%s) on %s, not on this NIC: its RX queues "
                                     "are left as they are" % (rps_release[1], rps_release[0]))
                return None
            return plan_rps(sysfs, nic["interface"], topology, release=rps_release[1])
    except RpsError as exc:
        raise _rps_error(exc)
    return None


def _apply_rps(rps, plan, procfs, sysfs, write):
    """Write the RPS plan after the pins; a failed write puts back the RPS masks written (``apply_rps``) and then
    every IRQ this run moved, and raises AffinityError naming both."""
    try:
        apply_rps(rps, sysfs, write or write_kernel_file)
    except RpsError as exc:
        pins = _rollback([i for i in plan.items if i.status == "changed"], procfs, write or write_kernel_file)
        raise AffinityError("%s; pins: %s" % (exc, pins["summary"]), pins_rolled_back=pins["restored"],
                            pins_rollback_failed=pins["failed"],
                            changed=bool(pins["failed"] or exc.details.get("rps_rollback_failed")), **exc.details)


def run_desired_state(desired, check_mode=False, procfs="/proc", sysfs="/sys", run=None, write=None, rps_release=None):
    """Read, validate, plan and (unless ``check_mode``) apply one desired state.

    ``desired`` keys are the ``nic_irq_affinity`` options (see DESIRED_KEYS).
    ``rps_release``: ``(pci_address, cpulist)`` of an RPS mask a stored desired
    state set and this one no longer has (see :func:`_plan_rps`).
    Returns ``changed``, ``interface``, ``pci_address``, ``driver``, ``cpus``,
    ``cpulist``, ``irqs``, ``rps`` (per RX queue; [] when RPS is not managed),
    ``warnings``, ``diff``, ``rps_diff`` (None without RPS), ``irqbalance``.
    """
    unknown = sorted(set(desired) - set(DESIRED_KEYS))
    if unknown:
        raise AffinityError("unknown keys %s in desired state" % ", ".join(unknown), value=unknown, expected="keys from %s" % ", ".join(DESIRED_KEYS))
    # a write never mixes a captured root with the live one (TreeError names the paths)
    check_roots(procfs, sysfs, write=True)
    selector = dict((k, desired.get(k)) for k in SELECTOR_KEYS)
    # A run that pins never guesses between several NICs (the default route is often the management NIC).
    require_named_nic(selector, procfs=procfs, sysfs=sysfs)
    nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    topology = read_topology(sysfs=sysfs, procfs=procfs)
    plan = plan_affinity(
        nic, topology, cpus=desired.get("cpus"), count=desired.get("count"), exclude_cpus=desired.get("exclude_cpus"),
        numa_local=desired.get("numa_local", True) is not False, whole_cores=desired.get("whole_cores", True) is not False,
        refused=read_refusals(procfs), strict=bool(desired.get("strict")),
    )
    irqbalance = read_irqbalance(root_of(procfs), run=run)
    if irqbalance["active"]:
        if not desired.get("allow_irqbalance"):
            raise AffinityError(
                "irqbalance is active and would undo the pins within seconds; stop and mask it or set allow_irqbalance",
                value="irqbalance active (%s)" % irqbalance["source"], expected="irqbalance inactive, or allow_irqbalance=true",
                option="allow_irqbalance",
            )
        banned = set(irqbalance["banned_cpus"])
        plan.warnings.append(
            "irqbalance is active (allowed): it may move these IRQs%s"
            % ("" if set(plan.cpus) <= banned else "; the target CPUs are not all in its banned list")
        )
    rps = _plan_rps(nic, topology, plan, desired.get("rps_cpus"), rps_release, sysfs)
    if plan.changes and not check_mode:
        apply_plan(plan, procfs=procfs, strict=bool(desired.get("strict")), write=write)
    if rps is not None and not check_mode:
        _apply_rps(rps, plan, procfs, sysfs, write)
    rps_items = rps["queues"] if rps is not None else []
    return {
        "changed": bool(plan.changes) or any(i["status"] in ("changed", "would_change") for i in rps_items),
        "interface": nic["interface"],
        "pci_address": nic["pci_address"],
        "driver": nic["driver"],
        "cpus": plan.cpus,
        "cpulist": format_cpulist(plan.cpus),
        "irqs": plan.as_list(),
        "rps": rps_items,
        "warnings": list(plan.warnings) + (rps["warnings"] if rps is not None else []) + list(nic["notes"]),
        "diff": plan.diff(),
        "rps_diff": rps_diff(rps_items, nic["interface"], nic["pci_address"]) if rps_items else None,
        "irqbalance": {k: irqbalance[k] for k in ("installed", "active", "enabled", "masked", "banned_cpus", "source")},
    }


# The pinning options of a module, beside the NIC selector (nic_irq_affinity, nic_irq_persist).
PIN_ARGUMENT_SPEC = dict(
    cpus=dict(type="raw"),
    count=dict(type="int"),
    exclude_cpus=dict(type="raw"),
    numa_local=dict(type="bool", default=True),
    whole_cores=dict(type="bool", default=True),
    allow_irqbalance=dict(type="bool", default=False),
    strict=dict(type="bool", default=False),
    rps_cpus=dict(type="raw"),
)


def _cpulist_text(value):
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def stored_desired_state(desired, pci_address):
    """The desired state as stored on the node: the NIC by its PCI address (found from
    the selector on this run), the CPUs or the policy; never an IRQ number or a name."""
    stored = {"pci_address": pci_address}
    cpus = _cpulist_text(desired.get("cpus"))
    if cpus:
        stored["cpus"] = cpus
    elif desired.get("count"):
        stored["count"] = int(desired["count"])
    exclude = _cpulist_text(desired.get("exclude_cpus"))
    if exclude:
        stored["exclude_cpus"] = exclude
    for key, default in (("numa_local", True), ("whole_cores", True), ("allow_irqbalance", False), ("strict", False)):
        value = desired.get(key)
        stored[key] = default if value is None else bool(value)
    rps = _cpulist_text(desired.get("rps_cpus"))
    if rps:
        stored["rps_cpus"] = rps
    return stored


def release_rps(pci_address, previous, check_mode=False, procfs="/proc", sysfs="/sys", run=None, write=None):
    """Put RPS back off (mask 0) on the RX queues of the NIC at ``pci_address`` that still carry ``previous`` (the
    CPU list a stored desired state set), for the removal of the persistence. The interface is found from the PCI
    address now. Returns ``changed``, ``interface``, ``rps``, ``warnings``, ``diff`` (None when nothing to show);
    a failed write puts back the masks written before it (AffinityError)."""
    check_roots(procfs, sysfs, write=True)
    interface = select_interface({"pci_address": pci_address}, procfs=procfs, sysfs=sysfs, run=run)[0]
    try:
        rps = plan_rps(sysfs, interface, read_topology(sysfs=sysfs, procfs=procfs), release=previous)
        if not check_mode:
            apply_rps(rps, sysfs, write or write_kernel_file)
    except RpsError as exc:
        raise _rps_error(exc)
    items = rps["queues"]
    return {"changed": any(i["status"] in ("changed", "would_change") for i in items), "interface": interface,
            "rps": items, "warnings": rps["warnings"], "diff": rps_diff(items, interface, pci_address) if items else None}


def restore_rps_masks(result, sysfs="/sys", write=None):
    """Put back every RX queue whose RPS mask a :func:`run_desired_state` (or :func:`release_rps`) result changed,
    newest first, as a failed RPS write does; for a run whose later steps failed. Returns ``restored``, ``failed``,
    ``summary``."""
    return restore_rps(result.get("rps"), sysfs, result["interface"], write or write_kernel_file)


def verify_pins(result, procfs="/proc", sysfs="/sys", run=None):
    """Read the NIC of ``result`` (from :func:`run_desired_state`) again and compare every
    queue IRQ's smp_affinity_list with its planned value.

    Returns ``mismatch`` (not where planned, or not planned at all; and every RX
    queue whose RPS mask is not the planned one), ``unchangeable``
    (kernel-managed: left out of the comparison, named) and ``lagging`` (effective
    affinity not followed yet: it moves with the next interrupt; never a failure).
    """
    planned = dict((i["irq"], i) for i in result["irqs"] if i["kind"] == "queue")
    nic = read_nic({"pci_address": result["pci_address"]}, procfs=procfs, sysfs=sysfs, run=run)
    out = {"mismatch": [], "unchangeable": [], "lagging": []}
    for entry in nic["irqs"]:
        if entry["kind"] != "queue":
            continue
        label = "%d %s" % (entry["irq"], entry["name"])
        item = planned.get(entry["irq"])
        now = format_cpulist(entry["affinity"]) if entry["affinity"] is not None else None
        if item is None:
            out["mismatch"].append("%s: not in the plan" % label)
        elif item["status"] == "unchangeable":
            out["unchangeable"].append("%s: kernel-managed, left at %s" % (label, now))
        elif now != item["after"]:
            out["mismatch"].append("%s: %s, planned %s" % (label, now, item["after"]))
        elif entry["effective_affinity"] is not None and set(entry["effective_affinity"]) - set(entry["affinity"] or []):
            out["lagging"].append("%s: effective %s, set %s" % (label, format_cpulist(entry["effective_affinity"]), now))
    out["mismatch"] += verify_rps(result.get("rps"), sysfs, nic["interface"])
    return out


__all__ = [
    "PIN_ARGUMENT_SPEC",
    "stored_desired_state",
    "verify_pins",
    "NicError",
    "apply_plan",
    "read_refusals",
    "record_refusals",
    "release_rps",
    "restore_rps_masks",
    "run_desired_state",
]
