# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's view from the topology forms a module is given: ``lscpu`` text, CPU lists, per-CPU dicts, counts.

Private module_utils of gpunode.tuning, standard library only.

:func:`parse_lscpu` reads ``lscpu -p`` and ``lscpu -e`` output,
:func:`topology_from_dict` the sockets/cores CPU lists or per-CPU dicts, and
:func:`topology_view` takes any form a module accepts (a sysfs path goes to
``_slurm.sysfs``); each ends in ``_slurm.view.build_view``.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError, cpu_list
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.sysfs import read_slurm_topology
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.view import build_view

_LSCPU_P_HEADER = re.compile(r"^#\s*CPU,")
_NO_WORDS = ("no", "non", "nein", "нет", "否", "nie", "não", "nao", "nej", "ei", "ne")


def parse_lscpu(text, socket_by="package", only_cpus=None):
    """Slurm's view from ``lscpu -p`` (``# CPU,Core,Socket,Node,,L1d,L1i,L2,L3``) or ``lscpu -e`` output.

    Cores are the ``(Socket, Core)`` pairs, so both the default logical ids
    and ``--physical`` ids work; NUMA nodes come from ``Node``/``NODE``, L3
    caches from the ``L3`` column. Offline CPUs (``-``, empty or a "no" in
    ``ONLINE``) are left out. ``lscpu`` does not know AMD compute units:
    give a sysfs tree for AMD family 15h/16h.
    """
    if not isinstance(text, str):
        raise SlurmCpuError("lscpu output must be text, not %s" % type(text).__name__, value=text, expected="lscpu -p or lscpu -e output")
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _LSCPU_P_HEADER.match(line):
            return _parse_lscpu_p(line, _block(lines[index + 1:]), socket_by, only_cpus)
    for index, line in enumerate(lines):
        words = line.split()
        if words[:1] == ["CPU"] and "SOCKET" in words and "CORE" in words:
            return _parse_lscpu_e(line, _block(lines[index + 1:]), socket_by, only_cpus)
    raise SlurmCpuError("no lscpu -p header ('# CPU,Core,Socket,...') nor lscpu -e header ('CPU NODE SOCKET CORE ...') in the text",
                        value=text[:200], expected="the output of lscpu -p or lscpu -e")


def _block(rows):
    """The rows of the first table: up to the first blank line or new header after some data (lscpu prints none)."""
    taken = []
    for row in rows:
        data = row.strip() and not row.lstrip().startswith("#")
        if taken and (not row.strip() or _LSCPU_P_HEADER.match(row) or row.split()[:1] == ["CPU"]):
            break
        if data:
            taken.append(row)
    return taken


def _lscpu_id(value, column, cpu):
    value = value.strip()
    if value in ("", "-"):
        return None
    if not value.isdigit():
        raise SlurmCpuError("lscpu column %s of CPU %s is %r" % (column, cpu, value), value=value, expected="a number, '-' or nothing")
    return int(value)


def _lscpu_record(cpus, cpu, socket, core, node, l3, row):
    if cpu in cpus:
        raise SlurmCpuError("CPU %d appears twice in the lscpu output" % cpu, value=row, expected="one row per CPU")
    levels = {"package": socket}
    if node is not None:
        levels["numa_node"] = node
    if l3 is not None:
        levels["l3cache"] = ("l3", l3)
    cpus[cpu] = {"core": ("core", socket, core), "levels": levels}


def _l3_p(names, col, fields, cpu):
    return _lscpu_id(fields[col["l3"]], "L3", cpu) if "l3" in col else None


def _l3_e(names, col, fields, cpu):
    """lscpu -e prints the caches in one column, ``L1d:L1i:L2:L3``, with one value per level."""
    caches = [name for name in names if name.startswith("l1") or name.startswith("l2") or name.startswith("l3")]
    if not caches:
        return None
    parts, values = names[col[caches[0]]].split(":"), fields[col[caches[0]]].split(":")
    if "l3" in parts and len(values) == len(parts):
        return _lscpu_id(values[parts.index("l3")], "L3", cpu)
    return None


# The two tables lscpu prints, as far as they differ: how a row splits, the column names as the messages give
# them, the words of an offline CPU, the cache column, and what the messages expect.
_LSCPU = {
    "-p": dict(split=lambda row: row.split(","), comment="#", labels=("CPU", "Socket", "Core", "Node"), offline=("n", "no"),
               l3=_l3_p, fields="rows with as many comma separated fields as the header",
               cpu="a CPU number in the first column", note="offline or unplaced CPUs left out"),
    "-e": dict(split=lambda row: row.split(), comment=None, labels=("CPU", "SOCKET", "CORE", "NODE"), offline=_NO_WORDS,
               l3=_l3_e, fields="rows with one field per header column",
               cpu="a CPU number in the CPU column", note="offline CPUs left out"),
}


