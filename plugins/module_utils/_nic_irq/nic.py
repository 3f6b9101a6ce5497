# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Find an Ethernet NIC, its PCI function, queues and IRQs, on any driver.

Private module_utils of gpunode.tuning, standard library only. Read-only:
nothing here writes. Roots are parameters; commands (``ip``, ``ethtool``) come
in as ``run(argv) -> (rc, stdout, stderr)`` and are optional: without them the
same facts come from ``/proc/net`` and sysfs.

Nothing is trusted to be stable: the interface is resolved to its PCI function
and the IRQs are taken from that function's ``msi_irqs`` on every call.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import (
    TreeError,
    join,
    link_name,
    list_dir,
    read_cpulist,
    read_int,
    read_raw,
    read_text,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import InterruptsError, parse_interrupts, per_cpu_counts

ARPHRD_INFINIBAND = 32
PCI_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_SHORT_RE = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5,19}$")
# a full PCI address inside an IRQ name or chip column ("mlx5_comp0@pci:0000:00:07.0", "PCI-MSIX-0000:00:07.0")
PCI_IN_TEXT = re.compile(r"(?<![0-9a-f])([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?![0-9a-f])", re.I)


# The NIC selector and filesystem roots every module takes; documented once in
# the gpunode.tuning.nic_selector doc fragment. Plain data: no Ansible import.
SELECTOR_KEYS = ("interface", "pci_address", "mac", "cidr")
SELECTOR_ARGUMENT_SPEC = dict(
    [(key, dict(type="str")) for key in SELECTOR_KEYS],
    procfs_path=dict(type="path", default="/proc"),
    sysfs_path=dict(type="path", default="/sys"),
)
SELECTOR_MUTUALLY_EXCLUSIVE = [SELECTOR_KEYS]


class NicError(DetailedError):
    """A NIC that cannot be found or selected. ``details`` holds the value and candidates."""


def check_selector(selector):
    """Raise NicError for a selector key given as an empty or blank string.

    Leaving every selector out means "the default-route NIC"; an empty value
    (``interface: ""``, often an unset variable) must not silently mean that too.
    """
    for key in SELECTOR_KEYS:
        value = (selector or {}).get(key)
        if value is not None and not str(value).strip():
            raise NicError(
                "%s is empty (%r): an empty selector would select the default-route NIC; give a value or leave %s out"
                % (key, value, key), option=key, value=value, expected="a non-empty %s, or no selector at all" % key,
            )


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


# ------------------------------------------------------------ interfaces ----

def normalize_pci(address):
    value = str(address).strip().lower()
    if value.startswith("pci:"):
        value = value[4:]
    if PCI_SHORT_RE.match(value):
        value = "0000:" + value
    if not PCI_RE.match(value):
        raise NicError(
            "pci_address %r is not a PCI address" % (address,), value=address, expected="a PCI address such as 0000:42:01.0 or 42:01.0"
        )
    return value


def normalize_mac(address):
    value = str(address).strip().lower().replace("-", ":")
    if not MAC_RE.match(value):
        raise NicError("mac %r is not a MAC address" % (address,), value=address, expected="a MAC address such as 52:54:00:12:34:56")
    return value


def _pci_function(sysfs, iface):
    """(pci_address, pci_dir) of the PCI function behind ``iface``, walking up from virtio children."""
    device = join(sysfs, "class/net", iface, "device")
    if not os.path.exists(device):
        return None, None
    path = os.path.realpath(device)
    top = os.path.realpath(join(sysfs, "devices"))
    while path.startswith(top) and path != top:
        name = os.path.basename(path)
        if PCI_RE.match(name):
            return name, path
        path = os.path.dirname(path)
    return None, None


def list_interfaces(sysfs):
    """Every interface under ``class/net`` with the facts used to select one."""
    result = []
    base = join(sysfs, "class/net")
    for name in list_dir(base):
        path = join(base, name)
        has_device = os.path.exists(join(path, "device"))
        if_type = read_int(join(path, "type"))
        pci, _dir = _pci_function(sysfs, name) if has_device else (None, None)
        eligible = has_device and if_type != ARPHRD_INFINIBAND
        reason = None
        if not has_device:
            reason = "virtual (no device link)"
        elif if_type == ARPHRD_INFINIBAND:
            reason = "InfiniBand (type 32)"
        result.append(
            {
                "interface": name,
                "mac": (read_text(join(path, "address")) or "").lower(),
                "type": if_type,
                "pci_address": pci,
                "eligible": eligible,
                "reason": reason,
                "lower": sorted(n[len("lower_"):] for n in list_dir(path) if n.startswith("lower_")),
            }
        )
    return result


