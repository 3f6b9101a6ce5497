# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint copier's command line: the node-side entry point runs this, with the code of ``_checkpoint``.

Usage: ``gpunode-ckpt-copier [--status] [--deadline SECONDS] CONFIG``

Without ``--status`` it runs copier passes until a pass copies nothing, the
target fails (the state file then holds the backoff) or the deadline passes,
and exits 0; an entry that fails is skipped with its own backoff (and
quarantined after ``quarantine_after`` failures) while the others go on.
``--force`` ignores every backoff and quarantine for the first pass. A
configuration that is not valid exits 2 naming the value. With ``--status`` it
prints :func:`_checkpoint.state.status` as JSON (``quarantined`` and ``failing``
entries with their reasons) and changes nothing.
Log lines go to stdout, which systemd sends to the journal.
"""

from __future__ import annotations

import json
import math
import sys
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.config import CopierError, check_config
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.passes import run_pass
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.state import status
from ansible_collections.gpunode.tuning.plugins.module_utils._host.cli import UsageError, parse_args


def _log(message):
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _seconds(value):
    """``--deadline``'s value: a finite number of seconds above 0 (ValueError otherwise)."""
    deadline = float(value)
    if not math.isfinite(deadline) or deadline <= 0:
        raise ValueError(value)
    return deadline


def main(argv=None):
    try:
        values, args = parse_args(sys.argv[1:] if argv is None else argv, flags=("--status", "--force"),
                                  options={"--deadline": _seconds}, prefix="--", options_first=True)
    except UsageError as exc:
        if exc.value is None:
            sys.stderr.write("unknown option %s\n" % exc.option)
        else:
            sys.stderr.write("--deadline %r is not a number of seconds above 0\n" % exc.value)
        return 2
    want_status, force = values.get("--status", False), values.get("--force", False)
    deadline = values.get("--deadline", 3000.0)
    if len(args) != 1:
        sys.stderr.write("usage: gpunode-ckpt-copier [--status] [--force] [--deadline SECONDS] CONFIG\n")
        return 2
    try:
        with open(args[0], "r", encoding="utf-8") as handle:
            cfg = check_config(json.load(handle))
    except (OSError, ValueError) as exc:
        sys.stderr.write("gpunode-ckpt-copier: %s: %s\n" % (args[0], exc))
        return 2
    if want_status:
        sys.stdout.write(json.dumps(status(cfg), indent=1, sort_keys=True) + "\n")
        return 0
    start = time.monotonic()
    while True:
        left = deadline - (time.monotonic() - start)
        if left <= 0:
            return 0
        try:
            summary = run_pass(cfg, log=_log, deadline=left, force=force)
        except CopierError as exc:
            _log("error: %s" % exc)
            return 1
        force = False
        if not summary.get("copied") or summary.get("failed") or summary.get("skipped"):
            return 0
