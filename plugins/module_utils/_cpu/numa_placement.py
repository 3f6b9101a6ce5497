# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NUMA placement of processes: where their resident memory is, against the CPUs they may run on.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. For the ``cpu_power_facts`` module (issue #14).

* :func:`parse_numa_maps` reads ``/proc/PID/numa_maps`` as the kernel prints it
  (``show_numa_map()`` in fs/proc/task_mmu.c): start address, the policy as
  ``mpol_to_str()`` writes it (``default``, ``local``, ``prefer:0``,
  ``bind:1``, ``interleave:0-1``, ``weighted interleave:0-1``,
  ``prefer (many):0-1``, with optional ``=static``/``=relative``/
  ``=balancing`` flags), then ``file=PATH`` (spaces escaped as ``\\040``) or
  ``heap`` or ``stack``, ``huge`` for hugetlb, the page counters and
  ``N<node>=<pages>``; ``kernelpagesize_kB`` since Linux 3.7. A mapping
  with no resident page has no counters at all.
* :func:`pages_by_node` turns that into resident bytes per node: pages *
  ``kernelpagesize_kB`` * 1024. hugetlb pages are counted in huge pages
  with ``kernelpagesize_kB=2048`` (or 1048576); transparent huge pages are
  counted in base pages, so the formula holds for both.
* :func:`process_placement` reads one process from a procfs/sysfs root.
  :func:`select_processes`, :func:`judge_placement` (a table of rules),
  :func:`numa_balancing`.
* :func:`parse_numastat_p` reads ``numastat -p`` output (numactl's
  numastat.c ``show_process_info()``), and :func:`numastat_view` computes
  the same table from parsed numa_maps, so the two can be compared.
  numastat's MB are MiB (it divides bytes by 1024 * 1024). numastat before
  numactl PR #149 (issue #147) multiplied huge pages by the default
  ``Hugepagesize`` of /proc/meminfo instead of the mapping's page size;
  :func:`numastat_view` uses the mapping's ``kernelpagesize_kB``.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_raw, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

MIB = 1024 * 1024

# The page counters show_numa_map() prints (all ``key=<unsigned long>``).
COUNTER_KEYS = ("anon", "dirty", "mapped", "mapmax", "swapcache", "active", "writeback")
# mpol_to_str() mode names that are one word; anything else ("weighted interleave",
# "prefer (many)") goes on into the next token.
_ONE_WORD_MODES = ("default", "local", "prefer", "bind", "interleave")

_ADDRESS_RE = re.compile(r"^[0-9a-fA-F]+$")
_NODE_RE = re.compile(r"^N(\d+)=(\d+)$")
_KEY_RE = re.compile(r"^(%s|kernelpagesize_kB)=(\d+)$" % "|".join(COUNTER_KEYS))
_STACK_RE = re.compile(r"^stack(?::\d+)?$")

# numa_balancing values, Documentation/admin-guide/sysctl/kernel.rst: a bit mask of
# NUMA_BALANCING_NORMAL (1) and NUMA_BALANCING_MEMORY_TIERING (2).
NUMA_BALANCING_NAMES = {0: "disabled", 1: "normal", 2: "memory_tiering", 3: "normal+memory_tiering"}


class NumaPlacementError(DetailedError):
    """Bad input (a pid, a pattern, a threshold, a numa_maps or numastat line).

    ``details`` holds ``value`` (the offending input) and ``expected`` for ``fail_json``.
    """


# ------------------------------------------------------------- numa_maps --


def parse_policy(text):
    """``{"text", "mode", "flags", "nodes"}`` of a numa_maps policy such as ``bind=static:0-1``.

    ``nodes`` is a list, or None for a policy without a node list (``default``, ``local``).
    """
    head, dummy, nodelist = text.partition(":")
    mode, dummy, flags = head.partition("=")
    nodes = None
    if nodelist:
        try:
            nodes = parse_cpulist(nodelist)
        except CpuListError as exc:
            raise NumaPlacementError("bad node list %r in policy %r: %s" % (nodelist, text, exc), value=text,
                                     expected="a policy such as bind:0-1")
    return {"text": text, "mode": mode, "flags": flags.split("|") if flags else [], "nodes": nodes}


