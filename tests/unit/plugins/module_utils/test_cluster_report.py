# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster report: the builder's gate, order, rows and groups, and its four renderings (parsed, not grepped).

The HTML page is also loaded in headless Chromium (skipped only where chromium is not installed; ./run.sh deps
installs it) and the JUnit XML validated against the Jenkins xUnit plugin's junit-10.xsd
(tests/unit/fixtures/junit/PROVENANCE.md).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import HOST_CHECK, ClusterReportError, build_report
from ansible_collections.gpunode.tuning.plugins.module_utils._report.render import render_html, render_junit, render_lines, render_markdown
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import finding

XSD = Path(__file__).resolve().parents[2] / "fixtures" / "junit" / "junit-10.xsd"
EVIL = "<script>alert('x')</script>"


def f(check, status="pass", message=None, fatal=False, fix=None, evidence=None, **extra):
    out = finding(check, status, "%s %s" % (check, status) if message is None else message, evidence=evidence, fix=fix, **extra)
    out["fatal"] = fatal
    return out


def ok(check):
    return f(check, "pass", "%s is fine" % check)


CHECKS = ["platform:page_size", "platform:thp", "gpu:row_remap", "softnet:contention", "nic_irq_pinning"]


def healthy():
    return {"findings": [ok(check) for check in CHECKS], "error": None}


def five_hosts():
    """node1..node5: node2 has a fatal row remap and a warn, node4 a fatal on GPU 1 and 3 (two findings),
    node5 a not-applicable; node1 and node3 pass."""
    hosts = dict(("node%d" % index, healthy()) for index in range(1, 6))
    hosts["node2"]["findings"][2] = f("gpu:row_remap", "fail", "GPU 0: 2 pending row remaps", fatal=True,
                                      fix="drain and reset GPU 0", evidence={"pending": 2}, gpu=0)
    hosts["node2"]["findings"][3] = f("softnet:contention", "warn", "squeezes on IRQ CPUs", fix="pin NIC IRQs")
    hosts["node4"]["findings"][2] = f("gpu:row_remap", "fail", "GPU 1: remap failure", fatal=True, gpu=1)
    hosts["node4"]["findings"].append(f("gpu:row_remap", "fail", "GPU 3: remap failure", fatal=True, gpu=3))
    hosts["node5"]["findings"][1] = f("platform:thp", "not_applicable", "THP not built in")
    return hosts


def report_of(hosts, **kwargs):
    return build_report(kwargs.pop("kind", "preflight"), kwargs.pop("title", "GPU preflight"), hosts,
                        kwargs.pop("generated_at", "2025-06-01T12:00:00Z"), **kwargs)


# --- builder ----------------------------------------------------------------------------------------------------


def test_go_gate_and_text():
    hosts = dict(("n%d" % index, healthy()) for index in range(5))
    hosts["n1"]["findings"][3] = f("softnet:contention", "warn", "squeezes")
    hosts["n2"]["findings"][3] = f("softnet:contention", "warn", "squeezes")
    hosts["n3"]["findings"][1] = f("platform:thp", "not_applicable", "no THP")
    report = report_of(hosts)
    assert report["gate"] == "go"
    assert report["gate_text"] == "GO: no fatal finding on 5 hosts (2 warn, 1 not applicable)"
    assert report["counts"] == {"hosts": 5, "findings": 25, "fatal": 0, "fail": 0, "warn": 2, "unknown": 0,
                                "not_applicable": 1, "pass": 22}
    assert report["host_counts"] == {"fatal": 0, "fail": 0, "warn": 2, "unknown": 0, "not_applicable": 1, "pass": 2}


def test_all_pass_text():
    assert report_of({"a1": healthy()})["gate_text"] == "GO: no fatal finding on 1 host (all pass)"


def test_no_go_gate_and_counts():
    report = report_of(five_hosts())
    assert report["gate"] == "no_go"
    assert report["gate_text"] == "NO-GO: 3 fatal findings on 2 of 5 hosts (1 warn, 1 not applicable)"
    counts = report["counts"]
    assert counts["fatal"] == 3 and counts["warn"] == 1 and counts["not_applicable"] == 1 and counts["fail"] == 0
    # Every finding is in exactly one bucket.
    assert sum(counts[key] for key in ("fatal", "fail", "warn", "unknown", "not_applicable", "pass")) == counts["findings"] == 26
    assert report["host_counts"] == {"fatal": 2, "fail": 0, "warn": 0, "unknown": 0, "not_applicable": 1, "pass": 2}
    assert report["kind"] == "preflight" and report["title"] == "GPU preflight"
    assert report["generated_at"] == "2025-06-01T12:00:00Z"


