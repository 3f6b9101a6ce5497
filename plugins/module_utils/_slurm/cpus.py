# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's abstract CPU ids: translate Linux CPU ids to a ``CpuSpecList`` and back.

Private module_utils of gpunode.tuning, standard library only.

``CpuSpecList=`` on a slurm.conf NodeName line and ``CPUSpecList=`` in
``scontrol show node`` are Slurm *abstract* CPU ids, not Linux ids. slurmd
numbers them from its hwloc topology (src/slurmd/common/xcpuinfo.c,
``xcpuinfo_hwloc_topo_get``; tests/unit/fixtures/slurm/README.md has the
line references)::

    abstract = ((socket * cores_per_socket) + core) * threads_per_core + thread

* ``socket`` is the index of the Package (or, with
  ``SlurmdParameters=l3cache_as_socket``, the L3 cache; with
  ``numa_node_as_socket``, the NUMA node's parent object) in hwloc logical
  order, which is the order of the lowest CPU id of each;
* ``core`` is the index of the core within its socket in hwloc logical order:
  a depth-first walk of the objects slurmd keeps between Package and Core
  (Die, L3 cache, Group such as a cluster or a NUMA locality group; L1/L2 are
  filtered out), children at every level ordered by their lowest CPU id;
* ``thread`` is the rank of the Linux id within the core (lowest first).

A core is one SMT sibling group (``topology/core_cpus_list``, formerly
``thread_siblings_list``). Exception copied from hwloc: on AMD family 15h/16h
(Bulldozer compute units) siblings with different ``core_id`` are separate
cores. Intel E-cores are dropped (as slurmd does unless
``SlurmdParameters=allow_ecores``) when sysfs marks them.

Slurm reserves whole cores: a ``CpuSpecList`` id reserves every CPU of its
core (``node_conf_convert_cpu_spec_list``). When a node is configured with
``CPUs=`` equal to its core count on SMT hardware, the ids are core indices
(``abstract // threads_per_core``) instead.

This module holds the translation of one view's ids (Linux ids to abstract ids and back, whole cores,
``CpuSpecList``, ``CoreSpecCount``) and the error of every ``_slurm`` CPU module. The view is numbered by
``_slurm.view`` from a topology read from sysfs (``_slurm.sysfs``) or given in another form
(``_slurm.topology``); ``scontrol show node`` is read by ``_slurm.scontrol``.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError


class SlurmCpuError(DetailedError):
    """A topology, a CPU list or an ``scontrol show node`` text that cannot be translated.

    ``details`` names the offending ``value`` and what was ``expected``.
    """


def cpu_list(value, what):
    """``value`` (a CPU list, an int or a list of ints) as sorted CPUs; SlurmCpuError naming ``what`` otherwise."""
    try:
        return parse_cpulist(value)
    except CpuListError as exc:
        raise SlurmCpuError("%s %r is not a CPU list: %s" % (what, value, exc), value=value, expected=exc.expected or "a CPU list such as 0-3,8")


# --------------------------------------------------------------------------- translation


def _os_cpus(view, os_cpus, what="os_cpus"):
    cpus = cpu_list(os_cpus, what)
    for cpu in cpus:
        if cpu not in view["os_to_abstract"]:
            why = view["excluded"].get(cpu)
            if why:
                raise SlurmCpuError("CPU %d is %s, so it has no Slurm abstract id" % (cpu, why), value=cpu,
                                    expected="CPUs of %s" % format_cpulist(sorted(view["os_to_abstract"])))
            raise SlurmCpuError("CPU %d is not an online CPU of this node (online: %s)" % (cpu, format_cpulist(sorted(view["os_to_abstract"]))),
                                value=cpu, expected="CPUs of %s" % format_cpulist(sorted(view["os_to_abstract"])))
    return cpus


def os_to_abstract(view, os_cpus):
    """Sorted Slurm abstract ids of the Linux CPUs ``os_cpus`` (a CPU list or ints)."""
    return sorted(view["os_to_abstract"][cpu] for cpu in _os_cpus(view, os_cpus))


def abstract_to_os(view, abstract):
    """Sorted Linux CPU ids of the Slurm abstract ids ``abstract``."""
    ids = cpu_list(abstract, "abstract CPU ids")
    bad = [i for i in ids if i >= view["cpus"]]
    if bad:
        raise SlurmCpuError("abstract CPU id %d is not below the node's %d CPUs" % (bad[0], view["cpus"]), value=bad[0],
                            expected="abstract ids 0 to %d" % (view["cpus"] - 1))
    return sorted(view["abstract_to_os"][i] for i in ids)


def whole_cores(view, os_cpus):
    """(every Linux CPU of the cores of ``os_cpus``, the ones added to ``os_cpus``), both sorted."""
    cpus = _os_cpus(view, os_cpus)
    tpc = view["threads_per_core"]
    every = set()
    for cpu in cpus:
        every.update(view["cores"][view["os_to_abstract"][cpu] // tpc])
    return sorted(every), sorted(every - set(cpus))


def cpu_spec_list(view, os_cpus, cpus_are_cores=False):
    """The ``CpuSpecList`` value that reserves the Linux CPUs ``os_cpus``, and what Slurm will reserve with it.

    Keys: ``cpu_spec_list`` (whole cores, in abstract ids, formatted as
    ``scontrol show node`` prints ``CPUSpecList``; core indices with
    ``cpus_are_cores``, for a node whose slurm.conf ``CPUs=`` is its core count),
    ``abstract`` (the abstract ids of ``os_cpus`` alone), ``os_cpus`` (every
    Linux CPU Slurm reserves), ``extra_os_cpus`` (the ones whole-core
    reservation adds), ``cores`` (how many) and ``cpus_effective`` (CPUs left
    for jobs, as ``CPUEfctv``).
    """
    cpus = _os_cpus(view, os_cpus)
    every, extra = whole_cores(view, cpus)
    tpc = view["threads_per_core"]
    core_ids = sorted(set(view["os_to_abstract"][cpu] // tpc for cpu in cpus))
    if cpus_are_cores:
        value = format_cpulist(core_ids)
        effective = view["sockets"] * view["cores_per_socket"] - len(core_ids)
    else:
        value = format_cpulist(sorted(view["os_to_abstract"][cpu] for cpu in every))
        effective = view["cpus"] - len(core_ids) * tpc
    return {
        "cpu_spec_list": value,
        "abstract": sorted(view["os_to_abstract"][cpu] for cpu in cpus),
        "os_cpus": every,
        "extra_os_cpus": extra,
        "cores": len(core_ids),
        "cpus_effective": effective,
    }


def core_spec_abstract(sockets, cores_per_socket, threads_per_core, count, spec_cores_first=False):
    """The abstract CPU ids Slurm reserves for ``CoreSpecCount=count``.

    As ``node_conf_select_spec_cores`` (slurmctld) and ``_select_spec_cores``
    (slurmd): the last core of the last socket, then the last core of each
    lower socket, then the next-to-last cores...; with
    ``SchedulerParameters=spec_cores_first`` the first cores of the first
    sockets. ``threads_per_core`` is the node's schedulable threads (1 when
    slurm.conf ``CPUs=`` is the core count).
    """
    for name, value in (("sockets", sockets), ("cores_per_socket", cores_per_socket), ("threads_per_core", threads_per_core)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SlurmCpuError("%s %r is not a positive integer" % (name, value), value=value, expected="an integer of at least 1")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SlurmCpuError("CoreSpecCount %r is not a non-negative integer" % (count,), value=count, expected="an integer of at least 0")
    if count >= sockets * cores_per_socket:
        raise SlurmCpuError("CoreSpecCount=%d leaves no core of the %d (Slurm resets it to 1)" % (count, sockets * cores_per_socket),
                            value=count, expected="at most %d" % (sockets * cores_per_socket - 1))
    core_order = range(cores_per_socket) if spec_cores_first else range(cores_per_socket - 1, -1, -1)
    socket_order = list(range(sockets)) if spec_cores_first else list(range(sockets - 1, -1, -1))
    picked = []
    left = count
    for core in core_order:
        for socket in socket_order:
            if not left:
                break
            first = ((socket * cores_per_socket) + core) * threads_per_core
            picked.extend(range(first, first + threads_per_core))
            left -= 1
    return sorted(picked)


def core_spec_cpus(view, count, spec_cores_first=False):
    """``{"cpu_spec_list", "abstract", "os_cpus"}``: what ``CoreSpecCount=count`` reserves on this node."""
    abstract = core_spec_abstract(view["sockets"], view["cores_per_socket"], view["threads_per_core"], count, spec_cores_first)
    return {"cpu_spec_list": format_cpulist(abstract), "abstract": abstract, "os_cpus": abstract_to_os(view, abstract)}
