# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/preflight.yml against local inventory hosts, each reading its own generated tree.

As in test_diagnose_playbook: every host is ``ansible_connection=local`` with its procfs/sysfs roots at a tree
from tests/unit/treegen.py, and one background writer advances the softnet and interrupt counters while the play
samples. One host has an NVIDIA GPU on its PCI bus and no driver (a real failure the gate must stop); one carries
the seed's contention. The lab (molecule preflight) runs the same playbook on a real kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The Ansible of the interpreter that runs the tests (the CI matrix runs them on each supported ansible-core).
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "softnet_load"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reportcheck  # noqa: E402
import softnet_load  # noqa: E402
import treegen  # noqa: E402
from cpuidle_tree import sysfs_from_idle_info  # noqa: E402
from cpupower_capture import parse_idle_info  # noqa: E402
from test_diagnose_playbook import SPEED, affinities, node_spec  # noqa: E402

pytestmark = pytest.mark.playbook

# A real server's idle states (cpupower idle-info of a Xeon with intel_idle, C1/C1E/C6 enabled) on every tree.
IDLE = ROOT / "tests" / "unit" / "fixtures" / "cpu_power" / "cpupower" / "idle_intel_idle_server_c6.txt"
# host -> (profile, NVIDIA GPUs on the bus without a driver)
HOSTS = {"gpu-a": ("seed_contention", 0), "gpu-c": ("healthy", 0), "gpu-g": ("healthy", 1)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("preflight")
    trees, lines = [], ["[gpu]"]
    for host, (profile, gpus) in HOSTS.items():
        spec = node_spec()
        tree = treegen.build_tree(base / host, spec)
        sysfs_from_idle_info(parse_idle_info(IDLE.read_text()), "0-7", Path(tree.sys))
        for index in range(gpus):
            dev = Path(tree.sys) / "bus/pci/devices" / ("0000:%02x:00.0" % (0x17 + index))
            dev.mkdir(parents=True)
            (dev / "vendor").write_text("0x10de\n")
            (dev / "class").write_text("0x030200\n")
        load = softnet_load.PROFILES[profile](list(range(8)), [0, 1, 2, 3], "ens7", SPEED)
        load["width"] = 13
        trees.append({"proc": tree.proc, "profile": load})
        lines.append("%s diagnose_procfs_path=%s diagnose_sysfs_path=%s" % (host, tree.proc, tree.sys))
    lines += ["", "[gpu:vars]", "ansible_connection=local", "ansible_python_interpreter={{ ansible_playbook_python }}"]
    inventory = base / "inventory.ini"
    inventory.write_text("\n".join(lines) + "\n")
    process, stop_file = softnet_load.start_writer({"trees": trees, "period": 0.1, "max_seconds": 600}, base)
    yield base, inventory
    softnet_load.stop_writer(process, stop_file)


def run_preflight(inventory, report_dir, *extra):
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.environ["ANSIBLE_COLLECTIONS_PATH"]  # set by tests/conftest.py
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORKS"] = "6"
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "preflight.yml"),
            "-e", "diagnose_interval=1", "-e", "diagnose_window_margin=1", "-e", "preflight_become=false",
            "-e", "preflight_report_dir=%s" % report_dir] + list(extra)
    return subprocess.run(argv, env=env, cwd=str(report_dir.parent), capture_output=True, text=True, timeout=300, check=False)


def findings(report, host):
    return dict((f["check"], f) for h in report["hosts"] if h["host"] == host for f in h["findings"])


