# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The closed loop on a real kernel (#18): contention detected, tuned away by the collection alone, the CPU measured.

Run by hand from the repository root, as root, with the lab image built (``./run.sh deps`` and ``python3
tests/lab/lab.py build``); not part of the test suite::

    .venv/bin/python benchmarks/closed_loop_bench.py --out benchmarks/closed_loop_results.md

A scaled-down model of seed 000's node in one ``gpu-node`` guest (8 vCPUs under TCG, 2 NUMA nodes, the 6-queue
virtio data NIC enp66s1 on node 1):

* **Load.** The data loaders: 4 CPU-bound workers (a Python loop that counts its own iterations), one per CPU of
  the NIC's node (4-7, as a launcher binds them to the GPU/NIC-local node), run by a systemd unit in
  ``gpunode-workload.slice``. The traffic: iperf3 UDP, two streams of 200-byte datagrams at ``--rate`` each (15M;
  ../shared/LAB.md found 10 Mbit/s the rate at which an idle CPU does not squeeze under TCG but a loaded one shows
  the seed's signal 2; with the vCPUs pinned, 10M per stream gave +8.5 %, under the goal of #28), from a network
  namespace that holds the data NIC's tap on the host side, into ``iperf3 -s`` in the guest. The queue IRQs start
  where virtio_net puts them (``ethtool -L`` to the queue count rewrites its own spread: CPUs 4-7), irqbalance
  stopped (as a node whose IRQs were never tuned, with the spread the driver chose).
* **Diagnose** (``playbooks/diagnose.yml``, inventory variables only, its default thresholds) under the load: the
  verdict and per-CPU softirq/user/squeezes.
* **Tune** (``playbooks/tune.yml``, inventory variables only): 2 IRQ CPUs chosen by the pinning policy away from the
  workers' CPUs (``nic_irq_pinning_count: 2``, ``nic_irq_pinning_exclude_cpus: 4-7``), and the cpusets fence
  (``gpunode_tune_cpusets``): system services on those CPUs, the workload slice on the others.
* **The next job**: the workers started again with the same binding (4-7): on kernel 6.1 the fence's cpuset write
  reset the affinity of the workers that were running, which then spread over the slice's CPUs.
* **Diagnose again** under the same load, then **measure** ``--reps`` windows of ``--window`` seconds in each
  phase: the workers' iterations per second (their own counters), per-CPU user/softirq from ``/proc/stat`` and
  squeezes from ``/proc/net/softnet_stat`` (read in the guest, independently of the collection), and the receive
  side (iperf3's own datagram and loss counts).

It writes the results as Markdown (``--out``) and JSON (beside it), with min/median/max over the repetitions, and
copies both diagnose reports next to them (``closed_loop_before/``, ``closed_loop_after/``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "closed-loop-gpu-node"
IFACE = "enp66s1"
NETNS = "gpunode-loop"
HOST_ADDR, GUEST_ADDR = "192.168.78.1", "192.168.78.2"
WORKER_CPUS = (4, 5, 6, 7)
# The workers: each counts iterations of a fixed piece of work and publishes (monotonic time, count) every 0.5 s.
WORKER = r"""
import os, sys, time
path = sys.argv[1]
count, last = 0, time.monotonic()
while True:
    for _ in range(2000):
        pass
    count += 1
    now = time.monotonic()
    if now - last >= 0.5:
        with open(path + ".tmp", "w") as fh:
            fh.write("%.6f %d\n" % (now, count))
        os.replace(path + ".tmp", path)
        last = now
"""
# One window in the guest: /proc/stat and softnet_stat before and after, and the workers' counters.
WINDOW = r"""
import glob, json, sys, time
def stat():
    out = {}
    for line in open("/proc/stat"):
        f = line.split()
        if f[0].startswith("cpu") and f[0] != "cpu":
            out[int(f[0][3:])] = [int(x) for x in f[1:9]]
    return out
def soft():
    out = {}
    for line in open("/proc/net/softnet_stat"):
        f = line.split()
        out[int(f[12], 16)] = (int(f[0], 16), int(f[1], 16), int(f[2], 16))
    return out
def workers():
    out = {}
    for path in glob.glob("/run/gpunode-loop/worker-*"):
        if path.endswith(".tmp"):
            continue
        t, n = open(path).read().split()
        out[path.rsplit("-", 1)[1]] = (float(t), int(n))
    return out
def dev():
    for line in open("/proc/net/dev"):
        if line.strip().startswith(sys.argv[2] + ":"):
            f = line.split(":", 1)[1].split()
            return {"rx_packets": int(f[1]), "rx_dropped": int(f[3])}
s0, n0, w0, d0 = stat(), soft(), workers(), dev()
time.sleep(float(sys.argv[1]))
s1, n1, w1, d1 = stat(), soft(), workers(), dev()
cpus = {}
for cpu in s1:
    delta = [b - a for a, b in zip(s0[cpu], s1[cpu])]
    total = sum(delta) or 1
    cpus[cpu] = {"user_pct": 100.0 * (delta[0] + delta[1]) / total, "softirq_pct": 100.0 * delta[6] / total,
                 "squeezes": n1[cpu][2] - n0[cpu][2], "processed": n1[cpu][0] - n0[cpu][0], "dropped": n1[cpu][1] - n0[cpu][1]}
rates = {}
for cpu, (t1, c1) in w1.items():
    t0, c0 = w0[cpu]
    rates[cpu] = (c1 - c0) / (t1 - t0) if t1 > t0 else None
print(json.dumps({"cpus": cpus, "workers": rates, "dev": {k: d1[k] - d0[k] for k in d1}}))
"""


def lab_module():
    spec = importlib.util.spec_from_file_location("lab", ROOT / "tests" / "lab" / "lab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAB = lab_module()


def ssh(inst, command, check=True, timeout=300):
    """``command`` in the guest; a connection that fails (ssh's exit 255: seen right after a restore, and once after
    tune.yml while the IRQ CPUs' host core was saturated by the traffic) is tried again, up to 5 times, 10 s apart."""
    for attempt in range(6):
        res = subprocess.run(LAB.ssh_base(inst["port"], Path(inst["identity_file"])) + [command], capture_output=True,
                             text=True, timeout=timeout, check=False)
        if res.returncode != 255:
            break
        time.sleep(10)
    if check and res.returncode:
        raise SystemExit("guest: %s -> rc %d\n%s%s" % (command, res.returncode, res.stdout, res.stderr))
    return res.stdout


def pin_vcpus(inst):
    """Each vCPU thread of QEMU on one host core: the workers' vCPUs (WORKER_CPUS) on host CPU 1, the other vCPUs
    with QEMU's own threads and this script's tools on host CPU 0 (main() put itself there; QEMU inherited it).

    Under TCG the 8 vCPUs otherwise share the host's 2 cores as one pool: interrupt work moved from CPU 4 to CPU 2
    then takes the same host time from the workers, which no real node does (its CPU 2 is another core). Returns
    {vCPU: host thread id}, from the monitor's ``info cpus``."""
    out = LAB.hmp(Path(inst["monitor"]), "info cpus")
    threads = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"CPU #(\d+):.*?thread_id=(\d+)", out)}
    if len(set(threads.values())) != len(threads) or len(threads) < 8:
        raise SystemExit("QEMU does not run one thread per vCPU (multi-threaded TCG); cannot pin:\n" + out)
    for cpu, tid in threads.items():
        os.sched_setaffinity(tid, {1} if cpu in WORKER_CPUS else {0})
    return threads


def inventory(inst, base, extra):
    hostvars = {
        "ansible_host": "127.0.0.1", "ansible_port": inst["port"], "ansible_user": "root",
        "ansible_ssh_private_key_file": inst["identity_file"],
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        "ansible_python_interpreter": "/usr/bin/python3",
        # The NIC and the model's scale (the diagnose playbook's own variables).
        "diagnose_interface": IFACE, "diagnose_link_speed_mbps": 10000,
        # Inventory for tune.yml: two IRQ CPUs away from the workers, the workload fence.
        "nic_irq_pinning_interface": IFACE, "nic_irq_pinning_count": 2, "nic_irq_pinning_exclude_cpus": "4-7",
        "gpunode_tune_cpusets": True,
    }
    hostvars.update(extra)
    path = base / "inventory.json"
    path.write_text(json.dumps({"all": {"hosts": {"gpu-node": hostvars}}}))
    return path


def playbook(inv, name, *extra):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=str(ROOT / "build" / "collections"),
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_PIPELINING="True")
    argv = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inv), str(ROOT / "playbooks" / name)] + list(extra)
    started = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=1800)
    return res, time.monotonic() - started


