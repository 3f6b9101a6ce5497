# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight gate (_preflight): module results to findings, the policy, the drift report's changes.

The module results are the real modules' outputs on generated trees and real captures (gpu_health on the real
A100 nvidia-smi capture, platform_facts on a tree, checkpoint_staging in check mode on real directories after the
installed copier ran) so the adapters see the shape the playbook hands them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import install as _ckpt_install
from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload
from ansible_collections.gpunode.tuning.plugins.module_utils._report import preflight as P
from ansible_collections.gpunode.tuning.plugins.module_utils._report.play_collect import collect_play
from ansible_collections.gpunode.tuning.plugins.module_utils._report.preflight import PreflightError
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import staging as _ckpt_staging
from ansible_collections.gpunode.tuning.plugins.modules import checkpoint_staging, gpu_health

ROOT = Path(__file__).resolve().parents[4]
SMI = ROOT / "tests" / "unit" / "fixtures" / "gpu_health" / "nvidia_smi"
POLICY = yaml.safe_load((ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text())


def by_check(findings):
    return dict((f["check"], f) for f in findings)


def test_the_shipped_policy_is_valid_and_documents_every_source():
    policy = P.check_policy(POLICY)
    assert policy["rules"][-1] == {"check": "*", "fatal": ["fail"]}
    text = (ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text()
    for source in ("softnet:", "irq:", "cpu_power:", "platform:", "gpu:", "dcgm:", "nccl:", "checkpoint:"):
        assert source in text


@pytest.mark.parametrize("policy,what", [
    ([], "mapping"),
    ({"rules": "x"}, "mapping"),
    ({"rules": [], "extra": 1}, "mapping"),
    ({"rules": [{"check": "*"}]}, "rules[0]"),
    ({"rules": [{"check": "", "fatal": []}]}, "rules[0]"),
    ({"rules": [{"check": "gpu:*", "fatal": ["fatal"]}]}, "fatal"),
    ({"rules": [{"check": "gpu:*", "fatal": "fail"}]}, "fatal"),
    ({"rules": [{"check": "gpu:*", "fatal": ["pass"]}]}, "'pass', which is not a status that can be fatal"),
    ({"rules": [{"check": "gpu:*", "fatal": ["not_aplicable"]}]},
     "'not_aplicable', which is not a status that can be fatal; the statuses are fail, warn, unknown, not_applicable"),
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


@pytest.mark.parametrize("verdict,status", [("contention", "fail"), ("no_contention", "pass"), ("inconclusive", "unknown"),
                                            ("idle", "not_applicable")])
def test_softnet_verdicts(verdict, status):
    found = P.host_findings({"softnet": {"verdict": verdict, "reasons": ["r1"], "irq_cpus": [0]}})
    assert found[0]["check"] == "softnet:contention" and found[0]["status"] == status and "r1" in found[0]["message"]
    assert len(found) == 1


def test_softnet_saturated_irq_cpus_are_a_warning_beside_the_verdict():
    saturated = {"name": "irq_cpus_saturated", "title": "IRQ CPUs saturated by packet rate", "cpus": [2],
                 "reason": "IRQ CPUs 2 squeeze at or above 0.5 per s", "remedy": "more IRQ CPUs or RPS"}
    found = P.host_findings({"softnet": {"verdict": "no_contention", "reasons": ["r1"], "irq_cpus": [2],
                                         "findings": [saturated]}})
    assert [(f["check"], f["status"]) for f in found] == [("softnet:contention", "pass"), ("softnet:irq_saturation", "warn")]
    assert found[1]["fix"] == "more IRQ CPUs or RPS" and found[1]["evidence"] == {"cpus": [2]}


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
        "IRQ 45 virtio1-input.0: 0 -> 2", "systemd enable gpunode-irq-pin.service", "update /etc/gpunode/irq.json (cpus)"]
    assert found["slurm_cpuspec"]["evidence"] == ["change /etc/slurm/nodes.conf"]
    assert found["cpu_power"]["evidence"] == ["write /sys/x: powersave -> performance", "update /etc/default/grub"]


def test_tune_playbook_gathers_every_drift_role():
    """tune.yml gathers the role reports with collect_play('drift'), which takes every role of DRIFT_ROLES."""
    text = (ROOT / "playbooks" / "tune.yml").read_text()
    assert "gpunode.tuning.collect_play('drift', ansible_play_hosts_all, ansible_play_hosts)" in text
    hostvars = {"n1": dict((role + "_report", {"role": role}) for role in P.DRIFT_ROLES)}
    assert tuple(collect_play(hostvars, "drift", ["n1"], ["n1"])["n1"]["reports"]) == P.DRIFT_ROLES


def test_the_policy_file_lists_every_check_the_modules_emit():
    text = (ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text()
    platform = (ROOT / "plugins" / "module_utils" / "_gpu" / "platform.py").read_text()
    smi = (ROOT / "plugins" / "module_utils" / "_gpu" / "nvidia_smi.py").read_text()
    names = set("platform:" + n for n in re.findall(r'\bfinding\("([a-z_0-9]+)"', platform))
    names |= set("gpu:" + n for n in re.findall(r'_finding\(\s*"([a-z_0-9]+)"', smi))
    # The adapters that name their checks themselves (nccl_topology's and checkpoint_staging's results).
    own = set(re.findall(r'\bfinding\("((?:nccl|checkpoint):[a-z_0-9]+)"', (ROOT / "plugins" / "module_utils" / "_report" / "preflight.py").read_text()))
    assert {"nccl:topology", "checkpoint:copier", "checkpoint:staging_usage"} <= own
    names |= own
    assert len(names) > 15
    assert sorted(n for n in names if n not in text) == []


def test_irqbalance_ban_is_checked_on_every_cpu_of_a_spread_irq():
    nic = {"interface": "ens7", "driver": "mlx5_core", "pci_address": "0000:3b:00.0",
           "irqs": [dict(_irq(31, None), affinity_list="2-3")], "irqbalance": {"active": True, "banned_cpus": [2]}}
    found = by_check(P.host_findings({"nic": {"ansible_facts": {"nic_irq": nic}}}))
    assert found["irq:layout"]["status"] == "warn" and "several CPUs" in found["irq:layout"]["message"]
    assert found["irq:irqbalance"]["status"] == "warn" and "CPUs 3:" in found["irq:irqbalance"]["message"]


# ---------------------------------------------------------------- checkpoint --
# checkpoint_staging in check mode, as preflight.yml runs the role, on real directories: a SYNTHETIC mount table
# (the target on an NFS mount), the unit files under tmp_path and systemd faked (no systemd runs as PID 1 here): the
# units run once "enable --now" was applied. The installed entry point is run as the node runs it to make the state.

class CkptNode:
    """One node's checkpoint copier: install(), stage(), copier() (a pass of the installed entry point), check() (the
    module's check-mode result as the role registers it, with preflight.yml's threshold)."""

    def __init__(self, tmp_path, monkeypatch):
        self.tmp = tmp_path
        self.staging, self.target = tmp_path / "nvme" / "ckpt", tmp_path / "nfs" / "ckpt"
        self.target.mkdir(parents=True)
        self.mount(True)
        units = tmp_path / "units"
        units.mkdir()
        monkeypatch.setattr(_ckpt_install, "UNIT_DIR", str(units))
        monkeypatch.setattr(checkpoint_staging, "UNIT_DIR", str(units))
        running = {}

        class Units(object):
            """systemd for the copier's units: enable starts them (no systemd runs as PID 1 here)."""

            def __init__(self, check):
                self.check, self.actions = check, []

            def show(self, units, properties=()):
                return dict((u, dict(running)) for u in units)

            def do(self, argv, label=None, undo=()):
                self.actions.append(label or " ".join(argv[1:]))
                if not self.check and argv[1] == "enable":
                    running.update(UnitFileState="enabled", ActiveState="active")

        monkeypatch.setattr(_ckpt_staging, "_systemd", lambda target, state: Units(target.check))
        # The state file must be in a StateDirectory= under /var/lib: here under tmp_path/var.
        monkeypatch.setattr(_ckpt_install, "STATE_ROOT", str(tmp_path / "var"))
        modharness.install_fake_exits(monkeypatch)
        self.args = dict(staging_dir=str(self.staging), target_dir=str(self.target),
                         mountinfo_path=str(tmp_path / "mountinfo"), config_file=str(tmp_path / "etc" / "ckpt-copier.json"),
                         state_file=str(tmp_path / "var" / "gpunode-ckpt" / "state.json"), lib_dir=str(tmp_path / "lib"),
                         entry_point=str(tmp_path / "sbin" / "gpunode-ckpt-copier"), python=sys.executable,
                         watermark_percent=100, unit_dir=str(units), staging_owner="root", allow_root_copier=True)

    def mount(self, nfs):
        """The mount table with the target's NFS mount, or without it (the mount went away)."""
        text = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        if nfs:
            text += "40 22 0:45 / %s rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2,hard\n" % (self.tmp / "nfs")
        (self.tmp / "mountinfo").write_text(text)

    def install(self, **over):
        kind, res = modharness.run(checkpoint_staging, dict(self.args, **over))
        assert kind is Exit and res["changed"], res
        return res

    def check(self, max_pending=None, **over):
        kind, res = modharness.run(checkpoint_staging, dict(self.args, **over), check=True)
        if kind is Fail:
            res = dict(res, failed=True)  # fail_json adds failed: true to what the harness hands back
        if max_pending is not None:
            res = dict(res, preflight_max_pending_seconds=max_pending)
        return res

    def stage(self, name, age):
        path = self.staging / name
        path.write_bytes(b"c" * 4096)
        then = time.time() - age
        os.utime(path, (then, then))

    def copier(self, *flags):
        env = dict(os.environ, PYTHONPATH="")  # only the installed library
        return subprocess.run([self.args["entry_point"]] + list(flags) + [self.args["config_file"]], capture_output=True,
                              text=True, env=env, check=True).stdout


@pytest.fixture
def node(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("installing the copier (files owned by root, the staging directory chowned) needs root")
    return CkptNode(tmp_path, monkeypatch)


def test_checkpoint_copier_not_installed_then_installed_then_drifted(node):
    found = P.host_findings({"checkpoint": node.check()})
    # No staging directory yet, so no copier status: only checkpoint:copier is reported.
    assert [f["check"] for f in found] == ["checkpoint:copier"]
    copier = found[0]
    files = len(node.check()["files"])
    assert copier["status"] == "fail" and copier["message"] == (
        "the copier is not installed: %d file(s) to create; create staging directory %s (missing); systemctl daemon-reload; "
        "systemctl enable --now gpunode-ckpt-copier.path; systemctl enable --now gpunode-ckpt-copier.timer" % (files, node.staging))
    assert "create %s (missing)" % node.args["config_file"] in copier["evidence"] and len(copier["evidence"]) == files + 4
    assert copier["fix"] == "run tune.yml with gpunode_tune_checkpoint_staging"
    node.install()
    found = by_check(P.host_findings({"checkpoint": node.check()}))
    assert sorted(found) == ["checkpoint:copier", "checkpoint:durable", "checkpoint:staging_usage", "checkpoint:target"]
    assert found["checkpoint:copier"]["status"] == "pass"
    assert found["checkpoint:copier"]["message"] == "installed and running: %s -> %s (nfs4 server:/export on %s)" % (
        node.staging, node.target, node.tmp / "nfs")
    drifted = by_check(P.host_findings({"checkpoint": node.check(completion="marker")}))["checkpoint:copier"]
    assert drifted["status"] == "fail" and drifted["message"] == (
        "the copier differs from the desired state: 1 change(s): update %s (content differs)" % node.args["config_file"])
    os.chmod(node.staging, 0o755)
    drifted = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:copier"]
    assert drifted["evidence"] == ["update staging directory %s (mode 0755, want 0750)" % node.staging]


def test_checkpoint_copier_module_failure_is_the_only_finding(node):
    node.install()
    node.mount(False)
    found = P.host_findings({"checkpoint": node.check(max_pending=900)})
    assert [(f["check"], f["status"]) for f in found] == [("checkpoint:copier", "fail")]
    assert "not on a mounted shared filesystem" in found[0]["message"] and found[0]["evidence"]["option"] == "target_dir"
    assert found[0]["fix"].endswith("run tune.yml with gpunode_tune_checkpoint_staging")
    hosts = P.collect({"a": {"results": {"checkpoint": node.check()}, "error": None}}, POLICY)
    assert hosts["a"]["findings"][0]["fatal"] is True


def test_checkpoint_state_absent_is_not_applicable(node):
    found = P.host_findings({"checkpoint": node.check(state="absent")})
    assert [(f["check"], f["status"]) for f in found] == [("checkpoint:copier", "not_applicable")]


def test_checkpoint_durable_late_complete_fails_young_passes_incomplete_never_fails(node):
    node.install()
    node.stage("step-100.pt", 2000)
    node.stage("step-200.pt", 100)
    node.stage("step-300.pt.tmp", 5000)
    found = by_check(P.host_findings({"checkpoint": node.check(max_pending=900)}))
    durable = found["checkpoint:durable"]
    assert durable["status"] == "fail"
    assert re.match(r"1 complete checkpoint\(s\) not yet on shared storage, oldest step-100\.pt 20\d\d s \(limit 900 s\); "
                    r"1 being written \(never copied until complete\): step-300\.pt\.tmp: temporary name", durable["message"])
    assert durable["evidence"]["max_pending_seconds"] == 900 and len(durable["evidence"]["complete"]) == 2
    # The same staging with a longer limit (as -e passes it: text): waiting, not late.
    durable = by_check(P.host_findings({"checkpoint": node.check(max_pending="3600")}))["checkpoint:durable"]
    assert durable["status"] == "pass" and durable["message"].startswith(
        "2 complete checkpoint(s) waiting for the copier, oldest step-100.pt")
    # Without the playbook's value the default applies.
    assert by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:durable"]["status"] == "fail"
    assert "copied step-100.pt" in node.copier()
    durable = by_check(P.host_findings({"checkpoint": node.check(max_pending=900)}))["checkpoint:durable"]
    assert durable["status"] == "pass" and durable["message"].startswith(
        "no complete checkpoint waiting: every one is on shared storage; 1 being written")
    assert sorted(os.listdir(node.target)) == ["step-100.pt", "step-200.pt"]


@pytest.mark.parametrize("value", ["soon", -1, True, float("nan")])
def test_checkpoint_bad_threshold_names_the_variable(node, value):
    node.install()
    with pytest.raises(PreflightError) as exc:
        P.host_findings({"checkpoint": node.check(max_pending=value)})
    assert "preflight_checkpoint_max_pending_seconds" in str(exc.value) and exc.value.details["expected"] == "seconds, 0 or more"


def test_checkpoint_target_outage_fails_until_a_copy_succeeds(node):
    node.install()
    target = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:target"]
    assert target["status"] == "pass" and target["message"].startswith("nothing copied yet and no failed attempt")
    node.stage("step-100.pt", 60)
    node.mount(False)  # the NFS mount went away: the copier must not copy into the empty mount point
    out = node.copier()
    assert "failed" in out
    node.mount(True)  # back, but the copier is backing off
    state = json.loads(Path(node.args["state_file"]).read_text())
    assert state["backoff"]["until"] > time.time() and state["last_error"]["entry"] is None
    target = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:target"]
    assert target["status"] == "fail" and target["message"].startswith(
        "the copier cannot reach the target: target %s unavailable: target_dir %s is not on a mounted shared filesystem" % (
            node.target, node.target))
    assert ", retrying (backoff until 20" in target["message"] and target["message"].endswith("Z) (1 failed attempt(s) in all)")
    assert target["evidence"]["last_error"] == state["last_error"]
    assert "NFS mount of %s" % node.target in target["fix"]
    # A state without the backoff (only a copy clears it): the last error is still newer than any copy.
    state["backoff"] = {"seconds": 0, "until": 0}
    Path(node.args["state_file"]).write_text(json.dumps(state))
    target = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:target"]
    assert target["status"] == "fail" and target["message"].endswith(" filesystem (it is on /), retrying (1 failed attempt(s) in all)")
    assert "copied step-100.pt" in node.copier()
    target = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:target"]
    assert target["status"] == "pass" and target["message"].startswith("no failed attempt since the last copy (1 copied;")


def test_checkpoint_staging_usage_at_the_watermark_fails_and_names_the_pause_file(node):
    pause = node.tmp / "var" / "gpunode-ckpt" / "ckpt-pause"  # in the copier's state directory: it may write there
    pause.parent.mkdir(parents=True, exist_ok=True)
    node.install(watermark_percent=0, pause_file=str(pause))
    node.stage("step-100.pt.tmp", 10)
    node.copier()
    assert pause.exists()
    usage = by_check(P.host_findings({"checkpoint": node.check(watermark_percent=0, pause_file=str(pause))}))
    usage = usage["checkpoint:staging_usage"]
    assert usage["status"] == "fail" and "at or above the watermark 0 %" in usage["message"]
    assert usage["message"].endswith("the copier creates %s: the trainer is told to pause checkpointing" % pause)
    assert usage["evidence"]["watermark_percent"] == 0 and usage["evidence"]["usage_percent"] >= 0
    node.install()
    usage = by_check(P.host_findings({"checkpoint": node.check()}))["checkpoint:staging_usage"]
    assert usage["status"] == "pass" and re.match(r"staging \S+ is [\d.]+ % full, watermark 100 %$", usage["message"])
    usage = by_check(P.host_findings({"checkpoint": node.check(watermark_percent=0)}))["checkpoint:staging_usage"]
    assert usage["message"].endswith("no pause_file is set: the trainer is not told to pause")


def test_checkpoint_staging_report_is_one_line_per_change_in_the_drift_report(node):
    """The role's checkpoint_staging_report as tasks/main.yml builds it: the changed files and the staging directory
    (their path, action and reason), the systemd actions; tune.yml's drift report lists each once."""
    def report(res):
        files = [f for f in res["files"] + [res.get("staging", {"action": "unchanged"})] if f["action"] != "unchanged"]
        return {"state": "present", "check_mode": True, "files": files, "systemd": res["systemd"],
                "copier_status": res.get("copier_status")}

    res = node.check()
    found = by_check(P.drift_findings({"checkpoint_staging": report(res)}))["checkpoint_staging"]
    assert found["status"] == "warn" and found["fatal"] and not any(line.startswith("IRQ ") for line in found["evidence"])
    assert "create %s (missing)" % node.staging in found["evidence"]
    assert "systemd enable --now gpunode-ckpt-copier.timer" in found["evidence"]
    # Every change the module's own drift lines name, once; the collection's library files in one line.
    library = [line for line in res["drift"] if "/ansible_collections/" in line or _payload.MANIFEST in line]
    assert library and found["evidence"][-1].startswith("%d library files of the collection under " % len(library))
    assert len(found["evidence"]) == len(res["drift"]) - len(library) + 1 + len(
        [a for a in res["systemd"] if not a.startswith("enable")])
    node.install()
    found = by_check(P.drift_findings({"checkpoint_staging": report(node.check())}))["checkpoint_staging"]
    assert found["status"] == "pass" and found["message"] == "in sync"


def test_checkpoint_quarantined_entries_fail_durable_whatever_their_age(tmp_path):
    """A checkpoint the copier quarantined (issue 27) is never durable until someone acts: checkpoint:durable fails
    and names it with the copier's reason, even when it was staged a second ago. The copier's real status() is used."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import config as _ckpt_config  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import entries as _ckpt_entries  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import state as _ckpt_state  # pylint: disable=import-outside-toplevel
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    target.mkdir()
    cfg = _ckpt_config.check_config({"staging_dir": str(staging), "target_dir": str(target),
                                     "state_file": str(tmp_path / "state.json")})
    os.mkfifo(staging / "fresh.pt")
    state = _ckpt_state.empty_state()
    entry = _ckpt_entries.scan(cfg)[0]
    state["entries"]["fresh.pt"] = {"failures": 5, "until": 0, "reason": "fresh.pt is a FIFO", "quarantined": True,
                                    "since": time.time(), "key": [entry["ino"], entry["mtime"]]}
    _ckpt_state.save_state(cfg["state_file"], state)
    result = {"config": {"staging_dir": str(staging), "target_dir": str(target)}, "files": [], "systemd": [],
              "copier_status": _ckpt_state.status(cfg)}
    found = by_check(P.host_findings({"checkpoint": result}))["checkpoint:durable"]
    assert found["status"] == "fail" and found["evidence"]["quarantined"] == ["fresh.pt: fresh.pt is a FIFO"]
    assert found["message"] == ("1 checkpoint(s) quarantined by the copier, never copied until fixed: "
                                "fresh.pt: fresh.pt is a FIFO")
    result["copier_status"]["quarantined"] = []
    assert by_check(P.host_findings({"checkpoint": result}))["checkpoint:durable"]["status"] == "pass"


def test_checkpoint_target_judges_only_the_targets_own_error(tmp_path):
    """One refused entry (a link out of staging, issue 27) makes last_error newer than every copy, but the target is
    fine: checkpoint:target passes and says where the entry's failure is; a failure of the target itself fails it.
    The copier's real run_pass and status() are used."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import config as _ckpt_config  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import passes as _ckpt_passes  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import state as _ckpt_state  # pylint: disable=import-outside-toplevel
    staging, target, outside = tmp_path / "staging", tmp_path / "target", tmp_path / "secret"
    staging.mkdir()
    target.mkdir()
    outside.write_bytes(b"not a checkpoint")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                         "40 22 0:45 / %s rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2,hard\n" % target)
    mount = {"point": str(target), "fstype": "nfs4", "source": "server:/export"}
    cfg = _ckpt_config.check_config({"staging_dir": str(staging), "target_dir": str(target), "retry_min": 5,
                                     "state_file": str(tmp_path / "state.json"), "mountinfo_path": str(mountinfo),
                                     "target_mount": mount})
    now = time.time()
    os.symlink(str(outside), str(staging / "link.pt"))
    summary = _ckpt_passes.run_pass(cfg, log=lambda line: None, clock=lambda: now)
    assert summary["entry_failures"] and summary["failed"] is None, summary
    result = {"config": {"staging_dir": str(staging), "target_dir": str(target)}, "files": [], "systemd": [],
              "copier_status": _ckpt_state.status(cfg, now=now)}
    found = by_check(P.host_findings({"checkpoint": result}))
    assert found["checkpoint:target"]["status"] == "pass", found["checkpoint:target"]
    assert "link.pt" in found["checkpoint:target"]["message"]
    assert found["checkpoint:target"]["evidence"]["last_target_error"] is None
    # The target's own failure still fails it, and an older copier's status (no last_target_error) is judged as before.
    mountinfo.write_text("22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n")
    (staging / "ok.pt").write_bytes(b"ok")
    summary = _ckpt_passes.run_pass(cfg, log=lambda line: None, clock=lambda: now + 100, force=True)
    assert summary["failed"]["entry"] is None, summary
    result["copier_status"] = _ckpt_state.status(cfg, now=now + 100)
    target_found = by_check(P.host_findings({"checkpoint": result}))["checkpoint:target"]
    assert target_found["status"] == "fail" and "not on a mounted shared filesystem" in target_found["message"]
    legacy = dict(result["copier_status"], backoff_until=None)
    del legacy["last_target_error"]
    legacy["last_error"] = dict(legacy["last_error"], entry="link.pt")
    assert by_check(P.host_findings({"checkpoint": dict(result, copier_status=legacy)}))["checkpoint:target"][
        "status"] == "fail"


# ---------------------------------------------------------------------- dcgm --
# Issue 29 class 5: diagnostics that did not run are never a silent GO. The dcgmi tables are the real captures of
# tests/unit/fixtures/gpu_health/dcgmi; "every GPU test skipped" is the ORNL P100 level 2 capture with its two
# remaining "Pass - All" rows set to "Skip - All" (the pattern of DCGM#55, where a level 3 run skipped everything
# beyond the Deployment checks; that issue's table is published truncated).

DCGMI = ROOT / "tests" / "unit" / "fixtures" / "gpu_health" / "dcgmi"
STRICT = yaml.safe_load((ROOT / "playbooks" / "files" / "preflight_policy_strict.yml").read_text())


def _gpu_with_dcgm(tmp_path, monkeypatch, text, level=0):
    sysfs = tmp_path / "sys"
    dev = sysfs / "bus/pci/devices/0000:17:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    args = dict(sysfs_path=str(sysfs), nvidia_smi_xml_path=str(SMI / "telegraf_a100-sxm4-v12.xml"), dcgm_level=level)
    if text is not None:
        (tmp_path / "dcgmi.txt").write_text(text)
        args["dcgmi_output_path"] = str(tmp_path / "dcgmi.txt")
    modharness.install_fake_exits(monkeypatch)
    _kind, res = modharness.run(gpu_health, args)
    return res


def _gate(res, policy):
    hosts = P.collect({"n1": {"results": {"gpu": res}, "error": None}}, policy)
    found = by_check(hosts["n1"]["findings"])
    # build_report takes GPU indexes; _nvidia_smi's per-GPU findings carry PCI bus ids (reported separately), so the
    # report here is built from the findings without one.
    hosts["n1"]["findings"] = [f for f in hosts["n1"]["findings"] if not isinstance(f.get("gpu"), str)]
    return found, hosts


def test_every_gpu_test_skipped_is_a_warning_by_default_and_fatal_when_strict(tmp_path, monkeypatch):
    skipped = (DCGMI / "dcgm_p100_level2_skip_all_ornl_doc.txt").read_text().replace("Pass - All", "Skip - All")
    res = _gpu_with_dcgm(tmp_path, monkeypatch, skipped)
    found, hosts = _gate(res, POLICY)
    dcgm = found["gpu:dcgm"]
    assert dcgm["status"] == "warn" and dcgm["fatal"] is False
    assert "GPU diagnostics did not run: all 6 tests beyond the Deployment checks were skipped" in dcgm["message"]
    assert dcgm["evidence"]["gpu_tests_skipped"] == ["GPU Memory", "Diagnostic", "PCIe", "SM Performance",
                                                     "Targeted Performance", "Targeted Power"]
    from ansible_collections.gpunode.tuning.plugins.module_utils._report.cluster import build_report
    report = build_report("preflight", "t", hosts, "now")
    assert report["gate"] == "go" and "warn" in report["gate_text"]  # GO, but saying so
    found, hosts = _gate(res, P.check_policy(STRICT))
    assert found["gpu:dcgm"]["fatal"] is True and found["dcgm:PCIe"]["fatal"] is True
    assert build_report("preflight", "t", hosts, "now")["gate"] == "no_go"


def test_a_run_with_no_test_at_all_is_a_warning(tmp_path, monkeypatch):
    text = (DCGMI / "dcgm_level1_deployment_prolog_uber_prof.txt").read_text().replace("| Pass ", "| Skip ")
    found, _hosts = _gate(_gpu_with_dcgm(tmp_path, monkeypatch, text), POLICY)
    assert found["gpu:dcgm"]["status"] == "warn" and "dcgmi diag ran no test: all 9 were skipped" in found["gpu:dcgm"]["message"]


def test_real_runs_that_ran_pass_and_count_their_skips(tmp_path, monkeypatch):
    found, _hosts = _gate(_gpu_with_dcgm(tmp_path / "a", monkeypatch,
                                         (DCGMI / "dcgm_p100_level2_skip_all_ornl_doc.txt").read_text()), POLICY)
    assert found["gpu:dcgm"]["status"] == "pass" and found["gpu:dcgm"]["message"].startswith("dcgmi diag ran 10 of 15 tests")
    assert found["dcgm:Diagnostic"]["status"] == "not_applicable" and found["dcgm:Diagnostic"]["fatal"] is False
    found, _hosts = _gate(_gpu_with_dcgm(tmp_path / "b", monkeypatch,
                                         (DCGMI / "dcgm_level1_deployment_prolog_uber_prof.txt").read_text()), POLICY)
    assert found["gpu:dcgm"]["status"] == "pass" and found["gpu:dcgm"]["message"] == "dcgmi diag ran 9 of 9 tests"


def test_diagnostics_not_run_on_a_gpu_node_say_so(tmp_path, monkeypatch):
    found, _hosts = _gate(_gpu_with_dcgm(tmp_path, monkeypatch, None, level=0), POLICY)
    assert found["gpu:dcgm"]["status"] == "warn" and "dcgm_level 0" in found["gpu:dcgm"]["message"]
    assert found["gpu:dcgm"]["fatal"] is False
    found, _hosts = _gate(_gpu_with_dcgm(tmp_path / "s", monkeypatch, None, level=0), P.check_policy(STRICT))
    assert found["gpu:dcgm"]["fatal"] is True


def test_the_strict_policy_is_valid_and_documented():
    policy = P.check_policy(STRICT)
    assert {"check": "gpu:dcgm", "fatal": ["fail", "warn", "unknown", "not_applicable"]} in policy["rules"]
    header = (ROOT / "playbooks" / "preflight.yml").read_text()
    assert "files/preflight_policy_strict.yml" in header
    assert "preflight_policy_strict.yml" in (ROOT / "playbooks" / "files" / "preflight_policy.yml").read_text()


def test_per_gpu_findings_reach_every_rendering_of_the_cluster_report(tmp_path, monkeypatch):
    """gpu_health names each GPU by its PCI bus id (nvidia-smi's own key); the cluster report took only integer
    indexes, so a real GPU node's preflight failed building its report. The real A100 capture, the real module, the
    default policy, then every rendering."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._report import cluster as C
    from ansible_collections.gpunode.tuning.plugins.module_utils._report import render as R
    res = _gpu_result(tmp_path, 2, monkeypatch)
    hosts = P.collect({"gpu-a": {"results": {"gpu": res}, "error": None}}, POLICY)
    per_gpu = [f for f in hosts["gpu-a"]["findings"] if isinstance(f.get("gpu"), str)]
    assert per_gpu and all(C._BUS_ID.match(f["gpu"]) for f in per_gpu)  # pylint: disable=protected-access
    report = C.build_report("preflight", "t", hosts, "now")
    assert "gpu 00000000:01:00.0" in R.render_junit(report)
    assert R.render_markdown(report) and R.render_html(report) and R.render_lines(report)
    with pytest.raises(C.ClusterReportError) as exc:
        C.build_report("preflight", "t", {"h": {"findings": [dict(per_gpu[0], gpu="01:00.0; rm")], "error": None}}, "now")
    assert "PCI bus id" in exc.value.details["expected"]
