#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_irq_persist
short_description: Pin a NIC's queue IRQs, keep them pinned across boots, rebinds and late interface opens, and verify
version_added: 0.2.0
description:
  - One module run that does what the M(gpunode.tuning.nic_irq_affinity) module does (find the NIC from the PCI
    function on every run, plan, pin) and installs and verifies the persistence, so a converged node costs one
    module run instead of one per file and probe.
  - "Persistence (O(persist)): the collection's own module_utils (the import closure of the boot-time entry point,
    taken from this module's own payload, with a manifest of what was installed) under O(lib_dir); a small entry
    point O(entry_point); the desired state O(state_file), which names the NIC by its PCI address (never an IRQ number
    or an interface name); a systemd oneshot unit run at boot; a udev rule on the PCI path that re-runs it when the
    function is added again; an if-up hook for each network stack present (ifupdown C(/etc/network/if-up.d),
    NetworkManager C(dispatcher.d), networkd-dispatcher C(routable.d)) that re-runs it when the interface comes up;
    and a quiet re-check timer for queue-count changes, which send no event."
  - Many drivers (ena, ixgbe, i40e, ice, bnxt_en, e1000e, vmxnet3, and mlx5 since completion EQs are created on first
    use) request their queue IRQs only when the interface is opened. The boot unit waits for them (bounded), and the
    if-up hook pins them when the interface comes up later. Only the ifupdown hook is proven in this project's lab.
  - Every file is compared by content, mode and root ownership; only files that differ are written, atomically (a
    temporary file in the same directory, fsync, rename), and a failed write puts back every file written before it.
    Pruning and O(state=absent) remove only files the collection installed (the library by its manifest), never other
    content of a shared O(lib_dir).
  - "A run that fails after the pins puts back what it did: when a file write, a C(systemctl) or C(udevadm) step
    (daemon-reload, enable of the boot unit, enable --now of the timer, disable --now of a timer no longer wanted) or
    the read-back (O(verify)) fails, the units it enabled or started are stopped and disabled, every file goes back
    to its bytes, mode and owner (or its absence), systemd and udev re-read the files put back, a timer it disabled
    is enabled and started again, and every IRQ it moved goes back to its previous affinity. The failure names what
    was put back (C(files_rolled_back), C(systemd_rolled_back), C(pins_rolled_back)) and what could not be
    (C(rollback_failed), C(systemd_rollback_failed), C(pins_rollback_failed)); it reports C(changed) only when
    something could not be put back (or irqbalance's pass changed something, see O(irqbalance))."
  - After pinning, every queue IRQ's C(smp_affinity_list) is read back and compared with the plan (O(verify)).
    Kernel-managed IRQs (V(unchangeable)) are left out of the comparison and named in RV(unchangeable).
  - "RPS (O(rps_cpus), the seed article's step 5 note): every RX queue's C(rps_cpus) is set after the pins, with the
    code of M(gpunode.tuning.nic_irq_affinity); the value is stored in O(state_file), so the boot unit, the udev rule,
    the if-up hook and the re-check set it again (on the interface found from the PCI address then). It is read back
    with the pins (O(verify)) and put back with them when a later step fails. When a run leaves O(rps_cpus) out
    while the stored state had it, and with O(state=absent), every RX queue that still carries the stored mask is
    set back to 0 (RPS off, the kernel's default), a queue with another mask is left as it is with a warning; the
    masks before the collection's first run are not recorded."
  - On a captured or generated tree (O(procfs_path)/O(sysfs_path) not the live ones), the files go under that tree's
    root and no command (systemctl, udevadm) runs; the systemd actions are reported as they would be.
attributes:
  check_mode:
    support: full
    details: Returns the per-IRQ plan, every file that would be created, updated or removed (with the reason) and the
      systemd actions it would take, and writes nothing.
  diff_mode:
    support: full
    details: The IRQ table, the RX queues' C(rps_cpus) (with O(rps_cpus)), and before/after of every file that differs
      (library sources by name only).
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.nic_selector
  - gpunode.tuning.target.procfs_sysfs
options:
  state:
    description:
      - V(present) pins and installs; V(absent) stops and disables the units, sets the RPS masks the stored state set
        back to 0, removes every file the collection installed, and leaves the IRQs where they are.
    type: str
    choices: [present, absent]
    default: present
  cpus:
    description: Explicit target CPUs, as in M(gpunode.tuning.nic_irq_affinity). Mutually exclusive with O(count).
    type: raw
  count:
    description: Policy - how many CPUs, as in M(gpunode.tuning.nic_irq_affinity).
    type: int
  exclude_cpus:
    description: Policy - CPUs never to use, as in M(gpunode.tuning.nic_irq_affinity).
    type: raw
  numa_local:
    description: Policy - prefer CPUs of the NIC's NUMA node.
    type: bool
    default: true
  whole_cores:
    description: Policy - whole SMT sibling groups only.
    type: bool
    default: true
  allow_irqbalance:
    description: Pin although irqbalance is active (it is then expected to ban these CPUs and IRQs).
    type: bool
    default: false
  strict:
    description: Fail instead of warning when the plan cannot be met exactly or a write is refused.
    type: bool
    default: false
  rps_cpus:
    description:
      - Policy - RPS, as M(gpunode.tuning.nic_irq_affinity)'s O(gpunode.tuning.nic_irq_affinity#module:rps_cpus)
        (a CPU list string or a list of integers, housekeeping CPUs; it costs an inter-CPU hop per packet, so only
        for IRQ CPUs saturated by packet rate). Stored in O(state_file) and applied at every boot and re-check.
        Empty or omitted leaves RPS alone, and sets back to 0 the queues a previously stored mask still holds.
    type: raw
  assume_irqbalance_stopped:
    description:
      - Plan although irqbalance is active, as if it were already stopped. For check mode of a play that stops
        irqbalance itself before this task (the nic_irq_pinning role uses O(irqbalance) instead, which implies it).
        Only the run uses it; the stored desired state keeps O(allow_irqbalance), so check mode on a converged node
        compares the same file.
    type: bool
    default: false
  irqbalance:
    description:
      - Also put irqbalance in a mode in the same run, as M(gpunode.tuning.irqbalance_state) does (the same code), with
        the planned CPUs and this NIC's PCI function as the ban in V(banned) mode. Omitted, irqbalance is left alone.
      - "Order: the pins and the persistence files are planned and every input is checked, then irqbalance's pass is
        planned (its input checked), then irqbalance is stopped or restarted with the ban, and only then are the IRQs
        pinned, so no balancing pass of the old daemon comes in between. A failure after irqbalance's pass leaves that
        pass done (it is reported in RV(irqbalance_state) with the failure, and the run reports C(changed)); the pins,
        files and units of this module are put back. irqbalance's pass is not undone: its code (the same as
        M(gpunode.tuning.irqbalance_state)'s) rolls back only a failed write of its own files and keeps no record to
        take back a finished pass (unmask, enable, start); it is a complete state of its own, which a rerun (or
        M(gpunode.tuning.irqbalance_state) with the mode wanted) converges."
      - With O(state=present) the mode is V(disabled) or V(banned) (O(allow_irqbalance) then follows it); with
        O(state=absent) it is V(absent), which gives irqbalance back after the persistence is removed.
    type: dict
    suboptions:
      mode:
        description: As M(gpunode.tuning.irqbalance_state)'s O(gpunode.tuning.irqbalance_state#module:mode).
        type: str
        choices: [disabled, banned, absent]
        default: disabled
      ban_isolated:
        description: V(banned) - also ban the isolcpus and nohz_full CPUs.
        type: bool
        default: true
      config_file:
        description: irqbalance's environment file; empty picks it by OS family.
        type: path
        default: ""
      os_family:
        description: C(ansible_facts.os_family); worked out on the node when needed and not given.
        type: str
      state_dir:
        description: Where the markers of what was changed are kept.
        type: path
        default: /etc/gpunode
      policy_script:
        description: V(banned) - the policy script that bans this NIC's IRQs.
        type: path
        default: /usr/local/libexec/gpunode-irqbalance-policy
      binary:
        description: The irqbalance binary; absent means irqbalance is not installed (a fine state).
        type: path
        default: /usr/sbin/irqbalance
  persist:
    description: Install (and compare) the persistence. V(false) pins for the running kernel only.
    type: bool
    default: true
  verify:
    description: Read every queue IRQ back after pinning and fail when one is not where the plan put it.
    type: bool
    default: true
  recheck_interval:
    description:
      - systemd time span between re-checks by the timer (C(30s), C(5min), C(1h)). Empty removes the timer.
    type: str
    default: 5min
  state_file:
    description: The desired state on the node (JSON).
    type: path
    default: /etc/gpunode/nic-irq-affinity.json
  lib_dir:
    description: Where the library is installed. May be shared; only the collection's files are ever removed.
    type: path
    default: /usr/local/lib/gpunode-tuning
  entry_point:
    description: The boot-time entry point.
    type: path
    default: /usr/local/sbin/gpunode-nic-irq-pin
  python:
    description: Python (3.9 or later) on the node that runs the entry point.
    type: path
    default: /usr/bin/python3
  timeout:
    description: TimeoutStartSec of the units, in seconds (1-3600).
    type: int
    default: 30
notes:
  - The desired state keeps the selector's result, the PCI address, so the boot-time run finds the NIC again after
    renames and IRQ renumbering.
seealso:
  - module: gpunode.tuning.nic_irq_affinity
  - module: gpunode.tuning.nic_irq_facts
  - module: gpunode.tuning.softnet_check
"""

EXAMPLES = r"""
- name: Pin the storage NIC's queue IRQs to 4 NUMA-local CPUs and keep them there
  gpunode.tuning.nic_irq_persist:
    pci_address: "0000:42:01.0"
    count: 4
    recheck_interval: 5min

- name: Drift report only
  gpunode.tuning.nic_irq_persist:
    interface: enp66s1
    count: 4
  check_mode: true
  diff: true

- name: Remove the persistence (the IRQs stay where they are)
  gpunode.tuning.nic_irq_persist:
    state: absent
"""

RETURN = r"""
interface:
  description: The selected interface.
  returned: state=present
  type: str
pci_address:
  description: Its PCI function, as stored in the desired state.
  returned: state=present
  type: str
cpulist:
  description: The target CPUs.
  returned: state=present
  type: str
  sample: "4-7"
irqs:
  description: Every IRQ of the NIC with its plan and outcome, as M(gpunode.tuning.nic_irq_affinity) returns them.
  returned: state=present
  type: list
  elements: dict
rps:
  description:
    - Every RX queue whose RPS mask is managed (O(rps_cpus), or released by O(state=absent) or a run without it), as
      M(gpunode.tuning.nic_irq_affinity) returns them (C(queue), C(before), C(after) as the kernel prints the mask,
      C(before_cpus), C(after_cpus), C(status)). Empty when RPS is not managed.
  returned: always
  type: list
  elements: dict
drift:
  description:
    - The queue IRQs that differed from the plan, as C(IRQ NAME, BEFORE -> AFTER), then the RX queues whose RPS mask
      differed, as C(rx-N rps_cpus, BEFORE -> AFTER) (CPU lists, C(none) for RPS off).
  returned: state=present
  type: list
  elements: str
files:
  description:
    - The library, the entry point, O(state_file), the units, the udev rule and the if-up hooks, with action and
      reason as M(gpunode.tuning.cpuset_slices) returns its files in RV(gpunode.tuning.cpuset_slices#module:files).
  returned: always
  type: list
  elements: dict
systemd:
  description: The systemd and udev actions taken (or, in check mode or on a captured tree, that would be taken).
  returned: always
  type: list
  elements: str
verified:
  description: Whether the read-back matched the plan (null when not verified).
  returned: state=present
  type: bool
unchangeable:
  description: Kernel-managed queue IRQs the kernel does not let anyone pin, left out of the verification.
  returned: state=present
  type: list
  elements: str
effective_lagging:
  description: Queue IRQs whose effective affinity has not followed yet (it moves at the next interrupt).
  returned: state=present
  type: list
  elements: str
irqbalance:
  description:
    - irqbalance as seen before planning, as M(gpunode.tuning.nic_irq_affinity) returns it in
      RV(gpunode.tuning.nic_irq_affinity#module:irqbalance).
  returned: state=present
  type: dict
irqbalance_state:
  description:
    - O(irqbalance) given - the result of irqbalance's pass, as M(gpunode.tuning.irqbalance_state) returns it
      (C(status), C(config_file), C(files), C(systemd), C(restarted), and C(plan) in V(banned) mode).
  returned: when O(irqbalance) is given
  type: dict
"""


# Imported so that AnsiballZ ships the entry point's whole import closure, which is installed from this payload.
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_cli import main as _entry_point_main  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import install_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import PIN_ARGUMENT_SPEC
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance_state import SETTINGS_SPEC
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_ARGUMENT_SPEC, SELECTOR_MUTUALLY_EXCLUSIVE
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.persist_run import converge

ARGUMENT_SPEC = dict(
    SELECTOR_ARGUMENT_SPEC,
    state=dict(type="str", choices=["present", "absent"], default="present"),
    persist=dict(type="bool", default=True),
    verify=dict(type="bool", default=True),
    recheck_interval=dict(type="str", default="5min"),
    state_file=dict(type="path", default="/etc/gpunode/nic-irq-affinity.json"),
    timeout=dict(type="int", default=30),
    assume_irqbalance_stopped=dict(type="bool", default=False),
    irqbalance=dict(type="dict", options=SETTINGS_SPEC),
    **PIN_ARGUMENT_SPEC,
    **install_spec("/usr/local/lib/gpunode-tuning", "/usr/local/sbin/gpunode-nic-irq-pin")
)
INPUT_RULES = {
    "cidr": "cidr",
    "cpus": "cpulist",
    "exclude_cpus": "cpulist",
    "rps_cpus": "cpulist",
    "recheck_interval": "timespan",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE + [("cpus", "count")])
    target = module_target(module, ("ethtool", "ip", "systemctl", "udevadm"))
    out, warnings, diff = run_or_fail(module, converge, module.params, target)
    exit_with(module, out, diff, warnings)


if __name__ == "__main__":
    main()
