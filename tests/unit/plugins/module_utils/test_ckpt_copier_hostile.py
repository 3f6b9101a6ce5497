# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint copier (_ckpt_copier) against a trainer that writes what it likes into staging and a target that
fails (issue 27): links out, FIFOs, /dev/zero, races during the copy and before the removal, reused and long names,
a full target, a hung target, a clock that jumped, garbage state and mount tables. All on real directories (a real
2 MiB tmpfs for ENOSPC); the races run through the copier's test hooks inside the real forked child."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import stat
import subprocess
import time

import pytest

from ckpt_testlib import config, quiet_log

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import config as cc_config
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import copier as cc
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import entries as cc_entries
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import passes as cc_passes
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import state as cc_state
from ansible_collections.gpunode.tuning.plugins.module_utils._report import preflight as P


@pytest.fixture
def dirs(tmp_path):
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    target.mkdir()
    return staging, target


@pytest.fixture
def secret(tmp_path):
    """A file standing in for /etc/shadow: nothing of it may ever reach the target."""
    path = tmp_path / "etc" / "shadow"
    path.parent.mkdir()
    path.write_bytes(b"root:$6$SECRETHASH:19000:0:99999:7:::\n" * 100)
    os.chmod(path, 0o600)
    return path


def everything(top):
    """{relative path: bytes or 'link -> x'} of a tree, nothing followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            if os.path.islink(full):
                out[rel] = "link -> " + os.readlink(full)
            elif os.path.isfile(full):
                with open(full, "rb") as handle:
                    out[rel] = handle.read()
    return out


def assert_no_secret(target, secret):
    data = secret.read_bytes()
    for rel, content in everything(target).items():
        assert not (isinstance(content, bytes) and b"SECRETHASH" in content), rel
        assert content != data, rel


def no_partials(target):
    return not [n for n in os.listdir(target) if n.startswith(cc.PARTIAL_PREFIX)]


def old(path, seconds=100):
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


# ------------------------------------------------------------------ links --

def test_a_link_to_a_file_outside_is_refused_and_the_rest_is_copied(dirs, tmp_path, secret):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    os.symlink(secret, staging / "x.pt")
    old(staging / "x.pt")
    (staging / "y.pt").write_bytes(b"weights")
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["copied"] == ["y.pt"] and summary["failed"] is None
    assert "x.pt is a link to %s, outside staging: refused, never followed" % secret in summary["entry_failures"][0]["reason"]
    assert sorted(os.listdir(target)) == ["y.pt"]
    assert_no_secret(target, secret)
    assert os.path.islink(staging / "x.pt")  # reported, not removed
    assert any("x.pt failed" in line and "refused" in line for line in lines)


def test_a_linked_directory_is_refused(dirs, tmp_path, secret):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    os.symlink(secret.parent, staging / "ck3")
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "ck3 is a link to" in summary["entry_failures"][0]["reason"]
    assert os.listdir(target) == []


def test_links_inside_an_entry_stay_links_inside_and_out_is_refused(dirs, tmp_path, secret):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    ck = staging / "step10"
    (ck / "shards").mkdir(parents=True)
    (ck / "shards" / "0.distcp").write_bytes(b"zero")
    os.symlink("shards/0.distcp", ck / "latest")  # inside: recreated as a link
    os.symlink("../shards", ck / "shards" / "self")  # inside, through ..: a link to its own directory
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["step10"]
    assert os.readlink(target / "step10" / "latest") == "shards/0.distcp"
    assert os.readlink(target / "step10" / "shards" / "self") == "../shards"
    assert (target / "step10" / "latest").read_bytes() == b"zero"

    for name, link in (("step11", str(secret)), ("step12", "../../etc/shadow"), ("step13", "/dev/zero")):
        (staging / name).mkdir()
        (staging / name / "a.distcp").write_bytes(b"a")
        os.symlink(link, staging / name / "model.pt")
    os.symlink(".", staging / "step14")  # a top-level link that leads to staging itself
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    reasons = sorted(f["reason"] for f in summary["entry_failures"])
    assert len(reasons) == 4 and all("refused, never followed" in r for r in reasons), reasons
    assert sorted(os.listdir(target)) == ["step10"]
    assert_no_secret(target, secret)


def test_a_link_to_dev_zero_never_runs_and_fills_nothing(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path, op_timeout=2)
    os.symlink("/dev/zero", staging / "zero.pt")
    (staging / "ok.pt").write_bytes(b"ok")
    start = time.monotonic()
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert time.monotonic() - start < 5
    assert summary["copied"] == ["ok.pt"] and "zero.pt is a link to /dev/zero" in summary["entry_failures"][0]["reason"]
    assert sorted(os.listdir(target)) == ["ok.pt"]


def test_a_fifo_entry_is_never_opened_and_blocks_nothing(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path, op_timeout=30)
    os.mkfifo(staging / "pipe.pt")
    old(staging / "pipe.pt")
    (staging / "after.pt").write_bytes(b"a")
    start = time.monotonic()
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert time.monotonic() - start < 5
    assert summary["copied"] == ["after.pt"] and "pipe.pt is a FIFO" in summary["entry_failures"][0]["reason"]
    assert stat.S_ISFIFO(os.lstat(staging / "pipe.pt").st_mode) and sorted(os.listdir(target)) == ["after.pt"]


def test_lightning_last_ckpt_link_is_recreated_on_the_target(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / "epoch=1.ckpt").write_bytes(b"one")
    old(staging / "epoch=1.ckpt", 50)
    os.symlink("epoch=1.ckpt", staging / "last.ckpt")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["epoch=1.ckpt", "last.ckpt"]
    assert os.readlink(target / "last.ckpt") == "epoch=1.ckpt" and (target / "last.ckpt").read_bytes() == b"one"
    assert os.listdir(staging) == []
    (staging / "epoch=2.ckpt").write_bytes(b"two")
    old(staging / "epoch=2.ckpt", 50)
    os.symlink("epoch=2.ckpt", staging / "last.ckpt")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["epoch=2.ckpt", "last.ckpt"]
    assert os.readlink(target / "last.ckpt") == "epoch=2.ckpt"  # a link replaces a link: no last.ckpt.~1~
    assert sorted(os.listdir(target)) == ["epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]
    # Its referent not on the target yet (the link is older): it waits, not a failure, and follows on the next pass.
    (staging / "epoch=3.ckpt").write_bytes(b"three")
    os.symlink("epoch=3.ckpt", staging / "last.ckpt")
    old(staging / "last.ckpt", 100)
    old(staging / "epoch=3.ckpt", 50)
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == ["epoch=3.ckpt"] and summary["changed"][0]["entry"] == "last.ckpt"
    assert summary["entry_failures"] == [] and os.readlink(target / "last.ckpt") == "epoch=2.ckpt"
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["last.ckpt"]
    assert os.readlink(target / "last.ckpt") == "epoch=3.ckpt"


# ------------------------------------------------------------------ races --

def test_swapping_in_a_link_once_the_partial_appears_copies_nothing_of_it(dirs, tmp_path, secret, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    monkeypatch.setattr(cc, "CHUNK", 1024)
    src = staging / "x.pt"
    src.write_bytes(b"r" * 8192)
    old(src)

    def swap(where, offset):
        if where == "x.pt" and offset == 1024 and not os.path.islink(src):
            assert [n for n in os.listdir(target) if n.startswith(cc.PARTIAL_PREFIX)]  # the partial is there
            os.unlink(src)
            os.symlink(secret, src)

    monkeypatch.setitem(cc._HOOKS, "after_chunk", swap)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "x.pt" in summary["changed"][0]["reason"]
    assert os.listdir(target) == []  # the partial was dropped
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])  # now a link out: refused
    assert summary["copied"] == [] and "refused" in summary["entry_failures"][0]["reason"]
    assert os.listdir(target) == [] and os.path.islink(src)
    assert_no_secret(target, secret)


def test_a_same_size_decoy_renamed_in_during_the_copy_is_never_mixed(dirs, tmp_path, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    monkeypatch.setattr(cc, "CHUNK", 1024)
    src = staging / "x.pt"
    src.write_bytes(b"o" * 8192)
    old(src)
    decoy = staging / ".decoy"
    decoy.write_bytes(b"d" * 8192)

    def swap(where, offset):
        if where == "x.pt" and offset == 4096 and decoy.exists():
            os.rename(decoy, src)

    monkeypatch.setitem(cc._HOOKS, "after_chunk", swap)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and summary["changed"] and os.listdir(target) == []
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["x.pt"]
    assert (target / "x.pt").read_bytes() == b"d" * 8192  # all of one version, never a mix


def test_an_in_place_same_size_rewrite_during_the_copy_keeps_the_source(dirs, tmp_path, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    monkeypatch.setattr(cc, "CHUNK", 1024)
    src = staging / "model.pt"
    src.write_bytes(b"1" * 8192)
    old(src)

    def rewrite(where, offset):
        if where == "model.pt" and offset == 4096:
            with open(src, "r+b") as handle:  # the trainer saves again, same size, in place
                handle.write(b"2" * 8192)

    monkeypatch.setitem(cc._HOOKS, "after_chunk", rewrite)  # pylint: disable=protected-access
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["copied"] == [] and "changed while it was copied" in summary["changed"][0]["reason"]
    assert summary["entry_failures"] == [] and cc_state.load_state(cfg["state_file"])["retried"] == 0  # not a failure
    assert src.read_bytes() == b"2" * 8192 and os.listdir(target) == []
    assert any("not a failure" in line for line in lines)
    monkeypatch.delitem(cc._HOOKS, "after_chunk")  # pylint: disable=protected-access
    assert cc_passes.run_pass(cfg, log=log)["copied"] == ["model.pt"]
    assert (target / "model.pt").read_bytes() == b"2" * 8192


def test_bytes_appended_between_copy_and_removal_are_kept(dirs, tmp_path, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    src = staging / "model.pt"
    src.write_bytes(b"a" * 1000)
    old(src)

    def append(entry):
        with open(src, "ab") as handle:
            handle.write(b"b" * 10)

    monkeypatch.setitem(cc._HOOKS, "before_remove", append)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == ["model.pt"] and "nothing removed" in summary["kept"][0]["kept"][0]
    assert src.read_bytes() == b"a" * 1000 + b"b" * 10  # kept, with every byte
    assert (target / "model.pt").read_bytes() == b"a" * 1000
    monkeypatch.delitem(cc._HOOKS, "before_remove")  # pylint: disable=protected-access
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["model.pt"]  # the longer one, the first set aside
    assert (target / "model.pt").read_bytes() == b"a" * 1000 + b"b" * 10
    assert (target / "model.pt.~1~").read_bytes() == b"a" * 1000 and os.listdir(staging) == []


def test_a_shard_added_during_the_copy_or_before_removal_is_never_removed(dirs, tmp_path, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    ck = staging / "step5"
    ck.mkdir()
    (ck / "0.distcp").write_bytes(b"0" * 100)
    (ck / "1.distcp").write_bytes(b"1" * 100)
    old(ck)

    def add(where, offset):
        if not (ck / "2.distcp").exists():
            (ck / "2.distcp").write_bytes(b"2" * 100)

    monkeypatch.setitem(cc._HOOKS, "after_chunk", add)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "2.distcp appeared" in summary["changed"][0]["reason"]
    assert sorted(os.listdir(ck)) == ["0.distcp", "1.distcp", "2.distcp"] and os.listdir(target) == []
    monkeypatch.delitem(cc._HOOKS, "after_chunk")  # pylint: disable=protected-access

    def add_late(entry):
        (ck / "3.distcp").write_bytes(b"3" * 100)

    monkeypatch.setitem(cc._HOOKS, "before_remove", add_late)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == ["step5"] and "3.distcp appeared" in summary["kept"][0]["kept"][0]
    assert sorted(os.listdir(ck)) == ["0.distcp", "1.distcp", "2.distcp", "3.distcp"]
    assert sorted(os.listdir(target / "step5")) == ["0.distcp", "1.distcp", "2.distcp"]


def walk(staging, name):
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return cc_entries._walk_entry(fd, name)  # pylint: disable=protected-access
    finally:
        os.close(fd)


def test_removal_takes_only_the_copied_files_then_rmdir(dirs, tmp_path, monkeypatch):
    """A shard that appears between the check and its directory's rmdir stays (no rmtree), and is reported."""
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    ck = staging / "step6"
    (ck / "sub").mkdir(parents=True)
    (ck / "sub" / "a").write_bytes(b"a")
    entry = cc_entries.scan(cfg)[0]
    manifest = walk(staging, "step6")
    (ck / "sub" / "late").write_bytes(b"late")
    kept = cc.remove_source(entry, cfg, manifest)
    assert kept == ["step6: sub/late appeared since the copy: nothing removed"]
    assert sorted(os.listdir(ck / "sub")) == ["a", "late"]
    manifest = walk(staging, "step6")
    real_unlink = os.unlink

    def racing_unlink(name, *args, **kwargs):
        real_unlink(name, *args, **kwargs)
        if name == "a" and not (ck / "sub" / "later").exists():
            (ck / "sub" / "later").write_bytes(b"later")

    monkeypatch.setattr(os, "unlink", racing_unlink)
    kept = cc.remove_source(entry, cfg, manifest)
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert kept == ["step6/sub/later: not part of the copy"] and sorted(os.listdir(ck / "sub")) == ["later"]


