# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One copier pass: the target probed, then every complete entry copied, oldest first, in a child that cannot hang.

* **One entry never blocks the others**: a failing entry is skipped with its own
  backoff (``retry_min`` doubling to ``retry_max``, in the state file: ``state``) and the
  pass goes on; after ``quarantine_after`` failures it is quarantined with its
  reason (``status()``, preflight's ``checkpoint:durable``) until it changes or
  a ``--force`` pass. A target that fails (probe, mount, a hung copy) ends the pass with
  the same backoff for the whole copier.
* **No pass hangs**: every operation on the target runs in a forked child (:func:`in_child`) killed
  when it makes no progress for ``op_timeout`` seconds; a child that does not
  end ``kill_grace`` seconds after SIGKILL (uninterruptible sleep on a frozen or
  hard-mounted filesystem) is abandoned and the target reported hung; the pass
  lock is a POSIX record lock (not inherited by children, and the child closes
  it). A backoff never lies more than ``retry_max`` ahead of now, whatever the
  clock did.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import CopierError, check_target_mount, read_mountinfo
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.copier import (
    PARTIAL_PREFIX, Conflict, NoRoom, _PROGRESS, _remove_at, copy_entry, remove_source)
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.entries import Refused, SourceChanged, scan
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.state import _entry_failed, _fail, _settle, _watermark, load_state, save_state


class OpTimeout(Exception):
    """An operation on the target that did not finish in time (a hung or unreachable mount)."""


class TargetHung(OpTimeout):
    """A child that did not end after SIGKILL (uninterruptible sleep on the target): abandoned."""


# The pass lock's descriptor while a pass holds it: a child closes it first thing.
_LOCK = {"fd": None}
# Children that did not end after SIGKILL: reaped when they finally do.
_ABANDONED = []
# os.kill, or a stand-in in tests (a kill that does nothing is a child in uninterruptible sleep).
_kill = os.kill
_ERRORS = {"copier": CopierError, "changed": SourceChanged, "refused": Refused, "conflict": Conflict,
           "noroom": NoRoom}


def _reap_abandoned():
    for pid in list(_ABANDONED):
        try:
            done = os.waitpid(pid, os.WNOHANG)[0]
        except ChildProcessError:
            done = pid
        if done:
            _ABANDONED.remove(pid)


def _child(func, args, rfd, wfd):
    os.close(rfd)
    if _LOCK["fd"] is not None:
        try:
            os.close(_LOCK["fd"])
        except OSError:
            pass
    _PROGRESS["fd"] = wfd
    code = 0
    try:
        payload = {"ok": func(*args)}
    except CopierError as exc:
        payload, code = {"error": str(exc), "kind": getattr(exc, "kind", "copier"), "details": _jsonable(exc.details)}, 1
    except OSError as exc:
        payload, code = {"error": "%s: %s" % (exc.filename or "", exc.strerror or exc), "kind": "os",
                         "errno": exc.errno}, 1
    except BaseException as exc:  # pylint: disable=broad-except
        payload, code = {"error": "%s: %s" % (type(exc).__name__, exc), "kind": "other"}, 1
    try:
        data = json.dumps(payload).encode("ascii")
        while data:
            data = data[os.write(wfd, data):]
    finally:
        os._exit(code)  # pylint: disable=protected-access


def in_child(func, timeout, *args, **kwargs):
    """Run ``func(*args)`` in a forked child and return its JSON-able result; OpTimeout when it goes ``timeout``
    seconds without progress (no chunk written, flushed or read back: see _beat) and is SIGKILLed; TargetHung when
    it has not ended ``grace`` seconds (keyword, default 5) after SIGKILL: it is abandoned, never waited for.
    CopierError (and its kinds) and OSError re-raised from the child's report.

    The parent never blocks on the child: waitpid is only ever called with WNOHANG. The child closes the pass lock
    first thing (a POSIX record lock is not inherited anyway)."""
    grace = kwargs.pop("grace", 5)
    _reap_abandoned()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        _child(func, args, rfd, wfd)
    os.close(wfd)
    os.set_blocking(rfd, False)
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while True:
            done = os.waitpid(pid, os.WNOHANG)[0]
            if done:
                break
            if select.select([rfd], [], [], 0.05)[0]:
                try:
                    chunk = os.read(rfd, 65536)
                except BlockingIOError:
                    chunk = b""
                if b"\0" in chunk:
                    deadline = time.monotonic() + timeout
                data += chunk
            if time.monotonic() > deadline:
                _kill(pid, signal.SIGKILL)
                end = time.monotonic() + grace
                while time.monotonic() < end:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        raise OpTimeout("made no progress for %s s (a hung or unreachable mount?)" % timeout)
                    time.sleep(0.05)
                _ABANDONED.append(pid)
                raise TargetHung("made no progress for %s s and did not end %s s after SIGKILL (pid %d, abandoned): the "
                                 "target is hung (uninterruptible sleep: a frozen filesystem or a hard mount that does "
                                 "not answer)" % (timeout, grace, pid))
        while True:
            try:
                chunk = os.read(rfd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rfd)
    data = data.replace(b"\0", b"")
    try:
        payload = json.loads(data.decode("ascii") or "null")
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        payload = {"error": "the child died without a report", "kind": "other"}
    if "ok" in payload:
        return payload["ok"]
    if payload.get("kind") in _ERRORS:
        raise _ERRORS[payload["kind"]](payload["error"], **payload.get("details", {}))
    raise OSError(payload.get("errno") or errno.EIO, payload["error"])


def _jsonable(details):
    return json.loads(json.dumps(details, default=str))


def probe_target(cfg):
    """Remove every partial on the target (left by a crash or an abandoned copy: no copy of this pass is running
    yet) and check the target can be listed and written (run it in a child). The partials removed."""
    try:
        tfd = os.open(cfg["target_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OSError(errno.ENOENT, "%s: target directory is missing" % cfg["target_dir"])
    try:
        cleaned = []
        for name in sorted(os.listdir(tfd)):
            if name.startswith(PARTIAL_PREFIX):
                _remove_at(tfd, name)
                cleaned.append(name)
        probe = "%sprobe.%d.%s" % (PARTIAL_PREFIX, os.getpid(), os.urandom(4).hex())
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=tfd))
        os.unlink(probe, dir_fd=tfd)
        if cleaned:
            os.fsync(tfd)
        return cleaned
    finally:
        os.close(tfd)


# -------------------------------------------------------------------- pass --

_TARGET_ERRNOS = (errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.EROFS, errno.ETIMEDOUT, errno.EHOSTDOWN,
                  errno.EHOSTUNREACH, errno.ENODEV)


def run_pass(cfg, log=print, clock=time.time, deadline=None, force=False):
    """One copier pass: watermark, target probe (and cleanup of partials), then every complete entry oldest first.

    Holds an exclusive POSIX record lock beside the state file (a second pass waits for none: it returns at once;
    children never hold it). ``deadline`` (seconds) ends the pass between entries. Before any copy the mount table
    (``mountinfo_path``) must show the target still mounted. A failing entry is skipped with its own backoff; a
    failing target ends the pass. ``force`` ignores every backoff and quarantine. Returns a summary dict."""
    lock_path = cfg["state_file"] + ".lock"
    os.makedirs(os.path.dirname(lock_path), mode=0o755, exist_ok=True)
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return {"skipped": "another pass holds %s" % lock_path}
        _LOCK["fd"] = lock
        try:
            return _locked_pass(cfg, log, clock, deadline, force)
        finally:
            _LOCK["fd"] = None
    finally:
        os.close(lock)


def _locked_pass(cfg, log, clock, deadline, force):
    now = clock()
    start = time.monotonic()
    state = load_state(cfg["state_file"])
    summary = {"copied": [], "failed": None, "waiting": [], "usage_percent": None, "changed": [], "entry_failures": [],
               "quarantined": [], "kept": [], "cleaned": []}
    summary["usage_percent"], summary["above_watermark"] = _watermark(cfg, log)
    entries = scan(cfg, now)
    _settle(state, cfg, now, entries)
    if not force and state["backoff"]["until"] > now:
        summary["skipped"] = "backing off until %s" % time.strftime("%H:%M:%S", time.localtime(state["backoff"]["until"]))
        save_state(cfg["state_file"], state)
        return summary
    summary["waiting"] = [e["name"] for e in entries if not e["complete"]]
    todo = []
    for entry in (e for e in entries if e["complete"]):
        rec = state["entries"].get(entry["name"])
        if rec and rec["quarantined"] and not force:
            summary["quarantined"].append(entry["name"])
        elif rec and rec["until"] > now and not force:
            summary["waiting"].append(entry["name"])
        else:
            todo.append(entry)
    if todo:
        try:
            check_target_mount(cfg, read_mountinfo(cfg["mountinfo_path"]))
            summary["cleaned"] = in_child(probe_target, cfg["op_timeout"], cfg, grace=cfg["kill_grace"])
        except (OpTimeout, OSError, CopierError) as exc:
            _fail(state, cfg, now, "target %s unavailable: %s" % (cfg["target_dir"], exc), None, log)
            summary["failed"] = state["last_error"]
            state["last_pass"] = now
            save_state(cfg["state_file"], state)
            return summary
        state["last_target_error"] = None  # the target answered: reachable and writable
        if summary["cleaned"]:
            log("removed %d partial(s) left on the target by an interrupted copy" % len(summary["cleaned"]))
    for entry in todo:
        if deadline is not None and time.monotonic() - start > deadline:
            break
        if not _one_entry(cfg, state, summary, entry, log, clock):
            break
    state["last_pass"] = now
    save_state(cfg["state_file"], state)
    return summary


def _one_entry(cfg, state, summary, entry, log, clock):
    """Copy one entry and remove its source; False when the target failed (the pass ends)."""
    began = time.monotonic()
    name = entry["name"]
    log("copying %s (%s, %d bytes) to %s" % (name, entry["kind"], entry["bytes"], cfg["target_dir"]))
    try:
        result = in_child(copy_entry, cfg["op_timeout"], entry, cfg, grace=cfg["kill_grace"])
    except SourceChanged as exc:
        summary["changed"].append({"entry": name, "reason": str(exc)})
        log("%s not copied: %s; copied again once it is quiet (not a failure)" % (name, exc))
        return True
    except OpTimeout as exc:
        _fail(state, cfg, clock(), "target %s hung: %s" % (cfg["target_dir"], exc), name, log)
        summary["failed"] = state["last_error"]
        return False
    except OSError as exc:
        if exc.errno in _TARGET_ERRNOS:
            _fail(state, cfg, clock(), str(exc), name, log)
            summary["failed"] = state["last_error"]
            return False
        _entry_failed(state, cfg, clock(), entry, str(exc), log, room=exc.errno in (errno.ENOSPC, errno.EDQUOT))
        summary["entry_failures"].append(state["last_error"])
        return True
    except CopierError as exc:
        _entry_failed(state, cfg, clock(), entry, str(exc), log, quarantine=isinstance(exc, Conflict),
                      room=isinstance(exc, NoRoom))
        summary["entry_failures"].append(state["last_error"])
        return True
    try:
        kept = remove_source(entry, cfg, result["manifest"])
    except OSError as exc:
        kept = ["%s: cannot be removed from staging: %s" % (name, exc)]
    if kept:
        summary["kept"].append({"entry": name, "kept": kept})
        log("%s is on the target, but staging kept %s (not part of the copy or changed since: the next pass copies "
            "it again)" % (name, "; ".join(kept)))
    state["entries"].pop(name, None)
    seconds = round(time.monotonic() - began, 2)
    record = {"name": name, "kind": entry["kind"], "bytes": result["bytes"], "files": result["files"],
              "sha256": result["sha256"], "action": result["action"], "at": clock(), "seconds": seconds,
              "staged_mtime": entry["mtime"]}
    if result.get("aside"):
        record["aside"] = result["aside"]
    state["history"] = (state["history"] + [record])[-cfg["history"]:]
    state["copied"] += 1
    state["present"] += result["action"] == "present"
    state["bytes_copied"] += result["bytes"] if result["action"] != "present" else 0
    state["backoff"] = {"seconds": 0, "until": 0}
    state["last_target_error"] = None
    summary["copied"].append(name)
    verb = {"present": "found verified", "versioned": "copied (the older %s on the target is now %s)" % (
        name, result.get("aside")), "replaced": "copied (replacing the older one)", "linked": "linked"}
    log("%s %s to %s (%d bytes, %d files, %.1f s)%s" % (
        verb.get(result["action"], "copied"), name, cfg["target_dir"], result["bytes"], result["files"], seconds,
        "" if kept else ", removed from staging"))
    return True
