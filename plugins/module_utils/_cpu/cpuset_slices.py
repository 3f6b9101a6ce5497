# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Housekeeping units confined to the housekeeping CPUs, and a workload slice (the cpuset_slices module).

Private module_utils of gpunode.tuning, standard library only.

* :func:`check_params` - every option checked (unit names as systemd checks
  them, the slice tree, the drop-in name) before anything is read or written;
* :func:`plan` - the split (``_parse.cpu_partition.split``), the files (an
  ``AllowedCPUs=`` drop-in per housekeeping unit, the workload slice, with
  ``cpu_affinity`` a system.conf.d drop-in), compared by ``_host.files.plan_files``,
  and the live cgroup values read from ``fs/cgroup`` and compared with what the
  files ask for (drift);
* :func:`apply` - writes the files with ``_host.files.apply_files`` (atomic, all or
  nothing), runs ``systemctl daemon-reload`` and reads the cgroups back.

The unit names, the files' text and the other files that set ``AllowedCPUs=`` are
``_cpu.slice_units``; reading the live cgroups and their drift is ``_cpu.slice_cgroups``.

Why ``daemon-reload`` is enough to make ``AllowedCPUs=`` effective in running
units (systemd v252, Debian 12): ``unit_deserialize()`` (src/core/unit-serialize.c)
ends with ``unit_invalidate_cgroup(u, _CGROUP_MASK_ALL)`` for every realized
unit, which queues it for ``manager_dispatch_cgroup_realize_queue()``; that
re-runs ``cgroup_context_apply()`` (src/core/cgroup.c), which writes
``cpuset.cpus`` from the reloaded unit's ``AllowedCPUs=``. ``manager_loop()``
(src/core/manager.c) dispatches the realize queue before the D-Bus queue that
sends the reply to ``Reload()``, so the values are in the cgroups when
``systemctl daemon-reload`` returns. No ``systemctl set-property`` is used (it
would leave one more drop-in, in ``/etc/systemd/system.control`` or
``/run/systemd/system.control``, for a removal to find).

