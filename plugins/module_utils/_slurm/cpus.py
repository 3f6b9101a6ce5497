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
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist, parse_cpumask
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_int, read_text

SOCKET_BY = ("package", "numa_node", "l3cache")

# Container levels between the machine and the cores, outermost first, as slurmd's hwloc tree keeps them
# (Package > Die > NUMA locality Group > L3 > cluster Group > Core). Levels absent from the input are skipped.
_LEVELS = ("package", "die", "numa_node", "l3cache", "cluster")
_SOCKET_LEVEL = {"package": "package", "numa_node": "numa_node", "l3cache": "l3cache"}

_CPU_DIR_RE = re.compile(r"^cpu(\d+)$")
_NODE_DIR_RE = re.compile(r"^node(\d+)$")


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


# --------------------------------------------------------------------------- topology input


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


def _parse_lscpu_p(header, rows, socket_by, only_cpus):
    names = [name.strip().lower() for name in header.lstrip("#").split(",")]
    for needed in ("cpu", "core", "socket"):
        if needed not in names:
            raise SlurmCpuError("lscpu -p header %r has no %s column" % (header, needed.capitalize()), value=header,
                                expected="lscpu -p with at least CPU,Core,Socket (the default columns)")
    col = dict((name, names.index(name)) for name in names if name)
    cpus = {}
    offline = []
    for row in rows:
        if not row.strip() or row.lstrip().startswith("#"):
            continue
        fields = row.split(",")
        if len(fields) != len(names):
            raise SlurmCpuError("lscpu -p row %r has %d fields, the header %d" % (row, len(fields), len(names)), value=row,
                                expected="rows with as many comma separated fields as the header")
        cpu = _lscpu_id(fields[col["cpu"]], "CPU", "?")
        if cpu is None:
            raise SlurmCpuError("lscpu -p row %r has no CPU number" % row, value=row, expected="a CPU number in the first column")
        socket = _lscpu_id(fields[col["socket"]], "Socket", cpu)
        core = _lscpu_id(fields[col["core"]], "Core", cpu)
        online = fields[col["online"]].strip().upper() if "online" in col else "Y"
        if socket is None or core is None or online in ("N", "NO"):
            offline.append(cpu)
            continue
        node = _lscpu_id(fields[col["node"]], "Node", cpu) if "node" in col else None
        l3 = _lscpu_id(fields[col["l3"]], "L3", cpu) if "l3" in col else None
        _lscpu_record(cpus, cpu, socket, core, node, l3, row)
    notes = ["offline or unplaced CPUs left out: %s" % format_cpulist(offline)] if offline else []
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, notes=notes, source="lscpu -p")


def _parse_lscpu_e(header, rows, socket_by, only_cpus):
    names = [name.lower() for name in header.split()]
    for needed in ("cpu", "socket", "core"):
        if needed not in names:
            raise SlurmCpuError("lscpu -e header %r has no %s column" % (header, needed.upper()), value=header,
                                expected="lscpu -e with at least CPU, SOCKET and CORE")
    col = dict((name, names.index(name)) for name in names)
    caches = [name for name in names if name.startswith("l1") or name.startswith("l2") or name.startswith("l3")]
    cpus = {}
    offline = []
    for row in rows:
        if not row.strip():
            continue
        fields = row.split()
        if len(fields) != len(names):
            raise SlurmCpuError("lscpu -e row %r has %d fields, the header %d" % (row, len(fields), len(names)), value=row,
                                expected="rows with one field per header column")
        cpu = _lscpu_id(fields[col["cpu"]], "CPU", "?")
        if cpu is None:
            raise SlurmCpuError("lscpu -e row %r has no CPU number" % row, value=row, expected="a CPU number in the CPU column")
        socket = _lscpu_id(fields[col["socket"]], "SOCKET", cpu)
        core = _lscpu_id(fields[col["core"]], "CORE", cpu)
        online = fields[col["online"]].strip().lower() if "online" in col else "yes"
        if socket is None or core is None or online in _NO_WORDS:
            offline.append(cpu)
            continue
        node = _lscpu_id(fields[col["node"]], "NODE", cpu) if "node" in col else None
        l3 = None
        if caches:
            parts = names[col[caches[0]]].split(":")
            values = fields[col[caches[0]]].split(":")
            if "l3" in parts and len(values) == len(parts):
                l3 = _lscpu_id(values[parts.index("l3")], "L3", cpu)
        _lscpu_record(cpus, cpu, socket, core, node, l3, row)
    notes = ["offline CPUs left out: %s" % format_cpulist(offline)] if offline else []
    return build_view(cpus, socket_by=socket_by, only_cpus=only_cpus, notes=notes, source="lscpu -e")


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


# --------------------------------------------------------------------------- the view


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


# --------------------------------------------------------------------------- scontrol show node

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
