# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's CPUs split into housekeeping and workload: the one implementation of the split.

Private module_utils of gpunode.tuning, standard library only. Housekeeping
CPUs are where system services and the pinned NIC IRQs run (the IRQ CPUs plus
reserved ones); workload CPUs are the rest, for the training job. The
cpuset_slices module and the roles that fence the workload (isolcpus, Slurm
``CpuSpecList``, kubelet ``reservedSystemCPUs``) all take the split from
:func:`split`, so they cannot disagree about which CPU is whose.

Every CPU argument is anything :func:`_parse.cpulist.parse_cpulist` accepts (a CPU
list string such as ``"0-3,8"``, an integer, a list of integers).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist

# How the errors name each argument; callers with other option names pass ``labels``.
LABELS = {"housekeeping": "housekeeping", "irq_cpus": "irq_cpus", "reserved": "reserved", "workload": "workload"}


class PartitionError(DetailedError):
    """A split that cannot be made; ``details`` names the option, the bad value and what was expected."""


def _blank(value):
    """None, a blank string and an empty list all mean "not given"."""
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, (list, tuple)) and not value)


def _parse(value, key, names, ncpus=None):
    """``ncpus`` (the node's CPU count, from its online/present list) lets ``N`` and ``all`` resolve as the kernel
    resolves them."""
    # Only a list that uses N or all needs the count; others keep the plain parse, so a CPU beyond the node is
    # reported below as "not online", with the online list, rather than as a parse error.
    if not (isinstance(value, str) and ("N" in value or "all" in value.lower())):
        ncpus = None
    try:
        return set(parse_cpulist(value, ncpus=ncpus))
    except CpuListError as exc:
        raise PartitionError("%s %r is not a CPU list: %s" % (names[key], value, exc), option=names[key], value=value,
                             expected=exc.expected or "a CPU list such as 0-3,8")


def split(online, housekeeping=None, irq_cpus=(), reserved=(), workload=None, labels=None):
    """Return ``(housekeeping, workload)``, two disjoint non-empty sets of online CPUs.

    housekeeping = ``housekeeping`` when given, else ``irq_cpus`` | ``reserved``;
    workload = ``workload`` when given, else the online CPUs that are not housekeeping.
    ``None``, a blank string and an empty list mean "not given". With ``housekeeping`` given,
    ``irq_cpus`` and ``reserved`` may still be given, and must then be inside it
    (the IRQ CPUs are never the workload's). Online CPUs in neither set are
    fine: :func:`unassigned` names them.

    Raises :class:`PartitionError` for: a value that is not a CPU list, no
    online CPU, a CPU that is not online, IRQ or reserved CPUs outside an
    explicit housekeeping set, an empty housekeeping or workload set, and
    housekeeping and workload sharing CPUs.
    """
    names = dict(LABELS, **(labels or {}))
    try:
        up = set(parse_cpulist(online))
    except CpuListError as exc:
        raise PartitionError("online CPUs %r are not a CPU list: %s" % (online, exc), option="online", value=online,
                             expected="the online CPUs, as devices/system/cpu/online lists them")
    if not up:
        raise PartitionError("no online CPUs to split", option="online", value=online, expected="at least two online CPUs")
    given = {}
    for key, value in (("housekeeping", housekeeping), ("irq_cpus", irq_cpus), ("reserved", reserved), ("workload", workload)):
        given[key] = None if _blank(value) else _parse(value, key, names, max(up) + 1)
    online_text = format_cpulist(up)
    for key in ("housekeeping", "irq_cpus", "reserved", "workload"):
        offline = sorted((given[key] or set()) - up)
        if offline:
            raise PartitionError(
                "%s names CPU%s %s, not online on this node; the online CPUs are %s"
                % (names[key], "s" if len(offline) > 1 else "", format_cpulist(offline), online_text),
                option=names[key], value=format_cpulist(given[key]), cpus=format_cpulist(offline), online=online_text,
                expected="CPUs out of %s" % online_text)
    derived = (given["irq_cpus"] or set()) | (given["reserved"] or set())
    if given["housekeeping"] is not None:
        house = given["housekeeping"]
        outside = sorted(derived - house)
        if outside:
            raise PartitionError(
                "%s %s leaves out CPU%s %s of %s/%s: the IRQ and reserved CPUs are housekeeping CPUs"
                % (names["housekeeping"], format_cpulist(house), "s" if len(outside) > 1 else "", format_cpulist(outside),
                   names["irq_cpus"], names["reserved"]),
                option=names["housekeeping"], value=format_cpulist(house), cpus=format_cpulist(outside),
                expected="a CPU list that contains every IRQ and reserved CPU, or %s alone" % names["housekeeping"])
        source = names["housekeeping"]
    else:
        house = derived
        source = "%s + %s" % (names["irq_cpus"], names["reserved"])
    if not house:
        raise PartitionError(
            "the housekeeping CPUs are empty: give %s, or %s and/or %s (the CPUs where system services and the NIC "
            "IRQs run)" % (names["housekeeping"], names["irq_cpus"], names["reserved"]),
            option=names["housekeeping"], value="", expected="a non-empty CPU list such as 0-3")
    if given["workload"] is not None:
        work = given["workload"]
        both = sorted(house & work)
        if both:
            raise PartitionError(
                "%s %s and the housekeeping CPUs %s (%s) overlap on CPU%s %s; a CPU is either housekeeping or workload"
                % (names["workload"], format_cpulist(work), format_cpulist(house), source, "s" if len(both) > 1 else "",
                   format_cpulist(both)),
                option=names["workload"], value=format_cpulist(work), cpus=format_cpulist(both),
                expected="CPUs out of %s" % format_cpulist(up - house))
    else:
        work = up - house
    if not work:
        raise PartitionError(
            "no workload CPUs left: the housekeeping CPUs %s (%s) take every online CPU (%s)"
            % (format_cpulist(house), source, online_text),
            option=names["workload"], value="", cpus=format_cpulist(house), online=online_text,
            expected="housekeeping CPUs that leave at least one online CPU for the workload")
    return house, work


