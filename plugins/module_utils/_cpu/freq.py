# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpu_power_facts, frequency part: cpufreq policies, turbo, caps, and the busy-core frequency measured.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. Facts used (the kernel's admin-guide/pm/cpufreq.rst, intel_pstate.rst
and amd-pstate.rst, and turbostat's arithmetic in tools/power/x86/turbostat):

- ``devices/system/cpu/cpufreq/policyN/{affected_cpus,related_cpus,scaling_driver,scaling_governor,
  scaling_available_governors,scaling_min_freq,scaling_max_freq,cpuinfo_min_freq,cpuinfo_max_freq,
  scaling_cur_freq}`` in kHz; ``cpuinfo_max_freq`` includes turbo where the driver knows it;
- turbo: ``intel_pstate/no_turbo`` (1 = off; the kernel also shows 1 when the BIOS disabled turbo) and
  ``cpufreq/boost`` (acpi-cpufreq, amd-pstate; 0 = off); ``intel_pstate/max_perf_pct`` below 100 caps it;
- ``intel_pstate=disable`` on the command line (tuned's cpu-partitioning profile adds it) hands the CPUs to
  acpi-cpufreq, which cannot request turbo per core;
- measured: over an interval, Bzy_MHz = (TSC delta / interval) * (APERF delta / MPERF delta) with MSRs 0x10
  (TSC), 0xE8 (APERF), 0xE7 (MPERF) read through ``/dev/cpu/N/msr`` (the msr module), and Busy% = MPERF delta /
  TSC delta, as turbostat computes them. Without readable MSRs (no msr module, a VM that does not pass them) the
  fallback is the mean of ``scaling_cur_freq`` read during the interval, and the CPU's busy share from
  /proc/stat.
"""

from __future__ import annotations

import os
import re
import struct
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_int, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import norm, param_key, split_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import mpstat_percentages, parse_proc_stat

MSR_TSC, MSR_MPERF, MSR_APERF = 0x10, 0xE7, 0xE8
_POLICY_RE = re.compile(r"^policy(\d+)$")
POLICY_FILES = ("scaling_driver", "scaling_governor", "energy_performance_preference")
POLICY_INTS = ("scaling_min_freq", "scaling_max_freq", "cpuinfo_min_freq", "cpuinfo_max_freq", "scaling_cur_freq",
               "base_frequency")
PSTATE_FILES = ("status", "no_turbo", "max_perf_pct", "min_perf_pct", "hwp_dynamic_boost", "turbo_pct")
FREQ_CMDLINE_KEYS = ("intel_pstate", "amd_pstate", "cpufreq.off", "cpufreq.default_governor")


class FreqError(DetailedError):
    """Bad input for the frequency part (a governor the driver does not offer...); ``details`` names the value."""


def read_policies(sysfs):
    """``{policy_index: {...}}`` for every cpufreq policy directory."""
    base = join(sysfs, "devices/system/cpu/cpufreq")
    policies = {}
    for entry in list_dir(base):
        match = _POLICY_RE.match(entry)
        if not match:
            continue
        path = join(base, entry)
        policy = {"name": entry, "cpus": read_cpulist(join(path, "affected_cpus"), default=[]),
                  "related_cpus": read_cpulist(join(path, "related_cpus"), default=[]),
                  "available_governors": (read_text(join(path, "scaling_available_governors")) or "").split()}
        for name in POLICY_FILES:
            policy[name.replace("scaling_", "")] = read_text(join(path, name))
        for name in POLICY_INTS:
            policy[name] = read_int(join(path, name))
        policies[int(match.group(1))] = policy
    return policies


def read_freq(sysfs="/sys", procfs="/proc"):
    cpu_dir = join(sysfs, "devices/system/cpu")
    cmdline = [norm(t) for t in split_cmdline(read_text(join(procfs, "cmdline")) or "")
               if param_key(t) in FREQ_CMDLINE_KEYS]
    pstate = join(cpu_dir, "intel_pstate")
    return {
        "policies": read_policies(sysfs),
        "boost": read_int(join(cpu_dir, "cpufreq/boost")),
        "intel_pstate": None if not os.path.isdir(pstate) else dict(
            (name, read_text(join(pstate, name))) for name in PSTATE_FILES),
        "amd_pstate": read_text(join(cpu_dir, "amd_pstate/status")),
        "cmdline": cmdline,
    }


def check_governor(freq, governor):
    """Refuse a governor that some policy's driver does not offer; the policies that offer none are skipped."""
    missing = sorted(p["name"] for p in freq["policies"].values()
                     if p["available_governors"] and governor not in p["available_governors"])
    if missing:
        offered = sorted(set(g for p in freq["policies"].values() for g in p["available_governors"]))
        raise FreqError("governor %r is not offered by the cpufreq driver on %s (it offers %s)"
                        % (governor, ", ".join(missing), ", ".join(offered)), value=governor, expected=offered)


def judge_freq(freq, virt, governor="performance"):
    """``ok``, ``limited`` or ``not_visible``, with causes quoting the files; ``governor`` is the expected one
    (None: any)."""
    causes, notes = [], []
    policies = freq["policies"]
    drivers = sorted(set(p["driver"] for p in policies.values() if p["driver"]))
    governors = {}
    for p in policies.values():
        governors.setdefault(p["governor"], []).extend(p["cpus"])
    result = {"drivers": drivers, "governors": dict((g or "unknown", format_cpulist(c)) for g, c in governors.items()),
              "causes": causes, "notes": notes}
    for param in freq["cmdline"]:
        if param == "intel_pstate=disable":
            causes.append({"cause": "intel_pstate_disabled", "message": "the kernel command line has intel_pstate="
                           "disable (tuned's cpu-partitioning adds it): acpi-cpufreq runs instead and cannot request "
                           "turbo per core as intel_pstate does"})
        elif param in ("cpufreq.off=1",):
            causes.append({"cause": "cpufreq_off", "message": "the kernel command line has cpufreq.off=1"})
    if not policies:
        if virt.get("virtualized"):
            causes.append({"cause": "vm", "message": "a %s guest without cpufreq: frequency and turbo are the host's; "
                           "check turbo and the governor on the host" % virt.get("type")})
            result["verdict"] = "not_visible"
        else:
            causes.append({"cause": "no_driver", "message": "no cpufreq driver on bare metal: the firmware controls "
                           "frequency (BIOS power profile / OS control off) or the driver is not loaded"})
            result["verdict"] = "not_visible" if not causes[:-1] else "limited"
        return result
    pstate = freq["intel_pstate"] or {}
    if pstate.get("no_turbo") == "1":
        causes.append({"cause": "turbo_off", "message": "intel_pstate/no_turbo is 1: turbo is off (by this file, "
                       "or by the BIOS, which the kernel shows the same way)"})
    if freq["boost"] == 0:
        causes.append({"cause": "turbo_off", "message": "cpufreq/boost is 0: boost/turbo is off"})
    if pstate.get("max_perf_pct") and pstate["max_perf_pct"].isdigit() and int(pstate["max_perf_pct"]) < 100:
        causes.append({"cause": "capped", "message": "intel_pstate/max_perf_pct is %s: the P-state is capped below "
                       "the maximum" % pstate["max_perf_pct"]})
    capped = dict((cpu, p) for p in policies.values() for cpu in p["cpus"]
                  if p["scaling_max_freq"] and p["cpuinfo_max_freq"] and p["scaling_max_freq"] < p["cpuinfo_max_freq"])
    if capped:
        sample = next(iter(capped.values()))
        causes.append({"cause": "capped", "cpus": format_cpulist(capped),
                       "message": "scaling_max_freq below cpuinfo_max_freq on CPUs %s (e.g. %s: %d kHz of %d kHz)"
                       % (format_cpulist(capped), sample["name"], sample["scaling_max_freq"], sample["cpuinfo_max_freq"])})
    if governor:
        other = dict((g, c) for g, c in governors.items() if g != governor)
        if other:
            causes.append({"cause": "governor", "expected": governor,
                           "message": "governor %s on CPUs %s, expected %s" % (
                               ", ".join(sorted(g or "unknown" for g in other)),
                               format_cpulist([c for cpus in other.values() for c in cpus]), governor)})
    result["verdict"] = "limited" if causes else "ok"
    return result


def _read_msr(dev, cpu, reg):
    fd = os.open(join(dev, "cpu", str(cpu), "msr"), os.O_RDONLY)
    try:
        data = os.pread(fd, 8, reg)
    finally:
        os.close(fd)
    if len(data) != 8:
        raise OSError("short MSR read")
    return struct.unpack("<Q", data)[0]


def _msr_sample(dev, cpus):
    out = {}
    for cpu in cpus:
        try:
            out[cpu] = (_read_msr(dev, cpu, MSR_TSC), _read_msr(dev, cpu, MSR_APERF), _read_msr(dev, cpu, MSR_MPERF))
        except OSError:
            return None
    return out


def _cur_freqs(sysfs, policies):
    out = {}
    for p in policies.values():
        if p["cpus"]:
            value = read_int(join(sysfs, "devices/system/cpu/cpufreq", p["name"], "scaling_cur_freq"))
            if value:
                for cpu in p["cpus"]:
                    out[cpu] = value
    return out


def measure(sysfs, procfs, dev, seconds, cpus, policies, sleep=time.sleep, clock=time.monotonic, reads=5):
    """Busy share and frequency per CPU over ``seconds``: APERF/MPERF where the MSRs read, else scaling_cur_freq.

    ``{"method": "aperf_mperf"|"scaling_cur_freq"|None, "seconds": float, "cpus": {cpu: {"busy_pct", "mhz"}}}``."""
    stat_path = join(procfs, "stat")
    first_stat = parse_proc_stat(read_text(stat_path) or "")
    msr_first = _msr_sample(dev, cpus)
    start = clock()
    cur = dict((cpu, []) for cpu in cpus)
    for dummy in range(reads):
        sleep(float(seconds) / reads)
        for cpu, value in _cur_freqs(sysfs, policies).items():
            if cpu in cur:
                cur[cpu].append(value)
    msr_second = _msr_sample(dev, cpus) if msr_first is not None else None
    elapsed = clock() - start
    second_stat = parse_proc_stat(read_text(stat_path) or "")
    per_cpu = {}
    method = "aperf_mperf" if msr_second is not None else ("scaling_cur_freq" if any(cur.values()) else None)
    for cpu in cpus:
        entry = {"busy_pct": None, "mhz": None}
        if cpu in first_stat and cpu in second_stat:
            pct = mpstat_percentages(first_stat[cpu], second_stat[cpu])
            entry["busy_pct"] = round(100.0 - pct["idle"] - pct.get("iowait", 0.0), 2)
        if method == "aperf_mperf":
            tsc = msr_second[cpu][0] - msr_first[cpu][0]
            aperf = msr_second[cpu][1] - msr_first[cpu][1]
            mperf = msr_second[cpu][2] - msr_first[cpu][2]
            if mperf > 0 and elapsed > 0:
                entry["mhz"] = round(tsc / elapsed / 1e6 * aperf / mperf, 1)
                entry["busy_pct"] = round(100.0 * mperf / tsc, 2) if tsc else entry["busy_pct"]
        elif cur.get(cpu):
            entry["mhz"] = round(sum(cur[cpu]) / len(cur[cpu]) / 1000.0, 1)
        per_cpu[cpu] = entry
    return {"method": method, "seconds": round(elapsed, 3), "cpus": per_cpu}


def judge_measured(measured, policies, busy_pct=50.0, min_ratio_pct=90.0):
    """The busy-core frequency against the rated maximum (cpuinfo_max_freq): ``ok``, ``low``, or ``unknown``."""
    rated = dict((cpu, p["cpuinfo_max_freq"]) for p in policies.values() for cpu in p["cpus"] if p["cpuinfo_max_freq"])
    busy = dict((cpu, e) for cpu, e in measured["cpus"].items()
                if e["busy_pct"] is not None and e["busy_pct"] >= busy_pct and e["mhz"])
    result = {"method": measured["method"], "busy_cpus": format_cpulist(busy), "busy_mhz": None, "rated_mhz": None}
    if not busy or not rated:
        result["verdict"] = "unknown"
        result["message"] = ("no CPU was at least %.0f %% busy" % busy_pct) if not busy else \
            "no rated maximum (cpuinfo_max_freq) to compare with"
        return result
    mhz = sum(e["mhz"] for e in busy.values()) / len(busy)
    top = max(rated.get(cpu, 0) for cpu in busy) / 1000.0
    result.update(busy_mhz=round(mhz, 1), rated_mhz=round(top, 1), ratio_pct=round(100.0 * mhz / top, 1) if top else None)
    low = top and 100.0 * mhz / top < min_ratio_pct
    result["verdict"] = "low" if low else "ok"
    result["message"] = "busy CPUs %s ran at %.0f MHz, %.0f %% of the rated %.0f MHz (%s)" % (
        format_cpulist(busy), mhz, 100.0 * mhz / top if top else 0, top, measured["method"])
    return result
