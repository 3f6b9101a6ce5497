# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""irqbalance state: installed, active, enabled, masked, banned CPUs.

Private module_utils of gpunode.tuning, standard library only.

Where systemd runs (``run/systemd/system`` exists under ``root``) and a
``run(argv) -> (rc, stdout, stderr)`` callable is given, the state comes from
``systemctl``. Otherwise it is read from the unit files under ``root`` and
from ``proc/*/comm`` (a running ``irqbalance`` process means active).
The banned CPUs come from ``IRQBALANCE_BANNED_CPULIST`` (irqbalance >= 1.8)
or the older hex ``IRQBALANCE_BANNED_CPUS`` in ``/etc/default/irqbalance``
(Debian, Ubuntu) or ``/etc/sysconfig/irqbalance`` (RHEL, SUSE).
"""

from __future__ import annotations

import os
import shlex

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import CpuListError, parse_cpulist, parse_cpumask
from ansible_collections.gpunode.tuning.plugins.module_utils._fileio import join, list_dir, read_raw, read_text

CONFIG_FILES = ("etc/default/irqbalance", "etc/sysconfig/irqbalance")
UNIT = "irqbalance.service"
UNIT_DIRS = ("etc/systemd/system", "run/systemd/system", "usr/lib/systemd/system", "lib/systemd/system")
BINARIES = ("usr/sbin/irqbalance", "sbin/irqbalance", "usr/bin/irqbalance")


def parse_config(text):
    """Shell-style ``KEY=value`` assignments of an irqbalance environment file."""
    values = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().replace("_", "").isalnum():
            continue
        try:
            words = shlex.split(value, comments=True)
        except ValueError:
            words = [value.strip().strip("\"'")]
        values[key.strip()] = " ".join(words)
    return values


def banned_cpus_from_config(values, notes):
    cpulist = values.get("IRQBALANCE_BANNED_CPULIST", "").strip()
    if cpulist:
        try:
            return parse_cpulist(cpulist)
        except CpuListError as exc:
            notes.append("cannot parse IRQBALANCE_BANNED_CPULIST=%r: %s" % (cpulist, exc))
            return []
    mask = values.get("IRQBALANCE_BANNED_CPUS", "").strip()
    if mask:
        try:
            return parse_cpumask(mask)
        except CpuListError as exc:
            notes.append("cannot parse IRQBALANCE_BANNED_CPUS=%r: %s" % (mask, exc))
    return []


def _from_systemctl(run):
    rc, out, _err = run(["systemctl", "is-active", UNIT])
    active_state = (out or "").strip().splitlines()[0] if (out or "").strip() else "unknown"
    rc2, out2, err2 = run(["systemctl", "is-enabled", UNIT])
    enabled_state = (out2 or "").strip().splitlines()[0] if (out2 or "").strip() else ""
    if not enabled_state and "No such file" in (err2 or ""):
        enabled_state = "not-found"
    return {
        "active": active_state in ("active", "activating", "reloading"),
        "active_state": active_state,
        "enabled": enabled_state in ("enabled", "enabled-runtime", "alias"),
        "masked": enabled_state in ("masked", "masked-runtime"),
        "unit_file_state": enabled_state or ("unknown (rc %d)" % rc2),
        "installed": enabled_state not in ("not-found", ""),
    }


def _unit_path(root):
    for directory in UNIT_DIRS:
        path = join(root, directory, UNIT)
        if os.path.lexists(path):
            return path
    return None


def _from_unit_files(root):
    masked = False
    for directory in ("etc/systemd/system", "run/systemd/system"):
        path = join(root, directory, UNIT)
        if os.path.islink(path) and os.readlink(path) == "/dev/null":
            masked = True
        elif os.path.isfile(path) and os.path.getsize(path) == 0:
            masked = True
    enabled = False
    wants_root = join(root, "etc/systemd/system")
    for name in list_dir(wants_root):
        if name.endswith(".wants") and os.path.lexists(join(wants_root, name, UNIT)):
            enabled = True
    for level in ("2", "3", "5"):
        for name in list_dir(join(root, "etc/rc%s.d" % level)):
            if name.startswith("S") and name.lstrip("S0123456789") == "irqbalance":
                enabled = True
    active = False
    proc = join(root, "proc")
    for name in list_dir(proc):
        if name.isdigit() and read_text(join(proc, name, "comm")) == "irqbalance":
            active = True
            break
    installed = _unit_path(root) is not None or any(os.path.exists(join(root, b)) for b in BINARIES)
    return {
        "active": active,
        "active_state": "active" if active else "inactive",
        "enabled": enabled and not masked,
        "masked": masked,
        "unit_file_state": "masked" if masked else ("enabled" if enabled else ("disabled" if installed else "not-found")),
        "installed": installed,
    }


def read_irqbalance(root="/", run=None):
    """Return irqbalance facts for the system under ``root``.

    Keys: ``installed``, ``active``, ``enabled``, ``masked`` (bools),
    ``active_state``, ``unit_file_state`` (strings), ``banned_cpus`` (list),
    ``config_file`` (path or None), ``source`` ("systemctl" or "unit-files"),
    ``notes``.
    """
    notes = []
    if run is not None and os.path.isdir(join(root, "run/systemd/system")):
        state = _from_systemctl(run)
        source = "systemctl"
    else:
        state = _from_unit_files(root)
        source = "unit-files"
    config_file = None
    banned = []
    for candidate in CONFIG_FILES:
        path = join(root, candidate)
        text = read_raw(path)
        if text is not None:
            config_file = path
            banned = banned_cpus_from_config(parse_config(text), notes)
            break
    state.update({"banned_cpus": banned, "config_file": config_file, "source": source, "notes": notes})
    return state
