# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark nic_irq_facts against the seed article's shell loop on generated trees.

Usage (from the repository root, after one pytest run made build/collections):

    .venv/bin/python benchmarks/nic_irq_facts_bench.py [--runs 15] [--write benchmarks/nic_irq_facts_results.md]

Trees (tests/unit/treegen.py):
  * seed_vm: 176 vCPUs, 2 NUMA nodes, mlx5 VF ens7 with 11 comp IRQs (~230 IRQ rows)
  * large_numa: 1152 CPUs, 16 NUMA nodes, mlx5 PF with 64 comp IRQs, 1000 IRQ rows
    (/proc/interrupts of ~12 MB)
  * large_numa before tuning: the same, with every IRQ of the NIC allowed on all 1152 CPUs (the
    kernel's default), once with irq_affinity_format=both (integer lists too, asked for) and once
    with irq_affinity_format=string (the default since issue 29)

Measured, median and max of --runs:
  1. module main() in process (argument parsing, read_nic, read_topology, read_irqbalance; exit_json is
     replaced, so Ansible's exit-time scrubbing and JSON encoding are not in it): the module's own work
  2. the module as Ansible runs it on a target: a fresh `python3 nic_irq_facts.py args.json`
     (interpreter start and ansible.module_utils imports included)
  3. the seed's step-1 loop (grep mlx5_compN@pci:PCI in /proc/interrupts, cat smp_affinity_list and
     effective_affinity_list per IRQ) under bash, on the same tree
  4. the floor: a fresh `python3 -c "import ansible.module_utils.basic"`, what any Python module pays
     before its own work; and the size of the module's JSON output
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, "build", "collections")
sys.path.insert(0, COLLECTIONS)
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))

import treegen  # noqa: E402
from ansible.module_utils import basic  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_facts  # noqa: E402

SEED_LOOP = r'''
P="$1"; PCI="$2"
for irq in $(grep -E "mlx5_comp[0-9]+@pci:${PCI}" "$P/interrupts" | awk -F: '{gsub(/ /,"",$1); print $1}'); do
  echo "IRQ $irq affinity=$(cat $P/irq/$irq/smp_affinity_list) effective=$(cat $P/irq/$irq/effective_affinity_list)"
done
'''


class _Done(Exception):
    pass


def _exit(self, **kwargs):
    raise _Done(kwargs)


def _args(tree, iface, fmt):
    return {"interface": iface, "procfs_path": tree.proc, "sysfs_path": tree.sys, "irq_affinity_format": fmt}


def in_process(tree, iface, fmt):
    basic.AnsibleModule.exit_json = _exit
    with patch_module_args(_args(tree, iface, fmt)):
        start, cpu = time.perf_counter(), time.process_time()
        result = None
        try:
            nic_irq_facts.main()
        except _Done as done:
            result = done.args[0]
        elapsed = time.perf_counter() - start
        CPU.append(time.process_time() - cpu)
    assert result["ansible_facts"]["nic_irq"]["interface"] == iface
    return elapsed


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


OUTPUT = {}


def as_ansible(tree, iface, fmt, tmp):
    args = os.path.join(tmp, "args.json")
    with open(args, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": _args(tree, iface, fmt)}, handle)
    module = os.path.join(ROOT, "plugins", "modules", "nic_irq_facts.py")
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, module, args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=True)
    elapsed = time.perf_counter() - start
    CPU.append(_children_cpu() - cpu)
    assert json.loads(proc.stdout)["ansible_facts"]["nic_irq"]["interface"] == iface
    OUTPUT["bytes"] = len(proc.stdout)
    return elapsed


def floor():
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    start, cpu = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, "-c", "import ansible.module_utils.basic"], env=env, check=True)
    elapsed = time.perf_counter() - start
    CPU.append(_children_cpu() - cpu)
    return elapsed


def seed_loop(tree, pci, expected):
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(["bash", "-c", SEED_LOOP, "loop", tree.proc, pci], stdout=subprocess.PIPE, check=True)
    elapsed = time.perf_counter() - start
    CPU.append(_children_cpu() - cpu)
    assert proc.stdout.decode().count("IRQ ") == expected
    return elapsed


CPU = []


def measure(func, runs, *args):
    """(median wall ms, max wall ms, median child CPU ms or None)."""
    func(*args)  # warm the page cache
    del CPU[:]
    values = [func(*args) for dummy in range(runs)]
    cpu = statistics.median(CPU) * 1000 if CPU else None
    return statistics.median(values) * 1000, max(values) * 1000, cpu


