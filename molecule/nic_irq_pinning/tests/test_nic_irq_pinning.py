"""nic_irq_pinning and irqbalance on real kernels: the lab proof of issue 6.

Runs after converge, idempotence and the no-change check. The tests run in
file order and build on each other (one guest boot for the whole story):

  1  the fresh-guest check-mode plan is exactly what converge did
  2  converged state: irqbalance masked, 12 queue IRQs as planned, unit enabled
  3  drift: irqbalance un-masked and started moves IRQs, check mode reports it,
     converge fixes it
  4  reboot: the pins come back without Ansible, NIC found by PCI address
  5  PCI unbind/bind: the pins come back by the udev rule within seconds
  6  ethtool -L 4 then 6: check mode reports the drift, the timer restores it
  7  small-node (one NUMA node, no irqbalance) converged
  8  state=absent leaves nothing behind and gives irqbalance back

The helpers (guest SSH, the independent IRQ probe, playbook runs, reports)
are in molecule/_shared/labtest.py, shared with the irqbalance_banned scenario.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import (ENTRY, GPU, LIB, MASK_MARKER, RECHECK, RULE, STATE, TIMER, UNIT,  # noqa: E402
                     assert_fresh_plan_was_applied, assert_gpu_layout, host, pinned_as_planned, planned,
                     playbook, probe, queue_cpus, reboot, report, ssh, wait_until)

SMALL = {"name": "small-node", "iface": "ens4", "pci": "0000:00:04.0", "queues": 2}


# 1 -------------------------------------------------------------------------

def test_fresh_check_mode_plan_is_exactly_what_converge_did():
    assert_fresh_plan_was_applied(GPU)


# 2 -------------------------------------------------------------------------

def test_converged_gpu_node_pins_irqbalance_and_persistence():
    data = probe(GPU)
    assert_gpu_layout(data)
    h = host(GPU["name"])
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "masked"
    assert not h.service("irqbalance").is_running
    assert h.file(MASK_MARKER).exists
    assert json.loads(h.file(MASK_MARKER).content_string)["previous"] == {"enabled": True, "active": True}
    assert h.service("gpunode-nic-irq-affinity.service").is_enabled
    assert h.service("gpunode-nic-irq-affinity.timer").is_enabled
    assert h.service("gpunode-nic-irq-affinity.timer").is_running
    rule = h.file(RULE)
    assert rule.mode == 0o644 and 'KERNELS=="%s"' % GPU["pci"] in rule.content_string
    state = h.file(STATE)
    assert state.user == "root" and state.mode == 0o644
    desired = json.loads(state.content_string)
    assert desired["pci_address"] == GPU["pci"]
    assert "interface" not in desired and desired["count"] == 4
    assert h.file(ENTRY).mode == 0o755
    assert h.file(LIB + "/ansible_collections/gpunode/tuning/plugins/module_utils/_irq_pin_cli.py").exists
    # The installed entry point, run by hand in check mode, agrees: nothing to change.
    out = h.check_output("%s --check %s" % (ENTRY, STATE))
    assert "no change" in out and "(would_change)" not in out, out


# 3 -------------------------------------------------------------------------

def test_drift_by_irqbalance_is_reported_in_check_mode_and_fixed_by_converge():
    plan = planned(GPU["name"])
    ssh(GPU["name"], "systemctl unmask irqbalance.service && systemctl start irqbalance.service")
    moved = wait_until(lambda: not pinned_as_planned(GPU, plan), timeout=120)
    assert moved is not None, "irqbalance did not move any queue IRQ within 120 s"

    res, recap = playbook("--limit", GPU["name"], check=True, tag="drift-check")
    assert res.returncode == 0, res.stdout[-3000:]
    assert recap.get(GPU["name"], 0) > 0, "check mode reported no drift on gpu-node"
    drift = report(GPU["name"], "drift-check")["drift"]
    assert drift, "the report lists no drifted IRQ"
    assert pinned_as_planned(GPU, plan) is False, "check mode wrote the pins back"

    res, recap = playbook("--limit", GPU["name"], tag="drift-fix")
    assert res.returncode == 0, res.stdout[-3000:]
    assert recap[GPU["name"]] > 0
    data = probe(GPU)
    assert_gpu_layout(data)
    assert ssh(GPU["name"], "systemctl is-enabled irqbalance.service", check=False).stdout.strip() == "masked"
    # The marker still holds the state found before the role first masked it.
    marker = json.loads(ssh(GPU["name"], "cat %s" % MASK_MARKER).stdout)
    assert marker["previous"] == {"enabled": True, "active": True}


# 4 -------------------------------------------------------------------------

def test_reboot_restores_the_pins_without_ansible():
    before = probe(GPU)
    plan_by_queue = {q: next(iter(v)) for q, v in queue_cpus(before).items()}
    back = reboot(GPU, before["boot_id"])

    def restored():
        data = probe(GPU)
        return {q: next(iter(v)) for q, v in queue_cpus(data).items() if len(v) == 1} == plan_by_queue and data

    waited = wait_until(restored, timeout=120)
    assert waited is not None, "pins not restored after reboot: %s" % queue_cpus(probe(GPU))
    assert_gpu_layout(probe(GPU))
    journal = ssh(GPU["name"], "journalctl -b -u gpunode-nic-irq-affinity.service --no-pager -o cat").stdout
    assert "(%s)" % GPU["pci"] in journal, journal
    print("reboot: SSH back after %.0f s, pins found %.0f s later" % (back, waited))


# 5 -------------------------------------------------------------------------

def test_pci_rebind_restores_the_pins_through_udev():
    before = probe(GPU)
    plan_by_queue = {q: next(iter(v)) for q, v in queue_cpus(before).items()}
    # Stop the timer so that only the udev rule can restore the pins.
    ssh(GPU["name"], "systemctl stop gpunode-nic-irq-affinity.timer")
    since = ssh(GPU["name"], "date +%s").stdout.strip()
    ssh(GPU["name"], "echo {pci} > /sys/bus/pci/drivers/virtio-pci/unbind && sleep 1 && "
                     "echo {pci} > /sys/bus/pci/drivers/virtio-pci/bind".format(pci=GPU["pci"]))
    start = time.monotonic()

    def restored():
        data = probe(GPU)
        got = {q: next(iter(v)) for q, v in queue_cpus(data).items() if len(v) == 1}
        return got == plan_by_queue and data

    waited = wait_until(restored, timeout=60, step=1)
    assert waited is not None, "pins not restored after rebind: %s" % queue_cpus(probe(GPU))
    journal = ssh(GPU["name"], "journalctl -u gpunode-nic-irq-affinity.service --since @%s --no-pager -o cat" % since).stdout
    assert "(changed)" in journal, "the unit did not run (or changed nothing) after the rebind:\n" + journal
    assert ssh(GPU["name"], "ip -br link show dev %s" % GPU["iface"], check=False).returncode == 0
    ssh(GPU["name"], "systemctl start gpunode-nic-irq-affinity.timer")
    print("rebind: pins restored %.1f s after bind" % (time.monotonic() - start))


# 6 -------------------------------------------------------------------------

def test_channel_change_is_drift_in_check_mode_and_the_timer_restores_it():
    before = probe(GPU)
    plan_by_queue = {q: next(iter(v)) for q, v in queue_cpus(before).items()}
    ssh(GPU["name"], "systemctl stop gpunode-nic-irq-affinity.timer")
    ssh(GPU["name"], "ethtool -L {i} combined 4 && ethtool -L {i} combined 6".format(i=GPU["iface"]))
    moved = queue_cpus(probe(GPU))
    assert dict(moved) != {q: {c} for q, c in plan_by_queue.items()}, \
        "ethtool -L did not re-spread the IRQs here; this test would prove nothing"

    res, recap = playbook("--limit", GPU["name"], check=True, tag="channels-check")
    assert res.returncode == 0, res.stdout[-3000:]
    assert recap.get(GPU["name"], 0) > 0, "check mode reported no drift after ethtool -L"
    assert report(GPU["name"], "channels-check")["drift"]

    since = ssh(GPU["name"], "date +%s").stdout.strip()
    ssh(GPU["name"], "systemctl start gpunode-nic-irq-affinity.timer")

    def restored():
        data = probe(GPU)
        got = {q: next(iter(v)) for q, v in queue_cpus(data).items() if len(v) == 1}
        return got == plan_by_queue and data

    waited = wait_until(restored, timeout=150, step=3)
    assert waited is not None, "the timer did not restore the pins: %s" % queue_cpus(probe(GPU))
    journal = ssh(GPU["name"], "journalctl -u gpunode-nic-irq-affinity-recheck.service --since @%s --no-pager -o cat"
                  % since).stdout
    assert "(changed)" in journal, journal
    print("ethtool -L: timer restored the pins %.0f s after it was started" % waited)

    # Converged again: the quiet re-check logs nothing.
    since = ssh(GPU["name"], "date +%s").stdout.strip()
    ssh(GPU["name"], "systemctl start gpunode-nic-irq-affinity-recheck.service")
    quiet = ssh(GPU["name"], "journalctl -u gpunode-nic-irq-affinity-recheck.service --since @%s --no-pager -o cat"
                % since).stdout
    assert quiet.strip() in ("", "-- No entries --"), quiet


# 7 -------------------------------------------------------------------------

def test_small_node_without_irqbalance_and_numa_converged():
    data = probe(SMALL)
    by_queue = queue_cpus(data)
    assert sorted(by_queue) == list(range(SMALL["queues"]))
    assert all(len(v) == 1 for v in by_queue.values()), by_queue
    assert by_queue == {q: {after} for q, after in
                        {i["queue"]: i["after"] for i in report(SMALL["name"], "run")["irqs"] if i["kind"] == "queue"}.items()}
    rep = report(SMALL["name"], "run")
    assert rep["irqbalance"]["installed"] is False
    h = host(SMALL["name"])
    assert h.service("gpunode-nic-irq-affinity.service").is_enabled
    assert json.loads(h.file(STATE).content_string)["pci_address"] == SMALL["pci"]
    assert not h.file(MASK_MARKER).exists


# 8 -------------------------------------------------------------------------

def test_state_absent_leaves_nothing_and_gives_irqbalance_back():
    res, recap = playbook("--extra-vars", "nic_irq_pinning_state=absent", tag="absent")
    assert res.returncode == 0, res.stdout[-3000:]
    for node in (GPU, SMALL):
        h = host(node["name"])
        for path in (UNIT, TIMER, RECHECK, RULE, STATE, LIB, ENTRY, MASK_MARKER):
            assert not h.file(path).exists, "%s: %s is still there" % (node["name"], path)
        assert h.run("systemctl cat gpunode-nic-irq-affinity.service").rc != 0
    h = host(GPU["name"])
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "enabled"
    assert h.service("irqbalance").is_running
