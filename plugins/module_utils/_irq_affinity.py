# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plan and apply NIC queue IRQ affinity: read -> validate -> plan -> apply.

Private module_utils of gpunode.tuning, standard library only.

* :func:`plan_affinity` is pure: it takes ``read_nic`` and ``read_topology``
  output and returns a :class:`Plan` (or raises :class:`AffinityError`).
* :func:`apply_plan` is the only code that writes. It writes
  ``/proc/irq/N/smp_affinity_list`` only where the plan changes it, reports
  EIO/EPERM refusals (managed IRQs) as ``unchangeable`` and, on any other
  error, restores what it already changed before raising.
* :func:`run_desired_state` chains them for the ``nic_irq_affinity`` module
  and for the boot-time CLI in ``_irq_pin_cli``.

Assignment rule (deterministic): queue IRQs are grouped by queue index; every
IRQ of one queue (virtio ``input.K``/``output.K``, separate rx/tx vectors)
gets the same single CPU. Queues take CPUs in queue order from the target
list ordered core-first: the first thread of every core (cores in CPU order),
then the second threads, and so on, so queues spread over physical cores
before they share one. With more queues than CPUs the order wraps around.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._fileio import check_roots, join
from ansible_collections.gpunode.tuning.plugins.module_utils._irqbalance import read_irqbalance
from ansible_collections.gpunode.tuning.plugins.module_utils._nic import SELECTOR_KEYS, NicError, read_irq_state, read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._topology import read_topology, sibling_map

DESIRED_KEYS = SELECTOR_KEYS + ("cpus", "count", "exclude_cpus", "numa_local", "whole_cores", "allow_irqbalance", "strict")
MANAGED_ERRNOS = (errno.EIO, errno.EPERM)


class AffinityError(Exception):
    """Bad input or a failed write. ``details`` carries the value and what was expected."""

    def __init__(self, message, **details):
        super(AffinityError, self).__init__(message)
        self.details = details


class PlanItem(object):
    __slots__ = ("irq", "name", "kind", "queue", "direction", "before", "after", "effective", "status")

    def __init__(self, irq, name, kind, queue, direction, before, after, effective, status):
        self.irq, self.name, self.kind, self.queue, self.direction = irq, name, kind, queue, direction
        self.before, self.after, self.effective, self.status = before, after, effective, status

    def as_dict(self):
        return {
            "irq": self.irq,
            "name": self.name,
            "kind": self.kind,
            "queue": self.queue,
            "before": format_cpulist(self.before),
            "after": format_cpulist(self.after),
            "effective": None if self.effective is None else format_cpulist(self.effective),
            "status": self.status,
        }


class Plan(object):
    """The per-IRQ plan. ``items`` covers every IRQ of the NIC; ``changes`` the ones to write."""

    def __init__(self, nic, cpus, items, warnings):
        self.interface = nic.get("interface")
        self.pci_address = nic.get("pci_address")
        self.cpus = cpus
        self.items = items
        self.warnings = warnings

    @property
    def changes(self):
        return [i for i in self.items if i.status in ("would_change", "changed")]

    def as_list(self):
        return [i.as_dict() for i in self.items]

    def diff(self):
        """``{"before": text, "after": text}``: one aligned table line per IRQ."""
        width = max([len(i.name) for i in self.items] + [4])
        header = "%-6s %-*s %-6s %s\n" % ("IRQ", width, "NAME", "QUEUE", "smp_affinity_list")

        def table(attr):
            lines = [header]
            for item in self.items:
                queue = "-" if item.queue is None else str(item.queue)
                lines.append("%-6d %-*s %-6s %s\n" % (item.irq, width, item.name, queue, format_cpulist(getattr(item, attr))))
            return "".join(lines)

        return {
            "before": table("before"),
            "after": table("after"),
            "before_header": "%s (%s) IRQ affinity" % (self.interface, self.pci_address),
            "after_header": "%s (%s) IRQ affinity" % (self.interface, self.pci_address),
        }