def test_non_fatal_fail_keeps_the_gate_go():
    hosts = {"a": healthy()}
    hosts["a"]["findings"][0] = f("platform:page_size", "fail", "64 KiB pages", fatal=False)
    report = report_of(hosts)
    assert report["gate"] == "go"
    assert report["gate_text"] == "GO: no fatal finding on 1 host (1 fail)"
    assert report["hosts"][0]["worst"] == "fail" and report["hosts"][0]["fatal"] is False


def test_gate_labels_replace_the_words():
    hosts = {"a": healthy(), "b": healthy()}
    labels = {"go": "IN SYNC", "no_go": "DRIFT"}
    assert report_of(hosts, gate_labels=labels)["gate_text"] == "IN SYNC: no fatal finding on 2 hosts (all pass)"
    hosts["b"]["findings"][0] = f("platform:page_size", "fail", "drifted", fatal=True)
    report = report_of(hosts, gate_labels=labels, kind="drift")
    assert report["gate"] == "no_go" and report["gate_label"] == "DRIFT"
    assert report["gate_text"] == "DRIFT: 1 fatal finding on 1 of 2 hosts"


@pytest.mark.parametrize("labels", [{"go": ""}, {"nogo": "X"}, ["GO", "NO"], {"go": 1}])
def test_bad_gate_labels(labels):
    with pytest.raises(ClusterReportError):
        report_of({"a": healthy()}, gate_labels=labels)


def test_host_error_is_fatal_with_a_synthetic_finding():
    hosts = {"node1": healthy(), "node2": {"findings": [], "error": "UNREACHABLE: ssh timed out"},
             "node3": {"error": "module failed: rc 1"}}
    report = report_of(hosts)
    assert report["gate"] == "no_go"
    assert report["gate_text"] == "NO-GO: 2 fatal findings on 2 of 3 hosts"
    assert [entry["host"] for entry in report["hosts"]] == ["node2", "node3", "node1"]
    entry = report["hosts"][0]
    assert entry["fatal"] is True and entry["worst"] == "fatal" and entry["error"] == "UNREACHABLE: ssh timed out"
    synthetic = entry["findings"][0]
    assert (synthetic["check"], synthetic["status"], synthetic["fatal"], synthetic["message"]) == (
        HOST_CHECK, "fail", True, "UNREACHABLE: ssh timed out")
    assert entry["cells"] == {HOST_CHECK: {"status": "fail", "fatal": True, "count": 1,
                                           "messages": ["UNREACHABLE: ssh timed out"]}}
    # The synthetic check leads even though the first host in input order has none.
    assert report["checks"] == [HOST_CHECK] + CHECKS
    assert report["groups"][0]["check"] == HOST_CHECK


def test_host_error_keeps_the_findings_it_has():
    report = report_of({"a": {"findings": [ok("platform:page_size")], "error": "dcgmi diag failed"}})
    assert [item["check"] for item in report["hosts"][0]["findings"]] == [HOST_CHECK, "platform:page_size"]
    assert report["counts"]["fatal"] == 1 and report["counts"]["pass"] == 1


def test_host_without_findings_is_unknown():
    report = report_of({"a": {"findings": [], "error": None}, "b": healthy()})
    assert [(entry["host"], entry["worst"]) for entry in report["hosts"]] == [("a", "unknown"), ("b", "pass")]
    assert report["host_counts"]["unknown"] == 1 and report["gate"] == "go"