def test_a_target_copy_that_differs_is_not_counted_and_the_source_is_kept(dirs, tmp_path, monkeypatch):
    """Mutation guard (issue 34): the read-back verification is what keeps the source."""
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / "v.pt").write_bytes(b"v" * 5000)

    def corrupt(path):
        with open(path, "r+b") as handle:
            handle.write(b"X")

    monkeypatch.setitem(cc._HOOKS, "before_verify", corrupt)  # pylint: disable=protected-access
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "sha256 on the target differs" in summary["entry_failures"][0]["reason"]
    assert (staging / "v.pt").read_bytes() == b"v" * 5000 and os.listdir(target) == []
    for mode in ("size_mtime",):
        monkeypatch.setitem(cc._HOOKS, "before_verify", lambda path: os.truncate(path, 10))  # pylint: disable=protected-access
        summary = cc_passes.run_pass(config(dirs, tmp_path, verify=mode), log=quiet_log()[1], force=True)
        assert summary["copied"] == [] and "10 bytes on the target" in summary["entry_failures"][0]["reason"]
        assert (staging / "v.pt").read_bytes() == b"v" * 5000 and os.listdir(target) == []


def test_the_target_directory_is_fsynced_after_the_rename(dirs, tmp_path, monkeypatch):
    """Mutation guard (issue 34): the rename into place is made durable (observed in the forked child)."""
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / "f.pt").write_bytes(b"f")
    record = tmp_path / "fsyncs"
    real = cc.fsync_dir

    def observe(directory):
        with open(record, "a", encoding="utf-8") as handle:
            handle.write(json.dumps([directory, os.path.exists(os.path.join(directory, "f.pt"))]) + "\n")
        real(directory)

    monkeypatch.setattr(cc, "fsync_dir", observe)
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["f.pt"]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [str(target), True] in calls