def _cpus_arg(value, name):
    if value is None:
        return None
    try:
        return parse_cpulist(value)
    except CpuListError as exc:
        raise AffinityError("%s: %s" % (name, exc), option=name, value=exc.value, expected=exc.expected)


def _core_first(cpus, siblings_of, local=None):
    """Order CPUs: NUMA-local first, then first thread of each core, then second threads, ... (cores by lowest CPU)."""
    chosen = set(cpus)
    rank = {}
    for cpu in cpus:
        group = [c for c in siblings_of.get(cpu, [cpu]) if c in chosen]
        rank[cpu] = (0 if local is None or cpu in local else 1, group.index(cpu), min(group), cpu)
    return sorted(cpus, key=lambda c: rank[c])


def _local_cpus(nic, topology):
    """CPUs local to the NIC, or None when the firmware gives no NUMA hint (numa_node -1)."""
    node = nic.get("numa_node")
    if node is None:
        return None
    if nic.get("local_cpulist"):
        return set(nic["local_cpulist"])
    if node in topology["numa_nodes"]:
        return set(topology["numa_nodes"][node])
    return None


def _node_distance(topology, nic, cpu):
    """NUMA distance from the NIC's node to ``cpu``'s node (0 when unknown)."""
    node = nic.get("numa_node")
    row = topology.get("numa_distances", {}).get(node)
    other = topology.get("cpu_node", {}).get(cpu)
    if row is None or other is None:
        return 0
    order = sorted(topology["numa_nodes"])
    index = order.index(other) if other in order else -1
    return row[index] if 0 <= index < len(row) else 0


def _pick_cpus(nic, topology, count, exclude, numa_local, whole_cores, warnings):
    online = set(topology["online"])
    avoid = set(topology.get("isolated") or []) | set(topology.get("nohz_full") or [])
    local = _local_cpus(nic, topology) if numa_local else None
    if numa_local and local is None:
        warnings.append("the NIC gives no NUMA locality; CPUs were chosen without it")
    units = []
    if whole_cores:
        for group in topology["siblings"]:
            members = [c for c in group if c in online]
            if members and not (set(members) & (exclude | avoid)):
                units.append(members)
    else:
        units = [[c] for c in sorted(online - exclude - avoid)]
    # NUMA-local first; within that, highest-numbered cores first: CPU 0 and the
    # low CPUs carry housekeeping and are where launchers place work first.
    # Remote cores: nearest node first (node distance table).
    units.sort(key=lambda u: (0 if (local is None or set(u) <= local) else 1, _node_distance(topology, nic, u[0]), -min(u)))
    chosen = []
    for unit in units:
        if len(chosen) >= count:
            break
        chosen.extend(unit)
    if len(chosen) < count:
        raise AffinityError(
            "count %d: only %d CPUs are available for IRQs (online, not in exclude_cpus, not isolated/nohz_full%s)"
            % (count, len(chosen), ", whole cores" if whole_cores else ""),
            option="count", value=count, expected="at most %d" % len(chosen), available=format_cpulist(chosen),
        )
    if len(chosen) > count:
        warnings.append("count %d rounded up to %d CPUs (%s) to keep whole SMT cores" % (count, len(chosen), format_cpulist(chosen)))
    if local is not None and not set(chosen) <= local:
        warnings.append("CPUs %s are not NUMA-local to %s (local: %s)" % (
            format_cpulist(sorted(set(chosen) - local)), nic.get("interface"), format_cpulist(sorted(local))))
    return sorted(chosen)


