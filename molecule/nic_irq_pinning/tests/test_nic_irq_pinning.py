"""nic_irq_pinning and irqbalance on real kernels: the lab proof of issue 6.

Runs after converge, idempotence and the no-change check. The tests run in
file order and build on each other (one guest boot for the whole story):

  1  the fresh-guest check-mode plan is exactly what converge did
  2  converged state: irqbalance masked, 12 queue IRQs as planned, unit enabled
  3  drift: irqbalance un-masked and started moves IRQs, check mode reports it,
     converge fixes it
  4  reboot of both guests, re-check timers disabled: the boot unit (and on
     open-nic the ifupdown if-up hook, since vmxnet3 requests its IRQs only
     when the interface opens) restores the pins, asserted from their journal
  5  PCI unbind/bind: the pins come back by the udev rule within seconds
  5b open-nic brought up by hand after a rebind: the udev run finds the
     interface closed and says so, `ifup` pins it through the if-up hook;
     with allow-hotplug back, a rebind is pinned again
  6  ethtool -L 4 then 6: check mode reports the drift, the timer restores it
  6b the pin lock held by flock(1) (as a nic_irq_persist run holds it): the
     unit started meanwhile waits and writes nothing; a restart ends its wait
     (SIGTERM noted, never a kill) and the next run pins once the lock is free
  7  open-nic (small-node shape plus a 4-queue vmxnet3; one NUMA node, no
     irqbalance) converged
  8  state=absent leaves nothing behind and gives irqbalance back

The helpers (guest SSH, the independent IRQ probe, playbook runs, reports)
are in molecule/_shared/labtest.py, shared with the irqbalance_banned scenario.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import (ENTRY, GPU, LIB, MASK_MARKER, RECHECK, RULE, STATE, TIMER, UNIT,  # noqa: E402
                     assert_fresh_plan_was_applied, assert_gpu_layout, host, pinned_as_planned,
                     planned, playbook, probe, queue_cpus, reboot_all, report, ssh, wait_until)

OPEN = {"name": "open-nic", "iface": "ens8", "pci": "0000:00:08.0", "queues": 4}
HOOK = "/etc/network/if-up.d/gpunode-nic-irq-pin"
UNIT_NAME = "gpunode-nic-irq-affinity.service"


def open_queue_cpus(data):
    """{queue: smp_affinity_list} of the vmxnet3's rxtx IRQs (absent while the interface is closed)."""
    out = {}
    for irq in data["irqs"].values():
        m = re.match(r"ens8-rxtx-(\d+)$", irq["name"] or "")
        if m:
            out[int(m.group(1))] = irq["affinity"]
    return out


def journal(node, unit, since=None, boot=False):
    where = ("-b" if boot else "--since @%s" % since)
    return ssh(node["name"], "journalctl %s -u %s --no-pager -o cat" % (where, unit)).stdout


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
    assert h.file(LIB + "/ansible_collections/gpunode/tuning/plugins/module_utils/_nic_irq/pin_cli.py").exists
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

def test_reboot_restores_the_pins_from_the_boot_unit_and_the_if_up_hook():
    gpu_plan = {q: next(iter(v)) for q, v in queue_cpus(probe(GPU)).items()}
    open_plan = open_queue_cpus(probe(OPEN))
    assert len(open_plan) == OPEN["queues"]
    boot_ids = {}
    for node in (GPU, OPEN):
        # Only the boot-time paths may restore the pins: no re-check timer in the next boot.
        ssh(node["name"], "systemctl disable --now gpunode-nic-irq-affinity.timer")
        boot_ids[node["name"]] = probe(node)["boot_id"]
    up = reboot_all((GPU, OPEN), boot_ids)        # both guests reboot at once

    def gpu_restored():
        return {q: next(iter(v)) for q, v in queue_cpus(probe(GPU)).items() if len(v) == 1} == gpu_plan

    def open_restored():
        return open_queue_cpus(probe(OPEN)) == open_plan

    assert wait_until(gpu_restored, timeout=60) is not None, "gpu-node pins not restored: %s" % queue_cpus(probe(GPU))
    assert wait_until(open_restored, timeout=60) is not None, "open-nic pins not restored: %s" % open_queue_cpus(probe(OPEN))
    assert_gpu_layout(probe(GPU))
    for node in (GPU, OPEN):
        text = journal(node, UNIT_NAME, boot=True)
        # The driver's own spread differs from the pins: the boot-time run changed them.
        assert "(%s)" % node["pci"] in text and "(changed)" in text, "%s: boot unit journal:\n%s" % (node["name"], text)
        assert journal(node, "gpunode-nic-irq-affinity-recheck.service", boot=True).strip() in ("", "-- No entries --")
    hook_runs = ssh(OPEN["name"], "journalctl -b --no-pager -o cat _SYSTEMD_UNIT=ifup@ens8.service").stdout
    for node in (GPU, OPEN):
        ssh(node["name"], "systemctl enable --now gpunode-nic-irq-affinity.timer")
    print("reboot: both guests back after %.0f s; open-nic ifup@ens8 log: %r" % (up, hook_runs[-300:]))


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


