# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The IOMMU and the Grace SMMUv3/CMDQV: from the kernel command line, ``/sys/kernel/iommu_groups``, the kernel log
and the kernel config.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Read-only, like the other platform readers (``_gpu.platform``, whose
finding shape and error these return and raise); the kernel log and config are
passed in as text by the caller. Facts used:

- IOMMU: the command line (``iommu=pt|off|nopt``, ``iommu.passthrough=0|1``, ``iommu.strict=0|1``,
  ``intel_iommu=on|off``, ``amd_iommu=off|...``) and the groups in ``/sys/kernel/iommu_groups``;
- SMMUv3/CMDQV (Linux drivers/iommu/arm/arm-smmu-v3/{arm-smmu-v3.c,tegra241-cmdqv.c}): ``arm-smmu-v3 <dev>: found
  companion CMDQV device: NVDA200C:NN`` (older drivers: ``found companion CMDQV device, ...``), ``allocated N
  entries for vcmdqK``, ``Falling back to standard SMMU CMDQ``, ``Detected disable_cmdqv=true``, and
  ``CONFIG_TEGRA241_CMDQV`` in the kernel config; the companion line is printed only by kernels built with it.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import norm, split_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.platform import finding, text_arg
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_text

IOMMU_KEYS = ("iommu", "iommu.passthrough", "iommu.strict", "intel_iommu", "amd_iommu")
CMDQV_CONFIG = "CONFIG_TEGRA241_CMDQV"
SMMUV3_CONFIG = "CONFIG_ARM_SMMU_V3"

_SMMU_RE = re.compile(r"arm-smmu-v3 (\S+?):")
_COMPANION_RE = re.compile(r"(?:arm-smmu-v3 (\S+?): )?found companion CMDQV device[:,] (\S+)")
_VCMDQ_RE = re.compile(r"(?:arm-smmu-v3 (\S+?): )?allocated (\d+) entries for (vcmdq\d+)")
_FALLBACK_RE = re.compile(r"Falling back to standard SMMU CMDQ")
_DISABLED_RE = re.compile(r"Detected disable_cmdqv=true")
_SMMU_FAILED_RE = re.compile(r"probe with driver arm-smmu-v3 failed|arm-smmu-v3 \S+?: Failed to register iommu")
_CONFIG_RE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_CONFIG_UNSET_RE = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")


# -------------------------------------------------------------------- IOMMU --

def parse_iommu_cmdline(cmdline):
    """``{"params": {key: value}, "mode": ...}`` from a kernel command line; the last occurrence of a key wins.

    ``mode``: ``passthrough`` (``iommu=pt``, ``iommu.passthrough=1``), ``translated`` (``iommu=nopt``,
    ``iommu.passthrough=0``), ``off`` (``iommu=off``, ``intel_iommu=off``, ``amd_iommu=off``), ``on``
    (``intel_iommu=on``) or ``default``; ``strict`` is True/False from ``iommu.strict`` or None."""
    cmdline = text_arg("cmdline", cmdline) or ""
    params = {}
    for token in split_cmdline(cmdline):
        key, sep, value = norm(token).partition("=")
        if key in IOMMU_KEYS:
            params[key] = value if sep else ""
    mode = "default"
    intel = params.get("intel_iommu", "").split(",")
    if "on" in intel:
        mode = "on"
    passthrough = params.get("iommu.passthrough")
    if passthrough in ("1", "y", "Y", "on"):
        mode = "passthrough"
    elif passthrough in ("0", "n", "N", "off"):
        mode = "translated"
    iommu = params.get("iommu", "").split(",")
    if "pt" in iommu:
        mode = "passthrough"
    elif "nopt" in iommu:
        mode = "translated"
    if "off" in iommu or "off" in intel or params.get("amd_iommu") == "off":
        mode = "off"
    strict = params.get("iommu.strict")
    strict = True if strict in ("1", "y", "Y", "on") else False if strict in ("0", "n", "N", "off") else None
    return {"params": params, "mode": mode, "strict": strict}


