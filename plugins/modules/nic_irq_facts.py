#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_irq_facts
short_description: Find an Ethernet NIC's PCI function, queues, queue and control IRQs, CPU topology and irqbalance state
version_added: 0.1.0
description:
  - Selects one physical Ethernet interface by name, PCI address, MAC or network, or by the default route.
    InfiniBand interfaces (C(type) 32) and virtual interfaces (no C(device) link) are never selected; a bond,
    VLAN or bridge holding the default route or the address is followed down to its physical lower interface.
  - Resolves the PCI function behind the interface, also when C(/sys/class/net/IFACE/device) is a virtio child
    device, and reports the driver, C(numa_node) (C(-1) becomes null with a note) and C(local_cpulist).
  - Lists the IRQs from the PCI function's C(msi_irqs) (or its legacy C(irq)), names them from
    C(/proc/interrupts) and classifies each as a queue IRQ (with its queue index) or a control IRQ, with
    per-driver rules for mlx5_core, virtio_net, ena, gve, ice, i40e, ixgbe, bnxt_en and mana and a generic fallback
    that never reads a queue number out of a PCI address and takes names with a control word (C(fdir), C(misc),
    C(hwc), C(async) ...) as control IRQs.
  - Reports each IRQ's C(smp_affinity_list), C(effective_affinity_list) and per-CPU counts, the queue counts
    from C(ethtool -l) and sysfs, the CPU topology (online CPUs, SMT sibling groups read from
    C(thread_siblings_list), NUMA nodes, isolated, nohz_full, default_smp_affinity) and the irqbalance state.
  - IRQ numbers, interface names and CPU numbering are rediscovered on every run; nothing is cached.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.attributes.facts
  - gpunode.tuning.nic_selector
  - gpunode.tuning.target.procfs_sysfs
