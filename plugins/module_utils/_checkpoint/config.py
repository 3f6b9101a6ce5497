# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint copier's configuration: its settings, their defaults and checks, and the mount the target must be on.

Standard library only; the node-side copier and the modules share this code. :func:`check_config` fills in
:data:`DEFAULTS` and names the first bad value, touching no filesystem. :func:`check_placement` (at install) and
:func:`check_target_mount` (before every pass copies) read only the mount table (``mountinfo_path``), never the
target itself: a stat of a hung NFS mount would block. :class:`CopierError` is the error every failure of the
copier derives from (its kinds: ``entries.SourceChanged``, ``entries.Refused``, ``copier.NoRoom``,
``copier.Conflict``).
"""

from __future__ import annotations

import fnmatch
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

COMPLETION_RULES = ("rename", "marker", "quiescent")
VERIFY_MODES = ("sha256", "size_mtime")
CONFLICT_POLICIES = ("version", "replace", "keep")
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


class CopierError(DetailedError):
    """Bad configuration, or a copy that cannot be made safely; ``details`` name the value and what was expected."""


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