def parse_numa_maps(text):
    """Mappings of a ``/proc/PID/numa_maps`` text, in file order.

    Each: ``address`` (hex string as printed), ``policy`` (the policy text),
    ``mode``, ``policy_flags``, ``policy_nodes`` (see :func:`parse_policy`),
    ``file`` (path as printed, octal escapes kept, or None), ``heap``,
    ``stack``, ``huge`` (bools), ``pages`` (dict node -> pages), ``counters``
    (dict of the ``anon``/``dirty``/... counters present),
    ``kernelpagesize_kB`` (int, or None where the kernel did not print it:
    before Linux 3.7, or no resident page) and ``other`` (tokens not
    recognised, kept rather than guessed at). Blank lines are skipped and
    surrounding whitespace is ignored; a line that does not start with a
    hex address raises :class:`NumaPlacementError` naming it.
    """
    mappings = []
    for number, raw in enumerate((text or "").splitlines(), 1):
        tokens = raw.split()
        if not tokens:
            continue
        if not _ADDRESS_RE.match(tokens[0]) or len(tokens) < 2:
            raise NumaPlacementError("numa_maps line %d is not '<address> <policy> ...': %r" % (number, raw.strip()),
                                     value=raw.strip(), expected="a start address in hex followed by the memory policy")
        policy = tokens[1]
        index = 2
        if index < len(tokens) and (policy.split(":")[0].split("=")[0] not in _ONE_WORD_MODES or tokens[index].startswith("(")):
            # "weighted interleave:0-1", "prefer (many):0-1"
            policy = policy + " " + tokens[index]
            index += 1
        pol = parse_policy(policy)
        mapping = {
            "address": tokens[0], "policy": policy, "mode": pol["mode"], "policy_flags": pol["flags"],
            "policy_nodes": pol["nodes"], "file": None, "heap": False, "stack": False, "huge": False,
            "pages": {}, "counters": {}, "kernelpagesize_kB": None, "other": [],
        }
        for token in tokens[index:]:
            node = _NODE_RE.match(token)
            key = _KEY_RE.match(token)
            if node:
                mapping["pages"][int(node.group(1))] = int(node.group(2))
            elif key:
                if key.group(1) == "kernelpagesize_kB":
                    mapping["kernelpagesize_kB"] = int(key.group(2))
                else:
                    mapping["counters"][key.group(1)] = int(key.group(2))
            elif token.startswith("file="):
                mapping["file"] = token[len("file="):]
            elif token == "heap":
                mapping["heap"] = True
            elif _STACK_RE.match(token):
                mapping["stack"] = True
            elif token == "huge":
                mapping["huge"] = True
            else:
                mapping["other"].append(token)
        mappings.append(mapping)
    return mappings


def mapping_page_kb(mapping, default_pagesize_kb=4):
    """The page size of a mapping in KiB: its ``kernelpagesize_kB``, else ``default_pagesize_kb``."""
    size = mapping.get("kernelpagesize_kB")
    return default_pagesize_kb if size is None else size


def pages_by_node(parsed, default_pagesize_kb=4):
    """Resident bytes per node (dict node -> bytes) of :func:`parse_numa_maps` output.

    Each mapping's pages count with its own ``kernelpagesize_kB`` (2048 for
    2 MiB hugetlb pages, 1048576 for 1 GiB ones); a mapping the kernel
    printed without it (Linux before 3.7) counts ``default_pagesize_kb``.
    """
    result = {}
    for mapping in parsed:
        size = mapping_page_kb(mapping, default_pagesize_kb) * 1024
        for node, pages in mapping["pages"].items():
            result[node] = result.get(node, 0) + pages * size
    return dict(sorted(result.items()))


NUMASTAT_CATEGORIES = ("Huge", "Heap", "Stack", "Private")


