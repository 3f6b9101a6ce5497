#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_staging
short_description: Stage checkpoints on local storage and copy complete ones to shared storage without losing one
version_added: 0.4.0
description:
  - "Installs the checkpoint copier: the staging directory (owner, group, mode), the copier's configuration, the
    collection's own copier code as a small library with an entry point, and three systemd units: a oneshot
    C(gpunode-ckpt-copier.service), a C(.path) unit that starts it when the staging directory changes and a C(.timer)
    that starts it every O(interval) seconds and after boot (quiet-time completions, retries, copies a reboot
    interrupted)."
  - "The copier moves only complete checkpoints (O(completion)): into a partial name on the target, every file
    fsync'd, verified (O(verify)), renamed to its final name, the target directory fsync'd; only then is the staged
    copy removed. A sharded checkpoint (a directory) moves as a unit. Operations on the target run in a child killed
    when it makes no progress for O(op_timeout) seconds (a hung NFS mount), and a failed pass backs off from
    O(retry_min) to O(retry_max) seconds, logging the reason to the journal."
  - "Every value is checked before anything is written: a staging directory on the target's filesystem, a target
    that is not on a mounted filesystem, a percentage outside 0-100, or a completion rule that cannot be met fails
    naming the value, with nothing changed. Files are written all or nothing (rolled back on a failed write)."
  - "Returns the copier's status: what is staged, what was copied, the oldest checkpoint not yet durable and the
    last error. In check mode the same run is the exact plan, with C(--diff)."
author:
  - gpunode.tuning contributors (@gpunode)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The plan of files, the staging directory and systemd actions, exactly as a run would carry it out.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The configuration and unit files before and after (the library source is not shown).
