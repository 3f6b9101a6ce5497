# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one test of "this host or a tree" (_host.target): real paths, so every module agrees on a link to /proc."""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import (
    is_live,
    is_live_root,
    roots_mixed,
    runner_for_roots,
)


class Module(object):
    """The two methods module_runner uses; nothing runs."""

    def get_bin_path(self, name):
        return "/bin/" + name

    def run_command(self, argv, environ_update=None):
        return 0, " ".join(argv), ""


def test_links_to_the_live_roots_are_the_live_system_for_the_runner_and_the_write_guard_alike(tmp_path):
    os.symlink("/proc", str(tmp_path / "proc"))
    os.symlink("/sys", str(tmp_path / "sys"))
    procfs, sysfs = str(tmp_path / "proc"), str(tmp_path / "sys")
    assert is_live(procfs, sysfs) and is_live("/proc/", "/sys/")
    # Commands run on the live system however it is spelled, and the write guard sees one system.
    run = runner_for_roots(Module(), procfs, sysfs, commands=("ethtool",))
    assert run is not None and run(["ethtool", "-l", "eth0"])[1] == "/bin/ethtool -l eth0"
    assert roots_mixed(procfs, sysfs) is None


def test_a_tree_runs_no_command_and_a_half_live_pair_is_mixed(tmp_path):
    for name in ("proc", "sys"):
        (tmp_path / name).mkdir()
    procfs, sysfs = str(tmp_path / "proc"), str(tmp_path / "sys")
    assert not is_live(procfs, sysfs)
    assert runner_for_roots(Module(), procfs, sysfs) is None
    assert not is_live(procfs, "/sys") and runner_for_roots(Module(), "/proc", sysfs) is None
    assert "is the live system" in roots_mixed("/proc", sysfs)
    assert is_live_root("/") and is_live_root("") and not is_live_root(str(tmp_path))
