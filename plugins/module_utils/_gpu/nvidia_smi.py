# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``nvidia-smi -q -x`` XML: parse it by element name and judge GPU health (pure).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. ``parse_nvidia_smi`` turns the XML into plain values;
``gpu_findings`` turns the result into pass/warn/fail/not_applicable findings.

What the parser relies on (nvsmi_device_v10 ... v13 DTDs, files without a
DOCTYPE from older drivers):

* Elements are looked up by name among a GPU's children, never by position;
  v10/v11 call the throttle block ``clocks_throttle_reasons``, v12+
  ``clocks_event_reasons``; power sits in ``power_readings`` (old) or
  ``gpu_power_readings`` (new) with ``power_draw`` or
  ``instant_power_draw``/``average_power_draw`` and ``power_limit`` or
  ``current_power_limit``.
* ECC counters are ``single_bit``/``double_bit`` blocks with a ``total``
  (old) or flat ``sram_correctable``, ``dram_uncorrectable``,
  ``sram_uncorrectable_parity``... (new): every counter is kept by its name.
* ``remapped_rows`` and ``retired_pages`` may be ``N/A`` as a whole.
* ``N/A``, ``[N/A]``, ``Not Supported``, ``[Unknown Error]`` and the like are
  ``None``; ``1410 MHz``, ``67.04 W``, ``27 C`` are numbers.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import finding

_NUMBER_RE = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\s*[A-Za-z%/()]+(?:\s*[A-Za-z%/()]+)*)?$")
_DTD_RE = re.compile(r"nvsmi_device_(v\d+)\.dtd")
# Texts nvidia-smi prints where it has no value.
_MISSING = frozenset((
    "", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]",
    "insufficient permissions", "[insufficient permissions]", "requested functionality has been deprecated",
    "not available", "[not available]",
))
_TRUE = frozenset(("yes", "enabled", "active", "on"))
_FALSE = frozenset(("no", "disabled", "not active", "off"))
# Reasons that are not a problem when active.
_BENIGN_REASONS = frozenset(("gpu_idle", "applications_clocks_setting"))
# Reasons that mean the hardware slowed itself down.
_FAILING_REASONS = frozenset(("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"))


class NvidiaSmiError(DetailedError):
    """Text that is not ``nvidia-smi -q -x`` XML, or a value that cannot be read.

    ``value`` is the offending input (or element text) and ``expected`` says
    what would have been accepted.
    """


def _missing(text):
    return text is None or text.strip().lower() in _MISSING


def to_number(text, field="value"):
    """``"1410 MHz"`` -> 1410, ``"67.04 W"`` -> 67.04, ``"N/A"`` -> None."""
    if _missing(text):
        return None
    match = _NUMBER_RE.match(text.strip())
    if not match:
        raise NvidiaSmiError(
            "nvidia-smi %s is %r, not a number with an optional unit" % (field, text),
            value=text, expected="a number such as '1410 MHz' or '67.04 W', or N/A", field=field,
        )
    number = match.group(1)
    return float(number) if "." in number else int(number)


def to_flag(text, field="value"):
    """``Yes``/``Enabled``/``Active`` -> True, ``No``/``Disabled``/``Not Active`` -> False, ``N/A`` -> None."""
    if _missing(text):
        return None
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise NvidiaSmiError(
        "nvidia-smi %s is %r, not a yes/no state" % (field, text),
        value=text, expected="Yes, No, Enabled, Disabled, Active, Not Active or N/A", field=field,
    )


def _text(elem, name):
    if elem is None:
        return None
    child = elem.find(name)
    if child is None or child.text is None:
        return None
    return child.text.strip()


def _first_child(elem, *names):
    for name in names:
        child = elem.find(name)
        if child is not None:
            return child
    return None


def _number_of(elem, field, *names):
    """The number of the first of ``names`` that is present and has a value."""
    if elem is None:
        return None
    for name in names:
        value = to_number(_text(elem, name), "%s.%s" % (field, name))
        if value is not None:
            return value
    return None