def _validate_explicit(cpus, topology, exclude, nic, warnings):
    if not cpus:
        raise AffinityError("cpus is empty", option="cpus", value=cpus, expected="at least one online CPU")
    possible = set(topology["possible"]) | set(topology["online"])
    online = set(topology["online"])
    for cpu in cpus:
        if cpu not in possible:
            raise AffinityError(
                "CPU %d does not exist on this machine" % cpu, option="cpus", value=cpu,
                expected="a CPU in %s" % format_cpulist(sorted(possible)),
            )
        if cpu not in online:
            raise AffinityError(
                "CPU %d is offline" % cpu, option="cpus", value=cpu, expected="an online CPU in %s" % format_cpulist(topology["online"])
            )
        if cpu in exclude:
            raise AffinityError(
                "CPU %d is in exclude_cpus (%s)" % (cpu, format_cpulist(sorted(exclude))), option="cpus", value=cpu,
                expected="CPUs outside exclude_cpus",
            )
    local = _local_cpus(nic, topology)
    if local is not None and not set(cpus) <= local:
        warnings.append("CPUs %s are not NUMA-local to %s (local: %s)" % (
            format_cpulist(sorted(set(cpus) - local)), nic.get("interface"), format_cpulist(sorted(local))))
    chosen = set(cpus)
    split = []
    for group in topology["siblings"]:
        inside = chosen & set(group)
        if inside and inside != set(c for c in group if c in online):
            split.append(format_cpulist(group))
    if split:
        warnings.append("cpus split SMT sibling groups %s: their other threads can run workload next to the IRQs" % ", ".join(split))
    special = chosen & (set(topology.get("isolated") or []) | set(topology.get("nohz_full") or []))
    if special:
        warnings.append("CPUs %s are isolated or nohz_full: IRQs there disturb the isolated work" % format_cpulist(sorted(special)))


def plan_affinity(nic, topology, cpus=None, count=None, exclude_cpus=None, numa_local=True, whole_cores=True):
    """Return the :class:`Plan` that pins ``nic``'s queue IRQs; raise AffinityError on bad input."""
    warnings = []
    exclude = set(_cpus_arg(exclude_cpus, "exclude_cpus") or [])
    explicit = _cpus_arg(cpus, "cpus")
    queue_irqs = [e for e in nic["irqs"] if e["kind"] == "queue"]
    if not queue_irqs:
        raise AffinityError(
            "%s (%s, driver %s) has no queue IRQs to pin" % (nic.get("interface"), nic.get("pci_address"), nic.get("driver")),
            value=[e["name"] for e in nic["irqs"]], expected="queue IRQs of a multi-queue NIC",
        )
    queues = sorted(set(e["queue"] for e in queue_irqs))
    if explicit is not None:
        if count is not None:
            raise AffinityError("give cpus or count, not both", option="count", value=count, expected="count only without cpus")
        _validate_explicit(explicit, topology, exclude, nic, warnings)
        target = explicit
    else:
        if count is None:
            count = len(queues)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise AffinityError("count %r is not a positive integer" % (count,), option="count", value=count, expected="an integer >= 1")
        target = _pick_cpus(nic, topology, count, exclude, numa_local, whole_cores, warnings)
    order = _core_first(target, sibling_map(topology), _local_cpus(nic, topology) if numa_local else None)
    if len(queues) > len(order):
        warnings.append(
            "%d queues but %d CPUs: queues share CPUs round-robin (%s)" % (len(queues), len(order), format_cpulist(order))
        )
    queue_cpu = dict((queue, order[index % len(order)]) for index, queue in enumerate(queues))
    items = []
    control = []
    for entry in nic["irqs"]:
        before = entry["affinity"]
        effective = entry.get("effective_affinity")
        if entry["kind"] == "queue":
            after = [queue_cpu[entry["queue"]]]
        else:
            after = before
            control.append("%d %s (%s)" % (entry["irq"], entry["name"] or "?", format_cpulist(before)))
        if after != before:
            status = "would_change"
        elif effective is not None and not set(effective) <= set(after):
            status = "pending"
        else:
            status = "unchanged"
        items.append(PlanItem(entry["irq"], entry["name"], entry["kind"], entry["queue"], entry.get("direction"),
                              before, after, effective, status))
    if control:
        warnings.append("control IRQs left where they are: %s" % "; ".join(control))
    return Plan(nic, target, items, warnings)


