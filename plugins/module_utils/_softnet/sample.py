# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check, part 1 of 4: read the proc files it samples (their parsers are ``_parse.procfs``).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``read_sample`` takes one snapshot: the raw text of every file, read
back to back, parsed later so that the reads sit as close together as possible.
"""

from __future__ import annotations

import os
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import read_raw
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import SoftnetError


def _read_text(path, required=True):
    """The file's text (``_host.fileio.read_raw``); None for an optional file that cannot be read."""
    text = read_raw(path)
    if text is None and required:
        why = "no such file" if not os.path.lexists(path) else "not readable"
        raise SoftnetError("cannot read %s: %s" % (path, why), value=path, expected="a readable proc file", path=path)
    return text


def read_sample(procfs="/proc", clock=time.monotonic):
    """One snapshot: the raw text of every signal, read back to back.

    Parsing happens later (``compute_signals``, ``_softnet.check.irq_cpus_fired``) so
    that the five reads sit as close together as possible. ``softirqs``,
    ``net_dev`` and ``interrupts`` are None when the file is missing.
    """
    started = clock()
    sample = {
        "softnet_stat": _read_text(os.path.join(procfs, "net", "softnet_stat")),
        "stat": _read_text(os.path.join(procfs, "stat")),
        "softirqs": _read_text(os.path.join(procfs, "softirqs"), required=False),
        "net_dev": _read_text(os.path.join(procfs, "net", "dev"), required=False),
        # Where the NIC's queue IRQs really fire during the window (``_softnet.check.irq_cpus_fired``).
        "interrupts": _read_text(os.path.join(procfs, "interrupts"), required=False),
    }
    finished = clock()
    sample["time"] = (started + finished) / 2.0
    sample["read_seconds"] = finished - started
    # Wall-clock instant of the sample (the report's sampling window; lines up
    # other tools' per-second output, mpstat's, with this window).
    sample["wall"] = time.time() - (clock() - sample["time"])
    return sample
