# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``scontrol show node`` output: the nodes' fields, their CPU specialization, and the Linux CPUs it reserves.

Private module_utils of gpunode.tuning, standard library only.

:func:`parse_scontrol_nodes` reads the multi-line and ``-o`` forms,
:func:`node_spec` takes a node's CPU and specialization fields, and
:func:`spec_os_cpus` translates its reported ``CPUSpecList`` (abstract ids)
to Linux CPUs through a view (``_slurm.cpus``).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError, abstract_to_os, cpu_list, whole_cores

# Every key scontrol has printed for a node (src/api/node_info.c, slurm_sprint_node_table, 15.08 to 26.05).
SCONTROL_NODE_KEYS = frozenset((
    "ActiveFeatures", "AllocMem", "AllocTRES", "Arch", "AvailableFeatures", "AveWatts", "BcastAddr", "Boards", "BootTime", "CPUAlloc",
    "CPUEfctv", "CPUErr", "CPULoad", "CPUSpecList", "CPUTot", "CapWatts", "CfgTRES", "Comment", "ConsumedJoules", "CoreSpecCount",
    "CoresPerSocket", "CpuBind", "CurrentWatts", "ExtSensorsJoules", "ExtSensorsTemp", "ExtSensorsWatts", "Extra", "Features", "FreeMem",
    "Gres", "GresDrain", "GresUsed", "InstanceId", "InstanceType", "LastBusyTime", "LowestJoules", "MCS_label", "MemSpecLimit",
    "NextState", "NodeAddr", "NodeHostName", "NodeName", "OS", "Owner", "Parameters", "Partitions", "Port", "RackMidplane", "RealMemory",
    "Reason", "ReservationName", "RestrictedCoresPerGPU", "ResumeAfterTime", "SlurmdStartTime", "Sockets", "State", "SuspendTime",
    "TLSCertLastRenewal", "TLSCertTokenSet", "ThreadsPerCore", "TmpDisk", "Topology", "Version", "Weight",
))
# Values that are free text: spaces are part of the value, and a Key= that is not known (or already seen) is text too.
_FREE_TEXT = frozenset(("OS", "Reason", "Comment", "Extra"))
_KEY_RE = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_nodes(text):
    """Parse ``scontrol show node`` output, multi-line or ``-o``, into a list of dicts (key -> value string).

    A node starts at a ``NodeName=`` that begins a line. A field starts at a
    known ``Key=`` (:data:`SCONTROL_NODE_KEYS`) not yet seen for the node, or
    at any other ``Key=`` outside the free-text values ``OS``, ``Reason``,
    ``Comment`` and ``Extra``; values keep their inner spaces (``OS=Linux
    5.14.0 #1 SMP ...``) and, in the multi-line form, end with their line.
    ``No nodes in the system`` and empty text give ``[]``.
    """
    if not isinstance(text, str):
        raise SlurmCpuError("scontrol output must be text, not %s" % type(text).__name__, value=text, expected="scontrol show node output")
    stripped = text.strip()
    if not stripped or stripped == "No nodes in the system":
        return []
    nodes = []
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if line.startswith("NodeName=", indent):
            current = {}
            nodes.append(current)
        elif current is None:
            raise SlurmCpuError("line %d %r comes before any NodeName=" % (number, line), value=line,
                                expected="scontrol show node output, starting with NodeName=")
        starts = []
        last = None
        for match in _KEY_RE.finditer(line):
            key = match.group(1)
            if key == "NodeName" and match.start() != indent:
                continue
            seen = key in current or any(k == key for dummy, dummy2, k in starts)
            if last in _FREE_TEXT and (seen or key not in SCONTROL_NODE_KEYS):
                continue
            if seen:
                name = current.get("NodeName") or (line[starts[0][1]:starts[1][0] if len(starts) > 1 else len(line)].strip()
                                                   if starts and starts[0][2] == "NodeName" else None)
                raise SlurmCpuError("key %s appears twice for node %s (line %d)" % (key, name, number), value=line,
                                    expected="scontrol show node output, each Key= once per node")
            starts.append((match.start(), match.end(), key))
            last = key
        head = line[:starts[0][0]] if starts else line
        if head.strip():
            if not current:
                raise SlurmCpuError("line %d %r does not start with a Key=" % (number, line), value=line, expected="Key=value fields")
            key = list(current)[-1]
            current[key] = (current[key] + " " + head.strip()).strip()
        for index, (dummy, end, key) in enumerate(starts):
            stop = starts[index + 1][0] if index + 1 < len(starts) else len(line)
            current[key] = line[end:stop].strip()
    return nodes