def test_preflight_gates_on_the_fatal_findings_and_writes_four_reports(fleet):
    base, inventory = fleet
    before = affinities(base)
    report_dir = base / "report-all"
    result = run_preflight(inventory, report_dir)
    # NO-GO: ansible-playbook exits non-zero, and names the fatal checks per host.
    assert result.returncode != 0, result.stdout[-4000:]
    out = result.stdout + result.stderr
    assert re.search(r"NO-GO: [^\n]*softnet:contention", out) and re.search(r"NO-GO: [^\n]*gpu:gpu_present", out), out[-4000:]
    report = json.loads((report_dir / "cluster.json").read_text())
    assert report["kind"] == "preflight" and report["gate"] == "no_go"
    fatal = sorted(h["host"] for h in report["hosts"] if h["fatal"])
    assert fatal == ["gpu-a", "gpu-g"], [(h["host"], [f["check"] for f in h["findings"] if f["fatal"]]) for h in report["hosts"]]
    a, c, g = findings(report, "gpu-a"), findings(report, "gpu-c"), findings(report, "gpu-g")
    assert a["softnet:contention"]["status"] == "fail" and a["softnet:contention"]["fatal"]
    assert c["softnet:contention"]["status"] == "pass"
    assert g["gpu:gpu_present"]["status"] == "fail" and "1 NVIDIA GPU(s) on the PCI bus" in g["gpu:gpu_present"]["message"]
    # No GPU on gpu-c: said as such, not a pass, and not fatal under the default policy.
    assert c["gpu:gpu_present"]["status"] == "not_applicable" and not c["gpu:gpu_present"]["fatal"]
    # Every source ran on every host: the IRQ layout, CPU power, platform checks.
    for host in HOSTS:
        checks = findings(report, host)
        assert {"irq:layout", "softnet:contention", "gpu:gpu_present", "platform:smmuv3", "cpu_power:idle"} <= set(checks), sorted(checks)
        assert not any(check.endswith(":check") for check in checks), [checks[k] for k in checks if k.endswith(":check")]
    # The four formats agree.
    junit = reportcheck.junit(report_dir / "cluster.junit.xml")
    assert junit.tag == "testsuites" and int(junit.get("failures")) == report["counts"]["fatal"] >= 2
    suites = dict((s.get("name"), s) for s in junit.iter("testsuite"))
    assert sorted(suites) == sorted(HOSTS) and int(suites["gpu-c"].get("failures")) == 0
    page = reportcheck.grid(report_dir / "cluster.html")
    assert page.gate == "no-go" and page.rows == len(report["rows"]) >= 2
    markdown = (report_dir / "cluster.md").read_text()
    assert "NO-GO" in markdown and "gpu:gpu_present" in markdown
    assert affinities(base) == before                         # read-only


def test_preflight_of_healthy_hosts_is_go_and_check_mode_changes_nothing(fleet):
    base, inventory = fleet
    before = affinities(base)
    for mode in ((), ("--check",)):
        report_dir = base / ("report-go%s" % "-".join(mode))
        result = run_preflight(inventory, report_dir, "--limit", "gpu-c", *mode)
        assert result.returncode == 0, result.stdout[-4000:]
        report = json.loads((report_dir / "cluster.json").read_text())
        assert report["gate"] == "go" and report["gate_text"].startswith("GO"), report["gate_text"]
        assert "GO" in result.stdout
    assert affinities(base) == before


def test_a_bad_policy_stops_before_any_check(fleet):
    base, inventory = fleet
    policy = base / "policy.yml"
    policy.write_text("rules:\n  - check: 'gpu:*'\n    fatal: [not_aplicable]\n")
    report_dir = base / "report-bad-policy"
    # Relative to the directory ansible-playbook runs in (run_preflight runs it in report_dir's parent, base), as
    # the playbook header's example gives it.
    assert report_dir.parent == base
    result = run_preflight(inventory, report_dir, "-e", "preflight_policy_file=policy.yml")
    assert result.returncode != 0
    # The typo is named, and so are the statuses it could have been.
    assert ("policy rules[0] (check gpu:*) fatal has 'not_aplicable', which is not a status that can be fatal; the "
            "statuses are") in result.stdout and "not_applicable" in result.stdout, result.stdout[-3000:]
    assert "Start sampling" not in result.stdout and not report_dir.exists()


def test_a_checkpoint_copier_that_cannot_be_installed_is_fatal_and_nothing_is_written(fleet):
    """checkpoint_staging_dir turns the checkpoint checks on: the role runs in check mode on the host. The target
    here is no mount of its own (or shares the staging filesystem), which the module refuses: checkpoint:copier
    fails with its message, nothing else of the copier is judged, nothing is created."""
    base, inventory = fleet
    staging, target = base / "ckpt-nvme" / "ckpt", base / "ckpt-nfs" / "ckpt"
    target.mkdir(parents=True)
    report_dir = base / "report-checkpoint"
    result = run_preflight(inventory, report_dir, "--limit", "gpu-c", "-e", "checkpoint_staging_dir=%s" % staging,
                           "-e", "checkpoint_staging_target_dir=%s" % target, "-e", "preflight_checkpoint_max_pending_seconds=600")
    assert result.returncode != 0, result.stdout[-4000:]
    assert re.search(r"NO-GO: [^\n]*checkpoint:copier", result.stdout + result.stderr), result.stdout[-4000:]
    checks = findings(json.loads((report_dir / "cluster.json").read_text()), "gpu-c")
    assert sorted(c for c in checks if c.startswith("checkpoint:")) == ["checkpoint:copier"]
    copier = checks["checkpoint:copier"]
    assert copier["status"] == "fail" and copier["fatal"], copier
    assert "not on a mounted shared filesystem" in copier["message"] or "same filesystem" in copier["message"], copier
    assert copier["fix"].endswith("run tune.yml with gpunode_tune_checkpoint_staging")
    assert not staging.exists() and not staging.parent.exists()
