# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wall time of playbooks/diagnose.yml against N local inventory hosts, async versus sequential.

Run by hand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/diagnose_bench.py --hosts 10 50 200 --interval 2 --forks 10 \\
        --out benchmarks/diagnose_results.md

For each N it builds N generated trees (tests/unit/treegen.py, 8 CPUs each,
half in the seed's contention pattern, half healthy), starts one background
writer that advances every tree's counters (tests/unit/fixtures/softnet_load),
writes an inventory of N ``ansible_connection=local`` hosts and times:

* ``async``: the playbook as shipped (softnet_check started with async/poll 0 on every host, waited for with
  wait_for on the job's results file, collected with async_status);
* ``sequential``: the same playbook with ``diagnose_sequential=true`` (no async: forks hosts sample at a time).

It also measures the module's own CPU time per host: the module run as a process (interpreter start, imports,
reading the tree twice, judging), and ``run_check`` in-process (the sampling and judging alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402

COLLECTIONS = ROOT / "build" / "collections"
SPEED = 25000
IRQ_CPUS = [0, 1, 2, 3]


def spec():
    pci = "0000:3b:00.0"
    return {
        "cpus": 8,
        "numa": {0: list(range(8))},
        "nics": [{
            "name": "ens7", "pci": pci, "driver": "mlx5_core", "numa_node": 0, "mac": "02:00:17:0a:0b:0c",
            "speed": SPEED, "rx_queues": 4, "tx_queues": 4, "addresses": ["10.1.0.5/24"],
            "irqs": treegen.mlx5_irqs(pci, 60, 4, IRQ_CPUS),
        }],
        "virtual": [{"name": "lo", "addresses": ["127.0.0.1/8"]}],
        "routes": [{"iface": "ens7", "dest": "0.0.0.0", "mask": "0.0.0.0", "gateway": "10.1.0.1", "metric": 0}],
    }


def ensure_collection_tree():
    link = COLLECTIONS / "ansible_collections" / "gpunode" / "tuning"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(ROOT, link)


def build_fleet(base, count):
    trees = []
    lines = ["[fleet]"]
    for index in range(count):
        name = "node%03d" % index
        tree = treegen.build_tree(base / name, spec())
        profile = "seed_contention" if index % 2 == 0 else "healthy"
        trees.append({"proc": tree.proc, "profile": softnet_load.PROFILES[profile](list(range(8)), IRQ_CPUS, "ens7", SPEED)})
        lines.append("%s diagnose_procfs_path=%s diagnose_sysfs_path=%s" % (name, tree.proc, tree.sys))
    lines += ["", "[fleet:vars]", "ansible_connection=local", "ansible_python_interpreter={{ ansible_playbook_python }}"]
    inventory = base / "inventory.ini"
    inventory.write_text("\n".join(lines) + "\n")
    return trees, inventory


def start_writers(fleet, trees):
    """One writer per CPU (at most 4), each rewriting softnet_stat and stat of its share of the trees every 0.5 s
    (NET_RX and link counters stay at their first values: the verdicts do not depend on them). A writer must refresh
    every tree inside the sampling interval; its longest pass is in fleet/writerN/stats.json.
    Returns ([(process, stop_file)], shards)."""
    writers = []
    shards = max(1, min(os.cpu_count() or 1, 4))
    for shard in range(shards):
        workdir = fleet / ("writer%d" % shard)
        workdir.mkdir()
        writers.append(softnet_load.start_writer(
            {"trees": trees[shard::shards], "period": 0.5, "max_seconds": 3600,
             "files": ["net/softnet_stat", "stat"], "stats_file": str(workdir / "stats.json")}, workdir))
    return writers, shards


def run_play(inventory, report_dir, interval, forks, sequential):
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (ROOT / ".venv" / "bin", env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = str(COLLECTIONS)
    env["ANSIBLE_NOCOLOR"] = "1"
    argv = [
        str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "diagnose.yml"),
        "-f", str(forks), "-e", "diagnose_interval=%s" % interval, "-e", "diagnose_report_dir=%s" % report_dir,
        "-e", "diagnose_sequential=%s" % sequential,
    ]
    started = time.monotonic()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit("ansible-playbook failed (%d):\n%s\n%s" % (result.returncode, result.stdout[-3000:], result.stderr[-2000:]))
    report = json.loads((Path(report_dir) / "cluster.json").read_text())
    return wall, report["counts"]


def module_cpu(tree, interval, runs):
    """CPU seconds (user+sys) of the module as a process, and of run_check in-process, per run."""
    args = Path(tree.root) / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "procfs_path": tree.proc, "sysfs_path": tree.sys, "interval": interval}}))
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    process_cpu = []
    for dummy in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, str(ROOT / "plugins" / "modules" / "softnet_check.py"), str(args)],
                             env=env, capture_output=True, text=True, check=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert json.loads(out)["verdict"], out
        process_cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    sys.path.insert(0, str(COLLECTIONS))
    from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import run_check

    inproc = []
    for dummy in range(runs):
        started = time.process_time()
        run_check({"interval": interval}, procfs=tree.proc, sysfs=tree.sys)
        inproc.append(time.process_time() - started)
    return process_cpu, inproc