options:
  state:
    description: V(present) installs and starts the copier; V(absent) stops it and removes what it installed (never
      the staging directory, the checkpoints or the state file).
    type: str
    choices: [present, absent]
    default: present
  staging_dir:
    description: The staging directory on local storage (local NVMe). Required with O(state=present).
    type: path
  staging_owner:
    description: Owner of the staging directory (a user name or uid).
    type: str
    default: root
  staging_group:
    description: Group of the staging directory (a group name or gid).
    type: str
    default: root
  staging_mode:
    description: Mode of the staging directory, octal.
    type: str
    default: "0750"
  target_dir:
    description: The durable directory on shared storage (an NFS mount). Required with O(state=present).
    type: path
  completion:
    description:
      - When a staged entry is complete. V(rename) (the copier's default) - its name does not match O(temp_patterns)
        (the trainer writes under a temporary name and renames). V(marker) - C(<name><marker_suffix>) exists.
        V(quiescent) - no process holds a file of it open and nothing in it changed for O(quiet_seconds).
      - A name matching O(temp_patterns) is never complete, whatever the rule.
    type: str
    choices: [rename, marker, quiescent]
  temp_patterns:
    description: fnmatch patterns of temporary names (default C(*.tmp), C(*.partial), C(*.incomplete), C(.*)).
    type: list
    elements: str
  marker_suffix:
    description: The marker's suffix for O(completion=marker) (default C(.done)).
    type: str
  quiet_seconds:
    description: Seconds without change for O(completion=quiescent) (default 60).
    type: int
  verify:
    description: V(sha256) reads the target back past the page cache and compares checksums (the default);
      V(size_mtime) compares size and mtime of the fsync'd copy (for checkpoints too large to read twice).
    type: str
    choices: [sha256, size_mtime]
  op_timeout:
    description: Seconds an operation on the target (a copy, its read-back, the probe) may go without progress - no
      4 MiB chunk written or read back, no 64 MiB flush completed - before it is killed (default 120). A copy that
      keeps moving is never cut off, however large the checkpoint.
    type: int
  retry_min:
    description: First wait in seconds after a failed copy (default 10); doubled on each failure.
    type: int
  retry_max:
    description: Longest wait in seconds between retries (default 600).
    type: int
  watermark_percent:
    description: Usage of the staging filesystem, in percent, above which the copier warns in the journal (default 80).
    type: int
  pause_file:
    description: A flag file the copier creates while usage is above O(watermark_percent) and removes below it, for
      the trainer to poll and pause checkpointing.
    type: path
  interval:
    description: Seconds between timer-started passes (retries, quiet-time completions).
    type: int
    default: 30
  timeout:
    description: TimeoutStartSec of one service run, seconds.
    type: int
    default: 3600
  config_file:
    description: The copier's configuration (JSON).
    type: path
    default: /etc/gpunode/ckpt-copier.json
  state_file:
    description: The copier's state (counts, history, last error, backoff).
    type: path
    default: /var/lib/gpunode-ckpt/state.json
  lib_dir:
    description: Where the copier's library is installed (not shared with other entry points).
    type: path
    default: /usr/local/lib/gpunode-ckpt-copier
  entry_point:
    description: The copier's command.
    type: path
    default: /usr/local/sbin/gpunode-ckpt-copier
  python:
    description: The interpreter of the entry point.
    type: path
    default: /usr/bin/python3
  mountinfo_path:
    description: The mount table read for the placement checks (a captured one in tests). The copier reads the
      same table before each pass and copies only while O(target_dir) is on the mount found here (same mount point,
      filesystem type and source).
    type: path
    default: /proc/self/mountinfo
notes:
  - The staging directory's content is never changed by the module; only the copier moves checkpoints.
seealso:
  - name: The checkpoint_staging role
    description: Applies this module from inventory variables.
    link: https://github.com/gpunode/tuning/tree/main/roles/checkpoint_staging
"""

EXAMPLES = r"""
- name: Stage checkpoints on local NVMe, copy complete ones to NFS
  gpunode.tuning.checkpoint_staging:
    staging_dir: /mnt/nvme/ckpt
    staging_owner: trainer
    target_dir: /mnt/nfs/ckpt
    completion: marker
    watermark_percent: 70
    pause_file: /run/gpunode-ckpt-pause
"""

RETURN = r"""
staging:
  description: The staging directory's action (V(create), V(update) with the reason, V(unchanged)).
  returned: state is present
  type: dict
files:
  description: Each installed file with its action (V(create), V(update), V(remove), V(unchanged)) and the reason.
  returned: always
  type: list
  elements: dict
systemd:
  description: The systemd actions run (in check mode, that would run).
  returned: always
  type: list
  elements: str
config:
  description: The copier's configuration with its defaults filled in.
  returned: state is present
  type: dict
placement:
  description: The target's mount point, filesystem type and source, and the staging directory's mount point.
  returned: state is present
  type: dict
copier_status:
  description: What is staged, what was copied, the oldest checkpoint not yet durable, the last error.
  returned: state is present and the staging directory exists
  type: dict
drift:
  description: One line per difference from the desired state (empty when converged).
  returned: always
  type: list
  elements: str
"""

import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule

# Imported so that AnsiballZ ships the copier's command line (and its import closure) with this module: the
# library installed on the node is built from those files (_persist.library_files).
from ansible_collections.gpunode.tuning.plugins.module_utils._ckpt_cli import main as _copier_main  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils._ckpt_copier import CopierError, check_config, check_placement, status
from ansible_collections.gpunode.tuning.plugins.module_utils._ckpt_install import (
    TRIGGERS, UNIT_DIR, UNITS, apply_staging, render, staging_plan)
from ansible_collections.gpunode.tuning.plugins.module_utils._fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._persist import (
    MANIFEST, PersistError, apply_files, bytecode_of, installed_library, plan_files, systemctl_show)

COPIER_KEYS = ("completion", "temp_patterns", "marker_suffix", "quiet_seconds", "verify", "op_timeout", "retry_min",
               "retry_max", "watermark_percent", "pause_file", "state_file")

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    staging_dir=dict(type="path"),
    staging_owner=dict(type="str", default="root"),
    staging_group=dict(type="str", default="root"),
    staging_mode=dict(type="str", default="0750"),
    target_dir=dict(type="path"),
    completion=dict(type="str", choices=["rename", "marker", "quiescent"]),
    temp_patterns=dict(type="list", elements="str"),
    marker_suffix=dict(type="str"),
    quiet_seconds=dict(type="int"),
    verify=dict(type="str", choices=["sha256", "size_mtime"]),
    op_timeout=dict(type="int"),
    retry_min=dict(type="int"),
    retry_max=dict(type="int"),
    watermark_percent=dict(type="int"),
    pause_file=dict(type="path"),
    interval=dict(type="int", default=30),
    timeout=dict(type="int", default=3600),
    config_file=dict(type="path", default="/etc/gpunode/ckpt-copier.json"),
    state_file=dict(type="path", default="/var/lib/gpunode-ckpt/state.json"),
    lib_dir=dict(type="path", default="/usr/local/lib/gpunode-ckpt-copier"),
    entry_point=dict(type="path", default="/usr/local/sbin/gpunode-ckpt-copier"),
    python=dict(type="path", default="/usr/bin/python3"),
    mountinfo_path=dict(type="path", default="/proc/self/mountinfo"),
)


def _ident(module, value, db, option):
    """A user or group name (or a number) as its id, failing naming the value."""
    if value.isdigit():
        return int(value)
    try:
        return (db.getpwnam if db is pwd else db.getgrnam)(value)[2]
    except KeyError:
        module.fail_json(msg="%s %r does not exist on this host" % (option, value), option=option, value=value,
                         expected="an existing %s name or a numeric id" % ("user" if db is pwd else "group"), changed=False)
    return None


def _mode(module, text):
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        module.fail_json(msg="staging_mode %r is not an octal mode" % text, option="staging_mode", value=text,
                         expected="an octal mode such as 0750", changed=False)
    return mode


class Systemd(object):
    """systemctl through the module; in check mode only records."""

    def __init__(self, module):
        self.module, self.actions = module, []
        self.systemctl = module.get_bin_path("systemctl")

    def states(self):
        if self.systemctl is None:
            return dict((u, {}) for u in TRIGGERS)
        rc, out, _err = self.module.run_command([self.systemctl, "show", "--property=UnitFileState",
                                                 "--property=ActiveState"] + list(TRIGGERS))
        if rc != 0:
            return dict((u, {}) for u in TRIGGERS)
        return dict(zip(TRIGGERS, systemctl_show(out)))

    def do(self, argv, label):
        self.actions.append(label)
        if not self.module.check_mode:
            if self.systemctl is None:
                self.module.fail_json(msg="systemctl not found: the copier runs under systemd", changed=True,
                                      systemd=self.actions)
            rc, _out, err = self.module.run_command([self.systemctl] + argv[1:])
            if rc != 0:
                self.module.fail_json(msg="%s failed: %s" % (" ".join(argv), err.strip()), changed=True,
                                      systemd=self.actions)


def _settings(params):
    return dict((k, params[k]) for k in ("config_file", "lib_dir", "entry_point", "python", "interval", "timeout"))


def _owned(params):
    lib = params["lib_dir"].rstrip("/")
    library = installed_library(lib)
    return ([params["entry_point"], params["config_file"]] + ["%s/%s" % (UNIT_DIR, u) for u in UNITS]
            + library + bytecode_of(library) + ["%s/%s" % (lib, MANIFEST)])


def _present(module, params):
    for key in ("staging_dir", "target_dir"):
        if not params[key]:
            module.fail_json(msg="%s is required with state=present" % key, option=key, value=None,
                             expected="an absolute directory path", changed=False)
    for key in ("interval", "timeout"):
        if params[key] < 1:
            module.fail_json(msg="%s %d is not a positive number of seconds" % (key, params[key]), option=key,
                             value=params[key], expected="seconds, at least 1", changed=False)
    raw = dict((k, params[k]) for k in COPIER_KEYS if params[k] is not None)
    raw.update(staging_dir=params["staging_dir"], target_dir=params["target_dir"])
    cfg = check_config(raw)
    try:
        with open(params["mountinfo_path"], "r", encoding="utf-8") as handle:
            placement = check_placement(cfg, handle.read())
    except OSError as exc:
        module.fail_json(msg="mountinfo_path %s cannot be read: %s" % (params["mountinfo_path"], exc.strerror),
                         option="mountinfo_path", value=params["mountinfo_path"], expected="a readable mount table",
                         changed=False)
    # Every copier pass checks that the target is still on this mount (an NFS mount that went away leaves an empty
    # local directory, which must never count as durable).
    cfg["target_mount"] = {"point": placement["target_mount"], "fstype": placement["target_fstype"],
                           "source": placement["target_source"]}
    cfg["mountinfo_path"] = params["mountinfo_path"]
    uid = _ident(module, params["staging_owner"], pwd, "staging_owner")
    gid = _ident(module, params["staging_group"], grp, "staging_group")
    staging = staging_plan(cfg["staging_dir"], _mode(module, params["staging_mode"]), uid, gid)
    if staging["action"] == "error":
        module.fail_json(msg="staging_dir %s %s" % (cfg["staging_dir"], staging["reason"]), option="staging_dir",
                         value=cfg["staging_dir"], expected="a directory (or a path to create one at)", changed=False)
    files = render(cfg, _settings(params))
    # Present: remove only library files no longer shipped (with their bytecode); the bytecode Python writes for
    # the files still installed is not drift.
    gone = [p for p in installed_library(params["lib_dir"].rstrip("/")) if p not in files]
    actions = plan_files(files, remove=gone + bytecode_of(gone), diff_skip=(params["lib_dir"].rstrip("/") + "/",))
    changed_files = [a for a in actions if a["action"] != "unchanged"]
    systemd = Systemd(module)
    states = systemd.states()
    drift = ["%s %s (%s)" % (a["action"], a["path"], a["reason"]) for a in changed_files]
    if staging["action"] != "unchanged":
        drift.append("%s staging directory %s (%s)" % (staging["action"], staging["path"], staging["reason"]))
    if not module.check_mode:
        apply_staging(staging)
        try:
            apply_files(files, changed_files, prune_within=params["lib_dir"].rstrip("/"))
        except PersistError:
            if staging["action"] == "create":
                os.rmdir(staging["path"])  # created empty by this run: rolled back with the files
            raise
    if any(a["path"].startswith(UNIT_DIR + "/") for a in changed_files):
        systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
    for unit in TRIGGERS:
        state = states.get(unit, {})
        if state.get("UnitFileState") != "enabled" or state.get("ActiveState") != "active":
            systemd.do(["systemctl", "enable", "--now", unit], "enable --now %s" % unit)
            drift.append("start %s (%s, %s)" % (unit, state.get("UnitFileState", "?"), state.get("ActiveState", "?")))
        elif any(a["path"].endswith("/" + unit) for a in changed_files):
            systemd.do(["systemctl", "restart", unit], "restart %s" % unit)
    result = {"changed": bool(drift), "staging": staging, "files": _brief(actions), "systemd": systemd.actions,
              "config": cfg, "placement": placement, "drift": drift}
    if os.path.isdir(cfg["staging_dir"]):
        result["copier_status"] = status(cfg)
    return result, _diff(changed_files)


def _absent(module, params):
    actions = plan_files({}, remove=_owned(params), diff_skip=(params["lib_dir"].rstrip("/") + "/",))
    systemd = Systemd(module)
    states = systemd.states()
    drift = []
    for unit in TRIGGERS:
        if states.get(unit, {}).get("UnitFileState") not in (None, "", "not-found"):
            systemd.do(["systemctl", "disable", "--now", unit], "disable --now %s" % unit)
            drift.append("stop %s" % unit)
    drift += ["remove %s" % a["path"] for a in actions]
    if not module.check_mode:
        apply_files({}, actions, prune_within=params["lib_dir"].rstrip("/"))
    if any(a["path"].startswith(UNIT_DIR + "/") for a in actions):
        systemd.do(["systemctl", "daemon-reload"], "daemon-reload")
    return {"changed": bool(drift), "files": _brief(actions), "systemd": systemd.actions, "drift": drift}, _diff(actions)


def _brief(actions):
    return [dict((k, a[k]) for k in ("path", "action", "reason", "mode")) for a in actions]


def _diff(actions):
    return [{"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]}
            for a in actions if a["before"] or a["after"]]


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        if params["state"] == "absent":
            result, diff = _absent(module, params)
        else:
            result, diff = _present(module, params)
    except (CopierError, PersistError) as exc:
        details = dict(exc.details)
        details.setdefault("changed", False)
        module.fail_json(msg=str(exc), **details)
    exit_with(module, result, diff)


if __name__ == "__main__":
    main()
