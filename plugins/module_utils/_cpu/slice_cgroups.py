# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The live cgroup v2 side of the cpuset slices: whether the node's cgroups can hold ``AllowedCPUs=``, a unit's
cgroup and its cpuset values, and how they differ from what the files ask for (the cpuset_slices module,
``_cpu.cpuset_slices``).

Private module_utils of gpunode.tuning, standard library only. Read-only: nothing here writes.

* :func:`cgroup_v2_problem` - cgroup v1, the hybrid layout or no cpuset controller;
* :func:`cgroup_of`, :func:`read_live` - a unit's cgroup below ``fs/cgroup`` and its ``cpuset.cpus``,
  ``cpuset.cpus.effective`` (or the nearest ancestor's) and whether it has processes;
* :func:`restricted_services` - the running services with a ``cpuset.cpus`` of their own;
* :func:`drift_of` - why a unit's live cpuset is not what the files ask for.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.slice_units import slice_path

CGROUP = "fs/cgroup"


def cgroup_v2_problem(sysfs):
    """Why this node's cgroups cannot hold AllowedCPUs= (cgroup v1, hybrid, no cpuset controller), or None."""
    path = join(sysfs, CGROUP, "cgroup.controllers")
    text = read_text(path)
    if text is None:
        return dict(msg="cgroup v2 is required: %s does not exist, so %s is cgroup v1 or the hybrid layout, where "
                        "systemd's AllowedCPUs= does nothing. Boot with systemd.unified_cgroup_hierarchy=1 (the default "
                        "since systemd 247)" % (path, join(sysfs, CGROUP)),
                    path=path, expected="the unified cgroup hierarchy (cgroup2) at %s" % join(sysfs, CGROUP))
    if "cpuset" not in text.split():
        return dict(msg="the cpuset controller is not available: %s lists %s" % (path, text or "(nothing)"),
                    path=path, value=text, expected="cpuset among the controllers")
    return None


def cgroup_of(cgroot, unit):
    """A unit's cgroup below ``cgroot`` (relative path), or None when it has none (not running).
    Slices follow their names; a scope is looked for in every slice's cgroup (init.scope is in the root)."""
    if unit.endswith(".slice"):
        rel = slice_path(unit)
        return rel if os.path.isdir(os.path.join(cgroot, rel)) else None
    todo = [""]
    while todo:
        rel = todo.pop(0)
        here = os.path.join(cgroot, rel) if rel else cgroot
        if os.path.isdir(os.path.join(here, unit)):
            return "%s/%s" % (rel, unit) if rel else unit
        todo += ["%s/%s" % (rel, n) if rel else n for n in list_dir(here)
                 if n.endswith(".slice") and os.path.isdir(os.path.join(here, n))]
    return None


def read_live(cgroot, unit):
    """``{cgroup, cpus, effective, populated}`` of a unit: ``cpus`` its own cpuset.cpus (None without the file:
    the cpuset controller is not enabled for it), ``effective`` its cpuset.cpus.effective, or the nearest
    ancestor's when it has none of its own (the CPUs its processes may use). All None when it has no cgroup."""
    rel = cgroup_of(cgroot, unit)
    if rel is None:
        return {"cgroup": None, "cpus": None, "effective": None, "populated": False, "parent_effective": None}
    cpus = read_text(os.path.join(cgroot, rel, "cpuset.cpus"))
    effective = _nearest_effective(cgroot, rel)
    events = read_text(os.path.join(cgroot, rel, "cgroup.events")) or ""
    return {"cgroup": rel, "cpus": cpus, "effective": effective, "populated": "populated 1" in events.splitlines(),
            "parent_effective": _nearest_effective(cgroot, os.path.dirname(rel)) if rel else None}


def _nearest_effective(cgroot, rel):
    """cpuset.cpus.effective of ``rel``, or of its nearest ancestor that has the file."""
    effective, here = None, rel
    while effective is None:
        effective = read_text(os.path.join(cgroot, here, "cpuset.cpus.effective"))
        if not here:
            break
        here = os.path.dirname(here)
    return effective


def as_cpu_set(text):
    """The set of CPUs of a cpuset file's text, or None when it is not a CPU list."""
    try:
        return set(parse_cpulist(text))
    except CpuListError:
        return None


def drift_of(want, live):
    """Why a unit's live cpuset is not what the files ask for, or None. ``want``: the set of CPUs, or None for
    a unit with no AllowedCPUs= of ours any more (its own cpuset.cpus must be empty). No cgroup: no drift."""
    if live["cgroup"] is None:
        return None
    if want is None:
        # No restriction of its own: empty, or (where the kernel refuses an empty list for a cgroup with tasks) every
        # CPU its parent has.
        parent = as_cpu_set(live.get("parent_effective") or "")
        if live["cpus"] and not (parent and (as_cpu_set(live["cpus"]) or set()) >= parent):
            return "cpuset.cpus is %s, want no restriction of its own" % live["cpus"]
        return None
    if live["cpus"] is None:
        return "no cpuset.cpus (the cpuset controller is not enabled for it), want %s" % format_cpulist(want)
    if as_cpu_set(live["cpus"]) != want:
        return "cpuset.cpus is %s, want %s" % (live["cpus"] or '""', format_cpulist(want))
    if as_cpu_set(live["effective"]) != want:
        return "cpuset.cpus.effective is %s, want %s" % (live["effective"] or '""', format_cpulist(want))
    return None


def restricted_services(cgroot):
    """The running services with a cpuset.cpus of their own (relative cgroup path by unit), anywhere in the tree."""
    found, todo = {}, [""]
    while todo:
        rel = todo.pop(0)
        here = os.path.join(cgroot, rel) if rel else cgroot
        for name in list_dir(here):
            sub = "%s/%s" % (rel, name) if rel else name
            if name.endswith(".slice") and os.path.isdir(os.path.join(here, name)):
                todo.append(sub)
            elif name.endswith(".service") and read_text(os.path.join(here, name, "cpuset.cpus")):
                found[name] = sub
    return found