def _clocks(elem, field):
    return {
        "graphics": _number_of(elem, field, "graphics_clock"),
        "sm": _number_of(elem, field, "sm_clock"),
        "mem": _number_of(elem, field, "mem_clock"),
    }


def _ecc_block(elem, field):
    """``{counter: number}`` of a ``volatile`` or ``aggregate`` block, both layouts."""
    counters = {}
    if elem is None:
        return counters
    for child in elem:
        if len(child):
            # Old layout: single_bit/double_bit with per-unit counters and a total.
            counters[child.tag] = to_number(_text(child, "total"), "%s.%s.total" % (field, child.tag))
        else:
            counters[child.tag] = to_number(child.text, "%s.%s" % (field, child.tag))
    return counters


def _uncorrectable(counters):
    return sum(v for k, v in counters.items() if v is not None and ("uncorrectable" in k or k == "double_bit"))


def _remapped_rows(elem):
    if elem is None or not len(elem):
        return None
    return {
        "correctable": to_number(_text(elem, "remapped_row_corr"), "remapped_rows.remapped_row_corr"),
        "uncorrectable": to_number(_text(elem, "remapped_row_unc"), "remapped_rows.remapped_row_unc"),
        "pending": to_flag(_text(elem, "remapped_row_pending"), "remapped_rows.remapped_row_pending"),
        "failure": to_flag(_text(elem, "remapped_row_failure"), "remapped_rows.remapped_row_failure"),
    }


def _retired_pages(elem):
    if elem is None or not len(elem):
        return None
    single = elem.find("multiple_single_bit_retirement")
    double = elem.find("double_bit_retirement")
    pending = _text(elem, "pending_retirement")
    if pending is None:
        pending = _text(elem, "pending_blacklist")
    return {
        "single_bit": to_number(_text(single, "retired_count"), "retired_pages.single_bit"),
        "double_bit": to_number(_text(double, "retired_count"), "retired_pages.double_bit"),
        "pending": to_flag(pending, "retired_pages.pending_retirement"),
    }


def _reasons(elem):
    """``(element name, [active reason names without the prefix])`` or ``(None, None)``."""
    if elem is None:
        return None, None
    active = []
    for child in elem:
        name = re.sub(r"^clocks_(?:throttle|event)_reason_", "", child.tag)
        if to_flag(child.text, "%s.%s" % (elem.tag, child.tag)):
            active.append(name)
    return elem.tag, active


def _leaves(elem):
    return {child.tag: (child.text or "").strip() for child in elem.iter() if child is not elem and not len(child)}


