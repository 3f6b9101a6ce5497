# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side rendering of a cluster report (preflight gate, drift). Documentation: the YAML files beside this one.

Thin wrappers over ``module_utils/_report/render``, where the report that ``module_utils/_report/cluster`` builds
(``build_report``) is rendered; they only turn bad input into ``AnsibleFilterError``:

* ``cluster_report_markdown(report)``, ``cluster_report_html(report)`` and ``cluster_report_junit(report)``
  give the Markdown, self-contained HTML and JUnit XML texts;
* ``cluster_report_lines(report, limit=10)`` the lines of a closing debug summary;
* ``collect_play(hostvars, kind, hosts, running_hosts)`` each host's inputs to a report, from the variables its
  play left (``module_utils/_report/play_collect``): the one loop over hostvars of diagnose.yml, preflight.yml and tune.yml.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils._filters import filter_table, malformed, named
from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import ClusterReportError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.render import render_html, render_junit, render_lines, render_markdown
from ansible_collections.gpunode.tuning.plugins.module_utils._report.play_collect import CollectError, collect_play


def cluster_report_markdown(report):
    """The report as Markdown."""
    return render_markdown(report)


def cluster_report_html(report):
    """The report as one self-contained HTML page."""
    return render_html(report)


def cluster_report_junit(report):
    """The report as JUnit XML."""
    return render_junit(report)


def cluster_report_lines(report, limit=10):
    """The report as a few lines for a debug summary."""
    return render_lines(report, limit)


class FilterModule(object):
    def filters(self):
        return filter_table({
            "cluster_report_markdown": cluster_report_markdown,
            "cluster_report_html": cluster_report_html,
            "cluster_report_junit": cluster_report_junit,
            "cluster_report_lines": cluster_report_lines,
            "collect_play": collect_play,
        }, [((ClusterReportError, CollectError), named),
            ((KeyError, TypeError, ValueError, AttributeError), malformed("cluster report"))])