def test_host_order_worst_first_then_natural_name():
    hosts = {}
    for name in ("node10", "node9", "node2", "node1", "gpu3"):
        hosts[name] = healthy()
    hosts["node10"]["findings"][0] = f("platform:page_size", "warn", "w", fatal=True)  # fatal warn beats a plain fail
    hosts["node9"]["findings"][0] = f("platform:page_size", "fail", "x")
    hosts["node2"]["findings"][0] = f("platform:page_size", "unknown", "?")
    hosts["node1"]["findings"][0] = f("platform:page_size", "unknown", "?")
    report = report_of(hosts)
    assert [(entry["host"], entry["worst"]) for entry in report["hosts"]] == [
        ("node10", "fatal"), ("node9", "fail"), ("node1", "unknown"), ("node2", "unknown"), ("gpu3", "pass")]


def test_findings_sorted_worst_first_and_stable():
    items = [ok("a"), f("b", "warn", "b1"), f("c", "not_applicable"), f("d", "warn", "d1"), f("e", "fail", "e1"),
             f("f", "unknown"), f("g", "warn", "g1", fatal=True), ok("h")]
    report = report_of({"x": {"findings": items, "error": None}})
    assert [item["check"] for item in report["hosts"][0]["findings"]] == ["g", "e", "b", "d", "f", "c", "a", "h"]
    assert report["checks"] == ["a", "b", "c", "d", "e", "f", "g", "h"]


def test_cells_take_the_worst_finding_of_a_check():
    items = [f("gpu:ecc", "pass", "GPU 0 ok", gpu=0), f("gpu:ecc", "warn", "GPU 1 SBE", gpu=1),
             f("gpu:ecc", "fail", "GPU 2 DBE", fatal=True, gpu=2), f("gpu:ecc", "warn", "GPU 1 SBE", gpu=1)]
    report = report_of({"x": {"findings": items, "error": None}})
    assert report["hosts"][0]["cells"]["gpu:ecc"] == {
        "status": "fail", "fatal": True, "count": 4, "messages": ["GPU 2 DBE", "GPU 1 SBE", "GPU 0 ok"]}


def test_a_policy_may_make_not_applicable_fatal():
    hosts = {"gpu01": {"findings": [f("gpu_present", "not_applicable", "no NVIDIA GPU on the PCI bus", fatal=True)],
                       "error": None}}
    report = report_of(hosts)
    assert report["gate"] == "no_go" and report["hosts"][0]["worst"] == "fatal"
    case = ET.fromstring(render_junit(report).encode("utf-8")).find("testsuite/testcase")
    assert case.find("failure") is not None and case.find("skipped") is None


def test_checks_in_order_of_first_appearance():
    hosts = {"b": {"findings": [ok("z"), ok("y")], "error": None}, "a": {"findings": [ok("x"), ok("z"), ok("w")], "error": None}}
    assert report_of(hosts)["checks"] == ["z", "y", "x", "w"]


def test_groups_merge_one_check_and_status_across_hosts():
    report = report_of(five_hosts())
    groups = report["groups"]
    first = groups[0]
    assert (first["check"], first["status"], first["fatal"], first["message"]) == (
        "gpu:row_remap", "fail", True, "GPU 0: 2 pending row remaps")
    assert first["fix"] == "drain and reset GPU 0" and first["hosts"] == ["node2", "node4"] and first["hostlist"] == "node[2,4]"
    assert first["messages"] == ["GPU 0: 2 pending row remaps", "GPU 1: remap failure", "GPU 3: remap failure"]
    assert first["distinct"] == 3 and first["findings"] == 3 and first["count"] == 2
    assert [(group["status"], group["fatal"]) for group in groups[:3]] == [("fail", True), ("warn", False), ("not_applicable", False)]
    passing = [group for group in groups if group["status"] == "pass"]
    assert groups[-len(passing):] == passing
    page = [group for group in passing if group["check"] == "platform:page_size"][0]
    assert page["hosts"] == ["node1", "node2", "node3", "node4", "node5"] and page["hostlist"] == "node[1-5]"
    assert page["count"] == 5
    remap = [group for group in passing if group["check"] == "gpu:row_remap"][0]
    assert remap["hostlist"] == "node[1,3,5]"


def test_group_messages_are_capped_and_counted():
    hosts = dict(("n%02d" % i, {"findings": [f("softnet:contention", "fail", "%d squeezes" % (100 + i), fatal=True)], "error": None})
                 for i in range(12))
    group = report_of(hosts)["groups"][0]
    assert group["count"] == 12 and group["distinct"] == 12 and len(group["messages"]) == 5
    assert "(and 11 other messages)" in render_markdown(report_of(hosts))


