# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the copier remembers and reports: the state file, the backoff of the copier and of each entry, quarantine, the
staging watermark, and :func:`status`.

The state file is read whatever it holds (garbage is an empty state, a field of the wrong type its default) and
written atomically. A failure of the target backs the whole copier off (:func:`_fail`); a failure of one entry
backs off that entry alone and quarantines it after ``quarantine_after`` failures (:func:`_entry_failed`); a record
is forgotten when its entry is no longer staged as it was (:func:`_settle`). Every backoff is clamped to
``retry_max`` from now, whatever the clock did.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.entries import _kind_of, scan
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import write_atomic


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
