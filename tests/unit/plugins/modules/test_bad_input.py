# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad input, table-driven: every module, the real module code, a generated tree hashed before and after.

Each case runs one module's ``main()`` (exit_json/fail_json raise, as in
test_nic_irq_modules.py) against its own tree from ``treegen`` and asserts:

* the module failed through ``fail_json`` (no traceback, no success);
* the message names the bad value or path (every fragment of the case);
* 0 bytes changed: every file and link of the tree hashes the same after;
* nothing was opened for writing under the live ``/proc`` or ``/sys``
  (a guard refuses such opens, so a regression cannot touch this host).

The case count per module is printed (``-s``) and checked by
:func:`test_case_counts`.
"""

from __future__ import annotations

import builtins
import collections
import errno
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import treegen
from modharness import Exit, Fail, install_fake_exits, patch_module_args
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_affinity, nic_irq_facts, softnet_check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "softnet_load"))
import softnet_load  # noqa: E402

MODULES = {"nic_irq_facts": nic_irq_facts, "nic_irq_affinity": nic_irq_affinity, "softnet_check": softnet_check}
PCI = "0000:3b:00.0"
ONLINE = list(range(8))


# ------------------------------------------------------------------- trees --

def nic_spec(driver="mlx5_core", irqs=None, pci=PCI):
    """8 CPUs (siblings i/i+4), one NUMA node, NIC ens7 with 4 queue IRQs, IPv4 and IPv6 addresses, default route."""
    return {
        "cpus": 8, "siblings": [[0, 4], [1, 5], [2, 6], [3, 7]], "numa": {0: ONLINE},
        "nics": [{
            "name": "ens7", "pci": pci, "driver": driver, "numa_node": 0, "mac": "02:00:17:0a:0b:0c", "speed": 25000,
            "rx_queues": 4, "tx_queues": 4, "addresses": ["10.1.0.5/24", "fd00::5/64"],
            "irqs": treegen.mlx5_irqs(pci, 60, 4, [0, 1, 2, 3]) if irqs is None else irqs,
        }],
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [
            {"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0},
            {"iface": "ens7", "dest": "10.1.0.0", "mask": "255.255.255.0", "gateway": "0.0.0.0", "metric": 0},
        ],
    }


def build(root, spec):
    tree = treegen.build_tree(root, spec)
    # counters for softnet_check, so that a case the module wrongly accepts still completes its sample
    softnet_load.write_counters(tree.proc, softnet_load.healthy(ONLINE, [0, 1, 2, 3], "ens7", 25000), 0.0)
    return tree


def snapshot(root):
    """path -> sha256 of every file (links: their target) under ``root``; sizes for the byte count."""
    hashes, sizes = {}, {}
    for base, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                hashes[rel] = "link:" + os.readlink(path)
                sizes[rel] = 0
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    data = handle.read()
                hashes[rel] = hashlib.sha256(data).hexdigest()
                sizes[rel] = len(data)
    return hashes, sizes


def bytes_changed(before, after):
    (hb, sb), (ha, sa) = before, after
    changed = [p for p in set(hb) | set(ha) if hb.get(p) != ha.get(p)]
    return sorted(changed), sum(max(sb.get(p, 0), sa.get(p, 0), 1) for p in changed)


# ------------------------------------------------------- tree mutations --

def edit(rel, old, new):
    """Mutation: replace ``old`` by ``new`` in the tree file ``rel`` (which must contain it)."""
    def apply(tree):
        path = os.path.join(tree.root, rel)
        with open(path) as handle:
            text = handle.read()
        assert old in text, (rel, old)
        with open(path, "w") as handle:
            handle.write(text.replace(old, new, 1))
    return apply


def put(rel, text):
    def apply(tree):
        path = os.path.join(tree.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    return apply


ROUTE_HEAD = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
ROUTE_LAN = "ens7\t0001010A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
NO_V4_DEFAULT = put("proc/net/route", ROUTE_HEAD + ROUTE_LAN)


def both(*mutations):
    def apply(tree):
        for mutation in mutations:
            mutation(tree)
    return apply


def copy_sys(rel):
    """Mutation: a second sysfs tree at ``rel`` (a copy, so that its real path differs from the tree's own)."""
    def apply(tree):
        shutil.copytree(tree.sys, os.path.join(tree.root, rel), symlinks=True)
    return apply


# ------------------------------------------------------------------ cases --

Case = collections.namedtuple("Case", "id module args mutate fragments spec check")
CASES = []


def case(module, name, fragments, args=None, mutate=None, spec=None, check=False):
    """``args``: dict or function(tree) -> dict of module options; roots are added unless given."""
    CASES.append(Case("%s-%s" % (module, name), module, args or {}, mutate, list(fragments), spec, check))


ALL = ("nic_irq_facts", "nic_irq_affinity", "softnet_check")
SOFTNET_ARGS = {"interval": 0.05}

for _m in ALL:
    # empty selectors are an error, never "use the default-route NIC"
    case(_m, "empty-interface", ["interface", "empty"], {"interface": ""})
    case(_m, "blank-interface", ["interface", "empty"], {"interface": "   "})
    case(_m, "empty-pci_address", ["pci_address", "empty"], {"pci_address": ""})
    case(_m, "empty-mac", ["mac", "empty"], {"mac": ""})
    case(_m, "empty-cidr", ["cidr", "empty"], {"cidr": ""})
    # selectors that name nothing
    case(_m, "unknown-interface", ["ens9"], {"interface": "ens9"})
    case(_m, "bad-pci_address", ["zz:00.0"], {"pci_address": "zz:00.0"})
    case(_m, "bad-mac", ["02:00:17"], {"mac": "02:00:17"})
    case(_m, "bad-cidr", ["10.1.0.0/33"], {"cidr": "10.1.0.0/33"})
    case(_m, "two-selectors", ["mutually exclusive"], {"interface": "ens7", "mac": "02:00:17:0a:0b:0c"})
    # roots that are missing or are not a procfs/sysfs
    case(_m, "missing-procfs", ["procfs_path", "nowhere/proc", "does not exist"],
         lambda t: {"procfs_path": os.path.join(t.root, "nowhere/proc")})
    case(_m, "missing-sysfs", ["sysfs_path", "nowhere/sys", "does not exist"],
         lambda t: {"sysfs_path": os.path.join(t.root, "nowhere/sys")})
    case(_m, "procfs-not-a-procfs", ["procfs_path", "etc", "interrupts"], lambda t: {"procfs_path": t.etc},
         mutate=put("etc/hostname", "node17\n"))
    case(_m, "sysfs-not-a-sysfs", ["sysfs_path", "etc", "class/net"], lambda t: {"sysfs_path": t.etc},
         mutate=put("etc/hostname", "node17\n"))
    case(_m, "procfs-is-a-file", ["procfs_path", "hostname", "not a directory"],
         lambda t: {"procfs_path": os.path.join(t.etc, "hostname")}, mutate=put("etc/hostname", "node17\n"))
    # malformed /proc/interrupts header
    case(_m, "interrupts-header-bad-column", ["proc/interrupts", "CPUx"],
         mutate=edit("proc/interrupts", "CPU7", "CPUx"))
    case(_m, "interrupts-header-repeated-cpu", ["proc/interrupts", "CPU3"],
         mutate=edit("proc/interrupts", "CPU4", "CPU3"))
    # /proc/net/route with bad columns (default-route selection), and a bad header
    case(_m, "route-bad-flags", ["proc/net/route", "ZZ03"], mutate=edit("proc/net/route", "\t0003\t", "\tZZ03\t"))
    case(_m, "route-bad-metric", ["proc/net/route", "x5"],
         mutate=put("proc/net/route", ROUTE_HEAD + "ens7\t00000000\t0101010A\t0003\t0\t0\tx5\t00000000\t0\t0\t0\n"))
    case(_m, "route-short-line", ["proc/net/route", "ens7 00000000"],
         mutate=put("proc/net/route", ROUTE_HEAD + "ens7\t00000000\t0101010A\n"))
    case(_m, "route-no-header", ["proc/net/route", "Iface"],
         mutate=put("proc/net/route", "ens7\t00000000\t0101010A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"))
    # the same file read for a cidr selector, and if_inet6 columns
    case(_m, "route-bad-mask-for-cidr", ["proc/net/route", "00FFFFGG"], {"cidr": "10.1.0.0/24"},
         mutate=edit("proc/net/route", "00FFFFFF", "00FFFFGG"))
    case(_m, "if_inet6-bad-prefix", ["proc/net/if_inet6", "zz"], {"cidr": "fd00::/64"},
         mutate=edit("proc/net/if_inet6", " 02 40 ", " 02 zz "))
    case(_m, "if_inet6-bad-address", ["proc/net/if_inet6", "fd00xx"], {"cidr": "fd00::/64"},
         mutate=edit("proc/net/if_inet6", "fd000000", "fd00xx00"))
    case(_m, "if_inet6-short-line", ["proc/net/if_inet6", "fd0000000000"], {"cidr": "fd00::/64"},
         mutate=put("proc/net/if_inet6", "fd000000000000000000000000000005 02 40\n"))
    # IPv6 default route file, read when there is no IPv4 default route
    case(_m, "ipv6_route-bad-metric", ["proc/net/ipv6_route", "metricX"],
         mutate=both(NO_V4_DEFAULT, put("proc/net/ipv6_route", "%s 00 %s 00 %s metricX 00000001 00000000 00000003     ens7\n"
                                        % ("0" * 32, "0" * 32, "fe80" + "0" * 27 + "1"))))
    # an IRQ of the PCI function whose /proc row belongs to another function: not the same system
    case(_m, "irq-of-another-function-in-name", ["IRQ 62", "0000:3b:00.1", PCI],
         mutate=edit("proc/interrupts", "mlx5_comp1@pci:%s" % PCI, "mlx5_comp1@pci:0000:3b:00.1"))
    case(_m, "irq-of-another-function-in-chip", ["IRQ 61", "0000:af:00.0", PCI],
         mutate=edit("proc/interrupts", "PCI-MSIX-%s 427-edge" % PCI, "PCI-MSIX-0000:af:00.0 427-edge"))

# a write never mixes a captured root with a live one, and never two trees
case("nic_irq_affinity", "only-sysfs_path", ["procfs_path /proc", "sysfs_path", "same system"],
     lambda t: {"procfs_path": "/proc", "sysfs_path": t.sys, "cpus": "4-7"})
case("nic_irq_affinity", "only-sysfs_path-check-mode", ["procfs_path /proc", "sysfs_path", "same system"],
     lambda t: {"procfs_path": "/proc", "sysfs_path": t.sys, "cpus": "4-7"}, check=True)
case("nic_irq_affinity", "only-procfs_path", ["sysfs_path /sys", "procfs_path", "same system"],
     lambda t: {"procfs_path": t.proc, "sysfs_path": "/sys", "cpus": "4-7"})
case("nic_irq_affinity", "roots-of-two-trees", ["other/sys", "same system"],
     lambda t: {"sysfs_path": os.path.join(t.root, "other/sys"), "cpus": "4-7"}, mutate=copy_sys("other/sys"))

# nic_irq_affinity options
case("nic_irq_affinity", "cpu-does-not-exist", ["CPU 8", "does not exist"], {"cpus": "4-8"})
case("nic_irq_affinity", "cpus-reversed-range", ["cpus", "7-4"], {"cpus": "7-4"})
case("nic_irq_affinity", "cpus-and-count", ["mutually exclusive"], {"cpus": "4-7", "count": 4})
case("nic_irq_affinity", "count-zero", ["count 0"], {"count": 0})
case("nic_irq_affinity", "count-too-big", ["count 9"], {"count": 9})
case("nic_irq_affinity", "exclude-garbage", ["exclude_cpus", "x-1"], {"exclude_cpus": "x-1"})
case("nic_irq_affinity", "cpu-in-exclude", ["CPU 4", "exclude_cpus"], {"cpus": "4-7", "exclude_cpus": "4"})

# the generic rule never reads a queue number out of a PCI address
MANA_PCI = "7870:00:00.0"
case("nic_irq_affinity", "mana-hwc-only-unknown-driver", ["no queue IRQs", MANA_PCI, "hv_mystery"],
     {"cpus": "4-7"}, spec=nic_spec("hv_mystery", treegen.named_irqs(["mana_hwc@pci:%s" % MANA_PCI], 60, [0]), pci=MANA_PCI))
case("nic_irq_affinity", "mana-hwc-only", ["no queue IRQs", MANA_PCI, "driver mana"], {"cpus": "4-7"},
     spec=nic_spec("mana", treegen.named_irqs(["mana_hwc@pci:%s" % MANA_PCI], 60, [0]), pci=MANA_PCI))
case("nic_irq_affinity", "i40e-fdir-unknown-driver", ["no queue IRQs", "i40e_oot"], {"cpus": "4-7"},
     spec=nic_spec("i40e_oot", treegen.named_irqs(["i40e-%s:fdir-TxRx-0" % PCI, "i40e-%s:misc" % PCI], 60, [0])))
case("nic_irq_affinity", "pci-function-digit-unknown-driver", ["no queue IRQs", "0000:3b:00.3"],
     {"cpus": "4-7"}, spec=nic_spec("xyz", treegen.named_irqs(["xyz_ctl@pci:0000:3b:00.3"], 60, [0]), pci="0000:3b:00.3"))

# softnet_check thresholds: NaN, infinity, negative, percentages above 100
for _key in ("squeeze_rate", "squeeze_share_pct", "idle_pps", "softirq_pct", "user_pct", "max_link_util_pct"):
    case("softnet_check", "%s-nan" % _key, [_key, "nan"], {_key: "nan"})
    case("softnet_check", "%s-inf" % _key, [_key, "inf"], {_key: "inf"})
    case("softnet_check", "%s-negative" % _key, [_key, "-1"], {_key: -1})
for _key in ("softirq_pct", "user_pct", "max_link_util_pct", "squeeze_share_pct"):
    case("softnet_check", "%s-above-100" % _key, [_key, "100.5"], {_key: 100.5})
case("softnet_check", "interval-nan", ["interval", "nan"], {"interval": "nan"})
case("softnet_check", "interval-inf", ["interval", "inf"], {"interval": "inf"})
case("softnet_check", "link_speed-zero", ["link_speed_mbps", "0"], {"link_speed_mbps": 0})
case("softnet_check", "irq_cpus-garbage", ["irq_cpus", "a-b"], {"irq_cpus": "a-b"})


# --------------------------------------------------------------- harness --

@pytest.fixture
def guarded(monkeypatch):
    """exit_json/fail_json raise; opening anything under the live /proc or /sys for writing is refused and recorded."""
    attempts = []
    install_fake_exits(monkeypatch, fail_as_json=True)

    def live(path):
        real = os.path.realpath(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        return real in ("/proc", "/sys") or real.startswith(("/proc/", "/sys/"))

    real_os_open, real_open = os.open, builtins.open

    def os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT) and live(path):
            attempts.append(os.fspath(path))
            raise PermissionError(errno.EACCES, "write to the live system refused by the test", path)
        return real_os_open(path, flags, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and live(file):
            attempts.append(os.fspath(file))
            raise PermissionError(errno.EACCES, "write to the live system refused by the test", file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    return attempts


def run_case(item, tree):
    args = item.args(tree) if callable(item.args) else dict(item.args)
    args.setdefault("procfs_path", tree.proc)
    args.setdefault("sysfs_path", tree.sys)
    if item.module == "softnet_check":
        for key, value in SOFTNET_ARGS.items():
            args.setdefault(key, value)
    if item.check:
        args["_ansible_check_mode"] = True
    with patch_module_args(args):
        try:
            MODULES[item.module].main()
        except (Exit, Fail) as exc:
            return type(exc).__name__, exc.args[0]
        except SystemExit as exc:  # pragma: no cover - exit_json/fail_json are patched
            return "SystemExit", {"code": exc.code}
        except Exception as exc:  # a traceback is a failed case, reported as such
            return "Traceback", {"msg": "%s: %s" % (type(exc).__name__, exc)}
    return "Returned", {}


@pytest.mark.parametrize("item", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_names_it_and_changes_nothing(tmp_path, guarded, item):
    tree = build(tmp_path / "tree", item.spec or nic_spec())
    if item.mutate:
        item.mutate(tree)
    before = snapshot(tree.root)
    kind, result = run_case(item, tree)
    changed, nbytes = bytes_changed(before, snapshot(tree.root))
    msg = str(result.get("msg", ""))
    assert kind == "Fail", "%s: expected fail_json, got %s: %s" % (item.id, kind, msg or result)
    missing = [f for f in item.fragments if f not in msg]
    assert not missing, "%s: message %r does not name %s" % (item.id, msg, missing)
    assert not guarded, "%s: tried to write the live system: %s" % (item.id, guarded)
    assert nbytes == 0, "%s: %d bytes changed in %s" % (item.id, nbytes, changed)


def test_case_counts():
    counts = collections.Counter(c.module for c in CASES)
    print("bad-input cases: %d (%s)" % (len(CASES), ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    assert len(CASES) >= 60 and len(set(c.id for c in CASES)) == len(CASES)
    assert all(counts[m] >= 20 for m in ALL), counts


# ------------------------------------------- the same rules, accepted input --

def _run(module, args):
    with patch_module_args(args):
        try:
            MODULES[module].main()
        except (Exit, Fail) as exc:
            return type(exc).__name__, exc.args[0]
    raise AssertionError("no exit")


def test_mana_pins_its_queues_and_leaves_the_hwc_vector(tmp_path, guarded):
    names = ["mana_hwc@pci:%s" % MANA_PCI] + ["mana_q%d@pci:%s" % (q, MANA_PCI) for q in range(4)]
    tree = build(tmp_path / "tree", nic_spec("mana", treegen.named_irqs(names, 60, [0, 0, 1, 2, 3]), pci=MANA_PCI))
    kind, result = _run("nic_irq_affinity", {"procfs_path": tree.proc, "sysfs_path": tree.sys, "cpus": "4-7"})
    assert kind == "Exit", result
    by_irq = dict((i["irq"], i) for i in result["irqs"])
    assert (by_irq[60]["kind"], by_irq[60]["status"]) == ("control", "unchanged") and tree.affinity(60) == "0"
    assert [(by_irq[n]["queue"], tree.affinity(n)) for n in range(61, 65)] == [(0, "4"), (1, "5"), (2, "6"), (3, "7")]


def test_empty_selector_is_not_the_default_route_even_when_one_exists(tmp_path, guarded):
    tree = build(tmp_path / "tree", nic_spec())
    kind, result = _run("nic_irq_facts", {"procfs_path": tree.proc, "sysfs_path": tree.sys})
    assert kind == "Exit" and result["ansible_facts"]["nic_irq"]["selected_by"] == "default_route"
    kind, result = _run("nic_irq_facts", {"procfs_path": tree.proc, "sysfs_path": tree.sys, "interface": ""})
    assert kind == "Fail" and "interface" in result["msg"]


@pytest.mark.parametrize("driver,name,expected", [
    # MANA: gdma_main.c mana_gd_setup_irqs() names vector 0 mana_hwc, vector i mana_q(i-1)
    ("mana", "mana_hwc@pci:7870:00:00.0", ("control", None, None)),
    ("mana", "mana_q0@pci:7870:00:00.0", ("queue", 0, "txrx")),
    ("mana", "mana_q13@pci:7870:00:00.1", ("queue", 13, "txrx")),
    ("mana", "mana_msi2@pci:7870:00:00.0", ("control", None, None)),   # a naming this collection does not know
    # unknown drivers: the PCI function digit is never a queue number; control words win
    ("hv_mystery", "mana_hwc@pci:7870:00:00.0", ("control", None, None)),
    ("hv_mystery", "mana_q5@pci:7870:00:00.3", ("queue", 5, "txrx")),
    ("xyz", "xyz_ctl@pci:0000:3b:00.3", ("control", None, None)),
    ("xyz", "xyz@0000:3b:00.7", ("control", None, None)),
    ("i40e_oot", "i40e-0000:3b:00.0:fdir-TxRx-0", ("control", None, None)),
    ("i40e_oot", "i40e-ens1f0-fdir-TxRx-0", ("control", None, None)),
    ("i40e_oot", "i40e-ens1f0-TxRx-3", ("queue", 3, "txrx")),
    ("hns3", "hns3-0000:7d:00.0-TxRx-5", ("queue", 5, "txrx")),
    ("weird", "ena-mgmnt@pci:0000:00:05.0", ("control", None, None)),
    ("weird", "mlx5_async0@pci:0000:00:07.0", ("control", None, None)),
    ("weird", "mlx5_comp7@pci:0000:00:07.1", ("queue", 7, "txrx")),
])
def test_irq_name_rules(driver, name, expected):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import classify_irq

    assert classify_irq(name, driver) == expected


def test_boot_cli_refuses_mixed_roots_and_writes_nothing(tmp_path, guarded):
    """The boot-time entry point runs the same writer: a state file with only sysfs_path is an error, not a retry."""
    import io

    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli

    tree = build(tmp_path / "tree", nic_spec())
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"interface": "ens7", "cpus": "4-7", "sysfs_path": tree.sys}))
    before = snapshot(tree.root)
    out = io.StringIO()
    slept = []
    assert _irq_pin_cli.main(["--wait", "5", str(state)], run=lambda argv: (127, "", ""), out=out, sleep=slept.append) == 1
    assert "procfs_path /proc is the live system" in out.getvalue() and tree.sys in out.getvalue()
    assert slept == [] and not guarded and bytes_changed(before, snapshot(tree.root))[1] == 0


def test_roots_of_one_system(tmp_path):
    from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import roots_mixed

    tree = build(tmp_path / "tree", nic_spec())
    os.symlink(tree.root, str(tmp_path / "alias"))
    assert roots_mixed("/proc", "/sys") is None and roots_mixed("/proc/", "/sys/") is None
    assert roots_mixed(tree.proc, tree.sys) is None
    assert roots_mixed(str(tmp_path / "alias" / "proc"), tree.sys) is None         # the same tree through a link
    assert "is the live system" in roots_mixed("/proc", tree.sys)
    assert "is the live system" in roots_mixed(tree.proc, "/sys")
    assert "different trees" in roots_mixed(tree.proc, str(tmp_path))
