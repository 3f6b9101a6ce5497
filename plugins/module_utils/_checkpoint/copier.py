# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checkpoint staging: move *complete* checkpoints from local staging to shared storage without losing one.

Standard library only; the node-side copier and the modules share this code. The copier runs as the user who owns
staging (never as root), and it treats everything in staging as written by someone it does not trust.

Seed 000's one-liner (``rsync -a --remove-source-files staging/ nfs/``) loses
data two ways: it copies a checkpoint that is still being written and then
deletes the source, and a failed copy is never retried. The package
``_checkpoint`` does it in parts: ``config`` (the settings and the target's mount), ``entries`` (what is staged,
which entries are complete, what one is made of), this module (the copy of one entry and the removal of its
source), ``passes`` (a pass: every operation on the target in a child with a timeout, one entry after the other)
and ``state`` (the state file: backoff, quarantine, history; ``status()``). Here:

* **Copy** (:func:`copy_entry`): into ``<target>/.gpunode-partial.<hash>`` (a
  bounded name, so any valid name works; a directory, a sharded checkpoint, as
  a unit), every file fsync'd and verified by reading the target back past the
  page cache (``sha256``) or by size and mtime (``size_mtime``), then renamed to
  its final name and the target directory fsync'd. A reader of the target never
  sees a final name that is incomplete. Before the copy starts, a name longer
  than the target allows and an entry larger than the target's free space are
  refused with the reason (log, state, status). Exactly ``st_size`` bytes of the open
  descriptor are copied (a growing file cannot keep a copy going); modes come
  from the descriptor (setuid/setgid dropped), times are set on the target's
  descriptor, nothing follows a link. A top-level link (Lightning's
  ``last.ckpt`` with ``save_last="link"``: a relative link to another entry) is
  recreated on the target, atomically, once its referent is there; a top-level
  link out of staging is refused.
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
* **Source removal** (:func:`remove_source`) only after that: exactly the files that were copied, each
  checked again just before its unlink, then their directories with rmdir; what
  appeared or changed meanwhile is kept and reported. A crash leaves the source
  and a partial; partials are removed at the start of every pass.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import CopierError
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.entries import (
    _OPEN_DIR, _OPEN_FILE, Refused, SourceChanged, _difference, _ident, _walk_entry)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import fsync_dir

PARTIAL_PREFIX = ".gpunode-partial."
NAME_MAX = 255
CHUNK = 4 * 1024 * 1024
SYNC_EVERY = 16  # chunks (64 MiB) between flushes of a copy to the target
# Mode bits a copy keeps: never setuid or setgid (the copier is no way to make one).
_MODE_MASK = 0o1777


class NoRoom(CopierError):
    """The entry does not fit the target's free space (said before the copy starts): retried with its own backoff,
    never quarantined (the target's space is not the entry's fault)."""

    kind = "noroom"


class Conflict(CopierError):
    """The name exists on the target with other content and ``on_conflict`` is keep: the entry is quarantined."""

    kind = "conflict"


# In the child that copies (passes.in_child): the pipe its progress beats go to, or None.
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