def _lscpu_table(form, names, rows, socket_by, only_cpus):
    """Slurm's view from the rows of ``lscpu -p`` or ``lscpu -e`` (``form``) under the header's column ``names``."""
    how = _LSCPU[form]
    col = dict((name, names.index(name)) for name in names if name)
    label_cpu, label_socket, label_core, label_node = how["labels"]
    cpus, offline = {}, []
    for row in rows:
        if not row.strip() or (how["comment"] and row.lstrip().startswith(how["comment"])):
            continue
        fields = how["split"](row)
        if len(fields) != len(names):
            raise SlurmCpuError("lscpu %s row %r has %d fields, the header %d" % (form, row, len(fields), len(names)),
                                value=row, expected=how["fields"])
        cpu = _lscpu_id(fields[col["cpu"]], label_cpu, "?")
        if cpu is None:
            raise SlurmCpuError("lscpu %s row %r has no CPU number" % (form, row), value=row, expected=how["cpu"])
        socket = _lscpu_id(fields[col["socket"]], label_socket, cpu)
        core = _lscpu_id(fields[col["core"]], label_core, cpu)
        online = fields[col["online"]].strip().lower() if "online" in col else "yes"
        if socket is None or core is None or online in how["offline"]:
            offline.append(cpu)
            continue
        node = _lscpu_id(fields[col["node"]], label_node, cpu) if "node" in col else None
        _lscpu_record(cpus, cpu, socket, core, node, how["l3"](names, col, fields, cpu), row)
    notes = ["%s: %s" % (how["note"], format_cpulist(offline))] if offline else []
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, notes=notes, source="lscpu %s" % form)


def _parse_lscpu_p(header, rows, socket_by, only_cpus):
    names = [name.strip().lower() for name in header.lstrip("#").split(",")]
    for needed in ("cpu", "core", "socket"):
        if needed not in names:
            raise SlurmCpuError("lscpu -p header %r has no %s column" % (header, needed.capitalize()), value=header,
                                expected="lscpu -p with at least CPU,Core,Socket (the default columns)")
    return _lscpu_table("-p", names, rows, socket_by, only_cpus)


def _parse_lscpu_e(header, rows, socket_by, only_cpus):
    names = [name.lower() for name in header.split()]
    for needed in ("cpu", "socket", "core"):
        if needed not in names:
            raise SlurmCpuError("lscpu -e header %r has no %s column" % (header, needed.upper()), value=header,
                                expected="lscpu -e with at least CPU, SOCKET and CORE")
    return _lscpu_table("-e", names, rows, socket_by, only_cpus)


def topology_from_dict(data, socket_by="package", only_cpus=None):
    """Slurm's view from a topology given by the user.

    Either ``{"sockets": [cpulist, ...], "cores": [cpulist, ...]}`` (one CPU
    list per socket and per core, a core being an SMT sibling group; optional
    ``"l3cache"`` and ``"numa_nodes"`` lists of CPU lists), or a list (or
    ``{"cpus": [...]}``) of per-CPU dicts ``{"cpu": 0, "socket": 0, "core": 0}``
    with optional ``"numa_node"`` and ``"l3cache"`` (``package``/``core_id``/``node``
    are accepted as aliases).
    """
    if isinstance(data, dict) and ("sockets" in data or "cores" in data or "siblings" in data):
        return _from_groups(data, socket_by, only_cpus)
    if isinstance(data, dict) and "cpus" in data:
        data = data["cpus"]
    if not isinstance(data, (list, tuple)) or not data:
        raise SlurmCpuError("the topology must be a non-empty list of CPUs or a dict with sockets and cores", value=data,
                            expected="{'sockets': ['0-23,48-71', ...], 'cores': ['0,48', ...]} or [{'cpu': 0, 'socket': 0, 'core': 0}, ...]")
    cpus = {}
    for entry in data:
        if not isinstance(entry, dict):
            raise SlurmCpuError("topology entry %r is not a dict" % (entry,), value=entry, expected="{'cpu': 0, 'socket': 0, 'core': 0}")
        values = {}
        for key, aliases in (("cpu", ("cpu",)), ("socket", ("socket", "package")), ("core", ("core", "core_id"))):
            found = [entry[a] for a in aliases if a in entry]
            if not found or isinstance(found[0], bool) or not isinstance(found[0], int) or found[0] < 0:
                raise SlurmCpuError("topology entry %r has no non-negative integer %s" % (entry, key), value=entry,
                                    expected="{'cpu': 0, 'socket': 0, 'core': 0}")
            values[key] = found[0]
        if values["cpu"] in cpus:
            raise SlurmCpuError("CPU %d appears twice in the topology" % values["cpu"], value=entry, expected="one entry per CPU")
        levels = {"package": values["socket"]}
        for key, aliases in (("numa_node", ("numa_node", "node")), ("l3cache", ("l3cache", "l3"))):
            found = [entry[a] for a in aliases if a in entry and entry[a] is not None]
            if found:
                levels[key] = (key, found[0])
        cpus[values["cpu"]] = {"core": ("core", values["socket"], values["core"]), "levels": levels}
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, source="topology")


