# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint copier (_ckpt_copier, _ckpt_cli) on real directories: each completion rule, sharded directories,
verification, a FIFO (refused, never opened), backoff, the watermark, the lock, and the command line. The hostile
cases of issue 27 are in test_ckpt_copier_hostile.py. The mountinfo texts are SYNTHETIC (written for these tests)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time

import pytest

from ckpt_testlib import config, mounted, quiet_log

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import cli as _ckpt_cli
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import config as cc_config
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import copier as cc
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import entries as cc_entries
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import passes as cc_passes
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import state as cc_state
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import CopierError

# SYNTHETIC mountinfo: / on ext4, /mnt/nfs on NFS v4, /local on an NVMe xfs.
MOUNTINFO = (
    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "40 22 0:45 / /mnt/nfs rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2,hard,proto=tcp\n"
    "41 22 259:1 / /local rw,relatime shared:21 - xfs /dev/nvme0n1 rw\n"
)


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def dirs(tmp_path):
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    target.mkdir()
    return staging, target


# ------------------------------------------------------------------ config --

@pytest.mark.parametrize("over,option,expected", [
    ({"completion": "whenever"}, "completion", "one of rename, marker, quiescent"),
    ({"watermark_percent": 101}, "watermark_percent", "a number from 0 to 100"),
    ({"watermark_percent": -1}, "watermark_percent", "a number from 0 to 100"),
    ({"temp_patterns": ["*"]}, "temp_patterns", "patterns for temporary names only"),
    ({"completion": "rename", "temp_patterns": []}, "temp_patterns", "the temporary names"),
    ({"completion": "marker", "marker_suffix": ""}, "marker_suffix", "a non-empty file name suffix"),
    ({"completion": "marker", "marker_suffix": ".tmp"}, "marker_suffix", "a suffix no temp pattern matches"),
    ({"completion": "quiescent", "quiet_seconds": 0}, "quiet_seconds", "above 0"),
    ({"retry_min": 100, "retry_max": 10}, "retry_min", "at most retry_max"),
    ({"verify": "trust"}, "verify", "one of sha256, size_mtime"),
    ({"pause_file": "pause"}, "pause_file", "an absolute file path"),
    ({"frobnicate": 1}, "frobnicate", "one of"),
    ({"target_mount": {"point": "/mnt"}}, "target_mount", "{point, fstype, source}"),
    ({"mountinfo_path": "mountinfo"}, "mountinfo_path", "an absolute file path"),
])
def test_bad_config_names_the_value(dirs, tmp_path, over, option, expected):
    with pytest.raises(CopierError) as err:
        config(dirs, tmp_path, **over)
    assert err.value.details["option"] == option
    assert expected in err.value.expected


def test_staging_inside_target_is_no_staging(dirs, tmp_path):
    with pytest.raises(CopierError) as err:
        cc_config.check_config({"staging_dir": str(dirs[1] / "stage"), "target_dir": str(dirs[1])})
    assert "that is no staging" in str(err.value)


def test_placement_on_mountinfo():
    base = cc_config.check_config({"staging_dir": "/local/ckpt", "target_dir": "/mnt/nfs/ckpt"})
    placed = cc_config.check_placement(base, MOUNTINFO)
    assert placed["target_fstype"] == "nfs4" and placed["target_mount"] == "/mnt/nfs" and placed["staging_mount"] == "/local"
    with pytest.raises(CopierError) as err:  # the NFS mount is not there: the target is a directory on /
        cc_config.check_placement(cc_config.check_config({"staging_dir": "/local/ckpt", "target_dir": "/srv/ckpt"}), MOUNTINFO)
    assert err.value.details["option"] == "target_dir" and "not on a mounted" in str(err.value)
    with pytest.raises(CopierError) as err:  # both on the NFS mount
        cc_config.check_placement(cc_config.check_config({"staging_dir": "/mnt/nfs/stage", "target_dir": "/mnt/nfs/ckpt"}), MOUNTINFO)
    assert err.value.details["option"] == "staging_dir" and "same filesystem" in str(err.value)


def test_placement_reads_this_hosts_mountinfo():
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mounts = cc_config.parse_mountinfo(handle.read())
    # "/" is a mount point on a booted host but not in a chroot or every container: use the points listed here.
    points = [point for point, _fs, _src in mounts if os.path.isdir(point)]
    assert points, mounts
    for point in points:
        assert cc_config.mount_of(point, mounts)[0] == point
        assert cc_config.mount_of(os.path.join(point, "no-such-child"), mounts)[0] == point
    assert cc_config.mount_of("/proc/self", mounts)[1] == "proc"


