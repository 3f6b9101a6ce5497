# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Test helper (not shipped): a cpuidle sysfs tree from a parsed ``cpupower idle-info`` capture.

``sysfs_from_idle_info(parse_idle_info(text), cpus, root)`` writes, under the
sysfs root ``root``, what the kernel shows for that state table on every CPU
in ``cpus`` (drivers/cpuidle/sysfs.c): ``devices/system/cpu/cpuN/cpuidle/stateK/``
with ``name desc latency residency usage time disable default_status``, the
global ``devices/system/cpu/cpuidle/{current_driver,current_governor,current_governor_ro}``
and ``devices/system/cpu/{online,present,possible}``. cpupower does not print
the target residency: it is taken as the exit latency unless ``residency``
(``{state name: microseconds}``) says otherwise. With no states (driver
``none``) no ``cpuN/cpuidle`` directory is written, as the kernel shows none.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist, parse_cpulist


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("%s\n" % text)


def sysfs_from_idle_info(parsed, cpus, root, residency=None):
    """Write the tree; return ``root`` as a ``Path``."""
    root = Path(root)
    cpu_list = parse_cpulist(cpus)
    residency = residency or {}
    base = root / "devices" / "system" / "cpu"
    for name in ("online", "present", "possible"):
        _write(base / name, format_cpulist(cpu_list))
    governor = parsed.get("governor") or ""
    _write(base / "cpuidle" / "current_driver", parsed.get("driver") or "none")
    _write(base / "cpuidle" / "current_governor", governor)
    _write(base / "cpuidle" / "current_governor_ro", governor)
    for cpu in cpu_list:
        for state in parsed.get("states") or []:
            directory = base / ("cpu%d" % cpu) / "cpuidle" / ("state%d" % state["index"])
            latency = state["latency"] if state["latency"] is not None else 0
            _write(directory / "name", state["name"])
            _write(directory / "desc", state["description"] or "")
            _write(directory / "latency", latency)
            _write(directory / "residency", residency.get(state["name"], latency))
            _write(directory / "usage", state["usage"] if state["usage"] is not None else 0)
            _write(directory / "time", state["duration"] if state["duration"] is not None else 0)
            _write(directory / "disable", 1 if state["disabled"] else 0)
            _write(directory / "default_status", "enabled")
    return root
