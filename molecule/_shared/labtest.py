"""Helpers shared by the role scenarios' testinfra tests (nic_irq_pinning, irqbalance_banned).

A test module puts this directory on sys.path and imports it:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
    import labtest

Guest commands go over plain SSH with tests/lab/lab.py's options (they survive
a reboot); files and services are asserted with testinfra hosts from
Molecule's inventory. PROBE reads IRQ state on the guest independently of the
collection's code, so a bug there cannot confirm itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import time
import warnings
from pathlib import Path

import testinfra

REPO = Path(__file__).resolve().parents[2]
SCENARIO = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
SCENARIO_NAME = os.environ["MOLECULE_SCENARIO_NAME"]
# The converge playbook every role scenario shares (playbooks/tune.yml plus a report file).
CONVERGE = REPO / "molecule" / "_shared" / "tune_converge.yml"

GPU = {"name": "gpu-node", "iface": "enp66s1", "pci": "0000:42:01.0", "queues": 6, "cpus": {4, 5, 6, 7}}

UNIT = "/etc/systemd/system/gpunode-nic-irq-affinity.service"
TIMER = "/etc/systemd/system/gpunode-nic-irq-affinity.timer"
RECHECK = "/etc/systemd/system/gpunode-nic-irq-affinity-recheck.service"
RULE = "/etc/udev/rules.d/70-gpunode-nic-irq-affinity.rules"
STATE = "/etc/gpunode/nic-irq-affinity.json"
LIB = "/usr/local/lib/gpunode-tuning"
ENTRY = "/usr/local/sbin/gpunode-nic-irq-pin"
MASK_MARKER = "/etc/gpunode/irqbalance-masked.json"

# Guest-side helper the probe scripts of every scenario start with: a file's
# stripped text, or None.
GUEST_READ = r"""
def rd(p):
    try:
        with open(p) as fh:
            return fh.read().strip()
    except OSError:
        return None
"""

# Read on the guest, independently of the collection's code: the PCI
# function's MSI IRQs, their names, smp_affinity_list, effective affinity.
PROBE = r"""
import json, os, sys
""" + GUEST_READ + r"""
pci = sys.argv[1]
base = "/sys/bus/pci/devices/%s/msi_irqs" % pci
names = {}
with open("/proc/interrupts") as fh:
    for line in fh:
        parts = line.split()
        if parts and parts[0].rstrip(":").isdigit():
            names[int(parts[0].rstrip(":"))] = parts[-1]
irqs = {}
for n in sorted(int(i) for i in (os.listdir(base) if os.path.isdir(base) else [])):
    irqs[n] = {"name": names.get(n), "affinity": rd("/proc/irq/%d/smp_affinity_list" % n),
               "effective": rd("/proc/irq/%d/effective_affinity_list" % n)}
sib = {}
for c in os.listdir("/sys/devices/system/cpu"):
    if c[3:].isdigit() and c.startswith("cpu"):
        sib[int(c[3:])] = rd("/sys/devices/system/cpu/%s/topology/thread_siblings_list" % c)
print(json.dumps({"irqs": irqs, "siblings": sib, "boot_id": rd("/proc/sys/kernel/random/boot_id")}))
"""


def _lab():
    spec = importlib.util.spec_from_file_location("lab", REPO / "tests" / "lab" / "lab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAB = _lab()


def ssh(name, command, check=True, timeout=120):
    inst = LAB.load_instance("%s-%s" % (SCENARIO_NAME, name))
    res = subprocess.run(LAB.ssh_base(inst["port"], Path(inst["identity_file"])) + [command],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert res.returncode == 0, "%s: %s -> rc %d\n%s%s" % (name, command, res.returncode, res.stdout, res.stderr)
    return res


def probe(node):
    out = ssh(node["name"], "python3 -c '%s' %s" % (PROBE.replace("'", "'\"'\"'"), node["pci"])).stdout
    data = json.loads(out)
    data["irqs"] = {int(k): v for k, v in data["irqs"].items()}
    return data


def queue_cpus(data):
    """{queue: set of smp_affinity_list texts of its input/output IRQs}."""
    out = {}
    for irq in data["irqs"].values():
        m = re.match(r"virtio\d+-(input|output)\.(\d+)$", irq["name"] or "")
        if m:
            out.setdefault(int(m.group(2)), set()).add(irq["affinity"])
    return out


def cpus(text):
    """A Linux CPU list (``0-3,6``) as a set of ints; written here independently of the collection's parser."""
    out = set()
    for part in (text or "").strip().split(","):
        if part:
            low, high = (part.split("-") + [part])[:2]
            out |= set(range(int(low), int(high) + 1))
    return out