# ------------------------------------------------------------------- rules --

def test_rename_rule_copies_only_the_renamed_file(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    data = os.urandom(3 * 1024 * 1024 + 17)
    (staging / "step100.pt.tmp").write_bytes(data)
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["copied"] == [] and summary["waiting"] == ["step100.pt.tmp"]
    assert os.listdir(target) == []
    os.rename(staging / "step100.pt.tmp", staging / "step100.pt")
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["copied"] == ["step100.pt"]
    assert sha((target / "step100.pt").read_bytes()) == sha(data)
    assert os.listdir(staging) == [] and sorted(os.listdir(target)) == ["step100.pt"]
    state = cc_state.load_state(cfg["state_file"])
    assert state["copied"] == 1 and state["bytes_copied"] == len(data) and state["history"][0]["sha256"] == sha(data)
    assert any("copied step100.pt" in line for line in lines)


def test_marker_rule_waits_for_the_marker_and_removes_it(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path, completion="marker")
    (staging / "ckpt-7.pt").write_bytes(b"x" * 1000)
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["waiting"] == ["ckpt-7.pt"]
    (staging / "ckpt-7.pt.done").write_text("")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["ckpt-7.pt"]
    assert os.listdir(staging) == [] and os.listdir(target) == ["ckpt-7.pt"]


def test_quiescent_rule_open_file_and_quiet_time(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path, completion="quiescent", quiet_seconds=30)
    path = staging / "model.safetensors"
    with open(path, "wb") as handle:
        handle.write(b"y" * 4096)
        handle.flush()
        os.utime(path, (time.time() - 300, time.time() - 300))
        entry = cc_entries.scan(cfg)[0]
        assert not entry["complete"] and entry["why"].startswith("open by a process")
    os.utime(path, (time.time() - 5, time.time() - 5))  # closed, but written 5 s ago
    entry = cc_entries.scan(cfg)[0]
    assert not entry["complete"] and entry["why"] == "changed 5 s ago (quiet_seconds 30)"
    os.utime(path, (time.time() - 31, time.time() - 31))
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["model.safetensors"]
    assert os.listdir(target) == ["model.safetensors"]


def test_sharded_directory_moves_as_a_unit(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    shards = {"__0_0.distcp": os.urandom(200000), "__1_0.distcp": os.urandom(300000), "meta/.metadata": b"{}"}
    (staging / "step200.tmp" / "meta").mkdir(parents=True)
    for rel, data in shards.items():
        (staging / "step200.tmp" / rel).write_bytes(data)
    os.rename(staging / "step200.tmp", staging / "step200")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["step200"]
    for rel, data in shards.items():
        assert (target / "step200" / rel).read_bytes() == data
    record = cc_state.load_state(cfg["state_file"])["history"][-1]
    assert record["kind"] == "directory" and record["files"] == 3 and record["bytes"] == 500002


# --------------------------------------------------------- failure and retry --

def test_a_fifo_is_refused_without_a_stall_and_retried_once_it_is_a_file(dirs, tmp_path):
    """Issue 27 changed this: a FIFO in an entry used to stall the copy until op_timeout and end the pass; now it is
    never opened (refused at once), the entry gets its own backoff, and the other entries are still copied."""
    staging, target = dirs
    cfg = config(dirs, tmp_path, op_timeout=30)
    (staging / "step300").mkdir()
    (staging / "step300" / "a.distcp").write_bytes(b"a" * 5000)
    os.mkfifo(staging / "step300" / "b.distcp")  # nobody writes it: opening it for reading would block
    os.utime(staging / "step300", (1, 1))  # oldest first: it goes before step301
    (staging / "step301.pt").write_bytes(b"n" * 100)
    lines, log = quiet_log()
    start = time.monotonic()
    summary = cc_passes.run_pass(cfg, log=log)
    assert time.monotonic() - start < 10
    assert summary["copied"] == ["step301.pt"] and summary["failed"] is None
    assert "b.distcp is a FIFO" in summary["entry_failures"][0]["reason"]
    assert sorted(os.listdir(target)) == ["step301.pt"]  # no final name, no partial
    assert sorted(os.listdir(staging / "step300")) == ["a.distcp", "b.distcp"]
    state = cc_state.load_state(cfg["state_file"])
    assert state["retried"] == 1 and state["entries"]["step300"]["failures"] == 1
    assert state["entries"]["step300"]["until"] > time.time() and state["backoff"] == {"seconds": 0, "until": 0}
    assert cc_passes.run_pass(cfg, log=log)["waiting"] == ["step300"]  # its own backoff
    os.unlink(staging / "step300" / "b.distcp")
    (staging / "step300" / "b.distcp").write_bytes(b"b" * 7000)  # the entry changed: its failures are forgotten
    assert cc_passes.run_pass(cfg, log=log)["copied"] == ["step300"]
    assert sorted(os.listdir(target)) == ["step300", "step301.pt"]
    assert (target / "step300" / "b.distcp").read_bytes() == b"b" * 7000
    assert cc_state.load_state(cfg["state_file"])["entries"] == {}
    assert any("this entry is retried in 5 s, the others go on" in line for line in lines)


def test_target_unavailable_backs_off_doubling_to_the_maximum(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / "c.pt").write_bytes(b"c")
    os.rmdir(target)
    waits = []
    for attempt in range(5):
        summary = cc_passes.run_pass(cfg, log=quiet_log()[1], force=True)
        assert "unavailable" in summary["failed"]["reason"]
        state = cc_state.load_state(cfg["state_file"])
        assert state["retried"] == attempt + 1
        waits.append(state["backoff"]["seconds"])
    assert waits == [5, 10, 20, 40, 40]
    assert os.listdir(staging) == ["c.pt"]
    target.mkdir()
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], force=True)["copied"] == ["c.pt"]
    assert cc_state.load_state(cfg["state_file"])["retried"] == 5