def test_a_host_with_the_same_finding_twice_counts_once_in_its_group():
    items = [f("gpu:ecc", "warn", "SBE", gpu=0), f("gpu:ecc", "warn", "SBE", gpu=1)]
    report = report_of({"x": {"findings": items, "error": None}, "y": {"findings": items[:1], "error": None}})
    group = report["groups"][0]
    assert group["hosts"] == ["x", "y"] and group["count"] == 2 and group["findings"] == 3


def test_rows_group_identical_hosts():
    report = report_of(five_hosts())
    rows = report["rows"]
    assert [(row["hostlist"], row["count"], row["worst"]) for row in rows] == [
        ("node2", 1, "fatal"), ("node4", 1, "fatal"), ("node5", 1, "not_applicable"), ("node[1,3]", 2, "pass")]
    assert rows[1]["cells"]["gpu:row_remap"] == {
        "status": "fail", "fatal": True, "count": 2, "messages": ["GPU 1: remap failure", "GPU 3: remap failure"], "distinct": 2}
    assert rows[3]["cells"]["platform:page_size"]["count"] == 2
    assert rows[3]["hosts"] == ["node1", "node3"]


def test_rows_merge_hosts_whose_messages_differ_only_in_their_numbers():
    hosts = {"a1": healthy(), "a2": healthy()}
    hosts["a2"]["findings"][0] = f("platform:page_size", "pass", "pages are 64 KiB")
    rows = report_of(hosts)["rows"]
    assert len(rows) == 1 and rows[0]["hostlist"] == "a[1-2]"
    assert rows[0]["cells"]["platform:page_size"]["distinct"] == 2
    assert "pages are 64 KiB" in rows[0]["cells"]["platform:page_size"]["messages"]
    hosts["a2"]["findings"][0] = f("platform:page_size", "warn", "pages are 64 KiB")
    assert len(report_of(hosts)["rows"]) == 2


def _thousand_hosts():
    hosts = {}
    checks = ["check:%02d" % index for index in range(40)]
    for index in range(1, 1001):
        hosts["node%04d" % index] = {"findings": [f(check, "pass", "%s fine" % check, evidence={"v": 1}) for check in checks],
                                     "error": None}
    hosts["node0998"]["findings"][7] = f("check:07", "fail", "bad value", fatal=True, fix="set it")
    hosts["node0999"]["findings"][9] = f("check:09", "warn", "odd value")
    hosts["node1000"] = {"findings": [], "error": "unreachable"}
    return hosts


def test_thousand_hosts_scale_and_group():
    hosts = _thousand_hosts()
    # Its speed is measured in benchmarks/preflight_results.md, not asserted here.
    report = report_of(hosts)
    rows = report["rows"]
    assert len(rows) == 4
    assert (rows[-1]["hostlist"], rows[-1]["count"], rows[-1]["worst"]) == ("node[0001-0997]", 997, "pass")
    assert [row["hostlist"] for row in rows[:3]] == ["node0998", "node1000", "node0999"]
    assert report["counts"]["findings"] == 999 * 40 + 1 and report["counts"]["fatal"] == 2
    assert report["gate_text"] == "NO-GO: 2 fatal findings on 2 of 1000 hosts (1 warn)"
    group = [group for group in report["groups"] if group["check"] == "check:00"][0]
    assert group["hostlist"] == "node[0001-0999]" and group["count"] == 999
    for render in (render_markdown, render_html, render_junit, render_lines):
        assert render(report)


def test_report_is_json_and_input_untouched():
    hosts = five_hosts()
    before = copy.deepcopy(hosts)
    report = report_of(hosts)
    assert json.loads(json.dumps(report)) == report
    assert hosts == before


def test_extra_finding_keys_are_kept():
    report = report_of({"a": {"findings": [f("gpu:ecc", "pass", "ok", gpu=[0, 1], source="nvidia-smi", serial="X1")],
                              "error": None}})
    item = report["hosts"][0]["findings"][0]
    assert item["gpu"] == [0, 1] and item["source"] == "nvidia-smi" and item["serial"] == "X1"


