# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Boot-time entry point: apply the NIC IRQ pins saved in a JSON desired-state file.

Runs on the target without Ansible (standard library plus the private
module_utils only). The nic_irq_pinning role installs it and calls it from a
systemd unit and a udev rule::

    python3 -m ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_cli \\
        [--check] [--quiet] [--wait SECONDS] [/etc/gpunode/nic-irq-affinity.json]

The JSON file holds one desired state (the ``nic_irq_affinity`` options:
interface/pci_address/mac/cidr, cpus or count, exclude_cpus, numa_local,
whole_cores, allow_irqbalance, strict, rps_cpus) or a list of them. With
``rps_cpus`` every RX queue's RPS mask is set too (on the interface found
from the PCI address at that moment), by the same code as the module. Optional
``procfs_path``/``sysfs_path`` keys point at another tree (tests).

Prints one line per IRQ for the journal and exits 0 on success, 1 on any
error, 2 on bad usage. With ``--quiet`` (the periodic re-check) it prints
nothing for a NIC whose pins are already in place, and everything for one it
had to change or could not handle. When the NIC is not there yet (boot, driver rebind) it
retries for at most ``--wait`` seconds (default 5, capped at 30).

Many drivers (ena, ixgbe, i40e, ice, bnxt_en, e1000e, vmxnet3, and mlx5
since completion EQs are created on first use) allocate their MSI-X vectors
at probe but request the queue IRQs only when the interface is opened: until
then ``msi_irqs`` lists the vectors and ``/proc/irq/N`` does not exist. For
such a NIC the run waits (bounded by ``--wait``) for the IRQs to appear; if
the interface is still closed it says so and exits 0, because the network
stack's if-up hook (installed by the role) runs it again when the interface
comes up.

A restart or stop (SIGTERM: the udev rule and the if-up hook use ``systemctl
restart`` so that an event during a run gets a run of its own after it) never
cuts a pass of pins in half: the pass in progress (every state of the file) is
finished and printed, a wait for the NIC, its IRQs or the lock ends at once,
and the run exits 0 for systemd to start the next one.

Each pass holds the system's pin lock (``/run/gpunode/nic-irq-pin.lock``, the
one the nic_irq_persist module holds across its pins, state file and
read-back), waiting for it at most 25 s, and reads the state file under it: a
re-check that starts while Ansible re-pins applies the state file Ansible
wrote, not the one it replaces. The waits for the NIC happen between passes,
without the lock. A ``--check`` run takes no lock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._host.cli import UsageError, parse_args
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import ALLOWED_COMMANDS, LockError, TreeError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import pin_lock, run_desired_state
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_KEYS, NicError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic_irqs import read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError

DEFAULT_STATE = "/etc/gpunode/nic-irq-affinity.json"


def subprocess_run(argv, timeout=5):
    """``run`` callable for the library: allowed commands only, bounded by ``timeout``."""
    if not argv or argv[0] not in ALLOWED_COMMANDS:
        return 127, "", "command not allowed"
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              universal_newlines=True, check=False, env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def _summary(result, check):
    lines = []
    for item in result["irqs"]:
        lines.append("%s irq %d %s queue %s: %s -> %s (%s)" % (
            result["interface"], item["irq"], item["name"] or "?", "-" if item["queue"] is None else item["queue"],
            item["before"], item["after"], item["status"]))
    for item in result.get("rps") or []:
        lines.append("%s rx-%d rps_cpus: %s -> %s (%s)"
                     % (result["interface"], item["queue"], item["before"], item["after"], item["status"]))
    for warning in result["warnings"]:
        lines.append("%s warning: %s" % (result["interface"], warning))
    lines.append("%s (%s): %s, target CPUs %s%s" % (
        result["interface"], result["pci_address"], "changed" if result["changed"] else "no change", result["cpulist"],
        " (check mode)" if check else ""))
    return lines


def unopened_vectors(state, procfs, sysfs, run):
    """MSI vectors of the NIC in ``state`` that have no IRQ yet (no /proc/irq/N: the
    driver requests them when the interface is opened). [] when the NIC cannot be read."""
    selector = dict((k, state.get(k)) for k in SELECTOR_KEYS)
    try:
        nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    except NicError:
        return []
    return [e["irq"] for e in nic["irqs"] if not os.path.isdir(os.path.join(procfs, "irq", str(e["irq"])))]


