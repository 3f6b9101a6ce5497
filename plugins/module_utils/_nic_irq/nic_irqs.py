# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A selected NIC's queues and IRQs, on any driver: what ``read_nic`` returns.

Private module_utils of gpunode.tuning, standard library only. Read-only:
nothing here writes. Roots are parameters; ``ethtool`` comes in as
``run(argv) -> (rc, stdout, stderr)`` and is optional: without it the queue
counts come from sysfs.

* :func:`classify_irq`, :func:`classify_irqs` - an IRQ's name, per driver
  (:data:`DRIVER_RULES`, else :data:`GENERIC_RULES`): a queue IRQ (its queue and
  direction) or a control IRQ;
* :func:`parse_ethtool_channels` - ``ethtool -l`` in both layouts;
* :func:`read_irq_state`, :func:`read_managed` - one IRQ's affinity and whether
  the kernel manages it;
* :func:`read_nic` - the NIC that ``_nic_irq.nic.select_interface`` selects, its
  PCI function, queues and IRQs (the function's ``msi_irqs``, on every call);
* :func:`add_cpulist_strings` - the CPU sets of that result as CPU list strings.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import (
    TreeError, join, link_name, list_dir, read_cpulist, read_int, read_raw, read_text)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import NicError, pci_function, select_interface
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import InterruptsError, parse_interrupts, per_cpu_counts

# a full PCI address inside an IRQ name or chip column ("mlx5_comp0@pci:0000:00:07.0", "PCI-MSIX-0000:00:07.0")
PCI_IN_TEXT = re.compile(r"(?<![0-9a-f])([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?![0-9a-f])", re.I)


# ---------------------------------------------------------------- IRQ names --

def _q(match, group=1):
    return int(match.group(group))


_TXRX = re.compile(r"-(?:TxRx|txrx|fp)-(\d+)$")
_RX = re.compile(r"-(?:rx|Rx|RX)-(\d+)$")
_TX = re.compile(r"-(?:tx|Tx|TX)-(\d+)$")

# Each driver rule: list of (regex, direction) for queue IRQs; anything else of
# that driver is a control IRQ. ``None`` direction means "txrx".
DRIVER_RULES = {
    "mlx5_core": [(re.compile(r"^mlx5_comp(\d+)(?:@|$)"), "txrx")],
    "virtio_net": [
        (re.compile(r"^virtio\d+-input\.(\d+)$"), "rx"),
        (re.compile(r"^virtio\d+-output\.(\d+)$"), "tx"),
        (re.compile(r"^virtio\d+-virtqueues$"), "shared"),
    ],
    "ena": [(re.compile(r"-Tx-Rx-(\d+)$"), "txrx")],
    "gve": [(re.compile(r"^gve-ntfy-blk(\d+)(?:@|$)"), "gve"), (re.compile(r"-ntfy-block\.(\d+)$"), "gve")],
    "ice": [(_TXRX, "txrx"), (re.compile(r"^ice-.*-rx-(\d+)$"), "rx"), (re.compile(r"^ice-.*-tx-(\d+)$"), "tx")],
    "i40e": [(re.compile(r"^i40e-(?!.*fdir).*-TxRx-(\d+)$"), "txrx")],
    "ixgbe": [(_TXRX, "txrx"), (_RX, "rx"), (_TX, "tx")],
    "bnxt_en": [(_TXRX, "txrx"), (_RX, "rx"), (_TX, "tx")],
    # VMware vmxnet3 (drivers/net/vmxnet3/vmxnet3_drv.c, vmxnet3_request_irqs): "<ifname>-rxtx-N" with
    # shared queue vectors, else "<ifname>-tx-N" / "<ifname>-rx-N"; "<ifname>-event-N" is control.
    # Requested in ndo_open, so the names carry the interface name (checked in the lab's open-nic guest).
    "vmxnet3": [(re.compile(r"-rxtx-(\d+)$"), "txrx"), (_RX, "rx"), (_TX, "tx")],
    # Microsoft Azure Network Adapter (PCI driver "mana"). drivers/net/ethernet/microsoft/mana/gdma_main.c,
    # mana_gd_setup_irqs(): vector 0 is "mana_hwc@pci:%s" (the hardware channel, control) and vector i >= 1
    # "mana_q%d@pci:%s" with i - 1; mana_en.c gives queue i msix_index (i + 1) % num_msix_usable, so
    # mana_qK serves queue K. Anything else (mana_hwc, a future naming) is control and never pinned.
    "mana": [(re.compile(r"^mana_q(\d+)@pci:"), "txrx")],
}
GENERIC_RULES = [
    (_TXRX, "txrx"),
    (re.compile(r"-Tx-Rx-(\d+)$"), "txrx"),
    (_RX, "rx"),
    (_TX, "tx"),
    (re.compile(r"-(?:input)\.(\d+)$"), "rx"),
    (re.compile(r"-(?:output)\.(\d+)$"), "tx"),
    (re.compile(r"^mlx5_comp(\d+)(?:@|$)"), "txrx"),
    (re.compile(r"(?:^|[-_])(?:comp|queue|q|ch)(\d+)(?:@|$)"), "txrx"),
]
# Generic names: a PCI address is removed before any rule looks for a queue number (its function digit
# "...@pci:DDDD:BB:SS.F" is not a queue), and a control word as its own name component wins over
# every queue rule (i40e's FDIR vector "i40e-0000:3b:00.0:fdir-TxRx-0" is not queue 0).
_PCI_IN_NAME = re.compile(r"(?:@pci:|@|pci:)?(?<![0-9a-f])(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](?![0-9a-f])", re.I)
_GENERIC_CONTROL = re.compile(
    r"(?:^|[-_:.@ ])(?:fdir|misc|async\d*|mgmnt|mgmt|hwc|config|adminq|aeq|mbx|ctrl|cmd|cmd_eq|pages|pages_eq)(?:[-_:.@ ]|$)", re.I)
_CONTROL_HINT = re.compile(r"(?:async|mgmnt|mgmt|misc|config|cmd|pages|ctrl|aeq|other|fdir|link|mbx|adminq)", re.I)
_SUFFIX = re.compile(r"[-.@](\d+)$")


def classify_irq(name, driver):
    """Return ``(kind, queue, direction)`` for one IRQ action name of ``driver``.

    ``kind`` is "queue" or "control". ``direction`` is "rx", "tx", "txrx" or
    None. gve notify blocks come back with direction "gve" and the raw block
    number; :func:`classify_irqs` turns those into queues (it needs them all).
    """
    rules = DRIVER_RULES.get(driver)
    if rules is None:
        name = _PCI_IN_NAME.sub("", name or "")
        if _GENERIC_CONTROL.search(name):
            return "control", None, None
    for regex, direction in rules if rules is not None else GENERIC_RULES:
        match = regex.search(name)
        if match:
            if direction == "shared":
                return "queue", 0, "txrx"
            return "queue", _q(match), direction
    if rules is None and name and not _CONTROL_HINT.search(name):
        match = _SUFFIX.search(name)
        if match:
            lowered = name.lower()
            direction = "rx" if ("rx" in lowered and "tx" not in lowered) else ("tx" if ("tx" in lowered and "rx" not in lowered) else "txrx")
            return "queue", _q(match), direction
    return "control", None, None


def classify_irqs(entries, driver):
    """Classify a list of ``{"irq", "name"}`` dicts in place (adds kind/queue/direction)."""
    gve_blocks = []
    for entry in entries:
        kind, queue, direction = classify_irq(entry["name"], driver)
        entry["kind"], entry["queue"], entry["direction"] = kind, queue, direction
        if direction == "gve":
            gve_blocks.append(entry)
    if gve_blocks:
        # gve: blocks 0..n/2-1 serve TX queues 0..; blocks n/2.. serve RX queues 0..
        # (gve_tx_idx_to_ntfy / gve_rx_idx_to_ntfy in drivers/net/ethernet/google/gve)
        half = (max(e["queue"] for e in gve_blocks) + 1) // 2
        for entry in gve_blocks:
            block = entry["queue"]
            if half and block >= half:
                entry["queue"], entry["direction"] = block - half, "rx"
            else:
                entry["queue"], entry["direction"] = block, "tx"
    return entries


# ----------------------------------------------------------- ethtool output --

_ETHTOOL_KEYS = {"rx": "rx", "tx": "tx", "other": "other", "combined": "combined"}


def parse_ethtool_channels(text):
    """Parse ``ethtool -l IFACE`` (ioctl layout with 0, netlink layout with n/a).

    Returns ``{combined_max, combined_current, rx_max, rx_current, tx_max,
    tx_current, other_max, other_current}``; a value is None for ``n/a`` or
    when the line is missing.
    """
    result = dict(("%s_%s" % (k, s), None) for k in _ETHTOOL_KEYS for s in ("max", "current"))
    section = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        lowered = line.lower()
        if lowered.startswith("pre-set maximums"):
            section = "max"
            continue
        if lowered.startswith("current hardware settings"):
            section = "current"
            continue
        if section is None or ":" not in line:
            continue
        key, _sep, value = line.partition(":")
        key = key.strip().lower()
        value = value.strip()
        if key in _ETHTOOL_KEYS:
            result["%s_%s" % (_ETHTOOL_KEYS[key], section)] = int(value) if value.isdigit() else None
    return result


# ------------------------------------------------------------------ read ----

def read_irq_state(procfs, irq):
    """smp_affinity_list and effective_affinity_list of one IRQ; each None when it cannot be read.

    An empty smp_affinity_list is read as None too: the kernel never shows an
    IRQ allowed on no CPU, so an empty read means the value is unknown (and
    must never be written back by a rollback: an empty write resets the IRQ).
    """
    base = join(procfs, "irq", str(irq))
    return read_cpulist(join(base, "smp_affinity_list")) or None, read_cpulist(join(base, "effective_affinity_list"))


# /sys/kernel/debug/irq/irqs/N (CONFIG_GENERIC_IRQ_DEBUGFS, debugfs mounted,
# root only) lists the IRQ's irq_data state bits one per line under "dstate:"
# (kernel/irq/debugfs.c, irqdata_states); IRQD_AFFINITY_MANAGED marks an IRQ
# whose affinity the kernel owns and refuses to change from user space.
DEBUGFS_IRQS = "kernel/debug/irq/irqs"


def read_managed(sysfs, irq):
    """True/False when debugfs under ``sysfs`` says whether ``irq`` is kernel-managed; None when unknown.

    Unknown: debugfs not mounted, not readable (not root), no such IRQ file, or
    a file without the ``dstate:`` block.
    """
    text = read_raw(join(sysfs, DEBUGFS_IRQS, str(irq)))
    if text is None or "dstate:" not in text:
        return None
    return any(line.strip() == "IRQD_AFFINITY_MANAGED" for line in text.splitlines())


def _check_owner(number, row, pci, path):
    """Raise TreeError when the /proc/interrupts row of an MSI vector of ``pci`` names another PCI function.

    MSI vectors are never shared, so a row whose chip (per-device MSI domains,
    ``PCI-MSIX-0000:3b:00.0``) or action name (``mlx5_comp1@pci:0000:3b:00.0``)
    names a different function comes from another system: procfs and sysfs
    roots that do not belong together (a capture's sysfs with the live /proc).
    """
    others = sorted(set(a.lower() for a in PCI_IN_TEXT.findall("%s %s" % (row["chip"], row["name"]))) - set([pci]))
    if others:
        raise TreeError(
            "IRQ %d of PCI function %s (its msi_irqs) is %r (chip %s) in %s, which belongs to %s: procfs_path and "
            "sysfs_path do not describe the same system" % (number, pci, row["name"], row["chip"] or "?", path, ", ".join(others)),
            path=path, irq=number, value=row["name"], expected="an IRQ of %s" % pci,
        )


def _queues(net, iface, run, notes):
    """The RX and TX queue counts sysfs shows and the channels ``ethtool -l`` reports (where it runs)."""
    rx = [n for n in list_dir(join(net, "queues")) if n.startswith("rx-")]
    tx = [n for n in list_dir(join(net, "queues")) if n.startswith("tx-")]
    queues = {"sysfs_rx": len(rx), "sysfs_tx": len(tx)}
    channels = parse_ethtool_channels("")
    if run is not None:
        rc, out, err = run(["ethtool", "-l", iface])
        if rc == 0:
            channels = parse_ethtool_channels(out)
        else:
            notes.append("ethtool -l %s failed (rc %s): %s" % (iface, rc, (err or out or "").strip()[:200]))
    queues.update(channels)
    return queues


def _irq_entries(procfs, sysfs, pci, pci_dir, interrupts_text, notes):
    """The PCI function's IRQs (its MSI/MSI-X vectors, else its legacy IRQ), each with its /proc/interrupts row, its
    affinity and per-CPU counts; a vector whose row names another device fails."""
    numbers = sorted(int(n) for n in list_dir(join(pci_dir, "msi_irqs")) if n.isdigit())
    msi = bool(numbers)
    if not numbers:
        legacy = read_int(join(pci_dir, "irq"))
        if legacy:
            numbers = [legacy]
            notes.append("PCI function %s has no MSI/MSI-X vectors; using its legacy IRQ %d" % (pci, legacy))
    interrupts_path = join(procfs, "interrupts")
    if interrupts_text is None:
        interrupts_text = read_raw(interrupts_path) or ""
    try:
        parsed = parse_interrupts(interrupts_text, keys=[str(n) for n in numbers])
    except InterruptsError as exc:
        raise TreeError("%s: %s" % (interrupts_path, exc), path=interrupts_path, **exc.details)
    entries = []
    for number in numbers:
        row = parsed["irqs"].get(str(number))
        if row is not None and msi:
            _check_owner(number, row, pci, interrupts_path)
        affinity, effective = read_irq_state(procfs, number)
        entries.append(
            {
                "irq": number,
                "name": row["name"] if row else "",
                "chip": row["chip"] if row else "",
                "affinity": affinity,
                "effective_affinity": effective,
                "managed": read_managed(sysfs, number),
                "counts": per_cpu_counts(row, parsed["cpus"]) if row else {},
                "total": row["total"] if row else 0,
            }
        )
        if row is None:
            notes.append("IRQ %d of %s is not in /proc/interrupts (vector allocated, no handler)" % (number, pci))
    return entries


def read_nic(selector, procfs="/proc", sysfs="/sys", run=None, interrupts_text=None):
    """Everything needed to pin one NIC's IRQs; see the module's RETURN for keys.

    ``selector`` is a dict with at most one of interface, pci_address, mac,
    cidr (empty: the default-route interface). ``interrupts_text`` lets a
    caller that already read ``/proc/interrupts`` pass it in.
    """
    iface, how, notes = select_interface(selector, procfs=procfs, sysfs=sysfs, run=run)
    net = join(sysfs, "class/net", iface)
    pci, pci_dir = pci_function(sysfs, iface)
    driver = link_name(join(net, "device/driver"))
    result = {
        "interface": iface,
        "selected_by": how,
        "ifindex": read_int(join(net, "ifindex")),
        "mac": (read_text(join(net, "address")) or "").lower() or None,
        "operstate": read_text(join(net, "operstate")),
        "mtu": read_int(join(net, "mtu")),
        "speed_mbps": None,
        "driver": driver,
        "pci_address": pci,
        "pci_driver": None,
        "numa_node": None,
        "local_cpulist": [],
        "queues": {},
        "irqs": [],
        "notes": notes,
    }
    speed = read_int(join(net, "speed"))
    result["speed_mbps"] = speed if speed is not None and speed > 0 else None

    result["queues"] = _queues(net, iface, run, notes)

    if pci_dir is None:
        notes.append("%s has no PCI function (not a PCI device); no IRQs can be listed" % iface)
        return result
    result["pci_driver"] = link_name(join(pci_dir, "driver"))
    node = read_int(join(pci_dir, "numa_node"))
    if node is None or node < 0:
        notes.append("PCI function %s reports numa_node %s: the firmware gives no NUMA hint" % (pci, "-1" if node is not None else "missing"))
        node = None
    result["numa_node"] = node
    result["local_cpulist"] = read_cpulist(join(pci_dir, "local_cpulist"), default=[])

    entries = _irq_entries(procfs, sysfs, pci, pci_dir, interrupts_text, notes)
    classify_irqs(entries, driver)
    entries.sort(key=lambda e: (e["kind"], -1 if e["queue"] is None else e["queue"], e["irq"]))
    result["irqs"] = entries
    if not any(e["kind"] == "queue" for e in entries):
        notes.append("no queue IRQs recognised for driver %s among %d IRQs" % (driver, len(entries)))
    return result


# --------------------------------------------------- CPU sets as strings ----

# CPU sets that the facts also give as kernel-style CPU list strings ("0-1151",
# as in the /proc and /sys files): (integer-list key, string key). On a
# 1152-CPU machine before tuning every IRQ allows all CPUs, and integer lists
# of the IRQs alone are ~150,000 JSON values that Ansible's exit-time scrubbing
# walks one by one (benchmarks/nic_irq_facts_results.md).
IRQ_CPU_SETS = (("affinity", "affinity_list"), ("effective_affinity", "effective_affinity_list"))
NIC_CPU_SETS = (("local_cpulist", "local_cpus_list"),)
TOPOLOGY_CPU_SETS = (("online", "online_list"), ("present", "present_list"), ("possible", "possible_list"),
                     ("isolated", "isolated_list"), ("nohz_full", "nohz_full_list"),
                     ("default_smp_affinity", "default_smp_affinity_list"))
IRQ_AFFINITY_FORMATS = ("both", "string")


def _add_strings(data, pairs, keep_integers=True):
    for key, text_key in pairs:
        if key in data:
            value = data[key]
            data[text_key] = None if value is None else format_cpulist(value)
            if not keep_integers:
                del data[key]


def add_cpulist_strings(nic, topology=None, irq_affinity_format="string"):
    """Add the string form of every CPU set of ``read_nic`` (and ``read_topology``) output, in place.

    ``irq_affinity_format`` "string" (the default, issue 29) drops the per-IRQ
    ``affinity``/``effective_affinity`` integer lists (the part that grows with
    IRQs x CPUs); "both", for a caller that asks for them, keeps them. NIC and
    topology integer lists are always kept.
    """
    if irq_affinity_format not in IRQ_AFFINITY_FORMATS:
        raise NicError("irq_affinity_format %r is not one of %s" % (irq_affinity_format, ", ".join(IRQ_AFFINITY_FORMATS)),
                       value=irq_affinity_format, expected="one of %s" % ", ".join(IRQ_AFFINITY_FORMATS))
    for entry in nic.get("irqs", []):
        _add_strings(entry, IRQ_CPU_SETS, keep_integers=irq_affinity_format == "both")
    _add_strings(nic, NIC_CPU_SETS)
    if topology is not None:
        _add_strings(topology, TOPOLOGY_CPU_SETS)
    return nic
