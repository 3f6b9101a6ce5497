# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one systemd wrapper: every ``systemctl`` (and ``udevadm``) call a module makes goes through :class:`Systemd`.

One set of rules for every module that drives systemd (checkpoint_staging, nic_irq_persist, irqbalance_state,
cpuset_slices):

* ``run`` is a runner (``argv -> (rc, out, err)``, :func:`_host.fileio.module_runner`); None on a captured tree.
* In check mode or on a tree a step is only recorded (with ``why`` on a tree: nothing ran); on the live host it runs,
  and a step that fails raises ``error`` (the caller's error class, a :class:`DetailedError`) naming the command,
  its exit status, what it said and what this run did before it.
* ``do`` takes the steps that take it back (``undo``), remembered before it runs (a step that fails may have done half
  of its work: ``enable --now`` enabled and did not start); :meth:`Systemd.roll_back` runs them around the files'
  rollback and never raises.
* Reads (``show``, ``query``, ``call``) are never recorded as actions.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError


class SystemdError(DetailedError):
    """A systemctl or udevadm step that failed; ``details`` names the command."""


def systemctl_show(out):
    """``systemctl show --property=... UNIT...`` output: one dict of properties per unit, in the order asked
    (systemd separates the units' blocks by an empty line)."""
    return [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in out.strip().split("\n\n")]


def _label(argv):
    return " ".join(argv[1:] if argv[0] == "systemctl" else argv)


class Systemd(object):
    """systemctl/udevadm through ``run``; in check mode or on a captured tree (``run`` None) only recorded.

    ``why``: what a recorded step says on a tree (``"captured tree: not run"``); ``error``: the class raised for a
    failed step, so that each caller's failures stay its own kind.
    """

    def __init__(self, run, check, why="captured tree: not run", error=SystemdError):
        self.run, self.check, self.why, self.error = run, check, why, error
        self.live = run is not None
        self.actions, self.undo = [], []

    def _fail(self, argv, rc, out, err, done=True):
        said = (err or out or "").strip() or "no output"
        before = "; done before it: %s" % (", ".join(self.actions) or "nothing") if done else ""
        return self.error("%s failed (rc %d): %s%s" % (" ".join(argv), rc, said, before), command=" ".join(argv))

    def call(self, argv):
        """A raw read (live only): ``(rc, out, err)``, never recorded, never raises."""
        rc, out, err = self.run(list(argv))
        return rc, out or "", err or ""

    def query(self, argv):
        """A read-only call that must work (live only): its output; a failure raises ``error``."""
        rc, out, err = self.call(argv)
        if rc != 0:
            raise self._fail(argv, rc, out, err, done=False)
        return out

    def show(self, units, properties=("Id", "UnitFileState", "ActiveState"), strict=False):
        """``{unit: {property: value}}`` of ``units`` in one ``systemctl show`` call (each call costs time on a slow
        node); ``{}`` on a tree. A failed call raises when ``strict``, else every unit reads as ``{}``."""
        units = list(units)
        if not self.live or not units:
            return {}
        argv = ["systemctl", "show"] + ["--property=%s" % p for p in properties] + units
        rc, out, err = self.call(argv)
        if rc != 0:
            if strict:
                raise self._fail(argv, rc, out, err, done=False)
            return dict((u, {}) for u in units)
        return dict(zip(units, systemctl_show(out)))

    def do(self, argv, label=None, undo=()):
        """Run one step that changes the host (``argv`` starts with the command); ``label`` as reported (default: the
        argv less ``systemctl``). Returns its output ("" when only recorded)."""
        label = label or _label(argv)
        if self.check or not self.live:
            self.actions.append(label if self.live else "%s (%s)" % (label, self.why))
            return ""
        self.undo.extend(list(step) for step in undo)
        rc, out, err = self.call(argv)
        if rc != 0:
            raise self._fail(argv, rc, out, err)
        self.actions.append(label)
        return out

    def roll_back(self, restore_files=None, reload_units=False, reload_udev=False):
        """Take back what this run did, around ``restore_files`` (a callable, or None): first stop and disable what
        it enabled or started (with the unit files it wrote), then the files, then ``daemon-reload`` and the udev
        reload (systemd and udev re-read what was put back), then enable and start again what it disabled or
        stopped. Every step that can run runs; returns (``restored``, ``failed``) step labels."""
        if self.check or not self.live:
            if restore_files is not None:
                restore_files()
            return [], []
        late = [argv for argv in self.undo if argv[0] == "systemctl" and argv[1] in ("enable", "start")]
        steps = [argv for argv in reversed(self.undo) if argv not in late] + [restore_files]
        if reload_units:
            steps.append(["systemctl", "daemon-reload"])
        if reload_udev:
            steps.append(["udevadm", "control", "--reload"])
        steps += late
        restored, failed = [], []
        for step in steps:
            if step is None:
                continue
            if callable(step):
                step()
                continue
            (restored if self.call(step)[0] == 0 else failed).append(_label(step))
        self.undo = []
        return restored, failed


def undo_enable_now(unit, props):
    """The steps that take back ``systemctl enable --now unit``, given the unit's properties before it."""
    enabled, active = props.get("UnitFileState") == "enabled", props.get("ActiveState") == "active"
    if not enabled and not active:
        return [["systemctl", "disable", "--now", unit]]
    if enabled and active:
        return []
    return [["systemctl", "stop" if enabled else "disable", unit]]


def undo_disable_now(unit, props):
    """The steps that take back ``systemctl disable --now unit``, given the unit's properties before it."""
    enabled, active = props.get("UnitFileState") == "enabled", props.get("ActiveState") == "active"
    if enabled and active:
        return [["systemctl", "enable", "--now", unit]]
    if enabled or active:
        return [["systemctl", "enable" if enabled else "start", unit]]
    return []
