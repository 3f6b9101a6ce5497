# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):
    """Where a module works: this host, or a captured or generated tree (module_utils/_host/target.py decides it).

    One sub-fragment per kind of target. The argument specs are the modules' own
    (``type="path"``, defaults ``/proc``, ``/sys`` and ``/``); validate-modules holds each module's spec to these.
    What a module reads or writes under a root beyond this goes in its own notes.
    """

    # procfs_path and sysfs_path: the modules whose target is the pair T/proc, T/sys.
    PROCFS_SYSFS = r"""
options:
  procfs_path:
    description:
      - Root of procfs, C(/proc) on this host. Another path is a captured or generated tree (C(T/proc) with
        O(sysfs_path) C(T/sys)), which is read (and, by a module that changes the node, written) instead of this host,
        and where no command runs - it would describe this host, not the tree. Files outside C(proc) and C(sys)
        (C(etc), C(run), C(dev)) are then the tree's, under the parent of O(procfs_path).
      - Give O(procfs_path) and O(sysfs_path) of one system, the live C(/proc) and C(/sys) or C(T/proc) and C(T/sys) of
        one tree; a module that writes refuses two systems. A root that does not exist or does not look like its
        filesystem fails, naming the path.
    type: path
    default: /proc
  sysfs_path:
    description: Root of sysfs, C(/sys) on this host. See O(procfs_path).
    type: path
    default: /sys
"""

    # sysfs_path alone: the modules that read only sysfs and take it as their target.
    SYSFS = r"""
options:
  sysfs_path:
    description:
      - Root of sysfs, C(/sys) on this host. Another path is a captured or generated tree (C(T/sys)), read instead of
        this host; no command runs there.
    type: path
    default: /sys
"""

    # root: the modules whose target is a system root T (files under it, such as T/etc).
    ROOT = r"""
options:
  root:
    description:
      - Directory every path is read and written under, C(/) on this host. Another directory is a captured, copied or
        generated tree - the files are planned and written under it only, and no command runs, because it would act
        on this host, not the tree.
    type: path
    default: /
"""