def test_final_name_present_is_verified_not_overwritten(dirs, tmp_path):
    """Issue 27 changed this: a different copy under the name no longer blocks the entry; on_conflict version (the
    default) renames the old one aside and the new one takes the name, so nothing is lost."""
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / "same.pt").write_bytes(b"s" * 100)
    (target / "same.pt").write_bytes(b"s" * 100)  # renamed into place, source not yet removed (a reboot)
    (staging / "other.pt").write_bytes(b"new")
    (target / "other.pt").write_bytes(b"old")
    os.utime(staging / "same.pt", (1, 1))  # oldest first
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == ["same.pt", "other.pt"] and summary["failed"] is None
    assert os.listdir(staging) == [] and (target / "other.pt").read_bytes() == b"new"
    assert (target / "other.pt.~1~").read_bytes() == b"old"
    state = cc_state.load_state(cfg["state_file"])
    assert state["present"] == 1 and state["history"][-1]["aside"] == "other.pt.~1~"


def test_size_mtime_verification_and_watermark_pause_file(dirs, tmp_path):
    staging, target = dirs
    pause = tmp_path / "pause-checkpointing"
    cfg = config(dirs, tmp_path, verify="size_mtime", watermark_percent=0, pause_file=str(pause))
    (staging / "d.pt").write_bytes(b"d" * 10)
    os.utime(staging / "d.pt", (1700000000, 1700000000))
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["above_watermark"] and pause.exists() and any("watermark 0 %" in line for line in lines)
    assert os.stat(target / "d.pt").st_mtime == 1700000000 and (target / "d.pt").read_bytes() == b"d" * 10
    cfg = config(dirs, tmp_path, watermark_percent=100, pause_file=str(pause))
    assert not cc_passes.run_pass(cfg, log=log)["above_watermark"] and not pause.exists()


def test_second_pass_does_not_wait_for_the_lock(dirs, tmp_path):
    """The lock is a POSIX record lock (issue 27: so that children never hold it): taken here by another process."""
    cfg = config(dirs, tmp_path)
    os.makedirs(os.path.dirname(cfg["state_file"]), exist_ok=True)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # another copier holding the lock
        try:
            fd = os.open(cfg["state_file"] + ".lock", os.O_RDWR | os.O_CREAT)
            fcntl.lockf(fd, fcntl.LOCK_EX)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)  # pylint: disable=protected-access
    try:
        assert os.read(ready_r, 1) == b"1"
        assert "another pass" in cc_passes.run_pass(cfg, log=quiet_log()[1])["skipped"]
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)
    assert "skipped" not in cc_passes.run_pass(cfg, log=quiet_log()[1])


# ------------------------------------------------------------ status, cli --

