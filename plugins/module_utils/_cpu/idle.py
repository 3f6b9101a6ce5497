# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpu_power_facts, idle part: the cpuidle states each CPU has, what limits them, and a verdict.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. Readers take the roots (``sysfs``, ``procfs``, ``dev``, ``root`` for
/etc and /usr) so a captured tree answers as the live host would.

Facts used (the kernel's Documentation/admin-guide/pm/cpuidle.rst, the PM QoS
interface docs, and commit 0759e80b84e3 "PM / QoS: Fix device resume latency
framework"):

- per CPU ``devices/system/cpu/cpuN/cpuidle/stateK/{name,desc,latency,residency,usage,time,disable,default_status,
  above,below}``; latency and residency in microseconds; ``disable`` is the one writable file and is per CPU;
- ``cpuidle/current_driver`` and ``current_governor`` (``current_governor_ro`` on kernels without governor
  switching); with the ``ladder`` governor a disabled shallow state also keeps every deeper one from being
  entered, without its ``disable`` file saying so;
- the kernel limits states with ``intel_idle.max_cstate=``, ``processor.max_cstate=``, ``intel_idle.states_off=``,
  ``idle=poll|halt|nomwait`` and ``cpuidle.off=1``;
- user space limits them with an open ``/dev/cpu_dma_latency`` (a request lives only while its descriptor is
  open; reading the device gives the aggregate limit as a native s32 in microseconds, 2000000000 when nobody
  asks), and with ``cpuN/power/pm_qos_resume_latency_us`` (``0`` no limit, ``n/a`` no latency at all, N µs);
- a VM without idle-state passthrough has no cpuidle states (``none`` driver) or only ``haltpoll``: the C-states
  that matter are the host's, and the guest cannot see them.

"Deep" here: any state that is not halt-class - not ``POLL``, ``C1``, ``C1E`` (or their ``_ACPI`` and model-suffixed
``C1-HSW``/``C1E-SKX`` forms), ARM's ``WFI`` or ``haltpoll`` - so the C3/C6/CC6-class states that give an idle
core's power budget to the busy ones. NVIDIA's dgxc-benchmarking ``check_cpu_cstates`` warns when CPU 0 exposes
two or fewer states or any state is disabled; that rule is reported as its own finding.
"""

from __future__ import annotations

import os
import re
import struct

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_int, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import norm, param_key, split_cmdline

STATE_FILES = ("name", "desc", "latency", "residency", "usage", "time", "disable", "default_status", "above", "below")
INT_FILES = ("latency", "residency", "usage", "time", "disable", "above", "below")
# Kernel parameters that limit idle states (key -> what it does), as the cpuidle admin guide lists them.
LIMIT_PARAMS = {
    "intel_idle.max_cstate": "limits intel_idle to states up to this index (0 disables intel_idle)",
    "processor.max_cstate": "limits acpi_idle to C-states up to this number",
    "intel_idle.states_off": "disables the intel_idle states of this bit mask",
    "idle": "replaces the idle driver (poll: busy polling; halt/nomwait: no MWAIT states)",
    "cpuidle.off": "switches cpuidle off (the architecture's default idle only)",
}
# The keys the cpu_power role's cpu_power_fix_kernel_limits takes off the next boot's command line.
LIMIT_KEYS = ("intel_idle.max_cstate", "processor.max_cstate", "intel_idle.states_off", "idle", "cpuidle.off")
CPU_DMA_LATENCY_DEFAULT = 2000000000
VM_DRIVERS = ("haltpoll",)
# Halt-class states by what they are, not by one spelling. intel_idle named its states with a model suffix until
# v5.x ("C1-NHM", "C1E-SNB", "C1-BYT", "C1-HSW", "C1E-SKX", "C1-IVT-4S"...; the tables of drivers/idle/intel_idle.c as
# stored for torvalds/linux and its mirrors, read with the search tool: library index ids 48503531, 147206694,
# 119647648) and without it since ("C1", "C1E", "C6", "C6S", "C6SP", "C10"); acpi_idle says "C1_ACPI", "C2_ACPI"...
# (older kernels "C1".."C3"); ARM PSCI/DT "WFI"; cpuidle-haltpoll "haltpoll"; POLL is matched by is_poll. Only the
# C1 family (C1, C1E) is halt-class: every other C-number (Atom's C2, C3, C4, C6N/C6S, C6P, C7s, C8-C10, AMD's
# C2_ACPI = CC6) gives the core's power budget away.
SHALLOW_RE = re.compile(r"^(?:C1E?(?:_ACPI)?(?:-[A-Z0-9]+)*|WFI|haltpoll)\Z", re.I)
_STATE_RE = re.compile(r"^state(\d+)$")
_CPU_RE = re.compile(r"^cpu(\d+)$")
TUNED_PROFILE_DIRS = ("etc/tuned/profiles", "etc/tuned", "usr/lib/tuned/profiles", "usr/lib/tuned")


class IdleError(DetailedError):
    """Bad input for the idle part (a CPU or state that does not exist); ``details`` names the value."""


def is_poll(state):
    """The polling pseudo-state (``POLL``, desc ``CPUIDLE CORE POLL IDLE``): not a C-state."""
    return (state.get("name") or "").upper() == "POLL" or "POLL IDLE" in (state.get("desc") or "").upper()


def read_states(sysfs, cpu):
    """The cpuidle states of one CPU, by index, each with the files of STATE_FILES (ints where numeric)."""
    base = join(sysfs, "devices/system/cpu", "cpu%d" % cpu, "cpuidle")
    states = []
    for entry in list_dir(base):
        match = _STATE_RE.match(entry)
        if not match:
            continue
        state = {"index": int(match.group(1))}
        for name in STATE_FILES:
            path = join(base, entry, name)
            state[name] = read_int(path) if name in INT_FILES else read_text(path)
        states.append(state)
    return sorted(states, key=lambda s: s["index"])


def cmdline_limits(procfs):
    """The idle-limiting parameters of the running kernel's command line: ``[{"param", "value", "effect"}]``."""
    found = []
    for token in split_cmdline(read_text(join(procfs, "cmdline")) or ""):
        key = param_key(token)
        if key in LIMIT_PARAMS:
            text = norm(token)
            found.append({"param": text, "key": key, "value": text.split("=", 1)[1] if "=" in text else None,
                          "effect": LIMIT_PARAMS[key]})
    return found


def pm_qos_holders(procfs):
    """Processes holding /dev/cpu_dma_latency open: ``[{"pid", "comm"}]`` (from /proc/PID/fd links)."""
    holders = []
    for pid in list_dir(procfs):
        if not pid.isdigit():
            continue
        fd_dir = join(procfs, pid, "fd")
        for fd in list_dir(fd_dir):
            try:
                target = os.readlink(join(fd_dir, fd))
            except OSError:
                continue
            if target == "/dev/cpu_dma_latency":
                holders.append({"pid": int(pid), "comm": read_text(join(procfs, pid, "comm"))})
                break
    return sorted(holders, key=lambda h: h["pid"])


def cpu_dma_latency(dev):
    """The aggregate CPU latency limit in µs (reading /dev/cpu_dma_latency), or None when unreadable.

    A captured tree may store it as the 4 binary bytes or as decimal text."""
    path = join(dev, "cpu_dma_latency")
    try:
        with open(path, "rb") as handle:
            data = handle.read(16)
    except OSError:
        return None
    if len(data) == 4:
        return struct.unpack("=i", data)[0]
    try:
        return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


def _ini_sections(text):
    sections, current = {}, None
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
        elif current is not None and "=" in line:
            key, dummy, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def tuned_force_latency(root, procfs):
    """The active tuned profile(s) and the ``force_latency`` of their ``[cpu]`` sections (includes followed).

    ``{"profiles": [...], "running": bool, "force_latency": str or None, "from": profile or None}``; None when
    tuned has no active_profile file."""
    active = read_text(join(root, "etc/tuned/active_profile"))
    if active is None:
        return None
    profiles = active.split()
    running = any(read_text(join(procfs, pid, "comm")) == "tuned" for pid in list_dir(procfs) if pid.isdigit())
    found, origin, seen = None, None, set()

    def visit(name, depth):
        nonlocal found, origin
        if name in seen or depth > 10:
            return
        seen.add(name)
        for directory in TUNED_PROFILE_DIRS:
            text = read_text(join(root, directory, name, "tuned.conf"))
            if text is not None:
                break
        else:
            return
        sections = _ini_sections(text)
        for parent in [p.strip() for p in sections.get("main", {}).get("include", "").split(",") if p.strip()]:
            visit(parent, depth + 1)
        for section, values in sections.items():
            if (section == "cpu" or values.get("type") == "cpu") and "force_latency" in values:
                found, origin = values["force_latency"], name

    for profile in profiles:
        visit(profile, 0)
    return {"profiles": profiles, "running": running, "force_latency": found, "from": origin}


def read_idle(sysfs="/sys", procfs="/proc", dev="/dev", root="/", cpus=None):
    """Everything the verdict needs, read once. ``cpus`` defaults to the online CPUs."""
    cpu_dir = join(sysfs, "devices/system/cpu")
    online = read_cpulist(join(cpu_dir, "online"))
    if online is None:
        online = sorted(int(m.group(1)) for m in (_CPU_RE.match(n) for n in list_dir(cpu_dir)) if m)
    cpus = online if cpus is None else sorted(cpus)
    per_cpu, resume = {}, {}
    for cpu in cpus:
        per_cpu[cpu] = read_states(sysfs, cpu)
        value = read_text(join(cpu_dir, "cpu%d" % cpu, "power/pm_qos_resume_latency_us"))
        if value is not None:
            resume[cpu] = value
    module_params = {}
    for module, param in (("intel_idle", "max_cstate"), ("intel_idle", "states_off"), ("processor", "max_cstate")):
        value = read_text(join(sysfs, "module", module, "parameters", param))
        if value is not None:
            module_params["%s.%s" % (module, param)] = value
    cpuidle = join(cpu_dir, "cpuidle")
    return {
        "cpuidle_dir": os.path.isdir(cpuidle),
        "driver": read_text(join(cpuidle, "current_driver")),
        "governor": read_text(join(cpuidle, "current_governor")) or read_text(join(cpuidle, "current_governor_ro")),
        "available_governors": (read_text(join(cpuidle, "available_governors")) or "").split(),
        "online": online,
        "cpus": per_cpu,
        "resume_latency_us": resume,
        "cmdline_limits": cmdline_limits(procfs),
        "module_params": module_params,
        "cpu_dma_latency_us": cpu_dma_latency(dev),
        "pm_qos_holders": pm_qos_holders(procfs),
        "tuned": tuned_force_latency(root, procfs),
    }


def _describe(state):
    return "%s (%s us exit latency, %s us target residency)" % (state["name"], state.get("latency"), state.get("residency"))


def _blocked_by_ladder(states):
    """Indexes a ladder governor cannot reach: every state after the first disabled non-POLL one."""
    blocked, hit = set(), False
    for state in states:
        if is_poll(state):
            continue
        if hit:
            blocked.add(state["index"])
        elif state.get("disable"):
            hit = True
    return blocked


def is_shallow(state):
    """A halt-class state: POLL, C1, C1E (with their _ACPI and model-suffixed forms such as C1E-SKX), WFI, haltpoll."""
    return is_poll(state) or bool(SHALLOW_RE.match(state.get("name") or ""))


def summarize_states(states):
    """One CPU's states split: halt-class (POLL excluded) and deep ones (everything else: C3, C6, CC6, C10...)."""
    halt = [s for s in states if is_shallow(s) and not is_poll(s)]
    return {"halt": halt[-1] if halt else None, "deep": [s for s in states if not is_shallow(s)], "all": states}


def _resume_limit(value):
    """pm_qos_resume_latency_us as an int limit in µs, None for no limit (0), 0 for ``n/a`` (no latency at all)."""
    if value == "n/a":
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return None if number == 0 else number


def _scan_cpus(cpus, ladder):
    """Per CPU: the idle states disabled in sysfs, those the ladder governor cannot reach, whether a deep state is
    usable; and over all CPUs the deepest usable state and the deepest state ever entered (usage > 0).

    Returns ``(disabled, blocked, reachable_on, deepest_enabled, deepest_entered)``."""
    disabled, blocked, reachable_on = {}, {}, []
    deepest_enabled, deepest_entered = None, None
    for cpu, states in sorted(cpus.items()):
        split = summarize_states(states)
        lad = _blocked_by_ladder(states) if ladder else set()
        off = [s["name"] for s in states if s.get("disable")]
        if off:
            disabled[cpu] = off
        if lad:
            blocked[cpu] = sorted(s["name"] for s in states if s["index"] in lad and not s.get("disable"))
        usable = [s for s in split["deep"] if not s.get("disable") and s["index"] not in lad]
        if usable:
            reachable_on.append(cpu)
            if deepest_enabled is None or usable[-1]["latency"] > deepest_enabled["latency"]:
                deepest_enabled = usable[-1]
        entered = [s for s in states if not is_poll(s) and (s.get("usage") or 0) > 0]
        if entered and (deepest_entered is None or entered[-1]["index"] > deepest_entered["index"]):
            deepest_entered = entered[-1]
    return disabled, blocked, reachable_on, deepest_enabled, deepest_entered


def _latency_causes(idle, deep):
    """The latency limits below every deep state of CPU 0 (``deep``): /dev/cpu_dma_latency held open (PM QoS) and
    per-CPU ``power/pm_qos_resume_latency_us``."""
    causes = []
    shallowest_deep = min(s["latency"] for s in deep if s.get("latency") is not None) \
        if any(s.get("latency") is not None for s in deep) else None
    qos = idle["cpu_dma_latency_us"]
    if qos is not None and shallowest_deep is not None and qos < shallowest_deep:
        holders = idle["pm_qos_holders"]
        who = ", ".join("%s (pid %d)" % (h["comm"], h["pid"]) for h in holders) or "no process found holding it"
        causes.append({"cause": "pm_qos", "value_us": qos, "holders": holders,
                       "message": "/dev/cpu_dma_latency asks for %d us, below the %d us of every deep state: "
                       "held open by %s" % (qos, shallowest_deep, who)})
    limited = {}
    for cpu, value in sorted(idle["resume_latency_us"].items()):
        limit = _resume_limit(value)
        if limit is not None and shallowest_deep is not None and limit < shallowest_deep:
            limited[cpu] = value
    if limited:
        causes.append({"cause": "resume_latency", "cpus": format_cpulist(limited),
                       "message": "power/pm_qos_resume_latency_us keeps CPUs %s out of deep states (%s)"
                       % (format_cpulist(limited), ", ".join(sorted(set(limited.values()))))})
    return causes


def _idle_notes(first, states0, deep, disabled, deepest_enabled, deepest_entered):
    """The notes that do not change the verdict: dgxc-benchmarking's two-states rule, states disabled in sysfs, and
    deep states enabled but never entered."""
    notes = []
    if len(states0) <= 2:
        notes.append("CPU %d exposes %d idle state(s) (%s): NVIDIA's dgxc-benchmarking check_cpu_cstates warns at two "
                     "or fewer: active cores may not reach expected boost clocks"
                     % (first, len(states0), ", ".join(s["name"] for s in states0)))
    if disabled:
        notes.append("idle states disabled on CPUs %s (%s)" % (format_cpulist(disabled), ", ".join(
            sorted(set(n for v in disabled.values() for n in v)))))
    if deep and deepest_enabled is not None and (deepest_entered is None or deepest_entered["latency"] <
                                                 min(s["latency"] for s in deep)):
        notes.append("deep states are enabled but no CPU has entered one (usage 0): a limit not visible here, or "
                     "CPUs that never idle")
    return notes


def judge_idle(idle, virt):
    """The idle verdict: ``deep_cstate_reachable``, ``limited`` or ``not_visible``, with causes quoting evidence.

    ``causes`` entries: ``{"cause": bios|kernel_parameter|sysfs_disabled|ladder|pm_qos|resume_latency|tuned|vm|
    no_driver, "message": str, ...}``; ``findings`` also carry the dgxc-benchmarking rule and "deep states never
    entered" as notes that do not change the verdict. ``evidence`` lists the states CPU 0 exposes."""
    causes, notes = [], []
    cpus = idle["cpus"]
    first = min(cpus) if cpus else None
    states0 = cpus.get(first, []) if first is not None else []
    evidence = [dict((k, s.get(k)) for k in ("index", "name", "desc", "latency", "residency", "disable", "usage"))
                for s in states0]
    limits = idle["cmdline_limits"]
    any_states = any(cpus.values())
    result = {"driver": idle["driver"], "governor": idle["governor"], "states_cpu0": evidence, "causes": causes,
              "notes": notes, "deepest_enabled": None, "deepest_entered": None}

    def limit_causes():
        for limit in limits:
            causes.append({"cause": "kernel_parameter", "param": limit["param"],
                           "message": "the kernel command line has %s: it %s" % (limit["param"], limit["effect"])})

    if idle["driver"] in VM_DRIVERS or (not any_states and virt.get("virtualized")):
        what = "only the %s driver" % idle["driver"] if idle["driver"] in VM_DRIVERS else \
            "no cpuidle states (driver %s)" % (idle["driver"] or "absent")
        causes.append({"cause": "vm", "message": "a %s guest with %s: the C-states that cost turbo are the host's and "
                       "are not visible from here; check C-states on the host (BIOS C-state limit, the host's cpuidle "
                       "states of the CPUs this VM runs on, turbostat there)" % (virt.get("type"), what)})
        for limit in limits:
            notes.append("the kernel command line has %s, but deep states are still exposed" % limit["param"])
        result["verdict"] = "not_visible"
        return result
    if not any_states:
        limit_causes()
        if not limits:
            causes.append({"cause": "no_driver", "message": "no cpuidle states on bare metal (driver %s): the BIOS "
                           "exposes no C-states (ACPI _CST), or no idle driver is loaded; enable C-states (C6) in "
                           "the firmware" % (idle["driver"] or "absent")})
        result["verdict"] = "limited"
        return result

    split0 = summarize_states(states0)
    if not split0["deep"]:
        limit_causes()
        if not limits:
            halt = split0["halt"]
            causes.append({"cause": "bios", "message": "CPU %d exposes no state deeper than %s (driver %s): the BIOS "
                           "limits C-states; allow C6 (package C-state limit and CPU C6 report in the firmware)"
                           % (first, _describe(halt) if halt else "POLL", idle["driver"])})
    disabled, blocked, reachable_on, deepest_enabled, deepest_entered = _scan_cpus(cpus, idle["governor"] == "ladder")
    result["deepest_enabled"] = deepest_enabled and deepest_enabled["name"]
    result["deepest_entered"] = deepest_entered and deepest_entered["name"]
    deep_names = set(s["name"] for s in split0["deep"])
    deep_disabled = dict((cpu, [n for n in names if n in deep_names]) for cpu, names in disabled.items())
    deep_disabled = dict((c, n) for c, n in deep_disabled.items() if n)
    if deep_disabled:
        causes.append({"cause": "sysfs_disabled", "cpus": format_cpulist(deep_disabled),
                       "states": sorted(set(n for names in deep_disabled.values() for n in names)),
                       "message": "deep states disabled in sysfs (cpuidle/stateK/disable) on CPUs %s: %s"
                       % (format_cpulist(deep_disabled), ", ".join(sorted(set(n for v in deep_disabled.values() for n in v))))})
    if blocked:
        causes.append({"cause": "ladder", "cpus": format_cpulist(blocked),
                       "message": "the ladder governor cannot enter %s on CPUs %s: a shallower state is disabled there"
                       % (", ".join(sorted(set(n for v in blocked.values() for n in v))), format_cpulist(blocked))})
    if split0["deep"]:
        causes.extend(_latency_causes(idle, split0["deep"]))
        limit_causes()
    tuned = idle["tuned"]
    if tuned and tuned["force_latency"] is not None:
        causes.append({"cause": "tuned", "profile": tuned["from"], "running": tuned["running"],
                       "message": "tuned profile %s sets force_latency=%s (it holds /dev/cpu_dma_latency while tuned "
                       "runs; tuned is %s)" % (tuned["from"], tuned["force_latency"], "running" if tuned["running"] else
                                               "not running")})
    notes.extend(_idle_notes(first, states0, split0["deep"], disabled, deepest_enabled, deepest_entered))
    blocking = [c for c in causes if not (c["cause"] == "tuned" and not c["running"])]
    result["reachable_cpus"] = format_cpulist(reachable_on)
    result["verdict"] = "deep_cstate_reachable" if split0["deep"] and reachable_on and not blocking else "limited"
    return result


def check_state_indexes(idle, indexes):
    """Refuse a state index no CPU has (an opt-in fix naming a state must name a real one)."""
    have = set(s["index"] for states in idle["cpus"].values() for s in states)
    bad = sorted(set(indexes) - have)
    if bad:
        raise IdleError("idle state index %s does not exist (the CPUs have %s)"
                        % (", ".join(str(i) for i in bad), ", ".join(str(i) for i in sorted(have)) or "no states"),
                        value=bad, expected="one of %s" % sorted(have))
