# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the checkpoint_staging module installs on a node: the copier's library, entry point, configuration and
systemd units (a oneshot service started by a path unit on the staging directory and by a timer).

The copier reads files that an unprivileged training job writes, so it never runs as root: the service runs as
the staging directory's owner and group (:func:`service_user`), inside systemd's sandbox (:data:`SANDBOX`), and
can write only the staging directory, the target's mount, its state directory (``StateDirectory=``, derived from
``state_file``) and, for a ``pause_file`` under ``/run``, its runtime directory (:func:`writable`).

Standard library only. The files are written with :mod:`_host.files`'s all-or-nothing writer; the library is the
import closure of ``_checkpoint.cli`` (the copier that runs is the collection's own code). :func:`apply_staging` and
:func:`undo_staging` put the staging directory back when a later step fails (the files: the file engine's own
rollback, :func:`_host.files.rollback_files`).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, is_valid
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import check_path as validate_path
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import MANIFEST, library_files

SERVICE = "gpunode-ckpt-copier.service"
PATH_UNIT = "gpunode-ckpt-copier.path"
TIMER = "gpunode-ckpt-copier.timer"
UNITS = (SERVICE, PATH_UNIT, TIMER)
TRIGGERS = (PATH_UNIT, TIMER)
UNIT_DIR = "/etc/systemd/system"
HEADER = "Managed by gpunode.tuning (checkpoint_staging role and module): local changes are overwritten."
STATE_ROOT = "/var/lib"
RUNTIME_ROOT = "/run"
# Where ProtectHome= hides or protects: a path of the unit under one of them needs ProtectHome=read-only (a
# ReadWritePaths= entry stays reachable and writable), otherwise ProtectHome=yes.
HOME_ROOTS = ("/home", "/root", "/run/user")
MOUNTINFO_MAX = 16 * 1024 * 1024
# A path that goes into a unit file, a shebang or the entry point: absolute, normalised, and without what systemd
# or a shell would read otherwise (whitespace splits ReadWritePaths= and ExecStart=, % is a systemd specifier,
# quotes and backslashes are unit-file quoting, control characters end the line).
# A user or group name as systemd's User=/Group= take it (and as useradd makes it); no name that is all digits.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,255}\Z")
NUMERIC = re.compile(r"[0-9]{1,10}\Z")
# The sandbox of the copier's service: systemd-analyze security --offline=yes scores the unit (see the role's
# README for the score). Every directive was checked against what the copier does: it forks children (op_timeout),
# takes flock locks, fsyncs, reads statvfs, /proc/self/mountinfo and, for completion=quiescent, /proc/*/fd of its
# own user's processes (other users' are unreadable to a non-root copier anyway, with or without ProtectProc=); it
# opens no socket (stdout is the journal's stream, connected by systemd) and needs no capability.
SANDBOX = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("DevicePolicy", "closed"),
    ("PrivateNetwork", "yes"),
    ("PrivateMounts", "yes"),
    ("IPAddressDeny", "any"),
    ("RestrictAddressFamilies", "AF_UNIX"),
    ("RestrictSUIDSGID", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("ProcSubset", "pid"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("RemoveIPC", "yes"),
    ("KeyringMode", "private"),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged @resources"),
    ("SystemCallErrorNumber", "EPERM"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    # Files the copier creates get their mode from the staged file (copystat); the rest (the pause file, partial
    # names before their mode is set) stays readable to the group, the job's readers, and to no one else.
    ("UMask", "0027"),
)


class InstallError(DetailedError):
    """A value the installed copier could not run with; ``details`` name the option, the value and what was expected."""


def _inside(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def check_path(option, value, expected=None):
    """``value`` if it can go into a unit file, a shebang or the entry point as it is (the collection's one path
    rule, _validate.check_path); InstallError naming it."""
    try:
        if not isinstance(value, str) or not value or os.path.normpath(value) != value:
            raise InputError("not a normalised path", option=option, value=value)
        validate_path(option, value)
    except InputError as exc:
        raise InstallError("%s %r cannot go into the copier's unit and entry point: %s" % (option, value, exc),
                           option=option, value=value,
                           expected=expected or exc.details.get("expected") or "an absolute, normalised path") from None
    return value


def _lookup(option, value, by_name, by_id, kind):
    try:
        return by_id(int(value)) if NUMERIC.match(value) else by_name(value)
    except (KeyError, ValueError, OverflowError):
        raise InstallError("%s %r does not exist on this host" % (option, value), option=option, value=value,
                           expected="an existing %s name or a numeric id" % kind) from None


def service_user(owner, group, allow_root=False):
    """The copier's user and group: ``{"user", "uid", "group", "gid"}``, names resolved from the host's user and
    group databases (``group`` None: the owner's primary group). Root (uid 0, or the group with gid 0) only with
    ``allow_root``: root is a privilege, never a default."""
    for option, value in (("staging_owner", owner), ("staging_group", group)):
        if value is None and option == "staging_group":
            continue
        if not isinstance(value, str) or not (NUMERIC.match(value) or (not value.isdigit() and is_valid("user", value, option))):
            raise InstallError("%s %r is not a user or group name" % (option, value), option=option, value=value,
                               expected="a name of letters, digits, '_', '.', '@' or '-' (not starting with a digit "
                                        "or '-'), or a numeric id")
    pw_entry = _lookup("staging_owner", owner, pwd.getpwnam, pwd.getpwuid, "user")
    if group is None:
        gr_entry = _lookup("staging_group", str(pw_entry.pw_gid), grp.getgrnam, grp.getgrgid, "group")
    else:
        gr_entry = _lookup("staging_group", group, grp.getgrnam, grp.getgrgid, "group")
    for option, value, name in (("staging_owner", owner, pw_entry.pw_name), ("staging_group", group, gr_entry.gr_name)):
        if not SAFE_NAME.match(name):
            raise InstallError("%s %r resolves to %r, which systemd's User=/Group= cannot take" % (option, value, name),
                               option=option, value=value, expected="a user and group with a plain name")
    if not allow_root:
        if pw_entry.pw_uid == 0:
            raise InstallError("staging_owner %r is root: the copier runs as the staging owner and reads what the "
                               "training job writes, so it never runs as root unless allow_root_copier is set" % owner,
                               option="staging_owner", value=owner,
                               expected="the training job's (non-root) user, or allow_root_copier=true")
        if gr_entry.gr_gid == 0:
            given = group if group is not None else owner
            raise InstallError("staging_group %r is gid 0 (%s): the copier's group is a privilege too; set another "
                               "group or allow_root_copier=true" % (given, gr_entry.gr_name),
                               option="staging_group", value=group, expected="a group other than gid 0")
    return {"user": pw_entry.pw_name, "uid": pw_entry.pw_uid, "group": gr_entry.gr_name, "gid": gr_entry.gr_gid}


def _under(path, root):
    """The directory of ``path`` relative to ``root`` (as StateDirectory=/RuntimeDirectory= take it), or None."""
    directory = os.path.dirname(path)
    if not directory.startswith(root + "/"):
        return None
    return directory[len(root) + 1:]


def writable(cfg):
    """What the service may write, derived from the configuration and checked before anything is written.

    ``{"read_write": [paths for ReadWritePaths=], "state_directory": rel, "runtime_directory": rel or None,
    "protect_home": "yes" or "read-only"}``. The target's *mount point* is listed, not target_dir: a ReadWritePaths=
    entry that is no mount point becomes a bind mount of its own in the service's mount table, and the copier's
    check that the target is still on its recorded mount would then refuse every copy. InstallError when a path
    the copier writes would not be writable (state_file outside /var/lib/<dir>/, a pause_file outside the state or
    a /run directory) or cannot go into the unit.
    """
    staging, target = cfg["staging_dir"], cfg["target_dir"]
    mount = (cfg.get("target_mount") or {}).get("point") or target
    check_path("staging_dir", staging)
    check_path("target_dir", target)
    check_path("target_dir", mount, expected="a target whose mount point (%s) has a plain path" % mount)
    state_file = check_path("state_file", cfg["state_file"])
    state_dir = _under(state_file, STATE_ROOT)
    if not state_dir or _inside(os.path.dirname(state_file), staging) or _inside(os.path.dirname(state_file), target):
        raise InstallError("state_file %s is not in a directory of its own under %s: the copier runs unprivileged and "
                           "writes its state only in its StateDirectory=" % (state_file, STATE_ROOT),
                           option="state_file", value=state_file,
                           expected="%s/<directory>/<file>, such as /var/lib/gpunode-ckpt/state.json" % STATE_ROOT)
    runtime_dir = None
    pause = cfg.get("pause_file")
    if pause is not None:
        check_path("pause_file", pause)
        pause_dir = os.path.dirname(pause)
        if pause in (state_file, state_file + ".lock"):
            raise InstallError("pause_file %s is the copier's state" % pause, option="pause_file", value=pause,
                               expected="a file of its own")
        if _inside(pause_dir, STATE_ROOT + "/" + state_dir):
            pass
        elif _under(pause, RUNTIME_ROOT) and not _inside(pause, RUNTIME_ROOT + "/user"):
            runtime_dir = _under(pause, RUNTIME_ROOT)
        else:
            own = "%s/%s" % (STATE_ROOT, state_dir)
            raise InstallError("pause_file %s would not be writable by the copier's sandboxed service: it may write a "
                               "pause file only in its state directory (%s) or in a runtime directory under %s"
                               % (pause, own, RUNTIME_ROOT), option="pause_file", value=pause,
                               expected="%s/<directory>/<file> (the service's RuntimeDirectory=), such as "
                                        "/run/gpunode-ckpt/pause, or a file in %s" % (RUNTIME_ROOT, own))
    read_write = [staging, mount]
    named = read_write + [STATE_ROOT + "/" + state_dir] + ([pause] if pause else [])
    home = any(_inside(p, h) or _inside(h, p) for p in named for h in HOME_ROOTS)
    return {"read_write": read_write, "state_directory": state_dir, "runtime_directory": runtime_dir,
            "protect_home": "read-only" if home else "yes"}


def _comment(text):
    return "".join("# %s\n" % line if line else "#\n" for line in text.splitlines())


def entry_point(python, lib_dir):
    return (
        "#!%s\n%s" % (python, _comment(HEADER))
        + '"""Move complete checkpoints from staging to shared storage (gpunode.tuning checkpoint copier).\n\n'
        "The code is the collection's own module_utils (_checkpoint.copier), installed under %s.\n\n"
        "Usage: gpunode-ckpt-copier [--status] [--force] [--deadline SECONDS] CONFIG\n"
        '"""\n' % lib_dir
        + "import sys\n\nsys.path.insert(0, %s)\n\n" % json.dumps(lib_dir)
        + "from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.cli import main  # noqa: E402\n\n"
        + 'if __name__ == "__main__":\n    sys.exit(main())\n'
    )


def service_unit(entry, config_file, timeout, user, access):
    """The copier's service: as ``user`` ({"user", "group"}), sandboxed, writing only ``access`` (:func:`writable`)."""
    runtime = ""
    if access["runtime_directory"]:
        # The pause file must outlive each (oneshot) run: the trainer polls it between passes.
        runtime = ("RuntimeDirectory=%s\nRuntimeDirectoryMode=0750\nRuntimeDirectoryPreserve=yes\n"
                   % access["runtime_directory"])
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
        + "# The copier reads what the training job writes: it runs as the staging directory's owner, never as\n"
        + "# root (unless allow_root_copier), which also makes NFS root_squash exports work as the job's own.\n"
        + "User=%s\nGroup=%s\n" % (user["user"], user["group"])
        + "# Background work: it must not take CPU or disk time from the training job.\n"
        + "Nice=10\nIOSchedulingClass=idle\n"
        + "StandardOutput=journal\nStandardError=journal\nSyslogIdentifier=gpunode-ckpt-copier\n"
        + "Environment=PYTHONDONTWRITEBYTECODE=1\n"
        + "# What it may write: the staging directory, the target's mount (- : a missing one is the copier's\n"
        + "# retry, not a failed start), its state directory and the pause file's runtime directory.\n"
        + "StateDirectory=%s\nStateDirectoryMode=0750\n" % access["state_directory"]
        + runtime
        + "ReadWritePaths=%s -%s\n" % tuple(access["read_write"])
        + "ProtectHome=%s\n" % access["protect_home"]
        + "".join("%s=%s\n" % (key, value) for key, value in SANDBOX)
        # As root (allow_root_copier) the state writer gives its file to root:root with fchown (@privileged).
        + ("SystemCallFilter=@chown\n" if user.get("uid") == 0 else "")
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


def check_settings(settings):
    """InstallError naming the first path of ``settings`` that cannot go into the unit or the entry point."""
    for key in ("config_file", "lib_dir", "entry_point", "python", "unit_dir"):
        if key in settings:
            check_path(key, settings[key])


def render(cfg, settings):
    """{absolute path: (bytes, mode)} of everything a present state installs.

    ``settings``: config_file, lib_dir, entry_point, python, interval, timeout, user ({"user", "group"}: see
    :func:`service_user`), access (what the service may write: :func:`writable`, checked by the caller before) and
    unit_dir (default /etc/systemd/system).
    """
    check_settings(settings)
    access = settings["access"]
    entry, config_file = settings["entry_point"], settings["config_file"]
    unit_dir = settings.get("unit_dir", UNIT_DIR)
    files = {
        entry: (entry_point(settings["python"], settings["lib_dir"]).encode(), 0o755),
        config_file: ((json.dumps(cfg, indent=1, sort_keys=True) + "\n").encode(), 0o644),
        "%s/%s" % (unit_dir, SERVICE): (service_unit(entry, config_file, settings["timeout"], settings["user"],
                                                     access).encode(), 0o644),
        "%s/%s" % (unit_dir, PATH_UNIT): (path_unit(cfg["staging_dir"]).encode(), 0o644),
        "%s/%s" % (unit_dir, TIMER): (timer_unit(settings["interval"]).encode(), 0o644),
    }
    lib = settings["lib_dir"].rstrip("/")
    library = library_files("_checkpoint.cli")
    for rel, data in library.items():
        files["%s/%s" % (lib, rel)] = (data, 0o644)
    files["%s/%s" % (lib, MANIFEST)] = ((json.dumps(sorted(library), indent=1) + "\n").encode(), 0o644)
    return files


def read_mountinfo(path):
    """The text of a mount table, or InstallError naming mountinfo_path: never blocks on a FIFO or reads a device
    forever, and never fails on bytes that are not UTF-8 (such a mount point matches no path given here)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (OSError, ValueError) as exc:
        raise InstallError("mountinfo_path %s cannot be read: %s" % (path, getattr(exc, "strerror", None) or exc),
                           option="mountinfo_path", value=path, expected="a readable mount table")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InstallError("mountinfo_path %s is not a file" % path, option="mountinfo_path", value=path,
                               expected="a mount table such as /proc/self/mountinfo")
        chunks, size = [], 0
        while size <= MOUNTINFO_MAX:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InstallError("mountinfo_path %s cannot be read: %s" % (path, exc.strerror), option="mountinfo_path",
                           value=path, expected="a readable mount table")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if size > MOUNTINFO_MAX or b"\0" in data:
        raise InstallError("mountinfo_path %s is not a mount table (%s)" % (
            path, "a NUL byte" if b"\0" in data else "over %d bytes" % MOUNTINFO_MAX), option="mountinfo_path",
            value=path, expected="a mount table such as /proc/self/mountinfo")
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- staging --

def staging_plan(path, mode, uid, gid):
    """The staging directory's action: create, update (mode/owner, named) or unchanged; never its content."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"path": path, "action": "create", "reason": "missing", "mode": "%04o" % mode, "owner": [uid, gid]}
    if not stat.S_ISDIR(st.st_mode):
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
    """Carry out :func:`staging_plan`'s action; returns what :func:`undo_staging` needs to put it back (the
    directories created, parents included, or the mode and owner before)."""
    undo = {"created": [], "before": None}
    if plan["action"] not in ("create", "update"):
        return undo
    path = plan["path"]
    try:
        if plan["action"] == "create":
            missing, parent = [], path
            while not os.path.lexists(parent):
                missing.append(parent)
                parent = os.path.dirname(parent)
            for directory in reversed(missing):
                os.mkdir(directory, 0o700 if directory == path else 0o755)
                undo["created"].append(directory)
        else:
            st = os.lstat(path)
            undo["before"] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        os.chown(path, plan["owner"][0], plan["owner"][1], follow_symlinks=False)
        os.chmod(path, int(plan["mode"], 8))
    except OSError:
        undo_staging(undo, path)
        raise
    return undo


def undo_staging(undo, path):
    """Put the staging directory back as it was before :func:`apply_staging`; [paths it could not put back]."""
    problems = []
    if undo["before"] is not None:
        mode, uid, gid = undo["before"]
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
            os.chmod(path, mode)
        except OSError:
            problems.append(path)
    for directory in reversed(undo["created"]):
        try:
            os.rmdir(directory)
        except OSError:
            problems.append(directory)
    return problems