class _StopRequest(object):
    """SIGTERM noted, not obeyed at once: the pass of pins in progress finishes first."""

    def __init__(self):
        self.requested = False
        self.previous = None

    def __call__(self, _signum, _frame):
        self.requested = True

    def __enter__(self):
        try:
            self.previous = signal.signal(signal.SIGTERM, self)
        except ValueError:              # not the main thread: nothing to defer
            self.previous = None
        return self

    def __exit__(self, *_exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def main(argv=None, run=None, out=None, sleep=time.sleep, clock=time.monotonic):
    with _StopRequest() as stop:
        return _main(argv, run, out or sys.stdout, sleep, clock, stop)


def _wait_seconds(value):
    """``--wait``'s value: seconds, held between 0 and 30 (ValueError when not a number)."""
    return min(30.0, max(0.0, float(value)))


def _parse(args, out):
    """(check, quiet, wait, path) or None after a usage line."""
    try:
        values, paths = parse_args(args, flags=("--check", "--quiet"), options={"--wait": _wait_seconds})
    except UsageError as exc:
        if exc.value is None:
            out.write("usage: _irq_pin_cli [--check] [--quiet] [--wait SECONDS] [STATE.json]\n")
        else:
            out.write("usage: --wait takes seconds\n")
        return None
    return (values.get("--check", False), values.get("--quiet", False), values.get("--wait", 5.0),
            paths[-1] if paths else DEFAULT_STATE)


def _read_states(path):
    """The desired states in ``path`` (a list), or a message saying why not."""
    try:
        with open(path) as handle:
            states = json.load(handle)
    except (OSError, ValueError) as exc:
        return "cannot read desired state %s: %s" % (path, exc)
    if isinstance(states, dict):
        states = [states]
    if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
        return "desired state %s must be a JSON object or a list of objects" % path
    if len(set(s.get("procfs_path", "/proc") for s in states)) > 1:
        return "desired state %s: every state of one file must have the same procfs_path (one system, one lock)" % path
    return states


def _main(argv, run, out, sleep, clock, stop):
    parsed = _parse(list(sys.argv[1:] if argv is None else argv), out)
    if parsed is None:
        return 2
    check, quiet, wait, path = parsed
    states = _read_states(path)
    if not isinstance(states, list):
        out.write(states + "\n")
        return 1
    procfs = states[0].get("procfs_path", "/proc") if states else "/proc"
    deadline = clock() + wait
    pending, status = list(range(len(states))), 0
    while pending:
        # One pass: every state still to apply, under the pin lock, from the state file as it is now (re-read
        # under the lock: a file that Ansible replaced while this run waited is the one applied).
        try:
            with pin_lock(procfs, take=not check, stop=lambda: stop.requested, sleep=sleep, clock=clock):
                states = _read_states(path)
                if not isinstance(states, list):
                    out.write(states + "\n")
                    return 1
                final = clock() >= deadline or stop.requested
                retry = []
                for index in pending:
                    if index < len(states):
                        done = _attempt(dict(states[index]), check, quiet, final, stop.requested, run, out)
                        if done is None:
                            retry.append(index)
                        else:
                            status = max(status, done)
        except LockError as exc:
            if stop.requested:
                out.write("stop requested (SIGTERM) while waiting for the lock %s\n" % exc.details["path"])
                return status
            out.write("error: %s\n" % exc)
            return 1
        if hasattr(out, "flush"):
            out.flush()
        pending = retry
        if pending:
            sleep(0.5)
    if stop.requested:
        out.write("stop requested (SIGTERM): the pass in progress was finished\n")
    return status


def _attempt(state, check, quiet, final, stopping, run, out):
    """Apply one desired state once: 0 or 1 when done (printed), None to try again (the NIC or its IRQs are
    not there yet and this is not the ``final`` attempt)."""
    procfs = state.pop("procfs_path", "/proc")
    sysfs = state.pop("sysfs_path", "/sys")
    runner = run if run is not None else (subprocess_run if procfs == "/proc" else None)
    try:
        result = run_desired_state(state, check_mode=check, procfs=procfs, sysfs=sysfs, run=runner)
    except TreeError as exc:
        # roots missing, not one system, or a /proc file out of layout: waiting will not fix it
        out.write("error: %s %s\n" % (exc, json.dumps(exc.details, default=str)))
        return 1
    except NicError as exc:
        if stopping:
            out.write("stop requested (SIGTERM) while waiting for the NIC: %s\n" % exc)
            return 0
        if not final:
            return None
        out.write("error: %s %s\n" % (exc, json.dumps(exc.details, default=str)))
        return 1
    except AffinityError as exc:
        unopened = unopened_vectors(state, procfs, sysfs, runner)
        if unopened and not final:
            return None
        if unopened:
            out.write("%s: %d MSI vectors allocated (%s) but no IRQs requested yet: the interface has not been "
                      "opened; its pins are applied when it comes up (if-up hook)\n"
                      % (state.get("pci_address") or state.get("interface") or "NIC", len(unopened),
                         ",".join(str(n) for n in unopened)))
            return 0
        out.write("error: %s %s\n" % (exc, json.dumps(exc.details, default=str)))
        return 1
    if not (quiet and not result["changed"]):
        for line in _summary(result, check):
            out.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
