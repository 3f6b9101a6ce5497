# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The boot-time entry point of nic_irq_pinning, installed the way nic_irq_persist installs it.

The library tree is the import closure of ``_nic_irq.pin_cli`` that the module
installs (``_payload.library_files``), the entry point is the module's own
rendering, and it runs in a separate, isolated Python (-I: no PYTHONPATH, no
script directory) against a generated tree of the lab's gpu-node guest. So
these tests fail if the closure misses a module_utils file or an __init__.py,
or if the entry point cannot import the installed copy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import persist as _nic_persist
from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload
from treegen import build_tree, lab_virtio


@pytest.fixture
def installed(tmp_path):
    """lib dir + entry point, as nic_irq_persist lays them out."""
    lib = tmp_path / "lib"
    for rel, data in _payload.library_files().items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_bytes(data)
    entry = tmp_path / "gpunode-nic-irq-pin"
    entry.write_text(_nic_persist.entry_point(sys.executable, str(lib), entry.name))
    entry.chmod(0o755)
    return entry


@pytest.fixture
def lab(tmp_path):
    tree = build_tree(tmp_path / "tree", lab_virtio())
    state = tmp_path / "nic-irq-affinity.json"
    state.write_text(json.dumps({
        "pci_address": "0000:42:01.0", "count": 4, "numa_local": True, "whole_cores": True,
        "allow_irqbalance": True, "strict": False, "procfs_path": tree.proc, "sysfs_path": tree.sys,
    }))
    return tree, state


def _run(entry, *args):
    return subprocess.run([sys.executable, "-I", str(entry)] + [str(a) for a in args],
                          capture_output=True, text=True, cwd="/", timeout=60, check=False)


def test_entry_point_pins_queue_pairs_round_robin_on_numa_node_1(installed, lab):
    tree, state = lab
    res = _run(installed, state)
    assert res.returncode == 0, res.stdout + res.stderr
    irqs = tree.irqs("enp66s1")
    names = dict((i["irq"], i["name"]) for i in tree.spec["nics"][1]["irqs"])
    by_queue = {}
    for irq in irqs:
        name = names[irq]
        if "-input." in name or "-output." in name:
            by_queue.setdefault(int(name.rsplit(".", 1)[1]), set()).add(tree.affinity(irq))
    assert len(by_queue) == 6
    assert all(len(cpus) == 1 for cpus in by_queue.values())        # input and output of a pair share a CPU
    cpus = [next(iter(by_queue[q])) for q in sorted(by_queue)]
    assert sorted(set(cpus)) == ["4", "5", "6", "7"]
    assert cpus[4:] == cpus[:2]                                       # round-robin: queues 4, 5 reuse the first CPUs
    assert "(changed)" in res.stdout


def test_quiet_run_on_a_converged_tree_prints_nothing_and_writes_nothing(installed, lab):
    tree, state = lab
    assert _run(installed, state).returncode == 0
    before = tree.all_affinities()
    res = _run(installed, "--quiet", state)
    assert res.returncode == 0
    assert res.stdout == ""
    assert tree.all_affinities() == before


def test_quiet_run_reports_what_it_restored(installed, lab):
    tree, state = lab
    assert _run(installed, state).returncode == 0
    moved = tree.irqs("enp66s1")[-1]
    tree.set_affinity(moved, [0])                                      # what ethtool -L does to the pins
    res = _run(installed, "--quiet", state)
    assert res.returncode == 0
    assert "irq %d " % moved in res.stdout and "(changed)" in res.stdout
    assert tree.affinity(moved) != "0"


def test_a_missing_nic_fails_loudly_even_when_quiet(installed, lab, tmp_path):
    tree, state = lab
    data = json.loads(state.read_text())
    data["pci_address"] = "0000:99:00.0"
    state.write_text(json.dumps(data))
    res = _run(installed, "--quiet", "--wait", "0", state)
    assert res.returncode == 1
    assert "0000:99:00.0" in res.stdout


def _close_interface(tree, irqs):
    """The NIC as a driver that requests its IRQs in ndo_open leaves it before the
    interface is up: the vectors in msi_irqs, no /proc/irq/N, no /proc/interrupts row."""
    for irq in irqs:
        shutil.rmtree(tree.irq_dir(irq))
    path = Path(tree.proc) / "interrupts"
    keep = [line for line in path.read_text().splitlines(keepends=True)
            if line.split(":", 1)[0].strip() not in {str(i) for i in irqs}]
    path.write_text("".join(keep))


def test_a_closed_interface_is_not_an_error_and_says_when_it_will_be_pinned(installed, lab):
    tree, state = lab
    irqs = tree.irqs("enp66s1")
    _close_interface(tree, irqs)
    before = tree.all_affinities()
    res = _run(installed, "--wait", "1", state)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no IRQs requested yet" in res.stdout and "if-up hook" in res.stdout, res.stdout
    assert str(len(irqs)) + " MSI vectors" in res.stdout, res.stdout
    assert tree.all_affinities() == before


