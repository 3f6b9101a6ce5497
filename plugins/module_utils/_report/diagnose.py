# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The diagnose report: each host's softnet verdict with its evidence, collected and rendered.

Private module_utils of gpunode.tuning, standard library only; runs on the controller (the diagnose_* filters are
thin wrappers). ``diagnose_collect(results, generated_at)`` turns ``{host: {"softnet": <softnet_check result>,
"nic": <nic_irq_facts result>}}`` into one report dict, hosts worst first; ``diagnose_markdown``,
``diagnose_html``, ``diagnose_summary`` and ``diagnose_lines`` render it. They are written with the pieces the
cluster report (preflight, drift) is written with: ``_report.render``'s Markdown escape, headings, sections, tables
and list items, its HTML escape, badges, header rows and page frame, and ``_report.cluster.counted``; what is left
here is what only this report shows (the verdict rules, the facts under a host, the strip of per-CPU cells).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import counted
from ansible_collections.gpunode.tuning.plugins.module_utils._report.render import (
    html_badge,
    html_escape,
    html_header_row,
    html_page_close,
    html_page_open,
    md_escape,
    md_heading,
    md_item,
    md_section,
    md_table,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    RULES,
    describe_findings,
    describe_rules,
    format_number,
)


class DiagnoseReportError(DetailedError):
    """Input that is not the diagnose play's results."""


# Worst first. "failed" (the check did not run or failed) sorts before
# inconclusive: a person must look at it. "idle" (no user work, no traffic:
# nothing could be judged) sorts before no_contention: run it again under load.
VERDICT_ORDER = ("contention", "failed", "inconclusive", "idle", "no_contention")
VERDICT_TEXT = {
    "contention": "contention",
    "failed": "check failed",
    "inconclusive": "inconclusive",
    "idle": "idle",
    "no_contention": "no contention",
}


def _num(value, digits=1):
    return format_number(value, digits, unknown="?")


def _cpulist(cpus):
    return format_cpulist(sorted(set(cpus or [])))


def _host_entry(name, data):
    data = data or {}
    softnet = data.get("softnet") or {}
    nic = data.get("nic") or {}
    failed = bool(softnet.get("failed")) or not softnet.get("verdict")
    if failed:
        message = softnet.get("msg") or "softnet_check returned no result"
        verdict = "failed"
        reasons = [message]
    else:
        verdict = softnet["verdict"]
        reasons = list(softnet.get("reasons") or [])
    link = softnet.get("link") or {}
    totals = softnet.get("totals") or {}
    return {
        "host": name,
        "verdict": verdict,
        "verdict_rule": None if failed else softnet.get("verdict_rule"),
        "reasons": reasons,
        "interface": softnet.get("interface") or nic.get("interface"),
        "pci_address": softnet.get("pci_address") or nic.get("pci_address"),
        "driver": softnet.get("driver") or nic.get("driver"),
        "irq_cpus": list(softnet.get("irq_cpus") or []),
        "irq_cpus_source": softnet.get("irq_cpus_source"),
        "irq_cpus_affinity": softnet.get("irq_cpus_affinity"),
        "findings": list(softnet.get("findings") or []),
        "hot_cpus": list(softnet.get("hot_cpus") or []),
        "non_irq_squeeze_cpus": list(softnet.get("non_irq_squeeze_cpus") or []),
        "interval": softnet.get("interval"),
        "squeeze_irq_per_10s": totals.get("time_squeeze_irq_cpus_per_10s"),
        "squeeze_all_per_10s": totals.get("time_squeeze_per_10s"),
        "link_util_pct": link.get("utilisation_pct"),
        "link_speed_mbps": link.get("speed_mbps"),
        "rx_mbps": link.get("rx_mbps"),
        "tx_mbps": link.get("tx_mbps"),
        "cpus": list(softnet.get("cpus") or []),
        "notes": list(softnet.get("notes") or []),
        "softnet": softnet,
        "nic": nic,
    }


def _sort_key(entry):
    rank = VERDICT_ORDER.index(entry["verdict"]) if entry["verdict"] in VERDICT_ORDER else len(VERDICT_ORDER)
    return (rank, -(entry["squeeze_irq_per_10s"] or 0), entry["host"])


