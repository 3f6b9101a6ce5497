# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_fileio.exclusive_lock: the lock the NIC IRQ pin module and the boot-time entry point share, on real flock."""

from __future__ import annotations

import fcntl
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import LockError, exclusive_lock
from treegen import flock_held


def test_the_lock_is_created_0600_held_inside_and_released_after(tmp_path):
    path = tmp_path / "run" / "gpunode" / "x.lock"
    with exclusive_lock(str(path), 1):
        assert flock_held(path)
        assert os.stat(str(path)).st_mode & 0o7777 == 0o600
    assert not flock_held(path) and path.is_file()                       # left in place, free


def test_no_path_takes_nothing_and_creates_nothing(tmp_path):
    with exclusive_lock(None, 1):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_busy_lock_is_waited_for_up_to_the_bound_then_named(tmp_path):
    path = tmp_path / "x.lock"
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    now, slept = [100.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    try:
        with pytest.raises(LockError) as err:
            with exclusive_lock(str(path), 2, sleep=sleep, clock=lambda: now[0]):
                pass
    finally:
        os.close(fd)
    assert str(path) in str(err.value) and "another run holds" in str(err.value)
    assert 1.9 <= sum(slept) <= 2.25, slept                          # the bound, give or take one 0.1 s step


def test_a_stop_request_ends_the_wait_at_once(tmp_path):
    path = tmp_path / "x.lock"
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    slept = []
    try:
        with pytest.raises(LockError):
            with exclusive_lock(str(path), 60, sleep=slept.append, stop=lambda: True):
                pass
    finally:
        os.close(fd)
    assert slept == []


def test_a_link_planted_at_the_lock_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "etc-shadow"
    path = tmp_path / "x.lock"
    path.symlink_to(target)
    with pytest.raises(LockError) as err:
        with exclusive_lock(str(path), 1):
            pass
    assert str(path) in str(err.value) and err.value.details["path"] == str(path)
    assert not target.exists()                                        # nothing created through the link


def test_a_fifo_at_the_lock_is_refused_without_blocking(tmp_path):
    path = tmp_path / "x.lock"
    os.mkfifo(str(path))
    with pytest.raises(LockError) as err:
        with exclusive_lock(str(path), 1):
            pass
    assert "not a regular file" in str(err.value)
