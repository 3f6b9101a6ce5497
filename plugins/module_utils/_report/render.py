# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The four renderings of a cluster report: Markdown, self-contained HTML, JUnit XML and the lines of a summary.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Each renderer takes the dict :func:`_report.cluster.build_report`
returns (its keys are checked first) and gives text; nothing here decides a
status, a row or a group. Every value of the report is escaped for its format
(Markdown table cells, HTML, XML 1.0 with the characters it cannot hold
replaced), so a message cannot break the page.

The pieces every report of the collection is written with live here too, once:
the Markdown escape, heading, section, table and list item (``md_*``), the HTML
escape, badge, header row and page frame (``html_*``). The cluster report
(preflight, drift) and the diagnose report (``_report.diagnose``) both use them.

Bad input raises :class:`_report.cluster.ClusterReportError` naming the value
and what was expected.
"""

from __future__ import annotations

import html
import json
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import (
    REPORT_KEYS,
    WORDS,
    WORST_ORDER,
    counted,
    is_host_error,
    report_error,
    worst_of,
)

SHORT = {"fatal": "FATAL", "fail": "FAIL", "warn": "WARN", "unknown": "?", "not_applicable": "N/A", "pass": "PASS"}
# Characters XML 1.0 does not allow, even escaped.
_XML_BAD_RE = re.compile(u"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _check_report(report, who):
    if not isinstance(report, dict):
        raise report_error("%s takes a report dict, got %s" % (who, type(report).__name__), report, "the dict build_report returns")
    missing = [key for key in REPORT_KEYS if key not in report]
    if missing:
        raise report_error("%s: the report lacks %s" % (who, ", ".join(missing)), sorted(report), "the dict build_report returns",
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


# --- the shared pieces: Markdown -------------------------------------------------------------------------------


def md_escape(text):
    """Text for a Markdown table cell or list item: backslash, pipe and ``<`` escaped, line breaks as spaces."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").replace("\r", " ").replace("\n", " ")


def md_heading(text, level=1):
    """``# text`` (``level`` hashes), the text escaped."""
    return "%s %s" % ("#" * level, md_escape(text))


def md_section(title, level=2):
    """The lines that open a section: a blank line, the heading, a blank line."""
    return ["", md_heading(title, level), ""]


def _md_row(cells):
    return "| %s |" % " | ".join(md_escape(cell) for cell in cells)


def md_table(header, rows):
    """A Markdown table: the header row, its rule, then one line per row; every cell escaped (:func:`md_escape`)."""
    return [_md_row(header), "|%s" % ("---|" * len(header))] + [_md_row(row) for row in rows]


def md_item(text, label="", depth=0):
    """A list item ``- <label><text>``, ``depth`` levels in; ``text`` escaped, ``label`` (Markdown) as given."""
    return "%s- %s%s" % ("  " * depth, label, md_escape(text))


# --- the shared pieces: HTML -----------------------------------------------------------------------------------

# The first rule of every page's style sheet.
BASE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}"""


def html_escape(text):
    """Text for HTML content or a quoted attribute."""
    return html.escape(str(text), quote=True)


def html_badge(css_class, text):
    """``<span class="badge CLASS">TEXT</span>``."""
    return '<span class="badge %s">%s</span>' % (html_escape(css_class), html_escape(text))


def html_header_row(names):
    """``<tr><th>..</th>..</tr>``, the names escaped."""
    return "<tr>%s</tr>" % "".join("<th>%s</th>" % html_escape(name) for name in names)


def html_page_open(title, css, viewport=True):
    """The lines that open a self-contained page: doctype, head (charset, ``viewport``, title, :data:`BASE_CSS`
    then ``css`` inline), body, the title as ``h1``."""
    return (["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">']
            + (['<meta name="viewport" content="width=device-width, initial-scale=1">'] if viewport else [])
            + ["<title>%s</title>" % html_escape(title), "<style>%s%s</style></head><body>" % (BASE_CSS, css),
               "<h1>%s</h1>" % html_escape(title)])


def html_page_close(out):
    """The page of lines ``out`` (from :func:`html_page_open` on), closed."""
    return "\n".join(list(out) + ["</body></html>"]) + "\n"


# --- Markdown ---------------------------------------------------------------------------------------------------


def _group_label(group):
    return "%s%s" % ("FATAL " if group["fatal"] else "", SHORT[group["status"]])


def group_message(group):
    """A group's first message, and how many other distinct messages its hosts gave (their own numbers)."""
    others = group.get("distinct", 1) - 1
    return group["message"] + (" (and %d other message%s)" % (others, "" if others == 1 else "s") if others > 0 else "")


def render_markdown(report):
    """Markdown: title, gate line, counts, "What to fix" (the non-pass groups), then one table row per row of hosts."""
    _check_report(report, "render_markdown")
    lines = [md_heading(report["title"]), "", "**%s**" % md_escape(report["gate_text"]), "",
             "Generated %s (%s report)." % (md_escape(report["generated_at"]), md_escape(report["kind"])), ""]
    lines += md_table(("status", "hosts (by worst finding)", "findings"),
                      [(SHORT[status], report["host_counts"].get(status, 0), report["counts"].get(status, 0))
                       for status in WORST_ORDER] + [("all", report["counts"]["hosts"], report["counts"].get("findings", 0))])
    lines += md_section("What to fix")
    todo = [group for group in report["groups"] if group["status"] != "pass"]
    if not todo:
        lines.append("Nothing: every finding passes.")
    for group in todo:
        label = "**%s** `%s`: " % (_group_label(group), md_escape(group["check"]).replace("`", "'"))
        lines.append(md_item(group_message(group), label))
        lines.append(md_item(group["hostlist"], "hosts (%d): " % group["count"], depth=1))
        if group.get("fix"):
            lines.append(md_item(group["fix"], "fix: ", depth=1))
    checks = report["checks"]
    lines += md_section("Hosts, worst first")
    lines += ["Hosts whose findings are identical share a row. %s; - is a check the hosts did not report." %
              ", ".join("%s %s" % (SHORT[status], WORDS[status]) for status in WORST_ORDER), ""]
    lines += md_table(["hosts", "count", "worst"] + list(checks), [_grid_row(row, checks) for row in report["rows"]])
    return "\n".join(lines) + "\n"


