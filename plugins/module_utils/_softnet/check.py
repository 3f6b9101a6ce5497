# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prove or rule out NIC IRQ / compute contention on one host (seed 000, step 2).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. softnet_check in four parts, one concern each:

* ``_softnet.sample`` and ``_parse.procfs``: read and parse ``/proc/net/softnet_stat``,
  ``/proc/stat``, ``/proc/softirqs`` and ``/proc/net/dev`` (``read_sample``
  takes one snapshot, all files and ``/proc/interrupts`` read back to back);
  ``SoftnetError``.
* ``_softnet.signals`` (pure): counter deltas, mpstat's arithmetic,
  ``compute_signals`` (two snapshots -> per-CPU and link numbers).
* ``_softnet.verdict`` (pure): the thresholds and the verdict as a table of
  rules (``RULES``, ``judge``, ``describe_rules``).
* this module, the orchestration: the module's options, the IRQ CPUs of the
  NIC and ``run_check``, which ties them together for the ``softnet_check``
  module. It never writes anything.

The IRQ CPUs are where the NIC's queue IRQs really fired during the sampling
window: the CPUs whose ``/proc/interrupts`` counts of those IRQs grew between
the two samples (``irq_cpus_fired``). ``effective_affinity_list`` lags behind
a new pin until each IRQ fires again (seed 000, step 3 note), so a pin made a
second before the window is seen at once only this way. When no queue IRQ
fired, the affinity files (``_nic_irq.nic_irqs.read_nic``, the same code ``nic_irq_facts``
uses: effective affinity, else ``smp_affinity_list``) are the fallback. Both
are reported, with the source used.
"""

from __future__ import annotations

import time

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import (
    CpuListError,
    format_cpulist,
    parse_cpulist,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import InterruptsError, parse_interrupts
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_KEYS, NicError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._host.proc_tasks import attribute, describe, on_cpus, read_tasks
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import SoftnetError
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.sample import read_sample
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.signals import compute_signals, delta_u32
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    judge,
    validate_thresholds,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

DEFAULT_INTERVAL = 10.0
MAX_INTERVAL = 3600.0


def irq_cpus_from_nic(nic):
    """CPUs where the NIC's queue IRQs currently land.

    Effective affinity per IRQ, falling back to the affinity list where the
    kernel has no ``effective_affinity_list``. Returns ``(cpus, source,
    notes)``; source is "effective_affinity", "affinity", "mixed" or "none".
    """
    cpus = set()
    sources = set()
    notes = []
    queue_irqs = [irq for irq in (nic or {}).get("irqs") or [] if irq.get("kind") == "queue"]
    for irq in queue_irqs:
        effective = irq.get("effective_affinity")
        if effective:
            cpus.update(effective)
            sources.add("effective_affinity")
        else:
            cpus.update(irq.get("affinity") or [])
            sources.add("affinity")
    if not queue_irqs:
        return [], "none", notes
    if "affinity" in sources:
        notes.append(
            "effective_affinity_list is missing for some queue IRQs of %s: their smp_affinity_list was used, "
            "which can be wider than where they land" % nic.get("interface")
        )
    source = sources.pop() if len(sources) == 1 else "mixed"
    return sorted(cpus), source, notes


def irq_cpus_fired(nic, first_text, second_text):
    """CPUs on which the NIC's queue IRQs fired between two ``/proc/interrupts`` texts.

    Returns ``(cpus, notes)``; ``cpus`` is None when it cannot be told (no
    queue IRQs, a file missing or unparsable), else the sorted CPUs whose count
    of at least one queue IRQ grew (u32 counters, a wrap is handled). A CPU
    column present in only one of the texts (hotplug) is skipped.
    """
    keys = [str(irq["irq"]) for irq in (nic or {}).get("irqs") or [] if irq.get("kind") == "queue"]
    if not keys:
        return None, []
    if first_text is None or second_text is None:
        return None, ["/proc/interrupts could not be read: the IRQ CPUs come from the affinity files"]
    try:
        first = parse_interrupts(first_text, keys=keys)
        second = parse_interrupts(second_text, keys=keys)
    except InterruptsError as exc:
        return None, ["/proc/interrupts is not parsable (%s): the IRQ CPUs come from the affinity files" % exc]
    fired = set()
    for key in keys:
        if key not in first["irqs"] or key not in second["irqs"]:
            continue
        before = dict(zip(first["cpus"], first["irqs"][key]["counts"]))
        after = dict(zip(second["cpus"], second["irqs"][key]["counts"]))
        fired.update(cpu for cpu in after if cpu in before and delta_u32(before[cpu], after[cpu]) > 0)
    return sorted(fired), []


def parse_irq_cpus_option(value):
    """``irq_cpus`` option: a CPU list string, an int or a list of ints."""
    try:
        cpus = parse_cpulist(value)
    except CpuListError as exc:
        raise SoftnetError("irq_cpus: %s" % exc, value=value, expected=exc.expected)
    if not cpus:
        raise SoftnetError("irq_cpus is empty", value=value, expected="at least one CPU, such as '0-10'")
    return cpus


def validate_options(options):
    """Check every option before anything is read; raise SoftnetError.

    Returns ``(interval, irq_cpus or None, thresholds, link_speed_mbps)``.
    """
    interval = options.get("interval", DEFAULT_INTERVAL)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= MAX_INTERVAL:
        raise SoftnetError(
            "interval %r is not a number of seconds in (0, %d]" % (interval, MAX_INTERVAL),
            value=interval,
            expected="seconds between the two samples, such as 10 or 0.5",
        )
    irq_cpus = options.get("irq_cpus")
    irq_cpus = parse_irq_cpus_option(irq_cpus) if irq_cpus not in (None, "", []) else None
    thresholds = validate_thresholds(dict((key, options.get(key)) for key in DEFAULT_THRESHOLDS))
    speed = options.get("link_speed_mbps")
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, int) or speed <= 0):
        raise SoftnetError(
            "link_speed_mbps %r is not a positive number of Mbit/s" % (speed,), value=speed, expected="such as 25000"
        )
    return float(interval), irq_cpus, thresholds, speed


def usr_of(signals, cpu):
    """The CPU's usr + nice percentage in the window (0 when unknown)."""
    for row in signals["cpus"]:
        if row["cpu"] == cpu and row["usr"] is not None:
            return round(row["usr"] + (row["nice"] or 0.0), 2)
    return 0.0


