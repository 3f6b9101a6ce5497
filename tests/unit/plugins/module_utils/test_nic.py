# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""read_nic: selection, PCI function resolution, queues, IRQ classification, over generated trees and real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

import treegen
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import parse_interrupts
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import NicError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import (
    classify_irq,
    classify_irqs,
    parse_ethtool_channels,
    read_nic,
)

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "captures"


@pytest.fixture
def seed(tmp_path):
    return treegen.build_tree(tmp_path, treegen.seed_vm())


@pytest.fixture
def lab(tmp_path):
    return treegen.build_tree(tmp_path, treegen.lab_virtio())


# ------------------------------------------------------------- selection --

@pytest.mark.parametrize("selector,expected,how", [
    ({}, "ens7", "default_route"),
    ({"interface": "ens7"}, "ens7", "interface"),
    ({"pci_address": "00:07.0"}, "ens7", "pci_address"),
    ({"pci_address": "0000:00:07.0"}, "ens7", "pci_address"),
    ({"mac": "02-00-17-0A-0B-0C"}, "ens7", "mac"),
    ({"cidr": "172.27.0.0/20"}, "ens7", "cidr"),
    ({"cidr": "172.27.1.15/32"}, "ens7", "cidr"),
])
def test_selectors_find_the_ethernet_vf(seed, selector, expected, how):
    for run in (seed.run, None):  # with `ip`/`ethtool` and from /proc only
        nic = read_nic(selector, procfs=seed.proc, sysfs=seed.sys, run=run)
        assert (nic["interface"], nic["selected_by"], nic["pci_address"]) == (expected, how, "0000:00:07.0")


@pytest.mark.parametrize("selector,message,value", [
    ({"interface": "ibp17s0"}, "InfiniBand (type 32)", "ibp17s0"),
    ({"interface": "docker0"}, "virtual (no device link)", "docker0"),
    ({"interface": "eth9"}, "does not exist", "eth9"),
    ({"pci_address": "0000:11:00.0"}, "no physical Ethernet NIC has PCI function 0000:11:00.0", "0000:11:00.0"),
    ({"pci_address": "zz:00"}, "is not a PCI address", "zz:00"),
    ({"mac": "nope"}, "is not a MAC address", "nope"),
    ({"cidr": "10.99.0.0/16"}, "no physical Ethernet NIC has an address in 10.99.0.0/16", "10.99.0.0/16"),
    ({"cidr": "172.17.0.0/16"}, "no physical Ethernet NIC", "172.17.0.0/16"),   # only docker0 (virtual) holds it
    ({"cidr": "300.1.1.1/8"}, "is not a network", "300.1.1.1/8"),
    ({"interface": "ens7", "mac": "02:00:17:0a:0b:0c"}, "at most one of", ["interface", "mac"]),
])
def test_bad_or_unmatched_selectors_fail_with_value_and_candidates(seed, selector, message, value):
    with pytest.raises(NicError) as exc:
        read_nic(selector, procfs=seed.proc, sysfs=seed.sys, run=seed.run)
    assert message in str(exc.value)
    assert exc.value.details["value"] == value
    if "candidates" in exc.value.details:
        assert "ibp17s0" not in exc.value.details["candidates"]


def test_ambiguous_match_lists_both_candidates(tmp_path):
    spec = treegen.lab_virtio()
    spec["nics"][0]["addresses"] = ["192.168.77.9/24"]          # both NICs in 192.168.77.0/24
    tree = treegen.build_tree(tmp_path, spec)
    with pytest.raises(NicError) as exc:
        read_nic({"cidr": "192.168.77.0/24"}, procfs=tree.proc, sysfs=tree.sys, run=tree.run)
    assert exc.value.details["candidates"] == ["enp66s1", "ens3"]
    assert "matches 2 interfaces" in str(exc.value)


def test_no_default_route_is_an_error_listing_candidates(tmp_path):
    spec = treegen.lab_virtio()
    spec["routes"] = [r for r in spec["routes"] if r["dest"] != "0.0.0.0"]
    tree = treegen.build_tree(tmp_path, spec)
    with pytest.raises(NicError) as exc:
        read_nic({}, procfs=tree.proc, sysfs=tree.sys)
    assert exc.value.details["candidates"] == ["enp66s1", "ens3"]