# 5b ------------------------------------------------------------------------

def test_open_nic_brought_up_by_hand_is_pinned_by_the_if_up_hook():
    plan = open_queue_cpus(probe(OPEN))
    ssh(OPEN["name"], "systemctl stop gpunode-nic-irq-affinity.timer")
    # A host whose interface is not brought up automatically: ifupdown without allow-hotplug.
    since = ssh(OPEN["name"], "date +%s").stdout.strip()
    ssh(OPEN["name"], "ifdown ens8 && sed -i 's/^allow-hotplug ens8/#allow-hotplug ens8/' /etc/network/interfaces.d/ens8"
                      " && echo {pci} > /sys/bus/pci/drivers/vmxnet3/unbind && sleep 1"
                      " && echo {pci} > /sys/bus/pci/drivers/vmxnet3/bind".format(pci=OPEN["pci"]))
    # The udev rule ran the unit on "add": the vectors exist, the IRQs do not (closed); it waited and said so.
    said = wait_until(lambda: "no IRQs requested yet" in journal(OPEN, UNIT_NAME, since=since), timeout=90, step=3)
    assert said is not None, journal(OPEN, UNIT_NAME, since=since)
    assert open_queue_cpus(probe(OPEN)) == {}, "the IRQs exist although the interface was never opened"
    assert "(changed)" not in journal(OPEN, UNIT_NAME, since=since)

    since = ssh(OPEN["name"], "date +%s").stdout.strip()
    ssh(OPEN["name"], "ifup ens8")
    start = time.monotonic()
    waited = wait_until(lambda: open_queue_cpus(probe(OPEN)) == plan, timeout=60, step=1)
    assert waited is not None, "pins not applied after ifup: %s" % open_queue_cpus(probe(OPEN))
    text = journal(OPEN, UNIT_NAME, since=since)
    assert "(changed)" in text, "the if-up hook did not run the unit:\n" + text
    print("late ifup: pinned %.1f s after ifup" % (time.monotonic() - start))


def test_open_nic_rebind_with_allow_hotplug_is_pinned_again():
    plan = open_queue_cpus(probe(OPEN))
    # ifdown first: ifupdown keeps an interface brought up by hand as configured across the rebind, and then
    # `ifup --allow=hotplug` on the new device does nothing (found in the clean-clone run).
    ssh(OPEN["name"], "ifdown ens8 && sed -i 's/^#allow-hotplug ens8/allow-hotplug ens8/' /etc/network/interfaces.d/ens8")
    since = ssh(OPEN["name"], "date +%s").stdout.strip()
    ssh(OPEN["name"], "echo {pci} > /sys/bus/pci/drivers/vmxnet3/unbind && sleep 1 && "
                      "echo {pci} > /sys/bus/pci/drivers/vmxnet3/bind".format(pci=OPEN["pci"]))
    waited = wait_until(lambda: open_queue_cpus(probe(OPEN)) == plan, timeout=90, step=1)
    assert waited is not None, "pins not restored after rebind: %s" % open_queue_cpus(probe(OPEN))
    assert "(changed)" in journal(OPEN, UNIT_NAME, since=since)
    assert "192.168.77.2/24" in ssh(OPEN["name"], "ip -br addr show dev ens8").stdout
    ssh(OPEN["name"], "systemctl start gpunode-nic-irq-affinity.timer")
    print("rebind with allow-hotplug: pins back %.1f s after bind" % waited)


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


# 6b ------------------------------------------------------------------------

# Exit 0 once the unit's main process has a SIGTERM handler (SigCgt bit 15); python3 on the guest, not gawk.
SIGTERM_CAUGHT = ("python3 -c 'import subprocess, sys; "
                  "pid = int(subprocess.check_output([\"systemctl\", \"show\", \"-p\", \"MainPID\", \"--value\", \"%s\"])); "
                  "mask = [l.split()[1] for l in open(\"/proc/%%d/status\" %% pid) if l.startswith(\"SigCgt:\")] if pid else [\"0\"]; "
                  "sys.exit(0 if int(mask[0], 16) >> 14 & 1 else 1)'" % UNIT_NAME)


