# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cpu_power_settings: the OS-side fixes of the cpu_power role - idle states re-enabled, the cpufreq governor set.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports.

* :func:`plan` - every check first (the governor is offered by every policy's driver, the state indexes exist),
  then the sysfs writes (path, before, after) and the tmpfiles.d file that repeats them at boot;
* :func:`apply` - the sysfs writes one by one, each read back; on a failed or not-taken write every earlier one is
  written back to its old value and the error raised; then the file through ``_host.files.apply_files`` (atomic);
  then, with ``remove_kernel_limits``, the kernel_cmdline module's own code (``_boot.kernel_cmdline.prepare``/``finish``,
  planned with everything else before anything is written) takes the idle-limiting keys (``_cpu.idle.LIMIT_KEYS``)
  off the next boot's command line; if that fails, the sysfs values and the file are put back.

Persistence is a ``systemd-tmpfiles`` ``w`` line per setting (tmpfiles.d(5): ``w`` writes the argument to a file
that exists, and accepts shell globs), run at boot by systemd-tmpfiles-setup.service. Only the reader and writer
code of this module decides what the lines say; the glob covers CPUs brought online later at the next boot.
A cpufreq driver loaded as a module after systemd-tmpfiles-setup (acpi-cpufreq on some distributions) misses the
governor line; the role's check reports that as drift.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._boot import kernel_cmdline as kcmd
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.freq import FreqError, check_governor, read_freq
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.idle import LIMIT_KEYS, IdleError, check_state_indexes, read_idle
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, read_text, write_kernel_file
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import KernelCmdlineError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import PersistError, apply_files, plan_files, rollback_files

TMPFILES = "/etc/tmpfiles.d/gpunode-cpu-power.conf"
HEADER = "# Managed by gpunode.tuning (cpu_power_settings). Applied at boot by systemd-tmpfiles.\n"


class SettingsError(DetailedError):
    """Bad input; ``details`` names the value."""


def tmpfiles_text(indexes, enable_idle, governor):
    lines = [HEADER]
    if enable_idle:
        states = "state*" if indexes is None else None
        for pattern in ([states] if states else ["state%d" % i for i in sorted(indexes)]):
            lines.append("w /sys/devices/system/cpu/cpu*/cpuidle/%s/disable - - - - 0\n" % pattern)
    if governor:
        lines.append("w /sys/devices/system/cpu/cpufreq/policy*/scaling_governor - - - - %s\n" % governor)
    return "".join(lines)


def kernel_params(params, procfs, sysfs, root):
    """The kernel_cmdline options that take the idle limits off (state present) or give them back (absent)."""
    return {"parameters": None, "remove": list(LIMIT_KEYS), "isolate": None, "state": params["state"],
            "bootloader": params.get("bootloader") or "auto", "root": root, "procfs_path": procfs, "sysfs_path": sysfs,
            "state_dir": kcmd.STATE_DIR, "dropin_name": kcmd.DROPIN}


