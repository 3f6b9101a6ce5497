# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests busbw judged: against minimums per message size (the gate) and across a sweep of one setting (pure).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. The input is nccl-tests output as ``_parse.nccl_tests`` parses it
(or the text, parsed here through it).

* ``compare_busbw(data, thresholds)`` checks measured busbw against
  ``{size_bytes: min_busbw_gbps}``.
* ``sweep_compare(labelled, baseline, sizes)`` puts several labelled runs (one
  per value of a swept setting, e.g. ``NCCL_IB_QPS_PER_CONNECTION``) side by
  side and recommends a label only when it beats the baseline by a margin at
  every named size; ``sweep_markdown(report)`` writes that comparison as the
  sweep playbook's Markdown page.

Sizes are bytes (int; ``parse_size`` reads ``1G``/``512M`` as nccl-tests
reads ``-b``/``-e``), busbw in GB/s (10^9 bytes per second), floats.
"""

from __future__ import annotations

import math
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.nccl_tests import (
    PLACEMENTS,
    NcclTestsError,
    collective_name,
    parse_nccl_tests,
    snippet,
)

AGGREGATES = ("min", "max", "mean", "median")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(value, what="size"):
    """Bytes as an int from an int or a string: ``1073741824``, ``"1073741824"``, ``"1G"``, ``"512M"``, ``"64KiB"``.

    Suffixes are powers of 1024, as nccl-tests reads ``-b``/``-e``.
    """
    if isinstance(value, bool):
        raise NcclTestsError("%s %r is not a size" % (what, value), value=value, expected="a size in bytes such as 1073741824 or 1G")
    if isinstance(value, int):
        if value < 0:
            raise NcclTestsError("%s %r is negative" % (what, value), value=value, expected="a size in bytes >= 0")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise NcclTestsError("%s %r is not a size" % (what, value), value=value, expected="a size in bytes such as 1073741824, or 1G / 512M / 64K")
    number = float(match.group(1))
    scaled = number * (1024 ** " KMGT".index(match.group(2).upper() or " "))
    if not scaled.is_integer():
        raise NcclTestsError("%s %r is not a whole number of bytes" % (what, value), value=value, expected="a whole number of bytes")
    return int(scaled)


def _number(value, what, expected="a number of GB/s >= 0"):
    if isinstance(value, bool):
        raise NcclTestsError("%s %r is not a number" % (what, value), value=value, expected=expected)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise NcclTestsError("%s %r is not a number" % (what, value), value=value, expected=expected) from None
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise NcclTestsError("%s %r is not a finite number >= 0" % (what, value), value=value, expected=expected)
    return number


# ---------------------------------------------------------------- compare


def _as_runs(data, what="data"):
    """Runs from parse output, one run, a list of either, or the raw text."""
    if isinstance(data, (str, bytes)):
        return parse_nccl_tests(data)["runs"]
    if isinstance(data, dict):
        if isinstance(data.get("runs"), list):
            return list(data["runs"])
        if isinstance(data.get("rows"), list):
            return [data]
    if isinstance(data, (list, tuple)):
        runs = []
        for item in data:
            runs.extend(_as_runs(item, what))
        return runs
    raise NcclTestsError(
        "%s is not nccl-tests output: got %s" % (what, type(data).__name__), value=snippet(data),
        expected="the text, the result of parse_nccl_tests, one of its runs, or a list of those",
    )


def _select_runs(runs, test, what):
    with_rows = [run for run in runs if run.get("rows")]
    if test is not None:
        wanted = collective_name(test)
        chosen = [run for run in with_rows if run.get("collective") == wanted or run.get("test") == test]
        if not chosen:
            found = sorted(set(str(run.get("collective")) for run in with_rows))
            raise NcclTestsError("%s has no %s run with rows (runs: %s)" % (what, test, ", ".join(found) or "none"),
                                 value=test, expected="one of: %s" % (", ".join(found) or "a run with rows"))
        return chosen
    if not with_rows:
        raise NcclTestsError("%s has no run with rows" % what, value=len(runs), expected="at least one nccl-tests table with rows")
    names = sorted(set(str(run.get("collective")) for run in with_rows))
    if len(names) > 1:
        raise NcclTestsError("%s has runs of several tests (%s): name one with test=" % (what, ", ".join(names)),
                             value=names, expected="test= one of %s" % ", ".join(names))
    return with_rows


def _aggregate(values, how):
    values = sorted(values)
    if how == "min":
        return values[0]
    if how == "max":
        return values[-1]
    if how == "mean":
        return sum(values) / len(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2.0


def _check_choice(value, choices, what):
    if value not in choices:
        raise NcclTestsError("%s %r is not one of %s" % (what, value, ", ".join(choices)), value=value, expected="one of %s" % ", ".join(choices))


def busbw_by_size(data, placement="out_of_place", test=None, datatype=None, redop=None, aggregate="min", what="data"):
    """``{size: {"busbw_gbps", "samples_gbps", "type", "redop", "runs"}}`` over the rows of the chosen runs.

    Rows of the same size from several runs (repeats) or cycles are
    aggregated (``min`` ``max`` ``mean`` ``median``); rows of one size with
    different data types or reduction ops need ``datatype``/``redop``.
    """
    _check_choice(placement, PLACEMENTS, "placement")
    _check_choice(aggregate, AGGREGATES, "aggregate")
    runs = _select_runs(_as_runs(data, what), test, what)
    by_size = {}
    for run in runs:
        for row in run["rows"]:
            if datatype is not None and row.get("type") != datatype:
                continue
            if redop is not None and row.get("redop") != redop:
                continue
            entry = by_size.setdefault(row["size"], {"rows": [], "runs": []})
            entry["rows"].append(row)
            if run["index"] not in entry["runs"]:
                entry["runs"].append(run["index"])
    result = {}
    for size in sorted(by_size):
        rows = by_size[size]["rows"]
        kinds = sorted(set((str(row.get("type")), str(row.get("redop"))) for row in rows))
        if len(kinds) > 1:
            raise NcclTestsError(
                "%s has rows of size %d with several data types / reduction ops (%s): choose with datatype= and redop=" % (
                    what, size, ", ".join("/".join(kind) for kind in kinds)),
                value=size, expected="datatype= and redop= naming one of %s" % ", ".join("/".join(kind) for kind in kinds),
            )
        halves = [row.get(placement) for row in rows]
        if any(half is None for half in halves):
            raise NcclTestsError("%s has no %s measurement at size %d (the table has only out-of-place columns)" % (what, placement, size),
                                 value=placement, expected="out_of_place")
        samples = [half["busbw_gbps"] for half in halves]
        result[size] = {
            "busbw_gbps": _aggregate(samples, aggregate),
            "samples_gbps": samples,
            "type": rows[0].get("type"),
            "redop": rows[0].get("redop"),
            "runs": by_size[size]["runs"],
        }
    return result


def _thresholds(thresholds):
    if not isinstance(thresholds, dict) or not thresholds:
        raise NcclTestsError("thresholds must be a non-empty mapping of size to minimum busbw, got %s" % snippet(thresholds),
                             value=snippet(thresholds), expected="{size_bytes: min_busbw_gbps}, e.g. {1073741824: 180}")
    parsed = {}
    for key, value in thresholds.items():
        size = parse_size(key, "threshold size")
        parsed[size] = _number(value, "minimum busbw for size %s" % key)
    return parsed


def compare_busbw(data, thresholds, placement="out_of_place", test=None, datatype=None, redop=None, aggregate="min"):
    """Pass/fail per size of ``thresholds`` (``{size_bytes: min_busbw_gbps}``) against the measured busbw.

    ``data`` is the text, ``parse_nccl_tests`` output, one run or a list of
    runs; ``test`` picks the runs of one collective when the log has several.
    Several samples of a size (repeats) are reduced with ``aggregate`` (the
    worst, ``min``, by default). A size the runs have no row of raises
    ``NcclTestsError`` naming it.
    """
    wanted = _thresholds(thresholds)
    measured = busbw_by_size(data, placement, test, datatype, redop, aggregate)
    results = []
    for size in sorted(wanted):
        if size not in measured:
            raise NcclTestsError(
                "no row of size %d bytes in the nccl-tests runs (sizes measured: %s)" % (size, ", ".join(str(s) for s in sorted(measured))),
                value=size, expected="one of the measured sizes: %s" % ", ".join(str(s) for s in sorted(measured)),
            )
        got = measured[size]
        results.append({
            "size": size,
            "min_busbw_gbps": wanted[size],
            "busbw_gbps": got["busbw_gbps"],
            "samples_gbps": got["samples_gbps"],
            "type": got["type"],
            "redop": got["redop"],
            "passed": got["busbw_gbps"] >= wanted[size],
        })
    failed = [entry["size"] for entry in results if not entry["passed"]]
    runs = sorted(set(index for size in wanted for index in measured[size]["runs"]))
    return {
        "passed": not failed,
        "placement": placement,
        "aggregate": aggregate,
        "test": collective_name(test),
        "runs": runs,
        "results": results,
        "failed_sizes": failed,
        "summary": "%d of %d sizes meet their minimum busbw (%s)" % (len(results) - len(failed), len(results), placement.replace("_", "-")),
    }


# ---------------------------------------------------------------- sweep


def _labelled(labelled):
    if isinstance(labelled, dict):
        items = list(labelled.items())
    elif isinstance(labelled, (list, tuple)) and all(isinstance(item, (list, tuple)) and len(item) == 2 for item in labelled):
        items = [tuple(item) for item in labelled]
    else:
        raise NcclTestsError("labelled runs must be a mapping of label to nccl-tests output, got %s" % type(labelled).__name__,
                             value=snippet(labelled), expected="{label: text, parse result, run or list of runs}")
    if not items:
        raise NcclTestsError("labelled runs are empty", value=labelled, expected="at least the baseline label")
    labels = [str(label) for label, dummy in items]
    if len(set(labels)) != len(labels):
        raise NcclTestsError("labels repeat: %s" % ", ".join(labels), value=labels, expected="distinct labels")
    return [(str(label), data) for label, data in items]


def _pct(value, base):
    if base == 0:
        return None
    return (value - base) / base * 100.0


def _fmt_pct(value):
    return "n/a" if value is None else "%+.1f%%" % value


def _named_sizes(measured, labels, baseline, sizes):
    """The sizes a recommendation is judged at: ``sizes`` parsed, else the sizes every label measured; each must be
    one the baseline measured."""
    if sizes is None:
        common = set(measured[labels[0]])
        for label in labels[1:]:
            common &= set(measured[label])
        if not common:
            raise NcclTestsError("the labels have no message size in common", value=labels, expected="runs that measured the same sizes")
        named = sorted(common)
    else:
        if isinstance(sizes, (str, int)):
            sizes = [sizes]
        named = sorted(set(parse_size(size) for size in sizes))
        if not named:
            raise NcclTestsError("sizes is empty", value=sizes, expected="at least one message size")
    for size in named:
        if size not in measured[baseline]:
            raise NcclTestsError(
                "baseline %r has no row of size %d bytes (sizes measured: %s)" % (
                    baseline, size, ", ".join(str(s) for s in sorted(measured[baseline]))),
                value=size, expected="one of the baseline's sizes: %s" % ", ".join(str(s) for s in sorted(measured[baseline])),
            )
    return named


def _candidate(mine, base_rows, named, margin):
    """Whether a label (its rows ``mine`` by size) beats the baseline's (``base_rows``) by ``margin`` percent at every
    named size, its smallest gain and where, and why."""
    worst, why, ok = None, None, True
    for size in named:
        got = mine.get(size)
        if got is None:
            ok, why = False, "no row of size %d" % size
            worst = (size, None)
            break
        base = base_rows[size]["busbw_gbps"]
        gain = _pct(got["busbw_gbps"], base)
        beats = got["busbw_gbps"] > 0 if gain is None else gain >= margin
        if worst is None or (gain is not None and (worst[1] is None or gain < worst[1])):
            worst = (size, gain)
        if not beats and ok:
            ok, why = False, "%s at %d B (needs %+.1f%%)" % (_fmt_pct(gain), size, margin)
    if ok:
        why = "at least %+.1f%% at every named size (smallest %s at %d B)" % (margin, _fmt_pct(worst[1]), worst[0])
    return {
        "qualifies": ok,
        "min_gain_pct": None if worst is None else worst[1],
        "worst_size": None if worst is None else worst[0],
        "why": why,
    }


def sweep_compare(labelled, baseline, sizes=None, margin_pct=5.0, placement="out_of_place", test=None, datatype=None, redop=None,
                  aggregate="median"):
    """Side by side busbw per size for several labelled runs, and a recommendation.

    ``labelled`` maps a label (``"qps_1"``, ``4``...) to that setting's runs
    (text, parse result, run or list of runs; repeats are reduced with
    ``aggregate``, the median by default). A label is recommended only when
    its busbw beats the ``baseline`` label's by at least ``margin_pct`` percent
    at every size of ``sizes`` (default: the sizes every label measured);
    among several such labels the one with the largest smallest gain wins.
    Otherwise the baseline is recommended and ``reason`` says why each label
    fell short.
    """
    items = _labelled(labelled)
    baseline = str(baseline)
    labels = [label for label, dummy in items]
    if baseline not in labels:
        raise NcclTestsError("baseline %r is not one of the labels (%s)" % (baseline, ", ".join(labels)), value=baseline,
                             expected="one of %s" % ", ".join(labels))
    margin = _number(margin_pct, "margin_pct", "a percentage >= 0, e.g. 5")
    measured = {}
    for label, data in items:
        measured[label] = busbw_by_size(data, placement, test, datatype, redop, aggregate, what="label %r" % label)
    named = _named_sizes(measured, labels, baseline, sizes)
    all_sizes = sorted(set(size for label in labels for size in measured[label]))
    table = []
    for size in all_sizes:
        base = measured[baseline].get(size)
        row = {"size": size, "named": size in named, "busbw_gbps": {}, "gain_pct": {}}
        for label in labels:
            got = measured[label].get(size)
            row["busbw_gbps"][label] = None if got is None else got["busbw_gbps"]
            row["gain_pct"][label] = None if got is None or base is None else _pct(got["busbw_gbps"], base["busbw_gbps"])
        table.append(row)
    candidates = {}
    for label in labels:
        if label == baseline:
            continue
        candidates[label] = _candidate(measured[label], measured[baseline], named, margin)
    winners = [label for label in labels if candidates.get(label, {}).get("qualifies")]
    if winners:
        best = max(winners, key=lambda label: (float("inf") if candidates[label]["min_gain_pct"] is None else candidates[label]["min_gain_pct"],
                                               -labels.index(label)))
        recommended = best
        reason = "%s beats baseline %s by at least %.1f%% at every named size (smallest gain %s at %d B)" % (
            best, baseline, margin, _fmt_pct(candidates[best]["min_gain_pct"]), candidates[best]["worst_size"])
    else:
        recommended = baseline
        if candidates:
            reason = "keep baseline %s: no label beats it by %+.1f%% at every named size (%s)" % (
                baseline, margin, "; ".join("%s: %s" % (label, candidates[label]["why"]) for label in labels if label in candidates))
        else:
            reason = "keep baseline %s: it is the only label" % baseline
    return {
        "recommended": recommended,
        "baseline": baseline,
        "changed": recommended != baseline,
        "reason": reason,
        "margin_pct": margin,
        "placement": placement,
        "aggregate": aggregate,
        "labels": labels,
        "sizes": named,
        "table": table,
        "candidates": candidates,
    }


def sweep_markdown(report):
    """The Markdown page of a sweep: :func:`sweep_compare`'s result with the playbook's ``variable``, ``host``,
    ``mode`` and ``test`` added. busbw in GB/s per size and label, the gain over the baseline in brackets, the sizes
    the recommendation is judged at marked ``*``, then the recommendation and its reason."""
    need = ("variable", "host", "mode", "labels", "baseline", "placement", "aggregate", "margin_pct", "table",
            "recommended", "changed", "reason")
    missing = [key for key in need if not isinstance(report, dict) or key not in report]
    if missing:
        raise NcclTestsError("sweep report lacks %s: expected nccl_tests_sweep's result with variable, host and mode "
                             "added" % ", ".join(missing), value=sorted(report) if isinstance(report, dict) else report,
                             expected="a sweep report with %s" % ", ".join(need))
    labels, baseline = list(report["labels"]), report["baseline"]
    lines = [
        "# %s sweep on %s" % (report["variable"], report["host"]),
        "",
        "%s, %s busbw in GB/s per value of %s (%s of the repeats; gain over baseline %s in brackets), %s runs. "
        "Sizes marked * are those the recommendation is judged at (margin %s %%)." % (
            report.get("test") or "nccl-tests", str(report["placement"]).replace("_", "-"), report["variable"],
            report["aggregate"], baseline, report["mode"], report["margin_pct"]),
        "",
        "| size (bytes) |%s" % "".join(" %s |" % label for label in labels),
        "|---:|" + "---:|" * len(labels),
    ]
    for row in report["table"]:
        cells = []
        for label in labels:
            busbw, gain = row["busbw_gbps"][label], row["gain_pct"][label]
            cells.append(" %s%s |" % ("-" if busbw is None else busbw,
                                      "" if gain is None or label == baseline else " (%+.1f%%)" % gain))
        lines.append("| %s%s |%s" % (row["size"], " *" if row["named"] else "", "".join(cells)))
    lines += [
        "",
        "**Recommendation:** `%s=%s` (%s)." % (report["variable"], report["recommended"],
                                               "change from %s" % baseline if report["changed"] else "keep the baseline"),
        "",
        str(report["reason"]),
    ]
    return "\n".join(lines) + "\n"
