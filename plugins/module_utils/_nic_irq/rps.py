# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Receive Packet Steering (RPS) of a NIC's RX queues: read, plan, apply, roll back.

Private module_utils of gpunode.tuning, standard library only (the boot-time
entry point imports it through ``_nic_irq.affinity``).

Each RX queue has ``/sys/class/net/<iface>/queues/rx-<n>/rps_cpus``: a hex
CPU mask in comma separated 32-bit words, most significant first, as wide as
the machine's CPU ids (``nr_cpu_ids``): ``00`` on 8 CPUs, 36 words of 8 digits
on 1,152. ``0`` (the kernel's default) is RPS off. With a mask, the receive
softirq work of packets taken by that queue's IRQ is steered (by flow hash) to
the CPUs of the mask through an IPI: the IRQ CPU does the hard IRQ and the
hand-off, the listed CPUs do the protocol processing. That is one inter-CPU hop
per packet (a cache-line transfer and an IPI, added latency): worth it only
when the IRQ CPUs are saturated by packet rate.

The interface is never stored: the callers find it from the PCI address on
every run (``_nic_irq.nic.select_interface``). Nothing here knows about IRQs.

* :func:`read_rps` reads every RX queue's mask;
* :func:`plan_rps` plans every RX queue to one mask, or (``release``) the
  queues that still carry the mask this collection set back to 0;
* :func:`apply_rps` writes the plan (through the caller's ``write``), reads
  every written file back and, on a failed write, puts back the queues it
  already wrote (newest first) before raising;
* :func:`restore_rps` puts back the queues a finished :func:`apply_rps`
  changed, for a caller whose later step failed; :func:`verify_rps` reads
  them back.

The masks are parsed and formatted by ``_parse.cpulist`` (``parse_cpumask``,
``format_cpumask``): the same code as every other CPU mask of the collection.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import (
    CpuListError, format_cpulist, format_cpumask, parse_cpulist, parse_cpumask)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_raw

RPS_FILE = "rps_cpus"


class RpsError(DetailedError):
    """Bad rps_cpus input, a NIC without RPS, or a failed write; ``details`` name the value, path and outcome."""


def nr_cpu_ids(topology):
    """The number of CPU ids (highest possible CPU + 1): the width of every CPU mask the kernel prints."""
    cpus = list(topology.get("possible") or []) + list(topology.get("online") or [])
    if not cpus:
        raise RpsError("the CPU topology lists no CPU", value=None, expected="devices/system/cpu/possible or online")
    return max(cpus) + 1


def parse_rps_mask(text, ncpus=None):
    """The CPUs of an ``rps_cpus`` mask (``"f0"``, ``"00000000,00000030"``); RpsError naming the text."""
    try:
        return parse_cpumask(text, ncpus)
    except CpuListError as exc:
        raise RpsError("rps_cpus %r: %s" % (text, exc), value=text, expected=exc.expected)


def format_rps_mask(cpus, ncpus):
    """``cpus`` as the kernel prints ``rps_cpus`` on a machine of ``ncpus`` CPU ids (``format_cpumask``)."""
    try:
        return format_cpumask(cpus, ncpus)
    except CpuListError as exc:
        raise RpsError("rps_cpus %s: %s" % (format_cpulist(cpus), exc), value=exc.value, expected=exc.expected)


def rps_path(sysfs, iface, queue):
    return join(sysfs, "class/net", iface, "queues", "rx-%d" % queue, RPS_FILE)


def rx_queues(sysfs, iface):
    """The RX queue numbers of ``iface`` (``queues/rx-N``), ascending."""
    names = list_dir(join(sysfs, "class/net", iface, "queues"))
    return sorted(int(n[3:]) for n in names if n.startswith("rx-") and n[3:].isdigit())


def read_rps(sysfs, iface, ncpus=None):
    """Every RX queue of ``iface``: ``[{"queue", "path", "mask" (the text, stripped), "cpus"}]``.

    RpsError when the interface has no RX queue in sysfs, a queue has no ``rps_cpus`` (a kernel without
    CONFIG_RPS), or a mask cannot be read or parsed."""
    queues = rx_queues(sysfs, iface)
    if not queues:
        raise RpsError("%s has no RX queues in sysfs (queues/rx-N)" % iface, value=iface,
                       expected="a network interface with RX queues", path=join(sysfs, "class/net", iface, "queues"))
    out = []
    for queue in queues:
        path = rps_path(sysfs, iface, queue)
        text = read_raw(path)
        if text is None:
            why = "missing (a kernel without CONFIG_RPS?)" if not os.path.exists(path) else "not readable"
            raise RpsError("%s rx-%d: %s is %s" % (iface, queue, path, why), value=path, path=path,
                           expected="a readable rps_cpus file (CONFIG_RPS)")
        mask = text.strip()
        out.append({"queue": queue, "path": path, "mask": mask, "cpus": parse_rps_mask(mask, ncpus)})
    return out


def check_rps_cpus(value, topology, option="rps_cpus"):
    """The CPUs of the ``rps_cpus`` option (a CPU list string or a list of integers), sorted; RpsError naming the
    value. Every CPU must exist and be online, and be a housekeeping CPU: the kernel drops isolcpus (domain) and
    nohz_full CPUs from an RPS mask without an error (net-sysfs.c ``rps_cpumask_housekeeping``), so a read-back
    would never match."""
    try:
        cpus = parse_cpulist(value)
    except CpuListError as exc:
        raise RpsError("%s %r: %s" % (option, value, exc), option=option, value=value,
                       expected=exc.expected or "a CPU list such as 0-3,8")
    if not cpus:
        raise RpsError("%s %r selects no CPU" % (option, value), option=option, value=value,
                       expected="at least one online CPU (leave %s empty to not manage RPS)" % option)
    online = set(topology.get("online") or [])
    possible = set(topology.get("possible") or []) | online
    for cpu in cpus:
        if cpu not in possible:
            raise RpsError("%s %r: CPU %d does not exist on this machine" % (option, value, cpu), option=option,
                           value=value, expected="CPUs in %s" % format_cpulist(sorted(possible)))
        if cpu not in online:
            raise RpsError("%s %r: CPU %d is offline" % (option, value, cpu), option=option, value=value,
                           expected="online CPUs in %s" % format_cpulist(sorted(online)))
    isolated = set(cpus) & (set(topology.get("isolated") or []) | set(topology.get("nohz_full") or []))
    if isolated:
        raise RpsError("%s %r: CPUs %s are isolcpus or nohz_full; the kernel drops them from an RPS mask"
                       % (option, value, format_cpulist(sorted(isolated))), option=option, value=value,
                       expected="housekeeping CPUs (not isolcpus, not nohz_full)")
    return cpus


def _item(entry, after, status, ncpus):
    return {"queue": entry["queue"], "before": entry["mask"], "after": format_rps_mask(after, ncpus),
            "before_cpus": format_cpulist(entry["cpus"]), "after_cpus": format_cpulist(after), "status": status}


def plan_rps(sysfs, iface, topology, cpus=None, release=None):
    """The per-queue plan for ``iface``: ``{"interface", "ncpus", "queues", "warnings"}``.

    ``cpus`` (from :func:`check_rps_cpus`): every RX queue gets that mask. ``release`` (a CPU list: the mask this
    collection set before): the queues that still carry exactly it go back to 0 (RPS off); a queue with another mask
    is left as it is and named in a warning. Each queue item: ``queue``, ``before`` and ``after`` (the mask text
    as the kernel prints it), ``before_cpus`` and ``after_cpus`` (CPU lists, "" for none) and ``status``
    (``would_change``, ``unchanged``, ``kept`` (release: not the collection's mask)).
    """
    ncpus = nr_cpu_ids(topology)
    state = read_rps(sysfs, iface, ncpus)
    items, warnings = [], []
    if cpus is not None:
        for entry in state:
            items.append(_item(entry, cpus, "unchanged" if entry["cpus"] == cpus else "would_change", ncpus))
    elif release is not None:
        try:
            ours = parse_cpulist(release)
        except CpuListError as exc:
            raise RpsError("the stored rps_cpus %r: %s" % (release, exc), option="rps_cpus", value=release,
                           expected=exc.expected or "a CPU list such as 0-3,8")
        kept = []
        for entry in state:
            if not entry["cpus"]:
                items.append(_item(entry, [], "unchanged", ncpus))
            elif entry["cpus"] == ours:
                items.append(_item(entry, [], "would_change", ncpus))
            else:
                items.append(_item(entry, entry["cpus"], "kept", ncpus))
                kept.append("rx-%d (%s)" % (entry["queue"], format_cpulist(entry["cpus"])))
        if kept:
            warnings.append("RPS of %s left as it is on %s: not the mask this collection set (%s)"
                            % (iface, ", ".join(kept), format_cpulist(ours)))
    return {"interface": iface, "ncpus": ncpus, "queues": items, "warnings": warnings}


def _write_all(sysfs, iface, items, write):
    """Write the ``after`` mask of each item; stop at the first failure. Returns (done, failure)."""
    done = []
    for item in items:
        path = rps_path(sysfs, iface, item["queue"])
        try:
            write(path, item["after"] + "\n")
        except OSError as exc:
            return done, (item, path, exc)
        done.append(item)
    return done, None


def _summary(restored, failed):
    if failed:
        return "RPS rollback FAILED for %s" % "; ".join("rx-%d (%s)" % (f["queue"], f["error"]) for f in failed)
    if restored:
        return "RPS of %s put back" % ", ".join("rx-%d" % q for q in restored)
    return "no RPS mask had been changed"


def _put_back(sysfs, iface, items, write):
    """Write every item's ``before`` mask back, newest first; each restored item is ``unchanged`` again."""
    restored, failed = [], []
    for item in reversed(items):
        path = rps_path(sysfs, iface, item["queue"])
        try:
            write(path, item["before"] + "\n")
        except OSError as exc:
            failed.append({"queue": item["queue"], "value": item["before"], "error": str(exc)})
            continue
        restored.append(item["queue"])
        item.update(status="unchanged", after=item["before"], after_cpus=item["before_cpus"])
    return {"restored": restored, "failed": failed, "summary": _summary(restored, failed)}


def apply_rps(plan, sysfs, write):
    """Write the ``would_change`` queues of ``plan`` (from :func:`plan_rps`) with ``write(path, text)``; each written
    queue is read back (``after``) and marked ``changed``. A failed write puts back the queues written before it
    (newest first) and raises RpsError naming the queue, the value, the error and what was put back."""
    todo = [item for item in plan["queues"] if item["status"] == "would_change"]
    done, failure = _write_all(sysfs, plan["interface"], todo, write)
    if failure is not None:
        item, path, exc = failure
        back = _put_back(sysfs, plan["interface"], done, write)
        raise RpsError("writing rps_cpus %s to %s rx-%d failed: [%s] %s; %s"
                       % (item["after"], plan["interface"], item["queue"], errno.errorcode.get(exc.errno, exc.errno),
                          exc.strerror or exc, back["summary"]),
                       value=item["after"], path=path, error=str(exc), errno=exc.errno,
                       rps_rolled_back=back["restored"], rps_rollback_failed=back["failed"])
    ncpus = plan["ncpus"]
    for item in done:
        item["status"] = "changed"
        text = read_raw(rps_path(sysfs, plan["interface"], item["queue"]))
        if text is not None:
            try:
                cpus = parse_rps_mask(text.strip(), ncpus)
            except RpsError:
                continue
            item.update(after=text.strip(), after_cpus=format_cpulist(cpus))
    return plan


def restore_rps(items, sysfs, iface, write):
    """Put back every queue of ``items`` (the ``queues`` of a finished :func:`apply_rps`, or a result's ``rps``) that
    it changed (status ``changed``), newest first, for a run whose later step failed. Updates the items; returns
    ``restored``, ``failed`` (queues) and ``summary``."""
    moved = [item for item in items or [] if item["status"] == "changed"]
    return _put_back(sysfs, iface, moved, write)


def verify_rps(items, sysfs, iface):
    """Read every planned queue of ``iface`` again: ``["IFACE rx-N rps_cpus: NOW, planned AFTER"]`` for each that
    differs (compared as CPU sets)."""
    out = []
    for item in items or []:
        text = read_raw(rps_path(sysfs, iface, item["queue"]))
        try:
            now = None if text is None else format_cpulist(parse_rps_mask(text.strip()))
        except RpsError:
            now = None
        if now != item["after_cpus"]:
            shown = "unreadable" if now is None else now or "none"
            out.append("%s rx-%d rps_cpus: %s, planned %s" % (iface, item["queue"], shown, item["after_cpus"] or "none"))
    return out


def rps_drift(items):
    """``rx-N rps_cpus: BEFORE -> AFTER`` (CPU lists, ``none`` for RPS off) of each queue that changes."""
    return ["rx-%d rps_cpus: %s -> %s" % (i["queue"], i["before_cpus"] or "none", i["after_cpus"] or "none")
            for i in items or [] if i["status"] in ("changed", "would_change")]


def rps_diff(items, iface, pci_address=None):
    """``--diff`` of the per-queue plan: one line per RX queue with its mask (and CPU list) before and after."""
    def table(attr):
        lines = ["%-6s %s\n" % ("QUEUE", "rps_cpus")]
        for item in items:
            lines.append("%-6s %s (%s)\n" % ("rx-%d" % item["queue"], item[attr], item[attr + "_cpus"] or "none"))
        return "".join(lines)

    header = "%s (%s) RPS" % (iface, pci_address)
    return {"before": table("before"), "after": table("after"), "before_header": header, "after_header": header}