def plan(params, sysfs, procfs, root, kernel=None):
    """``{"writes": [{"path", "before", "after", "what"}], "files": {...}, "actions": [...], "kernel": prepared or None}``.

    ``kernel``: ``(run, which, live, check)`` for the kernel_cmdline part, needed with ``remove_kernel_limits``."""
    enable, governor = params["enable_idle_states"], params["governor"] or None
    indexes = params.get("idle_state_indexes")
    indexes = None if not indexes else sorted(set(indexes))
    idle = read_idle(sysfs, procfs, dev=join(root, "dev"), root=root)
    freq = read_freq(sysfs, procfs)
    try:
        if enable and indexes is not None:
            check_state_indexes(idle, indexes)
        if governor:
            check_governor(freq, governor)
    except (IdleError, FreqError) as exc:
        raise SettingsError(str(exc), **exc.details)
    writes = []
    if params["state"] == "present":
        if enable:
            for cpu, states in sorted(idle["cpus"].items()):
                for s in states:
                    if (indexes is None or s["index"] in indexes) and s.get("disable"):
                        writes.append({"path": join(sysfs, "devices/system/cpu/cpu%d/cpuidle/state%d/disable" % (cpu, s["index"])),
                                       "before": "1", "after": "0", "what": "cpu%d %s enabled" % (cpu, s["name"])})
        if governor:
            for index, p in sorted(freq["policies"].items()):
                if p["governor"] != governor:
                    writes.append({"path": join(sysfs, "devices/system/cpu/cpufreq", p["name"], "scaling_governor"),
                                   "before": p["governor"], "after": governor,
                                   "what": "%s governor %s -> %s" % (p["name"], p["governor"], governor)})
    files, remove = {}, []
    if params["state"] == "present" and params["persist"] and (enable or governor):
        files[TMPFILES] = (tmpfiles_text(indexes, enable, governor).encode(), 0o644)
    else:
        remove.append(TMPFILES)
    actions = plan_files(files, remove=remove, root=root)
    notes = []
    if enable and not any(idle["cpus"].values()):
        notes.append("no CPU has cpuidle states (driver %s): nothing to enable" % (idle["driver"] or "absent"))
    if governor and not freq["policies"]:
        notes.append("no cpufreq policies: no governor to set")
    prepared = None
    if params.get("remove_kernel_limits"):
        run, which, live, check = kernel
        try:
            prepared = kcmd.prepare(kernel_params(params, procfs, sysfs, root), run, check, live, which, procfs=procfs)
        except KernelCmdlineError as exc:
            raise SettingsError(str(exc), **exc.details)
    return {"writes": writes, "files": files, "actions": actions, "notes": notes, "kernel": prepared}


def apply(planned, root, write_sysfs=None):
    """Carry out ``planned``: sysfs writes (read back, all or nothing), the persistence file, the kernel command line.
    Returns the kernel_cmdline (result, diff), or (None, []) without ``remove_kernel_limits``."""
    write_sysfs = write_sysfs or write_kernel_file
    done = []

    def put_back():
        problems = []
        for old in reversed(done):
            try:
                write_sysfs(old["path"], old["before"])
            except OSError:
                problems.append(old["path"])
        return problems

    for item in planned["writes"]:
        try:
            write_sysfs(item["path"], item["after"])
            now = read_text(item["path"])
            if now != item["after"]:
                raise OSError("it reads back %r" % now)
        except OSError as exc:
            problems = put_back()
            raise SettingsError("writing %r to %s failed (%s); %s" % (
                item["after"], item["path"], exc, "the earlier writes were put back" if not problems else
                "putting back failed for %s" % ", ".join(problems)), path=item["path"], value=item["after"],
                rollback_failed=problems)
        done.append(item)
    undo_files = None
    if any(a["action"] != "unchanged" for a in planned["actions"]):
        try:
            undo_files = apply_files(planned["files"], planned["actions"], root=root)
        except PersistError as exc:
            problems = put_back()
            raise SettingsError("%s; the sysfs writes were %s" % (exc, "put back" if not problems else
                                "not all put back (%s)" % ", ".join(problems)), **exc.details)
    if planned["kernel"] is None:
        return None, []
    try:
        return kcmd.finish(planned["kernel"])
    except KernelCmdlineError as exc:
        problems = put_back()
        if undo_files is not None and rollback_files(undo_files)["failed"]:
            problems.append(TMPFILES)
        raise SettingsError("%s; the sysfs writes and %s were %s" % (exc, TMPFILES, "put back" if not problems else
                            "not all put back (%s)" % ", ".join(problems)), **exc.details)


def kernel_check(planned):
    """The kernel_cmdline result and diff in check mode (nothing is written)."""
    return kcmd.finish(planned["kernel"]) if planned["kernel"] is not None else (None, [])
