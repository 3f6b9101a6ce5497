"""irqbalance_mode=banned on a real kernel: the lab proof that issue 6 left open.

irqbalance keeps running. The role bans the pinned CPUs (IRQBALANCE_BANNED_CPULIST)
and the pinned NIC's IRQs (a --policyscript that answers ban=true for its PCI
address). Runs after converge, idempotence and the no-change check; the tests
run in file order and build on each other (one guest boot):

  1  the fresh-guest check-mode plan is exactly what converge did
  2  converged: the config lines (the NIC's CPUs plus the isolcpus and nohz_full
     CPUs the guest boots with), the policy script, the running daemon's own
     command line and environment, restarted once by converge and never again
  3  the daemon itself says what it bans: the CPU mask on its socket, and
     "Override ban" for exactly the NIC's IRQs in its log; the pins stay through
     its balancing passes
  4  contrast: one irqbalance pass with the role's config leaves the pins; the
     same pass without the device ban moves them off the banned CPUs. The
     installed entry point reports that drift in check mode, the re-check
     service restores it
  5  reboot: the pins come back, irqbalance runs and bans the NIC again
  6  a hand-edited config is drift: check mode reports it and touches nothing,
     converge restores it and restarts irqbalance once
  7  switching to disabled puts the package's config back byte for byte and
     masks irqbalance without restarting it first
  8  state=absent: nothing left, irqbalance un-masked, enabled and running
     with the package's config
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import (ENTRY, GPU, LIB, MASK_MARKER, RECHECK, RULE, STATE, TIMER, UNIT,  # noqa: E402
                     assert_fresh_plan_was_applied, assert_gpu_layout, host, pinned_as_planned, planned,
                     playbook, probe, reboot, report, ssh, wait_until)

CONFIG = "/etc/default/irqbalance"
POLICY = "/usr/local/libexec/gpunode-irqbalance-policy"
BANNED_MARKER = "/etc/gpunode/irqbalance-banned.json"
POLICY_ARG = "--policyscript=" + POLICY
# The guest boots with isolcpus=2 nohz_full=3 (molecule.yml): the banned list is
# the NIC's CPUs 4-7 plus those two, because setting the variable switches off
# irqbalance's own isolcpus/nohz_full ban.
ISOLATED, NOHZ_FULL = {2}, {3}
BANNED = GPU["cpus"] | ISOLATED | NOHZ_FULL
ROLE_LINES = ["IRQBALANCE_BANNED_CPULIST=2-7", 'IRQBALANCE_ARGS="%s"' % POLICY_ARG]
NAME = GPU["name"]

# Asks the running daemon over its own socket (what irqbalance-ui uses) for its
# setup: "SLEEP <interval> BANNED <hex mask of banned CPUs> ...".
SETUP = r"""
import glob, socket
path = glob.glob("/run/irqbalance/irqbalance*.sock")[0]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(b"setup")
out = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    out += d
print(out.decode())
"""


def config_lines():
    text = ssh(NAME, "cat %s" % CONFIG).stdout
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def config_is_the_packages():
    """The config file's md5 equals the one dpkg recorded for the package's conffile."""
    out = ssh(NAME, "dpkg-query -W -f='${Conffiles}\\n' irqbalance; md5sum %s" % CONFIG).stdout
    shipped = dict(ln.split()[:2] for ln in out.splitlines() if ln.startswith(" /"))
    now = out.splitlines()[-1].split()[0]
    return shipped[CONFIG] == now


def daemon():
    """The irqbalance main process: pid, command line, environment, and how often systemd started it this boot."""
    out = ssh(NAME, "systemctl show -p MainPID --value irqbalance.service; "
                    "journalctl -b -u irqbalance.service -o cat | grep -c '^Started' || true").stdout.split()
    info = {"pid": int(out[0]), "starts": int(out[1]), "cmdline": [], "environ": []}
    if info["pid"]:
        info["cmdline"] = ssh(NAME, "tr '\\0' '\\n' < /proc/%d/cmdline" % info["pid"]).stdout.split("\n")
        info["environ"] = ssh(NAME, "tr '\\0' '\\n' < /proc/%d/environ" % info["pid"]).stdout.split("\n")
    return info


def device_irqs():
    """Every IRQ of the NIC's PCI function: its MSI-X vectors and its legacy INTx line, which irqbalance
    sees when it scans before the driver switched to MSI-X (at boot)."""
    data = probe(GPU)
    legacy = int(ssh(NAME, "cat /sys/bus/pci/devices/%s/irq" % GPU["pci"]).stdout)
    return set(data["irqs"]), legacy


def banned_by_policy(pid):
    """IRQs the daemon with this pid logged as banned by the policy script."""
    out = ssh(NAME, "journalctl -b -u irqbalance.service _PID=%d -o cat" % pid).stdout
    return {int(ln.split()[1].rstrip(":")) for ln in out.splitlines() if ln.endswith("Override ban to true")}


def daemon_banned_cpus():
    out = ssh(NAME, "python3 -c '%s'" % SETUP.replace("'", "'\"'\"'")).stdout.split()
    mask = int(out[out.index("BANNED") + 1], 16)
    return {cpu for cpu in range(64) if mask >> cpu & 1}


def running_for(seconds):
    """Wait until the irqbalance daemon has been up for this long (two passes take 2 x SLEEP 10)."""
    up = float(ssh(NAME, "ps -o etimes= -p $(systemctl show -p MainPID --value irqbalance.service)").stdout)
    if up < seconds:
        time.sleep(seconds - up)


def assert_banned_config_and_daemon():
    assert config_lines() == ROLE_LINES
    d = daemon()
    assert d["pid"] > 0
    assert POLICY_ARG in d["cmdline"], d["cmdline"]
    assert "IRQBALANCE_BANNED_CPULIST=2-7" in d["environ"]
    return d


# 1 -------------------------------------------------------------------------

def test_fresh_check_mode_plan_is_exactly_what_converge_did():
    fresh = assert_fresh_plan_was_applied(GPU)
    assert fresh["irqbalance"]["installed"] is True and fresh["irqbalance"]["active"] is True
    assert fresh["irqbalance"]["masked"] is False and fresh["irqbalance"]["mode"] == "banned"


# 2 -------------------------------------------------------------------------

def test_converged_config_policy_script_and_daemon():
    h = host(NAME)
    # The guest really has the isolated and nohz_full CPUs the banned list must include.
    assert h.file("/sys/devices/system/cpu/isolated").content_string.strip() == "2"
    assert h.file("/sys/devices/system/cpu/nohz_full").content_string.strip() == "3"
    cfg = h.file(CONFIG)
    assert cfg.user == "root" and cfg.mode == 0o644
    script = h.file(POLICY)
    assert script.user == "root" and script.mode == 0o755
    assert "  %s) echo ban=true ;;" % GPU["pci"] in script.content_string
    marker = json.loads(h.file(BANNED_MARKER).content_string)
    assert marker["previous"] == {"IRQBALANCE_BANNED_CPULIST": None, "IRQBALANCE_BANNED_CPUS": None,
                                  "IRQBALANCE_ARGS": None}
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "enabled"
    assert h.service("irqbalance").is_running
    assert not h.file(MASK_MARKER).exists
    d = assert_banned_config_and_daemon()
    # Started at boot, restarted once by converge; idempotence and check mode restarted nothing.
    assert d["starts"] == 2, d
    assert_gpu_layout(probe(GPU))
    assert h.service("gpunode-nic-irq-affinity.service").is_enabled
    assert json.loads(h.file(STATE).content_string)["allow_irqbalance"] is True


# 3 -------------------------------------------------------------------------

def test_the_daemon_bans_the_pinned_cpus_and_the_nics_irqs_and_leaves_the_pins():
    plan = planned(NAME)
    d = daemon()
    assert daemon_banned_cpus() == BANNED
    msi = device_irqs()[0]
    assert len(msi) == 2 * GPU["queues"] + 1                       # queues plus the config vector
    assert banned_by_policy(d["pid"]) == msi
    running_for(25)
    assert pinned_as_planned(GPU, plan), "irqbalance moved a pinned IRQ: %s" % probe(GPU)["irqs"]
    assert daemon()["pid"] == d["pid"]


# 4 -------------------------------------------------------------------------

def test_without_the_device_ban_irqbalance_moves_the_pins_off_the_banned_cpus():
    plan = planned(NAME)
    # Stop the re-check timer too, or it restores the pins while check mode runs.
    ssh(NAME, "systemctl stop irqbalance.service %s" % Path(TIMER).name)
    one_pass = "set -a; . %s; set +a; timeout 120 irqbalance --oneshot --foreground" % CONFIG
    # One balancing pass with exactly the role's config: the pins stay.
    ssh(NAME, one_pass + " $IRQBALANCE_ARGS", timeout=180)
    assert pinned_as_planned(GPU, plan), "a pass with the policy script moved a pin: %s" % probe(GPU)["irqs"]
    # The same pass with the banned CPUs but without the device ban: every pin is moved off them.
    # (Onto CPUs 0-1, the only ones not banned.)
    ssh(NAME, one_pass, timeout=180)
    moved = {irq: probe(GPU)["irqs"][irq]["affinity"] for irq in plan}
    off = {irq for irq, aff in moved.items()
           if not {int(c) for c in aff.replace("-", ",").split(",")} & GPU["cpus"]}
    assert off == set(plan), "without the device ban, irqbalance left pins on CPUs 4-7: %s" % moved

    # The installed entry point (the module's code) sees the drift in check mode and writes nothing;
    # check mode of the playbook on moved pins is proven in molecule/nic_irq_pinning.
    out = ssh(NAME, "%s --check %s" % (ENTRY, STATE)).stdout
    assert out.count("(would_change)") == len(plan), out
    assert pinned_as_planned(GPU, plan) is False, "check mode wrote the pins back"

    ssh(NAME, "systemctl start %s" % Path(RECHECK).name)
    assert pinned_as_planned(GPU, plan), "the re-check did not restore the pins: %s" % probe(GPU)["irqs"]
    ssh(NAME, "systemctl start irqbalance.service %s" % Path(TIMER).name)


# 5 -------------------------------------------------------------------------

def test_reboot_pins_come_back_and_irqbalance_bans_the_nic_again():
    plan = planned(NAME)
    back = reboot(GPU, probe(GPU)["boot_id"])
    waited = wait_until(lambda: pinned_as_planned(GPU, plan), timeout=120)
    assert waited is not None, "pins not restored after reboot: %s" % probe(GPU)["irqs"]
    d = assert_banned_config_and_daemon()
    assert d["starts"] == 1
    running_for(25)
    msi, legacy = device_irqs()
    banned = banned_by_policy(d["pid"])
    assert msi <= banned <= msi | {legacy}, (banned, msi, legacy)
    assert pinned_as_planned(GPU, plan), "irqbalance moved a pin after the reboot: %s" % probe(GPU)["irqs"]
    print("reboot (banned): SSH back after %.0f s, pins found %.0f s later" % (back, waited))


# 6 -------------------------------------------------------------------------

def test_hand_edited_config_is_drift_check_mode_touches_nothing_converge_restarts_once():
    ssh(NAME, "sed -i -e 's/^IRQBALANCE_BANNED_CPULIST=.*/IRQBALANCE_BANNED_CPULIST=7/' "
              "-e '/^IRQBALANCE_ARGS=/d' %s" % CONFIG)
    edited = ssh(NAME, "md5sum %s" % CONFIG).stdout
    before = daemon()

    res, recap = playbook("--limit", NAME, check=True, tag="config-check")
    assert res.returncode == 0, res.stdout[-3000:]
    assert recap.get(NAME, 0) > 0, "check mode reported no drift for a hand-edited config"
    assert "IRQBALANCE_BANNED_CPULIST=7" in res.stdout and "IRQBALANCE_BANNED_CPULIST=2-7" in res.stdout  # --diff
    assert ssh(NAME, "md5sum %s" % CONFIG).stdout == edited
    assert daemon()["pid"] == before["pid"]

    res, recap = playbook("--limit", NAME, tag="config-fix")
    assert res.returncode == 0, res.stdout[-3000:]
    after = assert_banned_config_and_daemon()
    assert after["pid"] != before["pid"] and after["starts"] == before["starts"] + 1, (before, after)
    assert report(NAME, "config-fix")["verified"] is True


# 7 -------------------------------------------------------------------------

def test_switch_to_disabled_restores_the_package_config_and_masks_without_a_restart():
    plan = planned(NAME)
    before = daemon()
    res = playbook("--limit", NAME, "--extra-vars", "nic_irq_pinning_irqbalance_mode=disabled", tag="to-disabled")[0]
    assert res.returncode == 0, res.stdout[-3000:]
    assert config_is_the_packages()
    h = host(NAME)
    assert not h.file(POLICY).exists and not h.file(BANNED_MARKER).exists
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "masked"
    assert not h.service("irqbalance").is_running
    assert json.loads(h.file(MASK_MARKER).content_string)["previous"] == {"enabled": True, "active": True}
    assert daemon()["starts"] == before["starts"], "irqbalance was restarted on its way to being masked"
    assert pinned_as_planned(GPU, plan)


# 8 -------------------------------------------------------------------------

def test_absent_leaves_nothing_and_irqbalance_as_packaged():
    h = host(NAME)
    res = playbook("--limit", NAME, "--extra-vars", "nic_irq_pinning_state=absent", tag="absent")[0]
    assert res.returncode == 0, res.stdout[-3000:]
    assert config_is_the_packages()
    for path in (POLICY, BANNED_MARKER, MASK_MARKER, UNIT, TIMER, RECHECK, RULE, STATE, LIB):
        assert not h.file(path).exists, "%s is still there" % path
    assert h.run("systemctl is-enabled irqbalance.service").stdout.strip() == "enabled"
    assert h.service("irqbalance").is_running
    d = daemon()
    assert POLICY_ARG not in d["cmdline"] and not [e for e in d["environ"] if e.startswith("IRQBALANCE_BANNED")], d
