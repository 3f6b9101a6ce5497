# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):
    """How every module of the collection selects the NIC.

    _nic.SELECTOR_ARGUMENT_SPEC also holds procfs_path and sysfs_path: a module that takes this fragment takes
    gpunode.tuning.target.procfs_sysfs with it, which documents them (this fragment's notes name them)."""

    # Options: the NIC selector. Their argument spec is _nic.SELECTOR_ARGUMENT_SPEC; keep the two in step
    # (validate-modules checks it).
    DOCUMENTATION = r"""
options:
  interface:
    description:
      - Interface name, for example C(ens7). Names are not stable across boots; prefer O(pci_address).
      - At most one of O(interface), O(pci_address), O(mac) and O(cidr). With none, the interface of the
        lowest-metric IPv4 default route (else IPv6) is used. An empty or blank value of any of the four is an
        error, never "the default route".
      - The modules that pin IRQs (M(gpunode.tuning.nic_irq_affinity), M(gpunode.tuning.nic_irq_persist)) use the
        default route only on a node with one physical Ethernet NIC; with several they fail naming them (the
        default route is often the management NIC).
      - An InfiniBand interface (type 32) or a virtual one (no C(device) link) is never selected.
    type: str
  pci_address:
    description:
      - PCI address of the NIC function, C(0000:42:01.0) or C(42:01.0). The most stable way to name the NIC.
    type: str
  mac:
    description:
      - MAC address of the interface.
    type: str
  cidr:
    description:
      - A network such as C(10.20.0.0/16) or C(fd00::/64); the one physical interface holding an address in it
        is used. Addresses come from C(ip -j addr), or from C(/proc/net/fib_trie) and C(/proc/net/if_inet6)
        when C(ip) is missing or a captured tree is read.
    type: str
notes:
  - On a captured or generated tree (O(procfs_path), O(sysfs_path)) the commands that describe the NIC (C(ethtool),
    C(ip), C(systemctl)) do not run. Its procfs must hold C(interrupts) and its sysfs C(class/net), else the module
    fails naming the path. Every module fails when an IRQ listed in the PCI function's C(msi_irqs) has a
    C(/proc/interrupts) row that names another PCI function.
"""
