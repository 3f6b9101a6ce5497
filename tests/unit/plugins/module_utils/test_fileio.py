# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The tree readers of _host.fileio on what a captured tree may hold besides files: a FIFO, a device, a link."""

from __future__ import annotations

import os
import signal

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import (
    read_cpulist,
    read_int,
    read_raw,
    read_text,
    write_kernel_file,
)


@pytest.fixture
def hang_guard():
    """A reader that blocks (open() of a FIFO nobody writes) fails the test after 5 s instead of hanging the suite."""

    def _alarm(_signum, _frame):
        raise AssertionError("the reader blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("reader", [read_raw, read_text, read_int, read_cpulist])
def test_a_fifo_in_a_tree_reads_as_missing_without_blocking(tmp_path, hang_guard, reader):
    fifo = tmp_path / "sys" / "devices" / "system" / "cpu" / "online"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(str(fifo))
    assert reader(str(fifo), default="missing") == "missing"


def test_a_device_in_a_tree_is_not_read(tmp_path, hang_guard):
    # /dev/zero behind a link in a tree: a reader that opened it would read zeros (or forever from /dev/urandom).
    link = tmp_path / "proc" / "interrupts"
    link.parent.mkdir(parents=True)
    os.symlink("/dev/zero", str(link))
    assert read_raw(str(link), default=None) is None
    assert read_text(str(link), default="missing") == "missing"


def test_regular_files_and_links_inside_the_tree_still_read(tmp_path):
    # sysfs is made of links (class/net/X/device -> ../../devices/...); a tree keeps them as relative links.
    device = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:03.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    (device / "local_cpulist").write_text("4-7\n")
    net = tmp_path / "sys" / "class" / "net" / "ens3"
    net.mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:03.0", str(net / "device"))
    assert read_raw(str(net / "device" / "numa_node")) == "1\n"
    assert read_text(str(net / "device" / "numa_node")) == "1"
    assert read_int(str(net / "device" / "numa_node")) == 1
    assert read_cpulist(str(net / "device" / "local_cpulist")) == [4, 5, 6, 7]
    assert read_text(str(net / "device" / "absent"), default="d") == "d"


def test_procfs_files_of_this_host_are_regular_and_read():
    # The live /proc reports its files as regular files of size 0; the regular-file check must not refuse them.
    assert read_text("/proc/self/stat").split()[0] == str(os.getpid())
    assert read_cpulist("/sys/devices/system/cpu/online")


def test_the_kernel_file_writer_never_creates_a_file(tmp_path):
    """The one writer of procfs/sysfs/cgroupfs values (pins, RPS masks, governors, cpuset.cpus): a file that is not
    there is an error - a kernel file cannot be made by writing it, and in a tree a new regular file would be a
    value the tree never had - and an existing one gets exactly the text, replacing what was there."""
    missing = tmp_path / "irq" / "42" / "smp_affinity_list"
    missing.parent.mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        write_kernel_file(str(missing), "3\n")
    assert not missing.exists()
    present = tmp_path / "scaling_governor"
    present.write_text("powersave\n")
    write_kernel_file(str(present), "performance")
    assert present.read_text() == "performance"
    with pytest.raises(UnicodeEncodeError):
        write_kernel_file(str(present), "perf\u00e9")