def processes_on(signals, irq_cpus, tasks_first, tasks_second, procfs, min_user_pct=1.0):
    """Whose user work ran on the IRQ CPUs (``_host.proc_tasks``): those whose usr + nice is ``min_user_pct`` or more.

    Returns ``{irq_cpus: [...], notes: [...]}``; ``irq_cpus`` as ``_host.proc_tasks.on_cpus``.
    """
    rows, unreadable = attribute(tasks_first, tasks_second)
    busy = dict((cpu, usr_of(signals, cpu)) for cpu in sorted(irq_cpus) if usr_of(signals, cpu) >= min_user_pct)
    notes = []
    if not tasks_second:
        notes.append("no thread readable under %s/*/task: the processes on the IRQ CPUs are unknown" % procfs)
    if unreadable:
        notes.append("%d thread stat lines under %s are not stat lines" % (unreadable, procfs))
    return {"irq_cpus": on_cpus(rows, busy, signals["elapsed"], procfs=procfs) if tasks_second else [], "notes": notes}


def _choose_irq_cpus(irq_option, fired, affinity, nic, online, notes):
    """The IRQ CPUs of the verdict and where they come from: the ``irq_cpus`` option, else the CPUs on which the
    NIC's queue IRQs fired during the sample (``interrupts``), else the affinity files. Appends what the reader should
    know to ``notes``. ``affinity`` is irq_cpus_from_nic's answer. Returns ``(irq_cpus, source, why)``; ``why``
    says why there are none (else None)."""
    affinity_cpus, affinity_source, affinity_notes = affinity
    interface = nic["interface"] if nic else None
    why = None
    if irq_option is not None:
        irq_cpus, source = irq_option, "option"
        offline = sorted(set(irq_cpus) - set(online))
        if offline:
            notes.append("irq_cpus %s are not online" % format_cpulist(offline))
    elif fired:
        irq_cpus, source = fired, "interrupts"
        if set(fired) != set(affinity_cpus):
            notes.append(
                "the queue IRQs of %s fired on CPUs %s during the sample; their affinity files say %s "
                "(effective_affinity_list follows a new pin only when each IRQ fires again)"
                % (interface, format_cpulist(fired), format_cpulist(affinity_cpus) or "nothing")
            )
    else:
        irq_cpus, source = affinity_cpus, affinity_source
        notes.extend(affinity_notes)
        if fired is not None and affinity_cpus:
            notes.append(
                "no queue IRQ of %s fired during the sample: the IRQ CPUs %s come from the affinity files"
                % (interface, format_cpulist(affinity_cpus))
            )
        if not irq_cpus and nic is not None:
            queue_count = len([irq for irq in nic.get("irqs") or [] if irq.get("kind") == "queue"])
            why = "%s (%s) shows %d queue IRQs%s" % (
                nic["interface"],
                nic.get("driver") or "no driver",
                queue_count,
                "" if nic.get("pci_address") else ", it has no PCI function",
            )
    return irq_cpus, source, why