# ------------------------------------------------------------------- names --

def test_a_reused_name_versions_replaces_or_keeps(dirs, tmp_path):
    staging, target = dirs
    (target / "last.ckpt").write_bytes(b"old")
    (staging / "last.ckpt").write_bytes(b"new")
    cfg = config(dirs, tmp_path, on_conflict="replace")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["last.ckpt"]
    assert os.listdir(target) == ["last.ckpt"] and (target / "last.ckpt").read_bytes() == b"new"
    (staging / "last.ckpt").write_bytes(b"newer")
    cfg = config(dirs, tmp_path, on_conflict="keep")
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "on_conflict keep" in summary["entry_failures"][0]["reason"]
    assert (target / "last.ckpt").read_bytes() == b"new" and (staging / "last.ckpt").read_bytes() == b"newer"
    report = cc_state.status(cfg)
    assert [q["name"] for q in report["quarantined"]] == ["last.ckpt"]
    assert report["staged"][0]["why"].startswith("quarantined after 1 failure(s)")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["quarantined"] == ["last.ckpt"]
    (target / "d").mkdir()
    (target / "d" / "x").write_bytes(b"1")
    (staging / "d").mkdir()
    (staging / "d" / "x").write_bytes(b"2")
    cfg = config(dirs, tmp_path, on_conflict="replace")
    assert "d" in cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"]
    assert everything(target / "d") == {"x": b"2"} and sorted(os.listdir(target)) == ["d", "last.ckpt"]


