# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpunode.tuning.irqbalance role in one pass: read, plan, apply (the irqbalance_state module).

Private module_utils of gpunode.tuning, standard library only. What the role
did in about ten tasks (probes, a lineinfile per config line, a template, a
copy per marker, systemd_service calls and a restart handler) is done here in
one module run, with the same results on disk and in systemd:

* :func:`read_state` - the unit (``systemctl show``, or the unit files of a
  tree), the binary, the two markers of what the role changed before;
* :func:`plan` - the files (config lines as ``lineinfile`` edits them, the
  policy script, the markers), the unit changes (as ``systemd_service`` decides
  them: mask, then enablement re-read, then state) and whether irqbalance is
  restarted. Every input is checked here, before anything changes;
* :func:`apply` - writes the files with ``_host.files.apply_files`` (atomic, all or
  nothing), then runs systemctl. Skipped in check mode.

The ban itself (which CPUs, the PCI address check) is ``_nic_irq.irqbalance.plan_ban``,
the same code as the irqbalance_facts module.
"""

from __future__ import annotations

import json
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.irqbalance import UNIT, IrqbalanceError, plan_ban, read_irqbalance
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import (
    PersistError,
    apply_files,
    marker_bytes,
    plan_files,
    rooted,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import Systemd
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file, check_path

MANAGED_BY = "gpunode.tuning.irqbalance"
MODES = ("disabled", "banned", "absent")
MASK_MARKER = "irqbalance-masked.json"
BANNED_MARKER = "irqbalance-banned.json"
BINARY = "/usr/sbin/irqbalance"
# The irqbalance settings of a pass, as the irqbalance_state module takes them at its top level and
# nic_irq_persist under its `irqbalance` option (there the banned CPUs and devices come from its own plan).
SETTINGS_SPEC = dict(
    mode=dict(type="str", choices=list(MODES), default="disabled"),
    ban_isolated=dict(type="bool", default=True),
    config_file=dict(type="path", default=""),
    os_family=dict(type="str"),
    state_dir=dict(type="path", default="/etc/gpunode"),
    policy_script=dict(type="path", default="/usr/local/libexec/gpunode-irqbalance-policy"),
    binary=dict(type="path", default=BINARY),
)

# irqbalance.service's environment file per ansible_facts.os_family.
CONFIG_BY_FAMILY = {"Debian": "/etc/default/irqbalance", "RedHat": "/etc/sysconfig/irqbalance", "Suse": "/etc/sysconfig/irqbalance"}
CPULIST, CPUMASK, ARGS = "IRQBALANCE_BANNED_CPULIST", "IRQBALANCE_BANNED_CPUS", "IRQBALANCE_ARGS"
# systemctl is-enabled answers that systemd_service counts as "enabled" (rc 0, minus the ones it re-enables).
_ENABLED_RC0 = ("enabled", "static", "generated", "transient")
_ACTIVE = ("active", "activating", "reloading")


class StateError(DetailedError):
    """Bad input, an unreadable marker or a failed systemctl; ``details`` names the value or path."""


# ------------------------------------------------------------------- render --

# The line by which a policy script is known as this module's (and the role's template's) own.
POLICY_MARKER = "# irqbalance --policyscript: called once per IRQ with the device's sysfs path\n"


def policy_script(devices, managed="Ansible managed"):
    """The --policyscript, byte for byte what the role's template rendered (``ansible_managed | comment``)."""
    return (
        "#!/bin/sh\n#\n# %s\n#\n" % managed
        + "# irqbalance --policyscript: called once per IRQ with the device's sysfs path\n"
        + "# and the IRQ number. The IRQs of these PCI functions are pinned by\n"
        + "# gpunode.tuning and must not be balanced.\n"
        + 'case "${1##*/}" in\n'
        + "".join("  %s) echo ban=true ;;\n" % dev for dev in devices)
        + "esac\nexit 0\n"
    )


def marker(data):
    """A marker file as the role's copy tasks wrote it (``to_nice_json`` plus a newline)."""
    return marker_bytes(data)


# ------------------------------------------------------ config lines (lineinfile) --

def _key_re(key):
    return re.compile((r"^\s*%s=" % key).encode())