def fit(points):
    """Least-squares slope and intercept of wall time over host count."""
    n = len(points)
    mean_x = sum(x for x, dummy in points) / n
    mean_y = sum(y for dummy, y in points) / n
    var = sum((x - mean_x) ** 2 for x, dummy in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
    return slope, mean_y - slope * mean_x


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--cpu-runs", type=int, default=5)
    parser.add_argument("--skip-sequential-above", type=int, default=10**9,
                        help="skip the sequential run for fleets larger than this")
    parser.add_argument("--out", default=None, help="write the Markdown result here")
    options = parser.parse_args(argv)
    ensure_collection_tree()
    command = "%s %s" % (Path(sys.executable).name, " ".join([str(Path(__file__).relative_to(ROOT))] + (argv or sys.argv[1:])))
    rows = []
    with tempfile.TemporaryDirectory(prefix="diagnose-bench-") as tmp:
        base = Path(tmp)
        fleet_base = base / "cpu"
        cpu_tree = treegen.build_tree(fleet_base, spec())
        softnet_load.write_counters(cpu_tree.proc, softnet_load.healthy(list(range(8)), IRQ_CPUS, "ens7", SPEED), 0.0)
        process_cpu, inproc = module_cpu(cpu_tree, options.interval, options.cpu_runs)
        for count in options.hosts:
            fleet = base / ("fleet%d" % count)
            trees, inventory = build_fleet(fleet, count)
            writers, shards = start_writers(fleet, trees)
            try:
                load_before = os.getloadavg()[0]
                wall_async, counts_async = run_play(inventory, fleet / "report-async", options.interval, options.forks, False)
                wall_seq = counts_seq = None
                if count <= options.skip_sequential_above:
                    wall_seq, counts_seq = run_play(inventory, fleet / "report-seq", options.interval, options.forks, True)
            finally:
                for writer, stop_file in writers:
                    softnet_load.stop_writer(writer, stop_file)
            longest = max(json.loads((fleet / ("writer%d" % shard) / "stats.json").read_text())["longest_pass_s"]
                          for shard in range(shards))
            rows.append({"hosts": count, "async": wall_async, "sequential": wall_seq, "load": load_before,
                         "counts_async": counts_async, "counts_seq": counts_seq, "writer_pass": longest})
            print("%4d hosts: async %.1f s, sequential %s s (load %.1f)" % (
                count, wall_async, "%.1f" % wall_seq if wall_seq else "-", load_before), flush=True)
    slope_async, base_async = fit([(r["hosts"], r["async"]) for r in rows])
    seq_points = [(r["hosts"], r["sequential"]) for r in rows if r["sequential"]]
    slope_seq, base_seq = fit(seq_points) if len(seq_points) > 1 else (None, None)
    lines = [
        "# diagnose benchmark",
        "",
        "Command (repository root): `%s`" % command,
        "",
        "Machine: %s, %d CPUs, Python %s, %s. Interval %s s, forks %d. Each host: a generated 8-CPU tree whose "
        "counters a background writer advances every 0.5 s (half the hosts in the seed's contention pattern)."
        % (platform.platform(), os.cpu_count(), platform.python_version(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           options.interval, options.forks),
        "",
        "| hosts | async wall (s) | sequential wall (s) | sequential / async | load avg at start | verdicts async | "
        "verdicts sequential | longest writer pass (s) |",
        "|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        ratio = "%.1fx" % (r["sequential"] / r["async"]) if r["sequential"] else "-"
        verdicts = ", ".join("%s %d" % (k, v) for k, v in sorted(r["counts_async"].items()) if v)
        verdicts_seq = ", ".join("%s %d" % (k, v) for k, v in sorted((r["counts_seq"] or {}).items()) if v) or "-"
        lines.append("| %d | %.1f | %s | %s | %.1f | %s | %s | %.2f |" % (
            r["hosts"], r["async"], "%.1f" % r["sequential"] if r["sequential"] else "-", ratio, r["load"], verdicts,
            verdicts_seq, r["writer_pass"]))
    lines += [
        "",
        "Growth (least squares over the rows): async %.3f s per host + %.1f s; sequential %s."
        % (slope_async, base_async,
           "%.3f s per host + %.1f s" % (slope_seq, base_seq) if slope_seq is not None else "not measured"),
        "",
        "Module CPU time per host (interval %s s, %d runs each):" % (options.interval, options.cpu_runs),
        "",
        "- as a process (interpreter start, imports, two samples, verdict): median %.3f s, max %.3f s"
        % (sorted(process_cpu)[len(process_cpu) // 2], max(process_cpu)),
        "- `run_check` in-process (two samples and the verdict only): median %.4f s, max %.4f s"
        % (sorted(inproc)[len(inproc) // 2], max(inproc)),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if options.out:
        Path(options.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
