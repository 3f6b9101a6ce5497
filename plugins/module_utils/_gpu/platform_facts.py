# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every platform reader run on one host (``platform_facts``), and what they need from commands and files
(``gather_inputs``).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. The readers are ``_gpu.platform`` (architecture, virtualisation, page
size, hugepages, THP, SMT, mitigations) and ``_gpu.iommu`` (IOMMU, SMMUv3,
CMDQV); ``gather_inputs`` runs ``uname -m``, ``getconf PAGESIZE`` and the
kernel log commands, and reads the kernel config, so that the readers take
them as text.
"""

from __future__ import annotations

import gzip
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.iommu import read_iommu, read_smmu
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.platform import (
    PlatformError,
    read_architecture,
    read_hugepages,
    read_mitigations,
    read_page_size,
    read_smt,
    read_thp,
    read_virtualisation,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_text


# ---------------------------------------------------------------- composed --

def platform_facts(procfs="/proc", sysfs="/sys", page_size=None, kernel_log=None, kernel_config=None, machine=None):
    """Every reader of ``_gpu.platform`` and ``_gpu.iommu`` composed: ``{"architecture", "virtualisation", "page_size",
    "hugepages", "thp", "iommu", "smmu", "smt", "mitigations", "findings": [...]}`` (each part without its own
    ``findings``; all of them, in this order, in the top-level list)."""
    arch = read_architecture(procfs, machine)
    parts = (
        ("architecture", arch),
        ("virtualisation", read_virtualisation(sysfs, procfs)),
        ("page_size", read_page_size(page_size, arch["architecture"])),
        ("hugepages", read_hugepages(sysfs)),
        ("thp", read_thp(sysfs)),
        ("iommu", read_iommu(procfs, sysfs)),
        ("smmu", read_smmu(arch["architecture"], kernel_log, kernel_config)),
        ("smt", read_smt(sysfs)),
        ("mitigations", read_mitigations(sysfs, procfs)),
    )
    out, findings = {}, []
    for name, part in parts:
        findings.extend(part.pop("findings"))
        out[name] = part
    out["architecture"] = arch["architecture"]
    out["architecture_source"] = arch["source"]
    out["page_size"] = parts[2][1]["page_size"]
    out["findings"] = findings
    return out


# ------------------------------------------------------------ live inputs --

def _read_config(path):
    """A kernel config file's text; ``.gz`` (``/proc/config.gz``) is decompressed. None when it cannot be read."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
                return handle.read()
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, EOFError):
        return None


def _read_given(option, path, read, expected, sources):
    """The text of a file an option names (``read`` it), its source noted; one that cannot be read fails naming it."""
    data = read(path)
    if data is None:
        raise PlatformError("%s %s cannot be read" % (option, path), option=option, value=path, expected=expected)
    sources[option[:-len("_path")]] = path
    return data


def gather_inputs(procfs="/proc", run=None, kernel_log_path=None, kernel_config_path=None, page_size=None):
    """What :func:`platform_facts` needs from commands and files: ``{"machine", "page_size", "kernel_log",
    "kernel_config", "sources": {name: where it came from}}``.

    ``run`` (``argv -> (rc, out, err)``, None on a captured tree) runs ``uname -m``, ``getconf PAGESIZE`` and
    ``journalctl -k -b -o cat`` (``dmesg`` when the journal has no kernel lines). Files given by path win; the
    kernel config is looked for in ``/proc/config.gz`` and ``/boot/config-<release>`` under the tree's root (the
    parent of ``procfs``). Nothing found stays None: the readers then say ``unknown``."""
    sources = {}
    machine = None
    if run is not None:
        rc, out, _err = run(["uname", "-m"])
        if rc == 0 and out.strip():
            machine, sources["machine"] = out.strip(), "uname -m"
        if page_size is None:
            rc, out, _err = run(["getconf", "PAGESIZE"])
            if rc == 0 and out.strip():
                page_size, sources["page_size"] = out.strip(), "getconf PAGESIZE"
    elif page_size is not None:
        sources["page_size"] = "page_size"
    kernel_log = None
    if kernel_log_path:
        kernel_log = _read_given("kernel_log_path", kernel_log_path, read_text, "a readable file with the kernel log (dmesg)",
                                 sources)
    elif run is not None:
        for argv in (["journalctl", "-k", "-b", "-o", "cat", "--no-pager", "-q"], ["dmesg"]):
            rc, out, _err = run(argv)
            if rc == 0 and out.strip():
                kernel_log, sources["kernel_log"] = out, " ".join(argv)
                break
    kernel_config = None
    if kernel_config_path:
        kernel_config = _read_given("kernel_config_path", kernel_config_path, _read_config,
                                    "a readable kernel config (config-<release> or config.gz)", sources)
    else:
        root = os.path.dirname(os.path.realpath(procfs))
        release = (read_text(join(procfs, "sys/kernel/osrelease")) or "").strip()
        candidates = [join(procfs, "config.gz")] + ([join(root, "boot", "config-" + release)] if release else [])
        for path in candidates:
            if os.path.isfile(path):
                kernel_config = _read_config(path)
                if kernel_config is not None:
                    sources["kernel_config"] = path
                    break
    return {"machine": machine, "page_size": page_size, "kernel_log": kernel_log, "kernel_config": kernel_config,
            "sources": sources}