def _rules(hosts):
    """softnet_check's verdict table, quoting the thresholds the hosts used.

    Every host that was checked reports its thresholds; when they all agree (or no host was checked: the
    defaults) the conditions quote those numbers, otherwise the option names, and ``thresholds`` is None.
    """
    used = []
    for entry in hosts:
        given = entry["softnet"].get("thresholds") or {}
        limits = dict((key, given[key]) for key in DEFAULT_THRESHOLDS if given.get(key) is not None)
        if entry["verdict"] != "failed" and limits and limits not in used:
            used.append(limits)
    if len(used) > 1:
        return {"thresholds": None, "rules": describe_rules(placeholder="%s"),
                "findings": describe_findings(placeholder="%s")}
    thresholds = dict(DEFAULT_THRESHOLDS, **(used[0] if used else {}))
    return {"thresholds": thresholds, "rules": describe_rules(thresholds), "findings": describe_findings(thresholds)}


def _rule_number(name):
    """1-based position of a verdict rule in softnet_check's table, or None."""
    names = [rule.name for rule in RULES]
    return names.index(name) + 1 if name in names else None


def diagnose_collect(results, generated_at=""):
    """One report from per-host results, hosts worst first (contention, failed, inconclusive, idle, no contention;
    then more squeezes first; then by name), with softnet_check's verdict table."""
    if not isinstance(results, dict):
        raise DiagnoseReportError("diagnose_collect expects a dict host -> {softnet, nic}, got %s" % type(results).__name__,
                                  value=type(results).__name__, expected="a dict host -> {softnet, nic}")
    hosts = sorted((_host_entry(name, data) for name, data in results.items()), key=_sort_key)
    counts = dict((verdict, 0) for verdict in VERDICT_ORDER)
    for entry in hosts:
        counts[entry["verdict"]] = counts.get(entry["verdict"], 0) + 1
    return {"generated_at": generated_at, "host_count": len(hosts), "counts": counts, "hosts": hosts,
            "verdict_rules": _rules(hosts)}


def _rules_intro(report):
    rules = report.get("verdict_rules") or _rules(report["hosts"])
    text = ("softnet_check tries these rules in order; the first whose condition holds gives the verdict. "
            "A shared CPU is an IRQ CPU with softirq and user work at or above their thresholds; squeeze rates are "
            "per CPU, per second of each host's sample.")
    if rules["thresholds"] is None:
        text += " The hosts used different thresholds: each host's are in cluster.json (softnet.thresholds)."
    return rules["rules"], text


def _rule_findings(report):
    rules = report.get("verdict_rules") or _rules(report["hosts"])
    return rules.get("findings") or describe_findings(placeholder="%s")


def _verdict_text(verdict):
    return VERDICT_TEXT.get(verdict, verdict)


def _finding_text(finding):
    return "%s: %s. Remedy: %s" % (finding.get("title"), finding.get("reason"), finding.get("remedy"))


def _irq_source(entry):
    source = entry["irq_cpus_source"]
    if not source:
        return None
    text = "IRQ CPUs from %s" % source
    if source == "interrupts" and entry.get("irq_cpus_affinity") is not None:
        text += " (affinity files: %s)" % (_cpulist(entry["irq_cpus_affinity"]) or "none")
    return text


def _host_notes(entry):
    """The notes under a host, one source for the Markdown and the HTML: the check's own notes (among them a NIC
    whose firmware gives no NUMA hint, numa_node -1) and, when the link speed is unknown, what to set."""
    notes = list(entry["notes"])
    if entry["verdict"] != "failed" and entry["interface"] and not entry["link_speed_mbps"]:
        notes.append("link speed of %s is unknown (its sysfs speed is -1 or missing, as on virtio and some VFs): link "
                     "use cannot be judged; set diagnose_link_speed_mbps (softnet_check's link_speed_mbps) to the "
                     "NIC's speed in Mbit/s" % entry["interface"])
    return notes


def _decided_by(entry):
    number = _rule_number(entry.get("verdict_rule"))
    return None if number is None else "decided by rule %d (%s)" % (number, entry["verdict_rule"])