def test_a_long_name_is_copied(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    name = "c" * 247 + ".ckpt"  # 252 bytes: with the old partial prefix it passed NAME_MAX
    (staging / name).write_bytes(b"long")
    (target / name).write_bytes(b"other")  # and versioned: the aside name is bounded too
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == [name]
    assert (target / name).read_bytes() == b"long" and no_partials(target)
    aside = [n for n in os.listdir(target) if n != name]
    assert len(aside) == 1 and len(aside[0]) <= 255 and (target / aside[0]).read_bytes() == b"other"


def test_a_name_the_target_cannot_hold_is_said_before_the_copy(dirs, tmp_path, monkeypatch):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (staging / ("n" * 120)).write_bytes(b"n")
    real = os.fstatvfs

    class Small:  # pylint: disable=too-few-public-methods
        def __init__(self, st):
            self.f_bavail, self.f_frsize, self.f_namemax = st.f_bavail, st.f_frsize, 100

    monkeypatch.setattr(cc, "_statvfs", lambda fd: Small(real(fd)))
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert "a name of 120 bytes is longer than the target allows (100): not copied" in summary["entry_failures"][0]["reason"]
    assert os.listdir(target) == [] and any("longer than the target allows" in line for line in lines)
    assert "longer than the target allows" in cc_state.status(cfg)["failing"][0]["reason"]


# --------------------------------------------------------------- capacity --

@pytest.fixture
def small_target(tmp_path):
    """A real 2 MiB tmpfs as the target (root only)."""
    target = tmp_path / "target"
    target.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(target)],
                                           capture_output=True, check=False).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def test_an_entry_larger_than_the_free_space_is_said_before_and_others_go_on(tmp_path, small_target):
    staging = tmp_path / "staging"
    staging.mkdir()
    cfg = config((staging, small_target), tmp_path)
    (staging / "big.pt").write_bytes(os.urandom(3 * 1024 * 1024))
    old(staging / "big.pt")
    (staging / "small.pt").write_bytes(b"s" * 1000)
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log)
    assert summary["copied"] == ["small.pt"]
    assert "big.pt needs 3145728 bytes, the target" in summary["entry_failures"][0]["reason"]
    assert "not started" in summary["entry_failures"][0]["reason"] and any("needs 3145728 bytes" in line for line in lines)
    assert os.listdir(small_target) == ["small.pt"]
    report = cc_state.status(cfg)
    assert report["failing"][0]["name"] == "big.pt" and "needs 3145728 bytes" in report["failing"][0]["reason"]
    for attempt in range(6):  # a full target is not the entry's fault: never quarantined
        assert cc_passes.run_pass(cfg, log=log, force=True)["entry_failures"], attempt
    assert cc_state.status(cfg)["quarantined"] == [] and cc_state.status(cfg)["failing"][0]["failures"] == 7