def _raises(hosts, *fragments, **kwargs):
    with pytest.raises(ClusterReportError) as info:
        report_of(hosts, **kwargs)
    assert isinstance(info.value, DetailedError)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    return info.value


def test_bad_status_names_host_and_value():
    hosts = {"good": healthy(), "gpu07": healthy()}
    hosts["gpu07"]["findings"][1]["status"] = "ok"
    error = _raises(hosts, "'gpu07'", "'platform:thp'", "'ok'", "pass, warn, fail, not_applicable, unknown")
    assert error.details["host"] == "gpu07" and error.value == "ok"
    assert error.expected == "one of pass, warn, fail, not_applicable, unknown"


def test_missing_keys_are_named():
    item = ok("gpu:ecc")
    del item["fatal"]
    del item["fix"]
    error = _raises({"n1": {"findings": [item], "error": None}}, "'n1'", "'gpu:ecc'", "lacks fix, fatal")
    assert error.details["missing"] == ["fix", "fatal"]


@pytest.mark.parametrize("hosts,fragments", [
    (["n1"], ("hosts is of type list",)),
    ({}, ("hosts is empty",)),
    ({"n1": "ok"}, ("host 'n1'", "type str")),
    ({"n1": {"findings": "x", "error": None}}, ("host 'n1'", "findings is of type str")),
    ({"n1": {"error": None}}, ("host 'n1' has neither findings nor an error",)),
    ({"n1": {"findings": [], "error": None, "facts": {}}}, ("host 'n1'", "unknown key facts")),
    ({"n1": {"findings": [], "error": 3}}, ("host 'n1'", "error is 3")),
    ({"n1": {"findings": [], "error": "  "}}, ("host 'n1'", "error is '  '")),
    ({"n1": {"findings": ["x"], "error": None}}, ("host 'n1'", "finding 0 is of type str")),
    ({"n1": {"findings": [f("a", "pass", fatal="yes")], "error": None}}, ("host 'n1'", "fatal 'yes'", "true or false")),
    ({"n1": {"findings": [f("a", "pass", fatal=True)], "error": None}}, ("host 'n1'", "fatal with status 'pass'")),
    ({"n1": {"findings": [f("", "pass")], "error": None}}, ("host 'n1'", "check is ''")),
    ({"n1": {"findings": [dict(ok("a"), message=5)], "error": None}},
     ("host 'n1'", "message of finding 'a' is 5")),
    ({"n1": {"findings": [f("a", "pass", gpu="0")], "error": None}}, ("host 'n1'", "gpu '0'")),
    ({"n1": {"findings": [f("a", "pass", gpu=True)], "error": None}}, ("gpu True",)),
    ({"": healthy()}, ("host name ''",)),
])
def test_bad_input(hosts, fragments):
    _raises(hosts, *fragments)


@pytest.mark.parametrize("args", [(None, "t", "now"), ("", "t", "now"), ("k", 3, "now"), ("k", "t", None)])
def test_bad_kind_title_time(args):
    with pytest.raises(ClusterReportError):
        build_report(args[0], args[1], {"a": healthy()}, args[2])


@pytest.mark.parametrize("render", [render_markdown, render_html, render_junit, render_lines])
def test_renderers_refuse_what_is_not_a_report(render):
    with pytest.raises(ClusterReportError):
        render({"title": "x"})
    with pytest.raises(ClusterReportError):
        render(["x"])


# --- Markdown ---------------------------------------------------------------------------------------------------


def _pipe_report():
    hosts = five_hosts()
    hosts["node2"]["findings"][3] = f("softnet:contention", "warn", "rx|tx squeezes", fix="echo 3 | tee /proc/irq/10/smp_affinity")
    hosts["node3"]["findings"].append(f("odd|check", "warn", EVIL))
    return report_of(hosts)


