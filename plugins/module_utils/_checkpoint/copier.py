# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checkpoint staging: move *complete* checkpoints from local staging to shared storage without losing one.

Standard library only; the node-side copier and the modules share this code. The copier runs as the user who owns
staging (never as root), and it treats everything in staging as written by someone it does not trust.

Seed 000's one-liner (``rsync -a --remove-source-files staging/ nfs/``) loses
data two ways: it copies a checkpoint that is still being written and then
deletes the source, and a failed copy is never retried. Here:

* **Complete** is a rule (:data:`COMPLETION_RULES`): ``rename`` (written under a
  temporary name that matches ``temp_patterns``, then renamed), ``marker`` (the
  trainer writes ``<name><marker_suffix>`` when done) or ``quiescent`` (no
  process holds a file of it open and nothing in it changed for
  ``quiet_seconds``). A name matching ``temp_patterns`` is never complete.
* **Only what a checkpoint is made of** (:func:`_walk_entry`): every item is
  looked at with lstat and opened fd-relative with ``O_NOFOLLOW`` (directories
  with ``O_DIRECTORY``, files with ``O_NONBLOCK``) and the *open* descriptor is
  checked with fstat: regular files and directories only. FIFOs, sockets and
  devices are never opened, they are refused and reported. A link inside a
  directory entry that resolves inside the same entry is recreated as a link;
  any other is refused, never followed. A top-level link (Lightning's
  ``last.ckpt`` with ``save_last="link"``: a relative link to another entry) is
  recreated on the target, atomically, once its referent is there; a top-level
  link out of staging is refused. Exactly ``st_size`` bytes of the open
  descriptor are copied (a growing file cannot keep a copy going); modes come
  from the descriptor (setuid/setgid dropped), times are set on the target's
  descriptor, nothing follows a link.
* **Copy** (:func:`copy_entry`): into ``<target>/.gpunode-partial.<hash>`` (a
  bounded name, so any valid name works; a directory, a sharded checkpoint, as
  a unit), every file fsync'd and verified by reading the target back past the
  page cache (``sha256``) or by size and mtime (``size_mtime``), then renamed to
  its final name and the target directory fsync'd. A reader of the target never
  sees a final name that is incomplete. Before the copy starts, a name longer
  than the target allows and an entry larger than the target's free space are
  refused with the reason (log, state, status).
* **A copy counts only if the source did not change**: (st_dev, st_ino, size,
  mtime_ns, ctime_ns) of every file from its open descriptor before and after
  its copy, and the whole entry (its file set) walked again after the copy and
  again right before removal. A changed source drops the partial; the entry is
  copied again once quiet (not counted as a failure).
* **Reused names** (``on_conflict``): ``version`` (default, loses nothing: the
  existing different copy on the target is renamed aside to ``<name>.~N~``, then
  the new one takes the name), ``replace`` (the new copy replaces the old one:
  Lightning's ``last.ckpt``-style names) or ``keep`` (both stay where they are
  and the entry is quarantined). A top-level link always replaces a link of its
  name (a link holds no data).
* **Source removal** only after that: exactly the files that were copied, each
  checked again just before its unlink, then their directories with rmdir; what
  appeared or changed meanwhile is kept and reported. A crash leaves the source
  and a partial; partials are removed at the start of every pass.
