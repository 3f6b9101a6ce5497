"""playbooks/preflight.yml on a real kernel: the lab proof of issue 16.

Runs after prepare (irqbalance stopped, an address on enp66s1), the check step (preflight --check) and converge
(preflight). In file order:

1  converge's report: cluster.md, cluster.json, cluster.html and cluster.junit.xml; the gate is GO; the VM's
   verdicts come out as such, never as passes - C-states not visible (TCG has no cpuidle), no GPU, x86 so no
   SMMUv3/CMDQV - and the guest's own facts are the report's (architecture, page size, SMT, the NIC and its
   queue IRQs); the check step's report has the same findings (the measured softnet verdict may differ: pass or
   not_applicable); the JUnit file is valid against Jenkins'
   junit-10.xsd; the HTML has the gate and one grid row
2  a planted NUMA misplacement: stress-ng with its memory bound to node 1 and its CPUs to node 0 (numactl), the
   preflight told to judge it - cpu_power:numa_remote is fatal, the playbook exits non-zero (NO-GO), the JUnit file
   has the failure, and nothing on the guest changed (no file under /etc, /usr/local or /var/lib newer than the
   run's start, the IRQ affinities as before)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "unit"))
from labtest import EPHEMERAL, GPU, SCENARIO, playbook, probe, ssh, wait_until  # noqa: E402
from reportcheck import grid, junit as validate_junit  # noqa: E402

NAME = GPU["name"]
CONVERGE = SCENARIO / "converge.yml"
PLANT = "gpunode-numa-plant"


def load(tag):
    return json.loads((EPHEMERAL / ("preflight-%s" % tag) / "cluster.json").read_text())


def findings(report):
    assert [h["host"] for h in report["hosts"]] == [NAME]
    return dict((f["check"], f) for f in report["hosts"][0]["findings"])


def test_converge_report_says_go_with_the_vm_verdicts_as_such():
    report = load("run")
    assert report["kind"] == "preflight" and report["gate"] == "go", report["gate_text"]
    for name in ("cluster.md", "cluster.json", "cluster.html", "cluster.junit.xml"):
        assert (EPHEMERAL / "preflight-run" / name).stat().st_size > 0
    found = findings(report)
    assert not [f for f in found.values() if f["fatal"]]
    # Not passes: what a TCG guest without a GPU cannot show.
    assert found["cpu_power:idle"]["status"] == "not_applicable", found["cpu_power:idle"]
    assert found["gpu:gpu_present"]["status"] == "not_applicable", found["gpu:gpu_present"]
    assert found["platform:smmuv3"]["status"] == "not_applicable" and found["platform:cmdqv"]["status"] == "not_applicable"
    assert "x86_64" in found["platform:smmuv3"]["message"]
    # The guest's own facts.
    arch = ssh(NAME, "uname -m").stdout.strip()
    page = ssh(NAME, "getconf PAGESIZE").stdout.strip()
    assert arch == "x86_64" and found["platform:architecture"]["status"] == "pass" and arch in found["platform:architecture"]["message"]
    assert found["platform:page_size"]["status"] == "pass" and page in found["platform:page_size"]["message"]
    assert found["platform:virtualisation"]["message"].startswith("virtual machine"), found["platform:virtualisation"]
    smt = ssh(NAME, "cat /sys/devices/system/cpu/smt/control").stdout.strip()
    assert smt in json.dumps(found["platform:smt"]), (smt, found["platform:smt"])
    # The NIC's queue IRQs, as the guest's own /proc says.
    layout = found["irq:layout"]
    data = probe(GPU)
    effective = sorted(set(i["effective"] for i in data["irqs"].values() if re.match(r"virtio\d+-(input|output)", i["name"] or "")))
    assert layout["evidence"]["interface"] == GPU["iface"] and sorted(set(layout["evidence"]["irq_cpus"].values())) == effective
    # the idle guest: no contention (pass), idle (not_applicable: no user work, no traffic) or inconclusive
    assert found["softnet:contention"]["status"] in ("pass", "not_applicable", "unknown"), found["softnet:contention"]
    # The check step saw the same guest: every finding read from the guest's configuration is the same. The softnet
    # verdict is a measurement of a live guest over diagnose_interval, different in each window: an idle guest's is pass or
    # not_applicable (CI, 2026-12-04: pass under --check, not_applicable in the run), never a fatal one.
    check = findings(load("check"))
    assert check["softnet:contention"]["status"] in ("pass", "not_applicable", "unknown"), check["softnet:contention"]
    assert not [f for f in check.values() if f["fatal"]]
    assert dict((k, f["status"]) for k, f in check.items() if k != "softnet:contention") == \
        dict((k, f["status"]) for k, f in found.items() if k != "softnet:contention")
    junit = validate_junit(EPHEMERAL / "preflight-run" / "cluster.junit.xml")
    assert int(junit.get("failures")) == 0 and int(junit.get("tests")) == len(found)
    page = grid(EPHEMERAL / "preflight-run" / "cluster.html")
    assert page.gate == "go" and page.rows == 1


def test_a_planted_numa_misplacement_is_fatal_and_the_playbook_exits_non_zero():
    before = probe(GPU)["irqs"]
    ssh(NAME, "systemctl reset-failed %s 2>/dev/null; systemd-run --unit %s numactl --cpunodebind=0 --membind=1 "
              "stress-ng --vm 1 --vm-bytes 96M --vm-populate --vm-hang 0 --timeout 900" % (PLANT, PLANT))
    try:
        # The worker has its memory once node 1's numa_maps share holds it (N1= pages of the 96 MiB mapping).
        def placed():
            out = ssh(NAME, "for p in $(pgrep -f stress-ng); do grep -ho 'N1=[0-9]*' /proc/$p/numa_maps; done", check=False).stdout
            return max([int(n) for n in re.findall(r"N1=(\d+)", out)] or [0]) > 20000
        assert wait_until(placed, 120) is not None, ssh(NAME, "systemctl status %s" % PLANT, check=False).stdout
        ssh(NAME, "touch /run/gpunode-preflight-start")
        res, recap = playbook("--extra-vars", '{"preflight_process_patterns": ["stress-ng"]}', tag="numa", path=CONVERGE)
        assert res.returncode != 0, res.stdout[-3000:]
        assert recap[NAME] == 0, res.stdout[-3000:]
        assert re.search(r"NO-GO: .*cpu_power:numa_remote", res.stdout + res.stderr), res.stdout[-3000:] + res.stderr[-2000:]
        report = load("numa")
        assert report["gate"] == "no_go", report["gate_text"]
        hosts = [f for f in report["hosts"][0]["findings"] if f["check"] == "cpu_power:numa_remote"]
        flagged = [f for f in hosts if f["status"] == "fail"]
        assert flagged and all(f["fatal"] for f in flagged), hosts
        assert any("stress-ng" in f["message"] for f in flagged), flagged
        junit = validate_junit(EPHEMERAL / "preflight-numa" / "cluster.junit.xml")
        assert int(junit.get("failures")) == report["counts"]["fatal"] >= 1
        assert "cpu_power:numa_remote" in (EPHEMERAL / "preflight-numa" / "cluster.md").read_text()
        # Nothing changed on the guest.
        newer = ssh(NAME, "find /etc /usr/local /var/lib -xdev -type f -newer /run/gpunode-preflight-start 2>/dev/null "
                          "| grep -v -e '^/var/lib/systemd/timers/' -e '^/var/lib/sudo/' || true").stdout.split()
        assert newer == [], newer
        after = probe(GPU)["irqs"]
        assert dict((k, v["affinity"]) for k, v in after.items()) == dict((k, v["affinity"]) for k, v in before.items())
    finally:
        ssh(NAME, "systemctl stop %s" % PLANT, check=False)
