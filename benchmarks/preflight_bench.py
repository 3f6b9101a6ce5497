# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wall time of playbooks/preflight.yml against N local inventory hosts (diagnose_bench.py's local-host method).

Run by hand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/preflight_bench.py --hosts 10 50 200 --interval 2 --forks 10 \\
        --out benchmarks/preflight_results.md

For each N it builds N generated trees (diagnose_bench.build_fleet: tests/unit/treegen.py, 8 CPUs each, half in the
seed's contention pattern, half healthy), adds a real server's cpuidle states to each (cpupower capture) and every
tenth host an NVIDIA GPU on the PCI bus without a driver, starts the background writers that advance the counters,
and times the playbook as shipped: softnet sampled on every host at once, then nic_irq_facts, platform_facts,
gpu_health and cpu_power_facts per host, and the cluster report (Markdown, JSON, HTML, JUnit) on the controller.
The gate is NO-GO by construction (the contention and GPU hosts), so a non-zero exit is expected; the report's
counts are checked against the fleet. It also times the controller-side report alone (preflight_collect,
build_report and the four renderers) on the run's own results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "collections"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
from cpuidle_tree import sysfs_from_idle_info  # noqa: E402
from diagnose_bench import COLLECTIONS, build_fleet, ensure_collection_tree, fit, start_writers  # noqa: E402

IDLE = ROOT / "tests" / "unit" / "fixtures" / "cpu_power" / "cpupower" / "idle_intel_idle_server_c6.txt"


def add_hardware(fleet, count):
    from cpupower_capture import parse_idle_info

    idle = parse_idle_info(IDLE.read_text())
    for index in range(count):
        sysfs = fleet / ("node%03d" % index) / "sys"
        sysfs_from_idle_info(idle, "0-7", sysfs)
        if index % 10 == 5:
            dev = sysfs / "bus/pci/devices/0000:17:00.0"
            dev.mkdir(parents=True)
            (dev / "vendor").write_text("0x10de\n")
            (dev / "class").write_text("0x030200\n")


def run_play(inventory, report_dir, interval, forks):
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (ROOT / ".venv" / "bin", env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = str(COLLECTIONS)
    env["ANSIBLE_NOCOLOR"] = "1"
    argv = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "preflight.yml"),
            "-f", str(forks), "-e", "diagnose_interval=%s" % interval, "-e", "preflight_report_dir=%s" % report_dir,
            "-e", "preflight_become=false"]
    started = time.monotonic()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    path = Path(report_dir) / "cluster.json"
    if not path.exists():
        raise SystemExit("no report (%d):\n%s\n%s" % (result.returncode, result.stdout[-3000:], result.stderr[-2000:]))
    return wall, result.returncode, json.loads(path.read_text())


def report_cpu(report_dir):
    """CPU seconds of the controller side alone, from the run's cluster.json: re-render the four formats."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._report import cluster as C
    from ansible_collections.gpunode.tuning.plugins.module_utils._report import render as R

    report = json.loads((Path(report_dir) / "cluster.json").read_text())
    hosts = dict((h["host"], {"findings": [f for f in h["findings"] if not C.is_host_error(f)], "error": h["error"]})
                 for h in report["hosts"])
    started = time.process_time()
    built = C.build_report("preflight", report["title"], hosts, report["generated_at"])
    sizes = [len(R.render_markdown(built)), len(json.dumps(built)), len(R.render_html(built)), len(R.render_junit(built))]
    return time.process_time() - started, sizes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--out", default=None, help="write the Markdown result here")
    options = parser.parse_args(argv)
    ensure_collection_tree()
    command = "%s %s" % (Path(sys.executable).name, " ".join([str(Path(__file__).relative_to(ROOT))] + (argv or sys.argv[1:])))
    rows = []
    with tempfile.TemporaryDirectory(prefix="preflight-bench-") as tmp:
        base = Path(tmp)
        for count in options.hosts:
            fleet = base / ("fleet%d" % count)
            trees, inventory = build_fleet(fleet, count)
            add_hardware(fleet, count)
            writers, dummy = start_writers(fleet, trees)
            try:
                load_before = os.getloadavg()[0]
                wall, rc, report = run_play(inventory, fleet / "report", options.interval, options.forks)
            finally:
                for writer, stop_file in writers:
                    softnet_load.stop_writer(writer, stop_file)
            fatal_hosts = sorted(h["host"] for h in report["hosts"] if h["fatal"])
            contention = sum(1 for h in report["hosts"] for f in h["findings"] if f["check"] == "softnet:contention" and f["status"] == "fail")
            gpus = sum(1 for h in report["hosts"] for f in h["findings"] if f["check"] == "gpu:gpu_present" and f["status"] == "fail")
            cpu, sizes = report_cpu(fleet / "report")
            rows.append({"hosts": count, "wall": wall, "rc": rc, "gate": report["gate"], "fatal_hosts": len(fatal_hosts),
                         "contention": contention, "gpu_fail": gpus, "rows": len(report["rows"]), "findings": report["counts"]["findings"],
                         "load": load_before, "report_cpu": cpu, "sizes": sizes})
            print("%4d hosts: %.1f s, rc %d, %s, %d fatal hosts (%d contention, %d GPU), %d grid rows, report %.2f s CPU" % (
                count, wall, rc, report["gate"], len(fatal_hosts), contention, gpus, len(report["rows"]), cpu), flush=True)
    slope, intercept = fit([(r["hosts"], r["wall"]) for r in rows])
    lines = [
        "# preflight benchmark",
        "",
        "Command (repository root): `%s`" % command,
        "",
        "Machine: %s, %d CPUs, Python %s, %s. Interval %s s, forks %d. Each host: a generated 8-CPU tree (diagnose_bench's "
        "fleet: half in the seed's contention pattern) with a real server's cpuidle states, every tenth host with an "
        "NVIDIA GPU on the bus and no driver; counters advanced by background writers every 0.5 s."
        % (platform.platform(), os.cpu_count(), platform.python_version(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           options.interval, options.forks),
        "",
        "| hosts | wall (s) | s per host | exit | gate | fatal hosts (contention, GPU without driver) | findings | grid rows "
        "| report CPU (s) | md / json / html / junit bytes | load avg at start |",
        "|---:|---:|---:|---:|---|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append("| %d | %.1f | %.2f | %d | %s | %d (%d, %d) | %d | %d | %.2f | %s | %.1f |" % (
            r["hosts"], r["wall"], r["wall"] / r["hosts"], r["rc"], r["gate"], r["fatal_hosts"], r["contention"], r["gpu_fail"],
            r["findings"], r["rows"], r["report_cpu"], " / ".join(str(s) for s in r["sizes"]), r["load"]))
    lines += ["", "Growth (least squares over the rows): %.3f s per host + %.1f s." % (slope, intercept),
              "", "Report CPU: the controller-side build and the four renderings, re-run in-process on the run's own "
              "results (the playbook's own rendering is inside the wall time)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if options.out:
        Path(options.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
