# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``cpupower idle-info`` and ``cpupower frequency-info``: parse them (pure). A test helper.

The tests turn real cpupower captures (fixtures/cpu_power/cpupower, provenance in its README) into sysfs trees
(cpuidle_tree) for cpu_power_facts to read. It was plugins/module_utils/_cpupower.py, imported by no plugin:
cpupower reads the same sysfs files the collection reads itself (issue 30, dead code wired or deleted).
``parse_idle_info`` and ``parse_frequency_info`` turn what cpupower printed into numbers; frequencies become kHz
integers, as sysfs has them.

The formats, from tools/power/cpupower/utils/cpuidle-info.c and
cpufreq-info.c (and the older cpufrequtils layout cpupower started from):

idle-info::

    CPUidle driver: intel_idle          ("none" when no driver is registered)
    CPUidle governor: menu
    analyzing CPU 0:

    Number of idle states: 4            ("CPU 11: No idle states" when none)
    Available idle states: POLL C1 C1E C6
    C6 (DISABLED) :                     ("%s%s:" with " (DISABLED) " when disabled)
    Flags/Description: MWAIT 0x20
    Latency: 170                        (exit latency, microseconds)
    Usage: 5214705
    Duration: 3710485901                (residency so far, microseconds)

frequency-info: ``driver:``, the two ``CPUs which ...`` lists, ``maximum
transition latency:``, ``hardware limits: 800 MHz - 3.90 GHz``, ``available
frequency steps:``, ``available cpufreq governors:`` (space or comma
separated), ``current policy: frequency should be within A and B.`` with
``The governor "X" may decide`` on the next line, ``current CPU frequency:``
(``N (asserted by call to hardware|kernel)``, ``Unable to call hardware``;
older: ``current CPU frequency is N (asserted by call to hardware).``) and
``boost state support:`` with ``Supported:``/``Active:`` and vendor lines
(turbo ratios, ``Pstate-Pn``, amd-pstate limits) kept as text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

_UNITS_KHZ = {"ghz": 1000000, "mhz": 1000, "khz": 1}
_FREQ_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(GHz|MHz|kHz)", re.IGNORECASE)
_LATENCY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ns|us|ms|s)\b")
_LATENCY_US = {"ns": Decimal("0.001"), "us": Decimal(1), "ms": Decimal(1000), "s": Decimal(1000000)}
_ANALYZING_RE = re.compile(r"^\s*analyzing CPU (\d+):\s*(.*)$")
_STATE_RE = re.compile(r"^(\S+?)(\s*\(DISABLED\))?\s*:\s*$")
_NO_STATES_RE = re.compile(r"^CPU (\d+): No idle states\s*$")
_STATE_KEYS = {"flags/description": "description", "flags/desc": "description", "latency": "latency", "usage": "usage", "duration": "duration"}


class CpupowerError(DetailedError):
    """Text that is not the cpupower output it was given as.

    ``value`` is the offending input (or line of it) and ``expected`` says
    what would have been accepted.
    """


def to_khz(text):
    """``'1.20 GHz'`` -> 1200000, ``'800 MHz'`` -> 800000 (``kHz`` accepted too)."""
    match = _FREQ_RE.search(text or "")
    if not match:
        raise CpupowerError("%r is not a frequency" % (text,), value=text, expected="a number followed by GHz, MHz or kHz")
    try:
        return int(Decimal(match.group(1)) * _UNITS_KHZ[match.group(2).lower()])
    except InvalidOperation:  # pragma: no cover - the regex admits only digits
        raise CpupowerError("%r is not a frequency" % (text,), value=text, expected="a number followed by GHz, MHz or kHz") from None


def _int(text, line):
    try:
        return int(text.strip())
    except ValueError:
        raise CpupowerError("%r is not a number in %r" % (text.strip(), line), value=line, expected="an integer") from None


def _new_cpu_idle(cpu):
    return {"cpu": cpu, "number_of_states": None, "available_states": [], "states": []}


