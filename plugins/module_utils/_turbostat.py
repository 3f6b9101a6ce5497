# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""turbostat's tabular output: parse it by header name (pure).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``parse_turbostat`` turns the text turbostat printed into numbers;
``busy_frequency`` and ``deepest_cstates`` read the last measurement interval
of the result.

What the parser relies on (tools/power/x86/turbostat/turbostat.c):

* Columns differ by vendor, model, driver, version and ``--show``/``--hide``
  (Intel ``C1E C6 ... CPU%c6 Pkg%pc6``, AMD acpi_idle ``POLL C1 C2``,
  optional ``Package Die Node Core CPU`` topology columns, ``usec`` and
  ``Time_Of_Day_Seconds`` in front), so every value is looked up by the name
  in the header line above it, never by position.
* The header is printed again for every interval (``--interval``); with
  ``--header_iterations`` it may not be, so a summary row also starts a new
  interval once the current one has rows.
* The summary row has ``-`` in its topology columns (``Core``, ``CPU``...).
  A row of a CPU that is not the first thread of its core (or of a core that
  is not the first of its package) stops after the per-thread (per-core)
  columns: the columns it lacks are absent from its dict.
* Cells are separated by tabs (turbostat's own output) or, in copies that
  went through a terminal or a web page, by spaces. No column name and no
  value contains a space. Lines before the first header (the version line,
  ``--debug`` dump, ``78.06 sec``, a shell prompt) are skipped; so is
  ``--quiet`` output that has none.

Values: integers become ``int``, decimals ``float``, ``-`` and empty cells
``None``; anything else (``--add ...,raw`` hex counters) is kept as text.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._errors import DetailedError

_INT_RE = re.compile(r"^-?\d+$")
_FLOAT_RE = re.compile(r"^-?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_HEX_RE = re.compile(r"^0x[0-9a-fA-F]+$")
# Columns that say which CPU a row belongs to; ``-`` in them marks a summary row.
TOPOLOGY_COLUMNS = ("Package", "Die", "Node", "L3", "Core", "CPU")
# A header has at least one of these (every turbostat since 2017 prints them unless hidden).
_HEADER_MARKERS = frozenset(("Avg_MHz", "Busy%", "Bzy_MHz", "TSC_MHz"))
_CORE_CSTATE_RE = re.compile(r"^CPU%c(\d+)$")
_PKG_CSTATE_RE = re.compile(r"^Pk(?:g)?%pc(\d+)$")
_MODULE_CSTATE_RE = re.compile(r"^Mod%c(\d+)$")


class TurbostatError(DetailedError):
    """Text that is not turbostat's table, or a table a helper cannot use.

    ``value`` is the offending input (or the offending line of it) and
    ``expected`` says what would have been accepted.
    """


def _split(line, tabs):
    if tabs:
        return [cell.strip() for cell in line.rstrip("\r\n").split("\t")]
    return line.split()


def _trim(cells):
    """Drop the empty cells a leading or trailing tab leaves."""
    start, end = 0, len(cells)
    while start < end and not cells[start]:
        start += 1
    while end > start and not cells[end - 1]:
        end -= 1
    return cells[start:end]


def _is_header(cells):
    names = [c for c in cells if c]
    if len(names) < 2 or not _HEADER_MARKERS.intersection(names):
        return False
    return not any(_INT_RE.match(c) or _FLOAT_RE.match(c) or c == "-" or c.endswith(":") for c in names)


def _value(cell):
    if cell == "" or cell == "-":
        return None
    if _INT_RE.match(cell):
        return int(cell)
    if _FLOAT_RE.match(cell):
        return float(cell)
    return cell


def _is_row(cells):
    """A data row: every cell a number, ``-``, empty or a hex counter."""
    present = [c for c in cells if c]
    if not present:
        return False
    return all(c == "-" or _INT_RE.match(c) or _FLOAT_RE.match(c) or _HEX_RE.match(c) for c in present)


def _new_interval(columns):
    return {"columns": list(columns), "summary": None, "cpus": {}}


def parse_turbostat(text):
    """Parse turbostat output into intervals of a summary row and per-CPU rows.

    Returns ``{"columns": [...], "intervals": [{"columns": [...],
    "summary": {column: value} or None, "cpus": {cpu: {column: value}}}]}``;
    ``columns`` at the top is the first header, each interval keeps its own.
    Rows without a ``CPU`` column (``--Summary``, ``--hide CPU``) count as
    summary rows. A row with more cells than its header raises.
    """
    if not isinstance(text, str):
        raise TurbostatError("turbostat output must be text, not %s" % type(text).__name__, value=text, expected="the text turbostat printed")
    intervals = []
    current = None
    columns = None
    tabs = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        line_tabs = "\t" in line
        cells = _split(line, line_tabs)
        if _is_header(cells):
            columns = _trim(cells)
            if any(not c for c in columns):
                raise TurbostatError(
                    "line %d: empty column name in turbostat header %r" % (number, line), value=line, expected="tab or space separated column names"
                )
            tabs = line_tabs
            if current is not None and (current["summary"] is not None or current["cpus"]):
                intervals.append(current)
            current = _new_interval(columns)
            continue
        if current is None:
            continue  # preamble: version, --debug dump, "N.NNN sec", prompt
        cells = _trim(_split(line, tabs and line_tabs))
        if not _is_row(cells):
            continue  # e.g. "turbostat: cpu3 jitter 26083 8533" between rows
        if len(cells) > len(columns):
            raise TurbostatError(
                "line %d has %d cells but its header has %d columns: %r" % (number, len(cells), len(columns), line),
                value=line,
                expected="at most %d cells, one per header column" % len(columns),
            )
        row = dict((name, _value(cell)) for name, cell in zip(columns, cells))
        cpu_cell = cells[columns.index("CPU")] if "CPU" in columns and columns.index("CPU") < len(cells) else None
        if cpu_cell is None or cpu_cell == "-":
            if current["summary"] is not None or current["cpus"]:
                intervals.append(current)
                current = _new_interval(columns)
            current["summary"] = row
            continue
        cpu = row["CPU"]
        if not isinstance(cpu, int) or cpu < 0:
            raise TurbostatError("line %d: CPU %r is not a CPU number" % (number, cpu_cell), value=line, expected="a CPU number or '-' in the CPU column")
        if cpu in current["cpus"]:
            intervals.append(current)
            current = _new_interval(columns)
        current["cpus"][cpu] = row
    if current is not None and (current["summary"] is not None or current["cpus"]):
        intervals.append(current)
    if not intervals:
        snippet = text.strip().splitlines()[:1]
        raise TurbostatError(
            "no turbostat table found: no header line with Avg_MHz, Busy%%, Bzy_MHz or TSC_MHz followed by data rows (first line: %r)"
            % (snippet[0] if snippet else ""),
            value=text[:200],
            expected="turbostat output with a header such as 'Core CPU Avg_MHz Busy% Bzy_MHz ...' and rows under it",
        )
    return {"columns": list(intervals[0]["columns"]), "intervals": intervals}


def _last_interval(parsed):
    intervals = parsed.get("intervals") if isinstance(parsed, dict) else None
    if not intervals:
        raise TurbostatError("no interval in the parsed turbostat output", value=parsed, expected="the result of parse_turbostat")
    return intervals[-1]


def busy_frequency(parsed, busy_threshold=50.0):
    """Busy frequency of the last interval.

    Returns ``{"summary_bzy_mhz", "summary_busy_pct", "busy_cpus": {cpu:
    Bzy_MHz}}`` where ``busy_cpus`` holds the CPUs whose ``Busy%`` is above
    ``busy_threshold`` (percent).
    """
    interval = _last_interval(parsed)
    missing = [c for c in ("Busy%", "Bzy_MHz") if c not in interval["columns"]]
    if missing:
        raise TurbostatError(
            "turbostat output has no %s column (it was hidden or this turbostat does not print it)" % " or ".join(missing),
            value=interval["columns"],
            expected="columns Busy% and Bzy_MHz",
        )
    summary = interval["summary"] or {}
    busy = {}
    for cpu in sorted(interval["cpus"]):
        row = interval["cpus"][cpu]
        pct = row.get("Busy%")
        if isinstance(pct, (int, float)) and pct > busy_threshold:
            busy[cpu] = row.get("Bzy_MHz")
    return {"summary_bzy_mhz": summary.get("Bzy_MHz"), "summary_busy_pct": summary.get("Busy%"), "busy_cpus": busy}


def _deepest(columns, pattern):
    best = None
    for name in columns:
        match = pattern.match(name)
        if match and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), name)
    return best[1] if best else None


