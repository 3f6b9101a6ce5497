# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""platform_facts and gpu_health through their main(), on generated trees with the real captures of
tests/unit/fixtures/{platform,gpu_health} as their command outputs. The lab (molecule preflight) runs both on a real
kernel without a GPU."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.modules import gpu_health, platform_facts

pytestmark = pytest.mark.usefixtures("fake_exits")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMI = FIXTURES / "gpu_health" / "nvidia_smi"
DCGMI = FIXTURES / "gpu_health" / "dcgmi"
GRACE_CPUINFO = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme msr hypervisor\n"


def w(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("%s\n" % text)


def platform_tree(tmp_path, cpuinfo=X86_CPUINFO):
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    w(procfs / "cpuinfo", cpuinfo)
    w(procfs / "cmdline", "BOOT_IMAGE=/vmlinuz ro iommu.passthrough=1")
    w(procfs / "sys/kernel/osrelease", "6.8.0-1013-nvidia-64k")
    w(sysfs / "devices/system/cpu/online", "0-3")
    w(sysfs / "devices/system/cpu/smt/control", "notsupported")
    w(sysfs / "devices/system/cpu/vulnerabilities/meltdown", "Not affected")
    w(sysfs / "kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    w(sysfs / "kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never")
    return procfs, sysfs


def statuses(findings):
    return dict((f["check"], f["status"]) for f in findings)


def test_platform_grace_tree_reads_the_boot_config_and_the_given_log(tmp_path):
    procfs, sysfs = platform_tree(tmp_path, GRACE_CPUINFO)
    w(tmp_path / "boot/config-6.8.0-1013-nvidia-64k", "CONFIG_ARM_SMMU_V3=y\n# CONFIG_TEGRA241_CMDQV is not set")
    log = FIXTURES / "platform" / "kernel_log_grace_arm_smmu_v3_cmdqv_lkml.txt"
    kind, res = modharness.run(platform_facts, dict(procfs_path=str(procfs), sysfs_path=str(sysfs), page_size=65536,
                                                    kernel_log_path=str(log)))
    assert kind is Exit and res["changed"] is False
    assert res["architecture"] == "aarch64" and res["page_size"] == 65536
    got = statuses(res["findings"])
    # The real log is of a failed SMMUv3 probe: both SMMU checks fail, and the config was read from boot/.
    assert got["page_size"] == "pass" and got["smmuv3"] == "fail" and got["cmdqv"] == "fail"
    assert res["sources"]["kernel_config"].endswith("boot/config-6.8.0-1013-nvidia-64k")
    assert res["smmu"]["config"]["CONFIG_TEGRA241_CMDQV"] == "n"
    assert res["ansible_facts"]["platform"]["findings"] == res["findings"]


def test_platform_x86_tree_smmu_not_applicable_and_no_page_size_is_unknown(tmp_path):
    procfs, sysfs = platform_tree(tmp_path)
    with gzip.open(procfs / "config.gz", "wt") as handle:
        handle.write("CONFIG_X86=y\n")
    kind, res = modharness.run(platform_facts, dict(procfs_path=str(procfs), sysfs_path=str(sysfs)))
    got = statuses(res["findings"])
    assert kind is Exit and got["smmuv3"] == "not_applicable" and got["cmdqv"] == "not_applicable"
    assert got["page_size"] == "unknown" and res["sources"]["kernel_config"].endswith("config.gz")
    assert res["smt"]["control"] == "notsupported" and got["smt"] == "not_applicable"


@pytest.mark.parametrize("args,option", [
    (dict(page_size=3000), "page_size"),
    (dict(kernel_log_path="/nonexistent/dmesg.txt"), "kernel_log_path"),
    (dict(kernel_config_path="/nonexistent/config"), "kernel_config_path"),
])
def test_platform_bad_input_names_the_option(tmp_path, args, option):
    procfs, sysfs = platform_tree(tmp_path)
    kind, res = modharness.run(platform_facts, dict(procfs_path=str(procfs), sysfs_path=str(sysfs), **args))
    assert kind is Fail and res["option"] == option and str(res["value"]) in res["msg"]


def gpu_tree(tmp_path, gpus=1, other=True):
    sysfs = tmp_path / "sys"
    for index in range(gpus):
        dev = sysfs / "bus/pci/devices" / ("0000:%02x:00.0" % (0x17 + index))
        w(dev / "vendor", "0x10de")
        w(dev / "class", "0x030200")
    if other:
        # An NVIDIA device that is not a GPU (an NVSwitch bridge, class 0680) and a NIC: neither counts.
        w(sysfs / "bus/pci/devices/0000:05:00.0/vendor", "0x10de")
        w(sysfs / "bus/pci/devices/0000:05:00.0/class", "0x068000")
        w(sysfs / "bus/pci/devices/0000:06:00.0/vendor", "0x15b3")
        w(sysfs / "bus/pci/devices/0000:06:00.0/class", "0x020000")
    (sysfs / "bus").mkdir(parents=True, exist_ok=True)
    return str(sysfs)


def test_gpu_health_real_a100_capture(tmp_path):
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path), nvidia_smi_xml_path=str(SMI / "telegraf_a100-sxm4-v12.xml")))
    assert kind is Exit and res["changed"] is False
    assert res["pci_gpus"] == ["0000:17:00.0"]
    first = res["findings"][0]
    assert first["check"] == "gpu_present" and first["status"] == "pass" and "A100" in first["message"]
    got = statuses(res["findings"])
    assert got["persistence_mode"] == "warn" and got["ecc_uncorrectable"] == "pass"
    assert res["nvidia_smi"]["dtd_version"] == "v12" and res["dcgm"] is None


