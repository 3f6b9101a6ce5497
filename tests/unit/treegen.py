# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Generate synthetic ``proc``/``sys``/``etc`` trees shaped like real machines.

Used by the unit tests and by ``benchmarks/``. Import it as a plain module
(``tests/unit`` is put on ``sys.path`` by ``tests/unit/conftest.py``)::

    from treegen import build_tree, seed_vm, gpu_node, lab_virtio, large_numa

    tree = build_tree(tmp_path, seed_vm())       # writes tmp_path/{proc,sys,etc}
    tree.proc, tree.sys, tree.etc, tree.root      # paths to pass as procfs/sysfs/root
    tree.run(["ethtool", "-l", "ens7"])           # recorded outputs: (rc, out, err)
    tree.affinity(61)                             # current smp_affinity_list text
    tree.irqs("ens7")                             # IRQ numbers of that NIC

A **spec** is a plain dict; the shape functions return one you can modify
before building. Keys (all optional except ``cpus``):

``cpus``            number of possible CPUs (ids 0..cpus-1)
``offline``         list of offline CPU ids (absent from the interrupts header)
``siblings``        list of SMT groups (lists of CPU ids); default: one CPU per core
``numa``            dict node -> CPU list; default: none (kernel without NUMA)
``numa_distance``   function (node, node) -> distance for ``nodeN/distance`` (default 10 local, 20 remote)
``isolated``, ``nohz_full``   CPU lists for ``devices/system/cpu/``
``cmdline``         text of ``/proc/cmdline`` (default: none, no file)
``default_smp_affinity``      CPU list (default: all CPUs)
``nics``            list of NIC dicts (below)
``virtual``         list of ``{"name", "lower": [...], "addresses": [...]}`` virtual interfaces
``other_irqs``      list of IRQ dicts for other devices (rows in /proc/interrupts only)
``routes``          list of ``{"iface", "dest", "mask", "gateway", "metric"}`` (IPv4, dotted)
``ipv6_default``    interface name holding an IPv6 default route, or None
``irqbalance``      None, or ``{"config": text, "path": "etc/default/irqbalance",
                    "running": bool, "unit": "enabled"|"disabled"|"masked", "systemd": bool}``
``arch_rows``       include NMI/LOC/ERR/MIS rows (default True)

