# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One cluster report from per-host findings: the builder, its input checks and its rules.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Used by the preflight gate and the drift report; its four renderings
(Markdown, HTML, JUnit XML, lines) are ``_report.render``.

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

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse import hostlist as _hostlist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import FATAL_STATUSES, STATUSES

# Worst first; "fatal" is a fatal finding of any status.
WORST_ORDER = ("fatal", "fail", "warn", "unknown", "not_applicable", "pass")
_RANK = dict((name, rank) for rank, name in enumerate(WORST_ORDER))
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


class ClusterReportError(DetailedError):
    """Bad input to the report builder or a renderer; ``details`` name the ``host``, the ``value`` and what was ``expected``."""


def report_error(message, value, expected, **details):
    """The :class:`ClusterReportError` of a bad input: ``message``, then what was ``expected``."""
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
        raise report_error("%s%s is %r" % (where, what, value), value, expected, host=host)
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
    raise report_error("host %r: finding %d has gpu %r" % (host, index, value), value,
                       "a GPU index or PCI bus id (00000000:01:00.0), a list of them, or null", host=host, key="gpu")


def _check_finding(host, index, item):
    """A copy of one finding with its types checked."""
    if not isinstance(item, dict):
        raise report_error("host %r: finding %d is of type %s, not a dict" % (host, index, type(item).__name__), item,
                           "a dict with keys %s" % ", ".join(FINDING_KEYS), host=host)
    missing = [key for key in FINDING_KEYS if key not in item]
    if missing:
        raise report_error("host %r: finding %d (%r) lacks %s" % (host, index, item.get("check"), ", ".join(missing)), item,
                           "a dict with keys %s" % ", ".join(FINDING_KEYS), host=host, missing=missing)
    out = dict(item)
    out["check"] = _check_text(item["check"], "a finding's check", "a non-empty check id string such as 'gpu:row_remap'",
                               host, allow_empty=False)
    status = item["status"]
    if not isinstance(status, str) or status not in STATUSES:
        raise report_error("host %r: finding %r has status %r" % (host, out["check"], status), status,
                           "one of %s" % ", ".join(STATUSES), host=host, check=out["check"])
    out["status"] = str(status)
    out["message"] = _check_text(item["message"], "the message of finding %r" % out["check"], "a string", host)
    out["fix"] = _check_text(item["fix"], "the fix of finding %r" % out["check"], "a string or null", host, allow_none=True)
    fatal = item["fatal"]
    if not isinstance(fatal, bool):
        raise report_error("host %r: finding %r has fatal %r" % (host, out["check"], fatal), fatal, "true or false", host=host,
                           check=out["check"])
    if fatal and status not in FATAL_STATUSES:
        raise report_error("host %r: finding %r is fatal with status %r" % (host, out["check"], status), status,
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
        raise report_error("host name %r" % (name,), name, "a non-empty host name string", host=name)
    if not isinstance(data, dict):
        raise report_error("host %r: its entry is of type %s, not a dict" % (name, type(data).__name__), data,
                           "a dict {findings: [...], error: null or a string}", host=name)
    unknown = sorted(str(key) for key in data if key not in HOST_KEYS)
    if unknown:
        raise report_error("host %r: unknown key %s" % (name, ", ".join(unknown)), unknown, "only the keys findings and error",
                           host=name)
    error = data.get("error")
    if error is not None and (not isinstance(error, str) or not error.strip()):
        raise report_error("host %r: error is %r" % (name, error), error, "null or a non-empty string saying why the host could not be checked",
                           host=name)
    if "findings" not in data and error is None:
        raise report_error("host %r has neither findings nor an error" % name, data, "a dict {findings: [...], error: null or a string}",
                           host=name)
    findings = data.get("findings")
    if findings is None and error is not None:
        findings = []
    if not isinstance(findings, (list, tuple)):
        raise report_error("host %r: findings is of type %s, not a list" % (name, type(findings).__name__), findings,
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
        raise report_error("gate_labels is %r" % (gate_labels,), gate_labels, "a dict {go: TEXT, no_go: TEXT}")
    labels = dict(DEFAULT_GATE_LABELS)
    for key, value in gate_labels.items():
        if key not in GATES:
            raise report_error("gate_labels has the key %r" % (key,), key, "only the keys go and no_go")
        labels[key] = _check_text(value, "gate_labels[%r]" % key, "a non-empty string", allow_empty=False)
    return labels


def counted(count, word, plural=None):
    """``1 host``, ``2 hosts`` (``plural`` when the word does not take an s)."""
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
        return "%s: %s on %d of %s%s" % (labels["no_go"], counted(counts["fatal"], "fatal finding"), fatal_hosts,
                                         counted(counts["hosts"], "host"), _others(counts))
    return "%s: no fatal finding on %s%s" % (labels["go"], counted(counts["hosts"], "host"), _others(counts, True))


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
        raise report_error("hosts is of type %s, not a dict" % type(hosts).__name__, hosts,
                           "a dict {host: {findings: [...], error: null or a string}}")
    if not hosts:
        raise report_error("hosts is empty: there is nothing to report on, and no gate passes on no host", hosts,
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