def _facts(entry, page=False):
    """The facts under a host's heading, one source for the Markdown and the HTML (``page``): interface, PCI
    address and driver; on the page the IRQ CPUs; where the IRQ CPUs came from; in Markdown the sample's length, on
    the page the link speed; the rule that decided."""
    labels = (("interface", "interface"), ("PCI", "pci_address"), ("driver", "driver"))
    facts = ["%s %s" % (label, entry[key]) for label, key in labels if entry[key]]
    if page:
        facts.append("IRQ CPUs %s" % (_cpulist(entry["irq_cpus"]) or "none"))
    facts.append(_irq_source(entry))
    if not page and entry["interval"] is not None:
        facts.append("sampled over %s s" % _num(entry["interval"], 3))
    if page and entry["link_speed_mbps"]:
        facts.append("link %s Mbit/s" % _num(entry["link_speed_mbps"]))
    facts.append(_decided_by(entry))
    return [fact for fact in facts if fact]


def _overview(entry):
    """A host's cells in the overview table, in the order of :data:`_OVERVIEW` (plain text, not yet escaped)."""
    return (_verdict_text(entry["verdict"]), entry["interface"] or "?", _cpulist(entry["irq_cpus"]) or "none",
            _cpulist(entry["hot_cpus"]) or "none", _num(entry["squeeze_irq_per_10s"]),
            "?" if entry["link_util_pct"] is None else "%s %%" % _num(entry["link_util_pct"], 2))


_TITLE = "NIC IRQ / compute contention: cluster diagnosis"
_OVERVIEW = ("host", "verdict", "interface", "IRQ CPUs", "hot CPUs", "squeezes/10 s on IRQ CPUs", "link use")
_RULES_HEADER = ("rule", "when", "verdict")
_FINDINGS_HEADER = ("finding", "when", "remedy")
_BESIDE = "Reported beside the verdict, whatever it is:"


def diagnose_summary(report):
    """One line: host counts per verdict."""
    counts = report["counts"]
    parts = ["%d %s" % (counts.get(verdict, 0), VERDICT_TEXT[verdict]) for verdict in VERDICT_ORDER]
    return "%s: %s" % (counted(report["host_count"], "host"), ", ".join(parts))


def diagnose_lines(report, limit=10):
    """The play's closing lines: host counts per verdict, then up to ``limit`` hosts (worst first) with their
    verdict and reasons, then how many more there are."""
    lines = [diagnose_summary(report)]
    for entry in report["hosts"][: int(limit)]:
        lines.append("%s: %s: %s" % (entry["host"], _verdict_text(entry["verdict"]),
                                     "; ".join(entry["reasons"] + ["finding: " + _finding_text(finding)
                                                                   for finding in entry["findings"]])))
    more = len(report["hosts"]) - int(limit)
    if more > 0:
        lines.append("... and %s in the report" % counted(more, "more host"))
    return lines


# --- Markdown (cluster.md) --------------------------------------------------------------------------------------


def _md_rules(report):
    rules, intro = _rules_intro(report)
    lines = md_section("How the verdict is decided") + [md_escape(intro), ""]
    lines += md_table(_RULES_HEADER, [(rule["number"], rule["condition"], VERDICT_TEXT[rule["verdict"]]) for rule in rules])
    lines += ["", _BESIDE, ""]
    lines += md_table(_FINDINGS_HEADER, [(finding["title"], finding["condition"], finding["remedy"])
                                         for finding in _rule_findings(report)])
    return lines


def _md_overview(entry):
    cells = _overview(entry)
    return (entry["host"], "**%s**" % cells[0]) + cells[1:]


def _md_host(entry):
    """One host's section: heading, facts, reasons, findings, notes."""
    lines = md_section("%s: %s" % (entry["host"], _verdict_text(entry["verdict"])), level=3)
    facts = _facts(entry)
    if facts:
        lines += [md_escape(", ".join(facts) + "."), ""]
    lines += [md_item(reason) for reason in entry["reasons"]]
    lines += [md_item(_finding_text(finding), "**finding**: ") for finding in entry["findings"]]
    notes = _host_notes(entry)
    if notes:
        lines += [""] + [md_item(note, "note: ") for note in notes]
    return lines


def diagnose_markdown(report):
    """cluster.md: counts, the verdict rules, one table row per host (worst first), then each host's section."""
    lines = [md_heading(_TITLE), "",
             "Generated %s. %s." % (md_escape(report.get("generated_at") or ""), md_escape(diagnose_summary(report))), ""]
    lines += md_table(("verdict", "hosts"),
                      [(VERDICT_TEXT[verdict], report["counts"].get(verdict, 0)) for verdict in VERDICT_ORDER])
    lines += _md_rules(report)
    lines += md_section("Hosts, worst first")
    lines += md_table(_OVERVIEW, [_md_overview(entry) for entry in report["hosts"]])
    for entry in report["hosts"]:
        lines += _md_host(entry)
    return "\n".join(lines) + "\n"