A NIC dict: ``name``, ``pci`` (``0000:bb:dd.f``), ``driver`` (netdev driver,
for example ``mlx5_core`` or ``virtio_net``), ``pci_driver`` (default: the
same; ``virtio-pci`` for virtio), ``virtio`` (child device name such as
``virtio2``, None for a plain PCI NIC), ``numa_node`` (int, -1 allowed),
``local_cpulist`` (default: the node's CPUs, all CPUs for -1), ``mac``,
``speed`` (Mb/s, -1 for unknown), ``type`` (1 Ethernet, 32 InfiniBand),
``rx_queues``/``tx_queues`` (sysfs queue dirs), ``addresses`` (list of
``"10.0.0.5/24"``), ``ethtool_l`` (recorded ``ethtool -l`` output or None),
``irqs``: list of IRQ dicts ``{"irq", "name", "affinity": [cpus],
"effective": [cpus] or None (no file), "counts": {cpu: n}, "chip",
"managed": True/False}`` (with ``managed``, ``sys/kernel/debug/irq/irqs/N``
is written in the kernel's layout, :func:`debugfs_irq_text`; without it no
debugfs file, as when debugfs is not mounted),
``legacy_irq`` (int written to the PCI ``irq`` file).

IRQ list helpers: :func:`mlx5_irqs`, :func:`virtio_irqs`, :func:`named_irqs`.
Everything written is a plain file, so tests may write ``smp_affinity_list``
like the kernel would be written to; make a write fail by replacing that file
with a directory (``tree.break_irq(n)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

# ------------------------------------------------------------------ helpers --


def cpulist(cpus):
    cpus = sorted(set(cpus))
    parts, start, prev = [], None, None
    for cpu in cpus:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(str(start) if start == prev else "%s-%s" % (start, prev))
            start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
    return ",".join(parts)


def cpumask(cpus, ncpus):
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    nwords = (ncpus + 31) // 32
    top = ncpus - (nwords - 1) * 32
    words = []
    for index in range(nwords - 1, -1, -1):
        word = (value >> (32 * index)) & 0xFFFFFFFF
        words.append("%0*x" % ((top + 3) // 4 if index == nwords - 1 else 8, word))
    return ",".join(words)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def _link(target, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(os.path.relpath(target, os.path.dirname(path)), path)


def mlx5_irqs(pci, first_irq, count, cpus, async_irq=True):
    """mlx5 VF/PF vectors: mlx5_async0 then mlx5_comp0..N-1 pinned like the driver does (one per CPU)."""
    irqs = []
    irq = first_irq
    if async_irq:
        irqs.append({"irq": irq, "name": "mlx5_async0@pci:%s" % pci, "affinity": [cpus[0]], "effective": [cpus[0]], "counts": {cpus[0]: 812}})
        irq += 1
    for index in range(count):
        cpu = cpus[index % len(cpus)]
        irqs.append({"irq": irq, "name": "mlx5_comp%d@pci:%s" % (index, pci), "affinity": [cpu], "effective": [cpu], "counts": {cpu: 100000 + index}})
        irq += 1
    return irqs


def virtio_irqs(vindex, first_irq, queues, cpus):
    """virtio-net vectors: config, then input.K/output.K per queue pair."""
    irqs = [{"irq": first_irq, "name": "virtio%d-config" % vindex, "affinity": list(cpus), "effective": [cpus[0]], "counts": {}}]
    irq = first_irq + 1
    for queue in range(queues):
        cpu = cpus[queue % len(cpus)]
        for kind in ("input", "output"):
            irqs.append({"irq": irq, "name": "virtio%d-%s.%d" % (vindex, kind, queue), "affinity": [cpu], "effective": [cpu], "counts": {cpu: 50 + queue}})
            irq += 1
    return irqs


def named_irqs(names, first_irq, cpus):
    """IRQs with the given names, spread over ``cpus`` in order."""
    return [
        {"irq": first_irq + i, "name": name, "affinity": [cpus[i % len(cpus)]], "effective": [cpus[i % len(cpus)]], "counts": {cpus[i % len(cpus)]: 7 + i}}
        for i, name in enumerate(names)
    ]


# ------------------------------------------------------------------- shapes --


def seed_vm():
    """The seed's VM: 176 vCPUs, 2 NUMA nodes, siblings i/i+88, mlx5 VF ens7 with 11 comp IRQs on CPUs 0-10.

    Also 8 InfiniBand mlx5 VFs (type 32, each with its own comp IRQs), NVMe
    queues, lo and docker0; default route on ens7; NIC numa_node -1 as in
    many cloud VMs (seed step 3 note).
    """
    ncpus, half = 176, 88
    siblings = [[i, i + half] for i in range(half)]
    numa = {0: list(range(0, 44)) + list(range(88, 132)), 1: list(range(44, 88)) + list(range(132, 176))}
    eth_pci = "0000:00:07.0"
    nics = [{
        "name": "ens7", "pci": eth_pci, "driver": "mlx5_core", "numa_node": -1, "mac": "02:00:17:0a:0b:0c",
        "speed": 200000, "rx_queues": 11, "tx_queues": 11, "addresses": ["172.27.1.15/20"],
        "ethtool_l": ETHTOOL_L_MLX5_11,
        "irqs": mlx5_irqs(eth_pci, 59, 11, list(range(0, 11))),
    }]
    irq = 100
    for index in range(8):
        pci = "0000:%02x:00.0" % (0x11 + index)
        nics.append({
            "name": "ibp%ds0" % (0x11 + index), "pci": pci, "driver": "mlx5_core", "numa_node": -1, "type": 32,
            "mac": "00:00:10:29:fe:80:00:00:00:00:00:00:%02x:%02x:%02x:ff:fe:00:00:%02x" % (index, index, index, index),
            "speed": 400000, "rx_queues": 11, "tx_queues": 11,
            "irqs": mlx5_irqs(pci, irq, 11, list(range(0, 11))),
        })
        irq += 12
    other = named_irqs(["nvme0q%d" % q for q in range(1, 33)], 220, list(range(0, 176, 6)))
    return {
        "cpus": ncpus, "siblings": siblings, "numa": numa, "nics": nics, "other_irqs": other,
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}, {"name": "docker0", "addresses": ["172.17.0.1/16"]}],
        "routes": [
            {"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "172.27.0.1", "metric": 100},
            {"iface": "ens7", "dest": "172.27.0.0", "mask": "255.255.240.0", "gateway": "0.0.0.0", "metric": 100},
            {"iface": "docker0", "dest": "172.17.0.0", "mask": "255.255.0.0", "gateway": "0.0.0.0", "metric": 0},
        ],
    }


def gpu_node():
    """Bare-metal 8-GPU node: 2 sockets x 48 cores x 2 threads (192 CPUs), NPS4 = 8 NUMA nodes.

    Siblings i/i+96. Node n holds cores 12n..12n+11 and their siblings.
    Ethernet: mlx5 PF ens21f0np0 at 0000:c1:00.0 on node 5 with 32 comp
    IRQs spread by the driver over CPUs 0-31; 8 InfiniBand PFs (type 32).
    """
    ncpus, half = 192, 96
    siblings = [[i, i + half] for i in range(half)]
    numa = dict((n, list(range(12 * n, 12 * n + 12)) + list(range(12 * n + half, 12 * n + 12 + half))) for n in range(8))
    pci = "0000:c1:00.0"
    nics = [{
        "name": "ens21f0np0", "pci": pci, "driver": "mlx5_core", "numa_node": 5, "mac": "b8:3f:d2:aa:bb:cc",
        "speed": 100000, "rx_queues": 32, "tx_queues": 32, "addresses": ["10.40.0.21/16"],
        "ethtool_l": ETHTOOL_L_MLX5_PF,
        "irqs": mlx5_irqs(pci, 300, 32, list(range(0, 32))),
    }]
    irq = 400
    for index in range(8):
        ib_pci = "0000:%02x:00.0" % (0x18 + 0x20 * index)
        nics.append({
            "name": "ibp%ds0" % (0x18 + 0x20 * index), "pci": ib_pci, "driver": "mlx5_core", "numa_node": index, "type": 32,
            "mac": "00:00:10:49:fe:80:00:00:00:00:00:00:b8:3f:d2:ff:fe:00:%02x:00" % index, "speed": 400000,
            "rx_queues": 8, "tx_queues": 8, "irqs": mlx5_irqs(ib_pci, irq, 8, numa[index][:8]),
        })
        irq += 9
    other = named_irqs(["nvme%dq%d" % (d, q) for d in range(4) for q in range(1, 17)], 600, list(range(0, ncpus, 3)))
    return {
        "cpus": ncpus, "siblings": siblings, "numa": numa, "nics": nics, "other_irqs": other,
        "numa_distance": lambda a, b: 10 if a == b else (12 if a // 4 == b // 4 else 32),
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [
            {"iface": "ens21f0np0", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.40.0.1", "metric": 0},
            {"iface": "ens21f0np0", "dest": "10.40.0.0", "mask": "255.255.0.0", "gateway": "0.0.0.0", "metric": 0},
        ],
    }


def lab_virtio():
    """The LAB.md gpu-node guest: 8 CPUs (siblings 0-1 .. 6-7), 2 nodes, virtio_net enp66s1 (6 queues) on node 1.

    Management NIC ens3 (virtio0, 1 queue pair) holds the default route;
    irqbalance is installed and running (as LAB.md observed).
    """
    siblings = [[0, 1], [2, 3], [4, 5], [6, 7]]
    numa = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    nics = [
        {"name": "ens3", "pci": "0000:00:03.0", "driver": "virtio_net", "virtio": "virtio0", "numa_node": -1,
         "mac": "52:54:00:12:34:56", "speed": -1, "rx_queues": 1, "tx_queues": 1, "addresses": ["10.0.2.15/24"],
         "irqs": virtio_irqs(0, 24, 1, [0, 1, 2, 3, 4, 5, 6, 7])},
        {"name": "enp66s1", "pci": "0000:42:01.0", "driver": "virtio_net", "virtio": "virtio2", "numa_node": 1,
         "mac": "52:54:00:ab:cd:01", "speed": -1, "rx_queues": 6, "tx_queues": 6, "addresses": ["192.168.77.2/24"],
         "ethtool_l": ETHTOOL_L_VIRTIO_6,
         "irqs": virtio_irqs(2, 40, 6, [4, 4, 5, 5, 6, 6, 7, 7][::2] + [4, 5])},
    ]
    return {
        "cpus": 8, "siblings": siblings, "numa": numa, "nics": nics,
        "other_irqs": named_irqs(["virtio1-req.0"], 30, [3]),
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [
            {"iface": "ens3", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.0.2.2", "metric": 0},
            {"iface": "ens3", "dest": "10.0.2.0", "mask": "255.255.255.0", "gateway": "0.0.0.0", "metric": 0},
            {"iface": "enp66s1", "dest": "192.168.77.0", "mask": "255.255.255.0", "gateway": "0.0.0.0", "metric": 0},
        ],
        "irqbalance": {"config": "#IRQBALANCE_ONESHOT=\n#IRQBALANCE_BANNED_CPULIST=\n", "path": "etc/default/irqbalance",
                       "running": True, "unit": "enabled", "systemd": True},
    }


def large_numa(ncpus=1152, nirqs=1000, queues=64):
    """A large NUMA box (SGI UV / Power class): ``ncpus`` CPUs in 16 nodes, ~``nirqs`` IRQ rows.

    SMT4 siblings numbered i, i+N/4, i+N/2, i+3N/4. mlx5 PF eth0 with
    ``queues`` comp IRQs, the rest NVMe/other rows.
    """
    quarter = ncpus // 4
    siblings = [[i, i + quarter, i + 2 * quarter, i + 3 * quarter] for i in range(quarter)]
    per_node = quarter // 16
    numa = dict((n, sorted(c for i in range(n * per_node, (n + 1) * per_node) for c in siblings[i])) for n in range(16))
    pci = "0000:81:00.0"
    nics = [{"name": "eth0", "pci": pci, "driver": "mlx5_core", "numa_node": 8, "mac": "98:03:9b:00:00:01", "speed": 100000,
             "rx_queues": queues, "tx_queues": queues, "ethtool_l": None,
             "irqs": mlx5_irqs(pci, 1000, queues, list(range(0, queues)))}]
    rest = max(0, nirqs - queues - 1)
    other = named_irqs(["nvme%dq%d" % (i // 64, i % 64) for i in range(rest)], 2000, list(range(0, ncpus, 7)))
    return {"cpus": ncpus, "siblings": siblings, "numa": numa, "nics": nics, "other_irqs": other,
            "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
            "routes": [{"iface": "eth0", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0}]}


ETHTOOL_L_MLX5_11 = """Channel parameters for ens7:
Pre-set maximums:
RX:\t\tn/a
TX:\t\tn/a
Other:\t\tn/a
Combined:\t11
Current hardware settings:
RX:\t\tn/a
TX:\t\tn/a
Other:\t\tn/a
Combined:\t11
"""
ETHTOOL_L_MLX5_PF = ETHTOOL_L_MLX5_11.replace("ens7", "ens21f0np0").replace("Combined:\t11\nCurrent", "Combined:\t63\nCurrent").replace(
    "Combined:\t11\n", "Combined:\t32\n")
ETHTOOL_L_VIRTIO_6 = """Channel parameters for enp66s1:
Pre-set maximums:
RX:\t\tn/a
TX:\t\tn/a
Other:\t\tn/a
Combined:\t6
Current hardware settings:
RX:\t\tn/a
TX:\t\tn/a
Other:\t\tn/a
Combined:\t6
"""


# -------------------------------------------------------------------- build --


class Tree(object):
    def __init__(self, root, spec):
        self.root = str(root)
        self.proc = os.path.join(self.root, "proc")
        self.sys = os.path.join(self.root, "sys")
        self.etc = os.path.join(self.root, "etc")
        self.spec = spec
        self.calls = []

    def irq_dir(self, irq):
        return os.path.join(self.proc, "irq", str(irq))

    def affinity(self, irq):
        with open(os.path.join(self.irq_dir(irq), "smp_affinity_list")) as handle:
            return handle.read().strip()

    def all_affinities(self):
        base = os.path.join(self.proc, "irq")
        return dict((int(n), self.affinity(n)) for n in os.listdir(base)
                    if n.isdigit() and os.path.isfile(os.path.join(base, n, "smp_affinity_list")))

    def set_affinity(self, irq, cpus, effective=None):
        _write(os.path.join(self.irq_dir(irq), "smp_affinity_list"), cpulist(cpus) + "\n")
        if effective is not None:
            _write(os.path.join(self.irq_dir(irq), "effective_affinity_list"), cpulist(effective) + "\n")

    def break_irq(self, irq):
        """Replace smp_affinity_list by a directory, so writing it fails (EISDIR) even as root."""
        path = os.path.join(self.irq_dir(irq), "smp_affinity_list")
        os.remove(path)
        os.mkdir(path)

    def irqs(self, name):
        for nic in self.spec.get("nics", []):
            if nic["name"] == name:
                return [i["irq"] for i in nic["irqs"]]
        raise KeyError(name)

    def run(self, argv):
        """Recorded command outputs for this tree: ``ethtool -l``, ``ip -j addr``, ``systemctl is-active/is-enabled irqbalance.service``."""
        self.calls.append(list(argv))
        if argv[:2] == ["ethtool", "-l"] and len(argv) == 3:
            for nic in self.spec.get("nics", []):
                if nic["name"] == argv[2] and nic.get("ethtool_l"):
                    return 0, nic["ethtool_l"], ""
            return 1, "", "netlink error: Operation not supported\n"
        if argv[:3] == ["ip", "-j", "addr"]:
            data = []
            for entry in list(self.spec.get("nics", [])) + list(self.spec.get("virtual", [])):
                infos = []
                for address in entry.get("addresses", []):
                    local, plen = address.split("/")
                    infos.append({"family": "inet6" if ":" in local else "inet", "local": local, "prefixlen": int(plen)})
                data.append({"ifname": entry["name"], "addr_info": infos})
            return 0, json.dumps(data), ""
        if argv[:1] == ["systemctl"] and len(argv) == 3 and argv[2] == "irqbalance.service":
            irqb = self.spec.get("irqbalance")
            if not irqb:
                if argv[1] == "is-enabled":
                    return 1, "", "Failed to get unit file state for irqbalance.service: No such file or directory\n"
                return 3, "inactive\n", ""
            if argv[1] == "is-active":
                return (0, "active\n", "") if irqb.get("running") else (3, "inactive\n", "")
            if argv[1] == "is-enabled":
                state = irqb.get("unit", "enabled")
                return (0 if state == "enabled" else 1), state + "\n", ""
        return 127, "", "%s: command not found" % argv[0]


def _interrupts_text(spec, rows, online):
    ncpus = spec["cpus"]
    prec = max(3, len(str(max([r["irq"] for r in rows] + [0]))))
    col = {cpu: i for i, cpu in enumerate(online)}
    zero = "%10u " % 0
    out = [" " * (prec + 8) + "".join("CPU%-8d" % c for c in online).rstrip() + "\n"]
    for row in rows:
        counts = row.get("counts") or {}
        if counts:
            cells = [zero] * len(online)
            for cpu, n in counts.items():
                if cpu in col:
                    cells[col[cpu]] = "%10u " % n
            body = "".join(cells)
        else:
            body = zero * len(online)
        chip = row.get("chip", "PCI-MSIX-%s" % row["pci"] if row.get("pci") else "IR-PCI-MSI")
        out.append("%*d: %s %8s %*d-edge      %s\n" % (prec, row["irq"], body, chip, prec, row.get("hwirq", row["irq"] * 7), row["name"]))
    if spec.get("arch_rows", True):
        out.append("%*s: %s  Non-maskable interrupts\n" % (prec, "NMI", "".join("%10u " % (3 + c % 5) for c in online)))
        out.append("%*s: %s  Local timer interrupts\n" % (prec, "LOC", "".join("%10u " % (100000 + c) for c in online)))
        out.append("%s: %10d\n" % ("ERR".rjust(prec), 0))
        out.append("%s: %10d\n" % ("MIS".rjust(prec), 0))
    del ncpus
    return "".join(out)


def debugfs_irq_text(row, managed):
    """``/sys/kernel/debug/irq/irqs/N`` as kernel/irq/debugfs.c prints it (layout of the x86 captures in
    fixtures/captures/debugfs_irq/): state bits one per line under ``dstate:``, IRQD_AFFINITY_MANAGED when managed."""
    bits = ["IRQD_ACTIVATED", "IRQD_IRQ_STARTED", "IRQD_SINGLE_TARGET"]
    bits += ["IRQD_AFFINITY_MANAGED", "IRQD_AFFINITY_ON_ACTIVATE"] if managed else ["IRQD_MOVE_PCNTXT", "IRQD_CAN_RESERVE"]
    bits.append("IRQD_HANDLE_ENFORCE_IRQCTX")
    aff = row.get("affinity") or [0]
    eff = row.get("effective") or aff[:1]
    return "".join([
        "handler:  handle_edge_irq\n", "device:   %s\n" % row.get("pci", "(null)"), "status:   0x00004000\n",
        "istate:   0x00004000\n", "ddepth:   0\n", "wdepth:   0\n",
        "dstate:   0x%08x\n" % (0x31600200 if managed else 0x1d408200),
        "".join("            %s\n" % b for b in bits),
        "node:     0\n", "affinity: %s\n" % cpulist(aff), "effectiv: %s\n" % cpulist(eff), "pending:\n",
        "domain:  PCI-MSIX-%s-12\n" % row.get("pci", "0000:00:00.0"), " hwirq:   0x%x\n" % row.get("hwirq", 1),
        " chip:    PCI-MSIX-%s\n" % row.get("pci", "0000:00:00.0"),
        " parent:\n", "    domain:  VECTOR\n", "     is_managed:       %d\n" % (1 if managed else 0),
    ])


def _ip_hex(dotted):
    parts = [int(p) for p in dotted.split(".")]
    return "%02X%02X%02X%02X" % (parts[3], parts[2], parts[1], parts[0])


def build_tree(root, spec):
    """Write the tree for ``spec`` under ``root`` (created; replaced if it exists) and return a :class:`Tree`."""
    root = str(root)
    if os.path.exists(os.path.join(root, "proc")):
        shutil.rmtree(os.path.join(root, "proc"))
        shutil.rmtree(os.path.join(root, "sys"))
        shutil.rmtree(os.path.join(root, "etc"), ignore_errors=True)
        shutil.rmtree(os.path.join(root, "run"), ignore_errors=True)
    tree = Tree(root, spec)
    ncpus = spec["cpus"]
    allcpus = list(range(ncpus))
    offline = set(spec.get("offline", []))
    online = [c for c in allcpus if c not in offline]
    cpu_dir = os.path.join(tree.sys, "devices/system/cpu")
    _write(os.path.join(cpu_dir, "online"), cpulist(online) + "\n")
    _write(os.path.join(cpu_dir, "present"), cpulist(allcpus) + "\n")
    _write(os.path.join(cpu_dir, "possible"), cpulist(allcpus) + "\n")
    _write(os.path.join(cpu_dir, "isolated"), cpulist(spec.get("isolated", [])) + "\n")
    _write(os.path.join(cpu_dir, "nohz_full"), cpulist(spec.get("nohz_full", [])) + "\n")
    if spec.get("cmdline") is not None:
        _write(os.path.join(tree.proc, "cmdline"), spec["cmdline"] + "\n")
    siblings = spec.get("siblings") or [[c] for c in allcpus]
    group_of = {}
    for group in siblings:
        for cpu in group:
            group_of[cpu] = group
    for cpu in allcpus:
        base = os.path.join(cpu_dir, "cpu%d" % cpu)
        if cpu:
            _write(os.path.join(base, "online"), "%d\n" % (0 if cpu in offline else 1))
        if cpu not in offline:
            _write(os.path.join(base, "topology/thread_siblings_list"), cpulist(group_of.get(cpu, [cpu])) + "\n")
            _write(os.path.join(base, "topology/thread_siblings"), cpumask(group_of.get(cpu, [cpu]), ncpus) + "\n")
    numa = spec.get("numa") or {}
    node_of = {}
    distance = spec.get("numa_distance") or (lambda a, b: 10 if a == b else 20)
    for node, cpus in numa.items():
        _write(os.path.join(tree.sys, "devices/system/node/node%d/cpulist" % node), cpulist(cpus) + "\n")
        _write(os.path.join(tree.sys, "devices/system/node/node%d/distance" % node), " ".join(str(distance(node, o)) for o in sorted(numa)) + "\n")
        for cpu in cpus:
            node_of[cpu] = node
    if numa:
        _write(os.path.join(tree.sys, "devices/system/node/online"), cpulist(sorted(numa)) + "\n")
    default_aff = spec.get("default_smp_affinity", allcpus)
    _write(os.path.join(tree.proc, "irq/default_smp_affinity"), cpumask(default_aff, ncpus) + "\n")

    rows = []
    ifindex = 1
    for virt in spec.get("virtual", []):
        base = os.path.join(tree.sys, "devices/virtual/net", virt["name"])
        _write(os.path.join(base, "type"), "772\n" if virt["name"] == "lo" else "1\n")
        _write(os.path.join(base, "address"), virt.get("mac", "00:00:00:00:00:00") + "\n")
        _write(os.path.join(base, "ifindex"), "%d\n" % ifindex)
        ifindex += 1
        _link(base, os.path.join(tree.sys, "class/net", virt["name"]))
    for nic in spec.get("nics", []):
        pci = nic["pci"]
        domain_bus = pci.rsplit(":", 1)[0]
        pci_dir = os.path.join(tree.sys, "devices/pci%s" % domain_bus, pci)
        node = nic.get("numa_node", -1)
        _write(os.path.join(pci_dir, "numa_node"), "%d\n" % node)
        local = nic.get("local_cpulist")
        if local is None:
            local = numa.get(node, allcpus) if node >= 0 else allcpus
        _write(os.path.join(pci_dir, "local_cpulist"), cpulist(local) + "\n")
        _write(os.path.join(pci_dir, "local_cpus"), cpumask(local, ncpus) + "\n")
        _write(os.path.join(pci_dir, "irq"), "%d\n" % (nic.get("legacy_irq") or 0))
        pci_driver = nic.get("pci_driver") or ("virtio-pci" if nic.get("virtio") else nic["driver"])
        drivers = os.path.join(tree.sys, "bus/pci/drivers", pci_driver)
        os.makedirs(drivers, exist_ok=True)
        _link(drivers, os.path.join(pci_dir, "driver"))
        for irq in nic["irqs"]:
            if nic.get("msix", True):
                _write(os.path.join(pci_dir, "msi_irqs", str(irq["irq"])), "msix\n")
        if nic.get("virtio"):
            dev_dir = os.path.join(pci_dir, nic["virtio"])
            vdrivers = os.path.join(tree.sys, "bus/virtio/drivers", nic["driver"])
            os.makedirs(vdrivers, exist_ok=True)
            _link(vdrivers, os.path.join(dev_dir, "driver"))
        else:
            dev_dir = pci_dir
        net = os.path.join(dev_dir, "net", nic["name"])
        _write(os.path.join(net, "type"), "%d\n" % nic.get("type", 1))
        _write(os.path.join(net, "address"), nic.get("mac", "02:00:00:00:00:01") + "\n")
        _write(os.path.join(net, "speed"), "%d\n" % nic.get("speed", -1))
        _write(os.path.join(net, "operstate"), "up\n")
        _write(os.path.join(net, "mtu"), "1500\n")
        _write(os.path.join(net, "ifindex"), "%d\n" % ifindex)
        ifindex += 1
        _link(dev_dir, os.path.join(net, "device"))
        for q in range(nic.get("rx_queues", 1)):
            _write(os.path.join(net, "queues/rx-%d/rps_cpus" % q), cpumask([], ncpus) + "\n")
        for q in range(nic.get("tx_queues", 1)):
            _write(os.path.join(net, "queues/tx-%d/xps_cpus" % q), cpumask([], ncpus) + "\n")
        _link(net, os.path.join(tree.sys, "class/net", nic["name"]))
        for irq in nic["irqs"]:
            rows.append(dict(irq, pci=pci))
    for virt in spec.get("virtual", []):
        for lower in virt.get("lower", []):
            upper = os.path.join(tree.sys, "devices/virtual/net", virt["name"])
            _link(os.path.realpath(os.path.join(tree.sys, "class/net", lower)), os.path.join(upper, "lower_" + lower))
    for irq in spec.get("other_irqs", []):
        rows.append(irq)
    rows.sort(key=lambda r: r["irq"])
    for row in rows:
        base = tree.irq_dir(row["irq"])
        aff = row.get("affinity", allcpus)
        _write(os.path.join(base, "smp_affinity_list"), cpulist(aff) + "\n")
        _write(os.path.join(base, "smp_affinity"), cpumask(aff, ncpus) + "\n")
        if row.get("effective", aff) is not None:
            _write(os.path.join(base, "effective_affinity_list"), cpulist(row.get("effective", aff)) + "\n")
        _write(os.path.join(base, "node"), "%d\n" % max(0, node_of.get(aff[0], 0) if aff else 0))
        if row.get("managed") is not None:
            _write(os.path.join(tree.sys, "kernel/debug/irq/irqs", str(row["irq"])), debugfs_irq_text(row, row["managed"]))
    _write(os.path.join(tree.proc, "interrupts"), _interrupts_text(spec, rows, online))

    route = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    for r in spec.get("routes", []):
        flags = 0x1 | (0x2 if r.get("gateway", "0.0.0.0") != "0.0.0.0" else 0)
        route.append("%s\t%s\t%s\t%04X\t0\t0\t%d\t%s\t0\t0\t0" % (
            r["iface"], _ip_hex(r["dest"]), _ip_hex(r.get("gateway", "0.0.0.0")), flags, r.get("metric", 0), _ip_hex(r["mask"])))
    _write(os.path.join(tree.proc, "net/route"), "\n".join(route) + "\n")
    v6 = []
    if spec.get("ipv6_default"):
        v6.append("%s 00 %s 00 %s %08x 00000001 00000000 00000003 %8s" % ("0" * 32, "0" * 32, "fe800000000000000000000000000001", 1024, spec["ipv6_default"]))
    v6.append("%s 80 %s 00 %s %08x 00000001 00000000 00200001 %8s" % ("0" * 31 + "1", "0" * 32, "0" * 32, 0, "lo"))
    _write(os.path.join(tree.proc, "net/ipv6_route"), "\n".join(v6) + "\n")
    trie = ["Main:", "  +-- 0.0.0.0/0 3 0 5"]
    inet6 = []
    for entry in list(spec.get("nics", [])) + list(spec.get("virtual", [])):
        for address in entry.get("addresses", []):
            local, plen = address.split("/")
            if ":" in local:
                import ipaddress
                full = ipaddress.IPv6Address(local).exploded.replace(":", "")
                inet6.append("%s %02x %02x 00 80 %8s" % (full, 2, int(plen), entry["name"]))
            else:
                trie.append("     |-- %s" % local)
                trie.append("        /32 host LOCAL")
    _write(os.path.join(tree.proc, "net/fib_trie"), "\n".join(trie) + "\n")
    _write(os.path.join(tree.proc, "net/if_inet6"), "\n".join(inet6) + ("\n" if inet6 else ""))

    irqb = spec.get("irqbalance")
    if irqb:
        if irqb.get("config") is not None:
            _write(os.path.join(root, irqb.get("path", "etc/default/irqbalance")), irqb["config"])
        unit = os.path.join(root, "lib/systemd/system/irqbalance.service")
        _write(unit, "[Unit]\nDescription=irqbalance daemon\n[Service]\nExecStart=/usr/sbin/irqbalance --foreground\n[Install]\nWantedBy=multi-user.target\n")
        state = irqb.get("unit", "enabled")
        if state == "enabled":
            os.makedirs(os.path.join(root, "etc/systemd/system/multi-user.target.wants"), exist_ok=True)
            os.symlink("/lib/systemd/system/irqbalance.service", os.path.join(root, "etc/systemd/system/multi-user.target.wants/irqbalance.service"))
        elif state == "masked":
            os.makedirs(os.path.join(root, "etc/systemd/system"), exist_ok=True)
            os.symlink("/dev/null", os.path.join(root, "etc/systemd/system/irqbalance.service"))
        if irqb.get("running"):
            _write(os.path.join(tree.proc, "731/comm"), "irqbalance\n")
        if irqb.get("systemd"):
            os.makedirs(os.path.join(root, "run/systemd/system"), exist_ok=True)
    _write(os.path.join(tree.proc, "1/comm"), "systemd\n")
    return tree


def flock_held(path):
    """True when another open file description holds an exclusive flock on ``path`` (False when it is absent)."""
    import fcntl
    if not os.path.exists(str(path)):
        return False
    fd = os.open(str(path), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def snapshot_tree(root):
    """Every file and link under ``root``: a link as ("link", target), a file as (sha256 of its bytes, its mode
    bits), so that a test can show a run changed nothing (or exactly what it planned). The NIC IRQ pin lock under
    run/ is left out: a runtime lock that every run that pins leaves in place, empty, by design."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import PIN_LOCK
    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.relpath(path, root) == PIN_LOCK:
                continue
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = ("link", os.readlink(path))
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = (hashlib.sha256(handle.read()).hexdigest(), os.lstat(path).st_mode & 0o7777)
    return out