def _from_groups(data, socket_by, only_cpus):
    sockets = data.get("sockets")
    cores = data.get("cores", data.get("siblings"))
    if not isinstance(sockets, (list, tuple)) or not sockets or not isinstance(cores, (list, tuple)) or not cores:
        raise SlurmCpuError("a grouped topology needs non-empty 'sockets' and 'cores' lists", value=data,
                            expected="{'sockets': ['0-23,48-71', '24-47,72-95'], 'cores': ['0,48', '1,49', ...]}")
    cpus = {}
    for index, group in enumerate(sockets):
        for cpu in cpu_list(group, "socket %d" % index):
            if cpu in cpus:
                raise SlurmCpuError("CPU %d is in two sockets" % cpu, value=data["sockets"], expected="disjoint CPU lists, one per socket")
            cpus[cpu] = {"levels": {"package": index}}
    seen = set()
    for group in cores:
        members = cpu_list(group, "core")
        if not members:
            raise SlurmCpuError("empty core in the topology", value=group, expected="a non-empty CPU list per core")
        for cpu in members:
            if cpu not in cpus:
                raise SlurmCpuError("core %s has CPU %d that is in no socket" % (format_cpulist(members), cpu), value=group,
                                    expected="cores made of the sockets' CPUs")
            if cpu in seen:
                raise SlurmCpuError("CPU %d is in two cores" % cpu, value=group, expected="disjoint CPU lists, one per core (SMT sibling group)")
            seen.add(cpu)
            cpus[cpu]["core"] = ("core", frozenset(members))
    missing = sorted(set(cpus) - seen)
    if missing:
        raise SlurmCpuError("CPUs %s are in a socket but in no core" % format_cpulist(missing), value=missing, expected="every socket CPU in one core")
    for key, option in (("numa_node", "numa_nodes"), ("l3cache", "l3cache")):
        for index, group in enumerate(data.get(option) or []):
            for cpu in cpu_list(group, "%s %d" % (option, index)):
                if cpu in cpus:
                    cpus[cpu]["levels"][key] = (key, index)
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, source="topology")


def topology_view(topology, name=None, socket_by="package", only_cpus=None):
    """Slurm's view from any of the topology forms a module accepts; errors name the node ``name``.

    ``{"lscpu": text}`` (:func:`parse_lscpu`), ``{"sysfs": path}``
    (:func:`read_slurm_topology`), ``{"sockets": n, "cores_per_socket": n,
    "threads_per_core": n}`` for a node whose Linux ids already are Slurm's
    (core k = CPUs k*T to k*T+T-1: QEMU guests, adjacent siblings), or the
    forms of :func:`topology_from_dict` (a ``"cores"`` list of per-CPU dicts
    with ``package``/``core`` works too).
    """
    try:
        if isinstance(topology, dict) and isinstance(topology.get("lscpu"), str):
            return parse_lscpu(topology["lscpu"], socket_by=socket_by, only_cpus=only_cpus)
        if isinstance(topology, dict) and isinstance(topology.get("sysfs"), str):
            return read_slurm_topology(topology["sysfs"], socket_by=socket_by, only_cpus=only_cpus)
        if isinstance(topology, dict) and all(isinstance(topology.get(k), int) and not isinstance(topology.get(k), bool)
                                              for k in ("sockets", "cores_per_socket", "threads_per_core")):
            return _shape(topology, socket_by, only_cpus)
        if isinstance(topology, dict) and isinstance(topology.get("cores"), list) and topology["cores"] \
                and all(isinstance(c, dict) for c in topology["cores"]):
            return topology_from_dict(topology["cores"], socket_by=socket_by, only_cpus=only_cpus)
        if isinstance(topology, dict) and "siblings" in topology and "sockets" not in topology:
            raise SlurmCpuError("the topology has SMT sibling groups but no sockets: Slurm numbers CPUs by socket first",
                                value=sorted(topology), expected="lscpu, sockets/cores lists, per-CPU socket and core, or the sockets/cores_per_socket/"
                                "threads_per_core counts")
        return topology_from_dict(topology, socket_by=socket_by, only_cpus=only_cpus)
    except SlurmCpuError as exc:
        if name is None:
            raise
        raise SlurmCpuError("node %s: %s" % (name, exc), **exc.details)


def _shape(topology, socket_by, only_cpus):
    sockets, cores, threads = topology["sockets"], topology["cores_per_socket"], topology["threads_per_core"]
    for key in ("sockets", "cores_per_socket", "threads_per_core"):
        if topology[key] < 1:
            raise SlurmCpuError("%s=%d is not positive" % (key, topology[key]), value=topology[key], expected="an integer of at least 1")
    if socket_by != "package":
        raise SlurmCpuError("socket_by=%s needs the node's NUMA nodes or L3 caches; counts only describe packages" % socket_by,
                            value=socket_by, expected="socket_by=package, or a topology with CPU lists")
    cpus = {}
    for cpu in range(sockets * cores * threads):
        cpus[cpu] = {"core": ("core", cpu // threads), "levels": {"package": cpu // (cores * threads)}}
    return build_view(cpus, only_cpus=only_cpus, source="counts")
