# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpu_power_facts: every input checked first, then the idle, frequency, NUMA and GPU parts read and judged.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``cpu_power_facts(params, run)`` is the whole module behind its
argument parsing: ``params`` as the module's options, ``run`` a command runner
(None on a captured tree: no command runs there).
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.freq import (
    FreqError, check_governor, judge_freq, judge_measured, measure, read_freq)
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.idle import judge_idle, read_idle
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_raw
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import root_of
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.numa_placement import (
    NumaPlacementError, judge_placement, numa_balancing, process_placement, select_processes)
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.nvidia_topo import (
    TopoError, gpu_local_cpus, nic_paths, parse_topo_matrix)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology
from ansible_collections.gpunode.tuning.plugins.module_utils._host.virt import detect_virt

MAX_SAMPLE_SECONDS = 600


class CpuPowerError(DetailedError):
    """Bad input: ``details`` names the option, the value and what was expected."""


def _pct(params, name):
    value = params[name]
    if value is None or not 0 <= value <= 100:
        raise CpuPowerError("%s %r is outside 0-100 %%" % (name, value), option=name, value=value,
                            expected="a percentage from 0 to 100")
    return value


def validate(params):
    """Every option checked before anything is read; returns the parsed ones."""
    for name in ("busy_pct", "min_frequency_pct", "remote_threshold_pct"):
        _pct(params, name)
    seconds = params["sample_seconds"] or 0
    if not 0 <= seconds <= MAX_SAMPLE_SECONDS:
        raise CpuPowerError("sample_seconds %r is outside 0-%d" % (seconds, MAX_SAMPLE_SECONDS), option="sample_seconds",
                            value=seconds, expected="seconds from 0 to %d" % MAX_SAMPLE_SECONDS)
    irq_cpus = None
    if params.get("irq_cpus") not in (None, "", []):
        try:
            irq_cpus = set(parse_cpulist(params["irq_cpus"]))
        except CpuListError as exc:
            raise CpuPowerError("irq_cpus %r is not a CPU list: %s" % (params["irq_cpus"], exc), option="irq_cpus",
                                value=params["irq_cpus"], expected="a CPU list such as 0-10 or a list of integers")
    topo = params.get("gpu_topology") or "auto"
    if topo not in ("auto", "never") and not os.path.isfile(topo):
        raise CpuPowerError("gpu_topology %r is neither auto, never nor a file" % topo, option="gpu_topology", value=topo,
                            expected="auto, never, or the path of a saved nvidia-smi topo -m output")
    return {"seconds": seconds, "irq_cpus": irq_cpus, "gpu_topology": topo}


def _gpus(topo, run):
    if topo == "never":
        return {"available": False, "reason": "gpu_topology is never"}
    if topo == "auto":
        if run is None:
            return {"available": False, "reason": "a captured tree: nvidia-smi is not run"}
        rc, out, err = run(["nvidia-smi", "topo", "-m"])
        if rc == 127:
            return {"available": False, "reason": "nvidia-smi is not installed"}
        if rc != 0:
            return {"available": False, "reason": "nvidia-smi topo -m failed (rc %d): %s" % (rc, (err or out).strip()[:300])}
        text, source = out, "nvidia-smi topo -m"
    else:
        text, source = read_raw(topo, ""), topo
    try:
        parsed = parse_topo_matrix(text)
    except TopoError as exc:
        return {"available": False, "reason": "%s: %s" % (source, exc)}
    return {"available": True, "source": source, "topology": parsed,
            "local_cpus": gpu_local_cpus(parsed), "nic_paths": nic_paths(parsed)}