def test_gpu_health_gpu_missing_from_nvidia_smi_fails(tmp_path):
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path, gpus=2), nvidia_smi_xml_path=str(SMI / "telegraf_a100-sxm4-v12.xml")))
    assert res["findings"][0]["status"] == "fail" and "lists 1 GPU(s), the PCI bus has 2" in res["findings"][0]["message"]


def test_gpu_health_no_gpu_is_not_applicable_and_gpu_without_driver_fails(tmp_path):
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path / "a", gpus=0)))
    assert kind is Exit and [statuses(res["findings"])] == [{"gpu_present": "not_applicable"}]
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path / "b", gpus=1)))
    assert res["findings"][0]["status"] == "fail" and res["findings"][0]["evidence"]["pci_nvidia_gpus"] == ["0000:17:00.0"]


def test_gpu_health_output_that_is_not_xml_fails_the_check_not_the_module(tmp_path):
    bad = tmp_path / "smi.xml"
    bad.write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path), nvidia_smi_xml_path=str(bad)))
    assert kind is Exit and res["findings"][0]["status"] == "fail" and "not XML" in res["findings"][0]["message"]


def test_gpu_health_real_dcgm_capture_skip_is_not_a_pass(tmp_path):
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path, gpus=0),
                                                dcgmi_output_path=str(DCGMI / "dcgm_p100_level2_skip_all_ornl_doc.txt")))
    dcgm = [f for f in res["findings"] if f["check"].startswith("dcgm:")]
    assert kind is Exit and dcgm and res["dcgm"]["layout"] == "2.x/3.x"
    assert "pass" not in {f["status"] for f in dcgm if "Skip" in f["message"]}
    assert any(f["status"] == "not_applicable" for f in dcgm)


def test_gpu_health_bad_input(tmp_path):
    kind, res = modharness.run(gpu_health, dict(sysfs_path=gpu_tree(tmp_path), nvidia_smi_xml_path=str(tmp_path / "missing.xml")))
    assert kind is Fail and res["option"] == "nvidia_smi_xml_path" and "missing.xml" in res["msg"]
    kind, res = modharness.run(gpu_health, dict(sysfs_path=str(tmp_path / "nosys")))
    assert kind is Fail and res["option"] == "sysfs_path"
