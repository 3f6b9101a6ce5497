#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_irq_affinity
short_description: Pin a NIC's queue IRQs to chosen CPUs, one queue per CPU, on any driver
version_added: 0.1.0
description:
  - Finds the NIC and its queue IRQs exactly as M(gpunode.tuning.nic_irq_facts) does (from the PCI function's
    C(msi_irqs), every run) and writes C(/proc/irq/N/smp_affinity_list) so that each queue's IRQs land on one
    target CPU.
  - "Target CPUs: either O(cpus), or a policy: O(count) CPUs (default: one per queue), NUMA-local to the NIC
    first (then the nearest nodes), whole SMT sibling groups (O(whole_cores)), never a CPU in O(exclude_cpus),
    never a nohz_full CPU or one isolated with C(isolcpus=managed_irq,...) (scheduler-only isolation,
    C(isolcpus=domain,...), keeps a CPU a candidate: that is how the isolcpus role fences the IRQ CPUs),
    highest-numbered cores first."
  - "Assignment: queues in queue order take the target CPUs ordered NUMA-local first, then the first thread of
    each core, then the second threads, so queues spread over physical cores before sharing one. All IRQs of one
    queue (virtio C(input.K) and C(output.K), separate rx/tx vectors) go to the same CPU. With more queues than
    CPUs the order wraps round-robin, with a warning. The same inputs always give the same assignment."
  - Control IRQs (C(mlx5_async), C(virtioN-config), C(ena-mgmnt) ...) are left where they are, with a warning.
  - Everything is validated before the first write. A write is made only where the affinity differs. A write the
    kernel refuses with EIO (kernels before 6.12) or EPERM (6.12 and later) marks a kernel-managed IRQ; it is
    reported as V(unchangeable) with the value read back from the file, an error only with O(strict). Any other
    write error restores the IRQs already changed in this run, then fails naming the IRQ, the value and the error.
    An IRQ whose previous value could not be read is never written back with an empty value (that would reset it
    on a real kernel); the error names it instead.
  - "Kernel-managed IRQs are found before writing where the kernel tells: C(IRQD_AFFINITY_MANAGED) in
    C(/sys/kernel/debug/irq/irqs/N) (debugfs mounted, read as root; under O(sysfs_path) on a captured tree, where a
    missing debugfs means unknown). Such IRQs are planned as V(unchangeable) and not written, in check mode too."
  - "A refusal is remembered for the rest of the boot in C(/run/gpunode/irq-affinity-refused.json) (under the tree's
    root for a captured tree), by IRQ number and name, so later runs, check mode included, plan those IRQs as
    V(unchangeable) instead of V(would_change): a converged host shows no drift. The record is written only by a
    real run that saw a refusal."
  - An IRQ whose C(effective_affinity_list) has not followed its C(smp_affinity_list) yet (it moves at the next
    interrupt) is reported as V(pending) and never rewritten for that.
attributes:
  check_mode:
    support: full
    details: Returns the exact per-IRQ before and after and V(would_change), and writes nothing.
  diff_mode:
    support: full
    details: A table of IRQ, name, queue and affinity before and after; with O(rps_cpus), a table of every RX queue's
      C(rps_cpus) before and after.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.nic_selector
  - gpunode.tuning.target.procfs_sysfs