def cpu_power_facts(params, run=None, sleep=None):
    """The module's result (without ``changed``)."""
    checked = validate(params)
    procfs, sysfs = params["procfs_path"], params["sysfs_path"]
    root = root_of(procfs)
    try:
        pids = select_processes(procfs, pids=params.get("pids") or (), name_patterns=params.get("process_patterns") or ())
    except NumaPlacementError as exc:
        raise CpuPowerError(str(exc), **getattr(exc, "details", {}))
    freq = read_freq(sysfs, procfs)
    governor = params.get("governor") or None
    if governor:
        try:
            check_governor(freq, governor)
        except FreqError as exc:
            raise CpuPowerError(str(exc), option="governor", **exc.details)

    virt = detect_virt(sysfs, procfs)
    idle = read_idle(sysfs, procfs, dev=join(root, "dev"), root=root)
    result = {
        "virtualization": virt,
        "idle": dict(judge_idle(idle, virt), cpus=dict((str(c), s) for c, s in idle["cpus"].items()),
                     cmdline_limits=idle["cmdline_limits"], module_params=idle["module_params"],
                     cpu_dma_latency_us=idle["cpu_dma_latency_us"], pm_qos_holders=idle["pm_qos_holders"],
                     tuned=idle["tuned"], resume_latency_us=dict((str(c), v) for c, v in idle["resume_latency_us"].items())),
        "frequency": dict(judge_freq(freq, virt, governor), policies=dict((str(k), v) for k, v in freq["policies"].items()),
                          boost=freq["boost"], intel_pstate=freq["intel_pstate"], amd_pstate=freq["amd_pstate"],
                          cmdline=freq["cmdline"]),
    }
    if checked["seconds"]:
        kwargs = {} if sleep is None else {"sleep": sleep}
        measured = measure(sysfs, procfs, join(root, "dev"), checked["seconds"], idle["online"], freq["policies"], **kwargs)
        result["measured"] = dict(judge_measured(measured, freq["policies"], params["busy_pct"], params["min_frequency_pct"]),
                                  cpus=dict((str(c), v) for c, v in measured["cpus"].items()), seconds=measured["seconds"])
    topology = read_topology(sysfs, procfs)
    placements = [p for p in (process_placement(procfs, sysfs, pid, topology=topology) for pid in pids) if p is not None]
    result["numa"] = {"numa_balancing": numa_balancing(procfs), "processes": placements,
                      "irq_cpus": None if checked["irq_cpus"] is None else format_cpulist(checked["irq_cpus"]),
                      "findings": judge_placement(placements, params["remote_threshold_pct"], checked["irq_cpus"])}
    result["gpus"] = _gpus(checked["gpu_topology"], run)
    result["findings"] = findings(result)
    return result


STATUS = {"deep_cstate_reachable": "pass", "ok": "pass", "limited": "fail", "low": "fail",
          "not_visible": "not_visible", "unknown": "unknown"}
CHECKS = ("idle", "frequency", "measured", "numa_remote", "numa_irq_cpus")


def findings(result):
    """One line per check for a gate: ``{"check", "status" (pass, fail, not_visible, unknown), "message"}``;
    ``not_visible`` is never a pass (the role warns on it)."""
    out = []
    for check in ("idle", "frequency", "measured"):
        part = result.get(check)
        if part is None:
            continue
        if check == "measured":
            message = part["message"]
        elif part["verdict"] in ("deep_cstate_reachable", "ok"):
            message = "deep C-states reachable on CPUs %s (deepest enabled %s)" % (
                part["reachable_cpus"], part["deepest_enabled"]) if check == "idle" else \
                "governors %s, turbo on, no cap" % ", ".join("%s on %s" % kv for kv in sorted(part["governors"].items()))
        else:
            message = "; ".join(c["message"] for c in part["causes"])
        out.append({"check": check, "status": STATUS[part["verdict"]], "verdict": part["verdict"], "message": message})
    for finding in result["numa"]["findings"]:
        for rule in ("remote_memory", "irq_cpus") if result["numa"]["irq_cpus"] is not None else ("remote_memory",):
            check = "numa_remote" if rule == "remote_memory" else "numa_irq_cpus"
            flagged = rule in (finding.get("rules") or [])
            out.append({"check": check, "status": "fail" if flagged else "pass", "pid": finding["pid"],
                        "verdict": "flagged" if flagged else "ok",
                        "message": "%s (pid %d): %s" % (finding["name"], finding["pid"],
                                                        "; ".join(finding["reasons"]) or "placement ok")})
    return out