def parse_idle_info(text):
    """Parse ``cpupower idle-info`` (one or more ``analyzing CPU`` blocks).

    Returns ``{"driver", "governor", "cpu", "number_of_states",
    "available_states", "states": [{"index", "name", "description",
    "disabled", "latency", "usage", "duration"}], "cpus": {cpu: {...}}}``;
    the top-level CPU fields are those of the first CPU analyzed. ``driver``
    is the text cpupower printed (``"none"`` when no cpuidle driver is
    registered), ``None`` where it printed none.
    """
    if not isinstance(text, str):
        raise CpupowerError("idle-info output must be text, not %s" % type(text).__name__, value=text, expected="the text cpupower printed")
    result = {"driver": None, "governor": None}
    cpus = {}
    current = None
    state = None
    seen = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        key, sep, value = stripped.partition(":")
        lowered = key.strip().lower()
        if lowered == "cpuidle driver" and sep:
            result["driver"] = value.strip() or None
            seen = True
            continue
        if lowered == "cpuidle governor" and sep:
            result["governor"] = value.strip() or None
            seen = True
            continue
        if stripped.startswith("Could not determine cpuidle"):
            seen = True
            continue
        match = _ANALYZING_RE.match(stripped)
        if match:
            current = _new_cpu_idle(int(match.group(1)))
            cpus[current["cpu"]] = current
            state = None
            continue
        match = _NO_STATES_RE.match(stripped)
        if match:
            cpu = int(match.group(1))
            current = cpus.setdefault(cpu, _new_cpu_idle(cpu))
            current["number_of_states"] = 0
            seen = True
            continue
        if current is None:
            continue
        if lowered == "number of idle states" and sep:
            current["number_of_states"] = _int(value, line)
            seen = True
            continue
        if lowered == "available idle states" and sep:
            current["available_states"] = value.split()
            continue
        if lowered in _STATE_KEYS and sep and state is not None:
            field = _STATE_KEYS[lowered]
            state[field] = value.strip() if field == "description" else _int(value, line)
            continue
        match = _STATE_RE.match(stripped)
        if match:
            state = {
                "index": len(current["states"]),
                "name": match.group(1),
                "description": None,
                "disabled": bool(match.group(2)),
                "latency": None,
                "usage": None,
                "duration": None,
            }
            current["states"].append(state)
            continue
    if not seen:
        first = text.strip().splitlines()[:1]
        raise CpupowerError(
            "not cpupower idle-info output: no 'CPUidle driver:' or 'Number of idle states:' line (first line: %r)" % (first[0] if first else ""),
            value=text[:200],
            expected="the output of cpupower idle-info",
        )
    for info in cpus.values():
        names = [s["name"] for s in info["states"]]
        if info["states"] and info["number_of_states"] is not None and len(names) != info["number_of_states"]:
            raise CpupowerError(
                "CPU %d: 'Number of idle states: %d' but %d state blocks %s" % (info["cpu"], info["number_of_states"], len(names), names),
                value=names,
                expected="%d state blocks" % info["number_of_states"],
            )
        if info["states"] and info["available_states"] and names != info["available_states"]:
            raise CpupowerError(
                "CPU %d: state blocks %s differ from 'Available idle states: %s'" % (info["cpu"], names, " ".join(info["available_states"])),
                value=names,
                expected=info["available_states"],
            )
    first_cpu = cpus[min(cpus)] if cpus else _new_cpu_idle(None)
    result.update(first_cpu)
    result["cpus"] = cpus
    return result


def _latency_us(value):
    match = _LATENCY_RE.search(value)
    if not match:
        return None  # "Cannot determine or is not supported."
    return float(Decimal(match.group(1)) * _LATENCY_US[match.group(2)])


def _cpu_list(value):
    value = value.strip()
    if not value or value.lower().startswith("not available"):
        return None
    return [int(v) for v in value.replace(",", " ").split()]


def _new_cpu_freq(cpu):
    return {
        "cpu": cpu,
        "driver": None,
        "related_cpus": None,
        "affected_cpus": None,
        "max_transition_latency_us": None,
        "hw_min_khz": None,
        "hw_max_khz": None,
        "available_frequencies_khz": [],
        "available_governors": [],
        "policy_min_khz": None,
        "policy_max_khz": None,
        "governor": None,
        "current_khz": None,
        "current_hardware_khz": None,
        "current_kernel_khz": None,
        "boost_supported": None,
        "boost_active": None,
        "boost_details": [],
    }


def _yes_no(value):
    value = value.strip().lower()
    return True if value == "yes" else False if value == "no" else None


def _current_frequency(info, value, line):
    value = value.strip()
    if value.startswith("Unable to call"):
        return
    if _FREQ_RE.search(value) is None:
        raise CpupowerError("cannot read the current frequency in %r" % line, value=line, expected="a frequency such as 2.70 GHz")
    khz = to_khz(value)
    if "kernel" in value:
        info["current_kernel_khz"] = khz
    else:
        info["current_hardware_khz"] = khz
    info["current_khz"] = info["current_hardware_khz"] if info["current_hardware_khz"] is not None else khz