# --- HTML (cluster.html) ----------------------------------------------------------------------------------------

# After _report.render.BASE_CSS.
_CSS = """
h1{font-size:1.4em}h2{font-size:1.15em;margin:1.4em 0 .3em}
.counts span{display:inline-block;margin-right:1em}
.badge{display:inline-block;padding:.1em .5em;border-radius:.3em;font-weight:600;color:#fff}
.v-contention{background:#b3261e}.v-failed{background:#6b4e00}.v-inconclusive{background:#8a6d00}
.v-no_contention{background:#1e6b35}.v-idle{background:#4a5a6a}
ul.findings{margin:.2em 0 .5em 1.2em;padding:0;color:#6b4e00}
.legend{border:1px solid #ccc;padding:.5em .8em;margin:1em 0;font-size:.9em}
.legend .cpu{vertical-align:middle}
.strip{display:flex;flex-wrap:wrap;gap:3px;margin:.4em 0 .8em}
.cpu{width:4.6em;border:1px solid #bbb;border-radius:3px;padding:2px 3px;font-size:.72em;line-height:1.25;
 background:#f4f4f4;position:relative}
.cpu .id{font-weight:700}
.cpu.irq{border:2px solid #1a4fd6;background:#e8eeff}
.cpu.hot{background:#ffd9d6}
.cpu.irq.hot{background:#ffb8b0}
.cpu .mark{font-weight:700;font-size:.9em;margin-left:.2em}
.cpu .mark.irq{color:#1a4fd6}.cpu .mark.hot{color:#b3261e}
.cpu.offline{opacity:.45}
ul.reasons,ul.notes{margin:.2em 0 .5em 1.2em;padding:0}
table.hosts,table.rules{border-collapse:collapse;font-size:.9em}
table.hosts td,table.hosts th,table.rules td,table.rules th{border:1px solid #ccc;padding:.2em .5em;text-align:left}
"""


def _cell(row, irq_cpus, hot_cpus):
    cpu = row.get("cpu")
    classes = ["cpu"]
    marks = []
    if cpu in irq_cpus:
        classes.append("irq")
        marks.append('<span class="mark irq" title="carries NIC queue IRQs">IRQ</span>')
    if cpu in hot_cpus:
        classes.append("hot")
        marks.append('<span class="mark hot" title="squeezing, or softirq together with user work">HOT</span>')
    if row.get("online") is False:
        classes.append("offline")
    soft = row.get("soft")
    usr = row.get("usr")
    squeeze = row.get("squeeze_per_10s")
    title = "CPU %s: softirq %s %%, user %s %%, %s squeezes per 10 s%s%s" % (
        cpu,
        _num(soft),
        _num(usr),
        _num(squeeze),
        ", NIC IRQ CPU" if cpu in irq_cpus else "",
        ", hot" if cpu in hot_cpus else "",
    )
    return (
        '<div class="%s" data-cpu="%s" data-soft="%s" data-usr="%s" data-squeeze="%s" title="%s">'
        '<span class="id">%s</span>%s<br>s %s%%<br>u %s%%<br>q %s</div>'
        % (
            " ".join(classes),
            html_escape(str(cpu)),
            html_escape(_num(soft)),
            html_escape(_num(usr)),
            html_escape(_num(squeeze)),
            html_escape(title),
            html_escape(str(cpu)),
            "".join(marks),
            html_escape(_num(soft)),
            html_escape(_num(usr, 0)),
            html_escape(_num(squeeze, 0)),
        )
    )


def _verdict_badge(verdict):
    return html_badge("v-%s" % verdict, _verdict_text(verdict))


