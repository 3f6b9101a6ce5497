# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The file engine of the host layer: every file the collection installs on a node goes through it.

Standard library only. :func:`plan_files` compares every file with what is on disk (bytes, mode,
root ownership); :func:`apply_files` writes them atomically (temp file in the
same directory, fsync, rename) and rolls every file back when one write fails.
All paths are resolved under one ``root`` ("/" on a node, a temp dir in tests).
"""

from __future__ import annotations

import json
import os
import tempfile

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

UNIT_DIR = "/etc/systemd/system"


class PersistError(DetailedError):
    """A file that cannot be read, written or rolled back; ``details`` names the path."""


def marker_bytes(data):
    """A marker or state file's bytes as Ansible's ``to_nice_json`` writes them, plus a newline (the irqbalance
    role's copy tasks wrote its markers so; kernel_cmdline's marker has the same form)."""
    return (json.dumps(data, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n").encode("utf-8")


def rooted(root, path):
    return os.path.join(root, path.lstrip("/"))


# ------------------------------------------------------------- plan / apply --

def _current(path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        return {"data": None, "mode": st.st_mode & 0o7777, "owner": (st.st_uid, st.st_gid), "regular": False}
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise PersistError("cannot read %s: %s" % (path, exc), path=path)
    return {"data": data, "mode": st.st_mode & 0o7777, "owner": (st.st_uid, st.st_gid), "regular": True}


def _text(data):
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "<binary, %d bytes>\n" % len(data)


def plan_files(files, remove=(), root="/", diff_skip=()):
    """Compare ``files`` ({path: (bytes, mode)}) and ``remove`` (paths) with the tree under ``root``.

    Returns a list of actions ``{path, action, reason, before, after}`` with
    action ``create``, ``update``, ``remove`` or ``unchanged``; ``before`` and
    ``after`` are the texts for ``--diff`` (left empty for paths that start
    with one of ``diff_skip``: the collection's own library source).
    """
    actions = []
    for path in sorted(files):
        data, mode = files[path]
        cur = _current(rooted(root, path))
        quiet = any(path.startswith(p) for p in diff_skip)
        if cur is None:
            action, reason = "create", "missing"
        elif not cur["regular"]:
            action, reason = "update", "not a regular file"
        elif cur["data"] != data:
            action, reason = "update", "content differs"
        elif cur["mode"] != mode or cur["owner"] != (0, 0):
            action, reason = "update", "mode %04o owner %d:%d, want %04o root:root" % (cur["mode"], cur["owner"][0], cur["owner"][1], mode)
        else:
            action, reason = "unchanged", ""
        actions.append({"path": path, "action": action, "reason": reason, "mode": "%04o" % mode,
                        "before": "" if quiet or cur is None else _text(cur["data"]),
                        "after": "" if quiet else _text(data)})
    for path in sorted(set(remove) - set(files)):
        cur = _current(rooted(root, path))
        if cur is not None:
            quiet = any(path.startswith(p) for p in diff_skip)
            actions.append({"path": path, "action": "remove", "reason": "no longer installed", "mode": "",
                            "before": "" if quiet else _text(cur["data"]), "after": ""})
    return actions


def write_atomic(path, data, mode, owner=(0, 0)):
    """Write ``data`` to ``path`` through a temporary file in its directory, fsync'd and renamed over it, with
    ``mode`` and (when running as root) ``owner`` (uid, gid)."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), owner[0], owner[1])
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def fsync_dir(directory):
    """fsync a directory, so that a rename or unlink in it is durable."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _makedirs(path, created):
    """mkdir -p with 0755, remembering what it created (for rollback)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.chmod(directory, 0o755)
        created.append(directory)


def apply_files(files, actions, root="/", write=None, prune_within=None):
    """Carry out ``actions`` from :func:`plan_files`. All or nothing: on a failed
    write every file already written is put back (or removed) and the error raised.
    Directories that removals left empty are removed up to and including
    ``prune_within`` (the lib dir), never above it.

    Returns the undo record of what was done, for :func:`rollback_files` when a later step of the caller fails."""
    write = write or write_atomic
    done, created_dirs = [], []
    try:
        for act in actions:
            path = rooted(root, act["path"])
            if act["action"] in ("create", "update"):
                data, mode = files[act["path"]]
                old = _current(path) if act["action"] == "update" else None
                _makedirs(os.path.dirname(path), created_dirs)
                if old is not None and not old["regular"] and os.path.isdir(path):
                    raise PersistError("%s is a directory, expected a file the collection installs" % act["path"],
                                       path=act["path"])
                write(path, data, mode)
                done.append((path, old))
            elif act["action"] == "remove":
                old = _current(path)
                os.unlink(path)
                done.append((path, old))
    except (OSError, PersistError) as exc:
        problems = _rollback(done, created_dirs)
        raise PersistError("writing %s failed (%s); %s" % (
            act["path"], exc, "rolled back every file written before" if not problems
            else "rollback failed for %s" % ", ".join(problems)), path=act["path"], rollback_failed=problems)
    removed = [a["path"] for a in actions if a["action"] == "remove"]
    if prune_within:
        _prune_empty_dirs(removed, root, prune_within)
    return {"done": done, "created_dirs": created_dirs}


def rollback_files(undo):
    """Put back every file of an :func:`apply_files` that succeeded (``undo``, what it returned): the bytes, mode and
    owner of each file it wrote or removed, and the absence of each file it created (with the directories it made).
    Returns ``restored`` and ``failed`` (paths); a file that was not a regular file before cannot be put back."""
    failed = _rollback(undo["done"], undo["created_dirs"])
    return {"restored": [path for path, _old in undo["done"] if path not in failed], "failed": failed}


def _rollback(done, created_dirs):
    problems = []
    for path, old in reversed(done):
        try:
            if old is None:
                os.unlink(path)
            elif old["regular"]:
                _makedirs(os.path.dirname(path), [])        # a removal may have pruned its directory
                write_atomic(path, old["data"], old["mode"])
                if os.geteuid() == 0:
                    os.chown(path, old["owner"][0], old["owner"][1])
            else:
                problems.append(path)                       # a link or special file: not put back
        except OSError:
            problems.append(path)
    for directory in reversed(created_dirs):
        try:
            os.rmdir(directory)
        except OSError:
            pass
    return problems


def _prune_empty_dirs(removed, root, top):
    """Remove the directories under ``top`` (``top`` included) that removal left empty.
    A directory holding anything the collection did not install is never empty, so it stays."""
    top = top.rstrip("/")
    for path in sorted(set(os.path.dirname(p) for p in removed if p.startswith(top + "/")), key=len, reverse=True):
        while path == top or path.startswith(top + "/"):
            try:
                os.rmdir(rooted(root, path))
            except OSError:
                break
            path = os.path.dirname(path)
