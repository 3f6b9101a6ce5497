# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster_report_* filters: the same texts as module_utils/_report/render, bad input as AnsibleFilterError."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.cluster_report import FilterModule
from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import build_report
from ansible_collections.gpunode.tuning.plugins.module_utils._report.render import render_html, render_junit, render_lines, render_markdown

FILTERS = FilterModule().filters()
NAMES = ["cluster_report_html", "cluster_report_junit", "cluster_report_lines", "cluster_report_markdown", "collect_play"]


def _finding(check, status, message, fatal=False, fix=None):
    return {"check": check, "status": status, "message": message, "evidence": None, "fix": fix, "fatal": fatal}


def _report():
    hosts = {
        "gpu01": {"findings": [_finding("platform:page_size", "pass", "4 KiB pages"),
                               _finding("gpu:row_remap", "fail", "GPU 3 pending remap", True, "reset GPU 3")], "error": None},
        "gpu02": {"findings": [_finding("platform:page_size", "pass", "4 KiB pages"),
                               _finding("gpu:row_remap", "pass", "no remap")], "error": None},
        "gpu03": {"findings": [], "error": "UNREACHABLE"},
    }
    return build_report("preflight", "Preflight", hosts, "2025-06-01T12:00:00Z")


def test_filter_names():
    assert sorted(FILTERS) == NAMES
    for name in NAMES:
        assert FILTERS[name].__name__ == name and FILTERS[name].__doc__


@pytest.mark.parametrize("name,render", [("cluster_report_markdown", render_markdown), ("cluster_report_html", render_html),
                                         ("cluster_report_junit", render_junit), ("cluster_report_lines", render_lines)])
def test_filters_give_the_module_utils_texts(name, render):
    report = _report()
    assert FILTERS[name](report) == render(report)


def test_lines_limit_is_passed_on():
    lines = FILTERS["cluster_report_lines"](_report(), 1)
    assert lines[0] == "NO-GO: 2 fatal findings on 2 of 3 hosts"
    assert lines[3].startswith("FATAL FAIL ") and lines[-1] == "... 1 more finding group in the report"


def test_junit_filter_is_xml():
    root = ET.fromstring(FILTERS["cluster_report_junit"](_report()).encode("utf-8"))
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "1", "1")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [None, "text", ["a"], {"kind": "preflight"}])
def test_bad_report_is_a_filter_error(name, bad):
    with pytest.raises(AnsibleFilterError) as info:
        FILTERS[name](bad)
    assert str(info.value).startswith(name + ": ")


def test_malformed_report_is_a_filter_error():
    report = _report()
    report["rows"] = [{"hostlist": "x"}]
    with pytest.raises(AnsibleFilterError, match="cluster_report_markdown: malformed cluster report"):
        FILTERS["cluster_report_markdown"](report)


def test_bad_limit_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="cluster_report_lines: render_lines: limit is -2"):
        FILTERS["cluster_report_lines"](_report(), -2)
