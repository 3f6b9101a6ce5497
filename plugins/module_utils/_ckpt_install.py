# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the checkpoint_staging module installs on a node: the copier's library, entry point, configuration and
systemd units (a oneshot service started by a path unit on the staging directory and by a timer).

Standard library only. The files are written with :mod:`_persist`'s all-or-nothing writer; the library is the
import closure of ``_ckpt_cli`` (the copier that runs is the collection's own code).
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._persist import MANIFEST, library_files

SERVICE = "gpunode-ckpt-copier.service"
PATH_UNIT = "gpunode-ckpt-copier.path"
TIMER = "gpunode-ckpt-copier.timer"
UNITS = (SERVICE, PATH_UNIT, TIMER)
TRIGGERS = (PATH_UNIT, TIMER)
UNIT_DIR = "/etc/systemd/system"
HEADER = "Managed by gpunode.tuning (checkpoint_staging role and module): local changes are overwritten."


def _comment(text):
    return "".join("# %s\n" % line if line else "#\n" for line in text.splitlines())


def entry_point(python, lib_dir):
    return (
        "#!%s\n%s" % (python, _comment(HEADER))
        + '"""Move complete checkpoints from staging to shared storage (gpunode.tuning checkpoint copier).\n\n'
        "The code is the collection's own module_utils (_ckpt_copier), installed under %s.\n\n"
        "Usage: gpunode-ckpt-copier [--status] [--force] [--deadline SECONDS] CONFIG\n"
        '"""\n' % lib_dir
        + "import sys\n\nsys.path.insert(0, %s)\n\n" % json.dumps(lib_dir)
        + "from ansible_collections.gpunode.tuning.plugins.module_utils._ckpt_cli import main  # noqa: E402\n\n"
        + 'if __name__ == "__main__":\n    sys.exit(main())\n'
    )


def service_unit(entry, config_file, timeout):
    return (
        _comment(HEADER)
        + "# One copier pass (more while entries are complete): started by %s when\n" % PATH_UNIT
        + "# the staging directory changes and by %s (quiet periods, retries).\n" % TIMER
        + "# Every operation on the target runs in a child killed after op_timeout, so a hung\n"
        + "# NFS mount ends the pass with a logged retry instead of hanging it.\n"
        + "[Unit]\nDescription=Copy complete checkpoints from staging to shared storage (gpunode.tuning)\n"
        + "Documentation=file:%s\n" % config_file
        + "ConditionPathExists=%s\n" % config_file
        + "After=local-fs.target remote-fs.target network-online.target\n\n"
        + "[Service]\nType=oneshot\n"
        + "ExecStart=%s --deadline %d %s\n" % (entry, max(30, timeout - 30), config_file)
        + "TimeoutStartSec=%d\n" % timeout
        + "# Background work: it must not take CPU or disk time from the training job.\n"
        + "Nice=10\nIOSchedulingClass=idle\n"
        + "StandardOutput=journal\nStandardError=journal\nSyslogIdentifier=gpunode-ckpt-copier\n"
    )


def path_unit(staging_dir):
    return (
        _comment(HEADER)
        + "# Starts the copier when an entry of the staging directory is created, renamed or closed after writing.\n"
        + "[Unit]\nDescription=Watch the checkpoint staging directory %s (gpunode.tuning)\n\n" % staging_dir
        + "[Path]\nPathChanged=%s\nUnit=%s\n\n" % (staging_dir, SERVICE)
        + "[Install]\nWantedBy=multi-user.target\n"
    )


def timer_unit(interval):
    return (
        _comment(HEADER)
        + "# Starts the copier every %d s and after boot: quiet-time completions, retries\n" % interval
        + "# after an outage (the pass itself honours the backoff), copies interrupted by a reboot.\n"
        + "[Unit]\nDescription=Retry and resume checkpoint copies every %d s (gpunode.tuning)\n\n" % interval
        + "[Timer]\nOnBootSec=%d\nOnUnitInactiveSec=%d\nAccuracySec=1s\nUnit=%s\n\n" % (interval, interval, SERVICE)
        + "[Install]\nWantedBy=timers.target\n"
    )


def render(cfg, settings):
    """{absolute path: (bytes, mode)} of everything a present state installs.

    ``settings``: config_file, lib_dir, entry_point, python, interval, timeout.
    """
    entry, config_file = settings["entry_point"], settings["config_file"]
    files = {
        entry: (entry_point(settings["python"], settings["lib_dir"]).encode(), 0o755),
        config_file: ((json.dumps(cfg, indent=1, sort_keys=True) + "\n").encode(), 0o644),
        "%s/%s" % (UNIT_DIR, SERVICE): (service_unit(entry, config_file, settings["timeout"]).encode(), 0o644),
        "%s/%s" % (UNIT_DIR, PATH_UNIT): (path_unit(cfg["staging_dir"]).encode(), 0o644),
        "%s/%s" % (UNIT_DIR, TIMER): (timer_unit(settings["interval"]).encode(), 0o644),
    }
    lib = settings["lib_dir"].rstrip("/")
    library = library_files("_ckpt_cli")
    for rel, data in library.items():
        files["%s/%s" % (lib, rel)] = (data, 0o644)
    files["%s/%s" % (lib, MANIFEST)] = ((json.dumps(sorted(library), indent=1) + "\n").encode(), 0o644)
    return files


def staging_plan(path, mode, uid, gid):
    """The staging directory's action: create, update (mode/owner, named) or unchanged; never its content."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"path": path, "action": "create", "reason": "missing", "mode": "%04o" % mode, "owner": [uid, gid]}
    if not os.path.isdir(path) or os.path.islink(path):
        return {"path": path, "action": "error", "reason": "exists and is not a directory", "mode": "%04o" % mode,
                "owner": [uid, gid]}
    reasons = []
    if st.st_mode & 0o7777 != mode:
        reasons.append("mode %04o, want %04o" % (st.st_mode & 0o7777, mode))
    if (st.st_uid, st.st_gid) != (uid, gid):
        reasons.append("owner %d:%d, want %d:%d" % (st.st_uid, st.st_gid, uid, gid))
    return {"path": path, "action": "update" if reasons else "unchanged", "reason": "; ".join(reasons),
            "mode": "%04o" % mode, "owner": [uid, gid]}


def apply_staging(plan):
    if plan["action"] == "create":
        os.makedirs(plan["path"], mode=0o700)
    if plan["action"] in ("create", "update"):
        os.chown(plan["path"], plan["owner"][0], plan["owner"][1])
        os.chmod(plan["path"], int(plan["mode"], 8))