def read_iommu(procfs="/proc", sysfs="/sys", cmdline=None):
    """``{"params", "mode", "strict", "groups": int|None, "findings"}``; ``cmdline`` defaults to ``/proc/cmdline``.

    No ``/sys/kernel/iommu_groups`` is unknown; an empty one, or ``mode=off``, warns (no VFIO, no DMA isolation)."""
    if cmdline is None:
        cmdline = read_text(join(procfs, "cmdline")) or ""
    result = parse_iommu_cmdline(cmdline)
    groups_dir = join(sysfs, "kernel/iommu_groups")
    entries = list_dir(groups_dir)
    result["groups"] = len([e for e in entries if e.isdigit()]) if os.path.isdir(groups_dir) else None
    evidence = ["%s=%s" % item for item in sorted(result["params"].items())] + ["iommu groups: %s" % result["groups"]]
    if result["mode"] == "off":
        found = finding("iommu", "warn", "the IOMMU is switched off on the command line", evidence=evidence,
                        fix="remove iommu=off / intel_iommu=off / amd_iommu=off; use iommu=pt (or iommu.passthrough=1) for speed")
    elif result["groups"] is None:
        found = finding("iommu", "unknown", "no /sys/kernel/iommu_groups", evidence=evidence)
    elif result["groups"] == 0:
        found = finding("iommu", "warn", "no IOMMU groups: no IOMMU is active (VFIO passthrough and DMA isolation unavailable)",
                        evidence=evidence, fix="enable the IOMMU in firmware and on the command line (intel_iommu=on, or the "
                                               "SMMU on aarch64)")
    else:
        found = finding("iommu", "pass", "%d IOMMU groups, mode %s%s" % (
            result["groups"], result["mode"], "" if result["strict"] is None else ", strict" if result["strict"] else ", lazy"),
            evidence=evidence)
    result["findings"] = [found]
    return result


# ------------------------------------------------------------ SMMUv3, CMDQV --

def parse_kernel_config(text):
    """``{CONFIG_X: "y"|"m"|value|"n"}`` from a kernel config; ``# CONFIG_X is not set`` reads as ``"n"``."""
    text = text_arg("kernel_config", text)
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        match = _CONFIG_RE.match(line)
        if match:
            out[match.group(1)] = match.group(2).strip('"')
            continue
        match = _CONFIG_UNSET_RE.match(line)
        if match:
            out[match.group(1)] = "n"
    return out


def parse_smmu_log(text):
    """The SMMUv3/CMDQV lines of a kernel log (dmesg, ``journalctl -k``: any line prefix):
    ``{"smmu_devices", "companions": [{"smmu", "cmdqv"}], "vcmdqs": [{"smmu", "queue", "entries"}], "fallback": [lines],
    "disabled": bool, "probe_failed": [lines]}``."""
    text = text_arg("kernel_log", text) or ""
    out = {"smmu_devices": [], "companions": [], "vcmdqs": [], "fallback": [], "disabled": False, "probe_failed": []}
    for line in text.splitlines():
        match = _SMMU_RE.search(line)
        if match and match.group(1) not in out["smmu_devices"]:
            out["smmu_devices"].append(match.group(1))
        match = _COMPANION_RE.search(line)
        if match:
            out["companions"].append({"smmu": match.group(1), "cmdqv": match.group(2)})
        match = _VCMDQ_RE.search(line)
        if match:
            out["vcmdqs"].append({"smmu": match.group(1), "queue": match.group(3), "entries": int(match.group(2))})
        if _FALLBACK_RE.search(line):
            out["fallback"].append(line.strip())
        if _DISABLED_RE.search(line):
            out["disabled"] = True
        if _SMMU_FAILED_RE.search(line):
            out["probe_failed"].append(line.strip())
    return out


