# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side preflight gate and drift report. Documentation: the YAML files beside this one.

Thin wrappers over ``module_utils/_report/preflight`` (findings and policy) and ``module_utils/_report/cluster`` (the
report); they only turn bad input into ``AnsibleFilterError``:

* ``preflight_policy(policy)`` validates a policy (playbooks/files/preflight_policy.yml is the default);
* ``preflight_collect(results, policy, generated_at)`` makes the preflight report from every host's module results;
* ``drift_collect(results, generated_at)`` makes tune.yml's drift report from every host's role report facts.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils._filters import filter_table, named
from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import ClusterReportError, build_report
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import FindingError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.preflight import (
    PreflightError,
    check_policy,
    collect,
    drift_collect_hosts,
)

DRIFT_LABELS = {"go": "IN SYNC", "no_go": "DRIFT"}


def preflight_policy(policy):
    """The policy, validated."""
    return check_policy(policy)


def preflight_collect(results, policy, generated_at):
    """``{host: {results: {source: module result}, error}}`` -> the preflight cluster report."""
    return build_report("preflight", "gpunode.tuning preflight", collect(results, policy), generated_at)


def drift_collect(results, generated_at, check_mode=True):
    """``{host: {reports: {role: report fact}, error}}`` -> the drift cluster report (tune.yml)."""
    title = "gpunode.tuning drift report (tune.yml --check)" if check_mode else "gpunode.tuning tune report (changes applied)"
    return build_report("drift", title, drift_collect_hosts(results, applied=not check_mode), generated_at,
                        gate_labels=DRIFT_LABELS)


class FilterModule:
    """gpunode.tuning preflight and drift report filters."""

    def filters(self):
        return filter_table({
            "preflight_policy": preflight_policy,
            "preflight_collect": preflight_collect,
            "drift_collect": drift_collect,
        }, [((PreflightError, ClusterReportError, FindingError), named)])
