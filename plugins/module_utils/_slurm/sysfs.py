# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's CPU topology read from sysfs, as slurmd's hwloc reads it, into Slurm's view.

Private module_utils of gpunode.tuning, standard library only.

Per online CPU: ``topology/physical_package_id``, the core (SMT sibling
group: ``core_cpus_list``, ``thread_siblings_list`` or their masks), the die
and cluster CPU lists, the L3 cache's ``shared_cpu_list`` (or map) and the
NUMA node. As hwloc does, AMD family 15h/16h compute units (read from
/proc/cpuinfo) count every CPU as its own core, and Intel E-cores are left
out as slurmd does without ``SlurmdParameters=allow_ecores``. The records go
to ``_slurm.view.build_view``.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpumask
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_int, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.view import build_view

_CPU_DIR_RE = re.compile(r"^cpu(\d+)$")
_NODE_DIR_RE = re.compile(r"^node(\d+)$")


def _online(cpu_dir, sysfs, notes):
    """The online CPUs: the ``online`` file, else the cpuN directories with a topology (said in ``notes``)."""
    online = read_cpulist(join(cpu_dir, "online"))
    if online is None:
        online = []
        for name in list_dir(cpu_dir):
            match = _CPU_DIR_RE.match(name)
            if match and os.path.isdir(join(cpu_dir, name, "topology")) and read_text(join(cpu_dir, name, "online"), "1") != "0":
                online.append(int(match.group(1)))
        online.sort()
        notes.append("%s/online is unreadable; the cpuN directories with a topology were used" % cpu_dir)
    if not online:
        raise SlurmCpuError("no online CPU under %s" % cpu_dir, value=sysfs, expected="a sysfs tree with online CPUs")
    return online


def _cpuset(cpu_dir, online_set, cpu, *names):
    """The online CPUs in the first readable of ``names`` (a ``*_list`` file or a mask) under cpuN/topology, or
    None; a set with no online CPU is the CPU itself."""
    for name in names:
        path = join(cpu_dir, "cpu%d" % cpu, "topology", name)
        value = _cpus_of(path, None) if name.endswith("_list") else _cpus_of(None, path)
        if value:
            return frozenset(set(value) & online_set) or frozenset([cpu])
    return None


def _cpus_of(list_path, mask_path):
    """The CPUs of a sysfs ``*_list`` file, else of the ``*_map``/mask file beside it; None when neither reads."""
    value = read_cpulist(list_path) if list_path else None
    if value is None and mask_path:
        text = read_text(mask_path)
        try:
            value = parse_cpumask(text) if text else None
        except CpuListError:
            value = None
    return value


def _cpu_record(cpu_dir, cpu, online_set, notes):
    """One online CPU's record: its core (SMT siblings), package, die, cluster and L3 groups, and core_id."""
    package = read_int(join(cpu_dir, "cpu%d" % cpu, "topology/physical_package_id"))
    if package is None or package < 0:
        raise SlurmCpuError(
            "cpu%d has no package id (topology/physical_package_id is %s); slurmd would see no sockets and map CPUs linearly"
            % (cpu, "missing" if package is None else package), value=cpu, expected="a physical_package_id for every online CPU")
    core = _cpuset(cpu_dir, online_set, cpu, "core_cpus_list", "thread_siblings_list", "core_cpus", "thread_siblings")
    if core is None:
        core = frozenset([cpu])
        notes.append("cpu%d has no readable sibling list; treated as its own core" % cpu)
    levels = {"package": package}
    die = _cpuset(cpu_dir, online_set, cpu, "die_cpus_list", "die_cpus")
    if die is not None:
        levels["die"] = die
    cluster = _cpuset(cpu_dir, online_set, cpu, "cluster_cpus_list", "cluster_cpus")
    if cluster is not None:
        levels["cluster"] = cluster
    l3 = _l3_of(cpu_dir, cpu, online_set)
    if l3 is not None:
        levels["l3cache"] = l3
    return {"core": core, "levels": levels, "core_id": read_int(join(cpu_dir, "cpu%d" % cpu, "topology/core_id"))}


