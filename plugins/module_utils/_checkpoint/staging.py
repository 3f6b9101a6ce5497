# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint_staging module's cycle: read the node, plan the staging directory, files and units, apply them
all or nothing, roll back.

Standard library only; the module is its options, its documentation and :func:`converge`. Every check runs before
the first write (config, placement on the mounts, the owner, the staging directory, files that are not the
module's, systemctl, the interpreter); a failed step puts back the files (:func:`_host.files.rollback_files`), the
staging directory (:func:`_checkpoint.install.undo_staging`) and what systemd started
(:meth:`_host.systemd.Systemd.roll_back`). Errors are :class:`_checkpoint.install.InstallError` naming the option,
the value and what was expected.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import check_config, check_placement
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.install import (
    HEADER, TRIGGERS, UNITS, InstallError, apply_staging, check_path, read_mountinfo, render, service_user,
    staging_plan, undo_staging, writable)
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.state import status
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import PersistError, apply_files, plan_files, rollback_files
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import MANIFEST, bytecode_of, installed_library
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import SystemdError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file

COPIER_KEYS = ("completion", "temp_patterns", "marker_suffix", "quiet_seconds", "verify", "op_timeout", "retry_min",
               "retry_max", "watermark_percent", "pause_file", "state_file", "on_conflict", "quarantine_after",
               "kill_grace")

# The copier's interpreter must run the collection's module_utils (from __future__ import annotations).
PYTHON_MIN = (3, 7)


def _mode(text):
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise InstallError("staging_mode %r is not an octal mode" % text, option="staging_mode", value=text,
                           expected="an octal mode such as 0750")
    return mode


def _systemd(target, state):
    """The one systemd wrapper, found before anything is written: a node without systemctl fails with nothing
    changed."""
    if target.which("systemctl") is None:
        raise InstallError("systemctl not found: the copier runs under systemd (nothing was changed)", option="state",
                           value=state, expected="a node that runs systemd")
    return target.systemd(error=SystemdError)


def _check_python(target, python):
    """The entry point's interpreter exists, is executable and runs the copier's code (before anything is written)."""
    expected = "the path of a Python %d.%d+ interpreter on the node" % PYTHON_MIN
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise InstallError("python %s is not an executable file" % python, option="python", value=python,
                           expected=expected)
    rc, out, err = target.call([python, "-I", "-c", "import sys; raise SystemExit(0 if sys.version_info >= %r else 3)"
                                % (PYTHON_MIN,)])
    if rc != 0:
        said = (err or out).strip()[:200]
        why = "exit status %d%s" % (rc, ": " + said if said else "")
        raise InstallError("python %s cannot run the copier (%s)" % (python, why), option="python", value=python,
                           expected=expected)


def _settings(params, user, access):
    keys = ("config_file", "lib_dir", "entry_point", "python", "interval", "timeout", "unit_dir")
    settings = dict((k, params[k]) for k in keys)
    settings.update(user=user, access=access)
    return settings


def _owned(params):
    lib = params["lib_dir"].rstrip("/")
    library = installed_library(lib)
    return ([params["entry_point"], params["config_file"]] + ["%s/%s" % (params["unit_dir"], u) for u in UNITS]
            + library + bytecode_of(library) + ["%s/%s" % (lib, MANIFEST)])


def _required(params):
    for key in ("staging_dir", "target_dir"):
        if not params[key]:
            raise InstallError("%s is required with state=present" % key, option=key, value=None,
                               expected="an absolute directory path")
    for key in ("interval", "timeout"):
        if params[key] < 1:
            raise InstallError("%s %d is not a positive number of seconds" % (key, params[key]), option=key,
                               value=params[key], expected="seconds, at least 1")


def _copier_config(params):
    """The copier's configuration, checked, and where it found the staging directory and the target mounted."""
    raw = dict((k, params[k]) for k in COPIER_KEYS if params[k] is not None)
    raw.update(staging_dir=params["staging_dir"], target_dir=params["target_dir"])
    cfg = check_config(raw)
    placement = check_placement(cfg, read_mountinfo(check_path("mountinfo_path", params["mountinfo_path"])))
    # Every copier pass checks that the target is still on this mount (an NFS mount that went away leaves an empty
    # local directory, which must never count as durable).
    cfg["target_mount"] = {"point": placement["target_mount"], "fstype": placement["target_fstype"],
                           "source": placement["target_source"]}
    cfg["mountinfo_path"] = params["mountinfo_path"]
    return cfg, placement


def _steps(changed_files, states, unit_dir, drift):
    """The systemctl steps that make the files effective, each with the steps that take it back (appending to
    ``drift`` the units that must start)."""
    steps = []
    if any(a["path"].startswith(unit_dir + "/") for a in changed_files):
        steps.append((["systemctl", "daemon-reload"], []))
    for unit in TRIGGERS:
        state = states.get(unit, {})
        if state.get("UnitFileState") != "enabled" or state.get("ActiveState") != "active":
            steps.append((["systemctl", "enable", "--now", unit], [["systemctl", "disable", "--now", unit]]))
            drift.append("start %s (%s, %s)" % (unit, state.get("UnitFileState", "?"), state.get("ActiveState", "?")))
        elif any(a["path"].endswith("/" + unit) for a in changed_files):
            steps.append((["systemctl", "restart", unit], []))
    return steps


def present(params, target):
    """state=present: every input checked, then the plan; applied unless in check mode. Returns (result, diff)."""
    _required(params)
    cfg, placement = _copier_config(params)
    # The copier runs as the staging directory's owner and group (never root by default): resolved here, names
    # in the unit. No default owner: the only user every node has is root.
    if not params["staging_owner"]:
        raise InstallError("staging_owner is required with state=present: the copier runs as the staging "
                           "directory's owner, the training job's user", option="staging_owner", value=None,
                           expected="the training job's (non-root) user")
    user = service_user(params["staging_owner"], params["staging_group"], params["allow_root_copier"])
    staging = staging_plan(cfg["staging_dir"], _mode(params["staging_mode"]), user["uid"], user["gid"])
    if staging["action"] == "error":
        raise InstallError("staging_dir %s %s" % (cfg["staging_dir"], staging["reason"]), option="staging_dir",
                           value=cfg["staging_dir"], expected="a directory (or a path to create one at)")
    # What the sandboxed service may write: every path the copier writes must be in it (state_file, pause_file).
    files = render(cfg, _settings(params, user, writable(cfg)))
    _own_files(files, params)
    # Every tool the run needs, before the first write.
    systemd = _systemd(target, params["state"])
    _check_python(target, params["python"])
    # Present: remove only library files no longer shipped (with their bytecode); the bytecode Python writes for
    # the files still installed is not drift.
    lib = params["lib_dir"].rstrip("/")
    gone = [p for p in installed_library(lib) if p not in files]
    actions = plan_files(files, remove=gone + bytecode_of(gone), diff_skip=(lib + "/",))
    changed_files = [a for a in actions if a["action"] != "unchanged"]
    drift = ["%s %s (%s)" % (a["action"], a["path"], a["reason"]) for a in changed_files]
    if staging["action"] != "unchanged":
        drift.append("%s staging directory %s (%s)" % (staging["action"], staging["path"], staging["reason"]))
    steps = _steps(changed_files, systemd.show(TRIGGERS), params["unit_dir"].rstrip("/"), drift)
    if target.check:
        for argv, _undo in steps:
            systemd.do(argv)
    else:
        _apply(staging, files, changed_files, params, systemd, steps)
    result = {"changed": bool(drift), "staging": staging, "files": _brief(actions), "systemd": systemd.actions,
              "config": cfg, "placement": placement, "drift": drift,
              "service_user": {"user": user["user"], "group": user["group"]}}
    if os.path.isdir(cfg["staging_dir"]):
        result["copier_status"] = status(cfg)
    return result, _diff(changed_files)


def _apply(staging, files, changed_files, params, systemd, steps):
    """Staging directory, files, systemd: all or nothing. A failed step puts back the files (content, mode, owner;
    a file the run created is removed), the staging directory's mode and owner (one the run created is removed)
    and stops what the run started."""
    try:
        undo = apply_staging(staging)
    except OSError as exc:
        raise InstallError("staging_dir %s could not be set up: %s (nothing was changed)" % (staging["path"], exc),
                           option="staging_dir", value=staging["path"], expected="a directory this run can create "
                           "and give to staging_owner")
    try:
        undo_files = apply_files(files, changed_files, prune_within=params["lib_dir"].rstrip("/"))
    except PersistError as exc:
        problems = undo_staging(undo, staging["path"])  # the files are already put back by apply_files
        details = dict(exc.details)
        details["rollback_failed"] = list(details.get("rollback_failed") or []) + problems
        details["changed"] = bool(details["rollback_failed"])
        raise PersistError("%s; staging directory %s" % (exc, "put back" if not problems else "not put back"),
                           **details)
    try:
        for argv, take_back in steps:
            systemd.do(argv, undo=take_back)
    except SystemdError as exc:
        back = {}
        reload_units = any(a["path"].startswith(params["unit_dir"].rstrip("/") + "/") for a in changed_files)
        systemd.roll_back(lambda: back.update(rollback_files(undo_files)), reload_units=reload_units)
        problems = back.get("failed", []) + undo_staging(undo, staging["path"])
        raise InstallError("%s; %s" % (exc, "every file and the staging directory were put back" if not problems
                                       else "could not put back %s" % ", ".join(problems)),
                           systemd=systemd.actions, rollback_failed=problems, changed=bool(problems))


def absent(params, target):
    """state=absent: stop the units, remove every file of the module's. Returns (result, diff)."""
    lib = params["lib_dir"].rstrip("/")
    actions = plan_files({}, remove=_owned(params), diff_skip=(lib + "/",))
    systemd = _systemd(target, params["state"])
    states = systemd.show(TRIGGERS)
    drift, removed = [], False
    try:
        for unit in TRIGGERS:
            if states.get(unit, {}).get("UnitFileState") not in (None, "", "not-found"):
                systemd.do(["systemctl", "disable", "--now", unit])
                drift.append("stop %s" % unit)
        drift += ["remove %s" % a["path"] for a in actions]
        if not target.check:
            apply_files({}, actions, prune_within=lib)
            removed = bool(actions)
        if any(a["path"].startswith(params["unit_dir"].rstrip("/") + "/") for a in actions):
            systemd.do(["systemctl", "daemon-reload"])
    except SystemdError as exc:
        # Absent takes things away: what was stopped or removed before the failure stays so (run it again).
        raise InstallError(str(exc), systemd=systemd.actions, changed=removed or len(systemd.actions) > 1)
    return {"changed": bool(drift), "files": _brief(actions), "systemd": systemd.actions, "drift": drift}, _diff(actions)


def _brief(actions):
    return [dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions]


def _diff(actions):
    return [{"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]}
            for a in actions if a["before"] or a["after"]]


def _is_config(data):
    """Whether ``data`` is a copier config this module wrote (a JSON object naming staging_dir and target_dir)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(parsed, dict) and "staging_dir" in parsed and "target_dir" in parsed


def _own_files(files, params):
    """Refuse to overwrite what is not this module's (issue 27): at the entry point, the config file or a unit, a
    file without the module's header (the config: not its JSON), a symlink or a non-regular file. The library under
    lib_dir is known by its manifest."""
    lib = params["lib_dir"].rstrip("/") + "/"
    names = {params["entry_point"]: "entry_point", params["config_file"]: "config_file"}
    for path in sorted(p for p in files if not p.startswith(lib)):
        try:
            check_own_file(names.get(path, "unit_dir"), path, _is_config if path == params["config_file"] else HEADER)
        except InputError as exc:
            raise InstallError(str(exc), path=path, **exc.details)


def converge(params, target):
    """One run of the module: ``params`` as its options, ``target`` the live node (:class:`_host.target.Target`)."""
    return absent(params, target) if params["state"] == "absent" else present(params, target)