def test_ipv6_default_route_when_there_is_no_ipv4_one(tmp_path):
    spec = treegen.lab_virtio()
    spec["routes"] = []
    spec["ipv6_default"] = "enp66s1"
    tree = treegen.build_tree(tmp_path, spec)
    nic = read_nic({}, procfs=tree.proc, sysfs=tree.sys)
    assert nic["interface"] == "enp66s1"


def test_default_route_on_a_bond_resolves_to_its_physical_member(tmp_path):
    spec = treegen.lab_virtio()
    spec["virtual"].append({"name": "bond0", "lower": ["enp66s1"], "addresses": ["10.9.0.2/24"]})
    spec["routes"] = [{"iface": "bond0", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.9.0.1", "metric": 0},
                      {"iface": "bond0", "dest": "10.9.0.0", "mask": "255.255.255.0", "gateway": "0.0.0.0", "metric": 0}]
    tree = treegen.build_tree(tmp_path, spec)
    nic = read_nic({}, procfs=tree.proc, sysfs=tree.sys)
    assert nic["interface"] == "enp66s1"
    assert "bond0 resolved to enp66s1" in nic["notes"][0]
    assert read_nic({"cidr": "10.9.0.0/24"}, procfs=tree.proc, sysfs=tree.sys, run=tree.run)["interface"] == "enp66s1"


def test_ipv6_cidr_from_if_inet6(tmp_path):
    spec = treegen.lab_virtio()
    spec["nics"][1]["addresses"].append("fd00:77::2/64")
    tree = treegen.build_tree(tmp_path, spec)
    assert read_nic({"cidr": "fd00:77::/64"}, procfs=tree.proc, sysfs=tree.sys)["interface"] == "enp66s1"


# ----------------------------------------------------- PCI and the queues --

def test_virtio_child_resolves_to_pci_function_with_numa_and_local_cpus(lab):
    nic = read_nic({"interface": "enp66s1"}, procfs=lab.proc, sysfs=lab.sys, run=lab.run)
    assert nic["pci_address"] == "0000:42:01.0"
    assert (nic["driver"], nic["pci_driver"]) == ("virtio_net", "virtio-pci")
    assert (nic["numa_node"], nic["local_cpulist"]) == (1, [4, 5, 6, 7])
    assert nic["speed_mbps"] is None
    assert nic["queues"]["sysfs_rx"] == 6 and nic["queues"]["combined_current"] == 6
    queue_irqs = [(i["name"], i["queue"], i["direction"]) for i in nic["irqs"] if i["kind"] == "queue"]
    assert queue_irqs[:3] == [("virtio2-input.0", 0, "rx"), ("virtio2-output.0", 0, "tx"), ("virtio2-input.1", 1, "rx")]
    assert [i["name"] for i in nic["irqs"] if i["kind"] == "control"] == ["virtio2-config"]


def test_pci_domains_wider_than_four_digits(tmp_path):
    # Intel VMD puts devices in domains such as 10000
    spec = treegen.lab_virtio()
    spec["nics"][1]["pci"] = "10000:42:01.0"
    tree = treegen.build_tree(tmp_path, spec)
    nic = read_nic({"pci_address": "10000:42:01.0"}, procfs=tree.proc, sysfs=tree.sys)
    assert (nic["interface"], nic["pci_address"]) == ("enp66s1", "10000:42:01.0")


def test_seed_vm_numa_minus_one_becomes_none_with_note(seed):
    nic = read_nic({}, procfs=seed.proc, sysfs=seed.sys, run=seed.run)
    assert nic["numa_node"] is None
    assert any("numa_node -1" in n for n in nic["notes"])
    assert [i["irq"] for i in nic["irqs"] if i["kind"] == "queue"] == list(range(60, 71))
    assert [i["queue"] for i in nic["irqs"] if i["kind"] == "queue"] == list(range(11))
    assert nic["irqs"][0]["name"] == "mlx5_async0@pci:0000:00:07.0" and nic["irqs"][0]["kind"] == "control"
    assert nic["irqs"][1]["counts"] == {0: 100000} and nic["irqs"][1]["effective_affinity"] == [0]
    assert nic["speed_mbps"] == 200000


def test_ethtool_failure_is_a_note_and_sysfs_counts_remain(lab):
    nic = read_nic({"interface": "ens3"}, procfs=lab.proc, sysfs=lab.sys, run=lab.run)
    assert nic["queues"]["combined_current"] is None and nic["queues"]["sysfs_tx"] == 1
    assert any("ethtool -l ens3 failed" in n for n in nic["notes"])


def test_legacy_irq_and_missing_effective_affinity(tmp_path):
    spec = treegen.lab_virtio()
    nic = spec["nics"][1]
    nic["msix"] = False
    nic["legacy_irq"] = 11
    spec["other_irqs"].append({"irq": 11, "name": "virtio2", "affinity": [0, 1, 2, 3], "effective": None})
    tree = treegen.build_tree(tmp_path, spec)
    got = read_nic({"interface": "enp66s1"}, procfs=tree.proc, sysfs=tree.sys)
    assert [(i["irq"], i["effective_affinity"]) for i in got["irqs"]] == [(11, None)]
    assert any("legacy IRQ 11" in n for n in got["notes"])


def test_msi_vector_without_handler_is_reported(tmp_path):
    spec = treegen.lab_virtio()
    tree = treegen.build_tree(tmp_path, spec)
    open(tree.sys + "/devices/pci0000:42/0000:42:01.0/msi_irqs/99", "w").write("msix\n")
    got = read_nic({"interface": "enp66s1"}, procfs=tree.proc, sysfs=tree.sys)
    assert any("IRQ 99" in n for n in got["notes"])
    assert [i for i in got["irqs"] if i["irq"] == 99][0]["kind"] == "control"


# ---------------------------------------------------------- classification --

@pytest.mark.parametrize("driver,name,expected", [
    ("mlx5_core", "mlx5_comp10@pci:0000:00:07.0", ("queue", 10, "txrx")),
    ("mlx5_core", "mlx5_async0@pci:0000:00:07.0", ("control", None, None)),
    ("mlx5_core", "mlx5_pages_eq@pci:0000:00:07.0", ("control", None, None)),
    ("mlx5_core", "mlx5_cmd_eq@pci:0000:00:07.0", ("control", None, None)),
    ("virtio_net", "virtio2-input.5", ("queue", 5, "rx")),
    ("virtio_net", "virtio2-output.5", ("queue", 5, "tx")),
    ("virtio_net", "virtio2-config", ("control", None, None)),
    ("virtio_net", "virtio0-virtqueues", ("queue", 0, "txrx")),
    ("ena", "ens5-Tx-Rx-3", ("queue", 3, "txrx")),
    ("ena", "ena-mgmnt@pci:0000:00:05.0", ("control", None, None)),
    ("ice", "ice-ens801f0-TxRx-7", ("queue", 7, "txrx")),
    ("ice", "ice-0000:af:00.0:misc", ("control", None, None)),
    ("i40e", "i40e-enP1s15-TxRx-2", ("queue", 2, "txrx")),
    ("i40e", "i40e-0001:00:0f.0:misc", ("control", None, None)),
    ("i40e", "i40e-ens1f0-fdir-TxRx-0", ("control", None, None)),
    ("ice", "ice-em3-TxRx-126", ("queue", 126, "txrx")),               # intel/ethernet-linux-ice#42
    ("ixgbe", "eth4-TxRx-11", ("queue", 11, "txrx")),
    ("ixgbe", "eth4-rx-2", ("queue", 2, "rx")),
    ("ixgbe", "eth4", ("control", None, None)),
    ("bnxt_en", "ens2f0np0-TxRx-4", ("queue", 4, "txrx")),
    ("bnxt_en", "ens2f0np0-tx-1", ("queue", 1, "tx")),
    ("igb", "enp5s0-TxRx-3", ("queue", 3, "txrx")),            # generic fallback from here on
    ("sfc", "eth0-12", ("queue", 12, "txrx")),
    ("hns3", "hns3-0000:7d:00.0-TxRx-5", ("queue", 5, "txrx")),
    ("mana", "mana_q7@pci:7870:00:00.0", ("queue", 7, "txrx")),
    ("igb", "enp5s0", ("control", None, None)),
    ("weird", "foo-misc-3", ("control", None, None)),
    ("weird", "", ("control", None, None)),
])
def test_classification_table(driver, name, expected):
    assert classify_irq(name, driver) == expected


def test_gve_notify_blocks_map_first_half_to_tx_second_half_to_rx():
    entries = [{"irq": 100 + b, "name": "gve-ntfy-blk%d@pci:0000:00:04.0" % b} for b in range(4)]
    entries.append({"irq": 104, "name": "gve-mgmnt@pci:0000:00:04.0"})
    classify_irqs(entries, "gve")
    assert [(e["kind"], e["queue"], e["direction"]) for e in entries] == [
        ("queue", 0, "tx"), ("queue", 1, "tx"), ("queue", 0, "rx"), ("queue", 1, "rx"), ("control", None, None)]


@pytest.mark.parametrize("capture,driver,prefix,queues,control", [
    ("ena_4cpu_two_nics.txt", "ena", ("ena-mgmnt@pci:0000:00:05.0", "eth0-"), [0, 1, 2, 3], ["ena-mgmnt@pci:0000:00:05.0"]),
    ("mlx5_cx5_12cpu_grep_noheader.txt", "mlx5_core", ("mlx5_async0@pci:0000:01:00.0", "mlx5_comp"), list(range(12)),
     ["mlx5_async0@pci:0000:01:00.0"]),
    ("virtio_16cpu_egrep.txt", "virtio_net", ("virtio0",), [0, 0, 1, 1, 2, 2, 3, 3], []),
    ("i40e_virtio_nemu_4cpu_partial.txt", "i40e", ("i40e-",), [0, 1, 2], ["i40e-0001:00:0f.0:misc"]),
    ("gve_2cpu_noheader_partial.txt", "gve", ("gve-",), [0, 0], ["gve-mgmnt@pci:0000:00:04.0"]),   # block 0 tx 0, block 1 rx 0
])
def test_real_captures_classify(capture, driver, prefix, queues, control):
    parsed = parse_interrupts((CAPTURES / "interrupts" / capture).read_text())
    entries = [{"irq": int(k), "name": r["name"]} for k, r in parsed["irqs"].items()
               if k.isdigit() and r["name"].startswith(prefix) and ("0000:01:00.1" not in r["name"])]
    classify_irqs(entries, driver)
    entries.sort(key=lambda e: e["irq"])
    assert [e["queue"] for e in entries if e["kind"] == "queue"] == queues
    assert [e["name"] for e in entries if e["kind"] == "control"] == control


# --------------------------------------------------------------- ethtool --

@pytest.mark.parametrize("capture,expected", [
    ("netlink_separate_rx_tx_eno1.txt", {"rx_max": 4, "tx_max": 4, "combined_max": None, "rx_current": 4, "tx_current": 1,
                                         "combined_current": None, "other_max": None}),
    ("netlink_combined_ens3f0.txt", {"combined_max": 64, "combined_current": 1, "rx_max": None, "other_current": 1}),
    ("ioctl_ena_eth0.txt", {"combined_max": 2, "combined_current": 1, "rx_max": 0, "tx_current": 0}),
    ("netlink_tabs_ens10f0.txt", {"combined_max": 64, "rx_max": 64, "rx_current": 0, "other_max": None}),
    ("ioctl_hv_netvsc_eth0.txt", {"combined_max": 64, "combined_current": 8}),
    ("ioctl_mlx_p2p1.txt", {"combined_max": 63, "combined_current": 1, "other_max": 1}),
])
def test_ethtool_channel_captures(capture, expected):
    parsed = parse_ethtool_channels((CAPTURES / "ethtool" / capture).read_text())
    assert dict((k, parsed[k]) for k in expected) == expected


def test_all_ethtool_captures_are_tested():
    names = sorted(p.name for p in (CAPTURES / "ethtool").glob("*.txt"))
    assert len(names) == 6


def test_gve_old_names_from_before_v1_4_map_the_same_way():
    # GoogleCloudPlatform/compute-virtual-ethernet-linux#30: "eth%d-ntfy-block.0 ... eth%d-ntfy-block.15"
    entries = [{"irq": 40 + b, "name": "eth%%d-ntfy-block.%d" % b} for b in range(16)]
    classify_irqs(entries, "gve")
    assert [(e["queue"], e["direction"]) for e in entries[6:10]] == [(6, "tx"), (7, "tx"), (0, "rx"), (1, "rx")]