def _read_nic_softly(selector, procfs, sysfs, run, notes):
    """The NIC, or (None, why) when the default-route NIC cannot be found; an explicit selector that matches no usable
    NIC raises. The NIC's notes and the failure go to ``notes``."""
    try:
        nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    except NicError as exc:
        if selector:
            raise
        why = "NIC discovery failed: %s" % exc
        notes.append(why)
        return None, why
    notes.extend(nic.get("notes") or [])
    return nic, None


def _annotate(signals, verdict, user_work, irq_set, speed_source):
    """Marks each CPU row (IRQ CPU, hot) and the link's speed source; returns the verdict's reasons with the processes
    whose user work on an IRQ CPU reaches the user threshold."""
    reasons = list(verdict["reasons"])
    busy = [item for item in user_work["irq_cpus"] if usr_of(signals, item["cpu"]) >= verdict["thresholds"]["user_pct"]]
    if busy:
        reasons.append("user work on the IRQ CPUs, by process: %s" % "; ".join(describe(item) for item in busy))
    hot = set(verdict["hot_cpus"])
    for row in signals["cpus"]:
        row["irq_cpu"] = row["cpu"] in irq_set
        row["hot"] = row["cpu"] in hot
    if signals["link"] is not None:
        signals["link"]["speed_source"] = speed_source
    return reasons