def test_a_restart_while_the_pin_lock_is_held_waits_then_pins_and_never_kills_a_run():
    """The lock and the restart on a real systemd: flock(1) holds the pin lock (as an Ansible run of
    nic_irq_persist does); the unit started meanwhile writes nothing and waits; a restart (what the udev rule and
    the if-up hook send) ends that wait with SIGTERM noted, not a kill; the next run pins once the lock is free."""
    plan_by_queue = {q: next(iter(v)) for q, v in queue_cpus(probe(GPU)).items()}
    assert all(c != "0" for c in plan_by_queue.values()), plan_by_queue
    ssh(GPU["name"], "systemctl stop gpunode-nic-irq-affinity.timer")
    irqs = [n for n, irq in probe(GPU)["irqs"].items() if re.match(r"virtio\d+-(input|output)\.\d+$", irq["name"] or "")]
    ssh(GPU["name"], "for n in %s; do echo 0 > /proc/irq/$n/smp_affinity_list; done" % " ".join(map(str, irqs)))
    moved = {q: {"0"} for q in plan_by_queue}
    assert queue_cpus(probe(GPU)) == moved
    since = ssh(GPU["name"], "date +%s").stdout.strip()
    ssh(GPU["name"], "mkdir -p /run/gpunode && (setsid nohup flock /run/gpunode/nic-irq-pin.lock sleep 25 "
                     ">/dev/null 2>&1 &) && sleep 1")
    ssh(GPU["name"], "systemctl start --no-block %s" % UNIT_NAME)
    assert wait_until(lambda: ssh(GPU["name"], SIGTERM_CAUGHT, check=False).returncode == 0, timeout=20, step=0.5) \
        is not None, "the boot unit's run never got its SIGTERM handler"
    time.sleep(1)
    assert queue_cpus(probe(GPU)) == moved, "the run pinned while another held the lock"
    ssh(GPU["name"], "systemctl --no-block restart %s" % UNIT_NAME)

    def restored():
        return {q: next(iter(v)) for q, v in queue_cpus(probe(GPU)).items() if len(v) == 1} == plan_by_queue

    waited = wait_until(restored, timeout=90)
    text = journal(GPU, UNIT_NAME, since=since)
    assert waited is not None, "pins not restored after the lock was freed:\n%s" % text
    assert "code=killed" not in text and "status=15" not in text, text
    assert "stop requested (SIGTERM) while waiting for the lock /run/gpunode/nic-irq-pin.lock" in text, text
    assert "(changed)" in text and "Failed" not in text, text
    ssh(GPU["name"], "systemctl start gpunode-nic-irq-affinity.timer")
    print("lock held 25 s, restart while waiting: pins restored %.0f s after the restart" % waited)


# 7 -------------------------------------------------------------------------

def test_open_nic_node_without_irqbalance_and_numa_converged():
    data = probe(OPEN)
    got = open_queue_cpus(data)
    assert sorted(got) == list(range(OPEN["queues"]))
    rep = report(OPEN["name"], "run")
    assert got == {i["queue"]: i["after"] for i in rep["irqs"] if i["kind"] == "queue"}
    assert sorted(got.values()) == ["0", "1", "2", "3"], got      # one queue per CPU, no NUMA hint
    assert rep["irqbalance"]["installed"] is False
    h = host(OPEN["name"])
    assert h.service("gpunode-nic-irq-affinity.service").is_enabled
    assert json.loads(h.file(STATE).content_string)["pci_address"] == OPEN["pci"]
    assert h.file(HOOK).mode == 0o755 and OPEN["pci"] in h.file(HOOK).content_string
    assert not h.file(MASK_MARKER).exists


# 8 -------------------------------------------------------------------------

def test_state_absent_leaves_nothing_and_gives_irqbalance_back():
    res, recap = playbook("--extra-vars", "nic_irq_pinning_state=absent", tag="absent")
    assert res.returncode == 0, res.stdout[-3000:]
    for node in (GPU, OPEN):
        h = host(node["name"])
        for path in (UNIT, TIMER, RECHECK, RULE, STATE, LIB, ENTRY, MASK_MARKER, HOOK):
            assert not h.file(path).exists, "%s: %s is still there" % (node["name"], path)
        assert h.run("systemctl cat gpunode-nic-irq-affinity.service").rc != 0
    h = host(GPU["name"])
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "enabled"
    assert h.service("irqbalance").is_running
