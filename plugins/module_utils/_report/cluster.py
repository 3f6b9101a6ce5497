# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One cluster report from per-host findings, and its four renderings (Markdown, HTML, JUnit XML, lines).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Used by the preflight gate and the drift report.

``build_report(kind, title, hosts, generated_at, gate_labels=None)`` takes
``{host: {"findings": [finding, ...], "error": None or str}}`` where a finding
is ``{check, status, message, evidence, fix, fatal}`` (the shape of
:func:`_report.findings.finding` plus the gate's ``fatal``), optionally with ``gpu``
(an int, a list of ints or None) and ``source`` (a string or None); other keys
are kept as they are. Rules:

* status order, worst first: a fatal finding, then ``fail``, ``warn``,
  ``unknown``, ``not_applicable``, ``pass``; ``fatal`` is allowed on every
  status but ``pass`` (a passing finding cannot stop the gate; a policy may
  make ``not_applicable`` fatal, e.g. no GPU on a GPU node);
* a host with an ``error`` (unreachable, its module failed) could not be
  checked: it gets the synthetic fatal finding ``host:reachable`` (status
  ``fail``, the error as message), first among its findings, and so the gate
  is ``no_go``; a host with no finding at all has the worst status
  ``unknown`` (nothing says it is fine);
* the gate is ``no_go`` if and only if some finding is fatal;
* ``counts`` counts findings, each in exactly one bucket: ``fatal`` for the
  fatal ones, its status for the others (so the buckets add up to
  ``findings``); ``host_counts`` counts hosts by their worst status;
* a host's and a row's ``worst`` is one of :data:`WORST_ORDER` (``fatal``
  included); a cell's and a group's ``status`` is the finding status, with
  ``fatal`` beside it;
* hosts sort worst first, then by name (digit runs compared as numbers);
  findings worst first, otherwise in input order; ``checks`` in order of
  first appearance over the hosts in input order, except that
  ``host:reachable`` leads when some host could not be checked;
* ``rows`` merge hosts whose cells have the same status and fatal flag in
  every check (messages quote each host's own numbers, so they are not part
  of the key: a healthy 1,000-node cluster is one row); ``groups`` merge the
  findings of one ``(check, status, fatal)`` across hosts. A row's cells and
  a group keep up to :data:`MAX_MESSAGES` distinct messages (``messages``)
  and count them all (``distinct``); a group's ``message`` is its first.
  Both sort worst first, then biggest first. Host lists are Slurm hostlist
  strings (:func:`_parse.hostlist.compress`).

Everything is built with dictionaries keyed by content, so the work grows
with the number of findings, not with hosts squared.

Bad input raises :class:`ClusterReportError` naming the host, the value and
what was expected.
"""

from __future__ import annotations

import html
import json
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse import hostlist as _hostlist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import FATAL_STATUSES, STATUSES

# Worst first; "fatal" is a fatal finding of any status.
WORST_ORDER = ("fatal", "fail", "warn", "unknown", "not_applicable", "pass")
_RANK = dict((name, rank) for rank, name in enumerate(WORST_ORDER))
SHORT = {"fatal": "FATAL", "fail": "FAIL", "warn": "WARN", "unknown": "?", "not_applicable": "N/A", "pass": "PASS"}
WORDS = {"fatal": "fatal", "fail": "fail", "warn": "warn", "unknown": "unknown", "not_applicable": "not applicable",
         "pass": "pass"}
GATES = ("go", "no_go")
DEFAULT_GATE_LABELS = {"go": "GO", "no_go": "NO-GO"}
HOST_CHECK = "host:reachable"
# Distinct messages kept per row cell and per group (their total is in "distinct").
MAX_MESSAGES = 5
HOST_ERROR_SOURCE = "cluster_report"
HOST_ERROR_FIX = "Make the host reachable and its checks runnable, then run the report again."
FINDING_KEYS = ("check", "status", "message", "evidence", "fix", "fatal")
HOST_KEYS = ("findings", "error")
REPORT_KEYS = ("kind", "title", "generated_at", "gate", "gate_text", "counts", "host_counts", "checks", "hosts", "rows",
               "groups")

_DIGITS_RE = re.compile(r"(\d+)")
# Characters XML 1.0 does not allow, even escaped.
_XML_BAD_RE = re.compile(u"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


class ClusterReportError(DetailedError):
    """Bad input to the report builder or a renderer; ``details`` name the ``host``, the ``value`` and what was ``expected``."""


def _fail(message, value, expected, **details):
    return ClusterReportError("%s: expected %s" % (message, expected), value=value, expected=expected, **details)


def name_key(name):
    """Sort key for host names: digit runs compared as numbers (``node2`` before ``node10``), then the text."""
    parts = _DIGITS_RE.split(name)
    return tuple(int(part) if index % 2 else part for index, part in enumerate(parts)), name


def rank(status, fatal=False):
    """Position in :data:`WORST_ORDER`: 0 for a fatal finding, 5 for a pass."""
    return 0 if fatal else _RANK[status]


def worst_of(status, fatal=False):
    """The :data:`WORST_ORDER` name of a status: ``fatal`` when fatal, else the status."""
    return "fatal" if fatal else status


def hostlist(names):
    """The Slurm hostlist of ``names`` (``node[01-03]``); names a hostlist cannot hold are joined with commas."""
    try:
        return _hostlist.compress(list(names))
    except _hostlist.HostlistError:
        return ",".join(sorted(set(names), key=name_key))


# --- building -------------------------------------------------------------------------------------------------


def _check_text(value, what, expected, host=None, allow_none=False, allow_empty=True):
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        where = "" if host is None else "host %r: " % host
        raise _fail("%s%s is %r" % (where, what, value), value, expected, host=host)
    return str(value)


# A GPU as nvidia-smi names it: its PCI bus id (``00000000:01:00.0``, domain of 4 or 8 hex digits).
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4}(?:[0-9A-Fa-f]{4})?:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\Z")


def _one_gpu(gpu):
    return (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0) or \
        (isinstance(gpu, str) and _BUS_ID.match(gpu) is not None)


def _check_gpu(host, index, value):
    """A finding's GPU: an index, a PCI bus id (gpu_health's per-GPU findings), a list of them, or None."""
    if value is None:
        return None
    if _one_gpu(value):
        return value
    if isinstance(value, (list, tuple)) and all(_one_gpu(gpu) for gpu in value):
        return list(value)
    raise _fail("host %r: finding %d has gpu %r" % (host, index, value), value,
                "a GPU index or PCI bus id (00000000:01:00.0), a list of them, or null", host=host, key="gpu")


def _check_finding(host, index, item):
    """A copy of one finding with its types checked."""
    if not isinstance(item, dict):
        raise _fail("host %r: finding %d is of type %s, not a dict" % (host, index, type(item).__name__), item,
                    "a dict with keys %s" % ", ".join(FINDING_KEYS), host=host)
    missing = [key for key in FINDING_KEYS if key not in item]
    if missing:
        raise _fail("host %r: finding %d (%r) lacks %s" % (host, index, item.get("check"), ", ".join(missing)), item,
                    "a dict with keys %s" % ", ".join(FINDING_KEYS), host=host, missing=missing)
    out = dict(item)
    out["check"] = _check_text(item["check"], "a finding's check", "a non-empty check id string such as 'gpu:row_remap'",
                               host, allow_empty=False)
    status = item["status"]
    if not isinstance(status, str) or status not in STATUSES:
        raise _fail("host %r: finding %r has status %r" % (host, out["check"], status), status,
                    "one of %s" % ", ".join(STATUSES), host=host, check=out["check"])
    out["status"] = str(status)
    out["message"] = _check_text(item["message"], "the message of finding %r" % out["check"], "a string", host)
    out["fix"] = _check_text(item["fix"], "the fix of finding %r" % out["check"], "a string or null", host, allow_none=True)
    fatal = item["fatal"]
    if not isinstance(fatal, bool):
        raise _fail("host %r: finding %r has fatal %r" % (host, out["check"], fatal), fatal, "true or false", host=host,
                    check=out["check"])
    if fatal and status not in FATAL_STATUSES:
        raise _fail("host %r: finding %r is fatal with status %r" % (host, out["check"], status), status,
                    "fatal only on status %s" % ", ".join(FATAL_STATUSES), host=host, check=out["check"])
    if "gpu" in item:
        out["gpu"] = _check_gpu(host, index, item["gpu"])
    if "source" in item:
        out["source"] = _check_text(item["source"], "the source of finding %r" % out["check"], "a string or null", host,
                                    allow_none=True)
    return out


def host_error_finding(error):
    """The synthetic fatal ``host:reachable`` finding of a host that could not be checked."""
    return {"check": HOST_CHECK, "status": "fail", "message": error, "evidence": None, "fix": HOST_ERROR_FIX,
            "fatal": True, "source": HOST_ERROR_SOURCE}


def is_host_error(item):
    """Whether ``item`` is the synthetic finding :func:`host_error_finding` made."""
    return item.get("check") == HOST_CHECK and item.get("source") == HOST_ERROR_SOURCE


def _check_host(name, data):
    if not isinstance(name, str) or not name.strip():
        raise _fail("host name %r" % (name,), name, "a non-empty host name string", host=name)
    if not isinstance(data, dict):
        raise _fail("host %r: its entry is of type %s, not a dict" % (name, type(data).__name__), data,
                    "a dict {findings: [...], error: null or a string}", host=name)
    unknown = sorted(str(key) for key in data if key not in HOST_KEYS)
    if unknown:
        raise _fail("host %r: unknown key %s" % (name, ", ".join(unknown)), unknown, "only the keys findings and error",
                    host=name)
    error = data.get("error")
    if error is not None and (not isinstance(error, str) or not error.strip()):
        raise _fail("host %r: error is %r" % (name, error), error, "null or a non-empty string saying why the host could not be checked",
                    host=name)
    if "findings" not in data and error is None:
        raise _fail("host %r has neither findings nor an error" % name, data, "a dict {findings: [...], error: null or a string}",
                    host=name)
    findings = data.get("findings")
    if findings is None and error is not None:
        findings = []
    if not isinstance(findings, (list, tuple)):
        raise _fail("host %r: findings is of type %s, not a list" % (name, type(findings).__name__), findings,
                    "a list of findings", host=name)
    checked = [_check_finding(name, index, item) for index, item in enumerate(findings)]
    if error is not None:
        checked.insert(0, host_error_finding(str(error)))
    return (None if error is None else str(error)), checked


def _cells(findings):
    cells = {}
    for item in findings:
        cell = cells.get(item["check"])
        if cell is None:
            cells[item["check"]] = {"status": item["status"], "fatal": item["fatal"], "count": 1, "messages": [item["message"]]}
            continue
        cell["count"] += 1
        if rank(item["status"], item["fatal"]) < rank(cell["status"], cell["fatal"]):
            cell["status"] = item["status"]
            cell["fatal"] = item["fatal"]
        if item["message"] not in cell["messages"]:
            cell["messages"].append(item["message"])
    return cells


def _gate_labels(gate_labels):
    if gate_labels is None:
        return dict(DEFAULT_GATE_LABELS)
    if not isinstance(gate_labels, dict):
        raise _fail("gate_labels is %r" % (gate_labels,), gate_labels, "a dict {go: TEXT, no_go: TEXT}")
    labels = dict(DEFAULT_GATE_LABELS)
    for key, value in gate_labels.items():
        if key not in GATES:
            raise _fail("gate_labels has the key %r" % (key,), key, "only the keys go and no_go")
        labels[key] = _check_text(value, "gate_labels[%r]" % key, "a non-empty string", allow_empty=False)
    return labels


def _plural(count, word, plural=None):
    return "%d %s" % (count, word if count == 1 else (plural or word + "s"))


def _others(counts, all_pass=False):
    """`` (1 fail, 2 warn)``: the non-fatal findings that do not pass; `` (all pass)`` if ``all_pass`` and there are none."""
    parts = ["%d %s" % (counts[status], WORDS[status]) for status in ("fail", "warn", "unknown", "not_applicable")
             if counts[status]]
    if parts:
        return " (%s)" % ", ".join(parts)
    return " (all pass)" if all_pass and counts["pass"] else ""


def gate_text(gate, counts, fatal_hosts, labels):
    """``NO-GO: 3 fatal findings on 2 of 5 hosts (2 warn)`` / ``GO: no fatal finding on 5 hosts (1 not applicable)``."""
    if gate == "no_go":
        return "%s: %s on %d of %s%s" % (labels["no_go"], _plural(counts["fatal"], "fatal finding"), fatal_hosts,
                                         _plural(counts["hosts"], "host"), _others(counts))
    return "%s: no fatal finding on %s%s" % (labels["go"], _plural(counts["hosts"], "host"), _others(counts, True))


def _add_to_group(group_index, name, item):
    """Counts ``item`` (a finding of host ``name``) in its group: one group per check, status and fatal, with the
    first fix, up to MAX_MESSAGES distinct messages and the hosts in the order they came."""
    key = (item["check"], item["status"], item["fatal"])
    group = group_index.get(key)
    if group is None:
        group = group_index[key] = {"check": item["check"], "status": item["status"], "fatal": item["fatal"],
                                    "message": item["message"], "messages": [], "distinct": 0, "_messages": set(),
                                    "fix": item["fix"], "hosts": [], "_seen": set(), "findings": 0}
    if group["fix"] is None:
        group["fix"] = item["fix"]
    if item["message"] not in group["_messages"]:
        group["_messages"].add(item["message"])
        group["distinct"] += 1
        if len(group["messages"]) < MAX_MESSAGES:
            group["messages"].append(item["message"])
    group["findings"] += 1
    if name not in group["_seen"]:
        group["_seen"].add(name)
        group["hosts"].append(name)


def _merge_rows(entries, host_keys):
    """The summary rows: hosts (already sorted) with the same status and fatal in every check share one row."""
    row_index = {}
    rows = []
    for entry in entries:
        # The same status (and fatal) in every check: one row. Messages quote each host's own numbers (squeezes,
        # temperatures), so keying on them would give a 1,000-node cluster 1,000 rows.
        signature = tuple(sorted((check, cell["status"], cell["fatal"]) for check, cell in entry["cells"].items()))
        row = row_index.get(signature)
        if row is None:
            row = row_index[signature] = {"hosts": [], "worst": entry["worst"], "fatal": entry["fatal"],
                                          "cells": dict((check, dict(cell, count=0, messages=[], distinct=0, _seen=set()))
                                                        for check, cell in entry["cells"].items())}
            rows.append(row)
        row["hosts"].append(entry["host"])
        for check, cell in entry["cells"].items():
            merged = row["cells"][check]
            merged["count"] += cell["count"]
            for message in cell["messages"]:
                if message not in merged["_seen"]:
                    merged["_seen"].add(message)
                    merged["distinct"] += 1
                    if len(merged["messages"]) < MAX_MESSAGES:
                        merged["messages"].append(message)
    for row in rows:
        row["hostlist"] = hostlist(row["hosts"])
        row["count"] = len(row["hosts"])
        for cell in row["cells"].values():
            del cell["_seen"]
    rows.sort(key=lambda row: (_RANK[row["worst"]], -row["count"], host_keys[row["hosts"][0]]))
    return rows


def _finish_groups(group_index, checks, host_keys):
    """The groups, their helper sets dropped, hosts sorted by name and listed, in report order (worst first, then
    the most hosts, then the check's order)."""
    check_pos = dict((check, pos) for pos, check in enumerate(checks))
    groups = list(group_index.values())
    for group in groups:
        del group["_seen"]
        del group["_messages"]
        group["hosts"].sort(key=host_keys.__getitem__)
        group["hostlist"] = hostlist(group["hosts"])
        group["count"] = len(group["hosts"])
    groups.sort(key=lambda group: (rank(group["status"], group["fatal"]), -group["count"], check_pos[group["check"]],
                                   group["message"]))
    return groups


def build_report(kind, title, hosts, generated_at, gate_labels=None):
    """The report dict (JSON-able) of ``hosts`` ``{name: {"findings": [...], "error": None or str}}``.

    ``kind`` names the report in JUnit class names (``preflight``, ``drift``), ``title`` heads every rendering,
    ``generated_at`` is shown as given (a string), ``gate_labels`` ``{"go": ..., "no_go": ...}`` replaces the words
    GO and NO-GO. See the module docstring for the rules and the keys.
    """
    kind = _check_text(kind, "kind", "a non-empty report kind such as 'preflight'", allow_empty=False)
    title = _check_text(title, "title", "a string")
    generated_at = _check_text(generated_at, "generated_at", "a time stamp string")
    labels = _gate_labels(gate_labels)
    if not isinstance(hosts, dict):
        raise _fail("hosts is of type %s, not a dict" % type(hosts).__name__, hosts,
                    "a dict {host: {findings: [...], error: null or a string}}")
    if not hosts:
        raise _fail("hosts is empty: there is nothing to report on, and no gate passes on no host", hosts,
                    "at least one host")

    checks = []
    seen_checks = set()
    counts = dict((key, 0) for key in ("hosts", "findings") + WORST_ORDER)
    host_counts = dict((key, 0) for key in WORST_ORDER)
    entries = []
    group_index = {}
    for name, data in hosts.items():
        error, findings = _check_host(name, data)
        worst = None
        for item in findings:
            if item["check"] not in seen_checks:
                seen_checks.add(item["check"])
                checks.append(item["check"])
            bucket = worst_of(item["status"], item["fatal"])
            counts[bucket] += 1
            if worst is None or _RANK[bucket] < _RANK[worst]:
                worst = bucket
            _add_to_group(group_index, name, item)
        worst = worst or "unknown"
        findings.sort(key=lambda item: rank(item["status"], item["fatal"]))
        counts["hosts"] += 1
        counts["findings"] += len(findings)
        host_counts[worst] += 1
        entries.append({"host": name, "worst": worst, "fatal": worst == "fatal", "error": error, "findings": findings,
                        "cells": _cells(findings)})
    if any(entry["error"] is not None for entry in entries) and checks[0] != HOST_CHECK:
        # The synthetic check of hosts that could not be checked leads: it is the first thing to read.
        checks.remove(HOST_CHECK)
        checks.insert(0, HOST_CHECK)
    host_keys = dict((entry["host"], name_key(entry["host"])) for entry in entries)
    entries.sort(key=lambda entry: (_RANK[entry["worst"]], host_keys[entry["host"]]))

    rows = _merge_rows(entries, host_keys)

    groups = _finish_groups(group_index, checks, host_keys)

    gate = "no_go" if counts["fatal"] else "go"
    return {
        "kind": kind,
        "title": title,
        "generated_at": generated_at,
        "gate": gate,
        "gate_label": labels[gate],
        "gate_text": gate_text(gate, counts, host_counts["fatal"], labels),
        "counts": counts,
        "host_counts": host_counts,
        "checks": checks,
        "hosts": entries,
        "rows": rows,
        "groups": groups,
    }


def _check_report(report, who):
    if not isinstance(report, dict):
        raise _fail("%s takes a report dict, got %s" % (who, type(report).__name__), report, "the dict build_report returns")
    missing = [key for key in REPORT_KEYS if key not in report]
    if missing:
        raise _fail("%s: the report lacks %s" % (who, ", ".join(missing)), sorted(report), "the dict build_report returns",
                    missing=missing)


def _cell_worst(cell):
    return worst_of(cell["status"], cell["fatal"])


def _evidence_text(evidence):
    if evidence is None:
        return None
    if isinstance(evidence, str):
        return evidence
    try:
        return json.dumps(evidence, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(evidence)


def finding_text(item):
    """``message``, then ``evidence: ...`` and ``fix: ...`` lines where the finding has them."""
    lines = [item.get("message") or ""]
    evidence = _evidence_text(item.get("evidence"))
    if evidence is not None:
        lines.append("evidence: %s" % evidence)
    if item.get("fix"):
        lines.append("fix: %s" % item["fix"])
    return "\n".join(lines)


def _gpu_text(gpu):
    if gpu is None or gpu == []:
        return ""
    if isinstance(gpu, (list, tuple)):
        return " gpu %s" % ",".join(str(index) for index in gpu)
    return " gpu %s" % gpu


# --- Markdown ---------------------------------------------------------------------------------------------------


def _md(text):
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").replace("\r", " ").replace("\n", " ")


def _group_label(group):
    return "%s%s" % ("FATAL " if group["fatal"] else "", SHORT[group["status"]])


def group_message(group):
    """A group's first message, and how many other distinct messages its hosts gave (their own numbers)."""
    others = group.get("distinct", 1) - 1
    return group["message"] + (" (and %d other message%s)" % (others, "" if others == 1 else "s") if others > 0 else "")


def render_markdown(report):
    """Markdown: title, gate line, counts, "What to fix" (the non-pass groups), then one table row per row of hosts."""
    _check_report(report, "render_markdown")
    lines = ["# %s" % _md(report["title"]), "", "**%s**" % _md(report["gate_text"]), "",
             "Generated %s (%s report)." % (_md(report["generated_at"]), _md(report["kind"])), "",
             "| status | hosts (by worst finding) | findings |", "|---|---|---|"]
    for status in WORST_ORDER:
        lines.append("| %s | %d | %d |" % (SHORT[status], report["host_counts"].get(status, 0), report["counts"].get(status, 0)))
    lines.append("| all | %d | %d |" % (report["counts"]["hosts"], report["counts"].get("findings", 0)))
    lines += ["", "## What to fix", ""]
    todo = [group for group in report["groups"] if group["status"] != "pass"]
    if not todo:
        lines.append("Nothing: every finding passes.")
    for group in todo:
        lines.append("- **%s** `%s`: %s" % (_group_label(group), _md(group["check"]).replace("`", "'"), _md(group_message(group))))
        lines.append("  - hosts (%d): %s" % (group["count"], _md(group["hostlist"])))
        if group.get("fix"):
            lines.append("  - fix: %s" % _md(group["fix"]))
    checks = report["checks"]
    lines += ["", "## Hosts, worst first", "",
              "Hosts whose findings are identical share a row. %s; - is a check the hosts did not report." %
              ", ".join("%s %s" % (SHORT[status], WORDS[status]) for status in WORST_ORDER), "",
              "| hosts | count | worst | %s |" % " | ".join(_md(check) for check in checks),
              "|---|---|---|%s" % ("---|" * len(checks))]
    for row in report["rows"]:
        cells = []
        for check in checks:
            cell = row["cells"].get(check)
            cells.append("-" if cell is None else SHORT[_cell_worst(cell)])
        lines.append("| %s | %d | %s | %s |" % (_md(row["hostlist"]), row["count"], SHORT[row["worst"]], " | ".join(cells)))
    return "\n".join(lines) + "\n"


# --- HTML -------------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .4em}h2{font-size:1.15em;margin:1.4em 0 .4em}
#gate{font-size:1.3em;font-weight:700;padding:.6em 1em;border-radius:.4em;color:#fff;margin:.6em 0}
#gate.go{background:#1e6b35}#gate.no-go{background:#b3261e}
.generated{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ccc;padding:.2em .45em;text-align:left;vertical-align:top}
table.counts td.n{text-align:right}
#grid th.check{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;font-weight:600}
#grid td.hosts{white-space:nowrap;font-family:ui-monospace,monospace}
#grid td.hosts .count{color:#555;font-family:system-ui,sans-serif;margin-left:.4em}
#grid td.cell{text-align:center;font-weight:700;font-size:.8em;min-width:2.6em}
.status-pass{background:#dff3e3;color:#1e6b35}
.status-not_applicable{background:#eee;color:#666}
.status-unknown{background:#f1e6ff;color:#5b2d91}
.status-warn{background:#fff1c2;color:#6b4e00}
.status-fail{background:#ffd9d6;color:#8c1d17}
.status-fatal,td.cell.fatal{background:#b3261e;color:#fff}
.status-none{background:#fff;color:#aaa}
.badge{display:inline-block;padding:.05em .45em;border-radius:.3em;font-weight:700;font-size:.85em}
.legend{border:1px solid #ccc;padding:.5em .8em;margin:1em 0;font-size:.9em}
.legend .badge{margin:0 .2em 0 .8em}
#fix li.group{margin:.5em 0;padding:.3em .6em;background:#fafafa;color:#1d1d1f;border-left:.45em solid #bbb}
#fix li.group.status-warn{border-left-color:#e0b000}#fix li.group.status-fail{border-left-color:#e0605a}
#fix li.group.status-unknown{border-left-color:#8a5cc7}#fix li.group.fatal{border-left-color:#b3261e;background:#fff1f0}
#fix .msg{font-weight:600}
#fix .fixtext,#fix .hostlist{font-family:ui-monospace,monospace;font-size:.9em}
#fix details{font-size:.9em;margin-top:.2em}
"""


def _esc(text):
    return html.escape(str(text), quote=True)


def _badge(worst):
    return '<span class="badge status-%s">%s</span>' % (_esc(worst), _esc(SHORT[worst]))


def _html_cell(check, cell):
    if cell is None:
        return '<td class="cell status-none" data-check="%s" title="%s: not reported">-</td>' % (_esc(check), _esc(check))
    classes = "cell status-%s%s" % (cell["status"], " fatal" if cell["fatal"] else "")
    title = "%s: %s%s (%s)\n%s" % (check, "FATAL " if cell["fatal"] else "", WORDS[cell["status"]],
                                   _plural(cell["count"], "finding"), "\n".join(cell["messages"]))
    return '<td class="%s" data-check="%s" data-status="%s" title="%s">%s</td>' % (
        _esc(classes), _esc(check), _esc(cell["status"]), _esc(title), _esc(SHORT[_cell_worst(cell)]))


def render_html(report):
    """One self-contained HTML page: gate banner ``#gate`` (class ``go``/``no-go``), a legend, counts, the grid
    ``table#grid`` (one ``tr.row`` per row of hosts, one cell per check with class ``status-<status>`` and
    ``fatal``, the messages in its ``title``), then "What to fix". Inline CSS, no script, no external fetch."""
    _check_report(report, "render_html")
    checks = report["checks"]
    gate_class = "no-go" if report["gate"] == "no_go" else "go"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>%s</title>" % _esc(report["title"]),
        "<style>%s</style></head><body>" % _CSS,
        "<h1>%s</h1>" % _esc(report["title"]),
        '<div id="gate" class="%s" role="status" data-gate="%s">%s</div>' % (
            gate_class, _esc(report["gate"]), _esc(report["gate_text"])),
        '<p class="generated">Generated %s (%s report), %s, %s.</p>' % (
            _esc(report["generated_at"]), _esc(report["kind"]), _esc(_plural(report["counts"]["hosts"], "host")),
            _esc(_plural(report["counts"].get("findings", 0), "finding"))),
        '<div class="legend" id="legend"><strong>Legend.</strong> One row per set of hosts whose findings are '
        "identical, worst first; one column per check; hover a cell for its messages.",
    ]
    for status in WORST_ORDER:
        out.append("%s %s" % (_badge(status), _esc("a fatal finding: it stops the gate" if status == "fatal" else WORDS[status])))
    out.append('<span class="badge status-none">-</span> not reported by these hosts.</div>')
    out.append('<table class="counts" id="counts"><tr><th>status</th><th>hosts (by worst finding)</th><th>findings</th></tr>')
    for status in WORST_ORDER:
        out.append('<tr data-status="%s"><td>%s</td><td class="n">%d</td><td class="n">%d</td></tr>' % (
            status, _badge(status), report["host_counts"].get(status, 0), report["counts"].get(status, 0)))
    out.append("</table>")
    out.append('<h2>Hosts, worst first</h2><table id="grid"><thead><tr><th>hosts</th>%s</tr></thead><tbody>' % "".join(
        '<th class="check" scope="col">%s</th>' % _esc(check) for check in checks))
    for row in report["rows"]:
        out.append('<tr class="row" data-worst="%s" data-count="%d"><td class="hosts" title="%s">%s<span class="count">(%s)</span></td>%s</tr>' % (
            _esc(row["worst"]), row["count"], _esc(", ".join(row["hosts"])), _esc(row["hostlist"]),
            _esc(_plural(row["count"], "host")), "".join(_html_cell(check, row["cells"].get(check)) for check in checks)))
    out.append("</tbody></table>")
    todo = [group for group in report["groups"] if group["status"] != "pass"]
    out.append('<h2>What to fix</h2><ol id="fix">')
    for group in todo:
        worst = worst_of(group["status"], group["fatal"])
        out.append('<li class="group status-%s%s" data-check="%s">%s <code>%s</code> <span class="msg">%s</span><br>'
                   '<span class="hostlist">%s</span> (%s)%s</li>' % (
                       _esc(group["status"]), " fatal" if group["fatal"] else "", _esc(group["check"]), _badge(worst),
                       _esc(group["check"]), _esc(group_message(group)), _esc(group["hostlist"]),
                       _esc(_plural(group["count"], "host")),
                       '<br>fix: <span class="fixtext">%s</span>' % _esc(group["fix"]) if group.get("fix") else ""))
    out.append("</ol>")
    if not todo:
        out.append('<p class="nothing">Nothing: every finding passes.</p>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --- JUnit XML --------------------------------------------------------------------------------------------------


def _xml_text(text):
    text = _XML_BAD_RE.sub(u"\ufffd", str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml_attr(text):
    return _xml_text(text).replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")


def _attrs(pairs):
    return "".join(' %s="%s"' % (key, _xml_attr(value)) for key, value in pairs)


def render_junit(report):
    """JUnit XML (the Jenkins xUnit ``junit-10.xsd`` shape): one ``testsuite`` per host, one ``testcase`` per finding.

    A fatal finding is a ``failure`` (type ``fatal``), a host that could not be checked an ``error``, a
    not-applicable finding ``skipped``; the other findings pass, their text in ``system-out``. The counts in the
    attributes are those of the elements written.
    """
    _check_report(report, "render_junit")
    kind = report["kind"]
    suites = []
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for index, entry in enumerate(report["hosts"]):
        host = entry["host"]
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        cases = []
        names = {}
        for item in entry["findings"]:
            name = "%s%s" % (item["check"], _gpu_text(item.get("gpu")))
            names[name] = names.get(name, 0) + 1
            if names[name] > 1:
                name = "%s (%d)" % (name, names[name])
            counts["tests"] += 1
            head = '    <testcase%s' % _attrs((("classname", "%s.%s" % (kind, host)), ("name", name), ("time", "0")))
            text = finding_text(item)
            label = "%s%s" % ("FATAL " if item["fatal"] else "", WORDS[item["status"]])
            if is_host_error(item):
                counts["errors"] += 1
                body = '<error%s>%s</error>' % (_attrs((("type", "unreachable"), ("message", item["message"]))), _xml_text(text))
            elif item["fatal"]:
                counts["failures"] += 1
                body = '<failure%s>%s</failure>' % (_attrs((("type", "fatal"), ("message", "%s: %s" % (item["status"], item["message"])))),
                                                    _xml_text(text))
            elif item["status"] == "not_applicable":
                counts["skipped"] += 1
                body = '<skipped%s/><system-out>%s</system-out>' % (_attrs((("message", item["message"]),)), _xml_text(text))
            else:
                body = '<system-out>%s</system-out>' % _xml_text("%s: %s" % (label, text))
            cases.append("%s>%s</testcase>" % (head, body))
        for key in total:
            total[key] += counts[key]
        suites.append('  <testsuite%s>' % _attrs((
            ("name", host), ("tests", counts["tests"]), ("failures", counts["failures"]), ("errors", counts["errors"]),
            ("skipped", counts["skipped"]), ("time", "0"), ("timestamp", report["generated_at"]), ("hostname", host),
            ("id", index), ("package", kind))))
        suites.append('    <properties><property%s/><property%s/></properties>' % (
            _attrs((("name", "worst"), ("value", entry["worst"]))),
            _attrs((("name", "error"), ("value", entry.get("error") or "")))))
        suites.extend(cases)
        suites.append("  </testsuite>")
    head = '<testsuites%s>' % _attrs((("name", report["title"]), ("tests", total["tests"]), ("failures", total["failures"]),
                                      ("errors", total["errors"]), ("time", "0")))
    return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', head] + suites + ["</testsuites>"]) + "\n"


# --- lines ------------------------------------------------------------------------------------------------------


def _one_line(text):
    return " ".join(str(text).split())


def render_lines(report, limit=10):
    """Lines for a debug summary: the gate text, hosts and findings by status, then the ``limit`` worst non-pass
    groups one per line, then ``... N more`` when some are left out."""
    _check_report(report, "render_lines")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise _fail("render_lines: limit is %r" % (limit,), limit, "a whole number, 0 or more")
    hosts = report["host_counts"]
    counts = report["counts"]
    lines = [
        report["gate_text"],
        "hosts by worst finding: %s" % ", ".join("%d %s" % (hosts.get(status, 0), WORDS[status]) for status in WORST_ORDER),
        "findings: %s" % ", ".join("%d %s" % (counts.get(status, 0), WORDS[status]) for status in WORST_ORDER),
    ]
    todo = [group for group in report["groups"] if group["status"] != "pass"]
    for group in todo[:limit]:
        lines.append("%s %s on %s (%s): %s%s" % (
            _group_label(group), group["check"], group["hostlist"], _plural(group["count"], "host"), _one_line(group_message(group)),
            "; fix: %s" % _one_line(group["fix"]) if group.get("fix") else ""))
    more = len(todo) - limit
    if more > 0:
        lines.append("... %d more finding group%s in the report" % (more, "" if more == 1 else "s"))
    return lines
