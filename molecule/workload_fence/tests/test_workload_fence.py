"""The workload fences on a real kernel: isolcpus= through the guest's own GRUB, and systemd cpusets.

One gpu-node guest booted through GRUB (its /boot/grub/grub.cfg, written by its
own update-grub, decides the command line). Runs after converge, idempotence
and the no-change check; the tests run in file order and build on each other:

  1  converged, before any reboot: the running cgroups already confine
     system.slice, user.slice and init.scope to the housekeeping CPUs (the NIC's
     IRQ CPUs plus CPU 0), sshd runs there, a unit in the workload slice runs
     only on the other CPUs; the next boot's grub.cfg has isolcpus=, the running
     kernel not yet, and the role says a reboot is required
  2  a real reboot through GRUB: /proc/cmdline is the old one plus exactly the
     new parameter, the kernel's own isolated list is the IRQ CPUs, the cgroups
     are as before, the IRQs are pinned again; converge changes nothing, check
     mode reports nothing, and no reboot is required any more
  2b the cpu_power role's kernel-limit fix (cpu_power.yml): an admin's
     processor.max_cstate=1 in the image's GRUB drop-in leaves the next boot's
     line, isolcpus= stays; no change again, none in check mode; absent puts
     the file back byte for byte (then the test undoes its own edit)
  3  state=absent and a second reboot: the drop-ins and the workload slice are
     gone, the cgroups span every CPU again, and /proc/cmdline is the one the
     guest first booted with, token for token
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import EPHEMERAL, GPU, cpus, playbook, probe, queue_cpus, reboot, report, ssh  # noqa: E402

NAME = GPU["name"]
ALL = set(range(8))
DROPIN = "/etc/default/grub.d/zz-gpunode-tuning.cfg"
SLICE = "gpunode-workload.slice"
UNITS = ("system.slice", "user.slice", "init.scope")
STATE = {}          # facts the later tests need from the earlier ones


def fences(tag):
    return json.loads((EPHEMERAL / ("fences-%s-%s.json" % (NAME, tag))).read_text())


def live():
    """The guest's own view: cgroup cpusets, sshd's and a workload-slice unit's allowed CPUs, isolcpus, cmdline."""
    script = r"""
import json, subprocess
def rd(p):
    try:
        return open(p).read().strip()
    except OSError:
        return None
def allowed(pid):
    for line in open("/proc/%s/status" % pid):
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
sshd = subprocess.run(["systemctl", "show", "-P", "MainPID", "ssh.service"], capture_output=True, text=True).stdout.strip()
unit = subprocess.run(["systemd-run", "--slice=SLICE", "--wait", "--pipe", "--quiet", "grep", "Cpus_allowed_list",
                       "/proc/self/status"], capture_output=True, text=True)
print(json.dumps({
    "cgroups": {u: {"cpus": rd("/sys/fs/cgroup/" + u + "/cpuset.cpus"),
                    "effective": rd("/sys/fs/cgroup/" + u + "/cpuset.cpus.effective")} for u in UNITS},
    "sshd": allowed(sshd), "workload_unit": unit.stdout.split()[-1] if unit.returncode == 0 else unit.stderr,
    "isolated": rd("/sys/devices/system/cpu/isolated"), "cmdline": rd("/proc/cmdline"),
    "boot_id": rd("/proc/sys/kernel/random/boot_id")}))
""".replace("SLICE", SLICE).replace("UNITS", repr(UNITS))
    return json.loads(ssh(NAME, "python3 -c '%s'" % script.replace("'", "'\"'\"'")).stdout)


def assert_confined(state, housekeeping):
    for unit in UNITS:
        assert cpus(state["cgroups"][unit]["effective"]) == housekeeping, (unit, state["cgroups"])
    assert cpus(state["sshd"]) == housekeeping, state
    assert cpus(state["workload_unit"]) == ALL - housekeeping, state


def test_converged_cgroups_are_live_and_the_next_boot_has_isolcpus():
    irq = cpus(report(NAME, "run")["cpus"])
    assert len(irq) == 2 and irq <= GPU["cpus"], irq
    housekeeping = irq | {0}
    run = fences("run")
    assert cpus(run["housekeeping_cpus"]) == housekeeping and cpus(run["workload_cpus"]) == ALL - housekeeping, run
    state = live()
    assert_confined(state, housekeeping)
    param = "isolcpus=domain," + report(NAME, "run")["cpus"]
    assert run["isolcpus"]["reboot_required"] is True and run["isolcpus_reboot_required"] is True, run["isolcpus"]
    assert param in run["isolcpus"]["next_boot_cmdline"], run["isolcpus"]
    assert param not in state["cmdline"].split() and not state["isolated"], state
    grub_cfg = ssh(NAME, "grep -c -- ' %s' /boot/grub/grub.cfg; grep -c isolcpus /etc/default/grub || true" % param).stdout
    assert int(grub_cfg.split()[0]) >= 1 and grub_cfg.split()[1] == "0", grub_cfg
    STATE.update(irq=irq, housekeeping=housekeeping, param=param, first_cmdline=state["cmdline"],
                 boot_id=state["boot_id"])