def test_enospc_during_the_copy_cleans_the_partial(tmp_path, small_target, monkeypatch):
    staging = tmp_path / "staging"
    staging.mkdir()
    cfg = config((staging, small_target), tmp_path)
    (staging / "big.pt").write_bytes(os.urandom(3 * 1024 * 1024))
    real = os.fstatvfs

    class Roomy:  # pylint: disable=too-few-public-methods
        def __init__(self, st):
            self.f_bavail, self.f_frsize, self.f_namemax = 1 << 40, 1, st.f_namemax

    monkeypatch.setattr(cc, "_statvfs", lambda fd: Roomy(real(fd)))  # the free-space check passes: a real ENOSPC
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == [] and "No space left on device" in summary["entry_failures"][0]["reason"]
    assert os.listdir(small_target) == [] and os.statvfs(small_target).f_bfree == os.statvfs(small_target).f_blocks
    assert os.path.getsize(staging / "big.pt") == 3 * 1024 * 1024


def test_partials_left_by_crashed_copies_are_cleaned(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    (target / (cc.PARTIAL_PREFIX + "gone.pt")).write_bytes(b"x" * 1000)
    (target / (cc.PARTIAL_PREFIX + "abc") / "d").mkdir(parents=True)
    os.symlink("/nonexistent", target / (cc.PARTIAL_PREFIX + "link"))
    (staging / "n.pt").write_bytes(b"n")
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
    assert summary["copied"] == ["n.pt"] and len(summary["cleaned"]) == 3
    assert os.listdir(target) == ["n.pt"]


# ----------------------------------------------------------- modes, pause --

def test_modes_come_from_the_open_file_and_nested_directories_keep_theirs(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    ck = staging / "step7"
    (ck / "inner").mkdir(parents=True)
    (ck / "inner" / "w.pt").write_bytes(b"w")
    os.chmod(ck / "inner" / "w.pt", 0o6755)  # setuid and setgid never survive a copy
    os.chmod(ck / "inner", 0o750)
    os.chmod(ck, 0o711)
    (staging / "single.pt").write_bytes(b"s")
    os.chmod(staging / "single.pt", 0o640)
    assert sorted(cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"]) == ["single.pt", "step7"]
    assert stat.S_IMODE(os.stat(target / "step7" / "inner" / "w.pt").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(target / "step7" / "inner").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(target / "step7").st_mode) == 0o711
    assert stat.S_IMODE(os.stat(target / "single.pt").st_mode) == 0o640


def test_the_pause_file_never_follows_a_link(dirs, tmp_path):
    staging, target = dirs
    nologin = tmp_path / "etc-nologin"  # stands in for /etc/nologin
    pause = tmp_path / "pause"
    os.symlink(nologin, pause)
    lines, log = quiet_log()
    summary = cc_passes.run_pass(config(dirs, tmp_path, watermark_percent=0, pause_file=str(pause)), log=log)
    assert summary["above_watermark"] and not nologin.exists() and os.path.islink(pause)
    nologin.write_text("keep me")
    cc_passes.run_pass(config(dirs, tmp_path, watermark_percent=100, pause_file=str(pause)), log=log)
    assert os.path.islink(pause) and nologin.read_text() == "keep me"  # a link is never removed nor followed
    assert any("is a link, not a regular file: left alone" in line for line in lines)
    os.unlink(pause)
    cc_passes.run_pass(config(dirs, tmp_path, watermark_percent=0, pause_file=str(pause)), log=log)
    assert stat.S_ISREG(os.lstat(pause).st_mode)
    cc_passes.run_pass(config(dirs, tmp_path, watermark_percent=100, pause_file=str(pause)), log=log)
    assert not os.path.lexists(pause)


# ------------------------------------------------------------- no hangs --

def test_a_hung_target_is_abandoned_within_the_grace_and_holds_no_lock(dirs, tmp_path, monkeypatch):
    """A child in uninterruptible sleep: SIGKILL does nothing (the injected kill), the child sleeps in the hook. The
    pass returns within op_timeout + kill_grace, reports the target hung, and the child holds no lock."""
    staging, target = dirs
    cfg = config(dirs, tmp_path, op_timeout=1, kill_grace=1)
    (staging / "h.pt").write_bytes(b"h" * 100)
    monkeypatch.setitem(cc._HOOKS, "after_chunk", lambda where, offset: time.sleep(60))  # pylint: disable=protected-access
    monkeypatch.setattr(cc_passes, "_kill", lambda pid, sig: None)
    monkeypatch.setattr(cc_passes, "_ABANDONED", [])
    start = time.monotonic()
    try:
        summary = cc_passes.run_pass(cfg, log=quiet_log()[1])
        took = time.monotonic() - start
        assert took < 5, took
        assert "target %s hung" % target in summary["failed"]["reason"] and "did not end 1 s after SIGKILL" in \
            summary["failed"]["reason"]
        assert len(cc_passes._ABANDONED) == 1  # pylint: disable=protected-access
        child = cc_passes._ABANDONED[0]  # pylint: disable=protected-access
        os.kill(child, 0)  # still alive
        fd = os.open(cfg["state_file"] + ".lock", os.O_RDWR)
        try:  # neither a flock nor a POSIX lock held by the abandoned child
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        probe = subprocess.run(["python3", "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                                "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", cfg["state_file"] + ".lock"],
                               capture_output=True, check=False)
        assert probe.returncode == 0, probe.stderr
        monkeypatch.delitem(cc._HOOKS, "after_chunk")  # pylint: disable=protected-access
        assert cc_passes.run_pass(cfg, log=quiet_log()[1], force=True)["copied"] == ["h.pt"]
    finally:
        for pid in list(cc_passes._ABANDONED):  # pylint: disable=protected-access
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_clock_that_was_30_days_ahead_does_not_silence_the_copier(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)  # retry_max 40
    now = time.time()
    ahead = now + 30 * 86400
    (staging / "c.pt").write_bytes(b"c")
    os.rmdir(target)
    assert "unavailable" in cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: ahead)["failed"]["reason"]
    assert cc_state.load_state(cfg["state_file"])["backoff"]["until"] > now + 29 * 86400
    target.mkdir()
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now)  # the clock is back
    assert summary["skipped"].startswith("backing off")
    assert cc_state.load_state(cfg["state_file"])["backoff"]["until"] <= now + 40
    assert cc_state.status(cfg, now=now)["backoff_until"] <= now + 40
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now + 41)["copied"] == ["c.pt"]


def test_an_entry_backoff_from_the_future_is_clamped_too(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    now = time.time()
    os.mkfifo(staging / "p.pt")
    cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now + 30 * 86400)
    assert cc_state.load_state(cfg["state_file"])["entries"]["p.pt"]["until"] > now + 29 * 86400
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now)["waiting"] == ["p.pt"]
    assert cc_state.load_state(cfg["state_file"])["entries"]["p.pt"]["until"] <= now + 40
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now + 41)["entry_failures"][0]["entry"] == "p.pt"