def test_markdown_has_gate_fix_groups_and_table():
    report = report_of(five_hosts())
    text = render_markdown(report)
    lines = text.splitlines()
    assert lines[0] == "# GPU preflight"
    assert "**NO-GO: 3 fatal findings on 2 of 5 hosts (1 warn, 1 not applicable)**" in lines
    fix = text.split("## What to fix")[1].split("## Hosts")[0]
    assert "- **FATAL FAIL** `gpu:row_remap`: GPU 0: 2 pending row remaps" in fix
    assert "  - hosts (1): node2" in fix.splitlines()
    assert "  - fix: drain and reset GPU 0" in fix.splitlines()
    assert "- **WARN** `softnet:contention`: squeezes on IRQ CPUs" in fix
    assert "- **N/A** `platform:thp`: THP not built in" in fix
    assert "is fine" not in fix  # pass groups are not things to fix
    table = [line for line in text.split("## Hosts, worst first")[1].splitlines() if line.startswith("|")]
    assert table[0] == "| hosts | count | worst | %s |" % " | ".join(CHECKS)
    assert table[1] == "|---|---|---|" + "---|" * len(CHECKS)
    assert table[2:] == [
        "| node2 | 1 | FATAL | PASS | PASS | FATAL | WARN | PASS |",
        "| node4 | 1 | FATAL | PASS | PASS | FATAL | PASS | PASS |",
        "| node5 | 1 | N/A | PASS | N/A | PASS | PASS | PASS |",
        "| node[1,3] | 2 | PASS | PASS | PASS | PASS | PASS | PASS |",
    ]


def test_markdown_escapes_pipes_and_html():
    text = render_markdown(_pipe_report())
    assert "rx\\|tx squeezes" in text and "echo 3 \\| tee" in text
    assert "| odd\\|check |" in text
    assert re.search(r"(?<!\\)<", text) is None and "\\<script>" in text
    # Every table line has as many unescaped separators as the header.
    table = [line for line in text.split("## Hosts, worst first")[1].splitlines() if line.startswith("|")]
    widths = set(line.replace("\\|", "").count("|") for line in table)
    assert widths == {len(CHECKS) + 1 + 4}


def test_markdown_nothing_to_fix():
    assert "Nothing: every finding passes." in render_markdown(report_of({"a": healthy()}))


# --- HTML -------------------------------------------------------------------------------------------------------


class Page(HTMLParser):
    """Elements with their attributes and text, the #gate banner, the grid's rows and cells, the fix list."""

    def __init__(self):
        HTMLParser.__init__(self, convert_charrefs=True)
        self.tags = []
        self.stack = []
        self.gate = None
        self.rows = []
        self.groups = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        node = {"tag": tag, "attrs": attrs, "text": "", "classes": (attrs.get("class") or "").split()}
        self.tags.append(node)
        if tag in ("meta", "br", "link", "img", "input"):
            return
        self.stack.append(node)
        if attrs.get("id") == "gate":
            self.gate = node
        if tag == "tr" and "row" in node["classes"]:
            self.rows.append({"node": node, "cells": []})
        if tag == "td" and self.rows and self._inside("tr", self.rows[-1]["node"]):
            self.rows[-1]["cells"].append(node)
        if tag == "li" and "group" in node["classes"]:
            self.groups.append(node)

    def _inside(self, tag, node):
        return any(item is node for item in self.stack if item["tag"] == tag)

    def handle_endtag(self, tag):
        while self.stack:
            node = self.stack.pop()
            if node["tag"] == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        for node in self.stack:
            node["text"] += data


def parse_page(text):
    page = Page()
    page.feed(text)
    page.close()
    return page


def _html_report():
    hosts = five_hosts()
    hosts["node3"]["findings"].append(f("softnet:contention", "warn", EVIL, fix="fix " + EVIL))
    hosts[EVIL] = {"findings": [], "error": "ssh: " + EVIL}
    return report_of(hosts, title="Preflight " + EVIL)


def _check_grid(page, report):
    assert page.gate is not None
    expected_class = "no-go" if report["gate"] == "no_go" else "go"
    assert expected_class in page.gate["classes"]
    assert page.gate["text"].strip() == report["gate_text"]
    assert len(page.rows) == len(report["rows"])
    for row, want in zip(page.rows, report["rows"]):
        cells = row["cells"]
        assert len(cells) == 1 + len(report["checks"])
        assert want["hostlist"] in cells[0]["text"] and "host" in cells[0]["text"]
        for cell, check in zip(cells[1:], report["checks"]):
            expect = want["cells"].get(check)
            if expect is None:
                assert "status-none" in cell["classes"] and cell["text"].strip() == "-"
                continue
            assert "status-%s" % expect["status"] in cell["classes"]
            assert ("fatal" in cell["classes"]) == expect["fatal"]
            short = "FATAL" if expect["fatal"] else {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "unknown": "?",
                                                     "not_applicable": "N/A"}[expect["status"]]
            assert cell["text"].strip() == short
            for message in expect["messages"]:
                assert message in cell["attrs"]["title"]