def unassigned(online, housekeeping, workload):
    """The online CPUs in neither set, sorted."""
    return sorted(set(parse_cpulist(online)) - set(housekeeping) - set(workload))


def as_cpulists(online, housekeeping, workload):
    """The split as the kernel writes CPU lists: housekeeping_cpus, workload_cpus, unassigned_cpus."""
    return {"housekeeping_cpus": format_cpulist(housekeeping), "workload_cpus": format_cpulist(workload),
            "unassigned_cpus": format_cpulist(unassigned(online, housekeeping, workload))}


# The kernel parameters of CPU isolation, as the isolcpus role manages them together.
ISOLATION_KEYS = ("isolcpus", "nohz_full", "rcu_nocbs")
ISOLCPUS_FLAGS = ("domain", "managed_irq", "nohz")


def isolation_parameters(isolate, present):
    """The kernel parameters that isolate ``isolate["cpus"]``, and the isolation keys to drop.

    ``isolate`` is the kernel_cmdline module's ``isolate`` option: ``cpus``
    (a CPU list), ``flags`` (isolcpus flags), ``nohz_full`` and ``rcu_nocbs``
    (the same CPUs), ``allow_cpu0``. ``present`` is the node's present CPU list.
    Returns ``(["isolcpus=<flags>,<cpus>", ...], [keys not asked for])``.

    Raises :class:`PartitionError` for: no CPUs, a value that is not a CPU
    list, a CPU the node does not have, every CPU (the kernel keeps no
    housekeeping CPU: no CPU for unbound work), CPU 0 without ``allow_cpu0``
    (the boot CPU keeps timekeeping duties; the kernel drops it from
    nohz_full), and an unknown flag.
    """
    try:
        have = set(parse_cpulist(present))
    except CpuListError as exc:
        raise PartitionError("present CPUs %r are not a CPU list: %s" % (present, exc), option="present", value=present,
                             expected="the present CPUs, as devices/system/cpu/present lists them")
    value = isolate.get("cpus")
    if _blank(value):
        raise PartitionError(
            "isolate.cpus is empty: give the CPUs to isolate (the isolcpus role takes the NIC IRQ CPUs the "
            "nic_irq_pinning role pinned earlier in the play)", option="isolate.cpus", value="",
            expected="a CPU list such as 4-5")
    cpus = _parse(value, "cpus", {"cpus": "isolate.cpus"}, max(have) + 1 if have else None)
    have_text = format_cpulist(have)
    missing = sorted(cpus - have)
    if missing:
        raise PartitionError(
            "isolate.cpus %s names CPU%s %s, which this node does not have; its CPUs are %s"
            % (format_cpulist(cpus), "s" if len(missing) > 1 else "", format_cpulist(missing), have_text),
            option="isolate.cpus", value=format_cpulist(cpus), cpus=format_cpulist(missing), present=have_text,
            expected="CPUs out of %s" % have_text)
    if cpus >= have:
        raise PartitionError(
            "isolate.cpus %s is every CPU of this node: no housekeeping CPU would be left for the kernel's unbound "
            "work and system services" % format_cpulist(cpus), option="isolate.cpus", value=format_cpulist(cpus),
            present=have_text, expected="a CPU list that leaves at least one of %s" % have_text)
    if 0 in cpus and not isolate.get("allow_cpu0"):
        raise PartitionError(
            "isolate.cpus %s includes CPU 0, the boot CPU, which keeps timekeeping and other housekeeping duties "
            "(the kernel drops it from nohz_full); set allow_cpu0 where the platform allows it"
            % format_cpulist(cpus), option="isolate.cpus", value=format_cpulist(cpus),
            expected="CPUs other than 0, or allow_cpu0: true")
    flags = list(isolate.get("flags") or [])
    bad = [f for f in flags if f not in ISOLCPUS_FLAGS]
    if bad or len(set(flags)) != len(flags):
        raise PartitionError(
            "isolate.flags %r: expected each of %s at most once" % (flags, ", ".join(ISOLCPUS_FLAGS)),
            option="isolate.flags", value=flags, expected="a list out of %s" % ", ".join(ISOLCPUS_FLAGS))
    text = format_cpulist(cpus)
    params = ["isolcpus=" + ",".join(flags + [text])]
    for key in ("nohz_full", "rcu_nocbs"):
        if isolate.get(key):
            params.append("%s=%s" % (key, text))
    wanted = set(p.partition("=")[0] for p in params)
    return params, [k for k in ISOLATION_KEYS if k not in wanted]