def numastat_category(mapping):
    """The ``numastat -p`` row a mapping is added to: Huge, Heap, Stack or Private (the catch-all)."""
    if mapping["huge"]:
        return "Huge"
    if mapping["heap"]:
        return "Heap"
    if mapping["stack"]:
        return "Stack"
    return "Private"


def numastat_view(parsed, default_pagesize_kb=4):
    """The ``numastat -p PID`` table computed from :func:`parse_numa_maps` output, in MiB, unrounded.

    Same shape as one :func:`parse_numastat_p` table: ``categories`` (dict
    Huge/Heap/Stack/Private -> ``{"nodes": {node: MiB}, "total": MiB}``),
    ``nodes`` (sorted list) and ``total``. Compare with a numastat capture
    within its rounding (0.005 per cell for ``-p``, 0.5 for ``-c``).
    """
    categories = dict((name, {"nodes": {}, "total": 0.0}) for name in NUMASTAT_CATEGORIES)
    total = {"nodes": {}, "total": 0.0}
    for mapping in parsed:
        row = categories[numastat_category(mapping)]
        size = mapping_page_kb(mapping, default_pagesize_kb) * 1024
        for node, pages in mapping["pages"].items():
            mib = pages * size / float(MIB)
            for cell in (row, total):
                cell["nodes"][node] = cell["nodes"].get(node, 0.0) + mib
                cell["total"] += mib
    nodes = sorted(total["nodes"])
    return {"pid": None, "name": None, "nodes": nodes, "categories": categories, "processes": [], "total": total}


# -------------------------------------------------------------- numastat --

_NUMASTAT_TITLE_RE = re.compile(r"^Per-node process memory usage \(in MBs\)(?: for PID (\d+) \((.*)\))?$")
_NUMASTAT_HEADER_RE = re.compile(r"^(?:PID\s+)?(?:(?:Node\s+\d+|Total)(?:\s+|$))+$")
_NUMASTAT_COLUMN_RE = re.compile(r"Node\s+(\d+)|Total")
_NUMBER_RE = re.compile(r"^-?\d+(?:\.\d+)?$")
_PID_LABEL_RE = re.compile(r"^(\d+) \((.*?)\)?$")


def parse_numastat_p(text):
    """Tables of ``numastat -p PID`` / ``numastat -p NAME`` / ``numastat -c ...`` output, in order.

    One table per ``Per-node process memory usage (in MBs)`` title: the
    detailed one (``... for PID N (name)``, one PID) has ``pid``, ``name`` and
    ``categories`` (dict Huge/Heap/Stack/Private -> ``{"nodes": {node: MB},
    "total": MB}``); the summary one (several PIDs, or ``-c``) has
    ``processes`` (list of ``{"pid", "name", "label", "nodes", "total"}``;
    ``name`` as printed, numastat cuts the label at 16 characters with
    ``-c``). Both have ``nodes`` (node ids of the columns) and ``total`` (the
    ``Total`` row, None when the capture ends before it). Column sections
    that numastat folds for a narrow terminal are merged; blank lines and
    dash rules are skipped; a ``Per-node system memory usage`` (``-m``) or
    ``numastat -n`` table after it ends the process table. An unreadable row
    inside a process table raises :class:`NumaPlacementError`.
    """
    tables = []
    table = None
    columns = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        title = _NUMASTAT_TITLE_RE.match(line)
        if title:
            table = {"pid": int(title.group(1)) if title.group(1) else None, "name": title.group(2),
                     "nodes": [], "categories": {}, "processes": [], "total": None}
            tables.append(table)
            columns = None
            continue
        if line.startswith("Per-node "):
            table = None
            continue
        if table is None or not line or set(line) <= set("- "):
            continue
        if _NUMASTAT_HEADER_RE.match(line):
            columns = [int(m.group(1)) if m.group(1) else "total" for m in _NUMASTAT_COLUMN_RE.finditer(line)]
            for node in columns:
                if node != "total" and node not in table["nodes"]:
                    table["nodes"].append(node)
            continue
        tokens = line.split()
        if columns is None or len(tokens) <= len(columns) or not all(_NUMBER_RE.match(t) for t in tokens[-len(columns):]):
            raise NumaPlacementError("cannot read numastat row %r" % line, value=line,
                                     expected="a label and %s numbers" % (len(columns) if columns else "the header's"))
        parts = line.rsplit(None, len(columns))
        label, values = re.sub(r"\s+", " ", parts[0]), [float(t) for t in parts[1:]]
        cell = _row_cell(table, label)
        for column, value in zip(columns, values):
            if column == "total":
                cell["total"] = value
            else:
                cell["nodes"][column] = value
    return tables