* **One entry never blocks the others**: a failing entry is skipped with its own
  backoff (``retry_min`` doubling to ``retry_max``, in the state file) and the
  pass goes on; after ``quarantine_after`` failures it is quarantined with its
  reason (``status()``, preflight's ``checkpoint:durable``) until it changes or
  a ``--force`` pass. A target that fails (probe, mount, a hung copy) ends the pass with
  the same backoff for the whole copier.
* **No pass hangs**: every operation on the target runs in a forked child killed
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
import fnmatch
import hashlib
import json
import math
import os
import select
import signal
import stat
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import fsync_dir, write_atomic

COMPLETION_RULES = ("rename", "marker", "quiescent")
VERIFY_MODES = ("sha256", "size_mtime")
CONFLICT_POLICIES = ("version", "replace", "keep")
PARTIAL_PREFIX = ".gpunode-partial."
NAME_MAX = 255
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
    # A name that exists on the target and holds something else: version (rename the old one aside to <name>.~N~,
    # loses nothing), replace (the new copy takes its place: last.ckpt-style names) or keep (both stay, quarantined).
    "on_conflict": "version",
    # Failures of one entry after which it is quarantined (not tried again until it changes or a --force pass).
    "quarantine_after": 5,
    # Seconds a copy child has to end after SIGKILL; past it the child is abandoned and the target reported hung.
    "kill_grace": 5,
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
    if cfg["on_conflict"] not in CONFLICT_POLICIES:
        raise CopierError("on_conflict %r is not a conflict policy" % (cfg["on_conflict"],), option="on_conflict",
                          value=cfg["on_conflict"], expected="one of %s" % ", ".join(CONFLICT_POLICIES))
    count = cfg["quarantine_after"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise CopierError("quarantine_after %r is not a positive count" % (count,), option="quarantine_after", value=count,
                          expected="an integer of at least 1 (failures of one entry before it is quarantined)")
    _positive(cfg, "kill_grace")
    if not isinstance(cfg["history"], int) or isinstance(cfg["history"], bool) or cfg["history"] < 1:
        raise CopierError("history %r is not a positive count" % (cfg["history"],), option="history", value=cfg["history"],
                          expected="an integer of at least 1")
    return cfg


def read_mountinfo(path):
    """The text of a mount table; bytes that are not UTF-8 are kept as surrogate escapes (never a traceback)."""
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "surrogateescape")


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

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Mode bits a copy keeps: never setuid or setgid (the copier is no way to make one).
_MODE_MASK = 0o1777


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


def _kind_of(mode):
    """What an lstat/fstat mode is, in words."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _tree_stat(dir_fd, name, rel, st, acc):
    """Add an item's bytes, newest mtime and regular files to ``acc`` [bytes, newest, [rel]]; lstat only, a
    directory opened O_NOFOLLOW fd-relative, nothing else opened, no link followed."""
    acc[1] = max(acc[1], st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        acc[0] += st.st_size
        acc[2].append(rel)
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    try:
        for child in sorted(os.listdir(fd)):
            _tree_stat(fd, child, rel + "/" + child if rel else child, os.stat(child, dir_fd=fd, follow_symlinks=False),
                       acc)
    finally:
        os.close(fd)


def is_temp(name, cfg):
    return any(fnmatch.fnmatchcase(name, p) for p in cfg["temp_patterns"])


def scan(cfg, now=None, held=None):
    """The staged entries, oldest first: dicts with name, path, kind (file, directory, link, or what else it is:
    FIFO, socket, device), bytes, mtime (newest in the entry), ino, complete and why not. Nothing is followed."""
    now = time.time() if now is None else now
    suffix = cfg["marker_suffix"] if cfg["completion"] == "marker" else None
    entries = []
    sfd = os.open(cfg["staging_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in os.listdir(sfd):
            if suffix and name.endswith(suffix):
                continue  # a marker (an orphan one is left by a crash between removing a copied entry and its marker)
            try:
                top = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                acc = [0, top.st_mtime, []]
                _tree_stat(sfd, name, "", top, acc)
            except OSError:
                continue  # removed or replaced while scanning: the next pass sees it
            path = os.path.join(cfg["staging_dir"], name)
            entry = {"name": name, "path": path, "kind": _kind_of(top.st_mode), "bytes": acc[0], "mtime": acc[1],
                     "ino": top.st_ino, "complete": False, "why": None}
            if is_temp(name, cfg):
                entry["why"] = "temporary name (matches temp_patterns)"
            elif cfg["completion"] == "marker" and not os.path.lexists(path + suffix):
                entry["why"] = "no marker %s%s" % (name, suffix)
            elif cfg["completion"] == "quiescent":
                if held is None:
                    held = open_paths()
                files = [os.path.join(path, rel) if rel else path for rel in acc[2]]
                busy = [f for f in files if os.path.realpath(f) in held]
                if busy:
                    entry["why"] = "open by a process (%s)" % os.path.basename(busy[0])
                elif now - acc[1] < cfg["quiet_seconds"]:
                    entry["why"] = "changed %.0f s ago (quiet_seconds %s)" % (now - acc[1], cfg["quiet_seconds"])
                else:
                    entry["complete"] = True
            else:
                entry["complete"] = True
            entries.append(entry)
    finally:
        os.close(sfd)
    entries.sort(key=lambda e: (e["mtime"], e["name"]))
    return entries


# -------------------------------------------------------------------- walk --

class SourceChanged(CopierError):
    """The staged entry changed while it was read, or is not ready yet: nothing counts, it is copied again once quiet
    (not a failure)."""

    kind = "changed"


class Refused(CopierError):
    """Something a checkpoint is not made of (a FIFO, a socket, a device, a link out of its entry): never opened,
    never followed."""

    kind = "refused"


class NoRoom(CopierError):
    """The entry does not fit the target's free space (said before the copy starts): retried with its own backoff,
    never quarantined (the target's space is not the entry's fault)."""

    kind = "noroom"


class Conflict(CopierError):
    """The name exists on the target with other content and ``on_conflict`` is keep: the entry is quarantined."""

    kind = "conflict"


def _ident(st):
    """What must not change while a file is copied: (st_dev, st_ino, size, mtime_ns, ctime_ns)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _inner_link_ok(rel, link, links):
    """Whether the link at ``rel`` (inside an entry) to ``link`` resolves inside the same entry, its components
    resolved as the kernel would, through the entry's other links (``links``: {rel: target})."""
    if not link or link.startswith("/"):
        return False
    parts = [p for p in rel.split("/")[:-1] if p]
    todo, hops = link.split("/"), 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return False
            parts.pop()
            continue
        here = "/".join(parts + [part])
        if here in links:
            hops += 1
            if hops > 40 or links[here].startswith("/"):
                return False
            todo = links[here].split("/") + todo
            continue
        parts.append(part)
    return True


def _walk_item(dir_fd, name, rel, items, visit, label):
    where = "%s/%s" % (label, rel) if rel else label
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise SourceChanged("%s was removed while it was read" % where, value=where,
                            expected="an entry that stays as it is while it is copied")
    kind = _kind_of(st.st_mode)
    if kind == "link":
        items[rel] = {"type": "l", "link": os.readlink(name, dir_fd=dir_fd), "id": _ident(st)}
        if visit:
            visit(rel, items[rel], None)
        return
    if kind not in ("file", "directory"):
        raise Refused("%s is a %s: a checkpoint is made of regular files and directories; it was not opened" % (where, kind),
                      value=where, expected="regular files and directories only")
    try:
        fd = os.open(name, _OPEN_DIR if kind == "directory" else _OPEN_FILE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):
            raise SourceChanged("%s was replaced while it was read (%s)" % (where, exc.strerror), value=where,
                                expected="an entry that stays as it is while it is copied")
        raise
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or _kind_of(fst.st_mode) != kind:
            raise SourceChanged("%s was replaced while it was read" % where, value=where,
                                expected="an entry that stays as it is while it is copied")
        items[rel] = {"type": kind[0], "id": _ident(fst), "mode": stat.S_IMODE(fst.st_mode),
                      "atime_ns": fst.st_atime_ns, "mtime_ns": fst.st_mtime_ns}
        if visit:
            visit(rel, items[rel], fd)
        if kind == "directory":
            for child in sorted(os.listdir(fd)):
                _walk_item(fd, child, rel + "/" + child if rel else child, items, visit, label)
    finally:
        os.close(fd)


def _walk_entry(dir_fd, name, visit=None):
    """Every item of the entry ``name`` in the directory ``dir_fd``, never following a link: {rel: {"type": "f", "d"
    or "l", "id": _ident, "mode", "atime_ns", "mtime_ns" | "link"}}, a directory before its contents, rel "" the entry
    itself. ``visit(rel, item, fd)`` runs for each with its descriptor open (None for a link).

    Each item is lstat'ed first: FIFOs, sockets and devices are never opened (Refused). Files are opened O_NOFOLLOW
    and O_NONBLOCK, directories O_DIRECTORY|O_NOFOLLOW, fd-relative; the open descriptor must be the lstat'ed inode
    (else SourceChanged). A link inside the entry must resolve inside it (else Refused); a top-level link is the
    caller's business."""
    items = {}
    _walk_item(dir_fd, name, "", items, visit, name)
    links = dict((rel, item["link"]) for rel, item in items.items() if item["type"] == "l" and rel)
    for rel, link in sorted(links.items()):
        if not _inner_link_ok(rel, link, links):
            raise Refused("%s/%s is a link to %s, out of the entry: refused, never followed" % (name, rel, link),
                          value="%s/%s" % (name, rel), expected="links that stay inside the checkpoint's directory")
    return items


def _difference(before, after):
    """The first difference between two walks of one entry (a file set or a file's identity), or None."""
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        where = rel or "the entry"
        if old is None:
            return "%s appeared" % where
        if new is None:
            return "%s disappeared" % where
        if old["type"] != new["type"]:
            return "%s changed its type" % where
        if old["type"] == "f" and old["id"] != new["id"]:
            return "%s changed (size, mtime or ctime)" % where
        if old["type"] == "l" and old["link"] != new["link"]:
            return "%s points elsewhere" % where
        if old["id"][:2] != new["id"][:2]:
            return "%s was replaced" % where
    return None


# -------------------------------------------------------------------- copy --

# In the child that copies (in_child): the pipe its progress beats go to, or None.
_PROGRESS = {"fd": None}
# Test hooks (none in production): "after_chunk" (where, offset) in the child after each chunk is written,
# "before_verify" (target path) in the child before a copied file is read back, "before_remove" (entry) in the
# parent before the source is removed.
_HOOKS = {}
# os.fstatvfs, or a stand-in in tests.
_statvfs = os.fstatvfs


def _hook(name, *args):
    hook = _HOOKS.get(name)
    if hook is not None:
        hook(*args)


def _beat():
    """One unit of progress (a chunk written, flushed or read back): in_child's timeout starts again."""
    if _PROGRESS["fd"] is not None:
        os.write(_PROGRESS["fd"], b"\0")


def _copy_fd(src_fd, size, dst_fd, where):
    """Copy exactly ``size`` bytes of ``src_fd`` to ``dst_fd`` (never more: a file that grows cannot keep a copy
    going), fsync'd; the sha256 of what was read.

    The data is flushed to the target every SYNC_EVERY chunks: the dirty pages stay bounded (a final fsync of a
    multi-GB file would show no progress for minutes), and each flush that completes is progress."""
    digest = hashlib.sha256()
    offset, count = 0, 0
    while offset < size:
        chunk = os.pread(src_fd, min(CHUNK, size - offset), offset)
        if not chunk:
            raise SourceChanged("%s shrank while it was copied" % where, value=where,
                                expected="a file that stays as it is while it is copied")
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view):]
        offset += len(chunk)
        count += 1
        if count % SYNC_EVERY == 0:
            os.fdatasync(dst_fd)
        _hook("after_chunk", where, offset)
        _beat()
    os.fsync(dst_fd)
    return digest.hexdigest()