def _int_field(node, key, default=None):
    value = node.get(key)
    if value is None or value in ("", "N/A"):
        return default
    if not value.isdigit():
        raise SlurmCpuError("%s=%s of node %s is not a whole number" % (key, value, node.get("NodeName")), value=value, expected="a whole number")
    return int(value)


def node_spec(node):
    """The CPU and specialization fields of one :func:`parse_scontrol_nodes` node.

    Keys: ``name``, ``cpu_tot``, ``cpu_efctv`` (None before 22.05),
    ``sockets``, ``boards``, ``cores_per_socket``, ``threads_per_core``,
    ``core_spec_count`` (0 when absent), ``cpu_spec_list`` (list of ids),
    ``cpu_spec_list_text`` (as printed, or None), ``mem_spec_limit`` (MiB, 0
    when absent) and ``spec_unit``: ``"core"`` when the node schedules cores
    only (``CPUTot`` not above ``Sockets*CoresPerSocket`` with
    ``ThreadsPerCore`` > 1), so the ids are core indices, else ``"cpu"``.
    """
    if not isinstance(node, dict) or "NodeName" not in node:
        raise SlurmCpuError("not a parsed scontrol node: %r" % (node,), value=node, expected="a dict from parse_scontrol_nodes")
    text = node.get("CPUSpecList")
    if text in (None, "", "(null)"):
        ids = []
        text = None if text != "" else text
    else:
        ids = cpu_list(text, "CPUSpecList of node %s" % node["NodeName"])
    result = {
        "name": node["NodeName"],
        "cpu_tot": _int_field(node, "CPUTot"),
        "cpu_efctv": _int_field(node, "CPUEfctv"),
        "sockets": _int_field(node, "Sockets"),
        "boards": _int_field(node, "Boards", 1),
        "cores_per_socket": _int_field(node, "CoresPerSocket"),
        "threads_per_core": _int_field(node, "ThreadsPerCore"),
        "core_spec_count": _int_field(node, "CoreSpecCount", 0),
        "cpu_spec_list": ids,
        "cpu_spec_list_text": text,
        "mem_spec_limit": _int_field(node, "MemSpecLimit", 0),
    }
    tot_cores = (result["sockets"] or 0) * (result["cores_per_socket"] or 0)
    threads = result["threads_per_core"] or 1
    result["spec_unit"] = "core" if threads > 1 and result["cpu_tot"] is not None and tot_cores >= result["cpu_tot"] else "cpu"
    return result


def spec_os_cpus(view, spec):
    """The Linux CPUs a node's reported ``CPUSpecList`` (a :func:`node_spec` dict) reserves, via this topology.

    Raises when the node's ``Sockets``/``CoresPerSocket``/``ThreadsPerCore``
    are not the topology's: the abstract ids would then mean other CPUs.
    """
    expected = (view["sockets"], view["cores_per_socket"], view["threads_per_core"])
    reported = (spec.get("sockets"), spec.get("cores_per_socket"), spec.get("threads_per_core"))
    if reported != expected:
        raise SlurmCpuError("node %s reports Sockets=%s CoresPerSocket=%s ThreadsPerCore=%s but the topology has %d sockets, %d cores per socket, "
                            "%d threads per core" % ((spec.get("name"),) + reported + expected),
                            value=dict(zip(("Sockets", "CoresPerSocket", "ThreadsPerCore"), reported)),
                            expected=dict(zip(("Sockets", "CoresPerSocket", "ThreadsPerCore"), expected)))
    ids = spec.get("cpu_spec_list") or []
    if spec.get("spec_unit") == "core":
        tpc = view["threads_per_core"]
        ids = [core * tpc + t for core in ids for t in range(tpc)]
    os_cpus = abstract_to_os(view, ids)
    every, dummy = whole_cores(view, os_cpus) if os_cpus else ([], [])
    return every