def read_smmu(architecture, kernel_log=None, kernel_config=None):
    """``{"log": parse_smmu_log(...)|None, "config": {CONFIG_ARM_SMMU_V3, CONFIG_TEGRA241_CMDQV}|None, "findings"}``
    with the ``smmuv3`` and ``cmdqv`` findings. Not aarch64: both ``not_applicable`` (never ``pass``).

    CMDQV: a failed SMMUv3 probe -> fail; companion found and VCMDQs allocated without a fallback -> pass; the fallback or ``disable_cmdqv`` line ->
    warn (the SMMU works, TLB invalidations go through the one standard CMDQ); ``CONFIG_TEGRA241_CMDQV`` not set ->
    warn; SMMUv3 probed, no companion, driver built -> not_applicable (no CMDQV hardware); otherwise unknown."""
    log = parse_smmu_log(kernel_log) if kernel_log is not None else None
    config = parse_kernel_config(kernel_config) if kernel_config is not None else None
    wanted = None if config is None else dict((key, config.get(key)) for key in (SMMUV3_CONFIG, CMDQV_CONFIG))
    result = {"log": log, "config": wanted}
    if architecture != "aarch64":
        why = "architecture %s: SMMUv3 and the Tegra241 CMDQV are aarch64 (Grace) hardware" % (architecture or "unknown")
        status = "not_applicable" if architecture else "unknown"
        result["findings"] = [finding("smmuv3", status, why), finding("cmdqv", status, why)]
        return result
    cmdqv_built = None if wanted is None else wanted[CMDQV_CONFIG] in ("y", "m")
    config_evidence = [] if wanted is None else ["%s=%s" % (k, v if v is not None else "(absent)") for k, v in sorted(wanted.items())]
    # SMMUv3
    if log is None:
        smmu = finding("smmuv3", "unknown", "no kernel log given", evidence=config_evidence, fix="pass kernel_log (dmesg or journalctl -k)")
    elif log["probe_failed"]:
        smmu = finding("smmuv3", "fail", "the arm-smmu-v3 probe failed", evidence=log["probe_failed"],
                       fix="read the arm-smmu-v3 lines of the kernel log before the failure")
    elif log["smmu_devices"]:
        smmu = finding("smmuv3", "pass", "%d SMMUv3 instance(s) probed" % len(log["smmu_devices"]),
                       evidence=log["smmu_devices"])
    else:
        smmu = finding("smmuv3", "warn", "no arm-smmu-v3 line in the kernel log", evidence=config_evidence,
                       fix="check that the log covers the boot and that the SMMU is enabled in firmware (IORT)")
    # CMDQV
    evidence = list(config_evidence)
    if log is not None:
        evidence += ["found companion CMDQV device: %s (%s)" % (c["cmdqv"], c["smmu"]) for c in log["companions"]]
        evidence += ["allocated %d entries for %s (%s)" % (q["entries"], q["queue"], q["smmu"]) for q in log["vcmdqs"]]
        evidence += log["fallback"]
    if log is not None and log["probe_failed"]:
        cmdqv = finding("cmdqv", "fail", "the SMMUv3 probe failed, so its CMDQV is not in use", evidence=evidence + log["probe_failed"],
                        fix="fix the arm-smmu-v3 probe failure first")
    elif log is not None and (log["fallback"] or log["disabled"]):
        cmdqv = finding("cmdqv", "warn", "CMDQV present but not used: the SMMU fell back to the standard CMDQ%s" % (
            " (disable_cmdqv=true)" if log["disabled"] else ""), evidence=evidence,
            fix="drop arm_smmu_v3.disable_cmdqv / tegra241_cmdqv.disable_cmdqv and check the CMDQV ACPI resources (NVDA200C)")
    elif log is not None and log["companions"] and log["vcmdqs"]:
        cmdqv = finding("cmdqv", "pass", "CMDQV in use: %d companion(s), %d VCMDQ(s) allocated" % (
            len(log["companions"]), len(log["vcmdqs"])), evidence=evidence)
    elif cmdqv_built is False:
        cmdqv = finding("cmdqv", "warn", "the kernel is built without %s: a Grace SMMU uses only its standard CMDQ" % CMDQV_CONFIG,
                        evidence=evidence, fix="use a kernel with %s=y (NVIDIA's and current distribution arm64 kernels)" % CMDQV_CONFIG)
    elif log is not None and log["companions"]:
        cmdqv = finding("cmdqv", "unknown", "companion CMDQV device found but no VCMDQ allocation in the log", evidence=evidence)
    elif log is not None and log["smmu_devices"] and cmdqv_built:
        cmdqv = finding("cmdqv", "not_applicable", "SMMUv3 without a companion CMDQV device (not a Tegra241/Grace SMMU)",
                        evidence=evidence)
    else:
        cmdqv = finding("cmdqv", "unknown", "no CMDQV evidence (the companion line is printed only by kernels with %s)" % CMDQV_CONFIG,
                        evidence=evidence, fix="pass kernel_log and kernel_config")
    result["findings"] = [smmu, cmdqv]
    return result