def test_reboot_through_grub_isolates_the_irq_cpus_and_keeps_the_cpusets():
    seconds = reboot(GPU, live()["boot_id"])
    print("\nreboot through GRUB: SSH back after %.0f s" % seconds)
    state = live()
    assert state["cmdline"].split() == STATE["first_cmdline"].split() + [STATE["param"]], state["cmdline"]
    assert cpus(state["isolated"]) == STATE["irq"], state
    assert_confined(state, STATE["housekeeping"])
    pins = {next(iter(v)) for v in queue_cpus(probe(GPU)).values()}
    assert cpus(",".join(pins)) == STATE["irq"], pins
    res, recap = playbook(tag="after-reboot")
    assert res.returncode == 0 and recap == {NAME: 0}, res.stdout[-3000:]
    assert fences("after-reboot")["isolcpus_reboot_required"] is False
    res, recap = playbook(check=True, tag="after-reboot-check")
    assert res.returncode == 0 and recap == {NAME: 0}, res.stdout[-3000:]
    STATE["boot_id"] = state["boot_id"]


CPU_POWER = Path(__file__).resolve().parents[1] / "cpu_power.yml"
# The lab image's GRUB drop-in sets GRUB_CMDLINE_LINUX (and empties _DEFAULT): the line an admin's limit goes on.
GRUB = "/etc/default/grub.d/gpunode-lab.cfg"
LIMIT = "processor.max_cstate=1"


def power(tag):
    return json.loads((EPHEMERAL / ("cpu-power-%s-%s.json" % (NAME, tag))).read_text())


def next_boot_line():
    """The default entry's linux line of the guest's grub.cfg (the first one: GRUB's default here)."""
    return ssh(NAME, "grep -m1 -E '^\\s*linux\\s' /boot/grub/grub.cfg").stdout.split()


def test_cpu_power_takes_a_c_state_limit_off_grub_next_to_isolcpus_and_absent_puts_it_back():
    """An admin's processor.max_cstate=1 in the image's GRUB drop-in (update-grub run by hand): the cpu_power role's
    kernel-limit fix takes that token out of the line (nothing else), the next boot's grub.cfg line loses it and
    keeps the isolcpus role's parameter, reboot_required; a second run and check mode change nothing; absent gives
    that file back byte for byte. Then the hand edit is undone, so the next test finds the first line."""
    ssh(NAME, "cp -p %s /root/grub.before-limit && sed -i 's/^GRUB_CMDLINE_LINUX=\"/&%s /' %s && "
              "grep -c -- '%s' %s && update-grub 2>/dev/null" % (GRUB, LIMIT, GRUB, LIMIT, GRUB))
    limited = ssh(NAME, "sha256sum %s" % GRUB).stdout.split()[0]
    assert LIMIT in next_boot_line()
    res, recap = playbook(tag="cpu-power", path=CPU_POWER)
    assert res.returncode == 0 and recap == {NAME: 1}, res.stdout[-3000:]
    line = next_boot_line()
    assert LIMIT not in line and STATE["param"] in line, line
    done = power("cpu-power")
    # The running kernel never booted with the limit (only grub.cfg had it): the next boot equals it, no reboot.
    assert done["reboot_required"] is False, done
    kernel = done["settings"]["kernel_cmdline"]
    assert "!processor.max_cstate" in kernel["managed"] and STATE["param"] in kernel["managed"], kernel
    edited = ssh(NAME, "diff /root/grub.before-limit %s || true" % GRUB).stdout
    assert edited.strip() == "", edited                 # the limit was the only change, and it is gone again
    for check in (False, True):
        res, recap = playbook(check=check, tag="cpu-power-again", path=CPU_POWER)
        assert res.returncode == 0 and recap == {NAME: 0}, res.stdout[-3000:]
    res, recap = playbook("--extra-vars", "cpu_power_state=absent", tag="cpu-power-absent", path=CPU_POWER)
    assert res.returncode == 0 and recap == {NAME: 1}, res.stdout[-3000:]
    assert ssh(NAME, "sha256sum %s" % GRUB).stdout.split()[0] == limited
    assert LIMIT in next_boot_line() and STATE["param"] in next_boot_line()
    ssh(NAME, "cp -p /root/grub.before-limit %s && update-grub 2>/dev/null" % GRUB)
    assert LIMIT not in next_boot_line()


def test_absent_and_a_reboot_bring_back_the_first_command_line():
    res, recap = playbook("--extra-vars", "isolcpus_state=absent cpusets_state=absent", tag="absent")
    assert res.returncode == 0 and recap[NAME] > 0, res.stdout[-3000:]
    gone = ssh(NAME, "ls -d %s /etc/systemd/system/%s /etc/systemd/system/*.slice.d/50-gpunode-cpuset.conf "
                     "/etc/systemd/system/init.scope.d/50-gpunode-cpuset.conf 2>/dev/null | wc -l" % (DROPIN, SLICE))
    assert gone.stdout.strip() == "0", gone.stdout
    assert fences("absent")["isolcpus_reboot_required"] is True
    state = live()
    for unit in UNITS:                  # systemd turns the cpuset controller off where no unit needs it: no file then
        effective = state["cgroups"][unit]["effective"]
        assert effective is None or cpus(effective) == ALL, state["cgroups"]
    assert cpus(state["sshd"]) == ALL and cpus(state["workload_unit"]) == ALL, state
    reboot(GPU, state["boot_id"])      # this boot's id, not one an earlier failed test left behind
    # Check mode first: live() starts a unit in the workload slice's name, a transient slice that the module in
    # state=absent rightly calls a leftover to stop.
    res, recap = playbook("--extra-vars", "isolcpus_state=absent cpusets_state=absent", check=True, tag="absent-check")
    assert res.returncode == 0 and recap == {NAME: 0}, res.stdout[-3000:]
    state = live()
    assert state["cmdline"].split() == STATE["first_cmdline"].split(), state["cmdline"]
    assert not state["isolated"], state