options:
  irq_affinity_format:
    description:
      - How the CPU sets of each IRQ are returned. Every CPU set is returned as a kernel-style CPU list string
        (C(affinity_list), C(effective_affinity_list), C(local_cpus_list), C(topology.online_list) ...), the format
        of the C(/proc) and C(/sys) files.
      - V(string) (the default) returns each IRQ's CPU sets only as those strings. Before tuning every IRQ allows
        every CPU, and on 1152 CPUs integer lists would be most of the output (see
        C(benchmarks/nic_irq_facts_results.md)).
      - V(both) also returns each IRQ's C(affinity) and C(effective_affinity) as lists of integers, for a caller that
        asks for them; the filter P(gpunode.tuning.cpulist_expand#filter) turns one string into such a list.
      - The NIC's and the topology's integer lists are returned in both formats.
    type: str
    choices: [both, string]
    default: string
notes:
  - On a captured tree (O(procfs_path)/O(sysfs_path) not the live roots) irqbalance is read from the tree's
    parent directory (its C(etc/), C(lib/systemd/), C(proc/*/comm)).
  - Runs C(ethtool -l), C(ip -j addr) and C(systemctl is-active/is-enabled irqbalance.service) only when they
    exist and only against the live system; without them the same facts come from procfs and sysfs.
seealso:
  - module: gpunode.tuning.nic_irq_affinity
  - name: Linux kernel, SMP IRQ affinity
    description: The /proc/irq interface this module reads.
    link: https://docs.kernel.org/core-api/irq/irq-affinity.html
"""

EXAMPLES = r"""
- name: Facts for the default-route NIC
  gpunode.tuning.nic_irq_facts:

- name: Facts for the NIC at a PCI address, then list its queue IRQs
  gpunode.tuning.nic_irq_facts:
    pci_address: "0000:42:01.0"

- name: Show where the queue IRQs are, as the /proc files show it
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nic_irq.irqs | selectattr('kind', 'equalto', 'queue') | map(attribute='affinity_list') | list }}"

- name: Each IRQ's CPU sets also as integer lists (a large output on big machines)
  gpunode.tuning.nic_irq_facts:
    interface: ens7
    irq_affinity_format: both
  register: nic

- name: Show the CPUs of the first queue IRQ as integers
  ansible.builtin.debug:
    msg: "{{ (nic.ansible_facts.nic_irq.irqs | selectattr('kind', 'equalto', 'queue') | first).affinity }}"

- name: Read a captured tree instead of this host
  gpunode.tuning.nic_irq_facts:
    interface: ens7
    procfs_path: /srv/captures/node17/proc
    sysfs_path: /srv/captures/node17/sys
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(nic_irq).
  returned: success
  type: dict
  contains:
    nic_irq:
      description: The selected NIC, its IRQs, the CPU topology and irqbalance.
      returned: success
      type: dict
      contains:
        interface:
          description: Selected interface name.
          type: str
          sample: ens7
        selected_by:
          description: How it was selected, V(interface), V(pci_address), V(mac), V(cidr) or V(default_route).
          type: str
          sample: default_route
        ifindex:
          description: Interface index.
          type: int
        mac:
          description: MAC address.
          type: str
          sample: "02:00:17:0a:0b:0c"
        operstate:
          description: Operational state from sysfs.
          type: str
          sample: up
        mtu:
          description: MTU.
          type: int
        speed_mbps:
          description: Link speed in Mb/s, null when unknown (link down, or C(-1) as virtio reports).
          type: int
          sample: 200000
        driver:
          description: Driver of the network device (C(virtio_net) for virtio, not C(virtio-pci)).
          type: str
          sample: mlx5_core
        pci_address:
          description: PCI function of the NIC; null for a non-PCI device.
          type: str
          sample: "0000:00:07.0"
        pci_driver:
          description: Driver bound to the PCI function.
          type: str
          sample: virtio-pci
        numa_node:
          description: NUMA node of the PCI function; null when the kernel reports C(-1).
          type: int
          sample: 1
        local_cpulist:
          description: CPUs local to the PCI function.
          type: list
          elements: int
        local_cpus_list:
          description: The same CPUs as a CPU list string.
          type: str
          sample: "0-63,128-191"
        queues:
          description: Queue counts; C(ethtool) values are null when ethtool did not run or printed C(n/a).
          type: dict
          contains:
            sysfs_rx:
              description: Number of C(queues/rx-*) directories.
              type: int
            sysfs_tx:
              description: Number of C(queues/tx-*) directories.
              type: int
            combined_max:
              description: Pre-set maximum combined channels.
              type: int
            combined_current:
              description: Current combined channels.
              type: int
            rx_max:
              description: Pre-set maximum RX channels.
              type: int
            rx_current:
              description: Current RX channels.
              type: int
            tx_max:
              description: Pre-set maximum TX channels.
              type: int
            tx_current:
              description: Current TX channels.
              type: int
            other_max:
              description: Pre-set maximum other channels.
              type: int
            other_current:
              description: Current other channels.
              type: int
        irqs:
          description: IRQs of the PCI function, control IRQs first, then queue IRQs by queue and IRQ number.
          type: list
          elements: dict
          contains:
            irq:
              description: IRQ number (valid for this boot only).
              type: int
            name:
              description: Action name from C(/proc/interrupts); empty when the vector has no handler.
              type: str
              sample: "mlx5_comp3@pci:0000:00:07.0"
            chip:
              description: Interrupt chip column of C(/proc/interrupts).
              type: str
            kind:
              description: V(queue) or V(control).
              type: str
            queue:
              description: Queue index for queue IRQs, null for control IRQs.
              type: int
            direction:
              description: V(rx), V(tx) or V(txrx) for queue IRQs, null for control IRQs.
              type: str
            affinity:
              description:
                - CPUs from C(smp_affinity_list); null when the file cannot be read.
                - Only with O(irq_affinity_format=both).
              type: list
              elements: int
            affinity_list:
              description: C(smp_affinity_list) as a CPU list string; null when the file cannot be read.
              type: str
              sample: "0-1151"
            effective_affinity:
              description:
                - CPUs from C(effective_affinity_list); null when the kernel has no such file.
                - Only with O(irq_affinity_format=both).
              type: list
              elements: int
            effective_affinity_list:
              description: C(effective_affinity_list) as a CPU list string; null when the kernel has no such file.
              type: str
              sample: "17"
            managed:
              description:
                - Whether the kernel manages the IRQ's affinity (C(IRQD_AFFINITY_MANAGED) in
                  C(/sys/kernel/debug/irq/irqs/N)); such an IRQ cannot be moved from user space.
                - Null when unknown (debugfs not mounted or not readable; read under O(sysfs_path)).
              type: bool
            counts:
              description: Non-zero interrupt counts by CPU id (keys are CPU ids as strings in JSON).
              type: dict
            total:
              description: Sum of the counts.
              type: int
        notes:
          description: Things worth knowing, such as a missing NUMA hint or ethtool failing.
          type: list
          elements: str
        topology:
          description: CPU topology.
          type: dict
          contains:
            online:
              description: Online CPUs.
              type: list
              elements: int
            online_list:
              description: The same as a CPU list string.
              type: str
            present:
              description: Present CPUs.
              type: list
              elements: int
            present_list:
              description: The same as a CPU list string.
              type: str
            possible:
              description: Possible CPUs.
              type: list
              elements: int
            possible_list:
              description: The same as a CPU list string.
              type: str
            nr_cpu_ids:
              description: Number of possible CPU ids.
              type: int
            siblings:
              description: SMT sibling groups, each once, from C(thread_siblings_list).
              type: list
              elements: list
              sample: [[0, 88], [1, 89]]
            numa_nodes:
              description: CPUs of each NUMA node (keys are node ids as strings in JSON).
              type: dict
            numa_distances:
              description: Distance row of each NUMA node.
              type: dict
            isolated:
              description: CPUs in C(/sys/devices/system/cpu/isolated).
              type: list
              elements: int
            isolated_list:
              description: The same as a CPU list string (empty when none).
              type: str
            nohz_full:
              description: CPUs in C(/sys/devices/system/cpu/nohz_full).
              type: list
              elements: int
            nohz_full_list:
              description: The same as a CPU list string (empty when none).
              type: str
            default_smp_affinity:
              description: CPUs of C(/proc/irq/default_smp_affinity).
              type: list
              elements: int
            default_smp_affinity_list:
              description: The same as a CPU list string; null when the file cannot be read.
              type: str
            notes:
              description: Notes about missing topology files.
              type: list
              elements: str
        irqbalance:
          description:
            - irqbalance's state and the CPUs it bans, read with the code of M(gpunode.tuning.irqbalance_facts) - the
              keys that module returns in RV(gpunode.tuning.irqbalance_facts#module:ansible_facts.irqbalance).
          type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import TreeError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import check_roots, roots_mixed
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance import read_irqbalance
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import (
    SELECTOR_ARGUMENT_SPEC,
    SELECTOR_KEYS,
    SELECTOR_MUTUALLY_EXCLUSIVE,
    NicError,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import IRQ_AFFINITY_FORMATS, add_cpulist_strings, read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._host.topology import read_topology

ARGUMENT_SPEC = dict(SELECTOR_ARGUMENT_SPEC, irq_affinity_format=dict(type="str", choices=list(IRQ_AFFINITY_FORMATS), default="string"))


INPUT_RULES = {
    "cidr": "cidr",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE)
    params = module.params
    procfs, sysfs = params["procfs_path"], params["sysfs_path"]
    target = module_target(module)
    run = target.run
    selector = dict((key, params[key]) for key in SELECTOR_KEYS)
    try:
        check_roots(procfs, sysfs)
        nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    except (NicError, TreeError) as exc:
        module.fail_json(msg=str(exc), **exc.details)
    mixed = roots_mixed(procfs, sysfs)
    if mixed:
        module.warn("%s: these facts mix two systems" % mixed)
    topology = read_topology(sysfs=sysfs, procfs=procfs)
    topology.pop("cpu_node")  # derivable from numa_nodes; 1000+ entries on big machines
    add_cpulist_strings(nic, topology, irq_affinity_format=params["irq_affinity_format"])
    nic["topology"] = topology
    nic["irqbalance"] = read_irqbalance(target.root, run=run)
    module.exit_json(changed=False, ansible_facts={"nic_irq": nic})


if __name__ == "__main__":
    main()
