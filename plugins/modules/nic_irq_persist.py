#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_irq_persist
short_description: Pin a NIC's queue IRQs, keep them pinned across boots, rebinds and late interface opens, and verify
version_added: 0.2.0
description:
  - One module run that does what the M(gpunode.tuning.nic_irq_affinity) module does (find the NIC from the PCI
    function on every run, plan, pin) and installs and verifies the persistence, so a converged node costs one
    module run instead of one per file and probe.
  - "Persistence (O(persist)): the collection's own module_utils (the import closure of the boot-time entry point,
    taken from this module's own payload, with a manifest of what was installed) under O(lib_dir); a small entry
    point O(entry_point); the desired state O(state_file), which names the NIC by its PCI address (never an IRQ number
    or an interface name); a systemd oneshot unit run at boot; a udev rule on the PCI path that re-runs it when the
    function is added again; an if-up hook for each network stack present (ifupdown C(/etc/network/if-up.d),
    NetworkManager C(dispatcher.d), networkd-dispatcher C(routable.d)) that re-runs it when the interface comes up;
    and a quiet re-check timer for queue-count changes, which send no event."
  - Many drivers (ena, ixgbe, i40e, ice, bnxt_en, e1000e, vmxnet3, and mlx5 since completion EQs are created on first
    use) request their queue IRQs only when the interface is opened. The boot unit waits for them (bounded), and the
    if-up hook pins them when the interface comes up later. Only the ifupdown hook is proven in this project's lab.
  - Every file is compared by content, mode and root ownership; only files that differ are written, atomically (a
    temporary file in the same directory, fsync, rename), and a failed write puts back every file written before it.
    Pruning and O(state=absent) remove only files the collection installed (the library by its manifest), never other
    content of a shared O(lib_dir).
  - "A run that fails after the pins puts back what it did: when a file write, a C(systemctl) or C(udevadm) step
    (daemon-reload, enable of the boot unit, enable --now of the timer, disable --now of a timer no longer wanted) or
    the read-back (O(verify)) fails, the units it enabled or started are stopped and disabled, every file goes back
    to its bytes, mode and owner (or its absence), systemd and udev re-read the files put back, a timer it disabled
    is enabled and started again, and every IRQ it moved goes back to its previous affinity. The failure names what
    was put back (C(files_rolled_back), C(systemd_rolled_back), C(pins_rolled_back)) and what could not be
    (C(rollback_failed), C(systemd_rollback_failed), C(pins_rollback_failed)); it reports C(changed) only when
    something could not be put back (or irqbalance's pass changed something, see O(irqbalance))."
  - After pinning, every queue IRQ's C(smp_affinity_list) is read back and compared with the plan (O(verify)).
    Kernel-managed IRQs (V(unchangeable)) are left out of the comparison and named in RV(unchangeable).
  - "RPS (O(rps_cpus), the seed article's step 5 note): every RX queue's C(rps_cpus) is set after the pins, with the
    code of M(gpunode.tuning.nic_irq_affinity); the value is stored in O(state_file), so the boot unit, the udev rule,
    the if-up hook and the re-check set it again (on the interface found from the PCI address then). It is read back
    with the pins (O(verify)) and put back with them when a later step fails. When a run leaves O(rps_cpus) out
    while the stored state had it, and with O(state=absent), every RX queue that still carries the stored mask is
    set back to 0 (RPS off, the kernel's default), a queue with another mask is left as it is with a warning; the
    masks before the collection's first run are not recorded."
  - On a captured or generated tree (O(procfs_path)/O(sysfs_path) not the live ones), the files go under that tree's
    root and no command (systemctl, udevadm) runs; the systemd actions are reported as they would be.
author:
  - gpunode.tuning contributors (@gpunode)
attributes:
  check_mode:
    support: full
    details: Returns the per-IRQ plan, every file that would be created, updated or removed (with the reason) and the
      systemd actions it would take, and writes nothing.
  diff_mode:
    support: full
    details: The IRQ table, the RX queues' C(rps_cpus) (with O(rps_cpus)), and before/after of every file that differs
      (library sources by name only).
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.nic_selector
options:
  state:
    description:
      - V(present) pins and installs; V(absent) stops and disables the units, sets the RPS masks the stored state set
        back to 0, removes every file the collection installed, and leaves the IRQs where they are.
    type: str
    choices: [present, absent]
    default: present
  cpus:
    description: Explicit target CPUs, as in M(gpunode.tuning.nic_irq_affinity). Mutually exclusive with O(count).
    type: raw
  count:
    description: Policy - how many CPUs, as in M(gpunode.tuning.nic_irq_affinity).
    type: int
  exclude_cpus:
    description: Policy - CPUs never to use, as in M(gpunode.tuning.nic_irq_affinity).
    type: raw
  numa_local:
    description: Policy - prefer CPUs of the NIC's NUMA node.
    type: bool
    default: true
  whole_cores:
    description: Policy - whole SMT sibling groups only.
    type: bool
    default: true
  allow_irqbalance:
    description: Pin although irqbalance is active (it is then expected to ban these CPUs and IRQs).
    type: bool
    default: false
  strict:
    description: Fail instead of warning when the plan cannot be met exactly or a write is refused.
    type: bool
    default: false
  rps_cpus:
    description:
      - Policy - RPS, as M(gpunode.tuning.nic_irq_affinity)'s O(gpunode.tuning.nic_irq_affinity#module:rps_cpus)
        (a CPU list string or a list of integers, housekeeping CPUs; it costs an inter-CPU hop per packet, so only
        for IRQ CPUs saturated by packet rate). Stored in O(state_file) and applied at every boot and re-check.
        Empty or omitted leaves RPS alone, and sets back to 0 the queues a previously stored mask still holds.
    type: raw
  assume_irqbalance_stopped:
    description:
      - Plan although irqbalance is active, as if it were already stopped. For check mode of a play that stops
        irqbalance itself before this task (the nic_irq_pinning role uses O(irqbalance) instead, which implies it).
        Only the run uses it; the stored desired state keeps O(allow_irqbalance), so check mode on a converged node
        compares the same file.
    type: bool
    default: false
  irqbalance:
    description:
      - Also put irqbalance in a mode in the same run, as M(gpunode.tuning.irqbalance_state) does (the same code), with
        the planned CPUs and this NIC's PCI function as the ban in V(banned) mode. Omitted, irqbalance is left alone.
      - "Order: the pins and the persistence files are planned and every input is checked, then irqbalance's pass is
        planned (its input checked), then irqbalance is stopped or restarted with the ban, and only then are the IRQs
        pinned, so no balancing pass of the old daemon comes in between. A failure after irqbalance's pass leaves that
        pass done (it is reported in RV(irqbalance_state) with the failure, and the run reports C(changed)); the pins,
        files and units of this module are put back. irqbalance's pass is not undone: its code (the same as
        M(gpunode.tuning.irqbalance_state)'s) rolls back only a failed write of its own files and keeps no record to
        take back a finished pass (unmask, enable, start); it is a complete state of its own, which a rerun (or
        M(gpunode.tuning.irqbalance_state) with the mode wanted) converges."
      - With O(state=present) the mode is V(disabled) or V(banned) (O(allow_irqbalance) then follows it); with
        O(state=absent) it is V(absent), which gives irqbalance back after the persistence is removed.
    type: dict
    suboptions:
      mode:
        description: As M(gpunode.tuning.irqbalance_state)'s O(gpunode.tuning.irqbalance_state#module:mode).
        type: str
        choices: [disabled, banned, absent]
        default: disabled
      ban_isolated:
        description: V(banned) - also ban the isolcpus and nohz_full CPUs.
        type: bool
        default: true
      config_file:
        description: irqbalance's environment file; empty picks it by OS family.
        type: path
        default: ""
      os_family:
        description: C(ansible_facts.os_family); worked out on the node when needed and not given.
        type: str
      state_dir:
        description: Where the markers of what was changed are kept.
        type: path
        default: /etc/gpunode
      policy_script:
        description: V(banned) - the policy script that bans this NIC's IRQs.
        type: path
        default: /usr/local/libexec/gpunode-irqbalance-policy
      binary:
        description: The irqbalance binary; absent means irqbalance is not installed (a fine state).
        type: path
        default: /usr/sbin/irqbalance
  persist:
    description: Install (and compare) the persistence. V(false) pins for the running kernel only.
    type: bool
    default: true
  verify:
    description: Read every queue IRQ back after pinning and fail when one is not where the plan put it.
    type: bool
    default: true
  recheck_interval:
    description:
      - systemd time span between re-checks by the timer (C(30s), C(5min), C(1h)). Empty removes the timer.
    type: str
    default: 5min
  state_file:
    description: The desired state on the node (JSON).
    type: path
    default: /etc/gpunode/nic-irq-affinity.json
  lib_dir:
    description: Where the library is installed. May be shared; only the collection's files are ever removed.
    type: path
    default: /usr/local/lib/gpunode-tuning
  entry_point:
    description: The boot-time entry point.
    type: path
    default: /usr/local/sbin/gpunode-nic-irq-pin
  python:
    description: Python (3.9 or later) on the node that runs the entry point.
    type: path
    default: /usr/bin/python3
  timeout:
    description: TimeoutStartSec of the units, in seconds (1-3600).
    type: int
    default: 30
notes:
  - The desired state keeps the selector's result, the PCI address, so the boot-time run finds the NIC again after
    renames and IRQ renumbering.
seealso:
  - module: gpunode.tuning.nic_irq_affinity
  - module: gpunode.tuning.nic_irq_facts
  - module: gpunode.tuning.softnet_check
"""

EXAMPLES = r"""
- name: Pin the storage NIC's queue IRQs to 4 NUMA-local CPUs and keep them there
  gpunode.tuning.nic_irq_persist:
    pci_address: "0000:42:01.0"
    count: 4
    recheck_interval: 5min

- name: Drift report only
  gpunode.tuning.nic_irq_persist:
    interface: enp66s1
    count: 4
  check_mode: true
  diff: true

- name: Remove the persistence (the IRQs stay where they are)
  gpunode.tuning.nic_irq_persist:
    state: absent
"""

RETURN = r"""
interface:
  description: The selected interface.
  returned: state=present
  type: str
pci_address:
  description: Its PCI function, as stored in the desired state.
  returned: state=present
  type: str
cpulist:
  description: The target CPUs.
  returned: state=present
  type: str
  sample: "4-7"
irqs:
  description: Every IRQ of the NIC with its plan and outcome, as M(gpunode.tuning.nic_irq_affinity) returns them.
  returned: state=present
  type: list
  elements: dict
rps:
  description:
    - Every RX queue whose RPS mask is managed (O(rps_cpus), or released by O(state=absent) or a run without it), as
      M(gpunode.tuning.nic_irq_affinity) returns them (C(queue), C(before), C(after) as the kernel prints the mask,
      C(before_cpus), C(after_cpus), C(status)). Empty when RPS is not managed.
  returned: always
  type: list
  elements: dict
drift:
  description:
    - The queue IRQs that differed from the plan, as C(IRQ NAME, BEFORE -> AFTER), then the RX queues whose RPS mask
      differed, as C(rx-N rps_cpus, BEFORE -> AFTER) (CPU lists, C(none) for RPS off).
  returned: state=present
  type: list
  elements: str
files:
  description: Every file compared, with C(action) (V(create), V(update), V(remove), V(unchanged)) and C(reason).
  returned: always
  type: list
  elements: dict
systemd:
  description: The systemd and udev actions taken (or, in check mode or on a captured tree, that would be taken).
  returned: always
  type: list
  elements: str
verified:
  description: Whether the read-back matched the plan (null when not verified).
  returned: state=present
  type: bool
unchangeable:
  description: Kernel-managed queue IRQs the kernel does not let anyone pin, left out of the verification.
  returned: state=present
  type: list
  elements: str
effective_lagging:
  description: Queue IRQs whose effective affinity has not followed yet (it moves at the next interrupt).
  returned: state=present
  type: list
  elements: str
irqbalance:
  description: irqbalance as seen before planning.
  returned: state=present
  type: dict
irqbalance_state:
  description:
    - O(irqbalance) given - the result of irqbalance's pass, as M(gpunode.tuning.irqbalance_state) returns it
      (C(status), C(config_file), C(files), C(systemd), C(restarted), and C(plan) in V(banned) mode).
  returned: when O(irqbalance) is given
  type: dict
"""

import json
import os


from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import new_module
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import LockError, TreeError, exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import runner_for_roots
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import (
    DESIRED_KEYS, PIN_ARGUMENT_SPEC, pin_lock, release_rps, restore_pins, restore_rps_masks, run_desired_state, stored_desired_state,
    verify_pins)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import root_of
# Imported so that AnsiballZ ships the entry point's whole import closure, which is installed from this payload.
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_cli import main as _entry_point_main  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance_state import SETTINGS_SPEC, StateError, finish, os_family, prepare
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_ARGUMENT_SPEC, SELECTOR_MUTUALLY_EXCLUSIVE, NicError
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_plan import AffinityError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import (
    UNIT_DIR, PersistError, apply_files, plan_files, rollback_files, rooted, systemctl_show)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import PKG_DIR, installed_library
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.persist import HEADER, RECHECK_UNIT, TIMER, UDEV_RULE, UNIT, owned_paths, render
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.rps import rps_drift
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file

ARGUMENT_SPEC = dict(
    SELECTOR_ARGUMENT_SPEC,
    state=dict(type="str", choices=["present", "absent"], default="present"),
    persist=dict(type="bool", default=True),
    verify=dict(type="bool", default=True),
    recheck_interval=dict(type="str", default="5min"),
    state_file=dict(type="path", default="/etc/gpunode/nic-irq-affinity.json"),
    lib_dir=dict(type="path", default="/usr/local/lib/gpunode-tuning"),
    entry_point=dict(type="path", default="/usr/local/sbin/gpunode-nic-irq-pin"),
    python=dict(type="path", default="/usr/bin/python3"),
    timeout=dict(type="int", default=30),
    assume_irqbalance_stopped=dict(type="bool", default=False),
    irqbalance=dict(type="dict", options=SETTINGS_SPEC),
    **PIN_ARGUMENT_SPEC
)
SETTINGS = ("state_file", "lib_dir", "entry_point", "python", "timeout", "recheck_interval")


def _validate(module, params):
    """What the one validator (_validate, called first) cannot know: ranges, combinations, system directories.
    The characters of recheck_interval (a systemd time span) and of the paths are its rules."""
    if not 1 <= params["timeout"] <= 3600:
        module.fail_json(msg="timeout %r: expected seconds from 1 to 3600" % params["timeout"], option="timeout",
                         value=params["timeout"])
    for key in ("state_file", "lib_dir", "entry_point", "python"):
        if params[key] in ("", "/"):
            module.fail_json(msg="%s %r: expected an absolute path (of a file or directory of its own)"
                             % (key, params[key]), option=key, value=params[key])
    irqbalance = params["irqbalance"]
    if irqbalance is not None:
        allowed = ("absent",) if params["state"] == "absent" else ("disabled", "banned")
        if irqbalance["mode"] not in allowed:
            module.fail_json(msg="irqbalance.mode %r with state=%s: expected %s" % (irqbalance["mode"], params["state"],
                             " or ".join(allowed)), option="irqbalance.mode", value=irqbalance["mode"])
    lib = params["lib_dir"].rstrip("/")
    if lib in ("/usr", "/usr/local", "/usr/lib", "/usr/local/lib", "/etc", "/opt", "/var", "/var/lib"):
        module.fail_json(msg="lib_dir %r: expected a directory of its own (for example /usr/local/lib/gpunode-tuning), "
                         "not a system directory" % params["lib_dir"], option="lib_dir", value=params["lib_dir"])


def _stored_rps(settings, root):
    """``(pci_address, rps_cpus)`` of the desired state stored by an earlier run, or None when it set no RPS mask
    (no file, not this module's JSON, no ``rps_cpus``)."""
    try:
        with open(rooted(root, settings["state_file"]), "rb") as handle:
            data = handle.read()
        stored = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("rps_cpus"), str) or not stored["rps_cpus"]:
        return None
    return stored.get("pci_address"), stored["rps_cpus"]


def _is_state_file(data):
    """Whether ``data`` is a desired-state file this module wrote (a JSON object with the NIC's pci_address)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(parsed, dict) and "pci_address" in parsed


def _own_files(files, settings, root):
    """Refuse to overwrite what is not this module's: a file without its header (the state file: not its JSON), a
    symlink or a non-regular file at the entry point, the state file, a unit, the udev rule or a hook. The library
    under lib_dir is known by its manifest."""
    lib = settings["lib_dir"].rstrip("/") + "/"
    names = {settings["entry_point"]: "entry_point", settings["state_file"]: "state_file"}
    for path in sorted(files):
        if path.startswith(lib):
            continue
        marker = _is_state_file if path == settings["state_file"] else HEADER
        try:
            check_own_file(names.get(path, "persist"), rooted(root, path), marker)
        except InputError as exc:
            raise PersistError(str(exc), path=path, **exc.details)


class Systemd(object):
    """systemctl/udevadm through the module's runner; on a captured tree (runner None) only records."""

    def __init__(self, module, live, check):
        self.module, self.live, self.check, self.actions, self.undo = module, live, check, [], []

    def states(self, *units):
        """UnitFileState and ActiveState of each unit, in one systemctl call (each call costs time on a slow node)."""
        if not self.live:
            return {}
        rc, out, _err = self.module.run_command(["systemctl", "show", "--property=Id", "--property=UnitFileState",
                                                 "--property=ActiveState"] + list(units), environ_update={"LC_ALL": "C"})
        found = {}
        if rc == 0:
            for unit, props in zip(units, systemctl_show(out)):
                found[props.get("Id") or unit] = props
        return found

    def do(self, argv, label, undo=()):
        """Run ``argv``; ``undo``: the steps (argv lists) that take it back, remembered before it runs (a step that
        fails may have done half of its work: ``enable --now`` enabled and did not start)."""
        if self.check or not self.live:
            self.actions.append(label + ("" if self.live else " (captured tree: not run)"))
            return
        self.undo.extend(undo)
        rc, out, err = self.module.run_command(argv, environ_update={"LC_ALL": "C"})
        if rc != 0:
            raise PersistError("%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip()), command=argv)
        self.actions.append(label)

    def quiet(self, argv):
        """Run one step of a rollback; whether it worked (a rollback runs every step it can, never raises)."""
        rc, _out, _err = self.module.run_command(argv, environ_update={"LC_ALL": "C"})
        return rc == 0

    def roll_back(self, restore_files, reload_units, reload_udev):
        """Take back what this run did through systemd, around ``restore_files`` (a callable): first stop and disable
        what it enabled or started (with the unit files it wrote), then the files, then daemon-reload and the udev
        reload (systemd and udev re-read what was put back), then enable and start again what it disabled or stopped.
        Returns (``restored``, ``failed``) step labels."""
        if self.check or not self.live:
            restore_files()
            return [], []
        late = [argv for argv in self.undo if argv[1] in ("enable", "start")]
        steps = [argv for argv in reversed(self.undo) if argv not in late] + [restore_files]
        if reload_units:
            steps.append(["systemctl", "daemon-reload"])
        if reload_udev:
            steps.append(["udevadm", "control", "--reload"])
        steps += late
        restored, failed = [], []
        for step in steps:
            if callable(step):
                step()
                continue
            (restored if self.quiet(step) else failed).append(" ".join(step[1:] if step[0] == "systemctl" else step))
        self.undo = []
        return restored, failed


def _irqbalance_prepare(module, params, root, sysfs, run, banned_cpus="", banned_devices=()):
    """Plan irqbalance's pass (params ``irqbalance``): every input checked, nothing changed yet."""
    settings = dict(params["irqbalance"], banned_cpus=banned_cpus, banned_devices=list(banned_devices))
    return prepare(settings, root, run, module.check_mode, sysfs=sysfs,
                   detect=(lambda: os_family(module)) if run is not None else None)


def _present(module, params, procfs, sysfs, run):
    desired = dict((key, params[key]) for key in DESIRED_KEYS)
    settings = dict((key, params[key]) for key in SETTINGS)
    root = root_of(procfs)
    irqbalance = params["irqbalance"]
    if irqbalance is not None:
        # Stored as the boot-time run needs it: a banned irqbalance keeps running, a disabled one is gone.
        desired["allow_irqbalance"] = irqbalance["mode"] == "banned"
    # Planned as if irqbalance were already stopped when this run (or the play, before this task) stops it.
    stopped_first = params["assume_irqbalance_stopped"] or irqbalance is not None
    run_desired = dict(desired, allow_irqbalance=True) if stopped_first else desired
    # rps_cpus left out while the stored state set a mask: the queues that still carry it go back to 0.
    rps_release = _stored_rps(settings, root) if params["persist"] and not desired["rps_cpus"] else None
    # Validate and plan everything (IRQs, RPS and files) before the first write.
    plan = run_desired_state(run_desired, check_mode=True, procfs=procfs, sysfs=sysfs, run=run, rps_release=rps_release)
    if not plan["pci_address"]:
        raise AffinityError("%s has no PCI function: expected a PCI network function, whose address finds it again "
                            "at boot" % plan["interface"], value=plan["interface"], expected="a PCI network function")
    files, actions = {}, []
    if params["persist"]:
        stored = stored_desired_state(desired, plan["pci_address"])
        files = render(stored, settings, root)
        _own_files(files, settings, root)
        remove = [p for p in installed_library(settings["lib_dir"], root) if p not in files]
        if not settings["recheck_interval"]:
            remove += ["%s/%s" % (UNIT_DIR, RECHECK_UNIT), "%s/%s" % (UNIT_DIR, TIMER)]
        actions = plan_files(files, remove, root, diff_skip=("%s/%s/" % (settings["lib_dir"].rstrip("/"), PKG_DIR),))
    # Everything is planned and checked: from here to the read-back, one pass of pins at a time on the system. The
    # boot/udev/if-up/re-check entry point waits for this lock, then applies the state file this run wrote.
    with pin_lock(procfs, take=not module.check_mode):
        irqbalance_result, irqbalance_diff = None, []
        if irqbalance is not None:
            prepared = _irqbalance_prepare(module, params, root, sysfs, run, plan["cpulist"], [plan["pci_address"]])
            irqbalance_result, irqbalance_diff = finish(prepared)
        try:
            out, warnings, diff = _pin_and_persist(module, params, procfs, sysfs, run, plan, run_desired, desired,
                                                   files, actions, settings, root, irqbalance_result, rps_release)
        except (AffinityError, NicError, TreeError, PersistError) as exc:
            if irqbalance_result is not None:   # irqbalance's pass is done: say so in the failure
                exc.details.update(irqbalance_state=irqbalance_result,
                                   changed=bool(irqbalance_result["changed"] or exc.details.get("changed")))
            raise
    return out, warnings, irqbalance_diff + diff


def _read_back(result, pin_desired, procfs, sysfs, run, rps_release, warnings):
    """verify_pins after the pins. IRQs moved between the write and the read-back are pinned once more and read back
    again: a one-off mover (a process that read the old state a moment before) is then said in ``warnings``; a mover
    that keeps moving them (irqbalance started again, a second tool) moves them again, and the mismatch stays."""
    check = verify_pins(result, procfs=procfs, sysfs=sysfs, run=run)
    if check["mismatch"]:
        moved = check["mismatch"]
        try:
            run_desired_state(pin_desired, check_mode=False, procfs=procfs, sysfs=sysfs, run=run,
                              rps_release=rps_release)
        except (AffinityError, NicError, TreeError) as exc:
            check["mismatch"] = moved + ["pinning again failed: %s" % exc]
        else:
            check = verify_pins(result, procfs=procfs, sysfs=sysfs, run=run)
            if not check["mismatch"]:
                warnings.append("after pinning, something moved queue IRQs of %s (%s); they were pinned again "
                                "and held" % (result["pci_address"], "; ".join(moved)))
    return check


def _pin_and_persist(module, params, procfs, sysfs, run, plan, run_desired, desired, files, actions, settings, root,
                     irqbalance_result, rps_release=None):
    # irqbalance (when this run handles it) is stopped or bans these CPUs by now: pin with the stored setting,
    # so a disabled irqbalance that is still running is refused, not raced.
    # (On a captured tree no systemctl ran, so the tree's irqbalance still looks as it was: plan as for check mode.)
    pin_desired = desired if (params["irqbalance"] is not None and run is not None) else run_desired
    if module.check_mode or not (plan["changed"] or (irqbalance_result or {}).get("changed")):
        # Nothing to pin and irqbalance as it was: the plan is the outcome (the read-back below still reads the IRQs).
        result = plan
    else:
        result = run_desired_state(pin_desired, check_mode=False, procfs=procfs, sysfs=sysfs, run=run,
                                   rps_release=rps_release)
    systemd = Systemd(module, run is not None, module.check_mode)
    changed_files = [a for a in actions if a["action"] != "unchanged"]
    undo_files = None
    if params["persist"]:
        timer_path = rooted(root, "%s/%s" % (UNIT_DIR, TIMER))
        try:
            if not settings["recheck_interval"] and os.path.exists(timer_path):
                timer = systemd.states(TIMER).get(TIMER, {}) if not module.check_mode else {}
                systemd.do(["systemctl", "disable", "--now", TIMER], "disable --now %s" % TIMER,
                           undo=_undo_disable_now(TIMER, timer))
            if not module.check_mode:
                undo_files = apply_files(files, changed_files, root, prune_within=settings["lib_dir"])
            units = [a for a in changed_files if a["path"].startswith(UNIT_DIR + "/")]
            if units:
                systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
            if any(a["path"] == UDEV_RULE for a in changed_files):
                systemd.do(["udevadm", "control", "--reload"], "udevadm control --reload")
            # Enablement is read from systemd itself, so only on the live system.
            if systemd.live:
                found = systemd.states(UNIT, TIMER)
                if found.get(UNIT, {}).get("UnitFileState") != "enabled":
                    systemd.do(["systemctl", "enable", UNIT], "enable %s" % UNIT, undo=[["systemctl", "disable", UNIT]])
                timer = found.get(TIMER, {})
                if settings["recheck_interval"] and (timer.get("UnitFileState") != "enabled"
                                                     or timer.get("ActiveState") != "active"):
                    systemd.do(["systemctl", "enable", "--now", TIMER], "enable --now %s" % TIMER,
                               undo=_undo_enable_now(TIMER, timer))
        except PersistError as exc:
            raise _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs)
    out = dict(
        changed=bool(result["changed"] or changed_files or systemd.actions),
        interface=result["interface"], pci_address=result["pci_address"], cpulist=result["cpulist"], cpus=result["cpus"],
        irqs=result["irqs"], rps=result["rps"], irqbalance=result["irqbalance"],
        drift=["%s %s: %s -> %s" % (i["irq"], i["name"], i["before"], i["after"])
               for i in result["irqs"] if i["status"] in ("changed", "would_change")] + rps_drift(result["rps"]),
        files=[dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions],
        systemd=systemd.actions, verified=None, unchangeable=[], effective_lagging=[],
    )
    if irqbalance_result is not None:
        out.update(irqbalance_state=irqbalance_result, changed=bool(out["changed"] or irqbalance_result["changed"]))
    warnings = list(result["warnings"])
    if params["verify"] and not module.check_mode:
        check = _read_back(result, pin_desired, procfs, sysfs, run, rps_release, warnings)
        out.update(verified=not check["mismatch"], unchangeable=check["unchangeable"],
                   effective_lagging=check["lagging"])
        if check["mismatch"]:
            exc = PersistError("after pinning, queue IRQs of %s are not on their planned CPUs (something moved them: "
                               "is irqbalance running?): %s" % (result["pci_address"], "; ".join(check["mismatch"])),
                               **out)
            raise _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs)
    diff = [result["diff"]] + ([result["rps_diff"]] if result["rps_diff"] else []) + [
        {"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]}
        for a in changed_files if a["before"] or a["after"]]
    return out, warnings, diff


def _undo_enable_now(unit, props):
    """What takes back ``systemctl enable --now unit`` given the unit's properties before it."""
    enabled, active = props.get("UnitFileState") == "enabled", props.get("ActiveState") == "active"
    if not enabled and not active:
        return [["systemctl", "disable", "--now", unit]]
    if enabled and active:
        return []
    return [["systemctl", "stop" if enabled else "disable", unit]]


def _undo_disable_now(unit, props):
    """What takes back ``systemctl disable --now unit`` given the unit's properties before it."""
    enabled, active = props.get("UnitFileState") == "enabled", props.get("ActiveState") == "active"
    if enabled and active:
        return [["systemctl", "enable", "--now", unit]]
    if enabled or active:
        return [["systemctl", "enable" if enabled else "start", unit]]
    return []


def _roll_back(exc, systemd, undo_files, changed_files, result, procfs, sysfs):
    """A step after the pins failed (a file, systemctl, the read-back): put back what this run did, so a failed run
    leaves the node as it found it - the units it enabled or started stopped and disabled, the files (bytes, mode,
    owner, or absence; after a failed write ``apply_files`` has already put them back), systemd and udev reloaded,
    what it disabled enabled again, the RPS masks it wrote, the IRQs it moved. irqbalance's pass, which ran before the pins, is not undone (it
    is reported with the failure). Returns the error to raise: what was put back, what could not be, and ``changed``
    true only when something could not."""
    files = {"restored": [], "failed": list(exc.details.get("rollback_failed") or [])}

    def restore_files():
        if undo_files is not None:
            back = rollback_files(undo_files)
            files["restored"], files["failed"] = back["restored"], files["failed"] + back["failed"]

    paths = [a["path"] for a in changed_files]
    restored, failed = systemd.roll_back(restore_files, undo_files is not None and any(
        p.startswith(UNIT_DIR + "/") for p in paths), undo_files is not None and UDEV_RULE in paths)
    rps = restore_rps_masks(result, sysfs=sysfs)
    pins = {"restored": [], "failed": [], "summary": "none moved"}
    if any(item["status"] == "changed" for item in result["irqs"]):
        pins = restore_pins(result["irqs"], procfs=procfs)
    parts = []
    if undo_files is not None:
        parts.append("files: %d put back%s" % (len(files["restored"]), "; rollback FAILED for %s" % ", ".join(
            files["failed"]) if files["failed"] else ""))
    if restored or failed:
        parts.append("systemd: %s%s" % (", ".join(restored) or "nothing", "; FAILED: %s" % ", ".join(failed)
                                        if failed else ""))
    if rps["restored"] or rps["failed"]:
        parts.append("RPS: %s" % rps["summary"])
    parts.append("pins: %s" % pins["summary"])
    details = dict(exc.details, files_rolled_back=files["restored"], rollback_failed=files["failed"],
                   systemd_rolled_back=restored, systemd_rollback_failed=failed, pins_rolled_back=pins["restored"],
                   pins_rollback_failed=pins["failed"], rps_rolled_back=rps["restored"], rps_rollback_failed=rps["failed"],
                   changed=bool(files["failed"] or failed or pins["failed"] or rps["failed"]))
    return PersistError("%s; rolled back: %s" % (exc, "; ".join(parts)), **details)


def _absent(module, params, procfs, sysfs, run):
    # The entry point's passes wait (a running one is stopped by disable --now: its wait for the lock ends).
    with pin_lock(procfs, take=not module.check_mode):
        return _remove(module, params, procfs, sysfs, run)


def _remove(module, params, procfs, sysfs, run):
    settings = dict((key, params[key]) for key in SETTINGS)
    root = root_of(procfs)
    actions = plan_files({}, owned_paths(settings, root), root,
                         diff_skip=("%s/%s/" % (settings["lib_dir"].rstrip("/"), PKG_DIR),))
    prepared = _irqbalance_prepare(module, params, root, sysfs, run) if params["irqbalance"] is not None else None
    # The RPS masks the stored state set go back to 0 (planned and checked here, written after the units stop, so
    # no re-check sets them again; a failed removal of the files puts them back).
    stored, rps, warnings = _stored_rps(settings, root), None, []
    if stored is not None:
        try:
            rps = release_rps(stored[0], stored[1], check_mode=True, procfs=procfs, sysfs=sysfs, run=run)
        except NicError as exc:
            warnings.append("the RPS masks the stored state set (%s) are left as they are: %s" % (stored[1], exc))
    systemd = Systemd(module, run is not None, module.check_mode)
    for unit in (TIMER, UNIT):
        if os.path.exists(rooted(root, "%s/%s" % (UNIT_DIR, unit))):
            systemd.do(["systemctl", "disable", "--now", unit], "disable --now %s" % unit)
    if rps is not None and rps["changed"] and not module.check_mode:
        rps = release_rps(stored[0], stored[1], check_mode=False, procfs=procfs, sysfs=sysfs, run=run)
    if not module.check_mode:
        try:
            apply_files({}, actions, root, prune_within=settings["lib_dir"])
        except PersistError as exc:
            if rps is None:
                raise
            back = restore_rps_masks(rps, sysfs=sysfs)
            raise PersistError("%s; RPS: %s" % (exc, back["summary"]), rps_rolled_back=back["restored"],
                               rps_rollback_failed=back["failed"], changed=bool(back["failed"]), **exc.details)
    if any(a["path"].startswith(UNIT_DIR + "/") for a in actions):
        systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
    if any(a["path"] == UDEV_RULE for a in actions):
        systemd.do(["udevadm", "control", "--reload"], "udevadm control --reload")
    out = dict(changed=bool(actions or systemd.actions or (rps and rps["changed"])),
               files=[dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions],
               systemd=systemd.actions, rps=rps["rps"] if rps else [])
    diff = ([rps["diff"]] if rps and rps["diff"] else []) + [
        {"before_header": a["path"], "after_header": "(absent)", "before": a["before"], "after": ""}
        for a in actions if a["before"]]
    warnings += rps["warnings"] if rps else []
    if prepared is not None:
        # After the persistence is gone, so nothing of the collection pins behind the irqbalance given back.
        irqbalance_result, irqbalance_diff = finish(prepared)
        out.update(irqbalance_state=irqbalance_result, changed=bool(out["changed"] or irqbalance_result["changed"]))
        diff += irqbalance_diff
    return out, warnings, diff


INPUT_RULES = {
    "cidr": "cidr",
    "cpus": "cpulist",
    "exclude_cpus": "cpulist",
    "rps_cpus": "cpulist",
    "recheck_interval": "timespan",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE + [("cpus", "count")])
    params = module.params
    _validate(module, params)
    procfs, sysfs = params["procfs_path"], params["sysfs_path"]
    try:
        run = runner_for_roots(module, procfs, sysfs, commands=("ethtool", "ip", "systemctl", "udevadm"))
        if params["state"] == "absent":
            out, warnings, diff = _absent(module, params, procfs, sysfs, run)
        else:
            out, warnings, diff = _present(module, params, procfs, sysfs, run)
    except (AffinityError, NicError, TreeError, PersistError, StateError, LockError) as exc:
        details = dict(exc.details)
        details.setdefault("changed", False)
        module.fail_json(msg=str(exc), **details)
    exit_with(module, out, diff, warnings)


if __name__ == "__main__":
    main()