def _row_cell(table, label):
    if label == "Total":
        if table["total"] is None:
            table["total"] = {"nodes": {}, "total": None}
        return table["total"]
    if table["pid"] is not None or label in NUMASTAT_CATEGORIES:
        return table["categories"].setdefault(label, {"nodes": {}, "total": None})
    for process in table["processes"]:
        if process["label"] == label:
            return process
    match = _PID_LABEL_RE.match(label)
    process = {"pid": int(match.group(1)) if match else None, "name": match.group(2) if match else label,
               "label": label, "nodes": {}, "total": None}
    table["processes"].append(process)
    return process


# ---------------------------------------------------------------- procfs --


def _status_fields(text):
    fields = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _cpulist_field(fields, key):
    try:
        return parse_cpulist(fields.get(key, ""))
    except CpuListError:
        return None


def _cmdline(procfs, pid):
    raw = read_raw(join(procfs, str(pid), "cmdline"))
    if raw is None:
        return None
    return raw.replace("\0", " ").strip()


def process_placement(procfs, sysfs, pid, topology=None):
    """Where process ``pid``'s resident memory is, against the NUMA nodes of its allowed CPUs.

    Returns None when the process does not exist or exits (or is a zombie)
    while being read. Otherwise a dict: ``pid``, ``name`` (status Name),
    ``comm``, ``cmdline`` (NULs as spaces), ``cpus_allowed``,
    ``mems_allowed`` (lists), ``local_nodes`` (nodes holding an allowed
    CPU), ``kernel_thread`` (empty cmdline and no mapping with pages),
    ``readable`` (False when numa_maps could not be read, as for another
    user's process without CAP_SYS_PTRACE), ``resident_bytes`` (dict node ->
    bytes, None when unreadable), ``total_bytes``, ``remote_bytes`` (on
    nodes not in ``local_nodes``), ``remote_nodes`` (those of them holding
    pages), ``remote_pct`` (float, 1 decimal; None when there is nothing
    resident or it is unreadable), ``policies`` (dict mode -> mappings) and
    ``notes``. ``topology`` is :func:`_host.topology.read_topology` output, read
    from ``sysfs``/``procfs`` when not given (pass it when judging many
    processes).
    """
    base = join(procfs, str(pid))
    status_text = read_text(join(base, "status"))
    if status_text is None:
        return None
    status = _status_fields(status_text)
    if status.get("State", "").startswith(("Z", "X")):
        return None
    comm = read_text(join(base, "comm"))
    cmdline = _cmdline(procfs, pid)
    maps_text = read_raw(join(base, "numa_maps"))
    if read_text(join(base, "status")) is None:
        return None  # exited while being read: what was read may be cut short
    notes = []
    if topology is None:
        topology = read_topology(sysfs, procfs)
    cpus = _cpulist_field(status, "Cpus_allowed_list")
    mems = _cpulist_field(status, "Mems_allowed_list")
    if cpus is None:
        notes.append("%s has no readable Cpus_allowed_list" % join(base, "status"))
        cpus = []
    cpu_node = topology.get("cpu_node") or {}
    numa = bool(topology.get("numa_nodes"))
    local_nodes = sorted(set(cpu_node[c] for c in cpus if c in cpu_node))
    if not numa:
        notes.append("no NUMA nodes in sysfs: all memory counts as local")
    result = {
        "pid": int(pid), "name": status.get("Name", comm), "comm": comm, "cmdline": cmdline,
        "cpus_allowed": cpus, "mems_allowed": mems, "local_nodes": local_nodes,
        "kernel_thread": False, "readable": maps_text is not None, "resident_bytes": None,
        "total_bytes": None, "remote_bytes": None, "remote_nodes": [], "remote_pct": None,
        "policies": {}, "notes": notes,
    }
    if maps_text is None:
        notes.append("%s is unreadable (permission denied: reading another user's numa_maps needs root)"
                     % join(base, "numa_maps"))
        return result
    parsed = parse_numa_maps(maps_text)
    for mapping in parsed:
        result["policies"][mapping["mode"]] = result["policies"].get(mapping["mode"], 0) + 1
    resident = pages_by_node(parsed)
    total = sum(resident.values())
    result["kernel_thread"] = not cmdline and not any(m["pages"] for m in parsed)
    remote = dict((n, b) for n, b in resident.items() if numa and n not in local_nodes and b)
    result.update(resident_bytes=resident, total_bytes=total, remote_bytes=sum(remote.values()),
                  remote_nodes=sorted(remote))
    if total:
        result["remote_pct"] = round(100.0 * result["remote_bytes"] / total, 1)
    elif result["kernel_thread"]:
        notes.append("kernel thread: no user memory")
    return result