def test_html_grid_rows_cells_and_gate():
    report = _html_report()
    page = parse_page(render_html(report))
    _check_grid(page, report)
    assert [row["node"]["attrs"]["data-worst"] for row in page.rows] == [row["worst"] for row in report["rows"]]
    assert page.rows[0]["cells"][0]["text"].startswith(EVIL)  # the unreachable host sorts first (fatal, name '<')
    assert [group["attrs"]["data-check"] for group in page.groups] == [
        group["check"] for group in report["groups"] if group["status"] != "pass"]
    assert "fatal" in page.groups[0]["classes"]
    assert any("legend" == node["attrs"].get("id") for node in page.tags)


def test_html_escapes_everything():
    report = _html_report()
    text = render_html(report)
    assert "<script" not in text  # neither the page's own (it has none) nor the messages' or host names'
    page = parse_page(text)
    titles = [node for node in page.tags if node["tag"] == "title"]
    assert titles and titles[0]["text"] == "Preflight " + EVIL
    assert EVIL in "".join(page.text)
    assert "ssh: " + EVIL in "".join(group["text"] for group in page.groups)
    assert not [node for node in page.tags if node["tag"] in ("script", "link", "img", "iframe")]


def test_html_is_self_contained():
    text = render_html(_html_report())
    for needle in ("src=", "href=\"http", "@import", "url("):
        assert needle not in text


def test_html_go_banner():
    page = parse_page(render_html(report_of({"a": healthy()})))
    assert page.gate["classes"] == ["go"]
    assert page.gate["text"] == "GO: no fatal finding on 1 host (all pass)"
    assert len(page.rows) == 1 and page.groups == []


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (./run.sh deps installs the Debian package chromium)")
def test_html_in_headless_chromium(tmp_path):
    report = _html_report()
    page_file = tmp_path / "cluster.html"
    page_file.write_text(render_html(report), encoding="utf-8")
    env = dict(os.environ, HOME=str(tmp_path))
    result = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--user-data-dir=%s" % (tmp_path / "profile"), "--dump-dom", page_file.as_uri()],
        capture_output=True, text=True, timeout=180, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<html" in dom, result.stderr[-2000:]
    page = parse_page(dom)
    _check_grid(page, report)
    assert page.gate["classes"] == ["no-go"]
    assert "<script" not in dom


# --- JUnit ------------------------------------------------------------------------------------------------------


def _junit_report():
    hosts = five_hosts()
    hosts["node3"]["findings"].append(f("weird", "unknown", "ctrl \x01 & <b> \"quoted\"\nnext", evidence=["a", 1]))
    hosts["node3"]["findings"].append(f("weird", "unknown", "again"))
    hosts["node6"] = {"findings": None, "error": "UNREACHABLE <ssh>"}
    return report_of(hosts, title="GPU & preflight")


def _cases(suite):
    return suite.findall("testcase")


def test_junit_structure_and_counts():
    report = _junit_report()
    text = render_junit(report)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites" and root.get("name") == "GPU & preflight"
    suites = root.findall("testsuite")
    assert [suite.get("name") for suite in suites] == [entry["host"] for entry in report["hosts"]]
    totals = dict((key, 0) for key in ("tests", "failures", "errors", "skipped"))
    for suite in suites:
        cases = _cases(suite)
        counted = {"tests": len(cases), "failures": sum(1 for case in cases if case.find("failure") is not None),
                   "errors": sum(1 for case in cases if case.find("error") is not None),
                   "skipped": sum(1 for case in cases if case.find("skipped") is not None)}
        for key, value in counted.items():
            assert int(suite.get(key)) == value, (suite.get("name"), key)
            totals[key] += value
        assert suite.get("hostname") == suite.get("name") and suite.get("package") == "preflight"
        assert suite.get("timestamp") == "2025-06-01T12:00:00Z"
    for key in ("tests", "failures", "errors"):
        assert int(root.get(key)) == totals[key]
    assert totals == {"tests": 29, "failures": 3, "errors": 1, "skipped": 1}
    assert totals["tests"] == report["counts"]["findings"]


