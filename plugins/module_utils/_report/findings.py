# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one shape of a preflight finding, shared by the platform, nvidia-smi and DCGM checks.

Private module_utils of gpunode.tuning, standard library only.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

STATUSES = ("pass", "warn", "fail", "not_applicable", "unknown")
# A gate's policy may make any of these fatal; a pass never stops a gate.
FATAL_STATUSES = ("fail", "warn", "unknown", "not_applicable")


class FindingError(DetailedError):
    """A finding built with a status that is not one of :data:`STATUSES`."""


def finding(check, status, message, evidence=None, fix=None, **extra):
    """``{check, status, message, evidence, fix}`` plus ``extra`` (for example ``gpu``)."""
    if status not in STATUSES:
        raise FindingError("finding status %r is not one of %s" % (status, ", ".join(STATUSES)), value=status, expected=list(STATUSES))
    out = {"check": check, "status": status, "message": message, "evidence": evidence, "fix": fix}
    out.update(extra)
    return out
