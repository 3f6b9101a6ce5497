# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Grace and VM readiness (_platform) on generated trees, one per verdict, and on real captures of kernel logs and
of the vulnerabilities directory (tests/unit/fixtures/platform/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import iommu as _iommu
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import platform as _platform
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import platform_facts as _platform_facts
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.platform import PlatformError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "platform"
X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme msr hypervisor\n"
GRACE_CPUINFO = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
THP_NEW = ("always [madvise] never", "always defer defer+madvise [madvise] never")
THP_OLD = ("[always] madvise never", "always [madvise] never")
GRACE_CONFIG = "CONFIG_ARM_SMMU_V3=y\nCONFIG_TEGRA241_CMDQV=y\n"
# The real log without the lines of its probe failure (the mail's bug): what a healthy Grace boot prints.
FAILURE_MARKS = ("stream 67328 already in tree", "Failed to register iommu", "probe with driver")
# tegra241_cmdqv_probe(): dev_info(smmu->impl_dev, ...) with dev_fmt "tegra241_cmdqv: " on the ACPI companion device.
FALLBACK_LINE = "  acpi NVDA200C:04: tegra241_cmdqv: Falling back to standard SMMU CMDQ"


def w(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("%s\n" % text)


def make_tree(tmp_path, cpuinfo=X86_CPUINFO, dmi=None, thp=THP_NEW, cmdline="BOOT_IMAGE=/vmlinuz ro", iommu_groups=None,
              hugepages=None, smt=("on", 1), vulnerabilities=None):
    """T/proc and T/sys. ``hugepages``: {size_kb: {node: nr}}; ``iommu_groups``: a count or None (no directory);
    ``vulnerabilities``: ``grep . .../vulnerabilities/*`` text."""
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    w(procfs / "cpuinfo", cpuinfo)
    w(procfs / "cmdline", cmdline)
    for name, value in (dmi or {}).items():
        w(sysfs / "class/dmi/id" / name, value)
    if thp is not None:
        w(sysfs / "kernel/mm/transparent_hugepage/enabled", thp[0])
        w(sysfs / "kernel/mm/transparent_hugepage/defrag", thp[1])
    if iommu_groups is not None:
        (sysfs / "kernel/iommu_groups").mkdir(parents=True)
        for group in range(iommu_groups):
            (sysfs / "kernel/iommu_groups" / str(group) / "devices").mkdir(parents=True)
    for size, per_node in (hugepages or {}).items():
        base = sysfs / "kernel/mm/hugepages" / ("hugepages-%dkB" % size)
        total = sum(per_node.values())
        for name, value in (("nr_hugepages", total), ("free_hugepages", total), ("resv_hugepages", 0),
                            ("surplus_hugepages", 0), ("nr_overcommit_hugepages", 0)):
            w(base / name, value)
        for node, count in per_node.items():
            nbase = sysfs / "devices/system/node" / ("node%d" % node) / "hugepages" / ("hugepages-%dkB" % size)
            for name, value in (("nr_hugepages", count), ("free_hugepages", count), ("surplus_hugepages", 0)):
                w(nbase / name, value)
    if smt is not None:
        w(sysfs / "devices/system/cpu/smt/control", smt[0])
        w(sysfs / "devices/system/cpu/smt/active", smt[1])
    for name, text in _platform.parse_vulnerabilities_grep(vulnerabilities or "").items():
        w(sysfs / "devices/system/cpu/vulnerabilities" / name, text)
    return str(procfs), str(sysfs)


def by_check(findings):
    return dict((item["check"], item) for item in findings)


def real_log(healthy=True):
    text = (FIXTURES / "kernel_log_grace_arm_smmu_v3_cmdqv_lkml.txt").read_text()
    if healthy:
        text = "\n".join(line for line in text.splitlines() if not any(mark in line for mark in FAILURE_MARKS))
    return text


def fallback_log():
    """The real log as a kernel that could not set the CMDQV up prints it: no VCMDQ queues, the fallback line."""
    lines = [line for line in real_log().splitlines() if "vcmdq" not in line]
    return "\n".join(lines[:1] + [FALLBACK_LINE] + lines[1:])


# ------------------------------------------------------------------ composed --

def test_x86_vm_cmdqv_is_not_applicable_never_pass(tmp_path):
    procfs, sysfs = make_tree(tmp_path, dmi={"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"},
                              iommu_groups=0, vulnerabilities=(FIXTURES / "vulnerabilities_x86_smt_disabled_runperf.txt").read_text())
    facts = _platform_facts.platform_facts(procfs, sysfs, page_size="4096\n", kernel_log=real_log(), kernel_config=GRACE_CONFIG)
    found = by_check(facts["findings"])
    assert facts["architecture"] == "x86_64" and facts["architecture_source"] == "cpuinfo"
    assert facts["virtualisation"]["virtualized"] is True and facts["virtualisation"]["type"] == "qemu"
    assert found["cmdqv"]["status"] == "not_applicable" and found["smmuv3"]["status"] == "not_applicable"
    assert found["page_size"]["status"] == "pass" and facts["page_size"] == 4096
    assert found["iommu"]["status"] == "warn"
    assert found["mitigations"]["status"] == "pass"
    checks = ["architecture", "virtualisation", "page_size", "hugepages", "transparent_hugepages", "iommu", "smmuv3", "cmdqv",
              "smt", "mitigations"]
    assert [f["check"] for f in facts["findings"]] == checks
    for item in facts["findings"]:
        assert set(item) == {"check", "status", "message", "evidence", "fix"} and item["status"] in _platform.STATUSES
    assert "findings" not in facts["thp"] and "findings" not in facts["smmu"]


def test_grace_with_cmdqv_lines_passes(tmp_path):
    procfs, sysfs = make_tree(tmp_path, cpuinfo=GRACE_CPUINFO, iommu_groups=22, smt=("notsupported", 0),
                              cmdline="BOOT_IMAGE=/vmlinuz-6.8.0-1013-nvidia-64k ro iommu.passthrough=1")
    facts = _platform_facts.platform_facts(procfs, sysfs, page_size=65536, kernel_log=real_log(), kernel_config=GRACE_CONFIG)
    found = by_check(facts["findings"])
    assert facts["architecture"] == "aarch64"
    assert found["virtualisation"]["status"] == "pass" and facts["virtualisation"]["virtualized"] is False
    assert found["page_size"]["status"] == "pass"
    assert found["smmuv3"]["status"] == "pass"
    assert found["cmdqv"]["status"] == "pass", found["cmdqv"]
    assert facts["smmu"]["log"]["companions"] == [{"smmu": "arm-smmu-v3.9.auto", "cmdqv": "NVDA200C:04"}]
    assert facts["smmu"]["log"]["vcmdqs"] == [{"smmu": "arm-smmu-v3.9.auto", "queue": "vcmdq0", "entries": 524288},
                                              {"smmu": "arm-smmu-v3.9.auto", "queue": "vcmdq1", "entries": 524288}]
    assert facts["smmu"]["config"] == {"CONFIG_ARM_SMMU_V3": "y", "CONFIG_TEGRA241_CMDQV": "y"}
    assert found["smt"]["status"] == "not_applicable"
    assert facts["iommu"]["mode"] == "passthrough" and facts["iommu"]["groups"] == 22 and found["iommu"]["status"] == "pass"


def test_grace_machine_argument_wins_over_cpuinfo(tmp_path):
    procfs, sysfs = make_tree(tmp_path, cpuinfo="processor\t: 0\n")
    facts = _platform_facts.platform_facts(procfs, sysfs, machine="arm64\n", page_size="4096")
    found = by_check(facts["findings"])
    assert facts["architecture"] == "aarch64" and facts["architecture_source"] == "uname"
    assert found["page_size"]["status"] == "warn" and "64k" in found["page_size"]["fix"]
    assert found["cmdqv"]["status"] == "unknown" and found["smmuv3"]["status"] == "unknown"


def test_unknown_architecture(tmp_path):
    procfs, sysfs = make_tree(tmp_path, cpuinfo="processor\t: 0\n")
    facts = _platform_facts.platform_facts(procfs, sysfs)
    found = by_check(facts["findings"])
    assert facts["architecture"] is None and found["architecture"]["status"] == "unknown"
    assert found["cmdqv"]["status"] == "unknown" and found["page_size"]["status"] == "unknown"


@pytest.mark.parametrize("machine", ["", "x86 64", 5])
def test_bad_machine_raises(tmp_path, machine):
    procfs, sysfs = make_tree(tmp_path)
    with pytest.raises(PlatformError) as info:
        _platform_facts.platform_facts(procfs, sysfs, machine=machine)
    assert info.value.details["option"] == "machine"


# ------------------------------------------------------------- SMMUv3/CMDQV --

def test_real_log_probe_failure_fails_both():
    result = _iommu.read_smmu("aarch64", real_log(healthy=False), GRACE_CONFIG)
    found = by_check(result["findings"])
    assert found["smmuv3"]["status"] == "fail" and found["cmdqv"]["status"] == "fail"
    assert any("failed with error -22" in line for line in found["smmuv3"]["evidence"])


def test_fallback_line_warns():
    result = _iommu.read_smmu("aarch64", fallback_log(), GRACE_CONFIG)
    found = by_check(result["findings"])
    assert found["smmuv3"]["status"] == "pass"
    assert found["cmdqv"]["status"] == "warn" and FALLBACK_LINE.strip() in found["cmdqv"]["evidence"]
    assert result["log"]["vcmdqs"] == []


def test_disable_cmdqv_warns():
    log = real_log().replace("found companion CMDQV device: NVDA200C:04",
                             "found companion CMDQV device: NVDA200C:04\n  arm-smmu-v3 arm-smmu-v3.9.auto: tegra241_cmdqv: "
                             "Detected disable_cmdqv=true")
    found = by_check(_iommu.read_smmu("aarch64", log)["findings"])
    assert found["cmdqv"]["status"] == "warn" and "disable_cmdqv" in found["cmdqv"]["message"]


def test_journal_prefix_and_older_companion_format():
    log = ("Mar 02 10:00:01 grace01 kernel: arm-smmu-v3 arm-smmu-v3.0.auto: found companion CMDQV device, NVDA200C:00\n"
           "[    2.123456] arm-smmu-v3 arm-smmu-v3.0.auto: allocated 524288 entries for vcmdq0\n")
    result = _iommu.read_smmu("aarch64", log)
    assert result["log"]["companions"] == [{"smmu": "arm-smmu-v3.0.auto", "cmdqv": "NVDA200C:00"}]
    assert by_check(result["findings"])["cmdqv"]["status"] == "pass"


def test_kernel_without_cmdqv_driver_warns():
    log = "\n".join(line for line in real_log().splitlines() if "CMDQV" not in line and "vcmdq" not in line)
    found = by_check(_iommu.read_smmu("aarch64", log, "CONFIG_ARM_SMMU_V3=y\n# CONFIG_TEGRA241_CMDQV is not set\n")["findings"])
    assert found["cmdqv"]["status"] == "warn" and "CONFIG_TEGRA241_CMDQV=n" in found["cmdqv"]["evidence"]


def test_smmu_without_companion_is_not_applicable_with_driver_built_else_unknown():
    log = "\n".join(line for line in real_log().splitlines() if "CMDQV" not in line and "vcmdq" not in line)
    assert by_check(_iommu.read_smmu("aarch64", log, GRACE_CONFIG)["findings"])["cmdqv"]["status"] == "not_applicable"
    assert by_check(_iommu.read_smmu("aarch64", log)["findings"])["cmdqv"]["status"] == "unknown"


def test_no_smmu_lines_warns():
    found = by_check(_iommu.read_smmu("aarch64", "Booting Linux on physical CPU 0x0000000000 [0x410fd4f0]\n")["findings"])
    assert found["smmuv3"]["status"] == "warn"


def test_kernel_text_must_be_text():
    with pytest.raises(PlatformError):
        _iommu.read_smmu("aarch64", kernel_log=b"arm-smmu-v3")
    with pytest.raises(PlatformError):
        _iommu.read_smmu("aarch64", kernel_config=["CONFIG_TEGRA241_CMDQV=y"])


# ---------------------------------------------------------------- page size --

@pytest.mark.parametrize("value,expected", [("65536\n", 65536), (4096, 4096), (" 16384 ", 16384), (None, None)])
def test_page_size_parses(value, expected):
    assert _platform.parse_page_size(value) == expected


@pytest.mark.parametrize("value", ["abc", "", "3000", 0, -4096, True, 4096.0, "64k"])
def test_bad_page_size_raises(value):
    with pytest.raises(PlatformError) as info:
        _platform.parse_page_size(value)
    assert info.value.details["option"] == "page_size"


# -------------------------------------------------------------- THP, pools --

@pytest.mark.parametrize("thp,defrag,fmt,status", [
    (THP_NEW, "madvise", "current", "pass"),
    (THP_OLD, "madvise", "old", "pass"),
    (("always madvise [never]", "always defer defer+madvise [madvise] never"), "madvise", "current", "warn"),
    (("[always] madvise never", "[always] defer defer+madvise madvise never"), "always", "current", "warn"),
    (("[always] madvise never", "[always] madvise never"), "always", "old", "warn"),
])
def test_thp_formats(tmp_path, thp, defrag, fmt, status):
    procfs, sysfs = make_tree(tmp_path, thp=thp)
    result = _platform.read_thp(sysfs)
    assert result["defrag"] == defrag and result["defrag_format"] == fmt
    assert len(result["defrag_options"]) == (5 if fmt == "current" else 3)
    assert result["findings"][0]["status"] == status
    assert procfs


def test_thp_missing_is_unknown(tmp_path):
    dummy, sysfs = make_tree(tmp_path, thp=None)
    result = _platform.read_thp(sysfs)
    assert result["enabled"] is None and result["findings"][0]["status"] == "unknown"
    assert dummy


@pytest.mark.parametrize("text", ["always madvise never", "[always] [madvise] never", "[always] sometimes never", ""])
def test_bad_thp_text_raises(text):
    with pytest.raises(PlatformError):
        _platform.parse_choice(text, "enabled", _platform.THP_ENABLED)


def test_hugepage_pools_per_node(tmp_path):
    dummy, sysfs = make_tree(tmp_path, hugepages={2048: {0: 512, 1: 512}, 1048576: {0: 0, 1: 0}})
    result = _platform.read_hugepages(sysfs)
    assert result["sizes_kb"] == [2048, 1048576]
    assert result["pools"][0]["nr_hugepages"] == 1024 and result["pools"][0]["free_hugepages"] == 1024
    assert [(r["node"], r["size_kb"], r["nr_hugepages"]) for r in result["nodes"]] == [
        (0, 2048, 512), (1, 2048, 512), (0, 1048576, 0), (1, 1048576, 0)]
    assert result["findings"][0]["status"] == "pass" and "1024 x 2048 kB" in result["findings"][0]["message"]
    assert dummy


def test_hugepages_on_one_node_only_warn(tmp_path):
    dummy, sysfs = make_tree(tmp_path, hugepages={1048576: {0: 16, 1: 0}, 2048: {0: 0, 1: 0}})
    found = _platform.read_hugepages(sysfs)["findings"][0]
    assert found["status"] == "warn" and "1048576 kB on node 0 only" in found["message"]
    assert dummy


def test_no_hugepages_is_unknown(tmp_path):
    dummy, sysfs = make_tree(tmp_path)
    assert _platform.read_hugepages(sysfs)["findings"][0]["status"] == "unknown"
    assert dummy


# -------------------------------------------------------------------- IOMMU --

@pytest.mark.parametrize("cmdline,mode,strict", [
    ("ro quiet", "default", None),
    ("ro iommu=pt", "passthrough", None),
    ("intel_iommu=on iommu=pt", "passthrough", None),
    ("intel_iommu=on,sm_on", "on", None),
    ("amd_iommu=off", "off", None),
    ("iommu=off", "off", None),
    ("iommu.passthrough=1 iommu.strict=0", "passthrough", False),
    ("iommu.passthrough=0 iommu.strict=1", "translated", True),
    ('root=/dev/sda1 "iommu=nopt"', "translated", None),
])
def test_iommu_cmdline(cmdline, mode, strict):
    result = _iommu.parse_iommu_cmdline(cmdline)
    assert result["mode"] == mode and result["strict"] == strict


def test_iommu_groups_and_findings(tmp_path):
    procfs, sysfs = make_tree(tmp_path, cmdline="ro intel_iommu=on iommu=pt", iommu_groups=3)
    result = _iommu.read_iommu(procfs, sysfs)
    assert result["groups"] == 3 and result["params"] == {"intel_iommu": "on", "iommu": "pt"}
    assert result["findings"][0]["status"] == "pass"
    assert _iommu.read_iommu(procfs, sysfs, cmdline="iommu=off")["findings"][0]["status"] == "warn"


def test_iommu_without_groups_dir_is_unknown(tmp_path):
    procfs, sysfs = make_tree(tmp_path)
    result = _iommu.read_iommu(procfs, sysfs)
    assert result["groups"] is None and result["findings"][0]["status"] == "unknown"


# ---------------------------------------------------------------------- SMT --

@pytest.mark.parametrize("control,status", [("on", "pass"), ("off", "pass"), ("forceoff", "pass"),
                                            ("notsupported", "not_applicable"), ("notimplemented", "not_applicable")])
def test_smt_controls(tmp_path, control, status):
    dummy, sysfs = make_tree(tmp_path, smt=(control, 1 if control == "on" else 0))
    result = _platform.read_smt(sysfs)
    assert result["control"] == control and result["findings"][0]["status"] == status
    assert dummy


def test_smt_bad_value_raises_and_missing_is_unknown(tmp_path):
    dummy, sysfs = make_tree(tmp_path, smt=("enabled", 1))
    with pytest.raises(PlatformError) as info:
        _platform.read_smt(sysfs)
    assert info.value.value == "enabled"
    dummy, sysfs = make_tree(tmp_path / "b", smt=None)
    assert _platform.read_smt(sysfs)["findings"][0]["status"] == "unknown"
    assert dummy


# -------------------------------------------------------------- mitigations --

def test_real_capture_all_mitigated(tmp_path):
    dummy, sysfs = make_tree(tmp_path, vulnerabilities=(FIXTURES / "vulnerabilities_x86_smt_disabled_runperf.txt").read_text())
    result = _platform.read_mitigations(sysfs)
    assert len(result["vulnerabilities"]) == 9
    assert set(item["state"] for item in result["vulnerabilities"].values()) == {"mitigated"}
    assert result["vulnerabilities"]["itlb_multihit"]["text"] == "KVM: Mitigation: VMX disabled"
    assert result["vulnerable"] == [] and result["findings"][0]["status"] == "pass"
    assert dummy


def test_real_capture_mitigations_off(tmp_path):
    dummy, sysfs = make_tree(tmp_path, vulnerabilities=(FIXTURES / "vulnerabilities_x86_mitigations_off_tutorial.txt").read_text())
    result = _platform.read_mitigations(sysfs)
    states = dict((name, item["state"]) for name, item in result["vulnerabilities"].items())
    assert states == {"l1tf": "mitigated", "mds": "vulnerable", "meltdown": "vulnerable", "spec_store_bypass": "vulnerable",
                      "spectre_v1": "mitigated", "spectre_v2": "vulnerable"}
    assert result["findings"][0]["status"] == "warn"
    assert result["findings"][0]["message"] == "vulnerable: mds, meltdown, spec_store_bypass, spectre_v2"
    assert dummy


def test_real_capture_vm_with_unknown_and_not_affected(tmp_path):
    dummy, sysfs = make_tree(tmp_path, vulnerabilities=(FIXTURES / "vulnerabilities_x86_vm_unknown_hypervisor.txt").read_text())
    result = _platform.read_mitigations(sysfs)
    states = dict((name, item["state"]) for name, item in result["vulnerabilities"].items())
    assert states["gather_data_sampling"] == "unknown" and states["itlb_multihit"] == "not_affected"
    assert states["l1tf"] == "mitigated" and states["indirect_target_selection"] == "vulnerable"
    assert result["vulnerable"] == ["indirect_target_selection", "meltdown", "spectre_v2"]
    assert dummy


@pytest.mark.parametrize("text,state", [("Not affected", "not_affected"), ("Vulnerable", "vulnerable"),
                                        ("Vulnerable: Safe RET, no microcode", "vulnerable"),
                                        ("Mitigation: PTI", "mitigated"), ("KVM: Vulnerable", "vulnerable"),
                                        ("Processor vulnerable", "vulnerable"), ("Unknown: No mitigations", "unknown"),
                                        ("Mitigation PTI", "unknown")])
def test_vulnerability_prefixes(text, state):
    assert _platform.classify_vulnerability(text) == state


def test_no_vulnerabilities_dir_is_unknown(tmp_path):
    dummy, sysfs = make_tree(tmp_path)
    assert _platform.read_mitigations(sysfs)["findings"][0]["status"] == "unknown"
    assert dummy


def test_bad_grep_line_raises():
    with pytest.raises(PlatformError):
        _platform.parse_vulnerabilities_grep("meltdown Mitigation: PTI")


def test_finding_rejects_unknown_status():
    with pytest.raises(PlatformError):
        _platform.finding("x", "ok", "message")


# -------------------------------------------- SMT clauses (issue 29, class 3) --

def test_real_capture_smt_vulnerable_is_reported(tmp_path):
    """A node whose MDS/TAA/L1TF mitigations leave the sibling thread open warns and names them (was: pass)."""
    text = (FIXTURES / "vulnerabilities_x86_smt_vulnerable_debian_microcode.txt").read_text()
    dummy, sysfs = make_tree(tmp_path, vulnerabilities=text)
    result = _platform.read_mitigations(sysfs)
    assert result["vulnerable"] == []
    assert result["smt_vulnerable"] == ["l1tf", "mds", "tsx_async_abort"]
    assert result["vulnerabilities"]["mds"]["state"] == "mitigated" and result["vulnerabilities"]["mds"]["smt"] == "vulnerable"
    found = result["findings"][0]
    assert found["status"] == "warn"
    assert "SMT vulnerable" in found["message"] and "l1tf, mds, tsx_async_abort" in found["message"]
    assert "nosmt" in found["fix"]
    assert dummy


# Every SMT clause bugs.c prints (tests/unit/fixtures/platform/README.md, "SMT clauses").
@pytest.mark.parametrize("text,smt", [
    ("Mitigation: Clear CPU buffers; SMT vulnerable", "vulnerable"),
    ("Mitigation: Clear CPU buffers; SMT disabled", "disabled"),
    ("Mitigation: Clear CPU buffers; SMT mitigated", "mitigated"),
    ("Mitigation: Clear CPU buffers; SMT Host state unknown", "host_state_unknown"),
    ("Mitigation: untrained return thunk; SMT enabled with STIBP protection", "stibp"),
    ("Mitigation: untrained return thunk; SMT vulnerable", "vulnerable"),
    ("Mitigation: PTE Inversion; VMX: conditional cache flushes, SMT vulnerable", "vulnerable"),
    ("Mitigation: PTE Inversion; VMX: cache flushes, SMT disabled", "disabled"),
    ("Vulnerable; SMT vulnerable", "vulnerable"),
    ("Mitigation: PTI", None),
    ("Vulnerable, IBPB: disabled, STIBP: disabled", None),
])
def test_smt_clauses(text, smt):
    assert _platform.smt_clause(text) == smt


@pytest.mark.parametrize("clause,status", [("SMT vulnerable", "warn"), ("SMT disabled", "pass"), ("SMT mitigated", "pass"),
                                           ("SMT Host state unknown", "pass")])
def test_smt_clause_decides_the_verdict(tmp_path, clause, status):
    dummy, sysfs = make_tree(tmp_path, vulnerabilities="/sys/devices/system/cpu/vulnerabilities/mds:Mitigation: Clear CPU "
                                                       "buffers; %s\n" % clause)
    found = _platform.read_mitigations(sysfs)["findings"][0]
    assert found["status"] == status
    if clause == "SMT Host state unknown":
        assert "SMT state of the host unknown to this guest: mds" in found["message"]
    assert dummy


# ------------------------------------ the fix for the running command line (issue 29, trip 7) --

@pytest.mark.parametrize("cmdline,says,never", [
    ("BOOT_IMAGE=/vmlinuz ro mitigations=auto", ["turns no mitigation off (it runs mitigations=auto)", "microcode"],
     ["drop"]),
    ("BOOT_IMAGE=/vmlinuz ro quiet", ["the default, mitigations=auto", "microcode"], ["drop"]),
    ("BOOT_IMAGE=/vmlinuz ro mitigations=off", ["command line has mitigations=off: drop it"], []),
    ("ro mitigations=off mitigations=auto", ["turns no mitigation off (it runs mitigations=auto)"], ["drop"]),
    ("ro mds=off nopti", ["command line has mds=off nopti: drop them"], ["mitigations=off"]),
])
def test_the_mitigations_fix_says_what_is_true_for_the_running_command_line(tmp_path, cmdline, says, never):
    """The real capture of a vulnerable node; the fix names mitigations=off only where the node booted with it."""
    procfs, sysfs = make_tree(tmp_path, cmdline=cmdline,
                              vulnerabilities=(FIXTURES / "vulnerabilities_x86_mitigations_off_tutorial.txt").read_text())
    found = [f for f in _platform_facts.platform_facts(str(procfs), str(sysfs), page_size=4096)["findings"]
             if f["check"] == "mitigations"][0]
    assert found["status"] == "warn"
    assert all(text in found["fix"] for text in says), found["fix"]
    assert not any(text in found["fix"] for text in never), found["fix"]


def test_the_mitigations_fix_without_a_command_line_does_not_claim_one():
    assert _platform.mitigations_fix(None).startswith("update the kernel and microcode; if the kernel command line")