def _gpu(gpu):
    power = _first_child(gpu, "gpu_power_readings", "power_readings")
    temperature = gpu.find("temperature")
    ecc = gpu.find("ecc_errors")
    source, active = _reasons(_first_child(gpu, "clocks_event_reasons", "clocks_throttle_reasons"))
    nvlink = [_leaves(elem) for elem in gpu.iter("nvlink")] or None
    fabric = gpu.find("fabric")
    return {
        "id": gpu.get("id"),
        "product_name": _text(gpu, "product_name"),
        "uuid": _text(gpu, "uuid"),
        "pci_bus_id": _text(gpu.find("pci"), "pci_bus_id") or gpu.get("id"),
        "persistence_mode": to_flag(_text(gpu, "persistence_mode"), "persistence_mode"),
        "clocks": _clocks(gpu.find("clocks"), "clocks"),
        "max_clocks": _clocks(gpu.find("max_clocks"), "max_clocks"),
        "applications_clocks": _clocks(gpu.find("applications_clocks"), "applications_clocks"),
        "default_applications_clocks": _clocks(gpu.find("default_applications_clocks"), "default_applications_clocks"),
        "power": {
            "draw": _number_of(power, "power", "power_draw", "instant_power_draw", "average_power_draw"),
            "limit": _number_of(power, "power", "current_power_limit", "power_limit", "enforced_power_limit"),
            "max_limit": _number_of(power, "power", "max_power_limit"),
        },
        "temperature": {
            "gpu": _number_of(temperature, "temperature", "gpu_temp"),
            "slowdown": _number_of(temperature, "temperature", "gpu_temp_slow_threshold"),
            "shutdown": _number_of(temperature, "temperature", "gpu_temp_max_threshold"),
            # Newer drivers (DTD v12 on Ada/Hopper and later, v13) report the margin to T.Limit instead of, or next
            # to, the absolute thresholds: gpu_temp_tlimit is how many degrees the GPU is below its T.Limit, and the
            # *_tlimit_threshold values are margins too (slowdown at -2 C: two degrees past T.Limit).
            "tlimit": _number_of(temperature, "temperature", "gpu_temp_tlimit"),
            "slowdown_tlimit": _number_of(temperature, "temperature", "gpu_temp_slow_tlimit_threshold"),
            "shutdown_tlimit": _number_of(temperature, "temperature", "gpu_temp_max_tlimit_threshold"),
            "max_operating_tlimit": _number_of(temperature, "temperature", "gpu_temp_max_gpu_tlimit_threshold"),
        },
        "ecc": {
            "volatile": _ecc_block(ecc.find("volatile") if ecc is not None else None, "ecc_errors.volatile"),
            "aggregate": _ecc_block(ecc.find("aggregate") if ecc is not None else None, "ecc_errors.aggregate"),
        },
        "remapped_rows": _remapped_rows(gpu.find("remapped_rows")),
        "retired_pages": _retired_pages(gpu.find("retired_pages")),
        "throttle_source": source,
        "active_throttle_reasons": active,
        "nvlink": nvlink,
        "fabric": None if fabric is None else {"state": _text(fabric, "state"), "status": _text(fabric, "status")},
    }


def parse_nvidia_smi(text):
    """Parse ``nvidia-smi -q -x`` output into ``{dtd_version, driver_version, cuda_version, timestamp, attached_gpus, gpus}``."""
    if not isinstance(text, str) or not text.strip():
        raise NvidiaSmiError("nvidia-smi XML is empty", value=text, expected="the output of nvidia-smi -q -x")
    try:
        root = ET.fromstring(text.strip().encode("utf-8"))
    except ET.ParseError as exc:
        raise NvidiaSmiError(
            "nvidia-smi output is not XML: %s" % exc, value=text[:200], expected="the output of nvidia-smi -q -x",
        ) from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError(
            "nvidia-smi XML root is <%s>, not <nvidia_smi_log>" % root.tag,
            value=root.tag, expected="nvidia_smi_log",
        )
    dtd = _DTD_RE.search(text[:1000])
    return {
        "dtd_version": dtd.group(1) if dtd else None,
        "timestamp": _text(root, "timestamp"),
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": to_number(_text(root, "attached_gpus"), "attached_gpus"),
        "gpus": [_gpu(gpu) for gpu in root.findall("gpu")],
    }


def _finding(check, gpu, status, message, evidence, fix=None):
    return finding(check, status, message, evidence=evidence, fix=fix, gpu=gpu["pci_bus_id"])


def _row_remap(gpu):
    rows = gpu["remapped_rows"]
    if rows is None:
        return _finding("remapped_rows", gpu, "not_applicable", "row remapping is not reported (N/A) for this GPU", None)
    if rows["pending"] or rows["failure"]:
        return _finding(
            "remapped_rows", gpu, "fail",
            "row remapping failed" if rows["failure"] else "row remapping is pending", rows,
            "drain the node and reset the GPU (nvidia-smi -r) to apply pending remaps; a remapping failure needs an RMA",
        )
    return _finding("remapped_rows", gpu, "pass", "no pending row remap and no remapping failure", rows)