def test_quarantine_after_repeated_failures_shows_in_status_and_preflight(dirs, tmp_path):
    staging, target = dirs
    cfg = config(dirs, tmp_path, quarantine_after=2)
    now = time.time()
    os.mkfifo(staging / "p.pt")
    (staging / "ok.pt").write_bytes(b"ok")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now)["copied"] == ["ok.pt"]
    lines, log = quiet_log()
    summary = cc_passes.run_pass(cfg, log=log, clock=lambda: now + 100)
    assert summary["entry_failures"][0]["entry"] == "p.pt" and any("quarantined after 2" in line for line in lines)
    assert cc_passes.run_pass(cfg, log=log, clock=lambda: now + 10000)["quarantined"] == ["p.pt"]
    report = cc_state.status(cfg, now=now + 10000)
    assert report["quarantined"][0]["name"] == "p.pt" and "is a FIFO" in report["quarantined"][0]["reason"]
    found = P._checkpoint_durable({"config": {}}, report)  # pylint: disable=protected-access
    assert found["check"] == "checkpoint:durable" and found["status"] == "fail"
    assert "1 checkpoint(s) quarantined by the copier" in found["message"] and "p.pt: " in found["message"]


# ----------------------------------------------------------------- garbage --

@pytest.mark.parametrize("content", [
    b"\xff\xfe\x00binary\x80", b"[1, 2]", b"{\"backoff\": \"soon\", \"history\": 5, \"entries\": [1], \"copied\": \"x\"}",
    b"{\"backoff\": {\"until\": 1e400, \"seconds\": null}, \"history\": [1, {\"at\": \"x\"}], \"last_error\": 3, "
    b"\"entries\": {\"a\": 5, \"b\": {\"failures\": \"x\", \"until\": []}}}",
    b"[" * 100000,
], ids=["binary", "a list", "wrong types", "wrong inner types", "too deep"])
def test_load_state_survives_garbage(dirs, tmp_path, content):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    os.makedirs(os.path.dirname(cfg["state_file"]))
    with open(cfg["state_file"], "wb") as handle:
        handle.write(content)
    state = cc_state.load_state(cfg["state_file"])
    assert isinstance(state["backoff"]["until"], (int, float)) and isinstance(state["history"], list)
    (staging / "g.pt").write_bytes(b"g")
    assert cc_state.status(cfg)["staged"][0]["name"] == "g.pt"
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["g.pt"]


