# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health of a node: which NVIDIA GPUs the PCI bus has, ``nvidia-smi -q -x`` and ``dcgmi diag`` judged.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Composes :mod:`_gpu.nvidia_smi` and :mod:`_gpu.dcgmi`; commands go through a
``run(argv) -> (rc, out, err)`` (None on a captured tree, where the outputs are
given as files).

The first finding, ``gpu_present``, says what the node has: ``pass`` (GPUs on
the bus and nvidia-smi lists them all), ``fail`` (NVIDIA GPUs on the PCI bus but
no driver, nvidia-smi failing, or fewer GPUs than on the bus), or
``not_applicable`` (no NVIDIA GPU on the bus and no nvidia-smi). Whether a node
without GPUs is fatal is the gate's policy, not this module's.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.dcgmi import DcgmiError, dcgm_coverage, dcgm_findings, parse_dcgmi_diag
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import finding
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nvidia_smi import NvidiaSmiError, gpu_findings, parse_nvidia_smi

NVIDIA_VENDOR = "0x10de"
# PCI class 0x0300 VGA controller, 0x0302 3D controller (the data-centre GPUs).
GPU_CLASSES = ("0x0300", "0x0302")
DCGM_LEVELS = (0, 1, 2, 3, 4)


class GpuHealthError(DetailedError):
    """Bad input (a level, an unreadable capture) or output that is not nvidia-smi's/dcgmi's."""


def nvidia_gpus_on_bus(sysfs="/sys"):
    """PCI addresses of the NVIDIA display/3D controllers under ``bus/pci/devices``, sorted."""
    base = join(sysfs, "bus/pci/devices")
    found = []
    for name in list_dir(base):
        vendor = (read_text(join(base, name, "vendor")) or "").strip().lower()
        klass = (read_text(join(base, name, "class")) or "").strip().lower()
        if vendor == NVIDIA_VENDOR and klass[:6] in GPU_CLASSES:
            found.append(name)
    return sorted(found)


def _read_capture(option, path):
    if not path:
        return None
    text = read_text(path)
    if text is None:
        raise GpuHealthError("%s %s cannot be read" % (option, path), option=option, value=path, expected="a readable file")
    return text


def _nvidia_smi_text(run, xml_path):
    """``(text, source, error)``: the XML from the file, or from ``nvidia-smi -q -x``; error when it cannot run."""
    text = _read_capture("nvidia_smi_xml_path", xml_path)
    if text is not None:
        return text, xml_path, None
    if run is None:
        return None, None, "no nvidia-smi output (a captured tree and no nvidia_smi_xml_path)"
    rc, out, err = run(["nvidia-smi", "-q", "-x"])
    if rc == 127:
        return None, None, "nvidia-smi is not installed"
    if rc != 0:
        return None, "nvidia-smi -q -x", "nvidia-smi -q -x exited %d: %s" % (rc, (err or out).strip()[:300])
    return out, "nvidia-smi -q -x", None


def _presence(on_bus, parsed, error):
    evidence = {"pci_nvidia_gpus": on_bus, "nvidia_smi_gpus": None if parsed is None else [g["pci_bus_id"] for g in parsed["gpus"]],
                "error": error}
    if parsed is None:
        if on_bus:
            return finding("gpu_present", "fail", "%d NVIDIA GPU(s) on the PCI bus but %s" % (len(on_bus), error), evidence=evidence,
                           fix="install and load the NVIDIA driver (nvidia-smi must list every GPU)")
        return finding("gpu_present", "not_applicable", "no NVIDIA GPU on the PCI bus (%s)" % error, evidence=evidence)
    listed = len(parsed["gpus"])
    if on_bus and listed < len(on_bus):
        return finding("gpu_present", "fail", "nvidia-smi lists %d GPU(s), the PCI bus has %d" % (listed, len(on_bus)), evidence=evidence,
                       fix="a GPU fell off the bus or is not bound to the driver: check dmesg for Xid 79 and the GPU's PCI link")
    if not listed:
        return finding("gpu_present", "not_applicable", "nvidia-smi runs but lists no GPU", evidence=evidence)
    return finding("gpu_present", "pass", "%d GPU(s): %s" % (listed, ", ".join(sorted(set(g["product_name"] or "?" for g in parsed["gpus"])))),
                   evidence=evidence)


