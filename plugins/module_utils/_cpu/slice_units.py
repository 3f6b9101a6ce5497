# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd side of the cpuset slices: unit names, the unit files this writes and the other files that set
``AllowedCPUs=`` (the cpuset_slices module, ``_cpu.cpuset_slices``).

Private module_utils of gpunode.tuning, standard library only.

* :func:`unit_name_problem`, :func:`parent_slices`, :func:`slice_path` - slice and scope names as systemd checks
  them (src/basic/unit-name.c) and where a slice's cgroup is;
* :func:`render` - the text and paths of the files (an ``AllowedCPUs=`` drop-in per housekeeping unit, the
  services drop-in, the workload slice, the system.conf.d ``CPUAffinity=`` drop-in), each starting with
  :func:`header`;
* :func:`owned_files` - the files on disk this wrote (their first line is :func:`header`);
* :func:`other_allowed_cpus`, :func:`overriding_file`, :func:`overriding_services_file` - the other files in the
  unit load path that set ``AllowedCPUs=`` for a unit, or that systemd reads after ours.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import list_dir, read_raw
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import UNIT_DIR, rooted

SYSTEM_CONF_DIR = "/etc/systemd/system.conf.d"
SERVICES_DIR = "service.d"
ROOT_SLICE = "-.slice"
# Where else the system manager reads a unit's fragment and drop-ins (systemd.unit(5), unit load path).
CONFIG_DIRS = ("/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
               "/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
               "/lib/systemd/system")
_ALLOWED_RE = re.compile(r"^[ \t]*AllowedCPUs[ \t]*=[ \t]*\S", re.M)
_ANY_ALLOWED_RE = re.compile(r"^[ \t]*AllowedCPUs[ \t]*=", re.M)
# systemd's src/basic/unit-name.c: VALID_CHARS (plus "@" for instances), UNIT_NAME_MAX 256 with the NUL.
_UNIT_CHARS = re.compile(r"[A-Za-z0-9:_.\\@-]+\Z")
_UNIT_NAME_MAX = 255


def unit_name_problem(name):
    """Why ``name`` is not a slice or scope unit name systemd accepts, or None (``unit_name_is_valid()``,
    ``slice_name_is_valid()``: slices are plain names whose dashes separate parent slices)."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if len(name) > _UNIT_NAME_MAX:
        return "it is longer than %d characters" % _UNIT_NAME_MAX
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in ("slice", "scope"):
        return "it does not end in .slice or .scope"
    if not stem:
        return "it has nothing before .%s" % suffix
    if not _UNIT_CHARS.match(stem):
        return "it has characters systemd does not allow (letters, digits and :_.\\- only, @ before an instance)"
    at = stem.find("@")
    if at == 0:
        return "it starts with @"
    if at > 0:
        if suffix == "slice":
            return "a slice name cannot have an @ (slices are never templates or instances)"
        if at == len(stem) - 1:
            return "it is a template (nothing after @), not a unit that runs"
        if "@" in stem[at + 1:]:
            return "it has more than one @"
    if suffix == "slice" and name != ROOT_SLICE:
        if stem.startswith("-") or stem.endswith("-") or "--" in stem:
            return "a slice name cannot start or end with a dash or have two in a row (a dash separates parent slices)"
    return None


def parent_slices(name):
    """The slices a slice is nested in, outermost first (``a-b-c.slice`` -> ``a.slice``, ``a-b.slice``)."""
    if not name.endswith(".slice") or name == ROOT_SLICE:
        return []
    parts = name[:-len(".slice")].split("-")
    return ["-".join(parts[:n]) + ".slice" for n in range(1, len(parts))]


def slice_path(name):
    """A slice's cgroup below the cgroup root: ``a-b.slice`` -> ``a.slice/a-b.slice``."""
    return "/".join(parent_slices(name) + [name])


# ---------------------------------------------------------------- render --

