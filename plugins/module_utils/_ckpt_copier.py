# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checkpoint staging: move *complete* checkpoints from local staging to shared storage without losing one.

Standard library only; the node-side copier and the modules share this code.

Seed 000's one-liner (``rsync -a --remove-source-files staging/ nfs/``) loses
data two ways: it copies a checkpoint that is still being written and then
deletes the source, and a failed copy is never retried. Here:

* **Complete** is a rule (:data:`COMPLETION_RULES`): ``rename`` (written under a
  temporary name that matches ``temp_patterns``, then renamed), ``marker`` (the
  trainer writes ``<name><marker_suffix>`` when done) or ``quiescent`` (no
  process holds a file of it open and nothing in it changed for
  ``quiet_seconds``). A name matching ``temp_patterns`` is never complete.
* **Copy** (:func:`copy_entry`): into ``<target>/.gpunode-partial.<name>`` (a
  directory, a sharded checkpoint, as a unit), every file fsync'd, then
  verified by reading the target back past the page cache (``sha256``) or by
  size and mtime (``size_mtime``), then renamed to its final name and the
  target directory fsync'd. A reader of the target never sees a final name
  that is incomplete.
* **Source removal** only after that, then the staging directory fsync'd. A
  copy interrupted by a crash or a reboot leaves the source and a partial; the
  next pass removes the partial and copies again.
* **Timeouts**: every operation on the target runs in a forked child killed
  when it makes no progress for ``op_timeout`` seconds (an NFS ``hard`` mount
  whose server is gone blocks in the kernel; SIGKILL ends such waits), so a
  hung mount never hangs the copier, and a long copy that keeps moving is never
  cut off. A copy is flushed every 64 MiB, so progress stays visible.
* **Backoff**: a failed pass doubles the wait from ``retry_min`` to
  ``retry_max``; the reason goes to the log (the journal under systemd) and
  into the state file that :func:`status` reads.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import select
import shutil
import signal
import tempfile
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._persist import fsync_dir, write_atomic

COMPLETION_RULES = ("rename", "marker", "quiescent")
VERIFY_MODES = ("sha256", "size_mtime")
PARTIAL_PREFIX = ".gpunode-partial."
DEFAULTS = {
    "completion": "rename",
    "temp_patterns": ["*.tmp", "*.partial", "*.incomplete", ".*"],
    "marker_suffix": ".done",
    "quiet_seconds": 60,
    "verify": "sha256",
    "op_timeout": 120,
    "retry_min": 10,
    "retry_max": 600,
    "watermark_percent": 80,
    "pause_file": None,
    "state_file": "/var/lib/gpunode-ckpt/state.json",
    "history": 50,
    # The mount that holds target_dir when the copier was installed ({"point", "fstype", "source"}); every pass
    # checks it is still there, so an unmounted NFS target (an empty local mount point) never counts as durable.
    "target_mount": None,
    # The mount table read for that check (a captured one in tests).
    "mountinfo_path": "/proc/self/mountinfo",
}
CHUNK = 4 * 1024 * 1024
SYNC_EVERY = 16  # chunks (64 MiB) between flushes of a copy to the target


class CopierError(DetailedError):
    """Bad configuration, or a copy that cannot be made safely; ``details`` name the value and what was expected."""


# ------------------------------------------------------------------ config --

def _percent(cfg, key):
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise CopierError("%s %r is not a percentage" % (key, value), option=key, value=value,
                          expected="a number from 0 to 100")


def _positive(cfg, key, allow_zero=False):
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        raise CopierError("%s %r is not a positive number of seconds" % (key, value), option=key, value=value,
                          expected="a number of seconds above 0")


