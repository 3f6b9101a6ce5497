# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Report rendering: ordering, Markdown, and what the HTML page shows (parsed, not grepped)."""

from __future__ import annotations

import copy
import html
from html.parser import HTMLParser

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.diagnose_report import FilterModule
from ansible_collections.gpunode.tuning.plugins.module_utils._report.diagnose import (
    diagnose_collect,
    diagnose_html,
    diagnose_lines,
    diagnose_markdown,
    diagnose_summary,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    RULES,
    describe_findings,
    describe_rules,
)


def cpus(n, irq=(), hot=()):
    rows = []
    for cpu in range(n):
        rows.append({
            "cpu": cpu, "online": True, "usr": 60.0 if cpu in hot else 20.0, "soft": 12.5 if cpu in irq else 0.1,
            "squeeze_per_10s": 150.0 if cpu in hot else 0.0, "time_squeeze": 150 if cpu in hot else 0,
        })
    return rows


def softnet(verdict, irq=(), hot=(), n=4, squeeze=0.0, util=3.5, reasons=None):
    return {
        "verdict": verdict, "reasons": reasons or ["%s because of numbers" % verdict], "interface": "ens7",
        "pci_address": "0000:3b:00.0", "driver": "mlx5_core", "irq_cpus": list(irq), "irq_cpus_source": "effective_affinity",
        "hot_cpus": list(hot), "non_irq_squeeze_cpus": [], "interval": 10.0, "cpus": cpus(n, irq, hot),
        "totals": {"time_squeeze_irq_cpus_per_10s": squeeze, "time_squeeze_per_10s": squeeze},
        "link": {"utilisation_pct": util, "speed_mbps": 200000, "rx_mbps": 7000.0, "tx_mbps": 120.0}, "notes": [],
    }


RESULTS = {
    "ok-1": {"softnet": softnet("no_contention", irq=[3]), "nic": {"interface": "ens7"}},
    "bad-small": {"softnet": softnet("contention", irq=[0, 1], hot=[0, 1], squeeze=300.0)},
    "bad-big": {"softnet": softnet("contention", irq=[0, 1, 2], hot=[0, 1, 2], squeeze=450.0)},
    "maybe": {"softnet": softnet("inconclusive", irq=[], util=None)},
    "down": {"softnet": {"failed": True, "msg": "interface 'ens9' does not exist"}, "nic": {}},
    "a<b>&c": {"softnet": softnet("no_contention", irq=[1])},
}


def test_hosts_are_sorted_worst_first():
    report = diagnose_collect(RESULTS, "2026-11-30T04:00:00Z")
    assert [h["host"] for h in report["hosts"]] == ["bad-big", "bad-small", "down", "maybe", "a<b>&c", "ok-1"]
    assert report["counts"] == {"contention": 2, "failed": 1, "inconclusive": 1, "idle": 0, "no_contention": 2}
    assert report["hosts"][2]["reasons"] == ["interface 'ens9' does not exist"]


def test_summary_of_one_host_is_singular():
    assert diagnose_summary(diagnose_collect({"n1": RESULTS["ok-1"]})).startswith("1 host: 0 contention")


def test_summary_counts_every_verdict():
    assert diagnose_summary(diagnose_collect(RESULTS)) == (
        "6 hosts: 2 contention, 1 check failed, 1 inconclusive, 0 idle, 2 no contention"
    )


def test_markdown_has_counts_table_and_reasons_worst_first():
    text = diagnose_markdown(diagnose_collect(RESULTS, "T"))
    assert "| contention | 2 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "**" in line]
    assert rows[0].startswith("| bad-big | **contention** | ens7 | 0-2 | 0-2 | 450 | 3.5 % |")
    assert rows[3].startswith("| maybe | **inconclusive** | ens7 | none | none | 0 | ? |")
    assert "### down: check failed" in text
    assert "- interface 'ens9' does not exist" in text
    assert text.index("### bad-big") < text.index("### ok-1")


