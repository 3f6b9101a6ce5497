# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The idle and frequency verdicts of cpu_power_facts on real cpupower state tables turned into sysfs trees
(tests/unit/cpuidle_tree.py) and on generated trees, one per cause; the virtualisation detection; the busy-core
arithmetic; and the whole module's result through its composition (_cpu_power)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import freq as _cpu_freq
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import idle as _cpu_idle
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu import power as _cpu_power
from ansible_collections.gpunode.tuning.plugins.module_utils._host import virt as _virt
from cpupower_capture import parse_idle_info

from cpuidle_tree import sysfs_from_idle_info

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cpu_power" / "cpupower"
BARE = {"virtualized": False, "type": "none", "evidence": []}
KVM = {"virtualized": True, "type": "kvm", "evidence": []}


def w(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("%s\n" % text)


def tree(tmp_path, capture, cpus="0-3", cmdline="BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro", dmi=None):
    """T/sys from a real cpupower idle-info capture, T/proc with cmdline, cpuinfo and one process."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    sysfs_from_idle_info(parse_idle_info((FIXTURES / capture).read_text()), cpus, sysfs)
    w(procfs / "cmdline", cmdline)
    w(procfs / "cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme msr\n")
    w(procfs / "1" / "comm", "systemd")
    (procfs / "1" / "fd").mkdir(parents=True)
    for name, value in (dmi or {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR"}).items():
        w(sysfs / "class/dmi/id" / name, value)
    return sysfs, procfs


def judge(sysfs, procfs, virt=None):
    idle = _cpu_idle.read_idle(str(sysfs), str(procfs), dev=str(sysfs.parent / "dev"), root=str(sysfs.parent))
    return _cpu_idle.judge_idle(idle, virt or _virt.detect_virt(str(sysfs), str(procfs)))


def causes(result):
    return [c["cause"] for c in result["causes"]]


# ---- idle, on real state tables --------------------------------------------------------------------------------

def test_intel_server_with_c6_enabled_is_deep_reachable(tmp_path):
    res = judge(*tree(tmp_path, "idle_intel_idle_server_c6.txt"))
    assert res["verdict"] == "deep_cstate_reachable", res
    assert res["deepest_enabled"] == "C6" and res["causes"] == []
    assert [s["name"] for s in res["states_cpu0"]] == ["POLL", "C1", "C1E", "C6"]
    assert res["reachable_cpus"] == "0-3"


def test_c6_disabled_in_sysfs_is_limited_and_names_the_state_and_cpus(tmp_path):
    res = judge(*tree(tmp_path, "idle_intel_idle_c6_disabled.txt"))
    assert res["verdict"] == "limited"
    cause = [c for c in res["causes"] if c["cause"] == "sysfs_disabled"][0]
    assert cause["states"] == ["C6"] and cause["cpus"] == "0-3"
    # C1E is halt-class: it does not count as a deep state that is still reachable.
    assert res["deepest_enabled"] is None
    assert any("disabled" in n for n in res["notes"])


def test_amd_acpi_idle_c2_is_deep(tmp_path):
    res = judge(*tree(tmp_path, "idle_amd_acpi_idle_c2.txt"))
    assert res["verdict"] == "deep_cstate_reachable" and res["deepest_enabled"] == "C2"


def test_poll_and_c1_only_with_kernel_limits_names_the_parameters(tmp_path):
    res = judge(*tree(tmp_path, "idle_amd_acpi_idle_max_cstate1_poll_c1.txt",
                      cmdline="BOOT_IMAGE=/vmlinuz ro processor.max_cstate=1 intel_idle.max_cstate=0"))
    assert res["verdict"] == "limited"
    assert sorted(c["param"] for c in res["causes"] if c["cause"] == "kernel_parameter") == \
        ["intel_idle.max_cstate=0", "processor.max_cstate=1"]
    # NVIDIA dgxc-benchmarking's rule: two or fewer states on CPU 0.
    assert any("2 idle state(s)" in n and "check_cpu_cstates" in n for n in res["notes"])


def test_poll_and_c1_only_without_kernel_limits_is_the_bios(tmp_path):
    res = judge(*tree(tmp_path, "idle_amd_acpi_idle_max_cstate1_poll_c1.txt"))
    assert causes(res) == ["bios"]
    assert "C1 (1 us exit latency" in res["causes"][0]["message"] and "firmware" in res["causes"][0]["message"]


def test_no_states_with_idle_poll_on_bare_metal(tmp_path):
    res = judge(*tree(tmp_path, "idle_driver_none_idle_poll.txt", cmdline="ro idle=poll"))
    assert res["verdict"] == "limited" and causes(res) == ["kernel_parameter"]
    assert res["causes"][0]["param"] == "idle=poll"


def test_no_states_on_bare_metal_without_limits_is_no_driver(tmp_path):
    res = judge(*tree(tmp_path, "idle_driver_none_idle_poll.txt"))
    assert res["verdict"] == "limited" and causes(res) == ["no_driver"]


def test_no_states_in_a_qemu_guest_is_not_visible_never_a_pass(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_driver_none_idle_poll.txt",
                         dmi={"sys_vendor": "QEMU", "product_name": "Standard PC (i440FX + PIIX, 1996)"})
    res = judge(sysfs, procfs)
    assert res["verdict"] == "not_visible" and causes(res) == ["vm"]
    assert "host" in res["causes"][0]["message"]


def test_haltpoll_is_a_vm_even_without_dmi(tmp_path):
    res = judge(*tree(tmp_path, "SYNTHETIC_idle_kvm_guest_haltpoll.txt", dmi={}), virt=BARE)
    assert res["verdict"] == "not_visible" and "haltpoll" in res["causes"][0]["message"]


# ---- idle, one generated cause each ----------------------------------------------------------------------------

def test_pm_qos_request_below_every_deep_state_names_its_holder(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "cpu_dma_latency").write_bytes(struct.pack("=i", 0))
    w(procfs / "4242" / "comm", "tuned")
    (procfs / "4242" / "fd").mkdir(parents=True)
    os.symlink("/dev/cpu_dma_latency", str(procfs / "4242" / "fd" / "7"))
    res = judge(sysfs, procfs)
    assert res["verdict"] == "limited"
    cause = [c for c in res["causes"] if c["cause"] == "pm_qos"][0]
    assert cause["value_us"] == 0 and cause["holders"] == [{"pid": 4242, "comm": "tuned"}]
    assert "tuned (pid 4242)" in cause["message"]


def test_default_pm_qos_value_is_no_limit(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "cpu_dma_latency").write_bytes(struct.pack("=i", _cpu_idle.CPU_DMA_LATENCY_DEFAULT))
    assert judge(sysfs, procfs)["verdict"] == "deep_cstate_reachable"


def test_resume_latency_na_keeps_those_cpus_shallow(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    for cpu, value in ((0, "0"), (1, "n/a"), (2, "10"), (3, "0")):
        w(sysfs / ("devices/system/cpu/cpu%d/power/pm_qos_resume_latency_us" % cpu), value)
    res = judge(sysfs, procfs)
    cause = [c for c in res["causes"] if c["cause"] == "resume_latency"][0]
    assert res["verdict"] == "limited" and cause["cpus"] == "1-2"


def test_ladder_governor_behind_a_disabled_c1_blocks_c6_without_saying_so(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    w(sysfs / "devices/system/cpu/cpuidle/current_governor", "ladder")
    w(sysfs / "devices/system/cpu/cpu2/cpuidle/state1/disable", "1")
    res = judge(sysfs, procfs)
    ladder = [c for c in res["causes"] if c["cause"] == "ladder"][0]
    assert ladder["cpus"] == "2" and "C6" in ladder["message"]
    assert res["verdict"] == "limited" and res["reachable_cpus"] == "0-1,3"


def test_tuned_force_latency_counts_only_while_tuned_runs(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    w(tmp_path / "etc/tuned/active_profile", "latency-performance")
    w(tmp_path / "usr/lib/tuned/latency-performance/tuned.conf", "[main]\nsummary=x\n[cpu]\nforce_latency=cstate.id_no_zero:1|3\n")
    res = judge(sysfs, procfs)
    tuned = [c for c in res["causes"] if c["cause"] == "tuned"][0]
    assert tuned["profile"] == "latency-performance" and tuned["running"] is False
    assert res["verdict"] == "deep_cstate_reachable"
    w(procfs / "900" / "comm", "tuned")
    assert judge(sysfs, procfs)["verdict"] == "limited"


def test_tuned_include_chain_is_followed(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    w(tmp_path / "etc/tuned/active_profile", "site")
    w(tmp_path / "etc/tuned/site/tuned.conf", "[main]\ninclude=network-latency\n")
    w(tmp_path / "usr/lib/tuned/network-latency/tuned.conf", "[main]\ninclude=latency-performance\n")
    w(tmp_path / "usr/lib/tuned/latency-performance/tuned.conf", "[cpu]\nforce_latency=1\n")
    info = _cpu_idle.tuned_force_latency(str(tmp_path), str(procfs))
    assert info == {"profiles": ["site"], "running": False, "force_latency": "1", "from": "latency-performance"}


def test_state_index_check_names_the_missing_index(tmp_path):
    sysfs, procfs = tree(tmp_path, "idle_intel_idle_server_c6.txt")
    idle = _cpu_idle.read_idle(str(sysfs), str(procfs))
    _cpu_idle.check_state_indexes(idle, [3])
    with pytest.raises(_cpu_idle.IdleError, match=r"index 7 does not exist \(the CPUs have 0, 1, 2, 3\)"):
        _cpu_idle.check_state_indexes(idle, [3, 7])


# ---- virtualisation ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("files, cpuinfo, kind", [
    ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, "", "qemu"),
    ({"sys_vendor": "Amazon EC2", "product_name": "p5.48xlarge"}, "", "amazon"),
    ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}, "", "microsoft"),
    ({"sys_vendor": "Microsoft Corporation", "product_name": "Surface Laptop 5"}, "", "none"),
    ({"sys_vendor": "NVIDIA", "product_name": "DGXH100"}, "flags\t: fpu hypervisor\n", "vm"),
    ({"sys_vendor": "NVIDIA", "product_name": "DGXH100"}, "flags\t: fpu sse\n", "none"),
])
def test_detect_virt(tmp_path, files, cpuinfo, kind):
    for name, value in files.items():
        w(tmp_path / "sys/class/dmi/id" / name, value)
    w(tmp_path / "proc/cpuinfo", cpuinfo)
    res = _virt.detect_virt(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert res["type"] == kind and res["virtualized"] == (kind != "none")


# ---- frequency ----------------------------------------------------------------------------------------------------

def freq_tree(tmp_path, governor="performance", no_turbo="0", max_pct="100", scaling_max=3800000, cmdline="ro"):
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    base = sysfs / "devices/system/cpu"
    w(base / "online", "0-3")
    for cpu in range(4):
        p = base / "cpufreq" / ("policy%d" % cpu)
        w(p / "affected_cpus", str(cpu))
        w(p / "related_cpus", str(cpu))
        w(p / "scaling_driver", "intel_pstate")
        w(p / "scaling_governor", governor if cpu != 3 else "performance")
        w(p / "scaling_available_governors", "performance powersave")
        w(p / "cpuinfo_max_freq", "3800000")
        w(p / "cpuinfo_min_freq", "800000")
        w(p / "scaling_max_freq", str(scaling_max if cpu == 1 else 3800000))
        w(p / "scaling_min_freq", "800000")
        w(p / "scaling_cur_freq", "3000000")
    for name, value in (("status", "active"), ("no_turbo", no_turbo), ("max_perf_pct", max_pct), ("min_perf_pct", "20")):
        w(base / "intel_pstate" / name, value)
    w(procfs / "cmdline", cmdline)
    return sysfs, procfs


def test_frequency_ok(tmp_path):
    sysfs, procfs = freq_tree(tmp_path)
    res = _cpu_freq.judge_freq(_cpu_freq.read_freq(str(sysfs), str(procfs)), BARE)
    assert res["verdict"] == "ok" and res["governors"] == {"performance": "0-3"} and res["drivers"] == ["intel_pstate"]


def test_frequency_every_cause(tmp_path):
    sysfs, procfs = freq_tree(tmp_path, governor="powersave", no_turbo="1", max_pct="80", scaling_max=2000000,
                              cmdline="ro intel_pstate=disable")
    res = _cpu_freq.judge_freq(_cpu_freq.read_freq(str(sysfs), str(procfs)), BARE)
    assert res["verdict"] == "limited"
    assert sorted(c["cause"] for c in res["causes"]) == ["capped", "capped", "governor", "intel_pstate_disabled", "turbo_off"]
    capped = [c for c in res["causes"] if c.get("cpus") == "1"][0]
    assert "2000000 kHz of 3800000 kHz" in capped["message"]
    assert [c for c in res["causes"] if c["cause"] == "governor"][0]["message"] == \
        "governor powersave on CPUs 0-2, expected performance"


def test_frequency_in_a_vm_without_cpufreq_is_not_visible(tmp_path):
    w(tmp_path / "sys/devices/system/cpu/online", "0-7")
    w(tmp_path / "proc/cmdline", "ro")
    res = _cpu_freq.judge_freq(_cpu_freq.read_freq(str(tmp_path / "sys"), str(tmp_path / "proc")), KVM)
    assert res["verdict"] == "not_visible" and res["causes"][0]["cause"] == "vm"


def test_governor_not_offered_names_it(tmp_path):
    sysfs, procfs = freq_tree(tmp_path)
    freq = _cpu_freq.read_freq(str(sysfs), str(procfs))
    with pytest.raises(_cpu_freq.FreqError, match=r"governor 'ondemand' is not offered .* \(it offers performance, powersave\)"):
        _cpu_freq.check_governor(freq, "ondemand")


def test_busy_core_frequency_against_the_rated_maximum():
    policies = {0: {"cpus": [0, 1], "cpuinfo_max_freq": 3800000}}
    measured = {"method": "aperf_mperf", "cpus": {0: {"busy_pct": 99.0, "mhz": 3000.0}, 1: {"busy_pct": 3.0, "mhz": 900.0}}}
    res = _cpu_freq.judge_measured(measured, policies, busy_pct=50, min_ratio_pct=90)
    assert res["verdict"] == "low" and res["busy_cpus"] == "0" and res["busy_mhz"] == 3000.0 and res["ratio_pct"] == 78.9
    measured["cpus"][0]["mhz"] = 3700.0
    assert _cpu_freq.judge_measured(measured, policies)["verdict"] == "ok"
    measured["cpus"][0]["busy_pct"] = 10.0
    assert _cpu_freq.judge_measured(measured, policies)["verdict"] == "unknown"


def test_measure_sees_a_real_busy_cpu_on_this_host():
    """Live /proc/stat: a spinning child pinned to one CPU is measured busy there; without cpufreq or MSRs here the
    frequency is unknown, not invented."""
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {%d})\nwhile True: pass" % cpu])
    try:
        import time
        time.sleep(0.3)
        res = _cpu_freq.measure("/sys", "/proc", "/dev", 1.0, [cpu], _cpu_freq.read_policies("/sys"))
    finally:
        child.kill()
        child.wait()
    assert res["cpus"][cpu]["busy_pct"] > 80, res
    if res["method"] is None:
        assert res["cpus"][cpu]["mhz"] is None


# ---- the composition --------------------------------------------------------------------------------------------

def params(tmp_path, **kw):
    base = dict(governor="performance", sample_seconds=0, busy_pct=50, min_frequency_pct=90, pids=[], process_patterns=[],
                remote_threshold_pct=10, irq_cpus=None, gpu_topology="never", procfs_path=str(tmp_path / "proc"),
                sysfs_path=str(tmp_path / "sys"))
    base.update(kw)
    return base


@pytest.mark.parametrize("key, value, match", [
    ("remote_threshold_pct", 150, r"remote_threshold_pct 150 is outside 0-100"),
    ("busy_pct", -1, r"busy_pct -1 is outside 0-100"),
    ("sample_seconds", 601, r"sample_seconds 601 is outside 0-600"),
    ("irq_cpus", "0-x", r"irq_cpus '0-x' is not a CPU list"),
    ("gpu_topology", "/nonexistent/topo.txt", r"gpu_topology '/nonexistent/topo.txt' is neither auto, never nor a file"),
    ("pids", [999999999], r"999999999"),
    ("process_patterns", ["python("], r"python\("),
    ("governor", "ondemand", r"governor 'ondemand' is not offered"),
])
def test_bad_input_fails_before_anything_is_read(tmp_path, key, value, match):
    freq_tree(tmp_path)
    with pytest.raises(_cpu_power.CpuPowerError, match=match) as info:
        _cpu_power.cpu_power_facts(params(tmp_path, **{key: value}))
    assert info.value.details.get("value", info.value.details.get("expected")) is not None


@pytest.mark.parametrize("key, value, expected", [
    ("remote_threshold_pct", 100.5, "a percentage from 0 to 100"),
    ("min_frequency_pct", -0.5, "a percentage from 0 to 100"),
    ("busy_pct", None, "a percentage from 0 to 100"),
    ("sample_seconds", 600.5, "seconds from 0 to 600"),
    ("irq_cpus", "0-x", "a CPU list such as 0-10 or a list of integers"),
    ("gpu_topology", "/nonexistent/topo.txt", "auto, never, or the path of a saved nvidia-smi topo -m output"),
])
def test_a_refusal_names_the_option_the_value_and_what_was_expected(tmp_path, key, value, expected):
    # What the module's fail_json carries (option, value, expected): a user fixing an inventory reads these.
    freq_tree(tmp_path)
    with pytest.raises(_cpu_power.CpuPowerError) as info:
        _cpu_power.cpu_power_facts(params(tmp_path, **{key: value}))
    assert info.value.details == {"option": key, "value": value, "expected": expected}
    assert str(info.value).startswith("%s %r " % (key, value))


@pytest.mark.parametrize("key, value", [
    ("remote_threshold_pct", 0), ("remote_threshold_pct", 100), ("busy_pct", 0), ("min_frequency_pct", 100),
    ("sample_seconds", 0), ("irq_cpus", ""), ("irq_cpus", []), ("gpu_topology", None), ("gpu_topology", "never"),
])
def test_the_edges_of_every_range_are_accepted(tmp_path, key, value):
    freq_tree(tmp_path)
    res = _cpu_power.cpu_power_facts(params(tmp_path, **{key: value}))
    assert res["idle"]["verdict"] and res["frequency"]["verdict"]
    if key == "irq_cpus":
        assert res["numa"]["irq_cpus"] is None      # empty means not given
    if key == "gpu_topology":
        # None means the default, auto: on a generated tree nvidia-smi is not run
        assert res["gpus"]["reason"] == ("gpu_topology is never" if value == "never" else "a captured tree: nvidia-smi is not run")


def test_validate_accepts_the_longest_sample_and_parses_irq_cpus():
    base = dict(busy_pct=50, min_frequency_pct=90, remote_threshold_pct=10, gpu_topology="never")
    assert _cpu_power.validate(dict(base, sample_seconds=_cpu_power.MAX_SAMPLE_SECONDS, irq_cpus=None)) == {
        "seconds": _cpu_power.MAX_SAMPLE_SECONDS, "irq_cpus": None, "gpu_topology": "never"}
    assert _cpu_power.validate(dict(base, sample_seconds=None, irq_cpus="0-2,7"))["irq_cpus"] == {0, 1, 2, 7}
    assert _cpu_power.validate(dict(base, sample_seconds=0, irq_cpus=[3, 1], gpu_topology=""))["gpu_topology"] == "auto"


def test_findings_give_one_line_per_check_and_one_per_process_and_rule():
    # The gate's lines from a result: the three CPU checks, then per judged process the remote-memory rule and,
    # with IRQ CPUs given, the IRQ-CPU rule; a process a rule flags fails that check only.
    result = {
        "idle": {"verdict": "deep_cstate_reachable", "reachable_cpus": "0-3", "deepest_enabled": "C6", "causes": []},
        "frequency": {"verdict": "ok", "governors": {"performance": "0-1", "schedutil": "2-3"}, "causes": []},
        "measured": {"verdict": "low", "message": "busy CPUs 2 ran at 1200 MHz"},
        "numa": {"irq_cpus": "0-1", "findings": [
            {"pid": 41, "name": "python3", "rules": ["irq_cpus"], "reasons": ["allowed CPUs 0-3 include IRQ CPUs 0-1"]},
            {"pid": 42, "name": "trainer", "rules": [], "reasons": []},
        ]},
    }
    assert _cpu_power.findings(result) == [
        {"check": "idle", "status": "pass", "verdict": "deep_cstate_reachable",
         "message": "deep C-states reachable on CPUs 0-3 (deepest enabled C6)"},
        {"check": "frequency", "status": "pass", "verdict": "ok",
         "message": "governors performance on 0-1, schedutil on 2-3, turbo on, no cap"},
        {"check": "measured", "status": "fail", "verdict": "low", "message": "busy CPUs 2 ran at 1200 MHz"},
        {"check": "numa_remote", "status": "pass", "pid": 41, "verdict": "ok",
         "message": "python3 (pid 41): allowed CPUs 0-3 include IRQ CPUs 0-1"},
        {"check": "numa_irq_cpus", "status": "fail", "pid": 41, "verdict": "flagged",
         "message": "python3 (pid 41): allowed CPUs 0-3 include IRQ CPUs 0-1"},
        {"check": "numa_remote", "status": "pass", "pid": 42, "verdict": "ok", "message": "trainer (pid 42): placement ok"},
        {"check": "numa_irq_cpus", "status": "pass", "pid": 42, "verdict": "ok", "message": "trainer (pid 42): placement ok"},
    ]
    # limited: the causes' messages; no IRQ CPUs: the remote-memory rule only; no sample: no measured line
    limited = {
        "idle": {"verdict": "limited", "causes": [{"message": "C6 disabled"}, {"message": "max_cstate=1"}]},
        "frequency": {"verdict": "not_visible", "causes": [{"message": "a vm guest"}]},
        "numa": {"irq_cpus": None, "findings": [
            {"pid": 7, "name": "x", "rules": ["remote_memory"], "reasons": ["62 % remote", "on node 1"]}]},
    }
    assert _cpu_power.findings(limited) == [
        {"check": "idle", "status": "fail", "verdict": "limited", "message": "C6 disabled; max_cstate=1"},
        {"check": "frequency", "status": "not_visible", "verdict": "not_visible", "message": "a vm guest"},
        {"check": "numa_remote", "status": "fail", "pid": 7, "verdict": "flagged", "message": "x (pid 7): 62 % remote; on node 1"},
    ]


def test_findings_on_a_bare_metal_tree(tmp_path):
    tree(tmp_path, "idle_intel_idle_c6_disabled.txt")
    freq_tree(tmp_path, no_turbo="1")
    res = _cpu_power.cpu_power_facts(params(tmp_path))
    by = dict((f["check"], f) for f in res["findings"])
    assert by["idle"]["status"] == "fail" and "C6" in by["idle"]["message"]
    assert by["frequency"]["status"] == "fail" and "no_turbo is 1" in by["frequency"]["message"]
    assert "measured" not in by and res["gpus"] == {"available": False, "reason": "gpu_topology is never"}


# ---- idle, model-suffixed state names (issue 29, class 1) -----------------------------------------------------

def tree_from_cstateinfo(tmp_path, capture, cmdline):
    """T/sys and T/proc from a real ``cstateInfo.sh`` table (``cpuN State Name Disabled Latency Residency Time
    Usage``): each row becomes ``cpuN/cpuidle/stateK/{name,desc,latency,residency,time,usage,disable}``."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    base = sysfs / "devices/system/cpu"
    cpus, cpu = [], None
    for line in (FIXTURES / capture).read_text().splitlines():
        fields = line.split()
        if fields[0].startswith("cpu"):
            cpu = int(fields[0][3:])
            cpus.append(cpu)
            continue
        index, name, disabled, latency, residency, time, usage = fields
        state = base / ("cpu%d" % cpu) / "cpuidle" / ("state%s" % index)
        desc = "CPUIDLE CORE POLL IDLE" if name == "POLL" else "MWAIT 0x00"
        for key, value in (("name", name), ("desc", desc), ("disable", disabled), ("latency", latency),
                           ("residency", residency), ("time", time), ("usage", usage), ("default_status", "enabled")):
            w(state / key, value)
    for name in ("online", "present", "possible"):
        w(base / name, "0-%d" % max(cpus))
    w(base / "cpuidle/current_driver", "intel_idle")
    w(base / "cpuidle/current_governor", "menu")
    w(procfs / "cmdline", cmdline)
    w(procfs / "cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme msr\n")
    w(procfs / "1" / "comm", "systemd")
    (procfs / "1" / "fd").mkdir(parents=True)
    for name, value in {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR"}.items():
        w(sysfs / "class/dmi/id" / name, value)
    return sysfs, procfs


def test_model_suffixed_c1_only_is_limited_and_names_the_kernel_limit(tmp_path):
    """Bay Trail with intel_idle.max_cstate=1 shows POLL and C1-BYT only: that is halt-class, so the node is limited
    by the parameter (was: C1-BYT counted as deep, verdict deep_cstate_reachable)."""
    res = judge(*tree_from_cstateinfo(tmp_path, "cstateinfo_baytrail_max_cstate1_c1_byt.txt",
                                      "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_idle.max_cstate=1"))
    assert res["verdict"] == "limited", res
    assert causes(res) == ["kernel_parameter"], res
    assert "intel_idle.max_cstate=1" in res["causes"][0]["message"]


# Every state name of the intel_idle tables as they stood with model suffixes (drivers/idle/intel_idle.c, library
# index id 147206694: nehalem..dnv tables), the suffix-free names of newer kernels, acpi_idle, ARM, haltpoll.
HALT_NAMES = ["C1-NHM", "C1E-NHM", "C1-SNB", "C1E-SNB", "C1-BYT", "C1-CHT", "C1-IVB", "C1E-IVB", "C1-IVT", "C1E-IVT",
              "C1-IVT-4S", "C1E-IVT-4S", "C1-IVT-8S", "C1E-IVT-8S", "C1-HSW", "C1E-HSW", "C1-BDW", "C1E-BDW", "C1-SKL",
              "C1E-SKL", "C1-SKX", "C1E-SKX", "C1E-ATM", "C1-TNG", "C1-AVN", "C1-KNL", "C1-BXT", "C1E-BXT", "C1-DNV",
              "C1E-DNV", "C1", "C1E", "C1_ACPI", "WFI", "haltpoll"]
DEEP_NAMES = ["C3-NHM", "C6-NHM", "C3-SNB", "C6-SNB", "C7-SNB", "C6N-BYT", "C6S-BYT", "C7-BYT", "C7S-BYT", "C6N-CHT",
              "C6S-CHT", "C7-CHT", "C7S-CHT", "C3-IVB", "C6-IVB", "C7-IVB", "C3-IVT", "C6-IVT", "C3-IVT-4S", "C6-IVT-4S",
              "C3-IVT-8S", "C6-IVT-8S", "C3-HSW", "C6-HSW", "C7s-HSW", "C8-HSW", "C9-HSW", "C10-HSW", "C3-BDW", "C6-BDW",
              "C7s-BDW", "C8-BDW", "C9-BDW", "C10-BDW", "C3-SKL", "C6-SKL", "C7s-SKL", "C8-SKL", "C9-SKL", "C10-SKL",
              "C6-SKX", "C2-ATM", "C4-ATM", "C6-ATM", "C4-TNG", "C6-TNG", "C7-TNG", "C9-TNG", "C6-AVN", "C6-KNL",
              "C6-BXT", "C7s-BXT", "C8-BXT", "C9-BXT", "C10-BXT", "C6-DNV", "C6", "C6P", "C6S", "C6SP", "C10", "C2_ACPI",
              "C3_ACPI", "C2", "C3"]


@pytest.mark.parametrize("name", HALT_NAMES)
def test_halt_class_names(name):
    assert _cpu_idle.is_shallow({"name": name, "desc": "MWAIT 0x00"})


@pytest.mark.parametrize("name", DEEP_NAMES)
def test_deep_names(name):
    assert not _cpu_idle.is_shallow({"name": name, "desc": "MWAIT 0x20"})


def test_poll_is_shallow_by_name_or_desc():
    assert _cpu_idle.is_shallow({"name": "POLL", "desc": ""}) and _cpu_idle.is_poll({"name": "x", "desc": "CPUIDLE CORE POLL IDLE"})


def test_a_sample_on_a_tree_reads_the_tree_as_it_changes(tmp_path):
    # sample_seconds on a generated tree: the module sleeps through the sample in 5 reads; here each "sleep" moves
    # the tree's counters on as a busy CPU 2 at 1.9 GHz would (its /proc/stat and scaling_cur_freq), so the result
    # is what the tree says, not what this host does.
    tree(tmp_path, "idle_intel_idle_server_c6.txt")
    freq_tree(tmp_path)
    stat = tmp_path / "proc/stat"

    def write_stat(busy2):
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        for cpu in range(4):
            user = busy2 if cpu == 2 else 0
            lines.append("cpu%d %d 0 0 %d 0 0 0 0 0 0" % (cpu, user, 1000 if cpu == 2 else 1000 + busy2))
        stat.write_text("\n".join(lines) + "\n")
    write_stat(0)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        write_stat(200 * len(slept))
        for cpu in range(4):
            (tmp_path / ("sys/devices/system/cpu/cpufreq/policy%d/scaling_cur_freq" % cpu)).write_text(
                "%d\n" % (1900000 if cpu == 2 else 800000))
    res = _cpu_power.cpu_power_facts(params(tmp_path, sample_seconds=2), sleep=sleep)
    assert slept == [0.4] * 5
    measured = res["measured"]
    assert measured["method"] == "scaling_cur_freq" and measured["busy_cpus"] == "2"
    assert measured["cpus"]["2"] == {"busy_pct": 100.0, "mhz": 1900.0} and measured["cpus"]["0"]["busy_pct"] == 0.0
    assert measured["busy_mhz"] == 1900.0 and measured["rated_mhz"] == 3800.0 and measured["verdict"] == "low"
    assert [f["check"] for f in res["findings"]][-1] == "measured" and res["findings"][-1]["status"] == "fail"