def test_irqs_that_appear_while_waiting_are_pinned_in_the_same_run(lab):
    """The boot unit runs before the interface is opened: it waits (bounded) and pins
    the IRQs as soon as the driver requests them."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli

    tree, state = lab
    _close_interface(tree, tree.irqs("enp66s1"))
    opened = []

    def sleep(_seconds):
        if not opened:                      # "ip link set up": the driver requests the IRQs
            build_tree(tree.root, lab_virtio())
            opened.append(True)

    lines = []

    class Out(object):
        def write(self, text):
            lines.append(text)

    assert _irq_pin_cli.main(["--wait", "5", str(state)], run=tree.run, out=Out(), sleep=sleep) == 0, lines
    assert opened, "the run did not wait for the IRQs"
    queue = {int(i): tree.affinity(i) for i in tree.irqs("enp66s1")[1:]}
    assert sorted(set(queue.values())) == ["4", "5", "6", "7"], (queue, lines)


def _catches_sigterm(pid):
    """True once the process has a SIGTERM handler (SigCgt bit 15 in /proc/PID/status)."""
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def test_sigterm_while_waiting_for_the_interface_ends_the_wait_at_once_and_is_not_a_failure(installed, lab):
    """``systemctl restart`` from the udev rule or the if-up hook stops a run that is waiting:
    the wait ends now (the next run starts right after), nothing is written, exit 0."""
    tree, state = lab
    _close_interface(tree, tree.irqs("enp66s1"))
    before = tree.all_affinities()
    proc = subprocess.Popen([sys.executable, "-I", str(installed), "--wait", "30", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _catches_sigterm(proc.pid), "the entry point never installed its SIGTERM handler"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=25)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert time.monotonic() - sent < 25, "the wait went on after SIGTERM"
    assert "stop requested (SIGTERM)" in out and "no IRQs requested yet" in out, out
    assert tree.all_affinities() == before


def test_sigterm_during_a_pass_finishes_every_pin_of_it_then_stops(lab):
    """A restart never leaves half the queues pinned: the signal that arrives while the pass
    reads the NIC is noted, the pass writes every pin and prints them, and the run stops after it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli

    tree, state = lab
    sent = []

    def run(argv, *args, **kwargs):
        if not sent:
            os.kill(os.getpid(), signal.SIGTERM)                   # what systemctl restart sends, mid-pass
            sent.append(argv)
        return tree.run(argv, *args, **kwargs)

    lines = []

    class Out(object):
        def write(self, text):
            lines.append(text)

    previous = signal.getsignal(signal.SIGTERM)
    assert _irq_pin_cli.main([str(state)], run=run, out=Out(), sleep=lambda _s: None) == 0, lines
    assert sent, "the pass never ran a command: the signal was not sent mid-pass"
    assert signal.getsignal(signal.SIGTERM) is previous              # the handler is the run's only
    queue = {int(i): tree.affinity(i) for i in tree.irqs("enp66s1")[1:]}
    assert sorted(set(queue.values())) == ["4", "5", "6", "7"], (queue, lines)
    text = "".join(lines)
    assert "(changed)" in text and "stop requested (SIGTERM): the pass in progress was finished" in text, text


def _hold_pin_lock(tree):
    """Hold the tree's pin lock as the nic_irq_persist module does (a second open file description)."""
    import fcntl

    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import PIN_LOCK

    path = Path(tree.proc).parent / PIN_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_run_waits_for_the_pin_lock_and_applies_the_state_file_written_meanwhile(installed, lab):
    """The re-check that starts while Ansible re-pins: it waits for the lock, writes nothing meanwhile, and then
    applies the state file as Ansible left it (read under the lock), not the one it replaced."""
    tree, state = lab
    before = tree.all_affinities()
    fd = _hold_pin_lock(tree)
    proc = subprocess.Popen([sys.executable, "-I", str(installed), str(state)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)
        assert proc.poll() is None, "the run did not wait for the lock: %s" % (proc.communicate(),)
        assert tree.all_affinities() == before                       # nothing written while the lock is held
        data = json.loads(state.read_text())
        data["count"] = 2                                            # what Ansible writes while it holds the lock
        state.write_text(json.dumps(data))
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    queue = {int(i): tree.affinity(i) for i in tree.irqs("enp66s1")[1:]}
    assert len(set(queue.values())) == 2, (queue, out)                # the new state's 2 CPUs, not the old 4


def test_a_lock_held_past_the_wait_is_an_error_naming_it_and_nothing_is_written(lab):
    from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli

    tree, state = lab
    before = tree.all_affinities()
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    lines = []

    class Out(object):
        def write(self, text):
            lines.append(text)

    fd = _hold_pin_lock(tree)
    try:
        status = _irq_pin_cli.main([str(state)], run=tree.run, out=Out(), sleep=sleep, clock=lambda: now[0])
    finally:
        os.close(fd)
    text = "".join(lines)
    assert status == 1 and "another run holds the lock" in text and "nic-irq-pin.lock" in text, text
    assert now[0] >= 25.0, now                                        # it waited the whole bound first
    assert tree.all_affinities() == before


def test_sigterm_while_waiting_for_the_lock_ends_the_run_at_once(installed, lab):
    tree, state = lab
    before = tree.all_affinities()
    fd = _hold_pin_lock(tree)
    try:
        proc = subprocess.Popen([sys.executable, "-I", str(installed), str(state)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd="/")
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)                      # well under the 25 s lock wait
    finally:
        os.close(fd)
    assert proc.returncode == 0, out + err
    assert "stop requested (SIGTERM) while waiting for the lock" in out, out
    assert tree.all_affinities() == before