def header(dropin):
    """The first line of every file this writes; it is also how removal knows a file is its own."""
    return "# Managed by gpunode.tuning (cpuset_slices module, %s): local changes are overwritten.\n" % dropin


def dropin_text(unit, cpus, dropin, workload_slice, workload=False):
    section = "Scope" if unit.endswith(".scope") else "Slice"
    if workload:
        return (header(dropin)
                + "# %s holds workload (containers): it runs on the workload CPUs, as %s does.\n" % (unit, workload_slice)
                + "[%s]\nAllowedCPUs=%s\n" % (section, cpus))
    return (header(dropin)
            + "# %s runs on the housekeeping CPUs (NIC IRQs, reserved CPUs); the workload\n" % unit
            + "# runs on the other CPUs, in %s.\n" % workload_slice
            + "[%s]\nAllowedCPUs=%s\n" % (section, cpus))


def services_text(cpus, dropin, why):
    return (header(dropin)
            + "# Every service runs on the housekeeping CPUs; system.slice itself is not confined, so that\n"
            + "# scopes in it get the workload CPUs (%s).\n" % why
            + "# A service in the workload slice keeps that slice's CPUs: none of these is in them, and the\n"
            + "# kernel then gives the cgroup its parent's CPUs (cgroup-v2.rst, cpuset.cpus.effective).\n"
            + "[Service]\nAllowedCPUs=%s\n" % cpus)


def services_path(dropin):
    return "%s/%s/%s" % (UNIT_DIR, SERVICES_DIR, dropin)


def slice_text(name, cpus, dropin):
    parents = parent_slices(name)
    nested = ("# A dash in a slice name means a parent slice: this one is in %s.\n" % parents[-1]) if parents else ""
    return (header(dropin)
            + "# The workload CPUs. Run work here: systemd-run --slice=%s ...,\n" % name
            + "# or docker run --cgroup-parent=%s --cpuset-cpus=%s ...\n" % (name, cpus)
            + nested
            + "[Unit]\nDescription=Workload CPUs %s (gpunode.tuning cpuset_slices)\n" % cpus
            + "Documentation=man:systemd.slice(5) man:systemd.resource-control(5)\n\n"
            + "[Slice]\nAllowedCPUs=%s\n" % cpus)


def affinity_text(cpus, dropin):
    return (header(dropin)
            + "# PID 1's CPU affinity, inherited by every process it starts that sets no\n"
            + "# CPUAffinity= of its own (units in the workload slice too).\n"
            + "[Manager]\nCPUAffinity=%s\n" % cpus)


def dropin_path(unit, dropin):
    return "%s/%s.d/%s" % (UNIT_DIR, unit, dropin)


def render(units, workload_slice, housekeeping, workload, dropin, cpu_affinity, workload_units=(), services_why=None):
    """{path: (bytes, mode)} of a present state (``services_why``: the services drop-in, and why)."""
    house, work = format_cpulist(housekeeping), format_cpulist(workload)
    files = dict((dropin_path(u, dropin), (dropin_text(u, house, dropin, workload_slice).encode(), 0o644)) for u in units)
    for unit in workload_units:
        files[dropin_path(unit, dropin)] = (dropin_text(unit, work, dropin, workload_slice, workload=True).encode(), 0o644)
    if services_why:
        files[services_path(dropin)] = (services_text(house, dropin, services_why).encode(), 0o644)
    files["%s/%s" % (UNIT_DIR, workload_slice)] = (slice_text(workload_slice, work, dropin).encode(), 0o644)
    if cpu_affinity:
        files["%s/%s" % (SYSTEM_CONF_DIR, dropin)] = (affinity_text(house, dropin).encode(), 0o644)
    return files


def _ours(path, dropin):
    try:
        with open(path, "rb") as handle:
            return handle.readline().decode("utf-8", "replace") == header(dropin)
    except OSError:
        return False


