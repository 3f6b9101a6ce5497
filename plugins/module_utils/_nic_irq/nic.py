# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Select an Ethernet NIC and find its PCI function: the NIC selector every module takes.

Private module_utils of gpunode.tuning, standard library only. Read-only:
nothing here writes. Roots are parameters; ``ip`` comes in as
``run(argv) -> (rc, stdout, stderr)`` and is optional: without it the
addresses come from ``/proc/net``.

* :data:`SELECTOR_KEYS`, :data:`SELECTOR_ARGUMENT_SPEC`, :func:`check_selector`
  - the selector (interface, PCI address, MAC or CIDR; none: the default route);
* :func:`list_interfaces`, :func:`pci_function` - the interfaces of ``class/net``
  and the PCI function behind one (walking up from virtio children);
* :func:`default_route_interfaces` - the interfaces of the default route;
* :func:`select_interface`, :func:`require_named_nic` - the one NIC a selector
  names, or NicError naming the candidates.

Nothing is trusted to be stable: the interface is resolved to its PCI function
on every call. Its queues and IRQs are ``_nic_irq.nic_irqs``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import (
    TreeError,
    join,
    list_dir,
    read_int,
    read_raw,
    read_text,
)

ARPHRD_INFINIBAND = 32
PCI_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_SHORT_RE = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5,19}$")


# The NIC selector and filesystem roots every module takes; documented once in
# the gpunode.tuning.nic_selector doc fragment. Plain data: no Ansible import.
SELECTOR_KEYS = ("interface", "pci_address", "mac", "cidr")
SELECTOR_ARGUMENT_SPEC = dict(
    [(key, dict(type="str")) for key in SELECTOR_KEYS],
    **target_spec("procfs_path", "sysfs_path")
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


def pci_function(sysfs, iface):
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
        pci, _dir = pci_function(sysfs, name) if has_device else (None, None)
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


# The selectors that name one address of the NIC: the key (in the selector and in each candidate), how a value is
# normalised, how the messages name it.
_BY_ADDRESS = (("pci_address", normalize_pci, "PCI function %s"), ("mac", normalize_mac, "MAC %s"))


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
    keyed = [(key, normal, label) for key, normal, label in _BY_ADDRESS if key in selector]
    if keyed:
        how, normal, label = keyed[0]
        value = selector[how]
        wanted = normal(value)
        matches = [e for e in eligible if e[how] == wanted]
        what = label % wanted
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
