# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One report stack (issue 30): the Markdown and HTML pieces of ``_report.render`` are the only ones, and the
diagnose report is written with them, so it escapes every host text exactly as the cluster report does."""

from __future__ import annotations

import ast
from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils._report import diagnose as _diagnose
from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import build_report
from ansible_collections.gpunode.tuning.plugins.module_utils._report.diagnose import (
    diagnose_collect,
    diagnose_html,
    diagnose_markdown,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._report import render as R

REPORT_DIR = Path(_diagnose.__file__).resolve().parent


def test_md_table_escapes_every_cell_and_rules_one_column_per_header():
    assert R.md_table(("a|b", "c"), [("x<y", 3), ("back\\slash", "two\nlines")]) == [
        "| a\\|b | c |",
        "|---|---|",
        "| x\\<y | 3 |",
        "| back\\\\slash | two lines |",
    ]


def test_md_heading_section_and_item_escape_their_text_but_not_the_label():
    assert R.md_heading("a|b", 3) == "### a\\|b"
    assert R.md_section("What to fix") == ["", "## What to fix", ""]
    assert R.md_item("r|1", "**finding**: ") == "- **finding**: r\\|1"
    assert R.md_item("x", "fix: ", depth=1) == "  - fix: x"


def test_html_pieces_escape_and_frame_a_page():
    assert R.html_badge("v-idle", "a<b") == '<span class="badge v-idle">a&lt;b</span>'
    assert R.html_header_row(("a", "<b>")) == "<tr><th>a</th><th>&lt;b&gt;</th></tr>"
    page = R.html_page_close(R.html_page_open("T&1", "\nh1{}", viewport=False) + ["<p>x</p>"])
    assert page.startswith("<!DOCTYPE html>\n")
    assert "viewport" not in page
    assert "<title>T&amp;1</title>" in page and "<h1>T&amp;1</h1>" in page
    assert "<style>%s\nh1{}</style>" % R.BASE_CSS in page
    assert page.endswith("<p>x</p>\n</body></html>\n")


def test_no_other_escape_or_page_frame_under_report():
    """render.py holds the one Markdown escape and the one page frame: no other _report module calls html.escape,
    builds a table rule or writes a doctype."""
    for path in sorted(REPORT_DIR.glob("*.py")):
        if path.name == "render.py":
            continue
        text = path.read_text()
        tree = ast.parse(text)
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "escape"
                 and isinstance(node.value, ast.Name) and node.value.id == "html"]
        assert not calls, path.name
        assert "|---|" not in text, path.name
        assert "<!DOCTYPE" not in text, path.name


HOSTILE = {
    "evil|<b>\\x": {"softnet": {
        "verdict": "contention", "reasons": ["a | b"], "interface": "en|s<7", "pci_address": "0000:3b:00.0",
        "driver": "mlx5", "irq_cpus": [0], "hot_cpus": [0], "interval": 1.0, "cpus": [],
        "totals": {}, "link": {"speed_mbps": 100}, "notes": ["n<1>"],
    }},
}


def test_diagnose_markdown_escapes_heading_and_facts_like_every_table_cell():
    text = diagnose_markdown(diagnose_collect(HOSTILE, "now|<"))
    assert "Generated now\\|\\<." in text
    assert "### evil\\|\\<b>\\\\x: contention" in text
    assert "interface en\\|s\\<7, PCI 0000:3b:00.0, driver mlx5" in text
    assert "| evil\\|\\<b>\\\\x | **contention** | en\\|s\\<7 |" in text
    assert "- a \\| b" in text
    assert "- note: n\\<1>" in text
    for line in text.splitlines():
        assert "<b>" not in line.replace("\\<b>", "")


def test_diagnose_and_cluster_pages_share_the_frame():
    diagnose_page = diagnose_html(diagnose_collect(HOSTILE))
    cluster_page = R.render_html(build_report("preflight", "t", {"a": {"findings": [], "error": None}}, "now"))
    for page in (diagnose_page, cluster_page):
        assert page.startswith('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n')
        assert "<style>%s" % R.BASE_CSS in page
        assert page.endswith("</body></html>\n")
    assert diagnose_page.count("<!DOCTYPE") == 1


def test_cluster_grid_of_hosts_with_no_check_is_a_well_formed_table():
    """A report whose hosts reported nothing has no check column: the grid's header, rule and rows have the
    same three cells (the hand-written table had a fourth, empty cell in the header and rows only)."""
    text = R.render_markdown(build_report("preflight", "t", {"n1": {"findings": [], "error": None}}, "now"))
    lines = text.splitlines()
    start = lines.index("| hosts | count | worst |")
    assert lines[start + 1:start + 3] == ["|---|---|---|", "| n1 | 1 | ? |"]