options:
  cpus:
    description:
      - Explicit target CPUs, a CPU list string (C(160-170)) or a list of integers.
      - Every CPU must exist, be online and not be in O(exclude_cpus). A NUMA-remote CPU, a split SMT sibling
        group or a nohz_full or managed_irq-isolated CPU only warns.
      - Mutually exclusive with O(count).
    type: raw
  count:
    description:
      - Number of target CPUs chosen by the policy. Default, when O(cpus) is not given, the number of queues.
      - With O(whole_cores) it is rounded up to whole sibling groups (a warning says so).
    type: int
  exclude_cpus:
    description:
      - CPUs the workload uses, as a CPU list string or a list of integers. No IRQ is pinned to them, and with
        O(whole_cores) no sibling of theirs is chosen either.
    type: raw
  numa_local:
    description:
      - Prefer CPUs local to the NIC's NUMA node (policy mode), and warn about remote ones.
    type: bool
    default: true
  whole_cores:
    description:
      - Choose whole SMT sibling groups (policy mode), so IRQ CPUs never share a physical core with workload CPUs.
    type: bool
    default: true
  allow_irqbalance:
    description:
      - Proceed although irqbalance is active. Without it an active irqbalance is an error, because it would
        undo the pins within seconds.
    type: bool
    default: false
  strict:
    description:
      - Treat an IRQ the kernel refuses to move (managed IRQ, EIO or EPERM) as an error; the IRQs changed so far
        are restored first. An IRQ known to be managed before writing (debugfs, or a refusal remembered in this
        boot) fails the run before anything is written.
    type: bool
    default: false
  rps_cpus:
    description:
      - Receive Packet Steering (the seed article's step 5 note). A CPU list string (C(0-3)) or a list of integers;
        every RX queue's C(/sys/class/net/IFACE/queues/rx-N/rps_cpus) is set to that mask (hex, comma separated
        32-bit words, as the kernel prints it), after the pins. The interface is found from the selector (the PCI
        function) on every run. Empty or omitted leaves RPS alone.
      - With RPS, the receive softirq work of each queue is steered (by flow hash) to these CPUs through an IPI; the
        IRQ CPU only takes the hard IRQ and hands the packet off. That costs an inter-CPU hop per packet (a
        cache-line transfer and an IPI, extra latency), so it is for IRQ CPUs saturated by packet rate
        (M(gpunode.tuning.softnet_check)'s finding V(irq_cpus_saturated)) only. Use housekeeping CPUs, not the
        workload's; including the IRQ CPUs warns.
      - Every CPU must exist and be online, and not be isolcpus (domain) or nohz_full (the kernel drops those from an
        RPS mask silently). Check mode and C(--diff) show every queue's mask before and after; a failed write puts
        back the masks already written and the IRQs this run moved.
    type: raw
notes:
  - Pins set through C(/proc/irq) do not survive a reboot, a queue count change (C(ethtool -L)), a link down/up on
    some drivers, or a driver rebind. Use the C(gpunode.tuning.nic_irq_pinning) role to reapply them.
seealso:
  - module: gpunode.tuning.nic_irq_facts
"""

EXAMPLES = r"""
- name: Pin the 11 mlx5 completion IRQs of ens7 to CPUs 160-170 (seed article step 3)
  gpunode.tuning.nic_irq_affinity:
    interface: ens7
    cpus: 160-170

- name: Let the policy choose NUMA-local whole cores away from the training job's CPUs
  gpunode.tuning.nic_irq_affinity:
    pci_address: "0000:42:01.0"
    exclude_cpus: 0-159
  register: pins

- name: Show the plan without changing anything
  gpunode.tuning.nic_irq_affinity:
    interface: enp66s1
    count: 4
  check_mode: true
  diff: true
"""

RETURN = r"""
interface:
  description: The interface whose IRQs were planned.
  returned: success
  type: str
  sample: ens7
pci_address:
  description: Its PCI function.
  returned: success
  type: str
  sample: "0000:00:07.0"
driver:
  description: Its network driver.
  returned: success
  type: str
  sample: mlx5_core
cpus:
  description: Target CPUs.
  returned: success
  type: list
  elements: int
  sample: [160, 161, 162]
cpulist:
  description: Target CPUs as a CPU list.
  returned: success
  type: str
  sample: 160-170
irqs:
  description: Every IRQ of the NIC with its plan and outcome, control IRQs first.
  returned: success
  type: list
  elements: dict
  contains:
    irq:
      description: IRQ number.
      type: int
    name:
      description: Action name from /proc/interrupts.
      type: str
    kind:
      description: V(queue) or V(control).
      type: str
    queue:
      description: Queue index, null for control IRQs.
      type: int
    before:
      description: smp_affinity_list before this run; null when it could not be read.
      type: str
      sample: "3"
    after:
      description: >-
        smp_affinity_list after this run (read back after a write, also after a refused write), or planned in check
        mode; for V(unchangeable) IRQs the value they keep.
      type: str
      sample: "163"
    effective:
      description: effective_affinity_list (read back after a write); null when the kernel has none.
      type: str
    status:
      description: >-
        V(unchanged), V(changed), V(would_change) (check mode), V(pending) (affinity already right, effective
        affinity not yet followed) or V(unchangeable) (kernel-managed IRQ: shown by debugfs, refused now, or refused
        earlier in this boot; not counted as a change).
      type: str
rps:
  description:
    - With O(rps_cpus), every RX queue of the NIC; empty when RPS is not managed.
  returned: success
  type: list
  elements: dict
  contains:
    queue:
      description: RX queue number (C(rx-N)).
      type: int
    before:
      description: C(rps_cpus) before this run, as the kernel prints it (C(00) is RPS off).
      type: str
      sample: "00"
    after:
      description: C(rps_cpus) after this run (read back after a write), or planned in check mode.
      type: str
      sample: "30"
    before_cpus:
      description: The mask before, as a CPU list; empty for RPS off.
      type: str
    after_cpus:
      description: After, as a CPU list.
      type: str
      sample: "4-5"
    status:
      description: V(unchanged), V(changed), V(would_change) (check mode), or V(kept) (a release left a queue that
        carries a mask the collection did not set).
      type: str
irqbalance:
  description:
    - irqbalance's state seen before planning - C(installed), C(active), C(enabled), C(masked), C(banned_cpus) and
      C(source), as M(gpunode.tuning.irqbalance_facts) returns them in
      RV(gpunode.tuning.irqbalance_facts#module:ansible_facts.irqbalance).
  returned: success
  type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import DESIRED_KEYS, PIN_ARGUMENT_SPEC, run_desired_state
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_ARGUMENT_SPEC, SELECTOR_MUTUALLY_EXCLUSIVE

ARGUMENT_SPEC = dict(SELECTOR_ARGUMENT_SPEC, **PIN_ARGUMENT_SPEC)


INPUT_RULES = {
    "cidr": "cidr",
    "cpus": "cpulist",
    "exclude_cpus": "cpulist",
    "rps_cpus": "cpulist",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE + [("cpus", "count")])
    params = module.params
    procfs, sysfs = params["procfs_path"], params["sysfs_path"]
    desired = dict((key, params[key]) for key in DESIRED_KEYS)
    result = run_or_fail(module, run_desired_state, desired, check_mode=module.check_mode, procfs=procfs, sysfs=sysfs,
                         run=module_target(module).run)
    warnings = result.pop("warnings")
    rps_diff = result.pop("rps_diff")
    diff = result.pop("diff")
    exit_with(module, result, [diff, rps_diff] if rps_diff else diff, warnings)


if __name__ == "__main__":
    main()
