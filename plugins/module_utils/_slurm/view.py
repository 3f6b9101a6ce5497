# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's view of a node: its CPUs numbered as slurmd numbers them from its hwloc topology.

Private module_utils of gpunode.tuning, standard library only.

:func:`build_view` takes the CPUs of a topology (each with its core and the
containers it lies in: package, die, NUMA node, L3 cache, cluster) and orders
sockets, cores and threads as slurmd does (``_slurm.cpus`` has the rule): the
socket level chosen by ``socket_by``, levels that do not nest left out, one
core count per socket and one thread count per core required. Every topology
reader (``_slurm.sysfs``, ``_slurm.topology``) ends here.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError, cpu_list

SOCKET_BY = ("package", "numa_node", "l3cache")

# Container levels between the machine and the cores, outermost first, as slurmd's hwloc tree keeps them
# (Package > Die > NUMA locality Group > L3 > cluster Group > Core). Levels absent from the input are skipped.
_LEVELS = ("package", "die", "numa_node", "l3cache", "cluster")
_SOCKET_LEVEL = {"package": "package", "numa_node": "numa_node", "l3cache": "l3cache"}


def _only(cpus, only_cpus, excluded):
    """``cpus`` restricted to ``only_cpus`` (each must be an online CPU); the others go to ``excluded``, with why."""
    keep = set(cpu_list(only_cpus, "only_cpus"))
    unknown = sorted(keep - set(cpus) - set(excluded))
    if unknown:
        raise SlurmCpuError("only_cpus %s are not online CPUs of this node (online: %s)" % (format_cpulist(unknown), format_cpulist(sorted(cpus))),
                            value=only_cpus, expected="a subset of %s" % format_cpulist(sorted(cpus)))
    for cpu in sorted(set(cpus) - keep):
        excluded[cpu] = "not in only_cpus"
    return dict((cpu, rec) for cpu, rec in cpus.items() if cpu in keep)


def _levels(cpus, socket_level, socket_by, notes):
    """The topology levels that order the CPUs, outermost first, and their containers ({level: {key: set of CPUs}}).

    A level counts when every CPU has it and it nests in the levels kept above it; the socket level always counts
    (levels above it that do not hold whole sockets are dropped). What is left out is said in ``notes``."""
    levels = []
    containers = {}
    for level in _LEVELS:
        if not all(level in rec["levels"] for rec in cpus.values()):
            continue
        groups = {}
        for cpu, rec in cpus.items():
            groups.setdefault(rec["levels"][level], set()).add(cpu)
        if level == socket_level:
            for upper in [up for up in levels if not _nests(groups, cpus, [up])]:
                notes.append("%s groups do not hold whole %s groups; left out of the ordering" % (upper, socket_by))
                levels.remove(upper)
        elif not _nests(groups, cpus, levels):
            if not all(_nests(containers[up], cpus, [level]) for up in levels):
                notes.append("%s groups do not nest in %s; left out of the ordering" % (level, "/".join(levels)))
            continue
        levels.append(level)
        containers[level] = groups
    return levels, containers


def _core_groups(cpus, levels):
    """{core key: set of CPUs}; a core whose SMT siblings lie in two groups of one level fails."""
    core_groups = {}
    for cpu, rec in cpus.items():
        core_groups.setdefault(rec["core"], set()).add(cpu)
    for members in core_groups.values():
        for level in levels:
            owners = set(cpus[cpu]["levels"][level] for cpu in members)
            if len(owners) > 1:
                raise SlurmCpuError("core %s spans %d %s groups; a core must lie in one %s" % (format_cpulist(sorted(members)), len(owners), level, level),
                                    value=sorted(members), expected="SMT siblings in one socket")
    return core_groups


def _uniform_shape(sockets, socket_keys):
    """(sockets, cores per socket, threads per core) of a node whose sockets have the same core count and whose cores
    the same thread count, as Slurm's one CoresPerSocket and ThreadsPerCore describe it; any other node fails."""
    counts = dict((key, len(sockets[key])) for key in socket_keys)
    if len(set(counts.values())) > 1:
        detail = ", ".join("socket %d (CPUs %s): %d" % (i, format_cpulist(sorted(c for dummy, m in sockets[k] for c in m)), counts[k])
                           for i, k in enumerate(socket_keys))
        raise SlurmCpuError("the topology is not uniform: the sockets have different core counts (%s); Slurm describes a node with one "
                            "CoresPerSocket and numbers its abstract CPUs on that assumption" % detail,
                            value=dict((i, counts[k]) for i, k in enumerate(socket_keys)), expected="the same number of cores in every socket")
    threads = set(len(m) for k in socket_keys for dummy, m in sockets[k])
    if len(threads) > 1:
        odd = sorted((len(m), m) for k in socket_keys for dummy, m in sockets[k])
        raise SlurmCpuError("the topology is not uniform: cores have %s threads (e.g. core %s has %d, core %s has %d); slurmd computes "
                            "ThreadsPerCore as CPUs / cores and its abstract numbering then collides" % (
                                " and ".join(str(t) for t in sorted(threads)), format_cpulist(odd[0][1]), odd[0][0], format_cpulist(odd[-1][1]), odd[-1][0]),
                            value=sorted(threads), expected="the same number of threads in every core (for a hybrid CPU, only_cpus= its P-cores)")
    return len(socket_keys), counts[socket_keys[0]], threads.pop()