def _retired(gpu):
    pages = gpu["retired_pages"]
    if pages is None or pages["pending"] is None:
        return _finding("retired_pages", gpu, "not_applicable", "pending page retirement is not reported for this GPU", pages)
    if pages["pending"]:
        return _finding(
            "retired_pages", gpu, "fail", "page retirement is pending", pages,
            "drain the node and reset the GPU or reboot so the pending pages are retired",
        )
    return _finding("retired_pages", gpu, "pass", "no page retirement pending", pages)


def _ecc(gpu):
    evidence = gpu["ecc"]
    known = [v for block in evidence.values() for v in block.values() if v is not None]
    if not known:
        return _finding("ecc_uncorrectable", gpu, "not_applicable", "ECC error counters are not reported (ECC off or unsupported)", evidence)
    volatile, aggregate = _uncorrectable(evidence["volatile"]), _uncorrectable(evidence["aggregate"])
    if volatile or aggregate:
        return _finding(
            "ecc_uncorrectable", gpu, "fail",
            "uncorrectable ECC errors: %d volatile, %d aggregate" % (volatile, aggregate), evidence,
            "drain the node; check remapped rows/retired pages, reset the GPU, and RMA it if errors recur",
        )
    return _finding("ecc_uncorrectable", gpu, "pass", "no uncorrectable ECC errors", evidence)


def _throttle(gpu):
    active = gpu["active_throttle_reasons"]
    if active is None:
        return _finding("clock_event_reasons", gpu, "not_applicable", "no clocks throttle/event reasons reported", None)
    relevant = [r for r in active if r not in _BENIGN_REASONS]
    evidence = {"source": gpu["throttle_source"], "active": active}
    failing = [r for r in relevant if r in _FAILING_REASONS]
    if failing:
        return _finding(
            "clock_event_reasons", gpu, "fail", "clocks slowed down by %s" % ", ".join(failing), evidence,
            "check cooling, power delivery and the power brake signal of this GPU",
        )
    if relevant:
        return _finding(
            "clock_event_reasons", gpu, "warn", "clocks limited by %s" % ", ".join(relevant), evidence,
            "check the power limit (nvidia-smi -pl) and the workload",
        )
    return _finding("clock_event_reasons", gpu, "pass", "no clock limiting reason active except idle/application clocks", evidence)


def _persistence(gpu):
    mode = gpu["persistence_mode"]
    if mode is None:
        return _finding("persistence_mode", gpu, "not_applicable", "persistence mode is not reported", None)
    if not mode:
        return _finding(
            "persistence_mode", gpu, "warn", "persistence mode is disabled", {"persistence_mode": mode},
            "enable nvidia-persistenced (or nvidia-smi -pm 1)",
        )
    return _finding("persistence_mode", gpu, "pass", "persistence mode is enabled", {"persistence_mode": mode})


def _temperature(gpu):
    """Judge the absolute form (gpu_temp against gpu_temp_slow_threshold) where it is reported, else the T.Limit form
    (the margin gpu_temp_tlimit against gpu_temp_slow_tlimit_threshold); a driver may report either or both."""
    temp = gpu["temperature"]
    fix = "check airflow, fans and inlet temperature"
    if temp["gpu"] is not None and temp["slowdown"] is not None:
        if temp["gpu"] >= temp["slowdown"]:
            return _finding(
                "temperature", gpu, "fail",
                "GPU at %s C, at/above its slowdown threshold %s C" % (temp["gpu"], temp["slowdown"]), temp, fix,
            )
        return _finding("temperature", gpu, "pass",
                        "GPU at %s C, below slowdown threshold %s C" % (temp["gpu"], temp["slowdown"]), temp)
    margin, slowdown = temp.get("tlimit"), temp.get("slowdown_tlimit")
    if margin is not None and slowdown is not None:
        where = "GPU %s C from its T.Limit%s" % (margin, (" (at %s C)" % temp["gpu"]) if temp["gpu"] is not None else "")
        if margin <= slowdown:
            return _finding("temperature", gpu, "fail", "%s, at/past its slowdown margin %s C" % (where, slowdown),
                            temp, fix)
        operating = temp.get("max_operating_tlimit")
        if operating is not None and margin <= operating:
            return _finding("temperature", gpu, "warn", "%s, at/past its maximum operating margin %s C (slowdown at "
                            "%s C)" % (where, operating, slowdown), temp, fix)
        return _finding("temperature", gpu, "pass", "%s, above its slowdown margin %s C" % (where, slowdown), temp)
    return _finding(
        "temperature", gpu, "not_applicable",
        "GPU temperature with neither an absolute slowdown threshold nor a T.Limit margin and threshold reported", temp,
    )