def _inside(path, parent):
    path, parent = os.path.normpath(path), os.path.normpath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def check_config(raw):
    """The configuration with defaults filled in, or CopierError naming the first bad value.

    Checks only what needs no filesystem: see :func:`check_placement` for the mounts.
    """
    unknown = sorted(set(raw) - set(DEFAULTS) - {"staging_dir", "target_dir"})
    if unknown:
        raise CopierError("unknown copier setting %s" % ", ".join(unknown), option=unknown[0], value=unknown[0],
                          expected="one of %s" % ", ".join(sorted(set(DEFAULTS) | {"staging_dir", "target_dir"})))
    cfg = dict(DEFAULTS)
    cfg.update(dict((k, v) for k, v in raw.items() if v is not None or k == "pause_file"))
    for key in ("staging_dir", "target_dir"):
        value = cfg.get(key)
        if not isinstance(value, str) or not value.startswith("/"):
            raise CopierError("%s %r is not an absolute path" % (key, value), option=key, value=value,
                              expected="an absolute directory path")
        cfg[key] = os.path.normpath(value)
    if _inside(cfg["staging_dir"], cfg["target_dir"]) or _inside(cfg["target_dir"], cfg["staging_dir"]):
        raise CopierError("staging_dir %s and target_dir %s overlap: that is no staging" % (cfg["staging_dir"], cfg["target_dir"]),
                          option="target_dir", value=cfg["target_dir"], expected="a directory outside staging_dir, on shared storage")
    if cfg["completion"] not in COMPLETION_RULES:
        raise CopierError("completion %r is not a completion rule" % (cfg["completion"],), option="completion",
                          value=cfg["completion"], expected="one of %s" % ", ".join(COMPLETION_RULES))
    if cfg["verify"] not in VERIFY_MODES:
        raise CopierError("verify %r is not a verification mode" % (cfg["verify"],), option="verify", value=cfg["verify"],
                          expected="one of %s" % ", ".join(VERIFY_MODES))
    patterns = cfg["temp_patterns"]
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise CopierError("temp_patterns %r is not a list of name patterns" % (patterns,), option="temp_patterns",
                          value=patterns, expected="a list of non-empty fnmatch patterns such as '*.tmp'")
    # A rule that cannot be met would leave every checkpoint in staging forever.
    probe = "checkpoint-000100.pt"
    if any(fnmatch.fnmatchcase(probe, p) for p in patterns):
        raise CopierError("temp_patterns %r match every name (%s): no checkpoint could ever be complete" % (patterns, probe),
                          option="temp_patterns", value=patterns, expected="patterns for temporary names only, such as '*.tmp'")
    if cfg["completion"] == "rename" and not patterns:
        raise CopierError("completion rename needs temp_patterns: without them a file being written looks complete",
                          option="temp_patterns", value=patterns, expected="the temporary names the trainer writes, such as '*.tmp'")
    if cfg["completion"] == "marker":
        suffix = cfg["marker_suffix"]
        if not isinstance(suffix, str) or not suffix or "/" in suffix:
            raise CopierError("marker_suffix %r cannot name a marker file" % (suffix,), option="marker_suffix", value=suffix,
                              expected="a non-empty file name suffix such as '.done'")
        if any(fnmatch.fnmatchcase(probe + suffix, p) for p in patterns):
            raise CopierError("marker_suffix %r: markers match temp_patterns %r, so no marker would ever count" % (suffix, patterns),
                              option="marker_suffix", value=suffix, expected="a suffix no temp pattern matches")
    if cfg["completion"] == "quiescent":
        _positive(cfg, "quiet_seconds")
    for key in ("op_timeout", "retry_min", "retry_max"):
        _positive(cfg, key)
    if cfg["retry_min"] > cfg["retry_max"]:
        raise CopierError("retry_min %s is above retry_max %s" % (cfg["retry_min"], cfg["retry_max"]), option="retry_min",
                          value=cfg["retry_min"], expected="at most retry_max (%s)" % cfg["retry_max"])
    _percent(cfg, "watermark_percent")
    if cfg["pause_file"] is not None and (not isinstance(cfg["pause_file"], str) or not cfg["pause_file"].startswith("/")):
        raise CopierError("pause_file %r is not an absolute path" % (cfg["pause_file"],), option="pause_file",
                          value=cfg["pause_file"], expected="an absolute file path, or null for none")
    if not isinstance(cfg["mountinfo_path"], str) or not cfg["mountinfo_path"].startswith("/"):
        raise CopierError("mountinfo_path %r is not an absolute path" % (cfg["mountinfo_path"],), option="mountinfo_path",
                          value=cfg["mountinfo_path"], expected="an absolute file path such as /proc/self/mountinfo")
    mount = cfg["target_mount"]
    if mount is not None and (not isinstance(mount, dict) or sorted(mount) != ["fstype", "point", "source"]
                              or not all(isinstance(v, str) for v in mount.values())):
        raise CopierError("target_mount %r is not a mount" % (mount,), option="target_mount", value=mount,
                          expected="null, or {point, fstype, source} as in /proc/self/mountinfo")
    if not isinstance(cfg["history"], int) or isinstance(cfg["history"], bool) or cfg["history"] < 1:
        raise CopierError("history %r is not a positive count" % (cfg["history"],), option="history", value=cfg["history"],
                          expected="an integer of at least 1")
    return cfg