def line_present(lines, key, line, insertafter=True):
    """``lineinfile`` with ``regexp: '^\\s*KEY='``, ``line`` and (with ``insertafter``)
    ``insertafter: '^#\\s*KEY='``, on ``readlines()`` output (bytes, with line ends).

    The last matching line is replaced; with no match the line goes after the
    last commented ``#KEY=`` line, else at the end. One difference: where the
    commented line is the file's last and has no newline, lineinfile glued the
    two lines together; here the newline is added first.
    """
    lines = list(lines)
    new = line.encode("utf-8")
    match = [n for n, cur in enumerate(lines) if _key_re(key).search(cur)]
    if match:
        if lines[match[-1]] != new + b"\n":
            lines[match[-1]] = new + b"\n"
        return lines
    after = [n + 1 for n, cur in enumerate(lines) if insertafter and re.search((r"^#\s*%s=" % key).encode(), cur)]
    if lines and lines[-1][-1:] not in (b"\n", b"\r"):
        lines[-1] += b"\n"
    if not after or after[-1] == len(lines):
        lines.append(new + b"\n")
    else:
        lines.insert(after[-1], new + b"\n")
    return lines


def line_absent(lines, key):
    """``lineinfile state=absent regexp='^\\s*KEY='``: every matching line goes."""
    return [cur for cur in lines if not _key_re(key).search(cur)]


def found_lines(data, keys):
    """{key: the first ``KEY=...`` line (leading blanks kept) or None}: what banned mode replaces, for the marker."""
    text = data.decode("utf-8", "replace")
    out = {}
    for key in keys:
        hit = re.search(r"(?m)^[ \t]*%s=.*$" % key, text)
        out[key] = hit.group(0) if hit else None
    return out


def banned_config(data, cpulist, devices, policy):
    lines = line_present(data.splitlines(True), CPULIST, "%s=%s" % (CPULIST, cpulist))
    lines = line_absent(lines, CPUMASK)
    if devices:
        lines = line_present(lines, ARGS, '%s="--policyscript=%s"' % (ARGS, policy))
    return b"".join(lines)


def restored_config(data, previous):
    lines = data.splitlines(True)
    for key, value in previous.items():
        lines = line_present(lines, key, value, insertafter=False) if value else line_absent(lines, key)
    return b"".join(lines)


# --------------------------------------------------------------------- read --

def _read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _marker(root, path):
    """(exists, data) of a marker; a marker that is not a JSON object fails naming it."""
    data = _read_bytes(rooted(root, path))
    if data is None:
        return False, {}
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise StateError("marker %s is not JSON (%s): fix or remove it" % (path, exc), path=path)
    if not isinstance(parsed, dict):
        raise StateError("marker %s is not a JSON object: fix or remove it" % path, path=path, value=parsed)
    return True, parsed


class Unit(object):
    """irqbalance.service through systemctl (``run``), or, on a tree or without systemd, its unit files.

    ``do`` runs an action only when ``live`` and not ``check``; otherwise it is
    recorded, the way systemd_service reports in check mode.
    """

    def __init__(self, root, run, check):
        self.root, self.check = root, check
        self.live = run is not None and os.path.isdir(join(root, "run/systemd/system"))
        self.systemd = Systemd(run if self.live else None, check, error=StateError,
                               why="no systemd here: not run" if run else "captured tree: not run")
        self.actions = self.systemd.actions
        self.tree = None if self.live else read_irqbalance(root)

    def show(self):
        if not self.live:
            state = self.tree["unit_file_state"]
            load = "masked" if self.tree["masked"] else ("not-found" if state == "not-found" else "loaded")
            return {"LoadState": load, "ActiveState": self.tree["active_state"], "UnitFileState": state}
        return self.systemd.show([UNIT], ("LoadState", "ActiveState", "UnitFileState"), strict=True)[UNIT]

    def is_enabled(self):
        if not self.live:
            state = self.tree["unit_file_state"]
            return (0 if state == "enabled" else 1), state
        rc, out, _err = self.systemd.call(["systemctl", "is-enabled", UNIT])
        return rc, out.strip()

    def do(self, action):
        self.systemd.do(["systemctl", action, UNIT], label=action)