def test_status_and_command_line(dirs, tmp_path, capsys):
    staging, target = dirs
    cfg_path = tmp_path / "copier.json"
    cfg_path.write_text(json.dumps({"staging_dir": str(staging), "target_dir": str(target),
                                    "state_file": str(tmp_path / "st" / "state.json"),
                                    "mountinfo_path": mounted(tmp_path, target)}))
    (staging / "old.pt").write_bytes(b"1")
    (staging / "new.pt.tmp").write_bytes(b"2")
    os.utime(staging / "old.pt", (time.time() - 100, time.time() - 100))
    assert _ckpt_cli.main(["--status", str(cfg_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["oldest_not_durable"]["name"] == "old.pt" and report["oldest_not_durable"]["age_seconds"] >= 99
    assert report["copied"] == 0 and os.path.exists(staging / "old.pt")  # --status changes nothing
    assert _ckpt_cli.main([str(cfg_path)]) == 0
    assert "copied old.pt" in capsys.readouterr().out
    assert _ckpt_cli.main(["--status", str(cfg_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["copied"] == 1 and [e["name"] for e in report["staged"]] == ["new.pt.tmp"]
    assert report["oldest_not_durable"]["complete"] is False
    cfg_path.write_text(json.dumps({"staging_dir": str(staging), "target_dir": str(target), "watermark_percent": 150}))
    assert _ckpt_cli.main([str(cfg_path)]) == 2
    assert "watermark_percent 150 is not a percentage" in capsys.readouterr().err


def test_no_copy_while_the_target_is_not_on_its_mount(dirs, tmp_path):
    """An NFS mount that went away leaves an empty local mount point: copying there would delete the only copy."""
    (dirs[0] / "ckpt-1.pt").write_bytes(b"weights")
    for table in (str(tmp_path / "nothing-mounted"), mounted(tmp_path, dirs[1], source="other:/export")):
        if not table.endswith("export"):
            with open(table, "w", encoding="utf-8") as handle:
                handle.write("22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n")
        cfg = config(dirs, tmp_path, mountinfo_path=table)
        lines, log = quiet_log()
        summary = cc_passes.run_pass(cfg, log=log, force=True)
        assert summary["copied"] == [] and summary["failed"]["entry"] is None, summary
        assert "is not on" in summary["failed"]["reason"] and "retry in" in lines[-1], lines
        assert (dirs[0] / "ckpt-1.pt").exists() and os.listdir(dirs[1]) == []
    assert cc_passes.run_pass(config(dirs, tmp_path), log=quiet_log()[1], force=True)["copied"] == ["ckpt-1.pt"]


def _progressing(seconds, step):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(step)
        cc._beat()  # pylint: disable=protected-access
    return "done"


def test_the_timeout_is_for_no_progress_not_for_a_long_copy():
    """A copy that keeps moving (a beat per chunk) runs past op_timeout and finishes; one that stops is killed."""
    start = time.monotonic()
    assert cc_passes.in_child(_progressing, 1, 2.5, 0.2) == "done"
    assert time.monotonic() - start >= 2.5
    with pytest.raises(cc_passes.OpTimeout) as err:
        cc_passes.in_child(_progressing, 1, 3, 1.5)
    assert "made no progress for 1 s" in str(err.value)


def test_a_large_copy_beats_and_flushes_as_it_goes(dirs, tmp_path, monkeypatch):
    """_copy_fd gives a beat per chunk (so in_child's timeout restarts) and flushes every SYNC_EVERY chunks."""
    monkeypatch.setattr(cc, "CHUNK", 1024)
    monkeypatch.setattr(cc, "SYNC_EVERY", 4)
    src = dirs[0] / "big.pt"
    src.write_bytes(os.urandom(10 * 1024))
    rfd, wfd = os.pipe()
    monkeypatch.setitem(cc._PROGRESS, "fd", wfd)  # pylint: disable=protected-access
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd)))
    sfd = os.open(src, os.O_RDONLY)
    dfd = os.open(dirs[1] / "big.pt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        digest = cc._copy_fd(sfd, 10 * 1024, dfd, "big.pt")  # pylint: disable=protected-access
    finally:
        os.close(sfd)
        os.close(dfd)
    os.close(wfd)
    beats = os.read(rfd, 100)
    os.close(rfd)
    assert beats == b"\0" * 10 and len(syncs) == 2
    assert digest == sha(src.read_bytes()) and (dirs[1] / "big.pt").read_bytes() == src.read_bytes()
