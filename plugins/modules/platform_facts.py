#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: platform_facts
short_description: Grace and VM readiness of a GPU node - architecture, virtualisation, pages, IOMMU, SMMUv3/CMDQV, SMT, mitigations
version_added: 0.3.0
description:
  - "Reads, with a finding (V(pass), V(warn), V(fail), V(not_applicable) or V(unknown)) per check and its evidence:
    the architecture (C(uname -m), else C(/proc/cpuinfo)); virtualisation from DMI and cpuinfo as
    C(systemd-detect-virt) does; the page size (C(getconf PAGESIZE); Grace kernels built C(-64k) give 65536);
    hugepage pools per size and per NUMA node; transparent hugepages C(enabled) and C(defrag) (5 values on current
    kernels, 3 on old ones); the IOMMU mode from the command line and the groups in C(/sys/kernel/iommu_groups);
    on aarch64 SMMUv3 and whether the Tegra241 CMDQV is in use, from the kernel log and the kernel config (on x86
    both are V(not_applicable), never V(pass)); SMT control; and every file of
    C(/sys/devices/system/cpu/vulnerabilities) by its prefix (C(Not affected), C(Vulnerable), C(Mitigation:)) and its
    SMT clause (a C(Mitigation:) that ends C(SMT vulnerable) still warns)."
  - A check with no evidence is V(unknown), not a pass. A virtual machine is reported, not failed.
  - Read-only. The preflight playbook (C(playbooks/preflight.yml)) turns the findings into a gate.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.attributes.facts
  - gpunode.tuning.target.procfs_sysfs
options:
  page_size:
    description:
      - The page size in bytes instead of C(getconf PAGESIZE) (for a captured tree, where no command runs).
    type: int
  kernel_log_path:
    description:
      - A file with the kernel log (C(dmesg) output) to read instead of C(journalctl -k -b) / C(dmesg).
      - On a captured tree without it the SMMU checks are V(unknown) on aarch64.
    type: path
  kernel_config_path:
    description:
      - The kernel config (C(config-<release>), or C(config.gz)) instead of C(/proc/config.gz) and
        C(/boot/config-<release>) under the tree's root.
    type: path
notes:
  - Commands run only against the live C(/proc) and C(/sys) - C(uname -m), C(getconf PAGESIZE),
    C(journalctl -k -b -o cat) and C(dmesg) - each optional; a missing one leaves its check V(unknown).
  - C(dmesg) needs root where C(kernel.dmesg_restrict=1); the journal needs membership of C(systemd-journal) or root.
seealso:
  - module: gpunode.tuning.gpu_health
  - module: gpunode.tuning.cpu_power_facts
"""

EXAMPLES = r"""
- name: Grace and VM readiness
  gpunode.tuning.platform_facts:
  register: platform

- name: The checks that are not a pass
  ansible.builtin.debug:
    msg: "{{ platform.findings | rejectattr('status', 'equalto', 'pass') | list }}"

- name: Read a captured tree
  gpunode.tuning.platform_facts:
    procfs_path: /srv/capture/node17/proc
    sysfs_path: /srv/capture/node17/sys
    page_size: 65536
    kernel_log_path: /srv/capture/node17/dmesg.txt
"""

RETURN = r"""
findings:
  description:
    - One per check - C(architecture), C(virtualisation), C(page_size), C(hugepages), C(transparent_hugepages), C(iommu), C(smmuv3),
      C(cmdqv), C(smt), C(mitigations) - with C(check), C(status), C(message), C(evidence) (lines) and C(fix).
  returned: always
  type: list
  elements: dict
architecture:
  description: C(x86_64), C(aarch64), another C(uname -m) value, or null when unknown.
  returned: always
  type: str
page_size:
  description: The page size in bytes, or null.
  returned: always
  type: int
virtualisation:
  description: C(virtualized), C(type) and the evidence, as C(systemd-detect-virt) would decide.
  returned: always
  type: dict
hugepages:
  description: Pools per page size, system-wide and per NUMA node.
  returned: always
  type: dict
thp:
  description: Transparent hugepages C(enabled) and C(defrag) choices and the format of the defrag file.
  returned: always
  type: dict
iommu:
  description: The command-line mode and the IOMMU groups.
  returned: always
  type: dict
smmu:
  description: The parsed SMMUv3/CMDQV kernel log lines and the kernel config options.
  returned: always
  type: dict
smt:
  description: SMT C(control) and C(active).
  returned: always
  type: dict
mitigations:
  description: Every vulnerabilities file with its state and SMT clause (C(smt)), the vulnerable ones, and those
    mitigated for the same thread only (C(smt_vulnerable)).
  returned: always
  type: dict
sources:
  description: Where each input came from (a command or a file).
  returned: always
  type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.platform_facts import gather_inputs, platform_facts

ARGUMENT_SPEC = dict(
    page_size=dict(type="int"),
    kernel_log_path=dict(type="path"),
    kernel_config_path=dict(type="path"),
    **target_spec("procfs_path", "sysfs_path")
)


INPUT_RULES = {}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    target = module_target(module, ("uname", "getconf", "journalctl", "dmesg"), require=("cpu",))
    inputs = run_or_fail(module, gather_inputs, target.procfs, target.run, params["kernel_log_path"],
                         params["kernel_config_path"], params["page_size"])
    facts = run_or_fail(module, platform_facts, target.procfs, target.sysfs, page_size=inputs["page_size"],
                        kernel_log=inputs["kernel_log"], kernel_config=inputs["kernel_config"], machine=inputs["machine"])
    facts["sources"] = inputs["sources"]
    module.exit_json(changed=False, ansible_facts={"platform": facts}, **facts)


if __name__ == "__main__":
    main()