def _app_clocks(gpu):
    app, default = gpu["applications_clocks"], gpu["default_applications_clocks"]
    evidence = {"applications": app, "default_applications": default, "max": gpu["max_clocks"]}
    if app["graphics"] is None or default["graphics"] is None:
        return _finding("applications_clocks", gpu, "not_applicable", "application clocks are not reported", evidence)
    lowered = [name for name in ("graphics", "mem") if app[name] is not None and default[name] is not None and app[name] < default[name]]
    if lowered:
        return _finding(
            "applications_clocks", gpu, "warn", "application clocks lowered below their defaults: %s" % ", ".join(
                "%s %s < %s MHz" % (name, app[name], default[name]) for name in lowered), evidence,
            "reset them with nvidia-smi -rac (or -ac to the default pair) unless the cap is deliberate",
        )
    return _finding("applications_clocks", gpu, "pass", "application clocks at their defaults (graphics %s MHz, max %s MHz)" % (
        app["graphics"], gpu["max_clocks"]["graphics"]), evidence)


def _power_cap(gpu):
    power = gpu["power"]
    if power["limit"] is None or power["max_limit"] is None:
        return _finding("power_limit", gpu, "not_applicable", "the power limit or its maximum is not reported", power)
    if power["limit"] < power["max_limit"]:
        return _finding(
            "power_limit", gpu, "warn", "power limit %s W is below the GPU's maximum %s W" % (power["limit"], power["max_limit"]), power,
            "raise it with nvidia-smi -pl %s unless the cap is deliberate (site power budget)" % power["max_limit"],
        )
    return _finding("power_limit", gpu, "pass", "power limit %s W is the GPU's maximum" % power["limit"], power)


def _fabric(gpu):
    fabric = gpu["fabric"]
    if fabric is None or fabric["state"] in (None, "N/A"):
        return _finding("fabric", gpu, "not_applicable", "no NVLink fabric (NVSwitch) state reported for this GPU", fabric)
    if fabric["state"] == "Completed" and fabric["status"] in ("Success", None):
        return _finding("fabric", gpu, "pass", "NVLink fabric registration completed", fabric)
    if fabric["state"] in ("In Progress", "Not Started"):
        return _finding("fabric", gpu, "fail", "NVLink fabric registration is %s" % fabric["state"].lower(), fabric,
                        "start nvidia-fabricmanager (and nvlsm on NVLink5 systems) and wait for registration")
    return _finding("fabric", gpu, "fail", "NVLink fabric state %s, status %s" % (fabric["state"], fabric["status"]), fabric,
                    "read the fabric manager log; reset the GPU or the NVSwitch tray")


def gpu_findings(parsed):
    """Findings ``{check, gpu, status, message, evidence, fix}`` for every GPU of ``parse_nvidia_smi``'s result."""
    if not isinstance(parsed, dict) or not isinstance(parsed.get("gpus"), list):
        raise NvidiaSmiError(
            "gpu_findings needs the result of parse_nvidia_smi", value=parsed, expected="a dict with a 'gpus' list",
        )
    findings = []
    for gpu in parsed["gpus"]:
        for check in (_row_remap, _retired, _ecc, _throttle, _persistence, _temperature, _app_clocks, _power_cap, _fabric):
            findings.append(check(gpu))
    return findings
