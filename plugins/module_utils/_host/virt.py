# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Is this a virtual machine, and which hypervisor: from DMI and /proc/cpuinfo, as systemd-detect-virt decides.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. Read-only; every path is under ``sysfs``/``procfs`` so a captured
tree answers for the machine it was captured on.

Order of the evidence, as systemd's ``detect_vm()`` (src/basic/virt.c) uses it:
the DMI vendor strings (``/sys/class/dmi/id/{product_name,sys_vendor,board_vendor,bios_vendor,product_version}``)
against a table of hypervisor vendors; Xen from ``/sys/hypervisor/type``; then
the CPU's ``hypervisor`` flag in ``/proc/cpuinfo`` (x86: CPUID leaf 1 ECX bit
31), which says "a VM" without naming it. Without DMI (some aarch64 guests)
and without the flag the answer is ``none``: bare metal or undetectable.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_text

# DMI string prefix -> systemd-detect-virt's name (systemd src/basic/virt.c dmi_vendor_table).
DMI_VENDORS = (
    ("KVM", "kvm"),
    ("OpenStack", "kvm"),
    ("KubeVirt", "kvm"),
    ("Amazon EC2", "amazon"),
    ("QEMU", "qemu"),
    ("VMware", "vmware"),
    ("VMW", "vmware"),
    ("innotek GmbH", "oracle"),
    ("VirtualBox", "oracle"),
    ("Oracle Corporation", "oracle"),
    ("Xen", "xen"),
    ("Bochs", "bochs"),
    ("Parallels", "parallels"),
    ("BHYVE", "bhyve"),
    ("Hyper-V", "microsoft"),
    ("Apple Virtualization", "apple"),
    ("Google Compute Engine", "google"),
)
# Microsoft's DMI strings name both its hardware and Hyper-V; only a "Virtual Machine" product is a VM.
MICROSOFT_VM = ("Microsoft Corporation", "Virtual Machine")
DMI_FILES = ("product_name", "sys_vendor", "board_vendor", "bios_vendor", "product_version")


def _cpu_flags(procfs):
    text = read_text(join(procfs, "cpuinfo")) or ""
    for line in text.splitlines():
        key, dummy, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def detect_virt(sysfs="/sys", procfs="/proc"):
    """``{"virtualized": bool, "type": name or "vm" (unnamed) or "none", "evidence": [str]}``."""
    evidence = []
    dmi = dict((name, read_text(join(sysfs, "class/dmi/id", name))) for name in DMI_FILES)
    for name in DMI_FILES:
        value = dmi[name]
        if not value:
            continue
        for prefix, kind in DMI_VENDORS:
            if value.startswith(prefix):
                evidence.append("DMI %s is %r" % (name, value))
                return {"virtualized": True, "type": kind, "evidence": evidence}
    if dmi["sys_vendor"] == MICROSOFT_VM[0] and (dmi["product_name"] or "").startswith(MICROSOFT_VM[1]):
        return {"virtualized": True, "type": "microsoft",
                "evidence": ["DMI sys_vendor %r, product_name %r" % (dmi["sys_vendor"], dmi["product_name"])]}
    xen = read_text(join(sysfs, "hypervisor/type"))
    if xen == "xen":
        return {"virtualized": True, "type": "xen", "evidence": ["/sys/hypervisor/type is xen"]}
    if "hypervisor" in _cpu_flags(procfs):
        return {"virtualized": True, "type": "vm", "evidence": ["the CPU flags in /proc/cpuinfo include hypervisor"]}
    named = ", ".join("%s %r" % (k, v) for k, v in sorted(dmi.items()) if v)
    evidence.append("no hypervisor in DMI (%s) nor in the CPU flags" % (named or "no DMI strings"))
    return {"virtualized": False, "type": "none", "evidence": evidence}


def architecture(procfs="/proc"):
    """A best guess of the machine from cpuinfo alone (for a captured tree): x86_64, aarch64 or None."""
    text = read_text(join(procfs, "cpuinfo")) or ""
    if re.search(r"^vendor_id\s*:", text, re.M):
        return "x86_64"
    if re.search(r"^CPU implementer\s*:", text, re.M):
        return "aarch64"
    return None
