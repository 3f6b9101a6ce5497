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
The banned CPUs are worked out as irqbalance itself does (see
``effective_ban``) from ``/etc/default/irqbalance`` (Debian, Ubuntu) or
``/etc/sysconfig/irqbalance`` (RHEL, SUSE) and the kernel's ``isolated`` and
``nohz_full`` CPU lists. ``plan_ban`` checks and computes what the irqbalance
role writes in banned mode, so the role and the modules share one reading.
"""

from __future__ import annotations

import os
import shlex

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist, parse_cpumask
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_cpulist, read_raw, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import NicError, normalize_pci

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


class IrqbalanceError(DetailedError):
    """Bad input for the irqbalance plan. ``details`` holds ``value`` and ``expected``."""

    def __init__(self, message, value=None, expected=None):
        super(IrqbalanceError, self).__init__(message, value=value, expected=expected)


BANNED_BY_DEFAULT = "isolated+nohz_full"


def effective_ban(values, isolated, nohz_full, notes):
    """The CPUs irqbalance bans, and which setting decided it: ``(cpus, banned_by)``.

    ``values`` are the variables of irqbalance's environment file
    (``parse_config``), ``isolated`` and ``nohz_full`` the CPU lists of
    ``/sys/devices/system/cpu/{isolated,nohz_full}``.

    This follows ``setup_banned_cpus()`` in irqbalance's cputree.c, which
    decides the same way in every release from v1.8.0 (which added the list)
    through v1.9.5, only its log texts differ
    (https://github.com/Irqbalance/irqbalance/blob/v1.9.4/cputree.c):

    1. ``IRQBALANCE_BANNED_CPUS`` (hex mask), if set and non-empty
       (``if (env && strlen(env))``), is the whole ban: ``goto out``, nothing
       else is read or added. ``IRQBALANCE_BANNED_CPUS=0`` bans nothing.
    2. Else ``IRQBALANCE_BANNED_CPULIST``, if set and non-empty, is the whole
       ban, again without the isolated or nohz_full CPUs.
    3. Else, with neither, the union of the ``isolated`` and ``nohz_full``
       files (a missing file, an empty one and ``(null)`` add nothing).

    The only change since is master commit 8929e4d (March 2026, after
    v1.9.5): there a set but empty ``IRQBALANCE_BANNED_CPULIST=`` bans
    nothing instead of falling through to step 3; that case gets a note. Not
    modelled: a ban set over irqbalance's socket at run time, and CPUs that a
    build with thermal support adds on a thermal event. A value irqbalance
    cannot parse gets a note and counts as banning nothing (irqbalance zeroes
    the mask before parsing and keeps only the CPUs before the bad character).
    """
    for key, parse in (("IRQBALANCE_BANNED_CPUS", parse_cpumask), ("IRQBALANCE_BANNED_CPULIST", parse_cpulist)):
        text = values.get(key)
        if text:
            try:
                return parse(text), key
            except CpuListError as exc:
                notes.append("cannot parse %s=%r: %s" % (key, text, exc))
                return [], key
    if values.get("IRQBALANCE_BANNED_CPULIST") is not None:
        notes.append(
            "IRQBALANCE_BANNED_CPULIST is set but empty: irqbalance up to 1.9.5 then bans the isolated and nohz_full CPUs,"
            " later versions ban no CPU"
        )
    return sorted(set(isolated) | set(nohz_full)), BANNED_BY_DEFAULT


def plan_ban(state, banned_cpus=None, ban_isolated=True, banned_devices=None):
    """What banned mode writes: ``banned_cpus`` (list), ``banned_cpulist`` (kernel-style string) and
    ``banned_devices`` (full, lower-case PCI addresses, in the order given, each once).

    ``state`` is ``read_irqbalance()``'s result (its ``isolated`` and
    ``nohz_full`` are added when ``ban_isolated``: setting
    ``IRQBALANCE_BANNED_CPULIST`` turns off irqbalance's own ban of them).
    ``banned_cpus`` is a CPU list string or a list of integers. Each device is
    checked with the normaliser of the modules' ``pci_address`` option
    (``42:01.0`` becomes ``0000:42:01.0``), because the policy script compares
    it with the device directory's name; anything else (``*``, a shell
    pattern, a bus number alone) raises ``IrqbalanceError`` naming it.
    """
    try:
        cpus = set(parse_cpulist(banned_cpus if banned_cpus is not None else []))
    except CpuListError as exc:
        raise IrqbalanceError("banned_cpus %r is not a CPU list: %s" % (banned_cpus, exc), value=banned_cpus, expected=exc.expected)
    if ban_isolated:
        cpus |= set(state["isolated"]) | set(state["nohz_full"])
    devices = []
    if banned_devices is not None and not isinstance(banned_devices, (list, tuple)):
        raise IrqbalanceError("banned_devices %r is not a list" % (banned_devices,), value=banned_devices, expected="a list of PCI addresses")
    for device in banned_devices or []:
        try:
            if not isinstance(device, str):
                raise NicError("not a string")
            address = normalize_pci(device)
        except NicError:
            raise IrqbalanceError(
                "banned_devices entry %r is not a PCI address" % (device,),
                value=device,
                expected="a PCI address such as 0000:42:01.0 (domain:bus:slot.function) or 42:01.0",
            )
        if address not in devices:
            devices.append(address)
    ordered = sorted(cpus)
    return {"banned_cpus": ordered, "banned_cpulist": format_cpulist(ordered), "banned_devices": devices}


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


def read_irqbalance(root="/", run=None, sysfs=None, config_file=None):
    """Return irqbalance facts for the system under ``root``.

    Keys: ``installed``, ``active``, ``enabled``, ``masked`` (bools),
    ``active_state``, ``unit_file_state`` (strings), ``banned_cpus`` (list:
    what irqbalance bans with this config, see ``effective_ban``),
    ``banned_by`` (``IRQBALANCE_BANNED_CPUS``, ``IRQBALANCE_BANNED_CPULIST``
    or ``isolated+nohz_full``), ``isolated``, ``nohz_full`` (lists),
    ``config_file`` (path or None), ``source`` ("systemctl" or "unit-files"),
    ``notes``. ``sysfs`` defaults to ``root``/sys; ``config_file``, a path on
    the system such as ``/etc/sysconfig/irqbalance``, is read under ``root``
    instead of the first of CONFIG_FILES that exists.
    """
    notes = []
    if run is not None and os.path.isdir(join(root, "run/systemd/system")):
        state = _from_systemctl(run)
        source = "systemctl"
    else:
        state = _from_unit_files(root)
        source = "unit-files"
    cpu_dir = join(join(root, "sys") if sysfs is None else sysfs, "devices/system/cpu")
    isolated = read_cpulist(join(cpu_dir, "isolated"), default=[])
    nohz_full = read_cpulist(join(cpu_dir, "nohz_full"), default=[])
    found, values = None, {}
    for candidate in [config_file] if config_file else CONFIG_FILES:
        path = join(root, candidate)
        text = read_raw(path)
        if text is not None:
            found, values = path, parse_config(text)
            break
    banned, banned_by = effective_ban(values, isolated, nohz_full, notes)
    state.update({
        "banned_cpus": banned, "banned_by": banned_by, "isolated": isolated, "nohz_full": nohz_full,
        "config_file": found, "source": source, "notes": notes,
    })
    return state
