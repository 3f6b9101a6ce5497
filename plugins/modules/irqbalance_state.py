#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: irqbalance_state
short_description: Disable irqbalance, or keep it running away from pinned IRQs, in one module run
version_added: 0.1.0
description:
  - The whole C(gpunode.tuning.irqbalance) role in one run - probe irqbalance, plan, write the files, call systemctl
    and restart irqbalance when its config changed. The role is this module and a C(set_fact).
  - O(mode=disabled) stops and masks C(irqbalance.service). When the unit was not masked, it first writes the mask
    marker C(STATE_DIR/irqbalance-masked.json) with the enablement and state found, so O(mode=absent) can put them
    back. A unit someone else masked gets no marker.
  - O(mode=banned) keeps irqbalance running. It sets C(IRQBALANCE_BANNED_CPULIST) to the ban worked out by the
    irqbalance_facts module's plan (O(banned_cpus) plus the isolated and nohz_full CPUs), removes
    C(IRQBALANCE_BANNED_CPUS), and with O(banned_devices) installs a C(--policyscript) that bans those devices' IRQs
    and points C(IRQBALANCE_ARGS) at it. The lines it replaces are kept in C(STATE_DIR/irqbalance-banned.json). The
    config lines are edited as C(ansible.builtin.lineinfile) did (same regexp, same insert point).
  - O(mode=absent) and O(mode=disabled) put back the config lines banned mode replaced (byte for byte), and remove the
    policy script and the banned marker. O(mode=absent) also un-masks irqbalance, and restores its enablement and
    state, only when the mask marker says this role masked it.
  - irqbalance is restarted (once) only when its config file or policy script changed, in O(mode=banned), or in
    O(mode=absent) when it was running; never in O(mode=disabled), on a converged host or in check mode. The restart is
    done inside this run, so it comes before anything the caller pins next.
  - irqbalance not installed (no O(binary)) and no marker is a fine state, reported, with nothing done.
  - Every input is checked before anything changes.
attributes:
  check_mode:
    support: full
    details: Reports the files and systemctl actions it would take; writes nothing, starts and stops nothing.
  diff_mode:
    support: full
    details: Before and after of every file that differs, the config file among them.
  facts:
    support: full
    details: In O(mode=banned), C(ansible_facts.irqbalance) as M(gpunode.tuning.irqbalance_facts) returns it.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.facts
  - gpunode.tuning.target.procfs_sysfs
options:
  mode:
    description: What to do with irqbalance (see above).
    type: str
    choices: [disabled, banned, absent]
    default: disabled
  banned_cpus:
    description:
      - O(mode=banned) - CPUs irqbalance must not assign IRQs to. A Linux CPU list string (C(4-7,12)) or a list of
        integers. A value that is not a CPU list fails, naming it.
    type: raw
    default: []
  ban_isolated:
    description: O(mode=banned) - add the CPUs of C(/sys/devices/system/cpu/isolated) and C(nohz_full) to the ban.
    type: bool
    default: true
  banned_devices:
    description:
      - O(mode=banned) - PCI functions whose IRQs irqbalance must leave alone, C(0000:42:01.0) or C(42:01.0). Anything
        else (C(*), a shell pattern, a bus number alone) fails naming the entry.
    type: list
    elements: str
    default: []
  config_file:
    description:
      - irqbalance's environment file. Empty picks it from O(os_family) - C(/etc/default/irqbalance) for Debian,
        C(/etc/sysconfig/irqbalance) for RedHat and Suse; any other family fails instead of guessing.
      - Only O(mode=banned) and the undo of banned mode read it.
    type: path
    default: ""
  os_family:
    description:
      - C(ansible_facts.os_family). Not given, the module works it out with the code of C(setup)'s C(distribution)
        subset, and only when it needs the config file. On a captured tree give it, or O(config_file).
    type: str
  state_dir:
    description: Where the markers live (what this module masked or replaced), so O(mode=absent) undoes only that.
    type: path
    default: /etc/gpunode
  policy_script:
    description: Path of the policy script of O(mode=banned) with O(banned_devices).
    type: path
    default: /usr/local/libexec/gpunode-irqbalance-policy
  binary:
    description: The irqbalance binary; its presence is what RV(status.installed) reports.
    type: path
    default: /usr/sbin/irqbalance