def test_a_binary_mountinfo_is_read_without_a_traceback(dirs, tmp_path):
    staging, target = dirs
    table = tmp_path / "mountinfo-binary"
    table.write_bytes(b"22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                      b"30 22 0:50 / /mnt/\xff\xfe rw - xfs /dev/\x80 rw\n"
                      b"40 22 0:45 / " + str(target).encode() + b" rw,relatime shared:20 - nfs4 server:/export rw\n"
                      b"\x00\x01garbage\n")
    cfg = config(dirs, tmp_path, mountinfo_path=str(table))
    (staging / "m.pt").write_bytes(b"m")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1])["copied"] == ["m.pt"]
    assert any(point == "/mnt/\udcff\udcfe" for point, _fs, _src in cc_config.parse_mountinfo(cc_config.read_mountinfo(str(table))))


@pytest.mark.parametrize("over,option,expected", [
    ({"on_conflict": "overwrite"}, "on_conflict", "one of version, replace, keep"),
    ({"quarantine_after": 0}, "quarantine_after", "an integer of at least 1"),
    ({"quarantine_after": True}, "quarantine_after", "an integer of at least 1"),
    ({"kill_grace": 0}, "kill_grace", "above 0"),
])
def test_new_settings_are_checked(dirs, tmp_path, over, option, expected):
    with pytest.raises(cc_config.CopierError) as err:
        config(dirs, tmp_path, **over)
    assert err.value.details["option"] == option and expected in err.value.expected
    assert set(cc_config.DEFAULTS) >= {"on_conflict", "quarantine_after", "kill_grace"}
    assert cc_config.DEFAULTS["on_conflict"] == "version"