The one thing systemd does not do: a unit whose ``AllowedCPUs=`` went away gets
no write at all (``cgroup_context_apply()`` touches ``cpuset.cpus`` only for a
unit with the cpuset controller in its own mask), so where another cgroup keeps
the cpuset controller enabled (runc enables every controller up its path), the
old value stays in the kernel. For such a unit, when ``systemctl show`` says it
has no ``AllowedCPUs=``, :func:`apply` writes an empty ``cpuset.cpus`` (the
kernel's "no restriction of its own").
"""

from __future__ import annotations

import errno
import os
import re
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpu_partition import PartitionError, as_cpulists, split
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_cpulist, write_kernel_file
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import (
    UNIT_DIR, PersistError, apply_files, plan_files, rooted)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.systemd import Systemd
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.slice_cgroups import (
    CGROUP, as_cpu_set, cgroup_v2_problem, drift_of, read_live, restricted_services)
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.slice_units import (
    CONFIG_DIRS, ROOT_SLICE, SYSTEM_CONF_DIR, dropin_path, header, other_allowed_cpus, overriding_file,
    overriding_services_file, owned_files, parent_slices, render, services_path, slice_path, unit_name_problem)

DEFAULT_UNITS = ["system.slice", "user.slice", "init.scope"]
DEFAULT_SLICE = "gpunode-workload.slice"
DEFAULT_DROPIN = "50-gpunode-cpuset.conf"
STATES = ("present", "absent")
SYSTEM_SLICE = "system.slice"
# How system.slice's work is kept on the housekeeping CPUs: its own AllowedCPUs= (slice), or every service's through
# the top-level service.d drop-in (services), which leaves scopes in system.slice - Slurm's slurmstepd.scope up to
# Slurm 25.05 - free to get the workload CPUs; auto picks services where slurmd is installed or its scope runs.
SYSTEM_SLICE_MODES = ("auto", "slice", "services")

# The options, with their defaults, for the module and any caller (one definition).
ARGUMENT_SPEC = dict(
    housekeeping_cpus=dict(type="str"),
    irq_cpus=dict(type="str", default=""),
    reserved_cpus=dict(type="str", default=""),
    workload_cpus=dict(type="str"),
    housekeeping_units=dict(type="list", elements="str", default=list(DEFAULT_UNITS)),
    system_slice=dict(type="str", choices=list(SYSTEM_SLICE_MODES), default="auto"),
    workload_slice=dict(type="str", default=DEFAULT_SLICE),
    workload_units=dict(type="list", elements="str", default=[]),
    cpu_affinity=dict(type="bool", default=False),
    dropin_name=dict(type="str", default=DEFAULT_DROPIN),
    state=dict(type="str", choices=list(STATES), default="present"),
    **target_spec("root", "sysfs_path")
)
MUTUALLY_EXCLUSIVE = [("housekeeping_cpus", "irq_cpus"), ("housekeeping_cpus", "reserved_cpus")]
# How _cpu_partition's errors name the module's options.
LABELS = {"housekeeping": "housekeeping_cpus", "irq_cpus": "irq_cpus", "reserved": "reserved_cpus", "workload": "workload_cpus"}

_DROPIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.conf\Z")


class SliceError(DetailedError):
    """Bad input, a node this cannot work on, a failed write or systemctl, or cgroups that did not follow;
    ``details`` names the option or path, the bad value and what was expected."""


# -------------------------------------------------------------- options --

def check_params(params):
    """The options, checked and normalised; raises SliceError naming the first bad one."""
    state = params.get("state") or "present"
    if state not in STATES:
        raise SliceError("state %r: expected one of %s" % (state, ", ".join(STATES)), option="state", value=state,
                         expected=list(STATES))
    dropin = params.get("dropin_name")
    if not isinstance(dropin, str) or not _DROPIN_RE.match(dropin) or len(dropin) > 255:
        raise SliceError("dropin_name %r: expected a plain file name ending in .conf (letters, digits, ._-), such as %s"
                         % (dropin, DEFAULT_DROPIN), option="dropin_name", value=dropin, expected="NAME.conf")
    units = []
    raw_units = params.get("housekeeping_units")
    if not isinstance(raw_units, (list, tuple)):
        raise SliceError("housekeeping_units %r: expected a list of .slice and .scope unit names" % (raw_units,),
                         option="housekeeping_units", value=raw_units, expected="a list such as %s" % DEFAULT_UNITS)
    for unit in raw_units:
        why = unit_name_problem(unit)
        if why:
            raise SliceError("housekeeping_units entry %r is not a valid slice or scope unit name: %s" % (unit, why),
                             option="housekeeping_units", value=unit, expected="a unit name such as system.slice or init.scope")
        if unit == ROOT_SLICE:
            raise SliceError("housekeeping_units entry -.slice is the root slice, which holds everything (the workload "
                             "slice too) and whose cpuset systemd never sets; name the slices below it",
                             option="housekeeping_units", value=unit, expected="system.slice, user.slice, init.scope...")
        if unit not in units:
            units.append(unit)
    if state == "present" and not units:
        raise SliceError("housekeeping_units is empty: nothing would be confined to the housekeeping CPUs",
                         option="housekeeping_units", value=[], expected="a list such as %s" % DEFAULT_UNITS)
    workload = params.get("workload_slice")
    why = unit_name_problem(workload)
    if not why and not workload.endswith(".slice"):
        why = "it does not end in .slice"
    if not why and workload == ROOT_SLICE:
        why = "it is the root slice"
    if why:
        raise SliceError("workload_slice %r is not a valid slice name: %s" % (workload, why), option="workload_slice",
                         value=workload, expected="a slice name such as %s" % DEFAULT_SLICE)
    if workload in units:
        raise SliceError("workload_slice %s is also in housekeeping_units: a slice runs either on the housekeeping or "
                         "on the workload CPUs" % workload, option="workload_slice", value=workload,
                         expected="a slice that is not one of %s" % ", ".join(units))
    for unit in units:
        if unit in parent_slices(workload):
            raise SliceError(
                "workload_slice %s is inside housekeeping unit %s (a dash in a slice name means a parent slice: its "
                "cgroup is %s), so it could only ever get %s's CPUs; pick a name without that prefix"
                % (workload, unit, slice_path(workload), unit), option="workload_slice", value=workload,
                expected="a slice outside %s" % unit)
        if workload in parent_slices(unit):
            raise SliceError(
                "housekeeping unit %s is inside workload_slice %s (a dash in a slice name means a parent slice: its "
                "cgroup is %s), so it could never get CPUs outside the workload's" % (unit, workload, slice_path(unit)),
                option="housekeeping_units", value=unit, expected="a unit outside %s" % workload)
    mode = params.get("system_slice") or "auto"
    if mode not in SYSTEM_SLICE_MODES:
        raise SliceError("system_slice %r: expected one of %s" % (mode, ", ".join(SYSTEM_SLICE_MODES)), option="system_slice",
                         value=mode, expected=list(SYSTEM_SLICE_MODES))
    extra = []
    raw_extra = params.get("workload_units") or []
    if not isinstance(raw_extra, (list, tuple)):
        raise SliceError("workload_units %r: expected a list of .slice and .scope unit names" % (raw_extra,),
                         option="workload_units", value=raw_extra, expected="a list such as [machine.slice]")
    for unit in raw_extra:
        why = unit_name_problem(unit)
        if not why and unit == ROOT_SLICE:
            why = "it is the root slice"
        if not why and unit == workload:
            why = "it is the workload slice itself, which gets the workload CPUs from its own file"
        if not why and (unit in units or unit in parent_slices(workload) or any(u in parent_slices(unit) for u in units)):
            why = "it is (or is inside) a housekeeping unit or a parent of the workload slice"
        if why:
            raise SliceError("workload_units entry %r cannot be given the workload CPUs: %s" % (unit, why),
                             option="workload_units", value=unit, expected="a slice or scope such as machine.slice (podman's)")
        if unit not in extra:
            extra.append(unit)
    root = params.get("root") or "/"
    out = dict(params, state=state, dropin_name=dropin, housekeeping_units=units, workload_slice=workload, root=root,
               system_slice=mode, workload_units=extra)
    return out


# ---------------------------------------------------------------- plan --

def slurm_steps_in_system_slice(root, sysfs):
    """Why Slurm's job steps run in system.slice on this node, or None. Slurm's cgroup/v2 plugin starts
    ``slurmstepd.scope`` over D-Bus with no Slice= up to 25.05 (src/plugins/cgroup/v2/cgroup_dbus.c: PIDs, Delegate,
    TasksMax), so systemd puts it in system.slice, and polls ``<mnt>/system.slice/slurmstepd.scope`` (cgroup_v2.c,
    22.05.8); 25.11's cgroup.conf CgroupSlice= can move it (then give system_slice=slice)."""
    if os.path.isdir(join(sysfs, CGROUP, SYSTEM_SLICE, "slurmstepd.scope")):
        return "Slurm's slurmstepd.scope, which holds the job steps, runs in system.slice"
    for base in CONFIG_DIRS:
        if base == "/run/systemd/transient":
            continue
        path = "%s/slurmd.service" % base
        if os.path.isfile(rooted(root, path)):
            return ("slurmd is installed (%s): Slurm's cgroup/v2 plugin runs job steps in system.slice/slurmstepd.scope "
                    "(up to 25.05; CgroupSlice= in 25.11 can move them)" % path)
    return None


def _present(p, sysfs):
    """The split, the files of a present state and the CPUs each unit must have."""
    online_path = join(sysfs, "devices/system/cpu/online")
    online = read_cpulist(online_path)
    if not online:
        raise SliceError("cannot read the online CPUs from %s" % online_path, path=online_path, option="sysfs_path",
                         value=sysfs, expected="a sysfs root with devices/system/cpu/online")
    try:
        house, work = split(online, housekeeping=p.get("housekeeping_cpus"), irq_cpus=p.get("irq_cpus"),
                            reserved=p.get("reserved_cpus"), workload=p.get("workload_cpus"), labels=LABELS)
    except PartitionError as exc:
        raise SliceError(str(exc), **exc.details)
    units, workload_slice = p["housekeeping_units"], p["workload_slice"]
    owned = owned_files(p["root"], p["dropin_name"])
    if p["services_why"]:
        other = overriding_services_file(p["root"], p["dropin_name"], owned)
        if other:
            raise SliceError("%s sets AllowedCPUs= for every service and systemd reads it after %s: remove it or choose a "
                             "dropin_name that sorts after it" % (other, services_path(p["dropin_name"])), path=other,
                             option="dropin_name", value=p["dropin_name"], expected="no AllowedCPUs= of another file after ours")
    for unit in units + p["workload_units"] + [workload_slice]:
        # The workload slice's own file is its fragment: any drop-in overrides it.
        other = overriding_file(p["root"], unit, None if unit == workload_slice else p["dropin_name"], owned)
        if other:
            raise SliceError(
                "%s sets AllowedCPUs= for %s and systemd reads it after %s (drop-ins are applied in file-name order, "
                "the last AllowedCPUs= wins), so the CPUs asked for here would not hold: remove it or choose a "
                "dropin_name that sorts after it" % (other, unit, dropin_path(unit, p["dropin_name"]) if unit != workload_slice
                                                     else "%s/%s" % (UNIT_DIR, workload_slice)),
                path=other, option="dropin_name", value=p["dropin_name"], expected="no AllowedCPUs= of another file after ours")
    files = render(units, workload_slice, house, work, p["dropin_name"], p.get("cpu_affinity"), p["workload_units"],
                   p["services_why"])
    want = dict((u, set(house)) for u in units)
    want[workload_slice] = set(work)
    for unit in p["workload_units"]:
        want[unit] = set(work)
    return as_cpulists(online, house, work), files, want


def _drift(want, live, stop):
    """The units whose running cgroup is not what the files ask for; an empty slice in ``stop`` is to be stopped."""
    drift = []
    for unit in sorted(u for u in live if u in want):
        found = live[unit]
        item = {"unit": unit, "cgroup": found["cgroup"], "cpus": found["cpus"], "effective": found["effective"],
                "want": None if want[unit] is None else format_cpulist(want[unit]), "stop": False}
        if unit in stop and found["cgroup"] is not None and not found["populated"]:
            drift.append(dict(item, reason="an empty slice without its file: stop it", want=None, stop=True))
            continue
        why = drift_of(want[unit], found)
        if why:
            drift.append(dict(item, reason=why))
    return drift


def plan(params, sysfs="/sys"):
    """Decide one pass; raises SliceError (before any change) on bad input or a node this cannot work on.

    ``params`` as :data:`ARGUMENT_SPEC` (``root`` included). Returns the split, the files and their actions,
    the units with the CPUs each must have (None: no restriction of ours), their live cgroup values and drift.
    """
    p = check_params(params)
    present = p["state"] == "present"
    # The system.slice mode, resolved: with services, system.slice is not confined and every service is.
    p["services_why"], mode_why = None, "system_slice=%s" % p["system_slice"]
    if present and SYSTEM_SLICE in p["housekeeping_units"] and p["system_slice"] != "slice":
        steps = slurm_steps_in_system_slice(p["root"], sysfs)
        if p["system_slice"] == "services" or steps:
            p["services_why"] = steps or "system_slice=services"
            p["housekeeping_units"] = [u for u in p["housekeeping_units"] if u != SYSTEM_SLICE]
            mode_why = p["services_why"]
        else:
            mode_why = "no Slurm job steps in system.slice (slurmd not installed)"
    p["system_slice_mode"] = "services" if p["services_why"] else ("slice" if SYSTEM_SLICE in p["housekeeping_units"] else None)
    p["system_slice_why"] = mode_why
    root, dropin, units, workload_slice = p["root"], p["dropin_name"], p["housekeeping_units"], p["workload_slice"]
    v2 = cgroup_v2_problem(sysfs)
    if present and v2:
        raise SliceError(v2.pop("msg"), **v2)
    split_out, files, want = _present(p, sysfs) if present else (
        {"housekeeping_cpus": "", "workload_cpus": "", "unassigned_cpus": ""}, {}, {})
    owned = owned_files(root, dropin)
    remove = sorted(path for path in owned if path not in files)
    actions = plan_files(files, remove, root)
    # Units that lose our AllowedCPUs=: their own cpuset must end up empty, unless another file sets one.
    released = [owned[path][1] for path in remove if owned[path][0] in ("dropin", "slice")]
    stop = set(owned[path][1] for path in remove if owned[path][0] == "slice")
    if not present:
        released += units + p["workload_units"] + [workload_slice]
        stop.add(workload_slice)
    # Services that lose our service.d drop-in keep the old cpuset.cpus where the cpuset controller stays on above
    # them (Slurm's delegated scope keeps it on in system.slice): each one's own must end up empty.
    if any(owned[path][0] == "services" for path in remove) and not v2:
        released += sorted(restricted_services(join(sysfs, CGROUP)))
    others = {}
    for unit in released:
        if unit not in want and unit not in others:
            other = other_allowed_cpus(root, unit, owned)
            if other:
                others[unit] = other
            else:
                want[unit] = None
    cgroot = join(sysfs, CGROUP)
    report = sorted(set(want) | set(others))
    live = dict((u, read_live(cgroot, u)) for u in report) if not v2 else {}
    warnings = ["%s has AllowedCPUs= from %s, not from cpuset_slices: its cgroup is not checked" % (u, others[u])
                for u in sorted(others)]
    # A file at one of our paths that this module did not write is left alone by a removal.
    for path in [] if present else [dropin_path(u, dropin) for u in units] + ["%s/%s" % (UNIT_DIR, workload_slice)]:
        if path not in owned and os.path.lexists(rooted(root, path)):
            warnings.append("%s was not written by cpuset_slices (its first line is not %r): left alone"
                            % (path, header(dropin).strip()))
    if v2 and not present:
        warnings.append("%s: the cgroups were not read" % v2["msg"])
    for unit in sorted(u for u in stop if live.get(u, {}).get("populated")):
        warnings.append("%s still has processes (cgroup %s): left running without its file; stop it when the work "
                        "is done (systemctl stop %s stops what runs in it)" % (unit, live[unit]["cgroup"], unit))
    affinity = "%s/%s" % (SYSTEM_CONF_DIR, dropin)
    return {
        "params": p, "split": split_out, "files": files, "actions": actions, "want": want, "report": report,
        "live": live, "drift": _drift(want, live, stop), "cgroot": cgroot, "affinity": affinity,
        "affinity_changed": any(a["path"] == affinity and a["action"] != "unchanged" for a in actions),
        "warnings": warnings, "system_slice": {"mode": p["system_slice_mode"], "why": p["system_slice_why"]},
    }


# ---------------------------------------------------------------- apply --

def _prune(root, removed):
    """Remove the <unit>.d and system.conf.d directories that the removals left empty (nothing above them)."""
    for path in sorted(set(os.path.dirname(p) for p in removed)):
        if path.endswith(".d") and (path.startswith(UNIT_DIR + "/") or path == SYSTEM_CONF_DIR):
            try:
                os.rmdir(rooted(root, path))
            except OSError:
                pass


def _write_cpus(cgroot, rel, text):
    write_kernel_file(os.path.join(cgroot, rel, "cpuset.cpus"), text + "\n")


def _release_cpus(cgroot, live):
    """Take a cgroup's own CPU restriction away: an empty cpuset.cpus (its parent's CPUs, and systemd's own way),
    or, where the kernel refuses that with ENOSPC (a populated cgroup whose list was not empty: validate_change() in
    kernel/cgroup/cpuset.c), its parent's effective CPUs, which gives the same CPUs. Returns what was written."""
    try:
        _write_cpus(cgroot, live["cgroup"], "")
        return ""
    except OSError as exc:
        if exc.errno != errno.ENOSPC or not live.get("parent_effective"):
            raise
    _write_cpus(cgroot, live["cgroup"], live["parent_effective"])
    return live["parent_effective"]


def apply(decided, systemd, check, sleep=time.sleep, settle=2.0):
    """Write the files, reload systemd, reset what it leaves behind, verify. Returns the cgroup values after."""
    p, cgroot, want = decided["params"], decided["cgroot"], dict(decided["want"])
    root = p["root"]
    changed = [a for a in decided["actions"] if a["action"] != "unchanged"]
    if changed and not check:
        try:
            apply_files(decided["files"], changed, root)
        except PersistError as exc:
            raise SliceError(str(exc), **exc.details)
        _prune(root, [a["path"] for a in changed if a["action"] == "remove"])
    # Drift alone is acted on only where systemd can act (the live host): on a tree it is reported.
    if not changed and not (decided["drift"] and systemd.live):
        return decided["live"]
    try:
        systemd.do(["systemctl", "daemon-reload"])
    except SliceError as exc:
        written = [a["path"] for a in changed]
        raise SliceError("%s%s" % (exc, "; the files are written (%s), run it again when systemd answers" % ", ".join(written)
                                   if written else ""), files=written, **exc.details)
    for item in decided["drift"]:
        if item["stop"]:
            systemd.do(["systemctl", "stop", item["unit"]])
    resets = [d["unit"] for d in decided["drift"] if d["want"] is None and not d["stop"]]
    if not systemd.live or check:
        for unit in resets:
            systemd.actions.append("reset %s cpuset.cpus (%s)" % (unit, "write an empty list" if systemd.live else systemd.why))
        return decided["live"]
    # After the reload: units whose AllowedCPUs= went away keep their old cpuset.cpus if systemd wrote none.
    live = dict((u, read_live(cgroot, u)) for u in decided["report"])
    stale = [u for u in sorted(want) if want[u] is None and live[u]["cpus"]]
    if stale:
        shown = systemd.show(stale, ("AllowedCPUs",), strict=True)
        for unit in stale:
            props = shown[unit]
            allowed = (props.get("AllowedCPUs") or "").strip()
            if allowed:
                want[unit] = as_cpu_set(allowed)
                decided["warnings"].append("%s has AllowedCPUs=%s from another drop-in: left as it is" % (unit, allowed))
                continue
            try:
                written = _release_cpus(cgroot, live[unit])
            except OSError as exc:
                raise SliceError("cannot clear %s/%s/cpuset.cpus (%s, left by its removed AllowedCPUs=): %s"
                                 % (cgroot, live[unit]["cgroup"], live[unit]["cpus"], exc), path=live[unit]["cgroup"])
            systemd.actions.append("reset %s cpuset.cpus%s" % (unit, " to its parent's %s" % written if written else ""))
    # systemd has applied the values when daemon-reload returns; a short wait covers a slow cgroup write.
    waited = 0.0
    while True:
        live = dict((u, read_live(cgroot, u)) for u in decided["report"])
        wrong = [(u, why) for u, why in ((u, drift_of(want[u], live[u])) for u in sorted(want)) if why]
        if not wrong or waited >= settle:
            break
        sleep(0.2)
        waited += 0.2
    if wrong:
        raise SliceError(
            "after systemctl daemon-reload the cgroups are not what the files ask for: %s"
            % "; ".join("%s (%s): %s" % (u, live[u]["cgroup"], why) for u, why in wrong),
            effective=_report(live), files=[a["path"] for a in changed], expected=dict(
                (u, None if want[u] is None else format_cpulist(want[u])) for u, _w in wrong))
    return live


def _report(live):
    return dict((u, {"cgroup": v["cgroup"], "cpus": v["cpus"], "effective": v["effective"]}) for u, v in live.items())


def converge(params, run, check, sleep=time.sleep):
    """One pass: plan, apply. ``params`` as :data:`ARGUMENT_SPEC`; ``run`` is the systemctl runner on the live
    host (root /), None on a tree. Returns the module's result (without ``diff``) and the diff list."""
    sysfs = params.get("sysfs_path") or "/sys"
    decided = plan(params, sysfs)
    root = decided["params"]["root"]
    if run is not None and not os.path.isdir(rooted(root, "run/systemd/system")):
        raise SliceError("systemd is not running on this host (no /run/systemd/system): AllowedCPUs= needs systemd as "
                         "PID 1", path="/run/systemd/system", expected="a host booted with systemd")
    systemd = Systemd(run, check, why="root %s is not /: not run" % root, error=SliceError)
    live = apply(decided, systemd, check, sleep=sleep)
    changes = [a for a in decided["actions"] if a["action"] != "unchanged"]
    warnings = list(decided["warnings"])
    if run is None:
        warnings.append("root is %s, not /: the files are planned under it, no systemctl runs and nothing is made "
                        "effective in a running systemd; effective shows the cgroup files under %s as found"
                        % (root, decided["cgroot"]))
    reboot = decided["affinity_changed"]
    if reboot:
        warnings.append(
            "CPUAffinity= in %s changed: PID 1 applies it at boot, daemon-reexec and daemon-reload (systemd v252 "
            "src/core/main.c, update_cpu_affinity()), and only to the processes it starts afterwards; services already "
            "running keep their CPUs, and a removed CPUAffinity= never widens PID 1's own mask again. Reboot for it to "
            "hold for every process." % decided["affinity"])
    result = dict(decided["split"])
    result.update(
        changed=bool(changes or (systemd.live and decided["drift"])),
        files=[{k: a[k] for k in ("path", "action", "reason")} for a in decided["actions"]],
        effective=dict((u, {"cgroup": v["cgroup"], "cpus": v["cpus"], "effective": v["effective"]}) for u, v in live.items()),
        drift=[{k: d[k] for k in ("unit", "cgroup", "reason", "cpus", "effective", "want")} for d in decided["drift"]],
        systemd=systemd.actions,
        reboot_required=reboot,
        system_slice=decided["system_slice"],
        warnings=warnings,
    )
    diff = [{"before_header": a["path"], "after_header": a["path"] if a["action"] != "remove" else "(absent)",
             "before": a["before"], "after": a["after"]} for a in changes]
    for d in decided["drift"] if systemd.live else []:
        where = "%s/%s/cpuset.cpus" % (decided["cgroot"], d["cgroup"])
        diff.append({"before_header": "%s (live)" % where, "after_header": "%s (%s)" % (where, "stopped" if d["stop"] else "after apply"),
                     "before": "%s\n" % (d["cpus"] or ""), "after": "" if d["stop"] else "%s\n" % (d["want"] or "")})
    return result, diff