def deepest_cstates(parsed):
    """The deepest C-state residency columns of the last interval.

    Returns ``{"core": "CPU%c6" or None, "module": "Mod%c6" or None,
    "package": "Pkg%pc6" or None, "requested": "C6%" or None, "residency":
    {column: {"summary": value, "cpus": {cpu: value}}}}``.

    ``core``/``module``/``package`` are the hardware residency counters with
    the highest number; ``requested`` is the last cpuidle state (the deepest
    one the OS can ask for) of the ``NAME``/``NAME%`` column pairs turbostat
    reads from sysfs (``C6%``, ``C2%``, ``C6SP%``). ``cpus`` holds only the
    rows that print the column (core counters only on the first thread of a
    core, package counters only on the first CPU of a package), so a caller
    can say "CPU%c6 is 0 on every busy core".
    """
    interval = _last_interval(parsed)
    columns = interval["columns"]
    requested = [name for name in columns if name.endswith("%") and name[:-1] in columns]
    result = {
        "core": _deepest(columns, _CORE_CSTATE_RE),
        "module": _deepest(columns, _MODULE_CSTATE_RE),
        "package": _deepest(columns, _PKG_CSTATE_RE),
        "requested": requested[-1] if requested else None,
    }
    residency = {}
    for key in ("core", "module", "package", "requested"):
        name = result[key]
        if name is None:
            continue
        cpus = dict((cpu, row[name]) for cpu, row in sorted(interval["cpus"].items()) if row.get(name) is not None)
        residency[name] = {"summary": (interval["summary"] or {}).get(name), "cpus": cpus}
    result["residency"] = residency
    return result