def read_state(root, unit, state_dir, binary=BINARY):
    """What the role's probes found: ``status`` (the irqbalance_status fact, less ``mode``), the unit's
    ``systemctl show`` properties and the two markers."""
    props = unit.show()
    mask_exists, mask_data = _marker(root, join(state_dir, MASK_MARKER))
    banned_exists, banned_data = _marker(root, join(state_dir, BANNED_MARKER))
    status = {
        "installed": os.path.exists(rooted(root, binary)),
        "active": props.get("ActiveState", "") in _ACTIVE,
        "enabled": props.get("UnitFileState", "") in ("enabled", "enabled-runtime"),
        "masked": props.get("LoadState", "") == "masked" or props.get("UnitFileState", "") in ("masked", "masked-runtime"),
        "masked_by_role": mask_exists,
    }
    return {"status": status, "props": props, "mask": mask_data, "banned": banned_data, "banned_exists": banned_exists}


def config_path(config_file, os_family, detect=None):
    """The environment file: ``config_file``, else the file of ``os_family`` (``detect()`` works it out when None)."""
    if config_file:
        return config_file
    family = os_family if os_family else (detect() if detect else None)
    path = CONFIG_BY_FAMILY.get(family or "")
    if not path:
        raise StateError(
            "irqbalance: no config file is known for OS family %s; expected one of %s, or config_file (the role's "
            "irqbalance_config_file) set to the environment file of irqbalance.service."
            % (json.dumps(family if family else "(not gathered)"), ", ".join(sorted(CONFIG_BY_FAMILY))),
            option="os_family", value=family, expected=sorted(CONFIG_BY_FAMILY))
    return path


# --------------------------------------------------------------------- plan --

def _dir_action(root, path):
    """The role's ``file: state=directory mode=0755 owner=root``: None when right or missing (apply_files creates it)."""
    try:
        st = os.stat(rooted(root, path))
    except OSError:
        return None
    if (st.st_mode & 0o7777) != 0o755 or (st.st_uid, st.st_gid) != (0, 0):
        return {"path": path, "action": "update", "reason": "directory mode %04o owner %d:%d, want 0755 root:root"
                % (st.st_mode & 0o7777, st.st_uid, st.st_gid)}
    return None


def _check_inputs(params):
    """Raise StateError on a mode that is not one of MODES, or a state_dir or policy_script that is not a safe absolute
    path (the one validator's path rule, run here too for callers without a module)."""
    mode = params["mode"]
    if mode not in MODES:
        raise StateError("mode %r: expected one of %s" % (mode, ", ".join(MODES)), option="mode", value=mode)
    for option in ("state_dir", "policy_script"):
        try:
            check_path(option, params[option] or "")
        except InputError as exc:
            raise StateError(str(exc), **exc.details)
        if not params[option]:
            raise StateError("%s %r: expected an absolute path" % (option, params[option]), option=option,
                             value=params[option], expected="an absolute path")


def _previous_lines(found, banned_marker):
    """The config lines banned mode replaced, from its marker (``{}`` without one); a damaged marker fails."""
    previous = found["banned"].get("previous", {}) if found["banned"] else {}
    if not isinstance(previous, dict) or any(v is not None and (not isinstance(v, str) or "\n" in v) for v in previous.values()):
        raise StateError("marker %s: previous is not a map of config lines: fix or remove it" % banned_marker,
                         path=banned_marker, value=previous)
    return previous


def _ban(params, root, config, applies, sysfs, run):
    """Banned mode's plan and the irqbalance facts it starts from; no CPU to ban fails where irqbalance runs."""
    state = read_irqbalance(root, run=run, sysfs=sysfs, config_file=config)
    try:
        ban = plan_ban(state, params["banned_cpus"], ban_isolated=params["ban_isolated"], banned_devices=params["banned_devices"])
    except IrqbalanceError as exc:
        raise StateError(str(exc), **exc.details)
    if applies and not ban["banned_cpulist"]:
        why = "the host has no isolated/nohz_full CPUs" if params["ban_isolated"] else "irqbalance_ban_isolated is false"
        raise StateError(
            "irqbalance_mode=banned needs CPUs to ban: irqbalance_banned_cpus is %s and %s. Expected a CPU list such "
            'as "4-7", or irqbalance_mode=disabled.' % (json.dumps(params["banned_cpus"]), why),
            option="banned_cpus", value=params["banned_cpus"], expected="a CPU list such as 4-7")
    return ban, state