def _write_file(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def apply_plan(plan, procfs="/proc", strict=False, write=None):
    """Write the plan's changes; return the plan with statuses updated.

    ``write(path, text)`` defaults to a single ``write(2)`` without O_CREAT.
    EIO/EPERM (the kernel refusing a managed IRQ) gives ``unchangeable``, or,
    with ``strict``, a rollback and an error. Any other error restores the IRQs
    changed so far (newest first) and raises AffinityError naming IRQ, value
    and error.
    """
    write = write or _write_file
    done = []
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
                plan.warnings.append(
                    "IRQ %d (%s) is kernel-managed: writing %s failed with %s; left at %s"
                    % (item.irq, item.name, value, errno.errorcode.get(exc.errno, exc.errno), format_cpulist(item.before))
                )
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
    for item in done:
        item.after, item.effective = read_irq_state(procfs, item.irq)
    return plan


def _rollback(done, procfs, write):
    restored, failed = [], []
    for item in reversed(done):
        path = join(procfs, "irq", str(item.irq), "smp_affinity_list")
        try:
            write(path, format_cpulist(item.before) + "\n")
            restored.append(item.irq)
            item.status = "unchanged"
            item.after = item.before
        except OSError as exc:
            failed.append({"irq": item.irq, "value": format_cpulist(item.before), "error": str(exc)})
    if failed:
        summary = "rollback FAILED for IRQs %s" % ", ".join(str(f["irq"]) for f in failed)
    elif restored:
        summary = "restored IRQs %s to their previous affinity" % ", ".join(str(i) for i in restored)
    else:
        summary = "nothing had been changed"
    return {"restored": restored, "failed": failed, "summary": summary}


def root_of(procfs):
    """The system root that holds ``procfs``: "/" for /proc, else the tree's root."""
    path = os.path.normpath(procfs)
    return "/" if path == "/proc" else os.path.dirname(path)


def run_desired_state(desired, check_mode=False, procfs="/proc", sysfs="/sys", run=None, write=None):
    """Read, validate, plan and (unless ``check_mode``) apply one desired state.

    ``desired`` keys are the ``nic_irq_affinity`` options (see DESIRED_KEYS).
    Returns ``changed``, ``interface``, ``pci_address``, ``driver``, ``cpus``,
    ``cpulist``, ``irqs``, ``warnings``, ``diff``, ``irqbalance``.
    """
    unknown = sorted(set(desired) - set(DESIRED_KEYS))
    if unknown:
        raise AffinityError("unknown keys %s in desired state" % ", ".join(unknown), value=unknown, expected="keys from %s" % ", ".join(DESIRED_KEYS))
    # a write never mixes a captured root with the live one (TreeError names the paths)
    check_roots(procfs, sysfs, write=True)
    selector = dict((k, desired.get(k)) for k in SELECTOR_KEYS)
    nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    topology = read_topology(sysfs=sysfs, procfs=procfs)
    plan = plan_affinity(
        nic, topology, cpus=desired.get("cpus"), count=desired.get("count"), exclude_cpus=desired.get("exclude_cpus"),
        numa_local=desired.get("numa_local", True) is not False, whole_cores=desired.get("whole_cores", True) is not False,
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
    if plan.changes and not check_mode:
        apply_plan(plan, procfs=procfs, strict=bool(desired.get("strict")), write=write)
    return {
        "changed": bool(plan.changes),
        "interface": nic["interface"],
        "pci_address": nic["pci_address"],
        "driver": nic["driver"],
        "cpus": plan.cpus,
        "cpulist": format_cpulist(plan.cpus),
        "irqs": plan.as_list(),
        "warnings": list(plan.warnings) + list(nic["notes"]),
        "diff": plan.diff(),
        "irqbalance": {k: irqbalance[k] for k in ("installed", "active", "enabled", "masked", "banned_cpus", "source")},
    }


__all__ = ["AffinityError", "NicError", "Plan", "PlanItem", "apply_plan", "plan_affinity", "run_desired_state"]