notes:
  - On a captured or generated tree (O(procfs_path), O(sysfs_path)) the files are read and written under the tree's
    root, the systemctl actions are only reported (RV(systemd)), and C(devices/system/cpu/isolated) and C(nohz_full)
    are read under O(sysfs_path).
  - systemctl runs through the module (C(systemctl show), C(is-enabled), and C(mask), C(unmask), C(enable), C(stop),
    C(start), C(restart) as needed), only on the live host with systemd running.
  - The policy script carries the header C(Ansible managed), as the role's template rendered it with the default
    C(ansible_managed).
seealso:
  - module: gpunode.tuning.irqbalance_facts
  - name: The gpunode.tuning.irqbalance role
    description: Calls this module once per pass.
    link: https://github.com/gpunode/tuning/tree/main/roles/irqbalance
"""

EXAMPLES = r"""
- name: Mask irqbalance (the marker lets mode=absent give it back)
  gpunode.tuning.irqbalance_state:
    mode: disabled

- name: Keep irqbalance, away from CPUs 4-7 and the IRQs of one NIC
  gpunode.tuning.irqbalance_state:
    mode: banned
    banned_cpus: "4-7"
    banned_devices: ["0000:42:01.0"]
  register: irqb

- name: Undo what was done
  gpunode.tuning.irqbalance_state:
    mode: absent
"""

RETURN = r"""
status:
  description: irqbalance as found before this run acted (the role's C(irqbalance_status) fact).
  returned: always
  type: dict
  contains:
    installed:
      description: Whether O(binary) exists.
      type: bool
    active:
      description: C(ActiveState) active, activating or reloading.
      type: bool
    enabled:
      description: C(UnitFileState) enabled or enabled-runtime.
      type: bool
    masked:
      description: C(LoadState) masked, or C(UnitFileState) masked or masked-runtime.
      type: bool
    masked_by_role:
      description: Whether the mask marker exists.
      type: bool
    mode:
      description: O(mode).
      type: str
config_file:
  description: The environment file used, null when the mode did not need it.
  returned: always
  type: str
files:
  description:
    - The environment file, the policy script and the markers, each with its action and reason, as
      M(gpunode.tuning.cpuset_slices) returns its files in RV(gpunode.tuning.cpuset_slices#module:files).
  returned: always
  type: list
  elements: dict
systemd:
  description: The systemctl actions taken (in check mode or on a captured tree, that would be taken).
  returned: always
  type: list
  elements: str
  sample: [unmask, enable, start]
restarted:
  description: Whether irqbalance was (or would be) restarted because its config changed.
  returned: always
  type: bool
plan:
  description: O(mode=banned) - the checked ban, as M(gpunode.tuning.irqbalance_facts) returns it.
  returned: mode=banned
  type: dict
  sample: {"banned_cpus": [2, 3, 4, 5, 6, 7], "banned_cpulist": "2-7", "banned_devices": ["0000:42:01.0"]}
ansible_facts:
  description: O(mode=banned) - C(irqbalance), the state and ban found before this run acted.
  returned: mode=banned
  type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance_state import SETTINGS_SPEC, converge

ARGUMENT_SPEC = dict(
    SETTINGS_SPEC,
    banned_cpus=dict(type="raw", default=[]),
    banned_devices=dict(type="list", elements="str", default=[]),
    **target_spec("procfs_path", "sysfs_path")
)


INPUT_RULES = {
    "banned_cpus": "cpulist",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    target = module_target(module, commands=("systemctl",), require=("cpu", "one_system"))
    result, diff = run_or_fail(module, converge, params, target.root, target.run, target.check, sysfs=target.sysfs,
                               detect=target.os_family)
    exit_with(module, result, diff)


if __name__ == "__main__":
    main()
