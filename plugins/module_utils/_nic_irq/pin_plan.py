# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The plan of a NIC's queue IRQ pins: which CPUs, and which IRQ goes where. Pure: nothing here reads or writes.

Private module_utils of gpunode.tuning, standard library only.

* :func:`plan_affinity` takes ``_nic_irq.nic_irqs.read_nic`` and ``_host.topology.read_topology``
  output and returns a :class:`Plan` of :class:`PlanItem` (or raises :class:`AffinityError`, the
  error of the pins, their writes included);
* the CPUs: an explicit ``cpus`` list checked against the topology, or the policy (``count``,
  ``exclude_cpus``, ``numa_local``, ``whole_cores``): NUMA-local cores first, then the nearest
  node's, highest-numbered first, never a nohz_full CPU or one isolated with managed_irq;
* IRQs the kernel manages or refused in this boot are planned ``unchangeable`` (or refused with
  ``strict``).

Assignment rule (deterministic): queue IRQs are grouped by queue index; every
IRQ of one queue (virtio ``input.K``/``output.K``, separate rx/tx vectors)
gets the same single CPU. Queues take CPUs in queue order from the target
list ordered core-first: the first thread of every core (cores in CPU order),
then the second threads, and so on, so queues spread over physical cores
before they share one. With more queues than CPUs the order wraps around.

Applying the plan is ``_nic_irq.affinity``.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import sibling_map


class AffinityError(DetailedError):
    """Bad input or a failed write. ``details`` carries the value and what was expected."""


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
            "before": None if self.before is None else format_cpulist(self.before),
            "after": None if self.after is None else format_cpulist(self.after),
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
                value = getattr(item, attr)
                lines.append("%-6d %-*s %-6s %s\n" % (item.irq, width, item.name, queue, "?" if value is None else format_cpulist(value)))
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


def _irq_free(topology):
    """CPUs no IRQ is planned on: nohz_full, and the isolated CPUs where isolcpus= has managed_irq
    (``irq_isolated`` from _topology). Scheduler-only isolation (isolcpus=domain) keeps a CPU an IRQ candidate."""
    return set(topology.get("irq_isolated") or []) | set(topology.get("nohz_full") or [])


def _pick_cpus(nic, topology, count, exclude, numa_local, whole_cores, warnings):
    online = set(topology["online"])
    avoid = _irq_free(topology)
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
            "count %d: only %d CPUs are available for IRQs (online, not in exclude_cpus, not nohz_full or isolated "
            "with managed_irq%s)"
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
    special = chosen & _irq_free(topology)
    if special:
        warnings.append("CPUs %s are nohz_full or isolated with managed_irq: IRQs there disturb the isolated work"
                        % format_cpulist(sorted(special)))


def cpus_text(cpus):
    """A CPU set as a CPU list, or "unknown" when it could not be read (None)."""
    return "unknown" if cpus is None else format_cpulist(cpus)


def _kept_reason(entry, refused):
    """Why the kernel will not take a new affinity for ``entry``, or None when it may."""
    if entry.get("managed"):
        return "kernel-managed (IRQD_AFFINITY_MANAGED in debugfs)"
    record = refused.get(entry["irq"])
    if record and record.get("name") == entry["name"]:
        return "the kernel refused writing %s to it earlier in this boot (%s)" % (record.get("value"), record.get("errno"))
    return None


def plan_affinity(nic, topology, cpus=None, count=None, exclude_cpus=None, numa_local=True, whole_cores=True,
                  refused=None, strict=False):
    """Return the :class:`Plan` that pins ``nic``'s queue IRQs; raise AffinityError on bad input.

    ``refused`` is :func:`read_refusals` output: IRQs the kernel refused in
    this boot. They, and IRQs that debugfs shows as kernel-managed, are
    planned as ``unchangeable`` (left as they are), or refused with ``strict``.
    An IRQ whose current affinity cannot be read has ``before`` None.
    """
    refused = refused or {}
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
    kept = []
    for entry in nic["irqs"]:
        before = entry["affinity"]
        effective = entry.get("effective_affinity")
        if entry["kind"] == "queue":
            after = [queue_cpu[entry["queue"]]]
        else:
            after = before
            control.append("%d %s (%s)" % (entry["irq"], entry["name"] or "?", cpus_text(before)))
        reason = _kept_reason(entry, refused) if after != before else None
        if reason:
            kept.append((entry, after, reason))
            status, after = "unchangeable", before
        elif after != before:
            status = "would_change"
        elif effective is not None and after is not None and not set(effective) <= set(after):
            status = "pending"
        else:
            status = "unchanged"
        items.append(PlanItem(entry["irq"], entry["name"], entry["kind"], entry["queue"], entry.get("direction"),
                              before, after, effective, status))
    if kept and strict:
        entry, wanted, reason = kept[0]
        raise AffinityError(
            "IRQ %d (%s) cannot be moved to %s: %s; strict is set, so nothing was written"
            % (entry["irq"], entry["name"], format_cpulist(wanted), reason),
            irq=entry["irq"], value=format_cpulist(wanted), expected="an IRQ the kernel lets user space move, or strict=false",
            unchangeable=[k[0]["irq"] for k in kept],
        )
    for entry, wanted, reason in kept:
        warnings.append("IRQ %d (%s) is left at %s, not moved to %s: %s"
                        % (entry["irq"], entry["name"], cpus_text(entry["affinity"]), format_cpulist(wanted), reason))
    if control:
        warnings.append("control IRQs left where they are: %s" % "; ".join(control))
    return Plan(nic, target, items, warnings)
