# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Small readers for procfs/sysfs style trees, shared by the private module_utils.

Standard library only. Every function takes a full path (build it from a root
parameter with :func:`join`); none of them raises for a missing or unreadable
file, they return the ``default`` instead, because sysfs files come and go with
kernel versions and drivers.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError


class TreeError(DetailedError):
    """A root or a procfs/sysfs file that is missing, is not in the kernel's layout, or is not of this system.

    ``details`` names the path (and the option, the bad value and what was
    expected) for ``fail_json``. Deliberately not a NicError: a tree that
    cannot be read is an error even where a missing NIC only degrades.
    """


def join(root, *parts):
    """Join ``parts`` under ``root``; absolute parts are re-rooted, not escaped to /."""
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def _open_regular(path):
    """``path`` opened for reading as text when it is a regular file (every procfs and sysfs attribute is one), else
    None. Opened with ``O_NONBLOCK`` and checked on the descriptor, so a FIFO or a device planted in a captured tree
    reads as missing instead of hanging the module or reading a device."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "r", encoding="utf-8", errors="replace")


def read_raw(path, default=None):
    """File content unstripped, or ``default`` (also for a FIFO, socket or device: see :func:`_open_regular`)."""
    try:
        handle = _open_regular(path)
        if handle is None:
            return default
        with handle:
            return handle.read()
    except (OSError, ValueError):
        return default


def read_text(path, default=None):
    """File content with surrounding whitespace stripped, or ``default`` (as :func:`read_raw`)."""
    text = read_raw(path)
    return default if text is None else text.strip()


def read_data(path, limit=65536, default=None):
    """A small file that may have been planted (a captured tree, a directory another user writes): opened with
    ``O_NOFOLLOW`` (a link is not followed) and ``O_NONBLOCK`` (a FIFO does not hang), and read only when the opened
    descriptor is a regular file; at most ``limit`` bytes, as text. ``default`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return default
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return default
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return default
    finally:
        os.close(fd)


def real_dir(path):
    """Whether ``path`` is a directory and not a link to one (``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_int(path, default=None, base=10):
    text = read_text(path)
    if text is None:
        return default
    try:
        return int(text, base)
    except ValueError:
        return default


def write_kernel_file(path, text):
    """The one writer of kernel files (procfs, sysfs, cgroupfs): ``text`` in one ``write(2)``, as the kernel takes a
    value, without ``O_CREAT`` (a file that is not there is an error, never a new regular file in a tree); ASCII,
    which every value the validator passes is."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def read_cpulist(path, default=None):
    """A CPU list file (``0-3,8``); ``(null)`` and empty read as ``[]``."""
    text = read_text(path)
    if text is None:
        return default
    if text in ("(null)", "none"):
        return []
    try:
        return parse_cpulist(text)
    except CpuListError:
        return default


def list_dir(path):
    """Sorted entries of a directory, ``[]`` when it does not exist."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def link_name(path):
    """Basename of a symlink's target (``driver`` links), or None."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


# The only commands the readers ever run (``ethtool -l``, ``ip -j addr``, ``systemctl is-active``...), for the
# module glue below and for the boot-time entry point (_nic_irq.pin_cli); the nic_selector doc fragment names them.
ALLOWED_COMMANDS = ("ethtool", "ip", "systemctl")


def module_runner(module, commands=ALLOWED_COMMANDS):
    """A ``run(argv) -> (rc, out, err)`` for module glue, built on ``module.run_command``.

    Only the listed commands run, resolved with ``module.get_bin_path``; a
    missing one returns rc 127 instead of failing the module. Duck-typed: no
    Ansible import here.
    """
    paths = {}

    def run(argv):
        name = argv[0]
        if name not in commands:
            return 127, "", "%s is not an allowed command" % name
        if name not in paths:
            paths[name] = module.get_bin_path(name)
        if paths[name] is None:
            return 127, "", "%s is not installed" % name
        rc, out, err = module.run_command([paths[name]] + list(argv[1:]), environ_update={"LC_ALL": "C"})
        return rc, out, err

    return run


def exit_with(module, result, diff, warnings=()):
    """The end of every module's main(): each warning through ``module.warn``, the diff only in --diff mode, then
    ``exit_json``. Duck-typed: no Ansible import here."""
    for warning in warnings:
        module.warn(warning)
    if module._diff:  # pylint: disable=protected-access
        result["diff"] = diff
    module.exit_json(**result)


class LockError(DetailedError):
    """An ``exclusive_lock`` that could not be taken: its file cannot be opened (a link planted there, no
    permission) or another holder kept it past the wait."""


class exclusive_lock(object):
    """``flock(LOCK_EX)`` on ``path`` (created 0600, never through a link), waited for at most ``wait`` seconds.

    The NIC IRQ pins are written by two programs: the nic_irq_persist module (pins, state file, read-back) and the
    boot/udev/if-up/re-check entry point (state file, pins). Holding one lock across each one's pass means neither
    reads the other's half-written pins or applies a state file that the other is replacing. ``stop`` (a callable)
    ends the wait early (SIGTERM noted by the entry point). Raises ``LockError`` naming the path. ``path`` None
    takes no lock (check mode: creating the lock file would be a change). The file is left in place on release:
    removing it would let a later run lock a new file while an earlier one still holds the old.
    """

    def __init__(self, path, wait, sleep=None, clock=None, stop=None):
        self.path, self.wait, self.fd = path, wait, None
        self.sleep, self.clock = sleep or time.sleep, clock or time.monotonic
        self.stop = stop or (lambda: False)

    def __enter__(self):
        if self.path is None:
            return self
        parent = os.path.dirname(self.path)
        try:
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, 0o755)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LockError("cannot open the lock %s: %s" % (self.path, exc.strerror or exc), path=self.path,
                            expected="a regular file that root can create or open, not a link")
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            self.fd = None
            raise LockError("the lock %s is not a regular file" % self.path, path=self.path,
                            expected="a regular file that root can create or open, not a link")
        deadline = None
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if deadline is None:        # the clock is read only when the lock is busy
                    deadline = self.clock() + self.wait
                stopped = self.stop()
                if stopped or self.clock() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise LockError("another run holds the lock %s (%s)" % (
                        self.path, "the wait was stopped" if stopped else "waited %.0f s" % self.wait),
                        path=self.path, stopped=bool(stopped))
                self.sleep(0.1)

    def __exit__(self, *_exc):
        if self.fd is not None:
            os.close(self.fd)          # closing the descriptor releases the flock
            self.fd = None
        return False