def test_junit_cases():
    root = ET.fromstring(render_junit(_junit_report()).encode("utf-8"))
    suites = dict((suite.get("name"), suite) for suite in root.findall("testsuite"))
    node2 = dict((case.get("name"), case) for case in _cases(suites["node2"]))
    remap = node2["gpu:row_remap gpu 0"]
    assert remap.get("classname") == "preflight.node2"
    failure = remap.find("failure")
    assert failure.get("type") == "fatal" and "GPU 0: 2 pending row remaps" in failure.get("message")
    assert 'evidence: {"pending": 2}' in failure.text and "fix: drain and reset GPU 0" in failure.text
    warn = node2["softnet:contention"]
    assert warn.find("failure") is None and "squeezes on IRQ CPUs" in warn.find("system-out").text
    node4 = [case.get("name") for case in _cases(suites["node4"])]
    assert "gpu:row_remap gpu 1" in node4 and "gpu:row_remap gpu 3" in node4
    skipped = dict((case.get("name"), case) for case in _cases(suites["node5"]))["platform:thp"].find("skipped")
    assert skipped.get("message") == "THP not built in"
    node3 = dict((case.get("name"), case) for case in _cases(suites["node3"]))
    assert "weird" in node3 and "weird (2)" in node3  # names stay unique within a suite
    out = node3["weird"].find("system-out").text
    assert "ctrl \ufffd & <b> \"quoted\"\nnext" in out and 'evidence: ["a", 1]' in out
    error_case = _cases(suites["node6"])[0]
    assert error_case.get("name") == HOST_CHECK
    assert error_case.find("error").get("message") == "UNREACHABLE <ssh>"


def test_junit_validates_against_the_xunit_schema():
    etree = pytest.importorskip("lxml.etree", reason="lxml is not installed (requirements-dev.txt pins it)")
    schema = etree.XMLSchema(etree.parse(str(XSD)))
    for report in (_junit_report(), report_of({"a": healthy()}), report_of(_thousand_hosts())):
        document = etree.fromstring(render_junit(report).encode("utf-8"))
        assert schema.validate(document), schema.error_log
    # The schema is strict enough to catch a mistake: an attribute it does not declare.
    broken = etree.fromstring(render_junit(report_of({"a": healthy()})).replace("<testsuites ", '<testsuites skipped="0" ').encode("utf-8"))
    assert not schema.validate(broken)


# --- lines ------------------------------------------------------------------------------------------------------


def test_lines():
    report = report_of(five_hosts())
    lines = render_lines(report)
    assert lines[0] == report["gate_text"]
    assert lines[1] == "hosts by worst finding: 2 fatal, 0 fail, 0 warn, 0 unknown, 1 not applicable, 2 pass"
    assert lines[2] == "findings: 3 fatal, 0 fail, 1 warn, 0 unknown, 1 not applicable, 21 pass"
    assert lines[3] == ("FATAL FAIL gpu:row_remap on node[2,4] (2 hosts): GPU 0: 2 pending row remaps (and 2 other messages); "
                        "fix: drain and reset GPU 0")
    assert len(lines) == 3 + 3 and not [line for line in lines if "is fine" in line]


def test_lines_limit_and_more():
    lines = render_lines(report_of(five_hosts()), 1)
    assert len(lines) == 3 + 1 + 1
    assert lines[-1] == "... 2 more finding groups in the report"
    assert render_lines(report_of(five_hosts()), 2)[-1] == "... 1 more finding group in the report"
    assert len(render_lines(report_of(five_hosts()), 0)) == 4


def test_lines_keep_messages_on_one_line():
    hosts = {"a": {"findings": [f("x", "warn", "one\ntwo   three")], "error": None}}
    assert render_lines(report_of(hosts))[-1] == "WARN x on a (1 host): one two three"


@pytest.mark.parametrize("limit", [-1, "3", 1.5, True, None])
def test_lines_bad_limit(limit):
    with pytest.raises(ClusterReportError):
        render_lines(report_of({"a": healthy()}), limit)
