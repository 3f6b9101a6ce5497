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

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import CpuListError, parse_cpulist


def join(root, *parts):
    """Join ``parts`` under ``root``; absolute parts are re-rooted, not escaped to /."""
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def read_text(path, default=None):
    """File content with surrounding whitespace stripped, or ``default``."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return default


def read_raw(path, default=None):
    """File content unstripped, or ``default``."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, ValueError):
        return default


def read_int(path, default=None, base=10):
    text = read_text(path)
    if text is None:
        return default
    try:
        return int(text, base)
    except ValueError:
        return default


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
# module glue below and for the boot-time entry point (_irq_pin_cli); the nic_selector doc fragment names them.
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


def runner_for_roots(module, procfs, sysfs, commands=ALLOWED_COMMANDS):
    """``module_runner`` when the roots are this host's ``/proc`` and ``/sys``, else None.

    Commands describe the live host, so on a captured or generated tree they
    must not run: the readers then use the tree's files only.
    """
    if os.path.normpath(procfs) == "/proc" and os.path.normpath(sysfs) == "/sys":
        return module_runner(module, commands)
    return None