def parse_frequency_info(text):
    """Parse ``cpupower frequency-info`` (one or more ``analyzing CPU`` blocks).

    Returns the first CPU's fields at the top level (``driver``,
    ``related_cpus`` = "CPUs which run at the same hardware frequency",
    ``affected_cpus``, ``max_transition_latency_us``, ``hw_min_khz``,
    ``hw_max_khz``, ``available_frequencies_khz``, ``available_governors``,
    ``policy_min_khz``, ``policy_max_khz``, ``governor``, ``current_khz``
    (asserted by the hardware where cpupower could ask it, else by the
    kernel), ``current_hardware_khz``, ``current_kernel_khz``,
    ``boost_supported``, ``boost_active``, ``boost_details``) and every CPU
    under ``cpus``. ``driver`` is None where cpupower said no cpufreq driver
    is active (typical of a VM).
    """
    if not isinstance(text, str):
        raise CpupowerError("frequency-info output must be text, not %s" % type(text).__name__, value=text, expected="the text cpupower printed")
    cpus = {}
    info = None
    in_boost = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        match = _ANALYZING_RE.match(stripped)
        if match:
            info = _new_cpu_freq(int(match.group(1)))
            cpus[info["cpu"]] = info
            in_boost = False
            stripped = match.group(2).strip()  # "analyzing CPU 0:  driver: acpi-cpufreq" in some copies
            if not stripped:
                continue
        if info is None:
            continue
        key, sep, value = stripped.partition(":")
        lowered = key.strip().lower()
        if stripped.startswith("no or unknown cpufreq driver"):
            info["driver"] = None
            continue
        if in_boost and lowered in ("supported", "active") and sep:
            info["boost_" + lowered] = _yes_no(value)
            continue
        if lowered == "driver" and sep:
            info["driver"] = value.strip() or None
        elif lowered == "cpus which run at the same hardware frequency":
            info["related_cpus"] = _cpu_list(value)
        elif lowered == "cpus which need to have their frequency coordinated by software":
            info["affected_cpus"] = _cpu_list(value)
        elif lowered == "maximum transition latency":
            info["max_transition_latency_us"] = _latency_us(value)
        elif lowered == "hardware limits":
            low, dash, high = value.partition(" - ")
            if not dash:
                raise CpupowerError("cannot read hardware limits in %r" % line, value=line, expected="'hardware limits: MIN - MAX'")
            info["hw_min_khz"], info["hw_max_khz"] = to_khz(low), to_khz(high)
        elif lowered == "available frequency steps":
            info["available_frequencies_khz"] = [to_khz(part) for part in value.split(",") if part.strip()]
        elif lowered == "available cpufreq governors":
            info["available_governors"] = value.replace(",", " ").split()
        elif lowered == "current policy":
            bounds = re.search(r"within\s+(.+?)\s+and\s+(.+?)\.?\s*$", value)
            if not bounds:
                raise CpupowerError("cannot read the policy limits in %r" % line, value=line, expected="'frequency should be within MIN and MAX.'")
            info["policy_min_khz"], info["policy_max_khz"] = to_khz(bounds.group(1)), to_khz(bounds.group(2))
        elif stripped.startswith("The governor"):
            governor = re.search(r'The governor "([^"]+)"', stripped)
            info["governor"] = governor.group(1) if governor else None
        elif lowered == "current cpu frequency":
            _current_frequency(info, value, line)
        elif stripped.startswith("current CPU frequency is"):
            _current_frequency(info, stripped[len("current CPU frequency is"):], line)
        elif lowered == "boost state support":
            in_boost = True
        elif in_boost:
            info["boost_details"].append(stripped)
    no_driver = any(line.strip().startswith("no or unknown cpufreq driver") for line in text.splitlines())
    recognised = any(i["driver"] or i["hw_max_khz"] is not None or i["available_governors"] for i in cpus.values())
    if not cpus or not (recognised or no_driver):
        first = text.strip().splitlines()[:1]
        raise CpupowerError(
            "not cpupower frequency-info output: no 'analyzing CPU' block with a driver (first line: %r)" % (first[0] if first else ""),
            value=text[:200],
            expected="the output of cpupower frequency-info",
        )
    result = dict(cpus[min(cpus)])
    result["cpus"] = cpus
    return result
