# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The target of a module: this host, or a captured or generated tree, and the one way to tell them apart.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports (duck-typed module glue).
A module reads and writes either the live node (``/proc``, ``/sys``, ``/``: commands run) or a tree (``T/proc``,
``T/sys``, ``T``: its files only, no command, because a command would describe this host, not the tree). Every
module decides it here: :func:`is_live` and :func:`is_live_root` (real paths, so a link to ``/proc`` is the live
system), :func:`runner_for_roots` (commands only on the live system), :func:`check_roots` / :func:`missing_cpu_root`
/ :func:`roots_problem` (a root that is not a procfs/sysfs, or roots of two systems, fail naming the option), and
:func:`root_of` / :func:`tree_which` (the system root and its tools); :class:`Target` carries the decision (roots,
runner, check mode) through a module's run.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import ALLOWED_COMMANDS, TreeError, join, module_runner
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import Systemd


def is_live(procfs="/proc", sysfs="/sys"):
    """Whether ``procfs`` and ``sysfs`` are this host's ``/proc`` and ``/sys`` (real paths)."""
    return os.path.realpath(procfs) == "/proc" and os.path.realpath(sysfs) == "/sys"


def is_live_root(root):
    """Whether ``root`` (a module's ``root`` option) is this host's / - then commands that change the host may run."""
    return os.path.realpath(root or "/") == "/"


def runner_for_roots(module, procfs, sysfs, commands=ALLOWED_COMMANDS):
    """``module_runner`` when the roots are this host's ``/proc`` and ``/sys``, else None.

    Commands describe the live host, so on a captured or generated tree they
    must not run: the readers then use the tree's files only.
    """
    if is_live(procfs, sysfs):
        return module_runner(module, commands)
    return None


# What must exist under each root for it to be a procfs/sysfs at all: without it
# every reader falls back to its default and the results mislead ("interface
# does not exist", every IRQ "control").
ROOT_MARKERS = (("procfs_path", "interrupts", "a procfs (it has no interrupts file)"),
                ("sysfs_path", "class/net", "a sysfs (it has no class/net directory)"))


def roots_mixed(procfs, sysfs):
    """Why ``procfs`` and ``sysfs`` are not the roots of one system, or None.

    One system: both the live ``/proc`` and ``/sys``, or two directories of the
    same parent (a captured or generated tree ``T/proc`` and ``T/sys``).
    """
    real_proc, real_sys = os.path.realpath(procfs), os.path.realpath(sysfs)
    live_proc, live_sys = real_proc == "/proc", real_sys == "/sys"
    if live_proc and live_sys:
        return None
    if live_proc != live_sys:
        live, tree = ("procfs_path", "sysfs_path") if live_proc else ("sysfs_path", "procfs_path")
        return "%s %s is the live system but %s %s is not" % (
            live, procfs if live_proc else sysfs, tree, sysfs if live_proc else procfs)
    if os.path.dirname(real_proc) != os.path.dirname(real_sys):
        return "procfs_path %s and sysfs_path %s are in different trees (%s, %s)" % (
            procfs, sysfs, os.path.dirname(real_proc), os.path.dirname(real_sys))
    return None


def missing_cpu_root(procfs, sysfs):
    """The fail_json arguments naming the first root that is not a directory (for sysfs: without
    devices/system/cpu), or None. A missing root would read as "no isolated CPUs, not installed"."""
    for option, root, path, expected in (("procfs_path", procfs, procfs, "a procfs root"),
                                         ("sysfs_path", sysfs, join(sysfs, "devices/system/cpu"),
                                          "a sysfs root with devices/system/cpu")):
        if not os.path.isdir(path):
            return dict(msg="%s %s is not %s" % (option, root, expected), option=option, value=root, path=path, expected=expected)
    return None


