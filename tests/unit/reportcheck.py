# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Readers of a written cluster report for the playbook tests (tests/integration) and the lab (molecule/preflight):
the HTML page's gate and grid rows, and the JUnit file validated against Jenkins' junit-10.xsd. Independent of
module_utils/_report/cluster and _report/render, so a bug there cannot confirm itself."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

XSD = Path(__file__).resolve().parent / "fixtures" / "junit" / "junit-10.xsd"


class Grid(HTMLParser):
    """``gate``: the class of the element with id ``gate``; ``rows``: the ``<tr class="row">`` count."""

    def __init__(self):
        HTMLParser.__init__(self)
        self.gate, self.rows = None, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id") == "gate":
            self.gate = attrs.get("class")
        if tag == "tr" and "row" in (attrs.get("class") or "").split():
            self.rows += 1


def grid(path):
    page = Grid()
    page.feed(Path(path).read_text())
    return page


def junit(path):
    """The JUnit file's root element, after lxml validated it against the XSD."""
    from lxml import etree  # test-only dependency (requirements-dev.txt)

    schema = etree.XMLSchema(etree.parse(str(XSD)))
    doc = etree.parse(str(path))
    assert schema.validate(doc), schema.error_log
    return ET.parse(str(path)).getroot()
