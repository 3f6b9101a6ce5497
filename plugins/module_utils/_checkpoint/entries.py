# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What is staged and what one staged entry is made of, read without trusting any of it: the scan and the walk.

The copier treats everything in staging as written by someone it does not trust. Nothing here writes.

* **Complete** is a rule (:data:`config.COMPLETION_RULES`, checked by :func:`scan`): ``rename`` (written under a
  temporary name that matches ``temp_patterns``, then renamed), ``marker`` (the
  trainer writes ``<name><marker_suffix>`` when done) or ``quiescent`` (no
  process holds a file of it open and nothing in it changed for
  ``quiet_seconds``). A name matching ``temp_patterns`` is never complete.
* **Only what a checkpoint is made of** (:func:`_walk_entry`): every item is
  looked at with lstat and opened fd-relative with ``O_NOFOLLOW`` (directories
  with ``O_DIRECTORY``, files with ``O_NONBLOCK``) and the *open* descriptor is
  checked with fstat: regular files and directories only. FIFOs, sockets and
  devices are never opened, they are refused (:class:`Refused`) and reported. A link inside a
  directory entry that resolves inside the same entry is recreated as a link;
  any other is refused, never followed.
* **What must not change** while an entry is copied (:func:`_ident`, :func:`_difference`): (st_dev, st_ino, size,
  mtime_ns, ctime_ns) of every file from its open descriptor, and the entry's file set; a change is
  :class:`SourceChanged` (nothing counts, not a failure).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import CopierError

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