def _dcgm(run, level, output_path, has_gpus=False):
    """``(parsed or None, findings)`` for ``dcgmi diag -r level``. Where the node has GPUs, diagnostics that did not
    run are a ``warn`` (``dcgm``: level 0, DCGM not installed, every test skipped), so that the gate is never GO
    without saying so; the strict policy makes it fatal. Without GPUs: nothing at level 0, not_applicable without
    DCGM."""
    text = _read_capture("dcgmi_output_path", output_path)
    source = output_path
    if text is None:
        if not level:
            if not has_gpus:
                return None, []
            return None, [finding("dcgm", "warn", "dcgmi diag not run (dcgm_level 0): the GPU diagnostics are not part of "
                                  "this result", fix="set dcgm_level (preflight_dcgm_level) to 1-4 to run dcgmi diag")]
        if run is None:
            return None, [finding("dcgm", "unknown", "dcgmi diag not run: a captured tree and no dcgmi_output_path")]
        rc, out, err = run(["dcgmi", "diag", "-r", str(level)])
        if rc == 127:
            return None, [finding("dcgm", "warn" if has_gpus else "not_applicable",
                                  "DCGM is not installed (no dcgmi)%s" % (": the GPU diagnostics did not run" if has_gpus else ""),
                                  fix="install datacenter-gpu-manager and start nv-hostengine to run dcgmi diag")]
        text, source = out, "dcgmi diag -r %d" % level
        if not (out or "").strip():
            return None, [finding("dcgm", "fail", "dcgmi diag -r %d exited %d with no table: %s" % (level, rc, (err or "").strip()[:300]),
                                  fix="start nv-hostengine (systemctl start nvidia-dcgm) and rerun")]
    try:
        parsed = parse_dcgmi_diag(text)
    except DcgmiError as exc:
        return None, [finding("dcgm", "fail", "%s output is not a dcgmi diag table: %s" % (source, exc), evidence=(text or "")[:500])]
    parsed["source"] = source
    return parsed, [dcgm_coverage(parsed)] + dcgm_findings(parsed)


def gpu_health(sysfs="/sys", run=None, nvidia_smi_xml_path=None, dcgm_level=0, dcgmi_output_path=None):
    """``{"pci_gpus", "nvidia_smi": parsed|None, "dcgm": parsed|None, "findings", "sources"}``."""
    if isinstance(dcgm_level, bool) or dcgm_level not in DCGM_LEVELS:
        raise GpuHealthError("dcgm_level %r is not a dcgmi diag run level" % (dcgm_level,), option="dcgm_level", value=dcgm_level,
                             expected="0 (do not run) or 1-4 (dcgmi diag -r)")
    if not os.path.isdir(join(sysfs, "bus")):
        raise GpuHealthError("sysfs_path %s has no bus directory" % sysfs, option="sysfs_path", value=sysfs, expected="a sysfs root")
    on_bus = nvidia_gpus_on_bus(sysfs)
    text, source, error = _nvidia_smi_text(run, nvidia_smi_xml_path)
    parsed = None
    if text is not None:
        try:
            parsed = parse_nvidia_smi(text)
        except NvidiaSmiError as exc:
            parsed, error = None, "%s did not give nvidia-smi XML: %s" % (source, exc)
    findings = [_presence(on_bus, parsed, error)]
    if parsed is not None:
        findings.extend(gpu_findings(parsed))
    has_gpus = bool(on_bus) or bool(parsed is not None and parsed["gpus"])
    dcgm, dcgm_found = _dcgm(run, dcgm_level, dcgmi_output_path, has_gpus)
    findings.extend(dcgm_found)
    return {"pci_gpus": on_bus, "nvidia_smi": parsed, "dcgm": dcgm, "findings": findings,
            "sources": {"nvidia_smi": source, "dcgm": None if dcgm is None else dcgm["source"]}}
