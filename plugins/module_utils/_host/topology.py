# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CPU topology as the kernel reports it: online CPUs, SMT sibling groups, NUMA nodes.

Private module_utils of gpunode.tuning, standard library only. Nothing here
assumes a numbering scheme: sibling groups come from each CPU's
``topology/thread_siblings_list`` (siblings may be ``i, i+1`` as under QEMU or
``i, i+N`` as on most two-socket servers, or anything else).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, parse_cpumask
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_text

_NODE_RE = re.compile(r"^node(\d+)$")


def read_topology(sysfs="/sys", procfs="/proc"):
    """Return the CPU topology of the tree under ``sysfs``/``procfs``.

    Keys: ``online``, ``present``, ``possible`` (lists of CPU ids),
    ``nr_cpu_ids`` (int), ``siblings`` (sorted list of sorted SMT groups, each
    once, covering the online CPUs), ``numa_nodes`` (dict node -> CPUs),
    ``isolated``, ``nohz_full`` (lists), ``default_smp_affinity`` (list, or
    None when unreadable), ``cpu_node`` (dict CPU -> node), ``numa_distances`` (dict node -> the
    node's ``distance`` row, indexed by node order) and ``notes``.
    """
    cpu_dir = join(sysfs, "devices/system/cpu")
    notes = []
    online = read_cpulist(join(cpu_dir, "online"))
    if online is None:
        online = sorted(int(name[3:]) for name in list_dir(cpu_dir) if re.match(r"^cpu\d+$", name))
        notes.append("%s/online is unreadable; using the cpuN directories" % cpu_dir)
    present = read_cpulist(join(cpu_dir, "present"), default=list(online))
    possible = read_cpulist(join(cpu_dir, "possible"), default=list(present))
    nr_cpu_ids = (max(possible) + 1) if possible else len(online)

    groups = {}
    for cpu in online:
        group = read_cpulist(join(cpu_dir, "cpu%d" % cpu, "topology/thread_siblings_list"))
        if not group:
            group = [cpu]
            notes.append("cpu%d has no readable thread_siblings_list; treated as its own core" % cpu)
        elif cpu not in group:
            group = sorted(set(group) | {cpu})
        groups[tuple(group)] = True
    siblings = sorted(list(g) for g in groups)

    numa_nodes = {}
    distances = {}
    node_dir = join(sysfs, "devices/system/node")
    for name in list_dir(node_dir):
        match = _NODE_RE.match(name)
        if match:
            node = int(match.group(1))
            numa_nodes[node] = read_cpulist(join(node_dir, name, "cpulist"), default=[])
            row = (read_text(join(node_dir, name, "distance")) or "").split()
            if row and all(x.isdigit() for x in row):
                distances[node] = [int(x) for x in row]
    cpu_node = {}
    for node, cpus in numa_nodes.items():
        for cpu in cpus:
            cpu_node[cpu] = node
    if not numa_nodes:
        notes.append("no NUMA nodes under %s (kernel without NUMA); locality is unknown" % node_dir)

    default_mask = read_text(join(procfs, "irq/default_smp_affinity"))
    default_smp_affinity = None
    if default_mask is not None:
        try:
            default_smp_affinity = parse_cpumask(default_mask)
        except CpuListError:
            notes.append("cannot parse irq/default_smp_affinity %r" % default_mask)

    return {
        "online": online,
        "present": present,
        "possible": possible,
        "nr_cpu_ids": nr_cpu_ids,
        "siblings": siblings,
        "numa_nodes": numa_nodes,
        "numa_distances": distances,
        "cpu_node": cpu_node,
        "isolated": read_cpulist(join(cpu_dir, "isolated"), default=[]),
        "irq_isolated": irq_isolated(procfs, read_cpulist(join(cpu_dir, "isolated"), default=[])),
        "nohz_full": read_cpulist(join(cpu_dir, "nohz_full"), default=[]),
        "default_smp_affinity": default_smp_affinity,
        "notes": notes,
    }


def sibling_map(topology):
    """Dict CPU -> its sibling group (a list), from ``read_topology`` output."""
    result = {}
    for group in topology["siblings"]:
        for cpu in group:
            result[cpu] = group
    return result


def irq_isolated(procfs, isolated):
    """The isolated CPUs the kernel was told to keep IRQs off: ``isolated`` when the running command line's last
    ``isolcpus=`` has the ``managed_irq`` flag, else none.

    ``isolcpus=domain,...`` alone isolates CPUs from the scheduler only, which
    is how seed 000 keeps the workload off the NIC's IRQ CPUs; those stay IRQ
    candidates, so a pin planned before such a boot is planned the same after it.
    """
    text = read_text(join(procfs, "cmdline"), default="") or ""
    flags = []
    for token in text.split():
        if token.startswith("isolcpus="):
            flags = [part for part in token[len("isolcpus="):].split(",") if part.isalpha() or "_" in part]
    return list(isolated) if "managed_irq" in flags else []