def _check_ids_below(cpus, total):
    """Every online CPU id is below the CPU count slurmd sees, or the abstract ids are not a permutation."""
    if max(cpus) >= total:
        raise SlurmCpuError("CPU %d is not below the %d CPUs slurmd sees (CPUs %s); slurmd's block map skips machine ids that high "
                            "(xcpuinfo.c, 'physical or logical ID are out of range') so the abstract ids of this node are not a "
                            "permutation of its CPUs" % (max(cpus), total, format_cpulist(sorted(cpus))),
                            value=format_cpulist(sorted(cpus)), expected="online CPU ids 0 to %d (bring offline CPUs online)" % (total - 1))


def build_view(cpus, socket_by="package", only_cpus=None, excluded=None, notes=None, source="topology"):
    """Number ``cpus`` as slurmd does and return the view.

    ``cpus``: dict OS CPU -> ``{"core": hashable core key, "levels": {level: key}}``
    with levels among ``package``, ``die``, ``numa_node``, ``l3cache``, ``cluster``.

    The view (a dict): ``sockets``, ``cores_per_socket``, ``threads_per_core``,
    ``cpus`` (count), ``socket_by``, ``os_to_abstract`` (dict OS id -> abstract
    id), ``abstract_to_os`` (list indexed by abstract id), ``cores`` (list per
    abstract core index of its OS CPUs in thread order), ``socket_cpus`` (OS
    CPU list per socket), ``excluded`` (dict OS id -> why slurmd does not see
    it), ``notes`` and ``source``.
    """
    if socket_by not in SOCKET_BY:
        raise SlurmCpuError("socket_by %r is not known" % (socket_by,), value=socket_by, expected="one of %s" % ", ".join(SOCKET_BY))
    notes = list(notes or [])
    excluded = dict(excluded or {})
    if only_cpus is not None:
        cpus = _only(cpus, only_cpus, excluded)
    if not cpus:
        raise SlurmCpuError("the topology has no CPU", value=source, expected="at least one online CPU")
    socket_level = _SOCKET_LEVEL[socket_by]
    missing = sorted(cpu for cpu, rec in cpus.items() if socket_level not in rec["levels"])
    if missing:
        raise SlurmCpuError("socket_by=%s but CPUs %s have no %s in the %s" % (socket_by, format_cpulist(missing), socket_by.replace("_", " "), source),
                            value=socket_by, expected="a %s for every CPU, or socket_by=package" % socket_by.replace("_", " "))

    levels, containers = _levels(cpus, socket_level, socket_by, notes)
    core_groups = _core_groups(cpus, levels)
    upto = levels.index(socket_level) + 1

    def order_key(cpu, depth):
        rec = cpus[cpu]
        return tuple(min(containers[level][rec["levels"][level]]) for level in levels[:depth])

    sockets = {}
    for members in core_groups.values():
        first = min(members)
        sockets.setdefault(order_key(first, upto), []).append((order_key(first, len(levels)) + (first,), sorted(members)))
    socket_keys = sorted(sockets)
    nsockets, ncores, nthreads = _uniform_shape(sockets, socket_keys)
    total = nsockets * ncores * nthreads
    _check_ids_below(cpus, total)
    os_to_abs = {}
    abs_to_os = [None] * total
    cores = []
    socket_cpus = []
    for s_index, key in enumerate(socket_keys):
        members_of_socket = []
        for c_index, (dummy, members) in enumerate(sorted(sockets[key])):
            cores.append(members)
            members_of_socket.extend(members)
            for t_index, cpu in enumerate(members):
                absid = ((s_index * ncores) + c_index) * nthreads + t_index
                os_to_abs[cpu] = absid
                abs_to_os[absid] = cpu
        socket_cpus.append(sorted(members_of_socket))
    if socket_by == "package":
        multi = [i for i, cpus_of in enumerate(socket_cpus)
                 if len(set(cpus[c]["levels"].get("numa_node") for c in cpus_of if "numa_node" in cpus[c]["levels"])) > 1]
        if multi:
            notes.append("sockets %s hold more than one NUMA node: slurmd built with hwloc 1.x counts each NUMA node as a socket "
                         "(socket_by=numa_node models that, and SlurmdParameters=numa_node_as_socket)" % ",".join(str(i) for i in multi))
    return {
        "source": source,
        "socket_by": socket_by,
        "sockets": nsockets,
        "cores_per_socket": ncores,
        "threads_per_core": nthreads,
        "cpus": total,
        "os_to_abstract": os_to_abs,
        "abstract_to_os": abs_to_os,
        "cores": cores,
        "socket_cpus": socket_cpus,
        "excluded": excluded,
        "notes": notes,
    }


def _nests(groups, cpus, upper_levels):
    """Whether every group lies within one container of each of ``upper_levels``."""
    for members in groups.values():
        for level in upper_levels:
            if len(set(cpus[cpu]["levels"][level] for cpu in members)) > 1:
                return False
    return True