def read_slurm_topology(sysfs="/sys", procfs=None, socket_by="package", only_cpus=None, allow_ecores=False):
    """Slurm's view of the CPUs under ``sysfs`` (see :func:`build_view` for the result).

    Per online CPU: ``topology/physical_package_id``, the core (``core_cpus_list``,
    ``thread_siblings_list`` or the ``thread_siblings`` mask), ``die_cpus_list``,
    ``cluster_cpus_list``, the L3 ``cache/index*/shared_cpu_list`` and the NUMA
    node. ``procfs`` (default: the ``proc`` next to ``sysfs``) is read for the
    AMD compute-unit rule only. ``only_cpus`` restricts the view to the CPUs
    slurmd sees (a cgroup does not: slurmd loads the whole system).
    """
    cpu_dir = join(sysfs, "devices/system/cpu")
    if not os.path.isdir(cpu_dir):
        raise SlurmCpuError("%s is not a sysfs CPU directory" % cpu_dir, value=sysfs, expected="a sysfs root with devices/system/cpu")
    if procfs is None:
        procfs = os.path.join(os.path.dirname(os.path.normpath(sysfs)), "proc")
    notes = []
    online = _online(cpu_dir, sysfs, notes)
    online_set = set(online)

    amd_cu = _amd_compute_units(procfs)
    records = dict((cpu, _cpu_record(cpu_dir, cpu, online_set, notes)) for cpu in online)

    node_dir = join(sysfs, "devices/system/node")
    for name in list_dir(node_dir):
        match = _NODE_DIR_RE.match(name)
        if match:
            for cpu in read_cpulist(join(node_dir, name, "cpulist"), default=[]) or []:
                if cpu in records:
                    records[cpu]["levels"]["numa_node"] = int(match.group(1))

    if amd_cu:
        _split_compute_units(records, notes)

    excluded = {}
    atoms = read_cpulist(join(sysfs, "devices/cpu_atom/cpus"))
    if atoms and read_cpulist(join(sysfs, "devices/cpu_core/cpus")) and not allow_ecores:
        for cpu in atoms:
            if cpu in records:
                excluded[cpu] = "an Intel E-core (devices/cpu_atom/cpus); slurmd drops E-cores unless SlurmdParameters=allow_ecores"
        notes.append("E-cores %s left out as slurmd does without SlurmdParameters=allow_ecores" % format_cpulist(sorted(excluded)))
    cpus = dict((cpu, {"core": ("core", rec["core"]), "levels": rec["levels"]}) for cpu, rec in records.items() if cpu not in excluded)
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, excluded=excluded, notes=notes, source="sysfs %s" % sysfs)


def _l3_of(cpu_dir, cpu, online_set):
    cache_dir = join(cpu_dir, "cpu%d" % cpu, "cache")
    for name in list_dir(cache_dir):
        if not name.startswith("index"):
            continue
        if read_text(join(cache_dir, name, "level")) == "3" and read_text(join(cache_dir, name, "type"), "Unified") in ("Unified", "Data"):
            shared = _cpus_of(join(cache_dir, name, "shared_cpu_list"), join(cache_dir, name, "shared_cpu_map"))
            if shared:
                return frozenset(set(shared) & online_set) or frozenset([cpu])
    return None


def _amd_compute_units(procfs):
    """hwloc's ``is_amd_with_CU``: /proc/cpuinfo says AuthenticAMD, cpu family 21 or 22 (topology-linux.c)."""
    text = read_text(join(procfs, "cpuinfo")) or ""
    vendor = family = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "cpu family" and family is None:
            family = value
    return vendor == "AuthenticAMD" and family in ("21", "22")


def _split_compute_units(records, notes):
    """One core per CPU when the first multi-CPU sibling group has distinct core_ids, as hwloc does on AMD CUs."""
    for cpu in sorted(records):
        group = records[cpu]["core"]
        if len(group) > 1:
            other = min(c for c in group if c != cpu)
            if records[cpu]["core_id"] == records.get(other, {}).get("core_id"):
                return
            break
    else:
        return
    for cpu, rec in records.items():
        rec["core"] = frozenset([cpu])
    notes.append("AMD compute units (family 15h/16h): every CPU of a sibling group is its own core, as hwloc and slurmd count them")