def _fd_sha256(fd, uncached=True):
    """sha256 of an open file; with ``uncached``, its pages are dropped first so the read comes from the storage
    (for NFS, from the server), not from what this host just wrote."""
    if uncached and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    digest = hashlib.sha256()
    offset = 0
    while True:
        chunk = os.pread(fd, CHUNK, offset)
        if not chunk:
            break
        digest.update(chunk)
        offset += len(chunk)
        _beat()
    return digest.hexdigest()


def file_sha256(path, uncached=True):
    """sha256 of a file (opened O_NOFOLLOW), read past the page cache with ``uncached``."""
    fd = os.open(path, _OPEN_FILE)
    try:
        return _fd_sha256(fd, uncached)
    finally:
        os.close(fd)


def partial_name(name):
    """The partial a copy of ``name`` is written to: the prefix and a hash, so any valid name fits NAME_MAX."""
    return PARTIAL_PREFIX + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _bounded(name, suffix):
    """``name`` + ``suffix``, ``name`` cut so that the whole fits NAME_MAX bytes."""
    raw = name.encode("utf-8", "surrogateescape")[:NAME_MAX - len(suffix.encode("utf-8"))]
    return raw.decode("utf-8", "surrogateescape") + suffix


def _lstat_at(dir_fd, name):
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_at(dir_fd, name):
    """Remove ``name`` (a tree, a file or a link) in ``dir_fd`` without following a link; nothing when absent."""
    st = _lstat_at(dir_fd, name)
    if st is None:
        return
    _beat()
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            _remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _room(tfd, name, size, cfg):
    """Before a copy starts: CopierError when the name is longer than the target allows or the entry is larger
    than the target's free space."""
    st = _statvfs(tfd)
    longest = st.f_namemax or NAME_MAX
    length = len(name.encode("utf-8", "surrogateescape"))
    if length > longest:
        raise CopierError("%s: a name of %d bytes is longer than the target allows (%d): not copied" % (name, length, longest),
                          value=name, expected="names of at most %d bytes on %s" % (longest, cfg["target_dir"]))
    free = st.f_bavail * st.f_frsize
    if size > free:
        raise NoRoom("%s needs %d bytes, the target %s has %d free: not started, will retry" % (
            name, size, cfg["target_dir"], free), value=name, expected="at most %d bytes (the target's free space)" % free)