def _html_rules(report):
    """The page's section on how the verdict is decided: the rules in order, then the findings beside them."""
    esc = html_escape
    rules, intro = _rules_intro(report)
    out = ['<section class="rules" id="rules"><h2>How the verdict is decided</h2><p>%s</p>' % esc(intro),
           '<table class="rules">%s' % html_header_row(_RULES_HEADER)]
    for rule in rules:
        out.append('<tr data-rule="%s"><td>%d</td><td>%s</td><td>%s</td></tr>' % (
            esc(rule["name"]), rule["number"], esc(rule["condition"]), _verdict_badge(rule["verdict"])))
    out.append("</table>")
    out.append('<p>%s</p><table class="rules findings">%s' % (esc(_BESIDE), html_header_row(_FINDINGS_HEADER)))
    for finding in _rule_findings(report):
        out.append('<tr data-finding="%s"><td>%s</td><td>%s</td><td>%s</td></tr>' % (
            esc(finding["name"]), esc(finding["title"]), esc(finding["condition"]), esc(finding["remedy"])))
    out.append("</table></section>")
    return out


def _html_host(entry):
    """One host's section: verdict, NIC facts, reasons, findings, notes and the strip of per-CPU cells."""
    esc = html_escape
    irq_cpus = set(entry["irq_cpus"])
    hot_cpus = set(entry["hot_cpus"])
    out = ['<section class="host" id="host-%s" data-verdict="%s">' % (esc(entry["host"]), esc(entry["verdict"])),
           "<h2>%s %s</h2>" % (esc(entry["host"]), _verdict_badge(entry["verdict"])),
           "<p>%s</p>" % esc(", ".join(_facts(entry, page=True))),
           '<ul class="reasons">%s</ul>' % "".join("<li>%s</li>" % esc(r) for r in entry["reasons"])]
    if entry["findings"]:
        out.append('<ul class="findings">%s</ul>' % "".join(
            '<li data-finding="%s"><strong>%s</strong>: %s. Remedy: %s</li>' % (
                esc(f.get("name") or ""), esc(f.get("title") or ""), esc(f.get("reason") or ""),
                esc(f.get("remedy") or "")) for f in entry["findings"]))
    notes = _host_notes(entry)
    if notes:
        out.append('<ul class="notes">%s</ul>' % "".join("<li>note: %s</li>" % esc(n) for n in notes))
    if entry["cpus"]:
        out.append('<div class="strip">%s</div>' % "".join(_cell(row, irq_cpus, hot_cpus) for row in entry["cpus"]))
    out.append("</section>")
    return "\n".join(out)


_LEGEND = (
    '<div class="legend" id="legend"><strong>Legend.</strong> One cell per CPU: '
    "<b>s</b> softirq %, <b>u</b> user %, <b>q</b> time_squeeze events per 10 s. "
    '<span class="cpu irq"><span class="id">n</span><span class="mark irq">IRQ</span></span> '
    "blue border and IRQ: the CPU carries the NIC's queue interrupts. "
    '<span class="cpu hot"><span class="id">n</span><span class="mark hot">HOT</span></span> '
    "red and HOT: the CPU squeezed, or ran softirq together with user work above the thresholds. "
    "Hover a cell for its numbers.</div>"
)


def diagnose_html(report):
    """cluster.html: one self-contained page (inline CSS, no scripts, no external fetches). Each host gets a
    strip of per-CPU cells with softirq %, user % and squeezes per 10 s; IRQ CPUs carry class ``irq`` and the
    visible mark "IRQ", hot CPUs class ``hot`` and the mark "HOT"."""
    esc = html_escape
    out = html_page_open(_TITLE, _CSS, viewport=False) + [
        '<p class="generated">Generated %s. %s.</p>' % (esc(report.get("generated_at") or ""), esc(diagnose_summary(report))),
        '<p class="counts">',
    ]
    for verdict in VERDICT_ORDER:
        out.append("<span>%s %d</span>" % (_verdict_badge(verdict), report["counts"].get(verdict, 0)))
    out += ["</p>", _LEGEND, '<table class="hosts">%s' % html_header_row(_OVERVIEW)]
    for entry in report["hosts"]:
        cells = [esc(text) for text in _overview(entry)]
        cells[0] = _verdict_badge(entry["verdict"])
        out.append('<tr><td><a href="#host-%s">%s</a></td>%s</tr>' % (
            esc(entry["host"]), esc(entry["host"]), "".join("<td>%s</td>" % cell for cell in cells)))
    out.append("</table>")
    out.extend(_html_rules(report))
    out.extend(_html_host(entry) for entry in report["hosts"])
    return html_page_close(out)