def parse_mountinfo(text):
    """[(mount point, fstype, source)] from /proc/self/mountinfo, in order (later mounts shadow earlier)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        rest = right.split()
        mounts.append((point, rest[0] if rest else "", rest[1] if len(rest) > 1 else ""))
    return mounts


def mount_of(path, mounts):
    """The (mount point, fstype, source) that holds ``path``: the longest, last mounted prefix."""
    best = None
    for mount in mounts:
        if _inside(path, mount[0]) and (best is None or len(mount[0]) >= len(best[0])):
            best = mount
    return best


def check_placement(cfg, mountinfo_text):
    """CopierError when the target is not on a mount of its own or staging shares the target's filesystem.

    Reads only mountinfo (no stat of the target: a hung NFS mount would block here).
    """
    mounts = parse_mountinfo(mountinfo_text)
    target, staging = mount_of(cfg["target_dir"], mounts), mount_of(cfg["staging_dir"], mounts)
    if target is None or target[0] == "/":
        raise CopierError("target_dir %s is not on a mounted shared filesystem (it is on /)" % cfg["target_dir"],
                          option="target_dir", value=cfg["target_dir"],
                          expected="a directory on a mounted filesystem such as NFS (mount it first)")
    if staging is not None and staging[0] == target[0]:
        raise CopierError("staging_dir %s is on the same filesystem as target_dir %s (%s, %s): that is no staging"
                          % (cfg["staging_dir"], cfg["target_dir"], target[0], target[1]), option="staging_dir",
                          value=cfg["staging_dir"], expected="a directory on local storage, not on %s" % target[0])
    return {"target_mount": target[0], "target_fstype": target[1], "target_source": target[2],
            "staging_mount": staging[0] if staging else None}


def check_target_mount(cfg, mountinfo_text):
    """CopierError unless target_dir is still on the mount recorded at install time (or, with none recorded, on a
    mount of its own): an NFS mount that is gone leaves an empty local directory that must not receive copies."""
    placement = check_placement(cfg, mountinfo_text)
    want = cfg.get("target_mount")
    have = {"point": placement["target_mount"], "fstype": placement["target_fstype"],
            "source": placement["target_source"]}
    if want and have != want:
        raise CopierError("target_dir %s is not on its mount: expected %s %s on %s, found %s %s on %s"
                          % (cfg["target_dir"], want["fstype"], want["source"], want["point"], have["fstype"],
                             have["source"], have["point"]), option="target_dir", value=cfg["target_dir"],
                          expected="%s mounted on %s" % (want["source"], want["point"]))
    return placement


# -------------------------------------------------------------------- scan --

def open_paths(proc="/proc"):
    """Every path some process holds open (the targets of /proc/*/fd/*), as real paths."""
    held = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("/"):
                held.add(target[:-10] if target.endswith(" (deleted)") else target)
    return held


def _walk_files(path):
    """[(relative path, full path)] of the regular files of an entry (itself when a file), sorted."""
    if not os.path.isdir(path):
        return [("", path)]
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            out.append((os.path.relpath(full, path), full))
    return out


def _entry_stat(path):
    """(bytes, newest mtime) of a file or a directory tree."""
    size, newest = 0, os.lstat(path).st_mtime
    for _rel, full in _walk_files(path):
        st = os.lstat(full)
        size += st.st_size
        newest = max(newest, st.st_mtime)
    return size, newest


def is_temp(name, cfg):
    return any(fnmatch.fnmatchcase(name, p) for p in cfg["temp_patterns"])


def scan(cfg, now=None, held=None):
    """The staged entries, oldest first: dicts with name, path, kind, bytes, mtime, complete and why not."""
    now = time.time() if now is None else now
    names = set(os.listdir(cfg["staging_dir"]))
    suffix = cfg["marker_suffix"] if cfg["completion"] == "marker" else None
    entries = []
    for name in names:
        path = os.path.join(cfg["staging_dir"], name)
        if suffix and name.endswith(suffix):
            continue  # a marker (an orphan one is left by a crash between removing a copied entry and its marker)
        try:
            size, newest = _entry_stat(path)
        except OSError:
            continue  # removed while scanning
        entry = {"name": name, "path": path, "kind": "directory" if os.path.isdir(path) else "file",
                 "bytes": size, "mtime": newest, "complete": False, "why": None}
        if is_temp(name, cfg):
            entry["why"] = "temporary name (matches temp_patterns)"
        elif cfg["completion"] == "marker" and not os.path.exists(path + suffix):
            entry["why"] = "no marker %s%s" % (name, suffix)
        elif cfg["completion"] == "quiescent":
            if held is None:
                held = open_paths()
            files = [full for _rel, full in _walk_files(path)]
            busy = [f for f in files if os.path.realpath(f) in held]
            if busy:
                entry["why"] = "open by a process (%s)" % os.path.basename(busy[0])
            elif now - newest < cfg["quiet_seconds"]:
                entry["why"] = "changed %.0f s ago (quiet_seconds %s)" % (now - newest, cfg["quiet_seconds"])
            else:
                entry["complete"] = True
        else:
            entry["complete"] = True
        entries.append(entry)
    entries.sort(key=lambda e: (e["mtime"], e["name"]))
    return entries


# -------------------------------------------------------------------- copy --

# In the child that copies (in_child): the pipe its progress beats go to, or None.
_PROGRESS = {"fd": None}


def _beat():
    """One unit of progress (a chunk written, flushed or read back): in_child's timeout starts again."""
    if _PROGRESS["fd"] is not None:
        os.write(_PROGRESS["fd"], b"\0")


def _copy_file(src, dst):
    """Copy ``src`` to a new ``dst``, fsync'd, mode and times kept; the sha256 of what was read.

    The data is flushed to the target every SYNC_EVERY chunks: the dirty pages stay bounded (a final fsync of a
    multi-GB file would show no progress for minutes), and each flush that completes is progress."""
    digest = hashlib.sha256()
    with open(src, "rb") as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fout:
            count = 0
            while True:
                chunk = fin.read(CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                fout.write(chunk)
                count += 1
                if count % SYNC_EVERY == 0:
                    fout.flush()
                    os.fdatasync(fout.fileno())
                _beat()
            fout.flush()
            os.fsync(fout.fileno())
    shutil.copystat(src, dst)
    return digest.hexdigest()


def file_sha256(path, uncached=True):
    """sha256 of a file; with ``uncached``, its pages are dropped first so the read comes from the storage
    (for NFS, from the server), not from what this host just wrote."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if uncached and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            _beat()
    return digest.hexdigest()


def _verify(manifest, root, mode):
    """The first difference between a copy under ``root`` and the source's manifest, or None."""
    for rel, want in sorted(manifest.items()):
        path = os.path.join(root, rel) if rel else root
        try:
            st = os.stat(path)
        except OSError as exc:
            return "%s: %s" % (rel or os.path.basename(root), exc.strerror)
        if st.st_size != want["bytes"]:
            return "%s: %d bytes on the target, %d in staging" % (rel or os.path.basename(root), st.st_size, want["bytes"])
        if mode == "sha256" and file_sha256(path) != want["sha256"]:
            return "%s: sha256 on the target differs from staging" % (rel or os.path.basename(root))
        if mode == "size_mtime" and int(st.st_mtime) != int(want["mtime"]):
            return "%s: mtime on the target differs from staging" % (rel or os.path.basename(root))
    return None


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def partial_name(name):
    return PARTIAL_PREFIX + name


def copy_entry(entry, cfg):
    """Copy one complete entry to the target under a partial name, verify, rename into place, fsync.

    Returns {"action": "copied"|"present", "bytes", "files", "sha256" (of a single file)}. When the final name
    already exists (a copy that was renamed but whose source was not yet removed, e.g. a reboot in between), it
    is verified against the source instead; a different one raises CopierError and nothing is removed.
    """
    target_dir, name = cfg["target_dir"], entry["name"]
    final = os.path.join(target_dir, name)
    partial = os.path.join(target_dir, partial_name(name))
    sources = _walk_files(entry["path"])
    if os.path.lexists(final):
        manifest = {}
        for rel, full in sources:
            st = os.stat(full)
            manifest[rel] = {"bytes": st.st_size, "mtime": st.st_mtime,
                             "sha256": file_sha256(full, uncached=False) if cfg["verify"] == "sha256" else None}
        problem = _verify(manifest, final, cfg["verify"])
        if problem:
            raise CopierError("%s already exists on the target and differs (%s): left in staging" % (name, problem),
                              value=final, expected="no entry of that name on the target, or the same checkpoint")
        return {"action": "present", "bytes": sum(m["bytes"] for m in manifest.values()), "files": len(manifest),
                "sha256": manifest[""]["sha256"] if "" in manifest else None}
    if os.path.lexists(partial):
        _remove(partial)  # an interrupted earlier copy: start again
    manifest = {}
    if entry["kind"] == "directory":
        os.mkdir(partial, 0o700)
        for dirpath, dirnames, _files in os.walk(entry["path"]):
            for sub in sorted(dirnames):
                os.mkdir(os.path.join(partial, os.path.relpath(os.path.join(dirpath, sub), entry["path"])), 0o700)
    for rel, full in sources:
        dst = os.path.join(partial, rel) if rel else partial
        sha = _copy_file(full, dst)
        st = os.stat(full)
        manifest[rel] = {"bytes": st.st_size, "mtime": st.st_mtime, "sha256": sha}
    if entry["kind"] == "directory":
        for dirpath, dirnames, _files in os.walk(partial, topdown=False):
            fsync_dir(dirpath)
        shutil.copystat(entry["path"], partial)
    problem = _verify(manifest, partial, cfg["verify"])
    if problem:
        _remove(partial)
        raise CopierError("verification of %s failed (%s): left in staging, will retry" % (name, problem), value=name,
                          expected="a target copy equal to the staged one")
    os.rename(partial, final)
    fsync_dir(target_dir)
    return {"action": "copied", "bytes": sum(m["bytes"] for m in manifest.values()), "files": len(manifest),
            "sha256": manifest[""]["sha256"] if "" in manifest else None}


def remove_source(entry, cfg):
    """Remove a staged entry (and its marker) whose copy is verified on the target; fsync staging."""
    _remove(entry["path"])
    if cfg["completion"] == "marker":
        marker = entry["path"] + cfg["marker_suffix"]
        if os.path.lexists(marker):
            os.unlink(marker)
    fsync_dir(cfg["staging_dir"])


# ----------------------------------------------------------------- timeout --

class OpTimeout(Exception):
    """An operation on the target that did not finish in time (a hung or unreachable mount)."""


def in_child(func, timeout, *args):
    """Run ``func(*args)`` in a forked child and return its JSON-able result; OpTimeout when it goes ``timeout``
    seconds without progress (no chunk written, flushed or read back: see _beat) and is SIGKILLed; CopierError and
    OSError re-raised from the child's report.

    A hung NFS ``hard`` mount blocks the child in the kernel; SIGKILL ends such waits. A large copy that keeps
    moving is never killed, however long it takes."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        _PROGRESS["fd"] = wfd
        code = 0
        try:
            payload = {"ok": func(*args)}
        except CopierError as exc:
            payload, code = {"error": str(exc), "kind": "copier", "details": _jsonable(exc.details)}, 1
        except OSError as exc:
            payload, code = {"error": "%s: %s" % (exc.filename or "", exc.strerror or exc), "kind": "os",
                             "errno": exc.errno}, 1
        except BaseException as exc:  # pylint: disable=broad-except
            payload, code = {"error": "%s: %s" % (type(exc).__name__, exc), "kind": "other"}, 1
        try:
            os.write(wfd, json.dumps(payload).encode("utf-8"))
        finally:
            os._exit(code)  # pylint: disable=protected-access
    os.close(wfd)
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            ready = select.select([rfd], [], [], 0.05)[0]
            if ready:
                chunk = os.read(rfd, 65536)
                if b"\0" in chunk:
                    deadline = time.monotonic() + timeout
                data += chunk
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise OpTimeout("made no progress for %s s (a hung or unreachable mount?)" % timeout)
        while True:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rfd)
    data = data.replace(b"\0", b"")
    payload = json.loads(data.decode("utf-8") or '{"error": "the child died without a report", "kind": "other"}')
    if "ok" in payload:
        return payload["ok"]
    if payload.get("kind") == "copier":
        raise CopierError(payload["error"], **payload.get("details", {}))
    raise OSError(payload.get("errno") or errno.EIO, payload["error"])


def _jsonable(details):
    return json.loads(json.dumps(details, default=str))


def probe_target(cfg):
    """Raise OSError when the target directory cannot be listed and written (run it in a child)."""
    target = cfg["target_dir"]
    if not os.path.isdir(target):
        raise OSError(errno.ENOENT, "%s: target directory is missing" % target)
    fd, tmp = tempfile.mkstemp(prefix=PARTIAL_PREFIX + "probe.", dir=target)
    os.close(fd)
    os.unlink(tmp)
    return True


# ------------------------------------------------------------------- state --

def empty_state():
    return {"copied": 0, "retried": 0, "present": 0, "bytes_copied": 0, "history": [], "last_error": None,
            "backoff": {"seconds": 0, "until": 0}, "last_pass": None}


def load_state(path):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return empty_state()
    state = empty_state()
    state.update(data if isinstance(data, dict) else {})
    return state


def save_state(path, state):
    """Write the state file atomically (the collection's one atomic writer, fsync'd file and directory)."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"), 0o644)


def usage_percent(path):
    """Used share of the filesystem holding ``path``, as ``df`` counts it (blocks used / (used + available))."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return round(100.0 * used / (used + avail), 1) if used + avail else 0.0


def _watermark(cfg, log):
    usage = usage_percent(cfg["staging_dir"])
    above = usage >= cfg["watermark_percent"]
    if above:
        log("warning: staging %s is %.1f %% full (watermark %s %%)" % (cfg["staging_dir"], usage, cfg["watermark_percent"]))
    pause = cfg["pause_file"]
    if pause:
        if above and not os.path.exists(pause):
            with open(pause, "w", encoding="utf-8") as handle:
                handle.write("staging %.1f %% full, watermark %s %%\n" % (usage, cfg["watermark_percent"]))
        elif not above and os.path.exists(pause):
            os.unlink(pause)
    return usage, above


def _fail(state, cfg, now, reason, entry, log):
    state["retried"] += 1
    wait = min(cfg["retry_max"], max(cfg["retry_min"], state["backoff"]["seconds"] * 2))
    state["backoff"] = {"seconds": wait, "until": now + wait}
    state["last_error"] = {"at": now, "entry": entry, "reason": reason}
    log("copy of %s failed: %s; retry in %s s" % (entry or "(target)", reason, wait))


def run_pass(cfg, log=print, clock=time.time, deadline=None, force=False):
    """One copier pass: watermark, target probe, then every complete entry oldest first until one fails.

    Holds an exclusive lock beside the state file (a second pass waits for none: it returns at once).
    ``deadline`` (seconds) ends the pass between entries. Before any copy the mount table (``mountinfo_path``)
    must show the target still mounted. Returns a summary dict.
    """
    lock_path = cfg["state_file"] + ".lock"
    os.makedirs(os.path.dirname(lock_path), mode=0o755, exist_ok=True)
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return {"skipped": "another pass holds %s" % lock_path}
        return _locked_pass(cfg, log, clock, deadline, force)
    finally:
        os.close(lock)


def _locked_pass(cfg, log, clock, deadline, force):
    now = clock()
    start = time.monotonic()
    state = load_state(cfg["state_file"])
    summary = {"copied": [], "failed": None, "waiting": [], "usage_percent": None}
    summary["usage_percent"], summary["above_watermark"] = _watermark(cfg, log)
    if not force and state["backoff"]["until"] > now:
        summary["skipped"] = "backing off until %s" % time.strftime("%H:%M:%S", time.localtime(state["backoff"]["until"]))
        return summary
    entries = scan(cfg, now)
    summary["waiting"] = [e["name"] for e in entries if not e["complete"]]
    todo = [e for e in entries if e["complete"]]
    if todo:
        try:
            with open(cfg["mountinfo_path"], "r", encoding="utf-8") as handle:
                check_target_mount(cfg, handle.read())
            in_child(probe_target, cfg["op_timeout"], cfg)
        except (OpTimeout, OSError, CopierError) as exc:
            _fail(state, cfg, now, "target %s unavailable: %s" % (cfg["target_dir"], exc), None, log)
            summary["failed"] = state["last_error"]
            state["last_pass"] = now
            save_state(cfg["state_file"], state)
            return summary
    for entry in todo:
        if deadline is not None and time.monotonic() - start > deadline:
            break
        began = time.monotonic()
        log("copying %s (%s, %d bytes) to %s" % (entry["name"], entry["kind"], entry["bytes"], cfg["target_dir"]))
        try:
            result = in_child(copy_entry, cfg["op_timeout"], entry, cfg)
        except (OpTimeout, OSError, CopierError) as exc:
            _fail(state, cfg, clock(), str(exc), entry["name"], log)
            summary["failed"] = state["last_error"]
            break
        remove_source(entry, cfg)
        seconds = round(time.monotonic() - began, 2)
        record = {"name": entry["name"], "kind": entry["kind"], "bytes": result["bytes"], "files": result["files"],
                  "sha256": result["sha256"], "action": result["action"], "at": clock(), "seconds": seconds,
                  "staged_mtime": entry["mtime"]}
        state["history"] = (state["history"] + [record])[-cfg["history"]:]
        state["copied"] += 1
        state["present"] += result["action"] == "present"
        state["bytes_copied"] += result["bytes"] if result["action"] == "copied" else 0
        state["backoff"] = {"seconds": 0, "until": 0}
        summary["copied"].append(entry["name"])
        log("%s %s to %s (%d bytes, %d files, %.1f s), removed from staging" % (
            "copied" if result["action"] == "copied" else "found verified", entry["name"], cfg["target_dir"],
            result["bytes"], result["files"], seconds))
    state["last_pass"] = now
    save_state(cfg["state_file"], state)
    return summary


# ------------------------------------------------------------------ status --

def status(cfg, now=None):
    """What is staged, what was copied, the oldest checkpoint not yet durable, the last error (read-only)."""
    now = time.time() if now is None else now
    state = load_state(cfg["state_file"])
    entries = scan(cfg, now) if os.path.isdir(cfg["staging_dir"]) else []
    staged = [{"name": e["name"], "kind": e["kind"], "bytes": e["bytes"], "age_seconds": round(now - e["mtime"], 1),
               "complete": e["complete"], "why": e["why"]} for e in entries]
    oldest = min((e for e in staged), key=lambda e: -e["age_seconds"], default=None)
    return {
        "staging_dir": cfg["staging_dir"], "target_dir": cfg["target_dir"],
        "staged": staged,
        "staged_bytes": sum(e["bytes"] for e in staged),
        "oldest_not_durable": oldest,
        "copied": state["copied"], "retried": state["retried"], "bytes_copied": state["bytes_copied"],
        "recent": state["history"][-10:],
        "last_error": state["last_error"],
        "backoff_until": state["backoff"]["until"] or None,
        "last_pass": state["last_pass"],
        "usage_percent": usage_percent(cfg["staging_dir"]) if os.path.isdir(cfg["staging_dir"]) else None,
    }