def _hex_ip4(text):
    if len(text) != 8:
        raise ValueError("%r is not 8 hex digits" % text)
    value = int(text, 16)
    return ipaddress.IPv4Address(value.to_bytes(4, "little"))


# Columns of the /proc/net files read here, as the kernel prints them
# (net/ipv4/fib_trie.c fib_route_seq_show, net/ipv6/route.c ipv6_route_native_seq_show,
# net/ipv6/addrconf.c if6_seq_show).
ROUTE_COLUMNS = "Iface Destination Gateway Flags RefCnt Use Metric Mask MTU Window IRTT (hex addresses, flags and mask)"
IPV6_ROUTE_COLUMNS = "dest plen src plen nexthop metric refcnt use flags iface (hex)"
IF_INET6_COLUMNS = "address(32 hex) ifindex plen scope flags iface (hex)"


def _proc_table(procfs, name, columns, expected, header=None):
    """Yield ``(fields, parse_error)`` for each non-empty row of ``procfs/net/NAME``.

    A missing file yields nothing. A row with fewer than ``columns`` fields, or
    a missing ``header``, raises TreeError naming the file, the line and what
    the kernel prints; ``parse_error(exc)`` does the same for a bad value.
    """
    path = join(procfs, "net", name)
    lines = (read_raw(path) or "").splitlines()
    start = 0
    if header is not None and lines:
        if not lines[0].split() or lines[0].split()[0] != header:
            raise TreeError("%s has no %r header line (got %r)" % (path, header, " ".join(lines[0].split())),
                            path=path, value=lines[0], expected=expected)
        start = 1
    for number, line in enumerate(lines[start:], start + 1):
        fields = line.split()
        if not fields:
            continue

        def bad(why, fields=fields, number=number):
            return TreeError("%s line %d (%s): %s; expected columns %s" % (path, number, " ".join(fields), why, expected),
                             path=path, value=" ".join(fields), expected=expected)

        if len(fields) < columns:
            raise bad("%d columns, not %d" % (len(fields), columns))
        yield fields, bad


def default_route_interfaces(procfs):
    """Interfaces holding the lowest-metric IPv4 (else IPv6) default route."""
    best = {}
    for fields, bad in _proc_table(procfs, "route", 8, ROUTE_COLUMNS, header="Iface"):
        try:
            iface, dest, flags, metric, mask = fields[0], fields[1], int(fields[3], 16), int(fields[6]), fields[7]
            _hex_ip4(dest), _hex_ip4(mask)
        except (ValueError, OverflowError) as exc:
            raise bad(str(exc))
        if dest == "00000000" and mask == "00000000" and flags & 0x1 and not flags & 0x200:
            best.setdefault(metric, set()).add(iface)
    if best:
        return sorted(best[min(best)]), "IPv4 default route"
    for fields, bad in _proc_table(procfs, "ipv6_route", 10, IPV6_ROUTE_COLUMNS):
        try:
            dest, plen, metric, flags, iface = fields[0], fields[1], int(fields[5], 16), int(fields[8], 16), fields[9]
        except ValueError as exc:
            raise bad(str(exc))
        if dest == "0" * 32 and plen == "00" and iface != "lo" and not flags & 0x200 and flags & 0x1:
            best.setdefault(metric, set()).add(iface)
    if best:
        return sorted(best[min(best)]), "IPv6 default route"
    return [], None


def _addresses_from_ip(run):
    rc, out, _err = run(["ip", "-j", "addr", "show"])
    if rc != 0 or not (out or "").strip():
        return None
    try:
        data = json.loads(out)
    except ValueError:
        return None
    result = {}
    for link in data:
        for info in link.get("addr_info", []):
            if info.get("local") and info.get("prefixlen") is not None:
                try:
                    result.setdefault(link.get("ifname"), []).append(ipaddress.ip_interface("%s/%s" % (info["local"], info["prefixlen"])))
                except ValueError:
                    continue
    return result