def owned_files(root, dropin):
    """{path: (kind, unit)} of the files on disk that this module wrote with this ``dropin`` (their first line is
    :func:`header`): kind ``dropin`` (unit = the confined unit), ``slice`` (unit = that slice) or ``affinity``."""
    found = {}
    base = rooted(root, UNIT_DIR)
    for name in list_dir(base):
        path = os.path.join(base, name)
        if name.endswith((".slice.d", ".scope.d")) and os.path.isdir(path) and not os.path.islink(path):
            conf = os.path.join(path, dropin)
            if os.path.isfile(conf) and not os.path.islink(conf) and _ours(conf, dropin):
                found[dropin_path(name[:-2], dropin)] = ("dropin", name[:-2])
        elif name.endswith(".slice") and os.path.isfile(path) and not os.path.islink(path) and _ours(path, dropin):
            found["%s/%s" % (UNIT_DIR, name)] = ("slice", name)
        elif name == SERVICES_DIR and os.path.isdir(path) and not os.path.islink(path):
            conf = os.path.join(path, dropin)
            if os.path.isfile(conf) and not os.path.islink(conf) and _ours(conf, dropin):
                found[services_path(dropin)] = ("services", None)
    conf = "%s/%s" % (SYSTEM_CONF_DIR, dropin)
    if os.path.isfile(rooted(root, conf)) and _ours(rooted(root, conf), dropin):
        found[conf] = ("affinity", None)
    return found


def other_allowed_cpus(root, unit, owned):
    """The first file, other than this module's own (``owned`` paths), that sets AllowedCPUs= for ``unit`` (its
    fragment or a drop-in in the unit load path), or None. Such a unit is not this module's to check once ours is gone."""
    for base in CONFIG_DIRS:
        directory = "%s/%s.d" % (base, unit)
        for path in ["%s/%s" % (base, unit)] + ["%s/%s" % (directory, n) for n in list_dir(rooted(root, directory))
                                                if n.endswith(".conf")]:
            if path in owned:
                continue
            text = read_raw(rooted(root, path))
            if text and _ALLOWED_RE.search(text):
                return path
    return None


def dropin_dirs(unit):
    """Every drop-in directory name systemd reads for ``unit`` (src/shared/dropin.c): ``UNIT.d``, the dash
    prefixes (``a-.slice.d`` for ``a-b.slice``) and the unit type's (``slice.d``)."""
    stem, _dot, suffix = unit.rpartition(".")
    parts = stem.split("-")
    return ["%s.d" % unit] + ["%s-.%s.d" % ("-".join(parts[:n]), suffix) for n in range(len(parts) - 1, 0, -1)] + \
        ["%s.d" % suffix]


def overriding_file(root, unit, after, owned):
    """The first drop-in (not in ``owned``) that sets AllowedCPUs= for ``unit`` and whose file name sorts after
    ``after`` (all of them when ``after`` is None), or None. systemd reads a unit's drop-ins from every directory
    in one list sorted by file name (conf_files_list_strv(), src/basic/conf-files.c), and the last AllowedCPUs= wins."""
    for base in CONFIG_DIRS:
        for directory in dropin_dirs(unit):
            path_dir = "%s/%s" % (base, directory)
            for name in list_dir(rooted(root, path_dir)):
                path = "%s/%s" % (path_dir, name)
                if not name.endswith(".conf") or path in owned or (after is not None and name <= after):
                    continue
                text = read_raw(rooted(root, path))
                if text and _ANY_ALLOWED_RE.search(text):
                    return path
    return None


def overriding_services_file(root, dropin, owned):
    """Another top-level service.d drop-in that sets AllowedCPUs= and sorts after ours, or None."""
    for base in CONFIG_DIRS:
        directory = "%s/%s" % (base, SERVICES_DIR)
        for name in list_dir(rooted(root, directory)):
            path = "%s/%s" % (directory, name)
            if name.endswith(".conf") and path not in owned and name > dropin:
                text = read_raw(rooted(root, path))
                if text and _ANY_ALLOWED_RE.search(text):
                    return path
    return None
