# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpu_power_facts and cpu_power_settings through their main(), on trees built from real cpupower captures.

cpu_power_settings writes under the tree (sysfs files and the tmpfiles.d file under the tree's etc): check mode's
plan is exactly what the run then does, a second run changes nothing, a failed write puts the earlier ones back,
bad input changes nothing. The lab (molecule nic_irq_modules) runs both on a real kernel, where a TCG guest has no
cpuidle states and no cpufreq."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import modharness
from modharness import Exit, Fail
from cpupower_capture import parse_idle_info
from ansible_collections.gpunode.tuning.plugins.modules import cpu_power_facts, cpu_power_settings

from cpuidle_tree import sysfs_from_idle_info

pytestmark = pytest.mark.usefixtures("fake_exits")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cpu_power"
TMPFILES = "etc/tmpfiles.d/gpunode-cpu-power.conf"


def w(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("%s\n" % text)


def node(tmp_path, capture="idle_intel_idle_c6_disabled.txt", governor="powersave"):
    """4 CPUs, a real intel_idle state table (C6 disabled), intel_pstate policies on the given governor."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    sysfs_from_idle_info(parse_idle_info((FIXTURES / "cpupower" / capture).read_text()), "0-3", sysfs)
    for cpu in range(4):
        p = sysfs / "devices/system/cpu/cpufreq" / ("policy%d" % cpu)
        for name, value in (("affected_cpus", cpu), ("related_cpus", cpu), ("scaling_driver", "intel_pstate"),
                            ("scaling_governor", governor), ("scaling_available_governors", "performance powersave"),
                            ("cpuinfo_max_freq", 3800000), ("scaling_max_freq", 3800000)):
            w(p / name, value)
    w(procfs / "cmdline", "ro")
    w(procfs / "cpuinfo", "vendor_id\t: GenuineIntel\nflags\t\t: fpu\n")
    w(procfs / "interrupts", "           CPU0\n")
    return {"procfs_path": str(procfs), "sysfs_path": str(sysfs)}


def disable_files(tmp_path):
    return dict((cpu, (tmp_path / ("sys/devices/system/cpu/cpu%d/cpuidle/state3/disable" % cpu)).read_text().strip())
                for cpu in range(4))


def governors(tmp_path):
    return [(tmp_path / ("sys/devices/system/cpu/cpufreq/policy%d/scaling_governor" % c)).read_text().strip() for c in range(4)]


def test_facts_report_the_disabled_c6_and_the_governor(tmp_path):
    kind, res = modharness.run(cpu_power_facts, dict(node(tmp_path), gpu_topology="never"))
    assert kind is Exit and res["changed"] is False
    assert res["idle"]["verdict"] == "limited" and res["frequency"]["verdict"] == "limited"
    assert res["ansible_facts"]["cpu_power"]["idle"]["driver"] == "intel_idle"
    assert {f["check"]: f["status"] for f in res["findings"]} == {"idle": "fail", "frequency": "fail"}


def test_facts_read_a_saved_topo_output(tmp_path):
    topo = FIXTURES / "nvidia_topo" / "hgx_nv18_8gpu_12nic_gpu_numa_id.txt"
    kind, res = modharness.run(cpu_power_facts, dict(node(tmp_path), gpu_topology=str(topo)))
    assert kind is Exit and res["gpus"]["available"] is True and len(res["gpus"]["topology"]["gpus"]) == 8


def test_facts_bad_input_names_the_value(tmp_path):
    kind, res = modharness.run(cpu_power_facts, dict(node(tmp_path), remote_threshold_pct=101))
    assert kind is Fail and res["value"] == 101 and "remote_threshold_pct" in res["msg"]


def test_settings_check_mode_plan_is_exactly_what_the_run_does_and_then_nothing(tmp_path):
    args = dict(node(tmp_path), enable_idle_states=True, governor="performance")
    kind, plan = modharness.run(cpu_power_settings, args, check=True, diff=True)
    assert kind is Exit and plan["changed"] is True
    assert disable_files(tmp_path) == {0: "1", 1: "1", 2: "1", 3: "1"} and governors(tmp_path) == ["powersave"] * 4
    assert not (tmp_path / TMPFILES).exists()
    assert sorted(x["what"] for x in plan["writes"]) == sorted(
        ["cpu%d C6 enabled" % c for c in range(4)] + ["policy%d governor powersave -> performance" % c for c in range(4)])
    assert plan["files"] == [{"path": "/" + TMPFILES, "action": "create", "reason": "missing"}]
    assert "state3/disable: 1" in plan["diff"][0]["before"] and "state3/disable: 0" in plan["diff"][0]["after"]

    kind, done = modharness.run(cpu_power_settings, args)
    assert kind is Exit and done["changed"] is True and done["writes"] == plan["writes"]
    assert disable_files(tmp_path) == {0: "0", 1: "0", 2: "0", 3: "0"} and governors(tmp_path) == ["performance"] * 4
    text = (tmp_path / TMPFILES).read_text()
    assert "w /sys/devices/system/cpu/cpu*/cpuidle/state*/disable - - - - 0\n" in text
    assert "w /sys/devices/system/cpu/cpufreq/policy*/scaling_governor - - - - performance\n" in text
    assert oct(os.stat(tmp_path / TMPFILES).st_mode & 0o777) == "0o644"

    for check in (True, False):
        kind, again = modharness.run(cpu_power_settings, args, check=check)
        assert kind is Exit and again["changed"] is False and again["writes"] == []

    kind, facts = modharness.run(cpu_power_facts, dict(procfs_path=args["procfs_path"], sysfs_path=args["sysfs_path"],
                                                       gpu_topology="never"))
    assert facts["idle"]["verdict"] == "deep_cstate_reachable" and facts["frequency"]["verdict"] == "ok"

    kind, gone = modharness.run(cpu_power_settings, dict(args, state="absent"))
    assert gone["changed"] is True and not (tmp_path / TMPFILES).exists()


def test_settings_a_failed_write_puts_the_earlier_ones_back(tmp_path):
    args = dict(node(tmp_path), enable_idle_states=True)
    target = tmp_path / "sys/devices/system/cpu/cpu2/cpuidle/state3/disable"
    target.unlink()
    # This host's kernel refuses every write to kernel_max (read-only attribute, EACCES even for root); it reads
    # as a non-zero number, so the plan writes "0" to it after cpu0 and cpu1.
    target.symlink_to("/sys/devices/system/cpu/kernel_max")
    kind, res = modharness.run(cpu_power_settings, args)
    assert kind is Fail and "cpu2/cpuidle/state3/disable" in res["msg"] and "put back" in res["msg"]
    assert disable_files_except(tmp_path, 2) == {0: "1", 1: "1", 3: "1"}
    assert not (tmp_path / TMPFILES).exists()


def disable_files_except(tmp_path, skip):
    return dict((c, v) for c, v in ((c, (tmp_path / ("sys/devices/system/cpu/cpu%d/cpuidle/state3/disable" % c)).read_text().strip())
                                    for c in range(4) if c != skip))


@pytest.mark.parametrize("extra, match", [
    ({"governor": "ondemand"}, "governor 'ondemand' is not offered"),
    ({"enable_idle_states": True, "idle_state_indexes": [9]}, "idle state index 9 does not exist"),
])
def test_settings_bad_input_changes_nothing(tmp_path, extra, match):
    args = dict(node(tmp_path), **extra)
    kind, res = modharness.run(cpu_power_settings, args)
    assert kind is Fail and match in res["msg"]
    assert disable_files(tmp_path) == {0: "1", 1: "1", 2: "1", 3: "1"} and governors(tmp_path) == ["powersave"] * 4
    assert not (tmp_path / TMPFILES).exists()


def test_settings_refuse_a_captured_sysfs_with_the_live_proc(tmp_path):
    args = dict(node(tmp_path), procfs_path="/proc", enable_idle_states=True)
    kind, res = modharness.run(cpu_power_settings, args)
    assert kind is Fail and "refusing to write" in res["msg"]


def test_settings_take_the_kernel_limits_off_with_the_kernel_cmdline_code_and_absent_puts_them_back(tmp_path):
    """On a tree with the Debian 12 GRUB files and processor.max_cstate=1 intel_idle.max_cstate=0 in
    /etc/default/grub: the limits leave that line (nothing else does), check mode plans it exactly, a second run and
    check mode then change nothing, and absent gives the line back byte for byte."""
    import shutil
    args = dict(node(tmp_path), remove_kernel_limits=True, bootloader="grub_debian")
    shutil.copytree(str(FIXTURES.parent / "kernel_cmdline" / "debian12" / "etc"), str(tmp_path / "etc"), dirs_exist_ok=True)
    grub = tmp_path / "etc/default/grub"
    limited = grub.read_text().replace('GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
                                       'GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=1 intel_idle.max_cstate=0"')
    grub.write_text(limited)
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet processor.max_cstate=1 intel_idle.max_cstate=0\n")
    kind, plan = modharness.run(cpu_power_settings, args, check=True)
    assert kind is Exit and plan["changed"] is True and grub.read_text() == limited
    assert plan["kernel_cmdline"]["reboot_required"] is True
    kind, done = modharness.run(cpu_power_settings, args)
    assert kind is Exit and done["changed"] is True
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n' in grub.read_text()
    assert grub.read_text().replace('GRUB_CMDLINE_LINUX_DEFAULT="quiet"', "X") == limited.replace(
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=1 intel_idle.max_cstate=0"', "X")
    assert done["kernel_cmdline"]["configured_after"] == plan["kernel_cmdline"]["configured_after"]
    assert [t for t in done["kernel_cmdline"]["configured_after"] if "cstate" in t] == []
    limits = ("intel_idle.max_cstate", "processor.max_cstate", "intel_idle.states_off", "idle", "cpuidle.off")
    assert done["kernel_cmdline"]["managed"] == ["!" + k for k in limits]
    for check in (True, False):
        kind, again = modharness.run(cpu_power_settings, args, check=check)
        assert kind is Exit and again["changed"] is False, again
    kind, gone = modharness.run(cpu_power_settings, dict(args, state="absent"))
    assert kind is Exit and gone["changed"] is True and grub.read_text() == limited
    assert not (tmp_path / "var/lib/gpunode-tuning/kernel-cmdline.json").exists()


def _return_doc(module):
    """The module's RETURN: top key -> its ``contains`` (or {})."""
    import yaml
    doc = yaml.safe_load(module.RETURN)
    return dict((key, value.get("contains") or {}) for key, value in doc.items())


def _keys(results, key):
    seen = set()
    for res in results:
        part = res.get(key)
        for item in (part if isinstance(part, list) else [part]):
            if isinstance(item, dict):
                seen.update(item)
    return seen


def test_facts_return_exactly_the_documented_keys(tmp_path):
    # What ansible-doc says cpu_power_facts returns is what a playbook gets: every key of the result, and every key
    # of its dicts (and of the findings' items), is documented in RETURN, and every documented one is returned on
    # one of three nodes - a tree with a deep state reachable and a saved nvidia-smi topo, one without deep states,
    # and this live host (a VM: nothing visible) with a sample, a process judged and IRQ CPUs.
    topo = FIXTURES / "nvidia_topo" / "hgx_nv18_8gpu_12nic_gpu_numa_id.txt"
    runs = []
    for name, capture, topology in (("deep", "idle_intel_idle_server_c6.txt", str(topo)),
                                    ("limited", "idle_intel_idle_c6_disabled.txt", "never")):
        kind, res = modharness.run(cpu_power_facts, dict(node(tmp_path / name, capture=capture), gpu_topology=topology))
        assert kind is Exit, res
        runs.append(res)
    kind, live = modharness.run(cpu_power_facts, dict(sample_seconds=0.2, pids=[os.getpid()], irq_cpus="0",
                                                      gpu_topology="never"))
    assert kind is Exit, live
    runs.append(live)
    assert runs[0]["idle"]["verdict"] == "deep_cstate_reachable" and runs[0]["gpus"]["available"] is True
    doc = _return_doc(cpu_power_facts)
    returned = set().union(*(set(res) for res in runs)) - {"changed"}
    assert returned == set(doc), (sorted(returned - set(doc)), sorted(set(doc) - returned))
    for key, contains in doc.items():
        if contains:
            assert _keys(runs, key) == set(contains), (key, sorted(_keys(runs, key) - set(contains)),
                                                       sorted(set(contains) - _keys(runs, key)))
    assert runs[2]["ansible_facts"]["cpu_power"] == dict((k, v) for k, v in runs[2].items() if k not in ("changed", "ansible_facts"))


def test_gpu_topology_auto_never_runs_nvidia_smi_for_a_captured_tree(tmp_path):
    kind, res = modharness.run(cpu_power_facts, dict(node(tmp_path), gpu_topology="auto"))
    assert kind is Exit and res["gpus"] == {"available": False, "reason": "a captured tree: nvidia-smi is not run"}


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi")
def test_gpu_topology_auto_on_a_host_without_nvidia_smi_says_so():
    # The live host, its real PATH: the test machine has no NVIDIA driver.
    kind, res = modharness.run(cpu_power_facts, dict(gpu_topology="auto"))
    assert kind is Exit and res["gpus"] == {"available": False, "reason": "nvidia-smi is not installed"}


def test_gpu_topology_auto_reads_what_nvidia_smi_prints_and_quotes_its_failure():
    # nvidia-smi does not run here: the runner gives what it printed on a real HGX node (the saved capture), then
    # what a failing run printed (a driver that is not loaded; rc 9 as nvidia-smi exits then).
    from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.power import _gpus
    text = (FIXTURES / "nvidia_topo" / "hgx_nv18_8gpu_12nic_gpu_numa_id.txt").read_text()
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, text, ""
    got = _gpus("auto", run)
    assert calls == [["nvidia-smi", "topo", "-m"]]
    assert got["available"] is True and got["source"] == "nvidia-smi topo -m" and len(got["topology"]["gpus"]) == 8
    assert got == dict(_gpus(str(FIXTURES / "nvidia_topo" / "hgx_nv18_8gpu_12nic_gpu_numa_id.txt"), None),
                       source="nvidia-smi topo -m")
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert _gpus("auto", lambda argv: (9, "%s\n" % failed, "")) == {
        "available": False, "reason": "nvidia-smi topo -m failed (rc 9): %s" % failed}
    assert _gpus("auto", lambda argv: (9, "ignored", " on stderr \n"))["reason"] == "nvidia-smi topo -m failed (rc 9): on stderr"
    assert _gpus("auto", lambda argv: (127, "", "")) == {"available": False, "reason": "nvidia-smi is not installed"}
    bad = _gpus("auto", lambda argv: (0, "no matrix here\n", ""))
    assert bad["available"] is False and bad["reason"].startswith("nvidia-smi topo -m: ") and len(bad) == 2


def test_facts_report_every_reading_they_judge_from_their_own_tree(tmp_path):
    # A node whose every reading is set to something other than its default: the result carries each one as read
    # from this tree (sysfs, procfs and the tree's own /dev and /etc), not from the host running the test. Two NUMA
    # nodes (CPUs 0-1, 2-3) and one judged process on node 0 with 40 % of its pages on node 1.
    import struct
    args = node(tmp_path, capture="idle_intel_idle_server_c6.txt")
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    w(sysfs / "module/intel_idle/parameters/max_cstate", "9")
    w(sysfs / "devices/system/cpu/cpu1/power/pm_qos_resume_latency_us", "0")
    w(sysfs / "devices/system/cpu/cpufreq/boost", "1")
    w(sysfs / "devices/system/cpu/intel_pstate/status", "active")
    w(sysfs / "devices/system/cpu/intel_pstate/no_turbo", "0")
    w(sysfs / "class/dmi/id/sys_vendor", "QEMU")
    for n, cpus in ((0, "0-1"), (1, "2-3")):
        w(sysfs / ("devices/system/node/node%d/cpulist" % n), cpus)
    w(sysfs / "devices/system/node/online", "0-1")
    w(procfs / "cmdline", "ro intel_pstate=active")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/cpu_dma_latency").write_bytes(struct.pack("<i", 2000000000))
    w(tmp_path / "etc/tuned/active_profile", "gpunode-test")
    w(tmp_path / "usr/lib/tuned/gpunode-test/tuned.conf", "[main]\nsummary=test\n")
    w(procfs / "4242/comm", "tuned")
    w(procfs / "4242/status", "Name:\ttuned\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0-1\n")
    w(procfs / "4242/cmdline", "tuned")
    w(procfs / "4242/numa_maps", "7f0000000000 default anon=100 dirty=100 N0=60 N1=40 kernelpagesize_kB=4")
    (procfs / "4242/fd").mkdir()
    (procfs / "4242/fd/3").symlink_to("/dev/cpu_dma_latency")
    kind, res = modharness.run(cpu_power_facts, dict(args, gpu_topology="never", pids=[4242], irq_cpus="1"))
    assert kind is Exit, res
    idle, freq, numa = res["idle"], res["frequency"], res["numa"]
    assert idle["module_params"] == {"intel_idle.max_cstate": "9"}
    assert idle["resume_latency_us"] == {"1": "0"}
    assert idle["cpu_dma_latency_us"] == 2000000000
    assert idle["pm_qos_holders"] == [{"pid": 4242, "comm": "tuned"}]
    assert idle["tuned"] == {"profiles": ["gpunode-test"], "running": True, "force_latency": None, "from": None}
    assert sorted(idle["cpus"]) == ["0", "1", "2", "3"] and [s["name"] for s in idle["cpus"]["2"]] == \
        [s["name"] for s in idle["states_cpu0"]]
    assert idle["cmdline_limits"] == []
    assert freq["boost"] == 1 and freq["intel_pstate"]["status"] == "active" and freq["intel_pstate"]["no_turbo"] == "0"
    assert freq["amd_pstate"] is None and freq["cmdline"] == ["intel_pstate=active"]
    assert sorted(freq["policies"]) == ["0", "1", "2", "3"] and freq["policies"]["3"]["governor"] == "powersave"
    assert res["virtualization"]["virtualized"] is True and "QEMU" in " ".join(res["virtualization"]["evidence"])
    [proc] = numa["processes"]
    assert proc["pid"] == 4242 and proc["local_nodes"] == [0] and proc["remote_nodes"] == [1] and proc["remote_pct"] == 40.0
    assert numa["irq_cpus"] == "1" and numa["findings"][0]["rules"] == ["remote_memory", "irq_cpus"]