def _addresses_from_proc(procfs):
    """Addresses per interface from fib_trie (+ route for the owner) and if_inet6."""
    result = {}
    routes = []
    for fields, bad in _proc_table(procfs, "route", 8, ROUTE_COLUMNS, header="Iface"):
        if fields[7] != "00000000":
            try:
                net = ipaddress.IPv4Network("%s/%s" % (_hex_ip4(fields[1]), _hex_ip4(fields[7])), strict=False)
            except (ValueError, OverflowError) as exc:
                raise bad(str(exc))
            routes.append((net.prefixlen, net, fields[0]))
    routes.sort(key=lambda r: -r[0])
    locals_ = set()
    previous = None
    for line in (read_raw(join(procfs, "net/fib_trie")) or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            previous = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and previous:
            locals_.add(previous)
    for address in sorted(locals_):
        ip = ipaddress.IPv4Address(address)
        if ip.is_loopback:
            continue
        for _plen, net, iface in routes:
            if ip in net:
                result.setdefault(iface, []).append(ipaddress.ip_interface("%s/%d" % (ip, net.prefixlen)))
                break
    for fields, bad in _proc_table(procfs, "if_inet6", 6, IF_INET6_COLUMNS):
        try:
            if len(fields[0]) != 32:
                raise ValueError("address %r is not 32 hex digits" % fields[0])
            text = ":".join(fields[0][i:i + 4] for i in range(0, 32, 4))
            address = ipaddress.IPv6Interface("%s/%d" % (text, int(fields[2], 16)))
        except ValueError as exc:
            raise bad(str(exc))
        result.setdefault(fields[5], []).append(address)
    return result


def _resolve_lower(name, by_name, chain=None):
    """Physical interfaces under a bond/VLAN/bridge, following lower_* links."""
    chain = chain or []
    entry = by_name.get(name)
    if entry is None or name in chain:
        return []
    if entry["eligible"] or not entry["lower"]:
        return [name]
    found = []
    for lower in entry["lower"]:
        found.extend(_resolve_lower(lower, by_name, chain + [name]))
    return found


def _candidates_text(entries):
    return ", ".join(
        "%s (%s%s)" % (e["interface"], e["pci_address"] or "no PCI", "" if e["eligible"] else ", " + e["reason"]) for e in entries
    ) or "none"


def _by_cidr(value, by_name, procfs, run, notes):
    """The eligible interfaces with an address in the network ``value`` (from ``ip`` when it runs, else /proc/net),
    a VLAN or bond resolved to its physical NICs; and the words for an error."""
    try:
        network = ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        raise NicError("cidr %r is not a network" % (value,), value=value, expected="an IPv4 or IPv6 network such as 10.0.0.0/24")
    addresses = _addresses_from_ip(run) if run is not None else None
    if addresses is None:
        addresses = _addresses_from_proc(procfs)
        notes.append("addresses read from /proc/net (fib_trie, if_inet6)")
    names = set()
    for iface, addrs in addresses.items():
        if any(a.version == network.version and a.ip in network for a in addrs):
            names.update(_resolve_lower(iface, by_name))
    matches = [by_name[n] for n in sorted(names) if n in by_name and by_name[n]["eligible"]]
    what = "an address in %s" % network
    return matches, what


def _by_default_route(procfs, by_name, eligible, notes):
    """The eligible interfaces under the default route (a VLAN or bond resolved to its physical NICs), the words for
    an error and the route's interface names; no default route, or one on no physical NIC, fails."""
    names, source = default_route_interfaces(procfs)
    if not names:
        raise NicError(
            "no interface, pci_address, mac or cidr given and there is no default route",
            value=None, expected="a selector, or a default route in %s" % join(procfs, "net/route"),
            candidates=[e["interface"] for e in eligible],
        )
    physical = set()
    for name in names:
        resolved = _resolve_lower(name, by_name)
        if resolved != [name]:
            notes.append("default route interface %s resolved to %s" % (name, ", ".join(resolved) or "nothing"))
        physical.update(resolved)
    matches = [by_name[n] for n in sorted(physical) if n in by_name and by_name[n]["eligible"]]
    what = "the %s (%s)" % (source, ", ".join(names))
    if not matches:
        raise NicError(
            "%s is not on a physical Ethernet NIC" % what, value=names,
            expected="a selector naming one of: " + _candidates_text(eligible), candidates=[e["interface"] for e in eligible],
        )
    return matches, what, names


def select_interface(selector, procfs="/proc", sysfs="/sys", run=None):
    """Return ``(interface, how, notes)`` for a selector dict, or raise NicError (TreeError for unreadable /proc/net)."""
    check_selector(selector)
    selector = dict((k, v) for k, v in (selector or {}).items() if k in SELECTOR_KEYS and v not in (None, ""))
    if len(selector) > 1:
        raise NicError(
            "give at most one of %s, got %s" % ("/".join(SELECTOR_KEYS), ", ".join(sorted(selector))),
            value=sorted(selector), expected="one selector",
        )
    interfaces = list_interfaces(sysfs)
    by_name = dict((e["interface"], e) for e in interfaces)
    eligible = [e for e in interfaces if e["eligible"]]
    notes = []
    if "interface" in selector:
        name = selector["interface"]
        entry = by_name.get(name)
        if entry is None:
            raise NicError(
                "interface %r does not exist" % name, value=name, expected="one of: " + _candidates_text(eligible),
                candidates=[e["interface"] for e in eligible],
            )
        if not entry["eligible"]:
            raise NicError(
                "interface %r is %s, not a physical Ethernet NIC" % (name, entry["reason"]), value=name,
                expected="one of: " + _candidates_text(eligible), candidates=[e["interface"] for e in eligible],
            )
        return name, "interface", notes
    if "pci_address" in selector:
        pci = normalize_pci(selector["pci_address"])
        matches = [e for e in eligible if e["pci_address"] == pci]
        how = "pci_address"
        what = "PCI function %s" % pci
        value = selector["pci_address"]
    elif "mac" in selector:
        mac = normalize_mac(selector["mac"])
        matches = [e for e in eligible if e["mac"] == mac]
        how = "mac"
        what = "MAC %s" % mac
        value = selector["mac"]
    elif "cidr" in selector:
        value = selector["cidr"]
        matches, what = _by_cidr(value, by_name, procfs, run, notes)
        how = "cidr"
    else:
        matches, what, value = _by_default_route(procfs, by_name, eligible, notes)
        how = "default_route"
    if len(matches) == 1:
        return matches[0]["interface"], how, notes
    if not matches:
        raise NicError(
            "no physical Ethernet NIC has %s" % what, value=value,
            expected="one of: " + _candidates_text(eligible), candidates=[e["interface"] for e in eligible],
        )
    raise NicError(
        "%s matches %d interfaces: %s" % (what, len(matches), _candidates_text(matches)), value=value,
        expected="a selector that matches exactly one interface, such as interface=%s" % matches[0]["interface"],
        candidates=[e["interface"] for e in matches],
    )


def require_named_nic(selector, procfs="/proc", sysfs="/sys"):
    """Raise NicError when no selector is given and the node has several physical Ethernet NICs.

    The read-only modules fall back to the default-route NIC; a run that pins IRQs (and masks irqbalance) does not
    guess between NICs: on a GPU node the default route is often the management NIC, not the training one. With one
    candidate (a VM, a single-NIC node) that one is used. Returns the candidates' names.
    """
    check_selector(selector)
    if any((selector or {}).get(key) not in (None, "") for key in SELECTOR_KEYS):
        return []
    eligible = [e for e in list_interfaces(sysfs) if e["eligible"]]
    if len(eligible) > 1:
        names = [e["interface"] for e in eligible]
        routed, _source = default_route_interfaces(procfs)
        raise NicError(
            "no NIC named and this node has %d physical Ethernet NICs: %s; the default route (%s) is often the "
            "management NIC, so a tuning run does not choose: set nic_irq_pinning_interface (or "
            "nic_irq_pinning_pci_address, _mac, _cidr) for this host, or the module's interface option"
            % (len(eligible), _candidates_text(eligible), ", ".join(routed) or "none"),
            option="interface", value=None, candidates=names,
            expected="nic_irq_pinning_interface (module option interface, pci_address, mac or cidr) naming one of: %s"
            % ", ".join(names),
        )
    return [e["interface"] for e in eligible]


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
    pci, pci_dir = _pci_function(sysfs, iface)
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
