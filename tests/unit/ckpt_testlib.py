# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers shared by the checkpoint copier's unit tests (test_ckpt_copier.py, test_ckpt_copier_hostile.py)."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import config as cc_config


def mounted(tmp_path, target, source="server:/export"):
    """A SYNTHETIC mount table with ``target`` mounted over NFS (the test's directories are on the host's /)."""
    path = tmp_path / ("mountinfo-%s" % source.replace("/", "_").replace(":", "_"))
    path.write_text("22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                    "40 22 0:45 / %s rw,relatime shared:20 - nfs4 %s rw,vers=4.2,hard\n" % (target, source))
    return str(path)


def config(dirs, tmp_path, **over):
    """The copier's checked configuration for (staging, target) ``dirs``, the target on a synthetic NFS mount."""
    raw = {"staging_dir": str(dirs[0]), "target_dir": str(dirs[1]), "state_file": str(tmp_path / "state" / "state.json"),
           "retry_min": 5, "retry_max": 40, "op_timeout": 5, "mountinfo_path": mounted(tmp_path, dirs[1]),
           "target_mount": {"point": str(dirs[1]), "fstype": "nfs4", "source": "server:/export"}}
    raw.update(over)
    return cc_config.check_config(raw)


def quiet_log():
    """(the lines logged, the log function)."""
    lines = []
    return lines, lines.append