def _check_plan(unit, found, mode, root, policy):
    """Fail before any write: a unit systemd does not know cannot be enabled, started or stopped, and a policy script
    path (``policy``: one the plan writes or removes, else None) must hold the module's own script or nothing (not
    /etc/passwd, not a link)."""
    if any(state is not None or enabled is not None for state, enabled, _m in unit) and \
            found["props"].get("LoadState", "not-found") == "not-found":
        raise StateError("Could not find the requested service %s: host (irqbalance_mode=%s)" % (UNIT, mode), value=UNIT)
    if policy is not None:
        try:
            check_own_file("policy_script", rooted(root, policy), POLICY_MARKER)
        except InputError as exc:
            raise StateError(str(exc), **exc.details)


def plan(params, root, found, sysfs=None, detect=None, run=None):
    """Decide everything for one pass. Raises StateError (before any change) on bad input.

    ``params``: mode, banned_cpus, ban_isolated, banned_devices, config_file,
    os_family, state_dir, policy_script. ``found`` is :func:`read_state`'s result;
    ``run`` (live systemd only) lets the banned-mode facts ask systemctl, as irqbalance_facts does.
    Returns files (for apply_files), actions (plan_files), dirs, the unit
    changes, restart rule, config_file, ban plan and facts.
    """
    mode, status = params["mode"], found["status"]
    _check_inputs(params)
    state_dir, policy = params["state_dir"], params["policy_script"]
    mask_marker, banned_marker = join(state_dir, MASK_MARKER), join(state_dir, BANNED_MARKER)
    previous = _previous_lines(found, banned_marker)
    undo_ban = bool(found["banned"])
    applies = status["installed"] or status["masked_by_role"] or undo_ban
    out = {"config_file": None, "ban": None, "facts": None, "unit": [], "restart": "never", "dirs": []}
    files, remove = {}, []

    config = None
    if mode == "banned" or undo_ban:
        config = config_path(params["config_file"], params["os_family"], detect)
        out["config_file"] = config
    if mode == "banned":
        out["ban"], out["facts"] = _ban(params, root, config, applies, sysfs, run)

    current = _read_bytes(rooted(root, config)) if config else None
    if not applies:
        out.update(files=files, actions=[], msg="irqbalance is not installed: nothing can move the pinned IRQs; mode %s needs no change" % mode)
        return out

    # Undo of banned mode (disabled, absent): the replaced lines back, the policy script and the marker away.
    if undo_ban and mode != "banned":
        if current is None and any(previous.values()):
            raise StateError("cannot put back the irqbalance config lines %s: %s does not exist" % (
                ", ".join(k for k, v in previous.items() if v), config), path=config)
        if current is not None:
            restored = restored_config(current, previous)
            if restored != current:
                files[config] = (restored, os.stat(rooted(root, config)).st_mode & 0o7777)
        remove += [policy, banned_marker]

    if mode == "disabled":
        if not status["masked"] and not status["masked_by_role"]:
            out["dirs"].append(state_dir)
            files[mask_marker] = (marker({"masked_by": MANAGED_BY, "previous": {"enabled": status["enabled"], "active": status["active"]}}), 0o644)
        out["unit"] = [("stopped", False, True)]
    elif mode == "absent":
        if status["masked_by_role"]:
            prev = found["mask"].get("previous", {}) if isinstance(found["mask"].get("previous"), dict) else {}
            if status["installed"]:
                out["unit"] = [("started" if prev.get("active") else None, bool(prev.get("enabled")), False)]
            else:
                out["unit"] = [(None, None, False)]
            remove.append(mask_marker)
        out["restart"] = "if-active"
    else:
        devices = out["ban"]["banned_devices"]
        keys = [CPULIST, CPUMASK] + ([ARGS] if devices else [])
        out["dirs"].append(state_dir)
        if not found["banned"]:
            files[banned_marker] = (marker({"managed_by": MANAGED_BY, "previous": found_lines(current or b"", keys)}), 0o644)
        if devices:
            out["dirs"].append(os.path.dirname(policy))
            files[policy] = (policy_script(devices).encode(), 0o755)
        files[config] = (banned_config(current or b"", out["ban"]["banned_cpulist"], devices, policy), 0o644)
        out["unit"] = [("started", True, False)]
        remove.append(mask_marker)
        out["restart"] = "always"

    _check_plan(out["unit"], found, mode, root, policy if policy in files or policy in remove else None)
    out["files"] = files
    out["actions"] = plan_files(files, remove, root)
    out["dir_actions"] = [a for a in (_dir_action(root, d) for d in out["dirs"]) if a]
    out["config_changed"] = any(a["action"] != "unchanged" and a["path"] in (config, policy) for a in out["actions"])
    return out