def _digests(dir_fd, name, uncached):
    """(walk, {rel: sha256}) of an entry."""
    shas = {}

    def visit(rel, item, fd):
        if item["type"] == "f":
            shas[rel] = _fd_sha256(fd, uncached)

    return _walk_entry(dir_fd, name, visit), shas


def _same_on_target(sfd, tfd, name, before, mode):
    """None when the target's ``name`` holds what staging's does, else the first difference."""
    try:
        there, there_sha = _digests(tfd, name, True) if mode == "sha256" else (_walk_entry(tfd, name), {})
    except CopierError as exc:
        return str(exc)
    for rel in sorted(set(before) | set(there)):
        old, new = before.get(rel), there.get(rel)
        where = rel or name
        if old is None or new is None or old["type"] != new["type"]:
            return "%s: not the same files on the target" % where
        if old["type"] == "l" and old["link"] != new["link"]:
            return "%s: the link points elsewhere on the target" % where
        if old["type"] == "f" and old["id"][2] != new["id"][2]:
            return "%s: %d bytes on the target, %d in staging" % (where, new["id"][2], old["id"][2])
        if old["type"] == "f" and mode == "size_mtime" and old["mtime_ns"] // 10 ** 9 != new["mtime_ns"] // 10 ** 9:
            return "%s: mtime on the target differs from staging" % where
    if mode == "sha256":
        here, here_sha = _digests(sfd, name, False)
        problem = _difference(before, here)
        if problem:
            raise SourceChanged("%s: %s while it was compared" % (name, problem), value=name,
                                expected="an entry that stays as it is while it is copied")
        for rel in sorted(here_sha):
            if here_sha[rel] != there_sha.get(rel):
                return "%s: sha256 on the target differs from staging" % (rel or name)
    return None


