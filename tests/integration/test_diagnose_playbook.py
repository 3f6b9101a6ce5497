# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/diagnose.yml against several local inventory hosts, each reading its own generated tree.

Every host is ``ansible_connection=local`` with ``procfs_path``/``sysfs_path``
host vars pointing at a tree built by tests/unit/treegen.py. One background
writer (tests/unit/fixtures/softnet_load) advances the counters of every tree
while the play samples, so the module reads real files that really change.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The Ansible of the interpreter that runs the tests (the CI matrix runs them on each supported ansible-core).
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402

pytestmark = pytest.mark.playbook

SPEED = 25000


def node_spec(ncpus=8, irq_cpus=(0, 1, 2, 3), offline=(), irqs=True):
    pci = "0000:3b:00.0"
    online = [cpu for cpu in range(ncpus) if cpu not in offline]
    return {
        "cpus": ncpus,
        "offline": list(offline),
        "numa": {0: online},
        "nics": [{
            "name": "ens7", "pci": pci, "driver": "mlx5_core", "numa_node": 0, "mac": "02:00:17:0a:0b:0c",
            "speed": SPEED, "rx_queues": len(irq_cpus), "tx_queues": len(irq_cpus), "addresses": ["10.1.0.5/24"],
            "irqs": treegen.mlx5_irqs(pci, 60, len(irq_cpus), list(irq_cpus)) if irqs else [],
        }],
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [{"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0}],
    }


# host -> (spec, profile, irq CPUs, softnet width, extra profile keys, expected verdict)
HOSTS = {
    "gpu-a": (node_spec(), "seed_contention", [0, 1, 2, 3], 13, {}, "contention"),
    # 15 columns and time_squeeze about to wrap at 2**32 during the sample
    "gpu-b": (node_spec(ncpus=12, irq_cpus=range(6)), "seed_contention", list(range(6)), 15,
              {"squeeze_base": 0xFFFFFFF0}, "contention"),
    # 11 columns (no CPU index) with CPU 5 offline: rows follow the online list
    "gpu-c": (node_spec(offline=[5]), "healthy", [0, 1, 2, 3], 11, {}, "no_contention"),
    "gpu-d": (node_spec(irq_cpus=(6, 7)), "healthy", [6, 7], 13, {}, "no_contention"),
    # the NIC shows no MSI vectors (like a sandbox kernel that hides them): nothing to attribute squeezes to
    "gpu-e": (node_spec(irqs=False), "seed_contention", [0, 1, 2, 3], 13, {}, "inconclusive"),
    # an idle IRQ CPU squeezing from packet rate alone: no contention, with the saturation finding (issue 28)
    "gpu-f": (node_spec(), "rate_flood", [0, 1, 2, 3], 13, {}, "no_contention"),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("fleet")
    trees = []
    lines = ["[gpu]"]
    for host, (spec, profile, irq_cpus, width, extra, _verdict) in HOSTS.items():
        tree = treegen.build_tree(base / host, spec)
        online = [cpu for cpu in range(spec["cpus"]) if cpu not in spec["offline"]]
        load = softnet_load.PROFILES[profile](online, irq_cpus, "ens7", SPEED)
        load["width"] = width
        load.update(extra)
        trees.append({"proc": tree.proc, "profile": load})
        lines.append("%s diagnose_procfs_path=%s diagnose_sysfs_path=%s" % (host, tree.proc, tree.sys))
    lines += ["", "[gpu:vars]", "ansible_connection=local", "ansible_python_interpreter={{ ansible_playbook_python }}"]
    inventory = base / "inventory.ini"
    inventory.write_text("\n".join(lines) + "\n")
    process, stop_file = softnet_load.start_writer(
        {"trees": trees, "period": 0.1, "max_seconds": 600}, base
    )
    yield base, inventory
    softnet_load.stop_writer(process, stop_file)


def run_playbook(inventory, report_dir, *extra, env_extra=None, margin="1"):
    # margin: diagnose_window_margin. Local hosts start a module in well under a second; the window test keeps the
    # playbook's default (None).
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.environ["ANSIBLE_COLLECTIONS_PATH"]  # set by tests/conftest.py
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORKS"] = "6"
    argv = [
        str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "diagnose.yml"),
        "-e", "diagnose_interval=1", "-e", "diagnose_report_dir=%s" % report_dir,
    ] + (["-e", "diagnose_window_margin=%s" % margin] if margin is not None else []) + list(extra)
    return subprocess.run(argv, env=env, cwd=str(report_dir.parent), capture_output=True, text=True, timeout=300, check=False)


class Cells(HTMLParser):
    def __init__(self):
        HTMLParser.__init__(self)
        self.host = None
        self.cells = {}
        self.legend = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "section" and "host" in classes:
            self.host = attrs["id"][len("host-"):]
            self.cells[self.host] = {}
        elif tag == "div" and "cpu" in classes and self.host:
            self.cells[self.host][int(attrs["data-cpu"])] = set(classes)
        if attrs.get("id") == "legend":
            self.legend = True

    def handle_endtag(self, tag):
        if tag == "section":
            self.host = None


def affinities(base):
    """Every IRQ affinity file of every tree: what a play that changed something would have touched."""
    return dict(
        (str(path.relative_to(base)), path.read_text()) for path in sorted(base.glob("gpu-*/proc/irq/*/*affinity*"))
    )


def cells_with(page, host, css):
    return sorted(cpu for cpu, classes in page.cells[host].items() if css in classes)


@pytest.mark.parametrize("sequential", [False, True], ids=["async", "sequential"])
def test_diagnose_gives_each_host_its_verdict_and_writes_the_report(fleet, sequential):
    base, inventory = fleet
    report_dir = base / ("report-sequential" if sequential else "report-async")
    result = run_playbook(inventory, report_dir, "-e", "diagnose_sequential=%s" % sequential)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "FAILED" not in result.stdout, result.stdout[-4000:]
    assert "6 hosts: 2 contention, 0 check failed, 1 inconclusive, 0 idle, 3 no contention" in result.stdout
    assert "report: %s/cluster.md" % report_dir in result.stdout
    assert "gpu-a: contention: IRQ CPUs 0-3 run user work" in result.stdout
    assert "finding: IRQ CPUs saturated by packet rate: IRQ CPUs 0-3 squeeze" in result.stdout
    assert "gpu-e: inconclusive: no NIC queue IRQ CPUs known" in result.stdout

    report = json.loads((report_dir / "cluster.json").read_text())
    verdicts = dict((host["host"], host["verdict"]) for host in report["hosts"])
    assert verdicts == dict((host, spec[-1]) for host, spec in HOSTS.items()), [
        (h["host"], h["reasons"]) for h in report["hosts"]
    ]
    order = [host["host"] for host in report["hosts"]]
    # no contention hosts: the one with squeezes (gpu-f) first
    assert set(order[:2]) == {"gpu-a", "gpu-b"} and order[2:4] == ["gpu-e", "gpu-f"]
    assert [f["name"] for f in report["hosts"][3]["findings"]] == ["irq_cpus_saturated"]
    by_host = dict((host["host"], host) for host in report["hosts"])
    assert by_host["gpu-b"]["irq_cpus"] == [0, 1, 2, 3, 4, 5]
    assert by_host["gpu-b"]["softnet"]["softnet"]["width"] == 15
    # the wrap did not turn into billions of squeezes
    assert 100 <= by_host["gpu-b"]["softnet"]["cpus"][0]["squeeze_per_10s"] <= 200
    assert by_host["gpu-c"]["softnet"]["softnet"]["cpu_mapping"] == "online_order"
    assert [row["cpu"] for row in by_host["gpu-c"]["softnet"]["cpus"]] == [0, 1, 2, 3, 4, 6, 7]
    assert "gpu-e" in by_host and "shows 0 queue IRQs" in by_host["gpu-e"]["reasons"][0]
    assert by_host["gpu-a"]["nic"]["pci_address"] == "0000:3b:00.0"  # nic_irq_facts result is in the report

    markdown = (report_dir / "cluster.md").read_text()
    assert markdown.index("### gpu-a") < markdown.index("### gpu-e") < markdown.index("### gpu-c")
    assert "time_squeeze on the shared CPUs 0-3" in markdown

    page = Cells()
    page.feed((report_dir / "cluster.html").read_text())
    assert page.legend
    assert cells_with(page, "gpu-a", "irq") == [0, 1, 2, 3]
    assert cells_with(page, "gpu-a", "hot") == [0, 1, 2, 3]
    assert cells_with(page, "gpu-d", "irq") == [6, 7]
    assert cells_with(page, "gpu-d", "hot") == []
    assert cells_with(page, "gpu-e", "irq") == []
    assert cells_with(page, "gpu-f", "irq") == [0, 1, 2, 3]
    assert sorted(page.cells["gpu-c"]) == [0, 1, 2, 3, 4, 6, 7]

    for name in ("cluster.md", "cluster.json", "cluster.html"):
        assert stat.S_IMODE((report_dir / name).stat().st_mode) == 0o644


def test_a_successful_run_never_prints_failed(fleet):
    # An interval longer than the launch and the nic_irq_facts task, so the jobs are still sampling when the play
    # comes to collect them: polling async_status with until/retries printed "FAILED - RETRYING" here.
    base, inventory = fleet
    report_dir = base / "report-no-failed"
    result = run_playbook(inventory, report_dir, "-e", "diagnose_interval=4", "--limit", "gpu-a,gpu-d")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "FAILED" not in result.stdout + result.stderr, result.stdout[-4000:]
    assert "2 hosts: 1 contention, 0 check failed, 0 inconclusive, 0 idle, 1 no contention" in result.stdout
    report = json.loads((report_dir / "cluster.json").read_text())
    assert all(4 <= host["interval"] < 5 for host in report["hosts"]), [host["interval"] for host in report["hosts"]]


def test_check_mode_still_samples_writes_the_report_and_gates(fleet):
    base, inventory = fleet
    report_dir = base / "report-check"
    before = affinities(base)
    result = run_playbook(inventory, report_dir, "--check", "-e", "diagnose_fail_on_contention=true")
    # the gate fails the two contention hosts, after the report is written
    assert result.returncode != 0
    assert "contention: IRQ CPUs 0-" in result.stdout
    recap = [line for line in result.stdout.splitlines() if line.startswith("gpu-")]
    failed = sorted(line.split()[0] for line in recap if "failed=1" in line)
    assert failed == ["gpu-a", "gpu-b"], recap
    report = json.loads((report_dir / "cluster.json").read_text())
    assert report["counts"]["contention"] == 2 and report["host_count"] == 6
    assert affinities(base) == before


def test_nothing_of_the_play_runs_on_a_host_inside_its_sampling_window(fleet, tmp_path):
    # Issue 28: every module run is a Python process on the host it measures. diagnose.yml once read the NIC
    # (nic_irq_facts) and waited (wait_for) on the targets while their jobs sampled, and the closed loop's tuned
    # node was judged contention by its own diagnose. Now the NIC is read before the launch and the controller
    # pauses until the window is over. A callback records when each task ran on each host; the window is the
    # sampling job's own (its two samples' wall-clock instants).
    base, inventory = fleet
    report_dir = base / "report-window"
    times = tmp_path / "task_times.jsonl"
    result = run_playbook(inventory, report_dir, "-e", "diagnose_interval=2", "--limit", "gpu-a,gpu-c,gpu-d", env_extra={
        "ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).resolve().parent / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "task_times", "GPUNODE_TASK_TIMES": str(times)}, margin=None)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((report_dir / "cluster.json").read_text())
    windows = dict((host["host"], host["softnet"]["window"]) for host in report["hosts"])
    assert sorted(windows) == ["gpu-a", "gpu-c", "gpu-d"]
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    ran = set(row["task"] for row in rows)
    # the callback saw the play: the NIC read, the launch, the controller's pause and the collection
    assert {"Read the NIC, its queue IRQs and where they land", "Start sampling on every host (two samples, diagnose_interval seconds apart)",
            "Wait on the controller until the sampling window is over", "Collect the samples"} <= ran, sorted(ran)
    overlapping = []
    for row in rows:
        window = windows.get(row["host"])
        if row["action"] == "ansible.builtin.pause" or row["task"].startswith("Start sampling") or window is None:
            continue       # the launch returns before the first sample; pause runs on the controller only
        if row["start"] < window["end"] and row["end"] > window["start"]:
            overlapping.append((row["host"], row["task"], round(row["start"] - window["start"], 2),
                                round(row["end"] - window["end"], 2)))
    assert not overlapping, overlapping
    # and the collection came after the window on every host: nothing of it was measured
    waited = "Wait for the samples (each host's job writes its result when both samples are taken)"
    collect = dict((row["host"], row["start"]) for row in rows if row["task"] == waited)
    assert sorted(collect) == sorted(windows) and all(collect[h] >= windows[h]["end"] for h in windows), (collect, windows)
