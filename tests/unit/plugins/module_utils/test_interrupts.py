# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""/proc/interrupts parsing over real captures (tests/unit/fixtures/captures/interrupts) and edge layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import InterruptsError, parse_interrupts, per_cpu_counts
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import classify_irqs

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "captures" / "interrupts"

# file, number of CPU columns, {key: (chip, name, total)}
CASES = [
    ("ena_4cpu_two_nics.txt", 4, {
        "27": ("PCI-MSI", "ena-mgmnt@pci:0000:00:05.0", 6584),
        "28": ("PCI-MSI", "eth0-Tx-Rx-0", 1482671 + 35400719),
        "9": ("IO-APIC", "acpi", 10),
        "ERR": ("", "", 0),
        "LOC": ("", "Local timer interrupts", 28933051 + 29085232 + 28863521 + 29027674),
    }),
    ("mlx5_cx5_12cpu_grep_noheader.txt", 12, {
        "98": ("IR-PCI-MSIX-0000:01:00.0", "mlx5_async0@pci:0000:01:00.0", 23274),
        "117": ("IR-PCI-MSIX-0000:01:00.0", "mlx5_comp9@pci:0000:01:00.0", 7 + 651437),
        "102": ("IR-PCI-MSIX-0000:01:00.1", "mlx5_comp0@pci:0000:01:00.1", 0),
    }),
    ("virtio_16cpu_egrep.txt", 16, {
        "45": ("PCI-MSI-edge", "virtio0-input.0", 151170261),
        "52": ("PCI-MSI-edge", "virtio0-output.3", 1),
    }),
    ("virtio_2nic_2queue_noheader.txt", 4, {
        "25": ("PCI-MSI", "virtio0-input.0", 4871),
        "29": ("PCI-MSI", "virtio1-config", 0),
    }),
    ("i40e_virtio_nemu_4cpu_partial.txt", 4, {
        "9": ("PCI-MSI", "i40e-0001:00:0f.0:misc", 2),
        "10": ("PCI-MSI", "i40e-enP1s15-TxRx-0", 119),
        "6": ("PCI-MSI", "virtio0-virtqueues", 752),
        "1": ("IO-APIC", "ACPI:Ged", 0),
    }),
    ("xenomai_oob_noheader_partial.txt", 4, {
        "26": ("IR-PCI-MSI-0000:00:19.0", "eno1", 406066),
        "18": ("IR-IO-APIC", "i801_smbus", 16),
        "24": ("SIRQC", "in-band irq work", 2954 + 2670 + 408790 + 18042),
        "524545": ("SIPIC", "EVL reschedule", 405980),
    }),
    ("old_kernel_2cpu_names_with_spaces.txt", 2, {
        "16": ("IO-APIC-level", "Intel EtherExpress Pro 10/100 Ethernet", 11184294 + 15940594),
        "12": ("IO-APIC-edge", "PS/2 Mouse", 5323 + 5793),
        "0": ("XT-PIC", "timer", 1366814704),
        "NMI": ("", "", 0),
    }),
    ("sysstat_root1_9cpu.txt", 9, {
        "24": ("PCI-MSI", "ahci[0000:00:1f.2]", 220950),
        "HVS": ("", "Hyper-V stimer0 interrupts", 0),
        "MIS": ("", "", 0),
    }),
    ("gve_2cpu_noheader_partial.txt", 2, {
        "24": ("PCI-MSI", "gve-ntfy-blk0@pci:0000:00:04.0", 65),
        "26": ("PCI-MSI", "gve-mgmnt@pci:0000:00:04.0", 0),
    }),
    ("SYNTHETIC_s390x_4cpu.txt", 4, {
        "I/O": ("", "", 2101 + 1893 + 1542 + 1977),
        "CLK": ("", "[EXT] Clock Comparator", 41238 + 32155 + 30113 + 31002),
        "4": ("PCI-MSI", "mlx5_comp0@pci:0001:00:00.0", 1201),
    }),
    ("SYNTHETIC_1152cpu_mlx5.txt", 1152, {
        "1001": ("PCI-MSIX-0000:81:00.0", "mlx5_comp0@pci:0000:81:00.0", 100003),
        "2005": ("PCI-MSIX-0000:c4:00.0", "nvme0q5", 42),
        "ERR": ("", "", 0),
    }),
]