class Traffic:
    """iperf3 UDP from a network namespace holding the data NIC's tap into iperf3 -s in the guest."""

    def __init__(self, inst, rate, seconds):
        self.inst, self.rate, self.seconds, self.client = inst, rate, seconds, None

    def __enter__(self):
        tap = self.inst["tap"]
        subprocess.run(["ip", "netns", "add", NETNS], check=True)
        subprocess.run(["ip", "link", "set", tap, "netns", NETNS], check=True)
        for argv in (["ip", "addr", "add", HOST_ADDR + "/24", "dev", tap], ["ip", "link", "set", tap, "up"]):
            subprocess.run(["ip", "netns", "exec", NETNS] + argv, check=True)
        ssh(self.inst, "ip link set %s up; ip -4 addr show dev %s | grep -q %s || ip addr add %s/24 dev %s; "
                       "systemd-run --unit gpunode-loop-iperf iperf3 -s -p 5201" % (IFACE, IFACE, GUEST_ADDR, GUEST_ADDR, IFACE))
        time.sleep(2)
        self.client = subprocess.Popen(["ip", "netns", "exec", NETNS, "iperf3", "-c", GUEST_ADDR, "-u", "-b", self.rate, "-l", "200",
                                        "-t", str(self.seconds), "-P", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        return self

    def stop(self):
        """Stop the client (the receive side is measured in the guest: /proc/net/dev and softnet_stat)."""
        if self.client and self.client.poll() is None:
            self.client.terminate()
        if self.client:
            self.client.wait(timeout=60)
        self.client = None

    def __exit__(self, *exc):
        if self.client:
            self.stop()
        ssh(self.inst, "systemctl stop gpunode-loop-iperf", check=False)
        subprocess.run(["ip", "-n", NETNS, "link", "set", self.inst["tap"], "netns", "1"], check=False)
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


def start_workers(inst):
    """The workers as a launcher starts a job: one unit per CPU of WORKER_CPUS, in the workload slice (started again
    after tune.yml, as the next job on the tuned node: on kernel 6.1 writing a cgroup v2 cpuset resets the CPU
    affinity of the tasks already in it, so the running workers lost their binding when the fence was applied)."""
    script = "/run/gpunode-loop/worker.py"
    ssh(inst, "mkdir -p /run/gpunode-loop && cat > %s <<'EOF'\n%s\nEOF" % (script, WORKER))
    ssh(inst, "systemctl stop 'gpunode-loop-worker-*' 2>/dev/null; rm -f /run/gpunode-loop/worker-[0-9]*; true")
    for cpu in WORKER_CPUS:
        ssh(inst, "systemd-run --unit gpunode-loop-worker-%d --slice gpunode-workload.slice -p CPUAffinity=%d "
                  "python3 %s /run/gpunode-loop/worker-%d" % (cpu, cpu, script, cpu))
    time.sleep(3)


def window(inst, seconds):
    script = "/run/gpunode-loop/window.py"
    ssh(inst, "test -f %s || cat > %s <<'EOF'\n%s\nEOF" % (script, script, WINDOW))
    data = json.loads(ssh(inst, "python3 %s %s %s" % (script, seconds, IFACE), timeout=seconds + 120))
    data["cpus"] = {int(k): v for k, v in data["cpus"].items()}
    data["workers"] = {int(k): v for k, v in data["workers"].items()}
    return data


def irq_cpus(inst):
    out = ssh(inst, "for i in $(ls /sys/bus/pci/devices/0000:42:01.0/msi_irqs); do "
                    "n=$(awk -v i=$i '$1==i\":\" {print $NF}' /proc/interrupts); case $n in virtio*-input*|virtio*-output*) "
                    "cat /proc/irq/$i/smp_affinity_list;; esac; done")
    return sorted(set(int(c) for c in out.split()))


def summary(values):
    values = [v for v in values if v is not None]
    return {"min": min(values), "median": statistics.median(values), "max": max(values)} if values else None


def units_started_since(inst, since):
    """The units systemd started in the guest since the guest time ``since`` (epoch seconds): a timer's service that
    ran during a diagnose window (the collection's own re-check timer among them) is named here."""
    out = ssh(inst, "journalctl --no-pager -q -o short-iso-precise --since=@%d _PID=1 | grep -E ' (Starting|Started|Finished) ' "
                    "| grep -v -E 'session-|user@|user-runtime-dir@' || true" % int(since))
    return [line for line in out.splitlines() if line.strip()]


def phase(inst, inv, label, reps, seconds, report_dir):
    since = float(ssh(inst, "date +%s.%N"))
    res, wall = playbook(inv, "diagnose.yml", "-e", "diagnose_interval=10", "-e", "diagnose_report_dir=%s" % report_dir)
    started_units = units_started_since(inst, since)
    if res.returncode:
        raise SystemExit("diagnose (%s) failed:\n%s" % (label, res.stdout[-3000:]))
    report = json.loads((Path(report_dir) / "cluster.json").read_text())["hosts"][0]
    windows = [window(inst, seconds) for dummy in range(reps)]
    irq = irq_cpus(inst)
    affinity = ssh(inst, "for c in %s; do taskset -cp $(systemctl show -P MainPID gpunode-loop-worker-$c); done"
                   % " ".join(map(str, WORKER_CPUS)))
    return {
        "label": label, "verdict": report["verdict"], "verdict_rule": report.get("verdict_rule"), "reasons": report["reasons"],
        "named_irq_cpus": report.get("irq_cpus", []), "irq_cpus_source": report.get("irq_cpus_source"),
        "irq_cpus": irq, "diagnose_wall_s": round(wall, 1), "affinity": affinity,
        # whose user work ran on the IRQ CPUs during the diagnose window (softnet_check's irq_cpu_processes)
        "irq_cpu_processes": (report.get("softnet") or {}).get("irq_cpu_processes"),
        # what systemd started in the guest while diagnose.yml ran (timers, the fence's restarts)
        "units_started": started_units,
        "workers_per_s": summary([sum(w["workers"][c] for c in WORKER_CPUS) for w in windows]),
        "per_worker_per_s": dict((c, summary([w["workers"][c] for w in windows])) for c in WORKER_CPUS),
        "cpus": dict((c, {k: summary([w["cpus"][c][k] for w in windows]) for k in ("user_pct", "softirq_pct", "squeezes", "dropped")})
                     for c in sorted(windows[0]["cpus"])),
        "rx_packets": summary([w["dev"]["rx_packets"] for w in windows]),
        "rx_dropped": summary([w["dev"]["rx_dropped"] for w in windows]),
        "softnet_dropped": summary([sum(w["cpus"][c]["dropped"] for c in w["cpus"]) for w in windows]),
        "windows": windows,
    }


def fmt(s, digits=1):
    return "-" if s is None else "%.*f / %.*f / %.*f" % (digits, s["min"], digits, s["median"], digits, s["max"])


def gain_of(before, after):
    return 100.0 * (after["workers_per_s"]["median"] / before["workers_per_s"]["median"] - 1)


def control(pair):
    """The workers whose CPUs did no interrupt work before tuning (softirq median below 5 %, the diagnose default)
    measure the host, not the fix: their rate before and after, and its change. A pair whose control workers moved
    far (another load on this machine, a slower or faster host core) says so instead of a gain."""
    cpus = [c for c in WORKER_CPUS if pair["before"]["cpus"][c if c in pair["before"]["cpus"] else str(c)]
            ["softirq_pct"]["median"] < 5.0]

    def rate(phase):
        per = pair[phase]["per_worker_per_s"]
        return sum(per[c if c in per else str(c)]["median"] for c in cpus)
    if not cpus:
        return {"cpus": [], "before": None, "after": None, "change_pct": None}
    before, after = rate("before"), rate("after")
    return {"cpus": cpus, "before": round(before, 1), "after": round(after, 1),
            "change_pct": round(100.0 * (after / before - 1), 1)}


def holds(pair):
    """The goal for one pair (#28): contention before, no contention after."""
    return pair["before"]["verdict"] == "contention" and pair["after"]["verdict"] == "no_contention"


def cpus_text(cpus):
    return ",".join(map(str, cpus)) or "-"


def markdown(result):
    pairs = result["pairs"]
    gains = [p["gain_pct"] for p in pairs]
    lines = [
        "# closed-loop benchmark (#18, #28)",
        "",
        "Command (repository root): `%s`" % result["command"],
        "",
        "Machine: %s, %d CPUs, %s. Each pair is a fresh lab `gpu-node` guest under TCG (8 vCPUs on this machine's 2 "
        "cores), a scaled-down model of seed 000's node: 4 workers on CPUs 4-7 (the NIC's node) in "
        "`gpunode-workload.slice`, iperf3 UDP %s of 200-byte datagrams into enp66s1; diagnose (its default "
        "thresholds), then %d windows of %s s measured; tune.yml; the workers started again; diagnose and measure again."
        % (result["machine"], os.cpu_count(), result["date"], result["rate"], result["reps"], result["window"]),
        "",
        ("The lab's change for this benchmark (#28): QEMU's vCPU threads pinned on the host, the workers' vCPUs 4-7 on "
         "host CPU 1, vCPUs 0-3, QEMU's other threads, the playbooks and iperf3 on host CPU 0. Unpinned, TCG runs the "
         "8 vCPUs as one pool on the 2 cores, so interrupt work moved to CPU 2 still takes its host time from the "
         "workers (a first unpinned pair: contention -> no_contention, but +2.7 %)." if result["pin_vcpus"] else
         "QEMU's vCPU threads unpinned (--no-pin-vcpus): the 8 vCPUs share the host's 2 cores as one pool."),
        "",
        "Goal: `contention` before and `no_contention` after in every pair, median gain >= 10 %%. "
        "Result: **%s** (%d of %d pairs hold), median gain %+.1f %% (min %+.1f, max %+.1f)."
        % ("holds" if result["all_hold"] and statistics.median(gains) >= 10 else "does not hold",
           sum(1 for p in pairs if holds(p)), len(pairs), statistics.median(gains), min(gains), max(gains)),
        "",
        "| pair | verdict before (rule) | IRQ CPUs named before (source) | verdict after (rule) "
        "| IRQ CPUs named after (source) | workers it/s before | after | gain | control workers (CPUs) before -> after "
        "| packets per window before | after |",
        "|---:|---|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for n, p in enumerate(pairs, 1):
        b, a = p["before"], p["after"]
        c = control(p)
        lines.append("| %d | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %.0f | %.0f | %+.1f %% | %s | %.0f | %.0f |" % (
            n, b["verdict"], b["verdict_rule"], cpus_text(b["named_irq_cpus"]), b["irq_cpus_source"],
            a["verdict"], a["verdict_rule"], cpus_text(a["named_irq_cpus"]), a["irq_cpus_source"],
            b["workers_per_s"]["median"], a["workers_per_s"]["median"], p["gain_pct"],
            "-" if not c["cpus"] else "%.0f -> %.0f (%+.1f %%, %s)" % (
                c["before"], c["after"], c["change_pct"], cpus_text(c["cpus"])),
            b["rx_packets"]["median"], a["rx_packets"]["median"]))
    moved = [n for n, p in enumerate(pairs, 1) if control(p)["change_pct"] is not None and abs(control(p)["change_pct"]) > 10]
    if moved:
        clean = [p["gain_pct"] for n, p in enumerate(pairs, 1) if n not in moved]
        lines += ["", "Pairs whose control workers moved more than 10 %% between the phases (the host changed, not "
                  "only the node): %s. Median gain without them: %s." % (
                      ", ".join(map(str, moved)), "%+.1f %%" % statistics.median(clean) if clean else "-")]
    for n, p in enumerate(pairs, 1):
        if holds(p):
            continue
        for label in ("before", "after"):
            ph = p[label]
            # the reasons name the processes with user work on the IRQ CPUs (softnet_check's irq_cpu_processes)
            lines += ["", "Pair %d does not hold; its %s-diagnose: %s. Units systemd started while diagnose.yml ran: "
                      "%s." % (n, label, "; ".join(ph["reasons"]), "; ".join(ph.get("units_started") or []) or "none")]
    for d in result.get("discarded", []):
        lines += ["", "Discarded: a pair measured %s (gain %+.1f %%, control workers %+.1f %%): %s. A pair measured "
                  "after it took its place." % (d["measured"], d["pair"]["gain_pct"],
                                                control(d["pair"])["change_pct"] or 0.0, d["why"])]
    lines += [
        "",
        "Packets per window fall after tuning in this lab: the IRQ CPUs' vCPUs then share host CPU 0 with QEMU's "
        "I/O thread and the iperf3 sender, which no real node's dedicated IRQ cores do. The workers' rate does not "
        "depend on it: after tuning host CPU 1 runs only their 4 vCPUs, whatever the packet rate; the gain is the "
        "host time that interrupt work took from them before.",
    ]
    last = pairs[-1]
    b, a = last["before"], last["after"]
    lines += [
        "",
        "Last pair in detail (min / median / max over its windows):",
        "",
        "| | before (driver's IRQ spread) | after (tune.yml: IRQs pinned away, workload fenced) |",
        "|---|---|---|",
        "| queue IRQ CPUs (smp_affinity_list) | %s | %s |" % (cpus_text(b["irq_cpus"]), cpus_text(a["irq_cpus"])),
        "| workers' iterations/s, all 4 | %s | %s |" % (fmt(b["workers_per_s"], 0), fmt(a["workers_per_s"], 0)),
        "| packets received per window | %s | %s |" % (fmt(b["rx_packets"], 0), fmt(a["rx_packets"], 0)),
        "| receive drops per window (netdev / softnet) | %s / %s | %s / %s |" % (
            fmt(b["rx_dropped"], 0), fmt(b["softnet_dropped"], 0), fmt(a["rx_dropped"], 0), fmt(a["softnet_dropped"], 0)),
        "",
        "| CPU | before user | before softirq | before squeezes | after user | after softirq | after squeezes |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cpu in sorted(b["cpus"]):
        bc, ac = b["cpus"][cpu], a["cpus"][cpu]
        lines.append("| %d | %.1f | %.1f | %d | %.1f | %.1f | %d |" % (
            cpu, bc["user_pct"]["median"], bc["softirq_pct"]["median"], bc["squeezes"]["median"],
            ac["user_pct"]["median"], ac["softirq_pct"]["median"], ac["squeezes"]["median"]))
    lines += ["", "Diagnose reasons before (last pair): %s" % "; ".join(b["reasons"]),
              "", "Diagnose reasons after (last pair): %s" % "; ".join(a["reasons"]),
              "", "The last pair's diagnose reports: [before](closed_loop_before/cluster.html), "
              "[after](closed_loop_after/cluster.html).",
              "", "tune.yml per pair: %s s. The last pair's drift report afterwards (check mode): %s." % (
                  ", ".join("%.0f" % p["tune_wall_s"] for p in pairs), result["drift_gate"])]
    return "\n".join(lines) + "\n"


def one_pair(options, base, port, last=True):
    """A fresh guest, the untuned node under load, diagnose + measure, tune.yml, the next job, diagnose + measure."""
    LAB.up(NAME, "gpu-node", port)
    inst = LAB.load_instance(NAME)
    try:
        vcpus = pin_vcpus(inst) if options.pin_vcpus else None
        inv = inventory(inst, base, {})
        # A node whose IRQs were never tuned: irqbalance stopped, the driver's own spread (LAB.md).
        ssh(inst, "systemctl stop irqbalance; ethtool -L %s combined 6" % IFACE)
        start_workers(inst)
        # The traffic outlasts both phases and tune.yml; it is stopped at the end of the pair.
        with Traffic(inst, options.rate, 3600) as traffic:
            before = phase(inst, inv, "before", options.reps, options.window, base / "before")
            res, tune_wall = playbook(inv, "tune.yml", "-e", "gpunode_tune_report_dir=%s" % (base / "tune"))
            if res.returncode:
                if options.out:     # the whole play's output beside the results, for the failure's first task
                    Path(options.out).with_suffix(".tune-failed.log").write_text(res.stdout + res.stderr)
                raise SystemExit("tune.yml failed:\n%s" % res.stdout[-4000:])
            start_workers(inst)
            after = phase(inst, inv, "after", options.reps, options.window, base / "after")
            traffic.stop()
        drift = {"gate_text": "not checked in this pair (the last pair's is)"}
        if last:
            playbook(inv, "tune.yml", "--check", "-e", "gpunode_tune_report_dir=%s" % (base / "drift"))
            drift_file = base / "drift" / "cluster.json"
            drift = json.loads(drift_file.read_text()) if drift_file.exists() else {"gate_text": "no drift report (tune.yml --check failed)"}
    finally:
        LAB.down(NAME)
    pair = {"before": before, "after": after, "tune_wall_s": round(tune_wall, 1), "tune_rc": res.returncode,
            "drift_gate": drift["gate_text"], "gain_pct": round(gain_of(before, after), 1), "vcpu_threads": vcpus}
    return pair


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="15M", help="iperf3 -b per stream (two streams)")
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--port", type=int, default=22295)
    parser.add_argument("--no-pin-vcpus", dest="pin_vcpus", action="store_false",
                        help="leave QEMU's vCPU threads unpinned (they then share the host's cores as one pool)")
    # Needs iperf3 on this machine too (the client runs in the namespace): apt-get install iperf3.
    parser.add_argument("--out", default=None)
    parser.add_argument("--resume", action="store_true",
                        help="keep the pairs of OUT's .partial.json (a run that stopped), or of OUT's .json, and "
                             "measure the rest")
    parser.add_argument("--discard", action="append", default=[], metavar="N=WHY",
                        help="with --resume: move kept pair N (from 1) to 'discarded' with the reason WHY; a new "
                             "pair takes its place")
    options = parser.parse_args(argv)
    command = "%s %s" % (Path(sys.executable).name, " ".join([str(Path(__file__).relative_to(ROOT))] + (argv or sys.argv[1:])))
    out = Path(options.out) if options.out else None
    if options.pin_vcpus:
        os.sched_setaffinity(0, {0})    # this script, its playbooks, iperf3 and QEMU's non-vCPU threads
    pairs, discarded, kept = [], [], None
    if options.resume and out and out.with_suffix(".partial.json").exists():
        pairs = json.loads(out.with_suffix(".partial.json").read_text())
    elif options.resume and out and out.with_suffix(".json").exists():
        kept = json.loads(out.with_suffix(".json").read_text())
        pairs, discarded = kept["pairs"], kept.get("discarded", [])
    for item in sorted(options.discard, key=lambda text: -int(text.split("=", 1)[0])):
        number, why = item.split("=", 1)
        discarded.append({"pair": pairs.pop(int(number) - 1), "why": why,
                          "measured": "as pair %s of the run that kept it" % number})
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        for n in range(len(pairs), options.pairs):
            base = Path(tmp) / ("pair-%d" % n)
            base.mkdir()
            # a port per pair: the last guest's forward may still hold the previous one for a while
            pair = one_pair(options, base, options.port + n, last=n == options.pairs - 1)
            pairs.append(pair)
            if out:
                # Each pair kept as it ends: a pair that fails later does not lose the ones measured before it.
                out.with_suffix(".partial.json").write_text(json.dumps(pairs, indent=1, default=str) + "\n")
            print(json.dumps({"pair": n + 1, "holds": holds(pair), "gain_pct": pair["gain_pct"],
                              "before": [pair["before"][k] for k in ("verdict", "verdict_rule", "named_irq_cpus")],
                              "after": [pair["after"][k] for k in ("verdict", "verdict_rule", "named_irq_cpus")]}), flush=True)
        gains = [p["gain_pct"] for p in pairs]
        measured = kept is None or len(kept["pairs"]) - len(options.discard) < options.pairs
        if not measured:
            # only rendered again (--resume with every pair kept): the run's own command and date stay
            command = "%s (rendered again by: %s)" % (kept["command"], command)
        result = {"command": command, "machine": platform.platform(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) if measured else kept["date"],
                  "rate": options.rate, "window": options.window, "reps": options.reps, "pin_vcpus": options.pin_vcpus,
                  "pairs": pairs, "discarded": discarded, "all_hold": all(holds(p) for p in pairs),
                  "controls": [control(p) for p in pairs],
                  "median_gain_pct": round(statistics.median(gains), 1), "drift_gate": pairs[-1]["drift_gate"]}
        text = markdown(result)
        print(text)
        if out:
            out.write_text(text)
            out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
            out.with_suffix(".partial.json").unlink(missing_ok=True)
            for label in ("before", "after"):
                source = Path(tmp) / ("pair-%d" % (options.pairs - 1)) / label
                if not source.is_dir():
                    continue        # --resume with nothing left to measure: the reports beside OUT stay
                dest = out.parent / ("closed_loop_%s" % label)
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(source, dest)
    return 0 if result["all_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