def test_hashlib_partial_name_is_bounded():
    for name in ("a", "x" * 255, "é" * 127):
        assert len(cc.partial_name(name).encode()) <= 64 and cc.partial_name(name).startswith(cc.PARTIAL_PREFIX)
    assert cc.partial_name("a") == cc.PARTIAL_PREFIX + hashlib.sha256(b"a").hexdigest()[:32]


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_cli_bad_deadline_is_a_usage_error(tmp_path, capsys, value):
    from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import cli as _ckpt_cli  # pylint: disable=import-outside-toplevel
    assert _ckpt_cli.main(["--deadline", value, str(tmp_path / "copier.json")]) == 2
    assert "--deadline %r is not a number of seconds above 0" % value in capsys.readouterr().err


# ------------------------------------------------ the target's health kept apart --

def test_a_refused_link_is_an_entry_failure_never_the_targets(dirs, tmp_path, secret):
    """One trainer's link to /etc/shadow is refused (checkpoint:durable's), but the target is fine: last_error names
    the link, last_target_error stays empty and preflight's checkpoint:target passes."""
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    now = time.time()
    (staging / "ok.pt").write_bytes(b"ok")
    assert cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now)["copied"] == ["ok.pt"]
    os.symlink(str(secret), str(staging / "x.pt"))
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now + 100)
    assert summary["entry_failures"][0]["entry"] == "x.pt" and summary["failed"] is None
    report = cc_state.status(cfg, now=now + 100)
    assert report["last_error"]["entry"] == "x.pt" and report["last_error"]["at"] == now + 100
    assert report["last_target_error"] is None and report["failing"][0]["name"] == "x.pt"
    found = P._checkpoint_target(report)  # pylint: disable=protected-access
    assert found["status"] == "pass", found
    assert "x.pt" in found["message"] and "checkpoint:durable" in found["message"]
    assert found["evidence"]["last_target_error"] is None and found["evidence"]["last_error"] == report["last_error"]
    assert os.listdir(str(target)) == ["ok.pt"]


def test_a_target_failure_is_cleared_by_the_next_successful_probe_even_without_a_copy(dirs, tmp_path, secret):
    staging, target = dirs
    cfg = config(dirs, tmp_path)
    now = time.time()
    os.symlink(str(secret), str(staging / "x.pt"))
    os.rmdir(str(target))
    assert "unavailable" in cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now)["failed"]["reason"]
    report = cc_state.status(cfg, now=now)
    assert report["last_target_error"] == report["last_error"] and report["last_target_error"]["entry"] is None
    found = P._checkpoint_target(report)  # pylint: disable=protected-access
    assert found["status"] == "fail" and found["message"].startswith("the copier cannot reach the target: target ")
    target.mkdir()
    summary = cc_passes.run_pass(cfg, log=quiet_log()[1], clock=lambda: now + 41)   # after the backoff; only x.pt to copy
    assert summary["copied"] == [] and summary["entry_failures"][0]["entry"] == "x.pt"
    report = cc_state.status(cfg, now=now + 41)
    assert report["last_target_error"] is None and report["last_error"]["entry"] == "x.pt"
    assert P._checkpoint_target(report)["status"] == "pass"  # pylint: disable=protected-access


@pytest.mark.parametrize("backoff, target_failing", [(True, True), (False, False)], ids=["in-backoff", "no-backoff"])
def test_a_state_file_without_last_target_error_still_loads(dirs, tmp_path, backoff, target_failing):
    """A state file of the copier before last_target_error: a backoff still set means its last error was the
    target's (only a target failure set it, only a copy cleared it); without one the last error was an entry's."""
    cfg = config(dirs, tmp_path)
    now = time.time()
    old = {"copied": 1, "retried": 1, "present": 0, "bytes_copied": 2, "history": [{"at": now - 50, "name": "a.pt"}],
           "last_error": {"at": now - 10, "entry": None if backoff else "x.pt", "reason": "gone"},
           "backoff": {"seconds": 5, "until": now + 5} if backoff else {"seconds": 0, "until": 0},
           "last_pass": now - 10, "entries": {}}
    os.makedirs(os.path.dirname(cfg["state_file"]))
    with open(cfg["state_file"], "w") as handle:
        json.dump(old, handle)
    state = cc_state.load_state(cfg["state_file"])
    assert state["last_error"]["reason"] == "gone"
    assert state["last_target_error"] == (state["last_error"] if target_failing else None)
    found = P._checkpoint_target(cc_state.status(cfg, now=now))  # pylint: disable=protected-access
    assert found["status"] == ("fail" if target_failing else "pass")
