#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: irqbalance_facts
short_description: irqbalance's state and the CPUs it bans, and the checked ban list for banned mode
version_added: 0.1.0
description:
  - Reports whether irqbalance is installed, running, enabled or masked, which environment file it reads, and the
    CPUs it bans with that file, worked out as irqbalance 1.8 to 1.9.5 does in the function C(setup_banned_cpus) of its cputree.c. A
    non-empty C(IRQBALANCE_BANNED_CPUS) (hex mask) wins. Otherwise a non-empty C(IRQBALANCE_BANNED_CPULIST)
    wins. With neither, the CPUs of C(/sys/devices/system/cpu/isolated) and C(nohz_full) are banned. A set
    variable replaces that default ban, it does not add to it.
  - With O(banned_cpus), O(ban_isolated) and O(banned_devices), it also checks and returns what the
    C(gpunode.tuning.irqbalance) role writes in banned mode (RV(plan)). The role's module
    M(gpunode.tuning.irqbalance_state) uses the same reading and plan, so the role and the C(nic_irq_*) modules read
    irqbalance the same way.
  - Needs no NIC. M(gpunode.tuning.nic_irq_facts) reports the same irqbalance facts with a NIC's.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.attributes.facts
  - gpunode.tuning.target.procfs_sysfs
options:
  banned_cpus:
    description:
      - CPUs to ban in banned mode, usually the CPUs the NIC IRQs are pinned to. A Linux CPU list string (C(4-7,12)) or
        a list of integers. A value that is not a CPU list fails, naming it.
    type: raw
    default: []
  ban_isolated:
    description:
      - Add the isolated and nohz_full CPUs to RV(plan.banned_cpus). Setting C(IRQBALANCE_BANNED_CPULIST) turns off
        irqbalance's own ban of them, so banned mode has to list them again.
    type: bool
    default: true
  banned_devices:
    description:
      - PCI functions whose IRQs irqbalance must leave alone, C(0000:42:01.0) or C(42:01.0) (domain 0000 is added).
        Anything else, such as C(*) or a shell pattern, fails naming the entry, because the addresses go into a
        C(case) statement of the policy script irqbalance runs as root.
    type: list
    elements: str
    default: []
  config_file:
    description:
      - The irqbalance environment file to read, a path on the system such as C(/etc/sysconfig/irqbalance). Empty
        reads the first of C(/etc/default/irqbalance) and C(/etc/sysconfig/irqbalance) that exists.
      - On a captured tree it is read under the tree's root (the parent of O(procfs_path)).
    type: path
notes:
  - On a captured tree (O(procfs_path), O(sysfs_path)) C(systemctl) does not run; the tree's unit files, config file
    and C(proc/*/comm) are read, and C(devices/system/cpu/isolated) and C(nohz_full) under O(sysfs_path).
  - Not modelled - a ban set at run time over irqbalance's socket, and CPUs that a build with thermal support adds on a
    thermal event.
  - irqbalance after 1.9.5 (master commit 8929e4d) takes a set but empty C(IRQBALANCE_BANNED_CPULIST=) as "ban no
    CPU"; 1.9.5 and older fall back to the isolated and nohz_full CPUs. This module follows 1.9.5 and says so in
    RV(ansible_facts.irqbalance.notes).
seealso:
  - module: gpunode.tuning.nic_irq_facts
  - name: irqbalance setup_banned_cpus()
    description: Where irqbalance decides which CPUs it bans.
    link: https://github.com/Irqbalance/irqbalance/blob/v1.9.4/cputree.c
"""

EXAMPLES = r"""
- name: Which CPUs does irqbalance ban here?
  gpunode.tuning.irqbalance_facts:

- name: Show them
  ansible.builtin.debug:
    msg: "{{ ansible_facts.irqbalance.banned_cpus }} (from {{ ansible_facts.irqbalance.banned_by }})"

- name: The ban list for NIC IRQs on CPUs 4-7, with isolated/nohz_full CPUs, and the NIC's device ban
  gpunode.tuning.irqbalance_facts:
    banned_cpus: "4-7"
    banned_devices: ["0000:42:01.0"]
  register: ban

- name: Write it
  ansible.builtin.lineinfile:
    path: /etc/default/irqbalance
    regexp: '^\s*IRQBALANCE_BANNED_CPULIST='
    line: "IRQBALANCE_BANNED_CPULIST={{ ban.plan.banned_cpulist }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(irqbalance).
  returned: success
  type: dict
  contains:
    irqbalance:
      description: irqbalance's state and bans.
      returned: success
      type: dict
      contains:
        installed:
          description: Whether the unit or the binary exists.
          type: bool
        active:
          description: Whether it runs now.
          type: bool
        enabled:
          description: Whether it starts at boot.
          type: bool
        masked:
          description: Whether the unit is masked.
          type: bool
        active_state:
          description: C(systemctl is-active) output or the state inferred from the process list.
          type: str
        unit_file_state:
          description: C(systemctl is-enabled) output or the state inferred from unit files.
          type: str
        banned_cpus:
          description: The CPUs irqbalance bans with the config file and kernel state read.
          type: list
          elements: int
          sample: [2, 3]
        banned_by:
          description: What decided RV(ansible_facts.irqbalance.banned_cpus), V(IRQBALANCE_BANNED_CPUS), V(IRQBALANCE_BANNED_CPULIST) or V(isolated+nohz_full).
          type: str
          sample: isolated+nohz_full
        isolated:
          description: CPUs of C(/sys/devices/system/cpu/isolated); C((null)), empty or missing is V([]).
          type: list
          elements: int
        nohz_full:
          description: CPUs of C(/sys/devices/system/cpu/nohz_full); C((null)), empty or missing is V([]).
          type: list
          elements: int
        config_file:
          description: The environment file read, null when there is none.
          type: str
          sample: /etc/sysconfig/irqbalance
        source:
          description: V(systemctl) or V(unit-files).
          type: str
        notes:
          description: Parse problems in the config file, and a set but empty C(IRQBALANCE_BANNED_CPULIST).
          type: list
          elements: str
plan:
  description: What banned mode of the C(gpunode.tuning.irqbalance) role writes, from the options.
  returned: success
  type: dict
  contains:
    banned_cpus:
      description: O(banned_cpus), plus the isolated and nohz_full CPUs when O(ban_isolated).
      type: list
      elements: int
      sample: [2, 3, 4, 5, 6, 7]
    banned_cpulist:
      description: The same as a kernel-style CPU list, empty when no CPU is banned.
      type: str
      sample: "2-7"
    banned_devices:
      description: O(banned_devices) as full lower-case PCI addresses, each once, in the order given.
      type: list
      elements: str
      sample: ["0000:42:01.0"]
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance import plan_ban, read_irqbalance

ARGUMENT_SPEC = dict(
    banned_cpus=dict(type="raw", default=[]),
    ban_isolated=dict(type="bool", default=True),
    banned_devices=dict(type="list", elements="str", default=[]),
    config_file=dict(type="path"),
    **target_spec("procfs_path", "sysfs_path")
)


INPUT_RULES = {
    "banned_cpus": "cpulist",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    target = module_target(module, require=("cpu",))
    state = read_irqbalance(target.root, run=target.run, sysfs=target.sysfs, config_file=params["config_file"] or None)
    plan = run_or_fail(module, plan_ban, state, params["banned_cpus"], ban_isolated=params["ban_isolated"],
                       banned_devices=params["banned_devices"])
    module.exit_json(changed=False, ansible_facts={"irqbalance": state}, plan=plan)


if __name__ == "__main__":
    main()