def run_check(options, procfs="/proc", sysfs="/sys", run=None, sleep=time.sleep, clock=time.monotonic):
    """Read the NIC, sample every signal twice ``interval`` seconds apart, judge.

    ``options`` holds the module options (selector keys, ``irq_cpus``,
    ``interval``, the thresholds, ``link_speed_mbps``). Reads only. Raises
    SoftnetError for bad options or unreadable proc files, and NicError when
    an explicit selector matches no usable NIC. Without a selector, a missing
    default-route NIC degrades to an ``inconclusive`` verdict instead (or
    ``idle`` on a host without load or traffic).
    """
    interval, irq_option, thresholds, speed_option = validate_options(options)
    selector = dict((key, options.get(key)) for key in SELECTOR_KEYS if options.get(key) not in (None, ""))
    notes = []
    nic, why = _read_nic_softly(selector, procfs, sysfs, run, notes)

    topology = read_topology(sysfs=sysfs, procfs=procfs)
    online = topology["online"]
    affinity = irq_cpus_from_nic(nic)
    affinity_cpus, affinity_source = affinity[:2]
    interface = nic["interface"] if nic else None
    speed = speed_option if speed_option is not None else (nic or {}).get("speed_mbps")

    # The threads are read just outside the window, so that reading them is not user work inside it.
    tasks_first = read_tasks(procfs)
    first = read_sample(procfs, clock=clock)
    sleep(interval)
    second = read_sample(procfs, clock=clock)
    tasks_second = read_tasks(procfs)

    fired, fired_notes = irq_cpus_fired(nic, first.get("interrupts"), second.get("interrupts"))
    notes.extend(fired_notes)
    irq_cpus, source, empty_why = _choose_irq_cpus(irq_option, fired, affinity, nic, online, notes)
    why = why or empty_why
    online_after = read_topology(sysfs=sysfs, procfs=procfs)["online"]
    if online_after != online:
        notes.append(
            "online CPUs changed during the sample: %s -> %s" % (format_cpulist(online), format_cpulist(online_after))
        )
    signals = compute_signals(first, second, online, interface=interface, speed_mbps=speed)
    notes.extend(signals["notes"])
    verdict = judge(signals, irq_cpus, thresholds, irq_cpus_why=why)
    irq_set = set(irq_cpus)
    user_work = processes_on(signals, irq_set, tasks_first, tasks_second, procfs)
    reasons = _annotate(signals, verdict, user_work, irq_set, "option" if speed_option is not None else (
        "sysfs" if speed is not None else "unknown"))
    return {
        "changed": False,
        "verdict": verdict["verdict"],
        "verdict_rule": verdict["verdict_rule"],
        "reasons": reasons,
        "signals": verdict["signals"],
        "irq_cpu_processes": user_work["irq_cpus"],
        "task_notes": user_work["notes"],
        "interface": interface,
        "pci_address": (nic or {}).get("pci_address"),
        "driver": (nic or {}).get("driver"),
        "irq_cpus": list(irq_cpus),
        "irq_cpulist": format_cpulist(irq_cpus),
        "irq_cpus_source": source,
        "irq_cpus_fired": fired,
        "irq_cpus_affinity": list(affinity_cpus),
        "irq_cpus_affinity_source": affinity_source,
        "findings": verdict["findings"],
        "hot_cpus": verdict["hot_cpus"],
        "busy_irq_cpus": verdict["busy_irq_cpus"],
        "contended_cpus": verdict["contended_cpus"],
        "non_irq_squeeze_cpus": verdict["non_irq_squeeze_cpus"],
        "online_cpus": list(online),
        "interval_requested": interval,
        "interval": signals["elapsed"],
        "window": {"start": round(first["wall"], 3), "end": round(second["wall"], 3)},
        "softnet": signals["softnet"],
        "cpus": signals["cpus"],
        "link": signals["link"],
        "totals": verdict["totals"],
        "thresholds": verdict["thresholds"],
        "notes": notes,
    }


def sampling_result(launch, status=None, nic_read=None):
    """One host's softnet_check result from the three tasks of the sampling (diagnose.yml and preflight.yml share it).

    ``launch`` is the registered start of the job (async with poll 0; in a sequential run, the result itself),
    ``status`` the registered ``async_status`` that collected it, ``nic_read`` the registered NIC read before the
    window. Returns the module's result (``finished`` set), or ``{failed: True, msg}`` saying why there is none:
    the launch's own error, else the NIC read's (an unreachable host fails there, before the launch), else that
    the job did not start, or did not finish in time.
    """
    launch, status, nic_read = launch or {}, status or {}, nic_read or {}
    if "verdict" in launch or (launch.get("failed") and "ansible_job_id" not in launch):
        return dict(launch, finished=1)     # a sequential run, or a job that failed to start: the launch holds it
    if not status or status.get("skipped"):
        first = nic_read.get("msg") or "the sampling job did not start (host unreachable?)"
        return {"failed": True, "msg": launch.get("msg") or first}
    if not status.get("finished"):
        return {"failed": True, "msg": "the sampling job did not finish in time"}
    return status