def check_roots(procfs, sysfs, write=False):
    """Raise TreeError naming the path when a root is missing or is not a procfs/sysfs.

    With ``write`` also when the two roots are not one system (:func:`roots_mixed`):
    a write must never mix a captured tree with the live ``/proc`` (it would
    write the capture's IRQ numbers into this host) nor two different trees.
    """
    for (option, marker, what), root in zip(ROOT_MARKERS, (procfs, sysfs)):
        if not root:
            raise TreeError("%s is empty" % option, option=option, value=root, expected="a directory such as /%s" % option[:-7])
        if not os.path.exists(root):
            raise TreeError("%s %s does not exist" % (option, root), option=option, path=root, value=root,
                            expected="an existing %s root" % option[:-7])
        if not os.path.isdir(root):
            raise TreeError("%s %s is not a directory" % (option, root), option=option, path=root, value=root,
                            expected="a %s root directory" % option[:-7])
        if not os.path.exists(join(root, marker)):
            raise TreeError("%s %s is not %s" % (option, root, what), option=option, path=join(root, marker), value=root,
                            expected="a %s root with %s" % (option[:-7], marker))
    if write:
        why = roots_mixed(procfs, sysfs)
        if why:
            raise TreeError(
                "%s: procfs_path %s and sysfs_path %s are not the same system, and a write never mixes a captured tree "
                "with the live /proc or /sys; give both roots of one tree (T/proc and T/sys) or neither" % (why, procfs, sysfs),
                option="procfs_path", value={"procfs_path": procfs, "sysfs_path": sysfs},
                expected="/proc and /sys, or T/proc and T/sys of one tree",
            )


def root_of(procfs):
    """The system root that holds ``procfs``: "/" for /proc, else the tree's root."""
    path = os.path.normpath(procfs)
    return "/" if path == "/proc" else os.path.dirname(path)


TOOL_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")


def tree_which(root):
    """``which(name)`` for a tree: the tool's path under ``root`` (usr/sbin, sbin, ...), or None."""
    def which(name):
        for directory in TOOL_DIRS:
            path = os.path.join(root, directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None
    return which


def roots_problem(root, sysfs):
    """The fail_json arguments when ``root`` or ``sysfs`` cannot be used, or they mix the live host with a tree."""
    if not root or not os.path.isdir(root):
        return dict(msg="root %s is not a directory" % root, option="root", value=root, expected="/ or the root of a tree")
    if not sysfs or not os.path.isdir(join(sysfs, "devices/system/cpu")):
        return dict(msg="sysfs_path %s is not a sysfs root with devices/system/cpu" % sysfs, option="sysfs_path",
                    value=sysfs, path=join(sysfs or "", "devices/system/cpu"), expected="a sysfs root with devices/system/cpu")
    live_root, live_sys = is_live_root(root), os.path.realpath(sysfs) == "/sys"
    if live_root != live_sys:
        return dict(msg="root %s and sysfs_path %s are not the same system (one is the live host, the other a tree): "
                        "give root and sysfs_path of one tree (T and T/sys) or neither" % (root, sysfs),
                    option="sysfs_path" if live_root else "root", value={"root": root, "sysfs_path": sysfs},
                    expected="/ and /sys, or T and T/sys of one tree")
    return None


class Target(object):
    """Where a module works, built once by the module (:func:`_host.module.module_target`): the live node or a tree.

    ``root``/``procfs``/``sysfs``: the roots read and written; ``live``: whether they are this host's; ``run``: the
    runner of the allowed commands (:func:`_host.fileio.module_runner`): on a tree None, or only the tools that read
    the files they are given (a GRUB script check), never one that reads this host; ``check``: check mode; ``which``:
    a tool's path or None; ``call``: ``argv -> (rc, out, err)`` for one absolute path the validator passed (an
    interpreter to probe), live only; ``os_family``: ``() -> ansible_facts.os_family`` of the live node, or None.
    :meth:`systemd` gives the one systemd wrapper on this target.
    """

    def __init__(self, root="/", procfs="/proc", sysfs="/sys", run=None, check=False, which=None, call=None,
                 os_family=None, live=None):
        self.root, self.procfs, self.sysfs = root, procfs, sysfs
        self.run, self.check, self.call, self.os_family = run, check, call, os_family
        self.which = which or tree_which(root)
        self.live = run is not None if live is None else live

    def systemd(self, error=None, why=None):
        """The :class:`_host.systemd.Systemd` of this target (on a tree it only records); ``error``: the caller's
        error class."""
        kwargs = dict((k, v) for k, v in (("error", error), ("why", why)) if v is not None)
        return Systemd(self.run if self.live else None, self.check, **kwargs)


# The options that name a module's target, spelled and typed the same in every module (one doc fragment:
# gpunode.tuning.target): the kernel's views and the root of the files.
TARGET_OPTIONS = {
    "procfs_path": dict(type="path", default="/proc"),
    "sysfs_path": dict(type="path", default="/sys"),
    "root": dict(type="path", default="/"),
}


def target_spec(*names):
    """The argument spec entries of the target options ``names`` (``procfs_path``, ``sysfs_path``, ``root``)."""
    return dict((name, dict(TARGET_OPTIONS[name])) for name in names)