@pytest.mark.parametrize("name,ncpu,expected", CASES, ids=[c[0] for c in CASES])
def test_every_capture_parses_with_columns_chip_name_and_counts(name, ncpu, expected):
    parsed = parse_interrupts((CAPTURES / name).read_text())
    assert len(parsed["cpus"]) == ncpu
    for key, (chip, action, total) in expected.items():
        row = parsed["irqs"][key]
        assert (row["chip"], row["name"], row["total"]) == (chip, action, total), key
    for key, row in parsed["irqs"].items():
        if key.isdigit():
            assert len(row["counts"]) == ncpu, key


def test_all_capture_files_are_in_the_table():
    assert sorted(p.name for p in CAPTURES.glob("*.txt")) == sorted(c[0] for c in CASES)


def test_header_column_ids_are_kept_when_cpus_are_offline():
    text = "           CPU0       CPU2       CPU5\n 40:  1  0  7   PCI-MSI 1-edge      eth0-TxRx-0\n"
    parsed = parse_interrupts(text)
    assert parsed["cpus"] == [0, 2, 5]
    assert per_cpu_counts(parsed["irqs"]["40"], parsed["cpus"]) == {0: 1, 5: 7}


@pytest.mark.parametrize("row,chip,name", [
    (" 45:  0  0   PCI-MSI 524288-edge", "PCI-MSI", ""),                                   # vector without a handler
    (" 45:  0  0   PCI-MSI 524288-edge      ", "PCI-MSI", ""),
    (" 11:  5  0   GICv3  27 Level     arch_timer", "GICv3", "arch_timer"),                  # GENERIC_IRQ_SHOW_LEVEL
    (" 16:  1  2   IO-APIC  16-fasteoi   uhci_hcd:usb5, ahci[0000:02:00.0]", "IO-APIC", "uhci_hcd:usb5, ahci[0000:02:00.0]"),
    ("120:  0  0   Hyper-V PCIe MSI 2701534461953-edge      mlx5_comp0@pci:4ea0:00:02.0", "Hyper-V PCIe MSI", "mlx5_comp0@pci:4ea0:00:02.0"),
    ("168:  0  0 PCI-MSIX-0000:00:08.0  30-edge      gve-ntfy-blk0@pci:0000:00:08.0", "PCI-MSIX-0000:00:08.0", "gve-ntfy-blk0@pci:0000:00:08.0"),
    ("IPI0:  10  20   Rescheduling interrupts", "", "Rescheduling interrupts"),
])
def test_row_layouts(row, chip, name):
    parsed = parse_interrupts("           CPU0       CPU1\n" + row + "\n")
    key = row.split(":")[0].strip()
    assert parsed["irqs"][key]["chip"] == chip
    assert parsed["irqs"][key]["name"] == name


def test_hyperv_chip_with_spaces_yields_the_mlx5_queue_index():
    parsed = parse_interrupts("   CPU0  CPU1\n 35:  0  43  Hyper-V PCIe MSI 2701534461954-edge      mlx5_comp1@pci:4ea0:00:02.0\n")
    entry = {"irq": 35, "name": parsed["irqs"]["35"]["name"]}
    classify_irqs([entry], "mlx5_core")
    assert (entry["kind"], entry["queue"]) == ("queue", 1)


def test_keys_filter_parses_only_the_requested_rows():
    text = (CAPTURES / "SYNTHETIC_1152cpu_mlx5.txt").read_text()
    parsed = parse_interrupts(text, keys=["1001", "1064"])
    assert sorted(parsed["irqs"]) == ["1001", "1064"]
    assert parsed["irqs"]["1064"]["counts"][1151] == 3


def test_no_header_counts_columns_from_the_widest_numeric_row():
    parsed = parse_interrupts(" 1:  4  5  6  IO-APIC 1-edge  i8042\nERR:  0\n")
    assert parsed["cpus"] == [0, 1, 2]
    assert parsed["irqs"]["ERR"]["counts"] == [0]


def test_bad_header_column_names_the_value():
    with pytest.raises(InterruptsError) as exc:
        parse_interrupts("   CPU0  CPUx\n 1: 0 0 X y\n")
    assert exc.value.details["value"] == "CPUx"


def test_empty_text_is_empty():
    assert parse_interrupts("") == {"cpus": [], "irqs": {}}