def host(name):
    return testinfra.get_host("ansible://%s" % name, ansible_inventory=INVENTORY)


def playbook(*extra, check=False, tag=None, path=None):
    """ansible-playbook on the scenario's inventory: the shared tune converge, or ``path``; (result, changed per host)."""
    argv = ["ansible-playbook", "--inventory", str(Path(INVENTORY).parent)]
    if check:
        argv += ["--check", "--diff"]
    if tag:
        argv += ["--extra-vars", "lab_report_tag=%s" % tag]
    argv += list(extra) + [str(path or CONVERGE)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)
    recap = {h: int(c) for h, c in re.findall(r"(?m)^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", res.stdout)}
    return res, recap


def report(name, tag):
    return json.loads((EPHEMERAL / ("report-%s-%s.json" % (name, tag))).read_text())


def wait_until(predicate, timeout, step=2.0):
    start = time.monotonic()
    while True:
        value = predicate()
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(step)


def planned(name, tag="run"):
    """{irq: after} of the queue IRQs in the role's report."""
    return {i["irq"]: i["after"] for i in report(name, tag)["irqs"] if i["kind"] == "queue"}


def pinned_as_planned(node, plan):
    data = probe(node)
    return all(data["irqs"].get(irq, {}).get("affinity") == after for irq, after in plan.items()) and data


def assert_gpu_layout(data):
    """12 queue IRQs; each pair on one CPU; the 4 CPUs of node 1 as whole SMT pairs; round-robin."""
    by_queue = queue_cpus(data)
    assert sorted(by_queue) == list(range(GPU["queues"])), by_queue
    assert all(len(v) == 1 for v in by_queue.values()), "a queue's input and output differ: %s" % by_queue
    cpus = [int(next(iter(by_queue[q]))) for q in range(GPU["queues"])]
    assert set(cpus) == GPU["cpus"], cpus
    for cpu in set(cpus):                                      # whole sibling pairs: both threads of each core used
        pair = {int(c) for c in re.split(r"[,-]", data["siblings"][str(cpu)])}
        assert pair <= set(cpus), (cpu, pair, cpus)
    assert len(set(cpus[:4])) == 4 and cpus[4:] == cpus[:2], "not round-robin over 4 CPUs: %s" % cpus


def assert_fresh_plan_was_applied(node):
    """The check-mode plan of the fresh guest (prepare) is exactly what converge did."""
    fresh = report(node["name"], "fresh-check")
    assert fresh["check_mode"] is True
    plan = {i["irq"]: i["after"] for i in fresh["irqs"] if i["kind"] == "queue"}
    assert len(plan) == 2 * node["queues"]
    assert fresh["drift"], "the fresh guest (irqbalance had spread the IRQs) showed no drift"
    data = probe(node)
    assert {irq: data["irqs"][irq]["affinity"] for irq in plan} == plan
    return fresh


def in_new_boot(node, boot_id):
    """A predicate: the guest answers SSH in a boot other than ``boot_id``.

    QEMU's port forward accepts the TCP connection even while the guest has no sshd, and ssh then waits for a banner
    that does not come (ConnectTimeout does not apply): so ask for sshd's banner first, with a short timeout, and
    only then log in. Each try costs seconds, not the 30 s of a hung login."""
    def rebooted():
        inst = LAB.load_instance("%s-%s" % (SCENARIO_NAME, node["name"]))
        if not LAB.ssh_banner(inst["port"], timeout=3):
            return False
        try:
            res = ssh(node["name"], "cat /proc/sys/kernel/random/boot_id", check=False, timeout=30)
        except subprocess.TimeoutExpired:
            return False
        return res.returncode == 0 and res.stdout.strip() != boot_id
    return rebooted


def start_reboot(node):
    """Reboot the guest 2 s after this SSH session ends (a timer with lab.py's accuracy: the default minute made
    reboots start up to 60 s late)."""
    ssh(node["name"], "systemd-run %s --on-active=2 systemctl reboot" % LAB.TIMER_NOW)