def _copy_tree(sfd, tfd, name, partial, before, cfg):
    """Copy the entry into ``partial`` (in tfd), each file checked against ``before`` as it is opened and again after
    its copy, read back and given its mode and times; {rel: sha256}."""
    shas = {}

    def visit(rel, item, fd):
        want = before.get(rel)
        where = "%s/%s" % (name, rel) if rel else name
        dst = "%s/%s" % (partial, rel) if rel else partial
        if want is None or want["type"] != item["type"] or want["id"][:2] != item["id"][:2]:
            raise SourceChanged("%s appeared or was replaced during the copy" % where, value=where,
                                expected="an entry that stays as it is while it is copied")
        if item["type"] == "d":
            os.mkdir(dst, 0o700, dir_fd=tfd)
            return
        if item["type"] == "l":
            if item["link"] != want["link"]:
                raise SourceChanged("%s points elsewhere since the copy began" % where, value=where,
                                    expected="an entry that stays as it is while it is copied")
            os.symlink(item["link"], dst, dir_fd=tfd)
            return
        if item["id"] != want["id"]:
            raise SourceChanged("%s changed before its copy began" % where, value=where,
                                expected="an entry that stays as it is while it is copied")
        out = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=tfd)
        try:
            digest = _copy_fd(fd, want["id"][2], out, where)
            if _ident(os.fstat(fd)) != want["id"]:
                raise SourceChanged("%s changed while it was copied (size, mtime or ctime): the copy does not count"
                                    % where, value=where, expected="a file that stays as it is while it is copied")
            _hook("before_verify", os.path.join(cfg["target_dir"], dst))
            size = os.fstat(out).st_size
            if size != want["id"][2]:
                raise CopierError("verification of %s failed (%d bytes on the target, %d in staging): left in staging, "
                                  "will retry" % (where, size, want["id"][2]), value=where,
                                  expected="a target copy equal to the staged one")
            if cfg["verify"] == "sha256" and _fd_sha256(out) != digest:
                raise CopierError("verification of %s failed (sha256 on the target differs from staging): left in "
                                  "staging, will retry" % where, value=where, expected="a target copy equal to the staged one")
            os.fchmod(out, want["mode"] & _MODE_MASK)
            os.utime(out, ns=(want["atime_ns"], want["mtime_ns"]))
            if cfg["verify"] == "size_mtime" and os.fstat(out).st_mtime_ns // 10 ** 9 != want["mtime_ns"] // 10 ** 9:
                raise CopierError("verification of %s failed (mtime on the target differs from staging)" % where,
                                  value=where, expected="a target copy equal to the staged one")
            os.fsync(out)
        finally:
            os.close(out)
        shas[rel] = digest

    _walk_entry(sfd, name, visit)
    # Directories last, deepest first: their modes and times, each fsync'd (its entries are durable).
    for rel in sorted((r for r, i in before.items() if i["type"] == "d"), key=lambda r: -len(r.split("/")) if r else 0):
        fd = os.open("%s/%s" % (partial, rel) if rel else partial, _OPEN_DIR, dir_fd=tfd)
        try:
            os.fsync(fd)
            os.fchmod(fd, before[rel]["mode"] & _MODE_MASK)
            os.utime(fd, ns=(before[rel]["atime_ns"], before[rel]["mtime_ns"]))
        finally:
            os.close(fd)
    return shas


def _set_aside(tfd, name):
    """Rename the target's ``name`` to a free ``<name>.~N~``; that name."""
    number = 1
    while True:
        aside = _bounded(name, ".~%d~" % number)
        if _lstat_at(tfd, aside) is None:
            os.rename(name, aside, src_dir_fd=tfd, dst_dir_fd=tfd)
            return aside
        number += 1


def _into_place(tfd, partial, name, existing, cfg):
    """Rename ``partial`` to ``name``; an ``existing`` different one is renamed aside first (version) or after
    (replace: then removed). The target directory is fsync'd after the rename. The action taken.

    The order (rename, then fsync of the directory that holds the new name) is what makes the copy survive a
    crash before the source is removed; no unit test can crash the machine, so the guard is
    ``test_the_target_directory_is_fsynced_after_the_rename`` (tests/unit/.../test_ckpt_copier_hostile.py): it
    records every directory fsync'd and fails unless the target directory was synced with the new name in it."""
    aside = _set_aside(tfd, name) if existing else None
    try:
        os.rename(partial, name, src_dir_fd=tfd, dst_dir_fd=tfd)
    except OSError:
        if aside:
            os.rename(aside, name, src_dir_fd=tfd, dst_dir_fd=tfd)
        raise
    fsync_dir(cfg["target_dir"])
    if aside and cfg["on_conflict"] == "replace":
        _remove_at(tfd, aside)
        return "replaced", None
    return ("versioned" if aside else "copied"), aside


