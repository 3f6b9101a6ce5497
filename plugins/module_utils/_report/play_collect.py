# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Each host's inputs to a cluster report, from the variables its play left: the one loop over hostvars.

Private module_utils of gpunode.tuning (controller side: the ``collect_play`` filter), standard library only.
``diagnose.yml``, ``preflight.yml`` and ``tune.yml`` each wrote this loop in Jinja, and the copies drifted; the
playbooks now pass ``hostvars`` here and the result to their report's collect filter (``diagnose_collect``,
``preflight_collect``, ``drift_collect``). A host of the play that is not among the hosts still running (it failed
or was unreachable) gets the error of its kind; the diagnose report has no error field (an unreachable host's
sampling result says why).
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.preflight import DRIFT_ROLES
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import sampling_result

KINDS = ("diagnose", "preflight", "drift")
FAILED = {
    "preflight": "the host failed or was unreachable before its checks ran",
    "drift": "the host failed or was unreachable: its roles did not finish",
}
DEFAULT_MAX_PENDING_SECONDS = 900


class CollectError(DetailedError):
    """A collect_play argument that is not what the playbooks pass."""


def _get(hostvars, name, default=None):
    """A host's variable, or ``default`` where the play never set it (Jinja's ``| default(...)``)."""
    return hostvars[name] if name in hostvars else default


def _softnet(hv):
    return sampling_result(_get(hv, "__diagnose_job", {}), _get(hv, "__diagnose_softnet", {}), _get(hv, "__diagnose_nic", {}))


def _diagnose(hv):
    nic_read = _get(hv, "__diagnose_nic", {})
    facts = nic_read.get("ansible_facts", {}) if isinstance(nic_read, Mapping) else {}
    return {"softnet": _softnet(hv), "nic": (facts or {}).get("nic_irq", {}) if isinstance(facts, Mapping) else {}}


def _preflight(hv):
    results = {"platform": _get(hv, "__preflight_platform"), "gpu": _get(hv, "__preflight_gpu"),
               "cpu_power": _get(hv, "__preflight_cpu_power"), "nic": _get(hv, "__diagnose_nic"),
               "softnet": _softnet(hv), "nccl": _get(hv, "__nccl_topology_result"), "checkpoint": None}
    if "__checkpoint_staging_result" in hv:
        results["checkpoint"] = dict(hv["__checkpoint_staging_result"], preflight_max_pending_seconds=_get(
            hv, "preflight_checkpoint_max_pending_seconds", DEFAULT_MAX_PENDING_SECONDS))
    return results


def _drift(hv):
    # the roles tune.yml runs, whose ``<role>_report`` facts make the drift report (_preflight.DRIFT_ROLES, in order)
    return dict((role, hv[role + "_report"]) for role in DRIFT_ROLES if role + "_report" in hv)


def collect_play(hostvars, kind, hosts, running_hosts):
    """``{host: inputs}`` for every host of ``hosts`` (ansible_play_hosts_all), in that order.

    ``kind`` diagnose: ``{softnet, nic}``; preflight: ``{results, error}``; drift: ``{reports, error}``, where
    ``error`` is None for a host in ``running_hosts`` (ansible_play_hosts) and says the host failed otherwise.
    """
    if kind not in KINDS:
        raise CollectError("collect_play kind %r: expected one of %s" % (kind, ", ".join(KINDS)), value=kind,
                           expected=" or ".join(KINDS))
    for name, value in (("hosts", hosts), ("running_hosts", running_hosts)):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise CollectError("collect_play %s is %r: expected a list of host names (ansible_play_hosts_all, "
                               "ansible_play_hosts)" % (name, value), value=value, expected="a list of host names")
    running = set(running_hosts)
    out = {}
    for host in hosts:
        hv = hostvars[host]
        if kind == "diagnose":
            out[host] = _diagnose(hv)
            continue
        error = None if host in running else FAILED[kind]
        if kind == "preflight":
            out[host] = {"results": _preflight(hv), "error": error}
        else:
            out[host] = {"reports": _drift(hv), "error": error}
    return out