class Page(HTMLParser):
    """Collects per-host CPU cells (classes, marks), tags and attributes of the page."""

    def __init__(self):
        HTMLParser.__init__(self)
        self.host = None
        self.cells = {}
        self.cell = None
        self.mark_class = None
        self.tags = []
        self.attrs = []
        self.legend = ""
        self.in_legend = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.attrs.append(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "section" and "host" in classes:
            self.host = attrs["id"][len("host-"):]
            self.cells[self.host] = {}
        if tag == "div" and "cpu" in classes and self.host is not None:
            self.cell = {"classes": set(classes), "marks": [], "attrs": attrs}
            self.cells[self.host][int(attrs["data-cpu"])] = self.cell
        if tag == "span" and "mark" in classes:
            self.mark_class = classes
        if attrs.get("id") == "legend":
            self.in_legend = 1

    def handle_endtag(self, tag):
        if tag == "section":
            self.host = None
        if tag == "div":
            self.cell = None
            self.in_legend = 0

    def handle_data(self, data):
        if self.mark_class and self.cell is not None:
            self.cell["marks"].append(data)
        self.mark_class = None
        if self.in_legend:
            self.legend += data


def parse(report):
    page = Page()
    page.feed(diagnose_html(report))
    return page


def test_html_marks_irq_cpus_and_hot_cpus_per_host():
    page = parse(diagnose_collect(RESULTS))
    big = page.cells["bad-big"]
    assert sorted(cpu for cpu, cell in big.items() if "irq" in cell["classes"]) == [0, 1, 2]
    assert sorted(cpu for cpu, cell in big.items() if "hot" in cell["classes"]) == [0, 1, 2]
    assert big[0]["marks"] == ["IRQ", "HOT"]
    assert big[3]["marks"] == [] and big[3]["classes"] == {"cpu"}
    ok = page.cells["ok-1"]
    assert [cpu for cpu, cell in ok.items() if "irq" in cell["classes"]] == [3]
    assert ok[3]["marks"] == ["IRQ"]
    assert not any("hot" in cell["classes"] for cell in ok.values())


def test_html_cells_carry_the_numbers():
    page = parse(diagnose_collect(RESULTS))
    cell = page.cells["bad-small"][1]
    assert cell["attrs"]["data-soft"] == "12.5"
    assert cell["attrs"]["data-usr"] == "60"
    assert cell["attrs"]["data-squeeze"] == "150"
    assert "softirq 12.5 %, user 60 %, 150 squeezes per 10 s, NIC IRQ CPU, hot" in cell["attrs"]["title"]


def test_html_is_self_contained_with_a_visible_legend():
    page = parse(diagnose_collect(RESULTS))
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    for attrs in page.attrs:
        for name in ("src", "href"):
            assert not (attrs.get(name) or "#").split("#")[0], attrs
    assert "IRQ" in page.legend and "HOT" in page.legend and "softirq" in page.legend


def test_html_escapes_host_names_and_reasons():
    text = diagnose_html(diagnose_collect(RESULTS))
    assert "a<b>&c" not in text
    assert "a&lt;b&gt;&amp;c" in text
    assert set(parse(diagnose_collect(RESULTS)).cells) >= {"a<b>&c"}


def test_failed_host_has_no_strip_but_its_error():
    page = parse(diagnose_collect(RESULTS))
    assert page.cells["down"] == {}
    assert "interface &#x27;ens9&#x27; does not exist" in diagnose_html(diagnose_collect(RESULTS))


def test_filters_are_registered_and_reject_malformed_input():
    filters = FilterModule().filters()
    assert set(filters) == {"diagnose_collect", "diagnose_markdown", "diagnose_html", "diagnose_summary",
                            "diagnose_lines", "softnet_sampling_result"}
    with pytest.raises(AnsibleFilterError):
        filters["diagnose_collect"](["not", "a", "dict"])
    with pytest.raises(AnsibleFilterError):
        filters["diagnose_markdown"]({"hosts": []})


def test_closing_lines_list_the_worst_hosts_with_reasons_and_count_the_rest():
    lines = diagnose_lines(diagnose_collect(RESULTS), 2)
    assert lines == [
        "6 hosts: 2 contention, 1 check failed, 1 inconclusive, 0 idle, 2 no contention",
        "bad-big: contention: contention because of numbers",
        "bad-small: contention: contention because of numbers",
        "... and 4 more hosts in the report",
    ]
    assert len(diagnose_lines(diagnose_collect(RESULTS))) == 7


@pytest.mark.parametrize(
    "usr, squeeze, soft, text",
    [
        (50.0, 100.0, 10.0, "<br>s 10%<br>u 50%<br>q 100</div>"),
        (5.0, 0.0, 0.0, "<br>s 0%<br>u 5%<br>q 0</div>"),
        (60.4, 1650.0, 12.25, "<br>s 12.2%<br>u 60%<br>q 1650</div>"),
        (100.0, 10.0, 0.5, "<br>s 0.5%<br>u 100%<br>q 10</div>"),
    ],
)
def test_html_cells_keep_the_zeros_of_whole_numbers(usr, squeeze, soft, text):
    # "u 50%" was shown as "u 5%" and 100 squeezes as "q 1"
    row = {"cpu": 0, "online": True, "usr": usr, "soft": soft, "squeeze_per_10s": squeeze}
    result = softnet("no_contention", irq=[0])
    result["cpus"] = [row]
    assert text in diagnose_html(diagnose_collect({"h": {"softnet": result}}))


def test_report_prints_the_verdict_rules_of_softnet_check_with_the_thresholds_used():
    results = copy.deepcopy(RESULTS)
    for name, data in results.items():
        if name != "down":
            data["softnet"]["thresholds"] = dict(DEFAULT_THRESHOLDS, squeeze_rate=2.5)
            data["softnet"]["verdict_rule"] = ("contention" if data["softnet"]["verdict"] == "contention"
                                               else "irq_cpus_no_user_work")
    report = diagnose_collect(results)
    rules = describe_rules(dict(DEFAULT_THRESHOLDS, squeeze_rate=2.5))
    findings = describe_findings(dict(DEFAULT_THRESHOLDS, squeeze_rate=2.5))
    assert report["verdict_rules"] == {"thresholds": dict(DEFAULT_THRESHOLDS, squeeze_rate=2.5), "rules": rules,
                                       "findings": findings}
    assert [rule["name"] for rule in rules] == [rule.name for rule in RULES]
    assert "no such shared CPU squeezes 2.5 times per second or more" in rules[4]["condition"]

    text = diagnose_markdown(report)
    table = text[text.index("## How the verdict is decided"):text.index("## Hosts, worst first")]
    for rule in rules:
        assert "| %d | %s | %s |" % (rule["number"], rule["condition"], rule["verdict"].replace("_", " ")) in table
    assert "decided by rule 9 (contention)" in text[text.index("### bad-big"):text.index("### bad-small")]
    assert "decided by rule 3 (irq_cpus_no_user_work)" in text[text.index("### ok-1"):]
    assert "| IRQ CPUs saturated by packet rate | an IRQ CPU with usr below 40 % squeezes 2.5 times per second" in table

    page = diagnose_html(report)
    for rule in rules:
        assert '<tr data-rule="%s"><td>%d</td><td>%s</td>' % (rule["name"], rule["number"], html.escape(rule["condition"])) in page
    assert "decided by rule 9 (contention)" in page
    assert '<tr data-finding="irq_cpus_saturated"><td>IRQ CPUs saturated by packet rate</td>' in page


def test_report_rules_name_the_thresholds_when_hosts_used_different_ones():
    results = copy.deepcopy(RESULTS)
    results["ok-1"]["softnet"]["thresholds"] = dict(DEFAULT_THRESHOLDS)
    results["bad-big"]["softnet"]["thresholds"] = dict(DEFAULT_THRESHOLDS, user_pct=20.0)
    report = diagnose_collect(results)
    assert report["verdict_rules"]["thresholds"] is None
    assert "usr >= user_pct %" in report["verdict_rules"]["rules"][3]["condition"]
    assert "different thresholds" in diagnose_markdown(report)
    # no host checked: the defaults
    report = diagnose_collect({"down": RESULTS["down"]})
    assert report["verdict_rules"]["thresholds"] == DEFAULT_THRESHOLDS
    assert "less than 100 packets/s" in report["verdict_rules"]["rules"][0]["condition"]


def test_idle_hosts_findings_and_where_the_irq_cpus_came_from_are_shown():
    """Issue 28: the idle verdict, the saturated-IRQ-CPU finding and the IRQ CPUs' source in every rendering."""
    saturated = softnet("no_contention", irq=[2])
    saturated.update({
        "verdict_rule": "irq_cpus_no_user_work", "irq_cpus_source": "interrupts", "irq_cpus_affinity": [2, 3, 4, 5, 6, 7],
        "findings": [{"name": "irq_cpus_saturated", "title": "IRQ CPUs saturated by packet rate", "cpus": [2],
                      "reason": "IRQ CPUs 2 squeeze at or above 0.5 per s", "remedy": "more IRQ CPUs or RPS"}],
    })
    idle = softnet("idle", irq=[3], reasons=["idle: nothing can be judged until the job runs"])
    report = diagnose_collect({"after": {"softnet": saturated}, "quiet": {"softnet": idle},
                               "before": {"softnet": softnet("contention", irq=[4], hot=[4], squeeze=78.0)}})
    assert [h["host"] for h in report["hosts"]] == ["before", "quiet", "after"]
    assert report["counts"]["idle"] == 1
    assert diagnose_summary(report) == "3 hosts: 1 contention, 0 check failed, 0 inconclusive, 1 idle, 1 no contention"
    lines = diagnose_lines(report)
    assert lines[3] == ("after: no contention: no_contention because of numbers; finding: IRQ CPUs saturated by packet "
                        "rate: IRQ CPUs 2 squeeze at or above 0.5 per s. Remedy: more IRQ CPUs or RPS")
    text = diagnose_markdown(report)
    after = text[text.index("### after"):]
    assert "IRQ CPUs from interrupts (affinity files: 2-7)" in after
    assert "- **finding**: IRQ CPUs saturated by packet rate: IRQ CPUs 2 squeeze" in after
    assert "| idle | 1 |" in text
    page = diagnose_html(report)
    assert '<span class="badge v-idle">idle</span>' in page
    assert ('<li data-finding="irq_cpus_saturated"><strong>IRQ CPUs saturated by packet rate</strong>: IRQ CPUs 2 '
            "squeeze at or above 0.5 per s. Remedy: more IRQ CPUs or RPS</li>") in page


def test_markdown_escapes_like_the_cluster_report():
    """One Markdown escape (``_report.render.md_escape``): a host name or reason with a backslash, a pipe, a ``<`` or
    a line break cannot break the table or inject markup (the diagnose page's own escape let ``\\`` and ``<`` through)."""
    results = {"evil|<b>\\x": {"softnet": {"failed": True, "msg": "line one\nline two | <script>"}, "nic": {}}}
    page = diagnose_markdown(diagnose_collect(results))
    assert "evil\\|\\<b>\\\\x" in page
    assert "<script>" not in page.replace("\\<script>", "")
    assert "line one line two" in page
