"""Lab cost benchmark: how long a restored guest takes to answer SSH, and a converged tune.yml pass.

Run by hand as root from the repository root, with the venv on PATH (it is not part of the test suite):

    PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/build/collections \\
        python3 benchmarks/lab_bench.py --runs 3 --out benchmarks/lab_results.md

1. ``lab.py up`` of a gpu-node guest restored from its saved booted state, ``--runs`` times: seconds until SSH
   answers and ``systemctl is-system-running`` settled (what ``up`` waits for), measured from the outside.
2. On one restored gpu-node guest: ``playbooks/tune.yml`` once (converge), then ``--runs`` converged passes and
   ``--runs`` check-mode passes (``--check --diff``), each timed, with the number of module runs on the host
   (``benchmarks/callback_plugins/module_runs.py``: tasks that ran a module there; set_fact, debug, assert and
   the role argument checks run on the controller and are not counted), and ``changed`` asserted 0 on the
   converged passes.

Settings: the gpu-node inventory of molecule/nic_irq_pinning (count 4, irqbalance disabled, timer 1min),
pipelining and ControlPersist as in the scenarios. The load average at start is recorded beside the result.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lab", ROOT / "tests" / "lab" / "lab.py")
LAB = importlib.util.module_from_spec(spec)
spec.loader.exec_module(LAB)

RECAP = re.compile(r"(?m)^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")


def up_times(runs):
    out = []
    for i in range(runs):
        name = "bench-up-%d" % i
        start = time.monotonic()
        subprocess.run([sys.executable, str(ROOT / "tests/lab/lab.py"), "up", "--name", name, "--shape", "gpu-node"],
                       check=True, capture_output=True, text=True)
        out.append(time.monotonic() - start)
        LAB.down(name)
    return out


def playbook(inventory, *extra):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_PIPELINING="True", ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3",
               ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile=/dev/null",
               ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "benchmarks" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="module_runs")
    start = time.monotonic()
    res = subprocess.run(["ansible-playbook", "-i", str(inventory)] + list(extra) + [str(ROOT / "playbooks/tune.yml")],
                         capture_output=True, text=True, env=env, check=False)
    elapsed = time.monotonic() - start
    if res.returncode != 0:
        raise SystemExit("tune.yml failed:\n" + res.stdout[-4000:] + res.stderr[-2000:])
    m = RECAP.search(res.stdout)
    runs = json.loads(re.search(r"(?m)^MODULE_RUNS (.*)$", res.stdout).group(1))
    return elapsed, len(runs.get("gpu-node", [])), int(m.group(3))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out")
    opts = parser.parse_args()
    load = os.getloadavg()[0]
    ups = up_times(opts.runs)
    inst = LAB.up("bench-tune", "gpu-node", None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inventory = Path(tmp) / "hosts.yml"
            inventory.write_text(json.dumps({"all": {"hosts": {"gpu-node": {
                "ansible_host": "127.0.0.1", "ansible_port": inst["port"], "ansible_user": "root",
                "ansible_ssh_private_key_file": inst["identity_file"],
                "nic_irq_pinning_interface": "enp66s1", "nic_irq_pinning_count": 4,
                "nic_irq_pinning_recheck_interval": "1min"}}}}))
            first = playbook(inventory)
            converged = [playbook(inventory) for dummy in range(opts.runs)]
            checks = [playbook(inventory, "--check", "--diff") for dummy in range(opts.runs)]
    finally:
        LAB.down("bench-tune")
    assert all(c[2] == 0 for c in converged + checks), (converged, checks)
    lines = [
        "# Lab cost: restored guests and a converged tune.yml pass",
        "",
        "Recorded %s on the project's 2-core machine (load average %.1f at start), TCG, QEMU %s." % (
            datetime.date.today().isoformat(), load, LAB.qemu_version().split()[3]),
        "Command: `python3 benchmarks/lab_bench.py --runs %d` (see the script's docstring)." % opts.runs,
        "",
        "| Measurement | Runs (s) | Median (s) | Module runs |",
        "|---|---|---|---|",
        "| `lab.py up` of a restored gpu-node until SSH answers and the boot settled | %s | %.1f | |" % (
            ", ".join("%.1f" % t for t in ups), statistics.median(ups)),
        "| first `tune.yml` (converge) on a fresh restored gpu-node | %.1f | | %d |" % (first[0], first[1]),
        "| converged `tune.yml` pass (changed=0) | %s | %.1f | %d |" % (
            ", ".join("%.1f" % c[0] for c in converged), statistics.median(c[0] for c in converged), converged[0][1]),
        "| `tune.yml --check --diff` on the converged guest (changed=0) | %s | %.1f | %d |" % (
            ", ".join("%.1f" % c[0] for c in checks), statistics.median(c[0] for c in checks), checks[0][1]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text)


if __name__ == "__main__":
    main()