# The kernel's last words before it resets the machine (kernel/reboot.c, "reboot: Restarting system").
SHUTDOWN_DONE = "reboot: Restarting system"
# Seconds without SSH after which a guest whose old system has shut down completely gets a hardware reset.
RESET_AFTER = 300


def console_log(node):
    return Path(LAB.load_instance("%s-%s" % (SCENARIO_NAME, node["name"]))["console_log"])


def _console_since(node, offset):
    try:
        with open(console_log(node), "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _console_tail(node, text, lines=40):
    clean = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    return "\n".join([line for line in clean.splitlines() if line.strip()][-lines:])


def _timed(node, back, offset, start):
    """``back`` that also prints where the reboot's time went (issue 28's lab budget: a TCG reboot is the largest
    item of the suite): seconds until the old system's shutdown completed (the console's SHUTDOWN_DONE), until SSH
    answered in the new boot, and the new boot's own ``systemd-analyze time`` (kernel, initrd, userspace)."""
    seen = {}

    def predicate():
        if "shutdown" not in seen and SHUTDOWN_DONE in _console_since(node, offset):
            seen["shutdown"] = time.monotonic() - start
        if not back():
            return False
        res = ssh(node["name"], "systemd-analyze time 2> /dev/null | head -1", check=False, timeout=60)
        print("reboot of %s: shutdown complete after %s s, SSH in the new boot after %.0f s; %s" % (
            node["name"], "%.0f" % seen["shutdown"] if "shutdown" in seen else "?", time.monotonic() - start,
            res.stdout.strip() or "systemd-analyze: no answer"))
        return True
    return predicate


def reboot_all(nodes, boot_ids, timeout=600):
    """Reboot ``nodes`` at once (systemd, 2 s after each SSH session ends); seconds until every one answers SSH in
    a new boot.

    A TCG guest has been seen (once in CI) to stay silent for 600 s after a reboot. If a guest is not back after
    RESET_AFTER seconds and its console shows that the old system shut down completely (the kernel printed
    SHUTDOWN_DONE), the hang is in firmware or the next boot's start, before any code of this collection runs: it
    gets one hardware reset (QEMU system_reset) and the boot is waited for again, with a warning that carries the
    console; the console is also kept in the lab's failed/ directory. A guest whose shutdown did not complete fails
    with its console tail."""
    offsets = {}
    for node in nodes:
        try:
            offsets[node["name"]] = console_log(node).stat().st_size
        except OSError:
            offsets[node["name"]] = 0
    for node in nodes:
        start_reboot(node)
    start = time.monotonic()
    for node in nodes:
        back = _timed(node, in_new_boot(node, boot_ids[node["name"]]), offsets[node["name"]], start)
        if wait_until(back, timeout=max(0.0, RESET_AFTER - (time.monotonic() - start)), step=2) is not None:
            continue
        text = _console_since(node, offsets[node["name"]])
        keep = LAB.STATE / "failed"
        keep.mkdir(parents=True, exist_ok=True)
        (keep / ("%s-%s-reboot-%d.console.log" % (SCENARIO_NAME, node["name"], int(time.time())))).write_text(text)
        assert SHUTDOWN_DONE in text, "%s did not come back and its shutdown did not complete; console:\n%s" % (
            node["name"], _console_tail(node, text))
        warnings.warn("%s: no SSH %d s after a completed shutdown; hardware reset. Console since the reboot:\n%s" % (
            node["name"], RESET_AFTER, _console_tail(node, text)))
        inst = LAB.load_instance("%s-%s" % (SCENARIO_NAME, node["name"]))
        LAB.hmp(Path(inst["monitor"]), "system_reset")
        assert wait_until(back, timeout=max(60.0, timeout - RESET_AFTER), step=2) is not None, \
            "%s did not come back after a reset either; console:\n%s" % (
                node["name"], _console_tail(node, _console_since(node, offsets[node["name"]])))
    return time.monotonic() - start


def reboot(node, boot_id, timeout=600):
    """Reboot one guest; seconds until SSH is back in a new boot (see reboot_all)."""
    return reboot_all([node], {node["name"]: boot_id}, timeout)
