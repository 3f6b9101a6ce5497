# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight gate (_preflight): module results to findings, the policy, the drift report's changes.

The module results are the real modules' outputs on generated trees and real captures (gpu_health on the real
A100 nvidia-smi capture, platform_facts on a tree) so the adapters see the shape the playbook hands them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import modharness
from ansible_collections.gpunode.tuning.plugins.module_utils import _preflight as P
from ansible_collections.gpunode.tuning.plugins.module_utils._preflight import PreflightError
from ansible_collections.gpunode.tuning.plugins.modules import gpu_health

ROOT = Path(__file__).resolve().parents[4]
SMI = ROOT / "tests" / "unit" / "fixtures" / "gpu_health" / "nvidia_smi"
POLICY = yaml.safe_load((ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text())


def by_check(findings):
    return dict((f["check"], f) for f in findings)


def test_the_shipped_policy_is_valid_and_documents_every_source():
    policy = P.check_policy(POLICY)
    assert policy["rules"][-1] == {"check": "*", "fatal": ["fail"]}
    text = (ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text()
    for source in ("softnet:", "irq:", "cpu_power:", "platform:", "gpu:", "dcgm:", "nccl:"):
        assert source in text


@pytest.mark.parametrize("policy,what", [
    ([], "mapping"),
    ({"rules": "x"}, "mapping"),
    ({"rules": [], "extra": 1}, "mapping"),
    ({"rules": [{"check": "*"}]}, "rules[0]"),
    ({"rules": [{"check": "", "fatal": []}]}, "rules[0]"),
    ({"rules": [{"check": "gpu:*", "fatal": ["fatal"]}]}, "fatal"),
    ({"rules": [{"check": "gpu:*", "fatal": "fail"}]}, "fatal"),
    ({"rules": [{"check": "gpu:*", "fatal": ["pass"]}]}, "other than pass"),
])
def test_bad_policy_names_the_rule_and_value(policy, what):
    with pytest.raises(PreflightError) as exc:
        P.check_policy(policy)
    assert what in str(exc.value) and "expected" in exc.value.details


def test_first_matching_rule_decides_and_unmatched_fail_is_fatal():
    policy = P.check_policy({"rules": [{"check": "gpu:gpu_present", "fatal": ["fail", "not_applicable"]},
                                       {"check": "platform:*", "fatal": []}]})
    found = P.apply_policy([
        {"check": "gpu:gpu_present", "status": "not_applicable"},
        {"check": "platform:thp", "status": "fail"},
        {"check": "softnet:contention", "status": "fail"},
        {"check": "softnet:contention", "status": "warn"},
    ], policy)
    assert [f["fatal"] for f in found] == [True, False, True, False]


def _gpu_result(tmp_path, gpus, monkeypatch):
    sysfs = tmp_path / "sys"
    for index in range(gpus):
        dev = sysfs / "bus/pci/devices" / ("0000:%02x:00.0" % (0x17 + index))
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text("0x030200\n")
    (sysfs / "bus").mkdir(parents=True, exist_ok=True)
    modharness.install_fake_exits(monkeypatch)
    _kind, res = modharness.run(gpu_health, dict(sysfs_path=str(sysfs), nvidia_smi_xml_path=str(SMI / "telegraf_a100-sxm4-v12.xml")))
    return res


def test_gpu_findings_keep_their_gpu_and_get_the_source_prefix(tmp_path, monkeypatch):
    found = P.host_findings({"gpu": _gpu_result(tmp_path, 2, monkeypatch)})
    checks = by_check(found)
    assert checks["gpu:gpu_present"]["status"] == "fail"
    assert checks["gpu:persistence_mode"]["gpu"] == "00000000:01:00.0" and checks["gpu:persistence_mode"]["source"] == "gpu"


def test_a_failed_module_is_a_failed_check_with_its_error():
    found = P.host_findings({"platform": {"failed": True, "msg": "sysfs_path /x is not a sysfs root", "option": "sysfs_path",
                                          "value": "/x"}})
    assert found == [dict(found[0], check="platform:check", status="fail")]
    assert "sysfs_path /x" in found[0]["message"] and found[0]["evidence"] == {"option": "sysfs_path", "value": "/x"}
    assert P.host_findings({"nccl": {"skipped": True}, "gpu": None}) == []


def test_unknown_source_is_refused():
    with pytest.raises(PreflightError) as exc:
        P.host_findings({"gpus": {}})
    assert "gpus" in str(exc.value)


@pytest.mark.parametrize("verdict,status", [("contention", "fail"), ("no_contention", "pass"), ("inconclusive", "unknown")])
def test_softnet_verdicts(verdict, status):
    found = P.host_findings({"softnet": {"verdict": verdict, "reasons": ["r1"], "irq_cpus": [0]}})
    assert found[0]["check"] == "softnet:contention" and found[0]["status"] == status and "r1" in found[0]["message"]


def test_cpu_power_not_visible_is_not_applicable_never_pass():
    found = P.host_findings({"cpu_power": {"findings": [
        {"check": "idle", "status": "not_visible", "verdict": "not_visible", "message": "VM without cpuidle"},
        {"check": "numa_remote", "status": "fail", "verdict": "flagged", "pid": 42, "message": "stress-ng (pid 42): 90 % remote"},
    ]}})
    assert [(f["check"], f["status"]) for f in found] == [("cpu_power:idle", "not_applicable"), ("cpu_power:numa_remote", "fail")]
    assert found[1]["pid"] == 42


def _irq(irq, cpus, kind="queue"):
    return {"irq": irq, "kind": kind, "effective_affinity_list": cpus, "affinity_list": "0-7"}


def test_irq_layout_one_per_cpu_passes_shared_warns_and_irqbalance_must_ban_them():
    nic = {"interface": "ens7", "driver": "mlx5_core", "pci_address": "0000:3b:00.0",
           "irqs": [_irq(30, "0", "control"), _irq(31, "2"), _irq(32, "3")], "irqbalance": {"active": True, "banned_cpus": [2]}}
    found = by_check(P.host_findings({"nic": {"ansible_facts": {"nic_irq": nic}}}))
    assert found["irq:layout"]["status"] == "pass" and "2,3" in found["irq:layout"]["message"]
    assert found["irq:irqbalance"]["status"] == "warn" and "3" in found["irq:irqbalance"]["message"]
    nic["irqs"] = [_irq(31, "2"), _irq(32, "2")]
    nic["irqbalance"] = {"active": False}
    found = by_check(P.host_findings({"nic": {"ansible_facts": {"nic_irq": nic}}}))
    assert found["irq:layout"]["status"] == "warn" and "share" in found["irq:layout"]["message"]
    assert found["irq:irqbalance"]["status"] == "pass"


def test_nccl_verify_probe_hcas_and_variables():
    verify = {"message": "NCCL_TOPO_FILE=/etc/nccl/topo.xml is set", "command": ["podman"], "hcas": ["mlx5_0"],
              "host_hcas": ["mlx5_0", "mlx5_1"], "hcas_missing": ["mlx5_1"], "variables": {"NCCL_TOPO_FILE": "/etc/nccl/topo.xml"}}
    result = {"files": [{"path": "/etc/cdi/gpunode-nccl.yaml", "action": "unchanged"}], "verify": verify}
    found = by_check(P.host_findings({"nccl": result}))
    assert found["nccl:topology"]["status"] == "pass"
    assert found["nccl:container_hcas"]["status"] == "fail" and "mlx5_1" in found["nccl:container_hcas"]["message"]
    assert "NCCL_TOPO_FILE=/etc/nccl/topo.xml" in found["nccl:variables"]["message"]
    result = {"failed": True, "msg": "verification failed: the container has a stale copy",
              "verify": dict(verify, hcas=[], host_hcas=[], hcas_missing=[])}
    failed = by_check(P.host_findings({"nccl": result}))
    assert failed["nccl:topology"]["status"] == "fail" and "stale" in failed["nccl:topology"]["message"]
    assert failed["nccl:container_hcas"]["status"] == "not_applicable"
    drift = by_check(P.host_findings({"nccl": {"files": [{"path": "/etc/nccl/topo.xml", "action": "update"}]}}))
    assert drift["nccl:topology"]["status"] == "fail" and "update /etc/nccl/topo.xml" in drift["nccl:topology"]["message"]


def test_collect_marks_fatal_and_keeps_the_error():
    hosts = P.collect({"a": {"results": {"softnet": {"verdict": "contention", "reasons": []}}, "error": None},
                       "b": {"results": {}, "error": "unreachable"}}, POLICY)
    assert hosts["a"]["findings"][0]["fatal"] is True and hosts["b"] == {"findings": [], "error": "unreachable"}


def test_drift_changes_from_every_report_kind():
    reports = {
        "nic_irq_pinning": {"files": [{"path": "/etc/gpunode/irq.json", "action": "update", "reason": "cpus"}],
                            "drift": ["45 virtio1-input.0: 0 -> 2"], "systemd": ["enable gpunode-irq-pin.service"]},
        "irqbalance": {"files": [], "systemd": [], "restart": False},
        "slurm_cpuspec": {"files": ["/etc/slurm/nodes.conf"]},
        "cpu_power": {"settings": {"writes": [{"path": "/sys/x", "before": "powersave", "after": "performance"}],
                                   "files": [], "kernel_cmdline": {"files": [{"path": "/etc/default/grub", "action": "update"}],
                                                                   "reboot_required": True}}},
        "isolcpus": "not run",
    }
    found = by_check(P.drift_findings(reports))
    assert sorted(found) == ["cpu_power", "irqbalance", "nic_irq_pinning", "slurm_cpuspec"]
    assert found["irqbalance"]["status"] == "pass" and not found["irqbalance"]["fatal"]
    pin = found["nic_irq_pinning"]
    assert pin["status"] == "warn" and pin["fatal"] and pin["evidence"] == [
        "update /etc/gpunode/irq.json (cpus)", "IRQ 45 virtio1-input.0: 0 -> 2", "systemd enable gpunode-irq-pin.service"]
    assert found["slurm_cpuspec"]["evidence"] == ["change /etc/slurm/nodes.conf"]
    assert found["cpu_power"]["evidence"] == ["write /sys/x: powersave -> performance", "update /etc/default/grub"]


def test_tune_playbook_gathers_every_drift_role():
    text = (ROOT / "playbooks" / "tune.yml").read_text()
    roles = re.search(r"for role in \[([^\]]*)\]", text).group(1)
    assert tuple(r.strip().strip("'") for r in roles.split(",")) == P.DRIFT_ROLES


def test_the_policy_file_lists_every_check_the_modules_emit():
    text = (ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text()
    platform = (ROOT / "plugins" / "module_utils" / "_platform.py").read_text()
    smi = (ROOT / "plugins" / "module_utils" / "_nvidia_smi.py").read_text()
    names = set("platform:" + n for n in re.findall(r'\bfinding\("([a-z_0-9]+)"', platform))
    names |= set("gpu:" + n for n in re.findall(r'_finding\(\s*"([a-z_0-9]+)"', smi))
    assert len(names) > 15
    assert sorted(n for n in names if n not in text) == []


def test_irqbalance_ban_is_checked_on_every_cpu_of_a_spread_irq():
    nic = {"interface": "ens7", "driver": "mlx5_core", "pci_address": "0000:3b:00.0",
           "irqs": [dict(_irq(31, None), affinity_list="2-3")], "irqbalance": {"active": True, "banned_cpus": [2]}}
    found = by_check(P.host_findings({"nic": {"ansible_facts": {"nic_irq": nic}}}))
    assert found["irq:layout"]["status"] == "warn" and "several CPUs" in found["irq:layout"]["message"]
    assert found["irq:irqbalance"]["status"] == "warn" and "CPUs 3:" in found["irq:irqbalance"]["message"]