def _copy_link(sfd, tfd, name, top, cfg):
    """A top-level link (Lightning's last.ckpt with save_last="link"): once its referent is on the target, the same
    relative link is made there (under the partial name, then renamed). A link out of staging is refused."""
    link = os.readlink(name, dir_fd=sfd)
    ref = os.path.normpath(link) if link else ""
    if not link or link.startswith("/") or ref in (".", "..") or ref.startswith("../") or ref.split("/")[0] == name:
        raise Refused("%s is a link to %s, outside staging: refused, never followed" % (name, link), value=name,
                      expected="a relative link to another checkpoint in staging (last.ckpt with save_last='link')")
    manifest = {"": {"type": "l", "link": link, "id": _ident(top)}}
    if _lstat_at(tfd, ref) is None:
        if _lstat_at(sfd, ref.split("/")[0]) is None:
            raise Refused("%s is a link to %s, which is neither in staging nor on the target" % (name, link), value=name,
                          expected="a link to a checkpoint in staging")
        raise SourceChanged("%s -> %s: waiting for %s to be on the target" % (name, link, ref), value=name,
                            expected="its referent on the target first")
    existing = _lstat_at(tfd, name)
    if existing is not None and stat.S_ISLNK(existing.st_mode) and os.readlink(name, dir_fd=tfd) == link:
        return {"action": "present", "bytes": 0, "files": 0, "sha256": None, "manifest": manifest, "aside": None}
    data = existing is not None and not stat.S_ISLNK(existing.st_mode)
    if data and cfg["on_conflict"] == "keep":
        raise Conflict("%s already exists on the target and is not a link: on_conflict keep leaves both; quarantined"
                       % name, value=name, expected="no entry of that name on the target, or on_conflict version or replace")
    partial = partial_name(name)
    _remove_at(tfd, partial)
    os.symlink(link, partial, dir_fd=tfd)
    try:
        if data:
            action, aside = _into_place(tfd, partial, name, True, cfg)
        else:  # a link replaces a link (it holds no data) in one rename
            os.rename(partial, name, src_dir_fd=tfd, dst_dir_fd=tfd)
            fsync_dir(cfg["target_dir"])
            action, aside = "linked", None
    except BaseException:
        _remove_at(tfd, partial)
        raise
    return {"action": action, "bytes": 0, "files": 0, "sha256": None, "manifest": manifest, "aside": aside}