# -------------------------------------------------------------------- apply --

def converge_unit(unit, props, state=None, enabled=None, masked=None):
    """systemd_service's order: mask/unmask (from is-enabled), enablement (is-enabled read again, after the
    mask), then the state found by the first ``systemctl show``. Returns True when it started the unit."""
    if masked is not None and (unit.is_enabled()[1] == "masked") != masked:
        unit.do("mask" if masked else "unmask")
    if enabled is not None:
        rc, out = unit.is_enabled()
        now = rc == 0 and out in _ENABLED_RC0
        if now != enabled:
            unit.do("enable" if enabled else "disable")
    active = props.get("ActiveState", "")
    if state == "started" and active not in ("active", "activating"):
        unit.do("start")
        return True
    if state == "stopped" and active in ("active", "activating", "deactivating"):
        unit.do("stop")
    return False


def apply(decided, root, unit, found, check):
    """Write the files (not in check mode), then the unit changes and the restart (recorded in check mode or on a
    tree). The restart comes last, inside this run, so it precedes whatever the caller does next (pinning IRQs)."""
    if not check:
        for act in decided["dir_actions"]:
            path = rooted(root, act["path"])
            os.chmod(path, 0o755)
            if os.geteuid() == 0:
                os.chown(path, 0, 0)
        changed = [a for a in decided["actions"] if a["action"] != "unchanged"]
        try:
            apply_files(decided["files"], changed, root)
        except PersistError as exc:
            raise StateError(str(exc), **exc.details)
    started = False
    for state, enabled, masked in decided["unit"]:
        started = converge_unit(unit, found["props"], state=state, enabled=enabled, masked=masked) or started
    status = found["status"]
    restart = decided["config_changed"] and status["installed"] and not started and (
        decided["restart"] == "always" or (decided["restart"] == "if-active" and status["active"]))
    if restart:
        # systemd_service state=restarted: start a stopped unit, restart a running one.
        unit.do("restart" if props_running(found["props"]) else "start")
    return restart


def props_running(props):
    return props.get("ActiveState", "") in ("active", "activating")


def prepare(params, root, run, check, sysfs=None, detect=None):
    """Read and plan one pass; raises StateError (before any change) on bad input. :func:`finish` applies it."""
    unit = Unit(root, run, check)
    found = read_state(root, unit, params["state_dir"], binary=params.get("binary") or BINARY)
    decided = plan(params, root, found, sysfs=sysfs, detect=detect, run=run if unit.live else None)
    return {"params": params, "root": root, "unit": unit, "found": found, "decided": decided, "check": check}


def finish(prepared):
    """Apply a :func:`prepare`'d pass. Returns the module's result (without ``diff``) and the diff list."""
    params, root, unit, found, decided = (prepared[k] for k in ("params", "root", "unit", "found", "decided"))
    status = dict(found["status"], mode=params["mode"])
    result = {"status": status, "config_file": decided["config_file"], "systemd": [], "restarted": False, "files": []}
    if decided["ban"] is not None:
        result["plan"] = decided["ban"]
        result["ansible_facts"] = {"irqbalance": decided["facts"]}
    if "msg" in decided:
        result.update(changed=False, msg=decided["msg"])
        return result, []
    result["restarted"] = apply(decided, root, unit, found, prepared["check"])
    result["systemd"] = unit.actions
    result["files"] = [{k: a[k] for k in ("path", "action", "reason")} for a in decided["actions"] + decided["dir_actions"]]
    changes = [a for a in decided["actions"] if a["action"] != "unchanged"]
    result["changed"] = bool(changes or decided["dir_actions"] or unit.actions)
    diff = [{"before_header": a["path"], "after_header": a["path"] if a["action"] != "remove" else "(absent)",
             "before": a["before"], "after": a["after"]} for a in changes]
    return result, diff


def converge(params, root, run, check, sysfs=None, detect=None):
    """One pass: read, plan, apply. Returns the module's result (without ``diff``) and the diff list."""
    return finish(prepare(params, root, run, check, sysfs=sysfs, detect=detect))