LOAD = os.getloadavg()[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--write")
    opts = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="nic_irq_bench_")
    untuned = treegen.large_numa(1152, 1000, 64)
    for irq in untuned["nics"][0]["irqs"]:
        irq["affinity"] = irq["effective"] = list(range(1152))      # the kernel's default before any tuning
    shapes = [
        ("seed VM: 176 vCPUs, mlx5 VF + 8 IB VFs", treegen.seed_vm(), "ens7", "0000:00:07.0", 11, 100, "both"),
        ("large NUMA: 1152 CPUs, 1000 IRQ rows", treegen.large_numa(1152, 1000, 64), "eth0", "0000:81:00.0", 64, 1000, "both"),
        ("large NUMA before tuning: NIC IRQs on all 1152 CPUs, irq_affinity_format=both", untuned, "eth0", "0000:81:00.0",
         64, 1000, "both"),
        ("large NUMA before tuning: NIC IRQs on all 1152 CPUs, irq_affinity_format=string", untuned, "eth0", "0000:81:00.0",
         64, 1000, "string"),
    ]
    rows = []
    trees = {}
    for label, spec, iface, pci, nqueues, goal, fmt in shapes:
        if id(spec) not in trees:
            trees[id(spec)] = treegen.build_tree(os.path.join(tmp, "tree%d" % len(trees)), spec)
        tree = trees[id(spec)]
        size = os.path.getsize(os.path.join(tree.proc, "interrupts"))
        lines = sum(1 for dummy in open(os.path.join(tree.proc, "interrupts")))
        r1 = measure(in_process, opts.runs, tree, iface, fmt)
        r2 = measure(as_ansible, opts.runs, tree, iface, fmt, tmp)
        r3 = measure(seed_loop, opts.runs, tree, pci, nqueues)
        rows.append((label, size, lines, goal, r1, r2, r3, OUTPUT["bytes"]))
    base = measure(floor, opts.runs)
    out = []
    out.append("# nic_irq_facts benchmark\n")
    out.append("Command: `.venv/bin/python benchmarks/nic_irq_facts_bench.py --runs %d --write benchmarks/nic_irq_facts_results.md`\n" % opts.runs)
    out.append("Machine: %s, Python %s, %d CPUs, load average %.1f at start, %s. Wall times in ms, median / max of %d runs"
               " after one warm-up; also the median CPU time (user+sys; for main() in process the process's own CPU"
               " time), which the load of other jobs on the machine does not inflate. \"Above the floor\" is the"
               " module process's CPU minus the floor's.\n" % (
                   platform.platform(), platform.python_version(), os.cpu_count(), LOAD, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   opts.runs))
    out.append("| tree | /proc/interrupts | goal | module work: main() in process (wall; CPU) "
               "| module as Ansible runs it, new python3 (wall; CPU) | above the floor (CPU) | JSON output "
               "| seed shell loop, bash (wall; CPU) |")
    out.append("|---|---|---|---|---|---|---|---|")

    def ms(value):
        return "-" if value is None else "%.1f" % value

    for label, size, lines, goal, r1, r2, r3, nbytes in rows:
        delta = None if r2[2] is None or base[2] is None else r2[2] - base[2]
        out.append("| %s | %d lines, %.1f MB | < %d ms | %s / %s; %s | %s / %s; %s | %s | %.0f KB | %s / %s; %s |" % (
            label, lines, size / 1e6, goal, ms(r1[0]), ms(r1[1]), ms(r1[2]), ms(r2[0]), ms(r2[1]), ms(r2[2]), ms(delta),
            nbytes / 1e3, ms(r3[0]), ms(r3[1]), ms(r3[2])))
    out.append("| floor: `python3 -c \"import ansible.module_utils.basic\"` | | | | %s / %s; %s | 0 | | |" % (
        ms(base[0]), ms(base[1]), ms(base[2])))
    out.append("")
    out.append("The module does more than the loop: it also selects the interface, resolves the PCI function, reads the")
    out.append("whole topology (every CPU's thread_siblings_list), irqbalance state, per-CPU counts and classifies every IRQ of")
    out.append("the function. The \"as Ansible runs it\" column includes starting the interpreter and importing")
    out.append("ansible.module_utils.basic, which is the floor of any Python module.")
    text = "\n".join(out) + "\n"
    print(text)
    if opts.write:
        with open(opts.write, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