def _grid_row(row, checks):
    """A row of hosts as the cells of the Markdown grid: hosts, count, worst, then each check's worst or -."""
    cells = ["-" if row["cells"].get(check) is None else SHORT[_cell_worst(row["cells"][check])] for check in checks]
    return [row["hostlist"], row["count"], SHORT[row["worst"]]] + cells


# --- HTML -------------------------------------------------------------------------------------------------------

_CSS = """
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


_esc = html_escape


def _badge(worst):
    return html_badge("status-%s" % worst, SHORT[worst])


def _html_cell(check, cell):
    if cell is None:
        return '<td class="cell status-none" data-check="%s" title="%s: not reported">-</td>' % (_esc(check), _esc(check))
    classes = "cell status-%s%s" % (cell["status"], " fatal" if cell["fatal"] else "")
    title = "%s: %s%s (%s)\n%s" % (check, "FATAL " if cell["fatal"] else "", WORDS[cell["status"]],
                                   counted(cell["count"], "finding"), "\n".join(cell["messages"]))
    return '<td class="%s" data-check="%s" data-status="%s" title="%s">%s</td>' % (
        _esc(classes), _esc(check), _esc(cell["status"]), _esc(title), _esc(SHORT[_cell_worst(cell)]))


def render_html(report):
    """One self-contained HTML page: gate banner ``#gate`` (class ``go``/``no-go``), a legend, counts, the grid
    ``table#grid`` (one ``tr.row`` per row of hosts, one cell per check with class ``status-<status>`` and
    ``fatal``, the messages in its ``title``), then "What to fix". Inline CSS, no script, no external fetch."""
    _check_report(report, "render_html")
    checks = report["checks"]
    gate_class = "no-go" if report["gate"] == "no_go" else "go"
    out = html_page_open(report["title"], _CSS) + [
        '<div id="gate" class="%s" role="status" data-gate="%s">%s</div>' % (
            gate_class, _esc(report["gate"]), _esc(report["gate_text"])),
        '<p class="generated">Generated %s (%s report), %s, %s.</p>' % (
            _esc(report["generated_at"]), _esc(report["kind"]), _esc(counted(report["counts"]["hosts"], "host")),
            _esc(counted(report["counts"].get("findings", 0), "finding"))),
        '<div class="legend" id="legend"><strong>Legend.</strong> One row per set of hosts whose findings are '
        "identical, worst first; one column per check; hover a cell for its messages.",
    ]
    for status in WORST_ORDER:
        out.append("%s %s" % (_badge(status), _esc("a fatal finding: it stops the gate" if status == "fatal" else WORDS[status])))
    out.append('<span class="badge status-none">-</span> not reported by these hosts.</div>')
    out.append('<table class="counts" id="counts">%s' % html_header_row(("status", "hosts (by worst finding)", "findings")))
    for status in WORST_ORDER:
        out.append('<tr data-status="%s"><td>%s</td><td class="n">%d</td><td class="n">%d</td></tr>' % (
            status, _badge(status), report["host_counts"].get(status, 0), report["counts"].get(status, 0)))
    out.append("</table>")
    out.append('<h2>Hosts, worst first</h2><table id="grid"><thead><tr><th>hosts</th>%s</tr></thead><tbody>' % "".join(
        '<th class="check" scope="col">%s</th>' % _esc(check) for check in checks))
    for row in report["rows"]:
        out.append('<tr class="row" data-worst="%s" data-count="%d"><td class="hosts" title="%s">%s<span class="count">(%s)</span></td>%s</tr>' % (
            _esc(row["worst"]), row["count"], _esc(", ".join(row["hosts"])), _esc(row["hostlist"]),
            _esc(counted(row["count"], "host")), "".join(_html_cell(check, row["cells"].get(check)) for check in checks)))
    out.append("</tbody></table>")
    todo = [group for group in report["groups"] if group["status"] != "pass"]
    out.append('<h2>What to fix</h2><ol id="fix">')
    for group in todo:
        worst = worst_of(group["status"], group["fatal"])
        out.append('<li class="group status-%s%s" data-check="%s">%s <code>%s</code> <span class="msg">%s</span><br>'
                   '<span class="hostlist">%s</span> (%s)%s</li>' % (
                       _esc(group["status"]), " fatal" if group["fatal"] else "", _esc(group["check"]), _badge(worst),
                       _esc(group["check"]), _esc(group_message(group)), _esc(group["hostlist"]),
                       _esc(counted(group["count"], "host")),
                       '<br>fix: <span class="fixtext">%s</span>' % _esc(group["fix"]) if group.get("fix") else ""))
    out.append("</ol>")
    if not todo:
        out.append('<p class="nothing">Nothing: every finding passes.</p>')
    return html_page_close(out)


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
        raise report_error("render_lines: limit is %r" % (limit,), limit, "a whole number, 0 or more")
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
            _group_label(group), group["check"], group["hostlist"], counted(group["count"], "host"), _one_line(group_message(group)),
            "; fix: %s" % _one_line(group["fix"]) if group.get("fix") else ""))
    more = len(todo) - limit
    if more > 0:
        lines.append("... %d more finding group%s in the report" % (more, "" if more == 1 else "s"))
    return lines
