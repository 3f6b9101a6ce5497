#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_power_settings
short_description: Re-enable disabled CPU idle states and set the cpufreq governor, now and at every boot
version_added: 0.2.0
description:
  - The OS-side fixes of the C(gpunode.tuning.cpu_power) role. BIOS C-state limits are not changed (nothing in the
    OS can); M(gpunode.tuning.cpu_power_facts) reports them with the evidence.
  - With O(enable_idle_states), writes C(0) to every C(cpuN/cpuidle/stateK/disable) that reads C(1) (all states,
    or those of O(idle_state_indexes)); with O(governor), writes it to every policy's C(scaling_governor) that
    differs. Each write is read back; a failed write puts every earlier one back and fails.
  - With O(persist), a C(systemd-tmpfiles) file (C(/etc/tmpfiles.d/gpunode-cpu-power.conf), C(w) lines with globs)
    repeats the settings at boot. Written atomically, root:root 0644.
  - Everything is checked before anything is written - a governor some policy's driver does not offer, a state
    index no CPU has - and the error names the value.
  - O(state=absent) removes the file; the live values stay as they are (they are what the kernel would pick after
    the next boot anyway, unless something else sets them).
attributes:
  check_mode:
    support: full
    details: Returns the exact writes and the file action it would carry out.
  diff_mode:
    support: full
    details: The sysfs values before and after, one line per file, and the tmpfiles file.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.target.procfs_sysfs
options:
  enable_idle_states:
    description: Re-enable disabled idle states.
    type: bool
    default: false
  idle_state_indexes:
    description: Only these state indexes (C(stateK)); empty means every state. An index no CPU has fails.
    type: list
    elements: int
    default: []
  governor:
    description: The cpufreq governor to set on every policy; empty sets none.
    type: str
    default: ""
  remove_kernel_limits:
    description:
      - Take the idle-limiting kernel parameters (C(intel_idle.max_cstate), C(processor.max_cstate),
        C(intel_idle.states_off), C(idle), C(cpuidle.off)) off the next boot's command line, with the code of
        M(gpunode.tuning.kernel_cmdline) (its O(gpunode.tuning.kernel_cmdline#module:remove) option - the same marker
        and drop-in, so it composes with the isolcpus role). With O(state=absent) what was taken out is put back.
      - Takes effect at the next boot; C(reboot_required) in RV(kernel_cmdline) says whether one is needed.
    type: bool
    default: false
  bootloader:
    description: Where O(remove_kernel_limits) edits the command line, as M(gpunode.tuning.kernel_cmdline) picks it.
    type: str
    choices: [auto, grub_debian, grubby]
    default: auto
  persist:
    description: Write the tmpfiles.d file that repeats the settings at boot.
    type: bool
    default: true
  state:
    description: V(absent) removes the persistence file.
    type: str
    choices: [present, absent]
    default: present
notes:
  - On a generated tree (O(procfs_path), O(sysfs_path)) the tmpfiles.d file is written under the tree's root, the
    parent of O(procfs_path).
seealso:
  - module: gpunode.tuning.cpu_power_facts
"""

EXAMPLES = r"""
- name: Deep C-states back on and the performance governor, persisted
  gpunode.tuning.cpu_power_settings:
    enable_idle_states: true
    governor: performance
"""

RETURN = r"""
writes:
  description: The sysfs writes carried out (in check mode - planned), each C(path), C(before), C(after), C(what).
  returned: always
  type: list
  elements: dict
files:
  description: The persistence file's action (C(path), C(action) create/update/remove/unchanged, C(reason)).
  returned: always
  type: list
  elements: dict
kernel_cmdline:
  description:
    - With O(remove_kernel_limits), M(gpunode.tuning.kernel_cmdline)'s result (C(configured_before),
      C(configured_after), C(running), C(next_boot_cmdline), C(reboot_required), C(managed), C(files), C(commands)).
  returned: when O(remove_kernel_limits) is true
  type: dict
notes:
  description: Why nothing could be set (no cpuidle states, no cpufreq policies).
  returned: always
  type: list
  elements: str
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.power_settings import SettingsError, apply, kernel_check, plan
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.kernel_cmdline import COMMANDS as KERNEL_COMMANDS
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.kernel_cmdline import TREE_COMMANDS

ARGUMENT_SPEC = dict(
    enable_idle_states=dict(type="bool", default=False),
    idle_state_indexes=dict(type="list", elements="int", default=[]),
    governor=dict(type="str", default=""),
    remove_kernel_limits=dict(type="bool", default=False),
    bootloader=dict(type="str", choices=["auto", "grub_debian", "grubby"], default="auto"),
    persist=dict(type="bool", default=True),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    **target_spec("procfs_path", "sysfs_path")
)


INPUT_RULES = {}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    target = module_target(module, KERNEL_COMMANDS, tree_commands=TREE_COMMANDS, require=("cpu", "one_system"))
    procfs, sysfs, root = target.procfs, target.sysfs, target.root
    kernel = (target.run, target.which, target.live, target.check)
    try:
        planned = plan(params, sysfs, procfs, root, kernel=kernel)
        changed = bool(planned["writes"]) or any(a["action"] != "unchanged" for a in planned["actions"])
        if module.check_mode:
            kresult, kdiff = kernel_check(planned)
        else:
            kresult, kdiff = apply(planned, root)
    except SettingsError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)
    warnings = []
    result = dict(changed=changed, writes=planned["writes"], notes=planned["notes"],
                  files=[dict((k, a[k]) for k in ("path", "action", "reason")) for a in planned["actions"]])
    if kresult is not None:
        warnings = kresult.pop("warnings", [])
        result["changed"] = changed or kresult["changed"]
        result["kernel_cmdline"] = kresult
    diff = [{"before_header": "sysfs", "after_header": "sysfs",
             "before": "".join("%s: %s\n" % (w["path"], w["before"]) for w in planned["writes"]),
             "after": "".join("%s: %s\n" % (w["path"], w["after"]) for w in planned["writes"])}]
    diff += [{"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]}
             for a in planned["actions"] if a["action"] != "unchanged"]
    exit_with(module, result, diff + kdiff, warnings)


if __name__ == "__main__":
    main()