def copy_entry(entry, cfg):
    """Copy one complete entry to the target under a partial name, verify, rename into place, fsync.

    Returns {"action": "copied"|"versioned"|"replaced"|"linked"|"present", "bytes", "files", "sha256" (of a single
    file), "manifest" (the walk the removal checks against), "aside" (where an older copy went)}. When the final
    name already holds the same checkpoint (renamed, source not yet removed: a reboot in between) it is "present";
    a different one is handled by ``on_conflict``. SourceChanged when the entry changed at any point (nothing
    counts), Refused for what a checkpoint is not made of, CopierError for a name too long or an entry too large
    (before anything is written) or a copy that does not verify; the partial is removed on every failure."""
    name = entry["name"]
    sfd = os.open(cfg["staging_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tfd = os.open(cfg["target_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            top = _lstat_at(sfd, name)
            if top is None:
                raise SourceChanged("%s was removed from staging" % name, value=name, expected="an entry in staging")
            if stat.S_ISLNK(top.st_mode):
                return _copy_link(sfd, tfd, name, top, cfg)
            before = _walk_entry(sfd, name)
            files = [rel for rel, item in before.items() if item["type"] == "f"]
            size = sum(before[rel]["id"][2] for rel in files)
            existing = _lstat_at(tfd, name) is not None
            if existing:
                problem = _same_on_target(sfd, tfd, name, before, cfg["verify"])
                if problem is None:
                    return {"action": "present", "bytes": size, "files": len(files), "sha256": None,
                            "manifest": before, "aside": None}
                if cfg["on_conflict"] == "keep":
                    raise Conflict("%s already exists on the target and differs (%s): on_conflict keep leaves both; "
                                   "quarantined" % (name, problem), value=name,
                                   expected="no entry of that name on the target, or the same checkpoint")
            _room(tfd, name, size, cfg)
            partial = partial_name(name)
            _remove_at(tfd, partial)  # an interrupted earlier copy: start again
            try:
                shas = _copy_tree(sfd, tfd, name, partial, before, cfg)
                problem = _difference(before, _walk_entry(sfd, name))
                if problem:
                    raise SourceChanged("%s: %s during the copy: the copy does not count" % (name, problem), value=name,
                                        expected="an entry that stays as it is while it is copied")
                action, aside = _into_place(tfd, partial, name, existing, cfg)
            except BaseException:
                try:
                    _remove_at(tfd, partial)
                except OSError:
                    pass  # the next pass's cleanup removes it
                raise
            return {"action": action, "bytes": size, "files": len(files), "sha256": shas.get(""), "manifest": before,
                    "aside": aside}
        finally:
            os.close(tfd)
    finally:
        os.close(sfd)


def _remove_item(dir_fd, name, rel, manifest, kept, label):
    where = "%s/%s" % (label, rel) if rel else label
    want = manifest.get(rel)
    st = _lstat_at(dir_fd, name)
    if st is None:
        return
    if want is None:
        kept.append("%s: not part of the copy" % where)
        return
    if want["type"] == "d":
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        try:
            if [os.fstat(fd).st_dev, os.fstat(fd).st_ino] != want["id"][:2]:
                kept.append("%s: replaced since the copy" % where)
                return
            for child in sorted(os.listdir(fd)):
                _remove_item(fd, child, rel + "/" + child if rel else child, manifest, kept, label)
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # Something appeared while the copied files were removed: it stays (never an rmtree).
                for child in sorted(os.listdir(fd)):
                    child_rel = rel + "/" + child if rel else child
                    if child_rel not in manifest:
                        kept.append("%s/%s: not part of the copy" % (label, child_rel))
        finally:
            os.close(fd)
        return
    if want["type"] == "l":
        if stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=dir_fd) == want["link"]:
            os.unlink(name, dir_fd=dir_fd)
        else:
            kept.append("%s: changed since the copy" % where)
        return
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError:
        kept.append("%s: replaced since the copy" % where)
        return
    try:
        same = _ident(os.fstat(fd)) == want["id"]
    finally:
        os.close(fd)
    if same:
        os.unlink(name, dir_fd=dir_fd)
    else:
        kept.append("%s: changed since the copy" % where)


def remove_source(entry, cfg, manifest):
    """Remove exactly what was copied (``manifest``, the walk copy_entry returned) from staging, then fsync it.

    The entry is walked again first: if anything differs (a file appended to or rewritten, a shard added), nothing is
    removed. Then each file is checked again just before its unlink, and directories are removed with rmdir, so
    what appears meanwhile stays. Returns what was kept, with why ([] when all is gone)."""
    name = entry["name"]
    sfd = os.open(cfg["staging_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _hook("before_remove", entry)
        try:
            if manifest[""]["type"] == "l":
                top = _lstat_at(sfd, name)
                now = {"": {"type": "l", "link": os.readlink(name, dir_fd=sfd), "id": _ident(top)}} if top and \
                    stat.S_ISLNK(top.st_mode) else {}
            else:
                now = _walk_entry(sfd, name)
        except CopierError as exc:
            return ["%s: %s" % (name, exc)]
        problem = _difference(manifest, now)
        if problem:
            return ["%s: %s since the copy: nothing removed" % (name, problem)]
        kept = []
        _remove_item(sfd, name, "", manifest, kept, name)
        if cfg["completion"] == "marker":
            marker = name + cfg["marker_suffix"]
            st = _lstat_at(sfd, marker)
            if st is not None and stat.S_ISREG(st.st_mode):
                os.unlink(marker, dir_fd=sfd)
    finally:
        os.close(sfd)
    fsync_dir(cfg["staging_dir"])
    return kept


# ----------------------------------------------------------------- timeout --

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


# ------------------------------------------------------------------- state --

def empty_state():
    # last_error: the last failure of any kind (for the log and --status); last_target_error: the last failure of the
    # target itself (probe, mount check, hung child, a target errno), cleared by the next copy or successful probe.
    return {"copied": 0, "retried": 0, "present": 0, "bytes_copied": 0, "history": [], "last_error": None,
            "last_target_error": None,
            "backoff": {"seconds": 0, "until": 0}, "last_pass": None, "entries": {}}


def _num(value, default=0):
    """``value`` when it is a finite number, else ``default``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if isinstance(value, float) and not math.isfinite(value):
        return default
    return value


def _sane_state(data):
    """A state with the right types whatever the file held (a field of the wrong type is its default)."""
    state = empty_state()
    if not isinstance(data, dict):
        return state
    for key in ("copied", "retried", "present", "bytes_copied"):
        state[key] = max(0, int(_num(data.get(key))))
    backoff = data.get("backoff")
    if isinstance(backoff, dict):
        state["backoff"] = {"seconds": max(0, _num(backoff.get("seconds"))), "until": _num(backoff.get("until"))}
    if isinstance(data.get("history"), list):
        state["history"] = [h for h in data["history"] if isinstance(h, dict) and _num(h.get("at"), None) is not None]
    for key in ("last_error", "last_target_error"):
        error = data.get(key)
        if isinstance(error, dict):
            state[key] = {"at": _num(error.get("at")), "reason": str(error.get("reason")),
                          "entry": error.get("entry") if isinstance(error.get("entry"), str) else None}
    if "last_target_error" not in data and state["backoff"]["until"]:
        # A state file of a copier before last_target_error: only a failure of the target set the backoff, and only
        # a copy cleared it, so a backoff still set means its last error was the target's.
        state["last_target_error"] = state["last_error"]
    state["last_pass"] = _num(data.get("last_pass"), None)
    entries = data.get("entries")
    if isinstance(entries, dict):
        for name, rec in entries.items():
            if isinstance(name, str) and isinstance(rec, dict):
                state["entries"][name] = {
                    "failures": max(0, int(_num(rec.get("failures")))), "until": _num(rec.get("until")),
                    "reason": str(rec.get("reason")), "quarantined": rec.get("quarantined") is True,
                    "since": _num(rec.get("since")), "key": rec.get("key") if isinstance(rec.get("key"), list) else None}
    return state


def load_state(path):
    """The state file's content, or an empty state: any garbage in it (binary, not JSON, wrong types) is no error."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return empty_state()
    return _sane_state(data)


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
    if pause and above:
        try:  # never through a link, never over anything
            fd = os.open(pause, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            fd = None
        except OSError as exc:
            fd = None
            log("warning: pause_file %s cannot be created: %s" % (pause, exc.strerror))
        if fd is not None:
            try:
                os.write(fd, ("staging %.1f %% full, watermark %s %%\n" % (usage, cfg["watermark_percent"])).encode())
            finally:
                os.close(fd)
    elif pause:
        try:
            st = os.lstat(pause)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode):
            os.unlink(pause)
        elif st is not None:
            log("warning: pause_file %s is a %s, not a regular file: left alone" % (pause, _kind_of(st.st_mode)))
    return usage, above


def _clamp(until, now, cfg):
    """A backoff's end never more than retry_max from now, whatever the clock did when it was written."""
    return min(until, now + cfg["retry_max"])


def _fail(state, cfg, now, reason, entry, log):
    """A failure of the target: the whole copier backs off."""
    state["retried"] += 1
    wait = min(cfg["retry_max"], max(cfg["retry_min"], state["backoff"]["seconds"] * 2))
    state["backoff"] = {"seconds": wait, "until": now + wait}
    state["last_error"] = {"at": now, "entry": entry, "reason": reason}
    state["last_target_error"] = dict(state["last_error"])
    log("copy of %s failed: %s; retry in %s s" % (entry or "(target)", reason, wait))


def _entry_key(entry):
    return [entry["ino"], entry["mtime"]]


def _entry_failed(state, cfg, now, entry, reason, log, quarantine=False, room=False):
    """A failure of one entry: its own backoff; quarantined after quarantine_after failures (or at once), unless
    it is ``room`` (no space on the target: the target's state, not the entry's fault)."""
    name = entry["name"]
    rec = state["entries"].get(name) or {}
    failures = rec.get("failures", 0) + 1
    wait = min(cfg["retry_max"], cfg["retry_min"] * 2 ** min(failures - 1, 40))
    quarantined = not room and (quarantine or failures >= cfg["quarantine_after"])
    state["entries"][name] = {"failures": failures, "until": now + wait, "reason": reason, "quarantined": quarantined,
                              "since": rec.get("since") or now, "key": _entry_key(entry)}
    state["retried"] += 1
    state["last_error"] = {"at": now, "entry": name, "reason": reason}
    if quarantined:
        log("copy of %s failed: %s; quarantined after %d failure(s): not tried again until it changes" % (
            name, reason, failures))
    else:
        log("copy of %s failed: %s; this entry is retried in %s s, the others go on" % (name, reason, wait))


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


def _settle(state, cfg, now, entries):
    """Clamp every backoff to retry_max from now; forget entries no longer staged or changed since they failed."""
    state["backoff"]["until"] = _clamp(state["backoff"]["until"], now, cfg)
    for key in ("last_error", "last_target_error"):
        if state[key] and state[key]["at"] > now:
            state[key]["at"] = now
    staged = dict((e["name"], e) for e in entries)
    for name in list(state["entries"]):
        rec = state["entries"][name]
        if name not in staged or rec.get("key") != _entry_key(staged[name]):
            del state["entries"][name]
        else:
            rec["until"] = _clamp(rec["until"], now, cfg)


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


# ------------------------------------------------------------------ status --

def status(cfg, now=None):
    """What is staged, what was copied, the oldest checkpoint not yet durable, the last error (of any kind) and the
    target's last error (cleared by a copy or a successful probe), the entries that failed and those quarantined
    (read-only)."""
    now = time.time() if now is None else now
    state = load_state(cfg["state_file"])
    entries = scan(cfg, now) if os.path.isdir(cfg["staging_dir"]) else []
    # Only records of entries still staged as they were when they failed (a pass forgets the others).
    keys = dict((e["name"], _entry_key(e)) for e in entries)
    recs = dict((n, r) for n, r in state["entries"].items() if keys.get(n) == r["key"])
    staged = []
    for e in entries:
        item = {"name": e["name"], "kind": e["kind"], "bytes": e["bytes"], "age_seconds": round(now - e["mtime"], 1),
                "complete": e["complete"], "why": e["why"]}
        rec = recs.get(e["name"])
        if rec:
            item["failures"] = rec["failures"]
            item["why"] = ("quarantined after %d failure(s): %s" if rec["quarantined"] else
                           "failed %d time(s), retrying: %s") % (rec["failures"], rec["reason"])
        staged.append(item)
    oldest = min((e for e in staged), key=lambda e: -e["age_seconds"], default=None)
    return {
        "staging_dir": cfg["staging_dir"], "target_dir": cfg["target_dir"],
        "staged": staged,
        "staged_bytes": sum(e["bytes"] for e in staged),
        "oldest_not_durable": oldest,
        "copied": state["copied"], "retried": state["retried"], "bytes_copied": state["bytes_copied"],
        "recent": state["history"][-10:],
        "last_error": state["last_error"],
        "last_target_error": state["last_target_error"],
        "backoff_until": _clamp(state["backoff"]["until"], now, cfg) or None,
        "last_pass": state["last_pass"],
        "usage_percent": usage_percent(cfg["staging_dir"]) if os.path.isdir(cfg["staging_dir"]) else None,
        "quarantined": [{"name": n, "reason": r["reason"], "failures": r["failures"], "since": r["since"]}
                        for n, r in sorted(recs.items()) if r["quarantined"]],
        "failing": [{"name": n, "reason": r["reason"], "failures": r["failures"], "retry_at": _clamp(r["until"], now, cfg)}
                    for n, r in sorted(recs.items()) if not r["quarantined"]],
    }