def _is_live_proc(procfs):
    return os.path.realpath(procfs) == "/proc"


def _valid_pid(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.strip().isdigit() and int(value.strip()) > 0:
        return int(value.strip())
    return None


def select_processes(procfs="/proc", pids=(), name_patterns=()):
    """Sorted pids: each of ``pids`` (it must exist) and every process whose comm or full cmdline matches a pattern.

    ``name_patterns`` are Python regular expressions, all compiled before
    any is used (``re.search``, so ``^nginx$`` anchors and ``nginx`` matches
    ``/usr/sbin/nginx -g ...``). Raises :class:`NumaPlacementError` naming a
    pid that is not a positive integer or does not exist under ``procfs``,
    and a pattern that does not compile (with the ``re`` error). The calling
    process is left out of the pattern matches when ``procfs`` is the live
    /proc (its own command line may hold the pattern); a pid given
    explicitly is kept. Processes that exit during the scan are skipped.
    """
    compiled = []
    for pattern in name_patterns or ():
        try:
            compiled.append(re.compile(pattern))
        except (re.error, TypeError) as exc:
            raise NumaPlacementError("invalid regular expression %r: %s" % (pattern, exc), value=pattern,
                                     expected="a Python regular expression")
    selected = set()
    for value in pids or ():
        pid = _valid_pid(value)
        if pid is None:
            raise NumaPlacementError("pid %r is not a positive integer" % (value,), value=value, expected="a process id such as 1234")
        if read_text(join(procfs, str(pid), "status")) is None:
            raise NumaPlacementError("pid %d does not exist (no %s)" % (pid, join(procfs, str(pid), "status")),
                                     value=pid, expected="the pid of a running process")
        selected.add(pid)
    if compiled:
        own = os.getpid() if _is_live_proc(procfs) else None
        for name in list_dir(procfs):
            if not name.isdigit() or int(name) == own:
                continue
            comm = read_text(join(procfs, name, "comm"))
            if comm is None:
                continue
            cmdline = _cmdline(procfs, name) or ""
            if any(p.search(comm) or (cmdline and p.search(cmdline)) for p in compiled):
                selected.add(int(name))
    return sorted(selected)


# --------------------------------------------------------------- verdict --


def format_bytes(value):
    """``2.1 GiB``, ``50.0 MiB``, ``12.0 KiB``, ``512 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return "%.1f %s" % (value / float(size), unit)
    return "%d B" % value


def _nodes_text(nodes):
    return ("node %d" % nodes[0]) if len(nodes) == 1 else ("nodes %s" % format_cpulist(nodes))


def _remote_message(placement, context):
    return "%.1f %% of %s resident on %s, remote to CPUs %s (%s)" % (
        placement["remote_pct"], format_bytes(placement["total_bytes"]), _nodes_text(placement["remote_nodes"]),
        format_cpulist(placement["cpus_allowed"]), _nodes_text(placement["local_nodes"]) if placement["local_nodes"] else "no node")


def _irq_message(placement, context):
    shared = sorted(set(placement["cpus_allowed"]) & context["irq_cpus"])
    return "allowed CPUs %s include %d CPU(s) carrying NIC IRQs: %s" % (
        format_cpulist(placement["cpus_allowed"]), len(shared), format_cpulist(shared))


# name, condition(placement, context), message(placement, context): evaluated in order by judge_placement.
RULES = (
    ("remote_memory",
     lambda p, c: p["remote_pct"] is not None and p["remote_pct"] > c["threshold_pct"],
     _remote_message),
    ("irq_cpus",
     lambda p, c: c["irq_cpus"] is not None and bool(set(p["cpus_allowed"]) & c["irq_cpus"]),
     _irq_message),
)


def judge_placement(placements, threshold_pct, irq_cpus=None):
    """One finding per placement (None entries, processes gone, are skipped), in input order.

    A finding: ``pid``, ``name``, ``flagged`` (bool), ``rules`` (names of
    the :data:`RULES` that hit: ``remote_memory`` when ``remote_pct`` >
    ``threshold_pct``, ``irq_cpus`` when ``irq_cpus`` is given and the
    allowed CPUs include any of them), ``reasons`` (one message per rule,
    quoting the numbers), ``remote_pct``, ``total_bytes``, and ``judged``
    (False with a reason when numa_maps was unreadable: only the IRQ rule
    could run). ``threshold_pct`` must be a number from 0 to 100 and
    ``irq_cpus`` a CPU list (string, list or set), else
    :class:`NumaPlacementError`.
    """
    if isinstance(threshold_pct, bool) or not isinstance(threshold_pct, (int, float)) or not 0 <= threshold_pct <= 100:
        raise NumaPlacementError("threshold_pct %r is not a percentage from 0 to 100" % (threshold_pct,),
                                 value=threshold_pct, expected="a number from 0 to 100")
    irq_set = None
    if irq_cpus is not None:
        try:
            irq_set = set(parse_cpulist(sorted(irq_cpus) if isinstance(irq_cpus, (set, frozenset)) else irq_cpus))
        except CpuListError as exc:
            raise NumaPlacementError("irq_cpus %r is not a CPU list: %s" % (irq_cpus, exc), value=irq_cpus,
                                     expected="a CPU list such as 0-3")
    context = {"threshold_pct": threshold_pct, "irq_cpus": irq_set}
    findings = []
    for placement in placements:
        if placement is None:
            continue
        finding = {"pid": placement["pid"], "name": placement["name"], "flagged": False, "rules": [], "reasons": [],
                   "remote_pct": placement["remote_pct"], "total_bytes": placement["total_bytes"],
                   "judged": placement["readable"]}
        for name, condition, message in RULES:
            if condition(placement, context):
                finding["rules"].append(name)
                finding["reasons"].append(message(placement, context))
        if not placement["readable"]:
            finding["reasons"].append("numa_maps unreadable: memory placement not judged")
        finding["flagged"] = bool(finding["rules"])
        findings.append(finding)
    return findings


# ---------------------------------------------------------------- sysctl --


def numa_balancing(procfs="/proc"):
    """``{"value": int, "name": str}`` of ``sys/kernel/numa_balancing``, None when absent or not an integer.

    Names: 0 disabled, 1 normal, 2 memory_tiering, 3 normal+memory_tiering
    (the kernel's NUMA_BALANCING_NORMAL | NUMA_BALANCING_MEMORY_TIERING bits);
    other values ``unknown``.
    """
    text = read_text(join(procfs, "sys/kernel/numa_balancing"))
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return {"value": value, "name": NUMA_BALANCING_NAMES.get(value, "unknown")}
