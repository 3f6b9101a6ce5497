#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpuset_slices
short_description: Confine systemd's housekeeping units to the housekeeping CPUs and create a workload slice
version_added: 0.1.0
description:
  - Splits the node's online CPUs into B(housekeeping) (the NIC IRQ CPUs plus reserved ones, where system services
    run) and B(workload) (the rest), with the collection's one implementation of the split (module_utils
    C(_parse.cpu_partition)), and makes systemd keep them apart on cgroup v2.
  - For each of O(housekeeping_units) it writes C(/etc/systemd/system/UNIT.d/DROPIN_NAME) with C(AllowedCPUs=) the
    housekeeping CPUs (section C([Slice]), or C([Scope]) for a scope); it writes the slice
    C(/etc/systemd/system/WORKLOAD_SLICE) with C(AllowedCPUs=) the workload CPUs. With O(cpu_affinity) also
    C(/etc/systemd/system.conf.d/DROPIN_NAME) with C(CPUAffinity=) the housekeeping CPUs.
  - Every file is compared by content, mode (0644) and root ownership and written only when it differs, atomically,
    all or nothing (a failed write puts back every file written before it). Every file starts with a C(Managed by
    gpunode.tuning (cpuset_slices module, DROPIN_NAME)) line; that line is how the module knows a file is its own.
  - O(state=present) also removes its own drop-ins of units no longer in O(housekeeping_units), and its own workload
    slice files of other names. O(state=absent) removes exactly its own files (the CPU options are then ignored), and
    the C(UNIT.d) and C(system.conf.d) directories that are left empty; a file at one of its paths that it did not
    write is left alone, with a warning.
  - On the live host (O(root=/)) the files are made effective at once - C(systemctl daemon-reload), which in systemd
    (v252, Debian 12) re-applies every running unit's cgroup settings before it returns - and the cgroups are read back
    (RV(effective)). The module fails, naming what it found, when they do not match. A unit whose C(AllowedCPUs=) was
    removed keeps its old C(cpuset.cpus) where another cgroup keeps the cpuset controller enabled (systemd writes
    nothing for a unit without C(AllowedCPUs=)); when C(systemctl show) confirms the unit has none, the module writes an
    empty C(cpuset.cpus) for it. An empty workload slice whose file was removed is stopped; one with processes is left
    running, with a warning.
  - Drift is what the files ask for but the running cgroups do not have (a file edited back by hand, values changed
    with C(systemctl set-property)); it is reported in RV(drift) and, on the live host, fixed like a file change.
  - Every input is checked before anything changes. cgroup v1, the hybrid layout and a kernel without the cpuset
    controller are refused.
attributes:
  check_mode:
    support: full
    details: The exact plan (files, systemctl actions, drift of the running cgroups); writes nothing and runs no systemctl.
  diff_mode:
    support: full
    details: Before and after of every file that differs, and of every drifting C(cpuset.cpus).
extends_documentation_fragment:
  - gpunode.tuning.attributes
options:
  housekeeping_cpus:
    description:
      - The housekeeping CPUs, a Linux CPU list such as C(0-3,96-99). Not given (or empty), they are O(irq_cpus) plus
        O(reserved_cpus).
    type: str
  irq_cpus:
    description:
      - The CPUs the NIC queue IRQs are pinned to (RV(gpunode.tuning.nic_irq_affinity#module:cpulist)),
        a CPU list. Part of the housekeeping CPUs.
    type: str
    default: ""
  reserved_cpus:
    description: More housekeeping CPUs (for sshd, journald, the container runtime), a CPU list.
    type: str
    default: ""
  workload_cpus:
    description:
      - The workload CPUs, a CPU list. Not given (or empty), every online CPU that is not housekeeping.
      - It must not share a CPU with the housekeeping CPUs. Online CPUs in neither list are allowed and reported in
        RV(unassigned_cpus); every CPU named anywhere must be online (C(SYSFS/devices/system/cpu/online)).
    type: str
  housekeeping_units:
    description:
      - The units confined to the housekeeping CPUs, each a valid systemd unit name ending in C(.slice) or C(.scope)
        (not the root slice C(-.slice)). A scope is found in the cgroup tree of the slice it runs in.
      - C(user.slice) holds every login session, so with it (the default) a shell from ssh runs on the housekeeping
        CPUs, and C(taskset -c WORKLOAD) there fails (a task's CPUs are bounded by its cgroup's cpuset). Start work
        from a session with C(systemd-run --slice=WORKLOAD_SLICE), or leave C(user.slice) out.
    type: list
    elements: str
    default: [system.slice, user.slice, init.scope]
  system_slice:
    description:
      - How C(system.slice), when it is in O(housekeeping_units), is kept on the housekeeping CPUs.
      - C(slice) - its own C(AllowedCPUs=) drop-in. Everything below it is bounded by it (cgroup v2 - a child never
        gets more than its parent's effective CPUs), scopes that other software starts there included.
      - C(services) - C(system.slice) is not confined; every service is, through the top-level drop-in
        C(/etc/systemd/system/service.d/DROPIN_NAME) (systemd 244 and later; it applies to transient services too). Scopes
        in C(system.slice) are then free - Slurm's C(slurmstepd.scope), where Slurm's cgroup/v2 plugin runs every job step
        (up to Slurm 25.05 it is always in C(system.slice); Slurm's C(CpuSpecList) and C(ConstrainCores=yes) then keep
        jobs off the housekeeping cores). A service in the workload slice keeps that slice's CPUs - none of its
        C(AllowedCPUs=) is in them, and the kernel then gives its cgroup the parent's CPUs (cgroup-v2.rst,
        C(cpuset.cpus.effective)).
      - C(auto) - C(services) where Slurm's job steps run in C(system.slice) (its C(slurmstepd.scope) cgroup exists, or a
        C(slurmd.service) unit file is installed), else C(slice). With Slurm 25.11's C(CgroupSlice=) moving the steps out,
        give C(slice). RV(system_slice) says which was used and why.
    type: str
    choices: [auto, slice, services]
    default: auto
  workload_units:
    description:
      - More slices or scopes given the workload CPUs with a drop-in, for work that systemd places outside the
        workload slice - C(machine.slice) holds rootful podman's containers (its default cgroup parent with the systemd
        cgroup manager). Not a housekeeping unit, not the workload slice.
    type: list
    elements: str
    default: []
  workload_slice:
    description:
      - The slice created for the workload, with C(AllowedCPUs=) the workload CPUs. A valid slice name, not one of
        O(housekeeping_units).
      - A dash in a slice name means a parent slice in systemd - C(gpunode-workload.slice) is a child of
        C(gpunode.slice), cgroup C(gpunode.slice/gpunode-workload.slice). A name inside a housekeeping slice
        (C(system-work.slice) is in C(system.slice)) is refused, as is a housekeeping slice inside this one.
      - systemd starts the slice when the first unit runs in it; until then it has no cgroup, and RV(effective) shows it
        with null values.
    type: str
    default: gpunode-workload.slice
  cpu_affinity:
    description:
      - Also set PID 1's C(CPUAffinity=) to the housekeeping CPUs (C(/etc/systemd/system.conf.d/DROPIN_NAME)), which
        every process it starts inherits unless the unit sets its own C(CPUAffinity=) - units in the workload slice
        too, so start those with C(systemd-run -p CPUAffinity=WORKLOAD ...).
      - PID 1 applies it at boot, daemon-reexec and daemon-reload, to the processes it starts after; running services
        keep their CPUs and a removed setting never widens PID 1's mask again, so a change of this file sets
        RV(reboot_required).
      - False removes the module's own file if an earlier run wrote it.
    type: bool
    default: false
  dropin_name:
    description: The file name of the drop-ins and of the system.conf.d file, a plain name ending in C(.conf).
    type: str
    default: 50-gpunode-cpuset.conf
  state:
    description: C(present) writes and applies the files, C(absent) removes them (see above).
    type: str
    choices: [present, absent]
    default: present
  root:
    description:
      - The root the files are written under. Anything but C(/) is a tree (an image, a test tree) - the files are
        planned and written under it, no systemctl runs and nothing is made effective; drift is reported, not acted on
        and not counted as a change. Give it with O(sysfs_path) of the same tree (T and T/sys).
    type: path
    default: /
  sysfs_path:
    description:
      - Root of sysfs. The online CPUs are read from C(devices/system/cpu/online), the cgroups from C(fs/cgroup).
    type: path
    default: /sys
notes:
  - systemctl runs through the module only on the live host and not in check mode - C(daemon-reload) when a file changed or
    a cgroup drifted, C(stop) for an empty workload slice whose file was removed, and C(show --property=AllowedCPUs) for
    units whose C(AllowedCPUs=) went away.
  - No C(systemctl set-property) is used - daemon-reload alone applies the files, and set-property would leave one more
    drop-in (in C(/etc/systemd/system.control) or C(/run/systemd/system.control)) for a removal to find.
  - systemd applies a unit's drop-ins from every directory in one list sorted by file name, and the last C(AllowedCPUs=)
    wins. Another drop-in that sets C(AllowedCPUs=) for a housekeeping unit and sorts after O(dropin_name) (or any
    drop-in that sets it for the workload slice) is refused before anything is written, naming the file.
  - Why daemon-reload is enough (systemd v252) - C(unit_deserialize) in src/core/unit-serialize.c invalidates the
    cgroup of every realized unit, C(manager_dispatch_cgroup_realize_queue) re-runs C(cgroup_context_apply)
    (src/core/cgroup.c), which writes C(cpuset.cpus) from the reloaded C(AllowedCPUs=), and C(manager_loop)
    (src/core/manager.c) does so before it sends the reply to the reload.
  - Container runtimes and schedulers whose cgroups sit under a housekeeping unit are confined with it - Docker with the
    systemd cgroup driver puts containers in C(system.slice) (moby daemon/oci_linux.go); give them
    C(--cgroup-parent=WORKLOAD_SLICE) or C("cgroup-parent") in C(daemon.json). Rootful podman uses C(machine.slice) - name it
    in O(workload_units). Slurm - see O(system_slice).
  - "The same facts, for other tools (RV(workload_cpus) and RV(housekeeping_cpus) of this module):
    C(taskset -c WORKLOAD_CPUS cmd) and C(numactl --physcpubind=WORKLOAD_CPUS cmd) from a shell outside the
    housekeeping units;
    C(systemd-run --slice=WORKLOAD_SLICE --scope cmd) (or C(--unit=NAME) for a service);
    C(podman run --cpuset-cpus=WORKLOAD_CPUS ...) and C(docker run --cgroup-parent=WORKLOAD_SLICE --cpuset-cpus=WORKLOAD_CPUS ...);
    kubelet C(reservedSystemCPUs: HOUSEKEEPING_CPUS) with the static CPU manager policy."
seealso:
  - module: gpunode.tuning.nic_irq_affinity
  - name: systemd.resource-control(5), AllowedCPUs=
    description: The cgroup setting this module writes.
    link: https://www.freedesktop.org/software/systemd/man/systemd.resource-control.html#AllowedCPUs=
"""

EXAMPLES = r"""
- name: Services on the NIC IRQ CPUs 0-3 and CPU 96, training on the rest
  gpunode.tuning.cpuset_slices:
    irq_cpus: "0-3"
    reserved_cpus: "96"
  register: cpusets

- name: Start a data loader on the workload CPUs, as a service in the workload slice
  ansible.builtin.command: systemd-run --slice=gpunode-workload.slice --unit=loader /opt/loader
  changed_when: true

- name: Or pin a process to them by hand (from outside the confined units)
  ansible.builtin.debug:
    msg: "numactl --physcpubind={{ cpusets.workload_cpus }} python train.py"

- name: Explicit split, with PID 1's affinity too (reported as reboot_required)
  gpunode.tuning.cpuset_slices:
    housekeeping_cpus: "0-7"
    workload_cpus: "8-191"
    cpu_affinity: true

- name: Drift report
  gpunode.tuning.cpuset_slices:
    irq_cpus: "0-3"
  check_mode: true
  diff: true

- name: Undo
  gpunode.tuning.cpuset_slices:
    state: absent
"""

RETURN = r"""
housekeeping_cpus:
  description: The housekeeping CPUs as a CPU list; empty for O(state=absent).
  returned: always
  type: str
  sample: "0-3,96"
workload_cpus:
  description: The workload CPUs as a CPU list; empty for O(state=absent).
  returned: always
  type: str
  sample: "4-95,97-191"
unassigned_cpus:
  description: Online CPUs in neither set (only with an explicit O(workload_cpus)).
  returned: always
  type: str
  sample: ""
files:
  description: Every file compared, with C(action) create, update, remove or unchanged, and the reason.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/systemd/system/system.slice.d/50-gpunode-cpuset.conf", "action": "create", "reason": "missing"}]
effective:
  description:
    - The cgroups of the units, read back after the apply (in check mode and on a tree, as found) - per unit its
      C(cgroup) below C(SYSFS/fs/cgroup), C(cpus) (its own C(cpuset.cpus), null without the file) and C(effective)
      (its C(cpuset.cpus.effective), or the nearest ancestor's when it has none - the CPUs its processes may use). All
      null for a unit that is not running.
  returned: always
  type: dict
  sample: {"system.slice": {"cgroup": "system.slice", "cpus": "0-3,96", "effective": "0-3,96"}}
drift:
  description: The units whose running cgroup is not what the files ask for, before this run acted.
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "system.slice", "cgroup": "system.slice", "reason": "cpuset.cpus is 0-191, want 0-3,96",
            "cpus": "0-191", "effective": "0-191", "want": "0-3,96"}]
systemd:
  description: The systemctl actions and cgroup resets taken (in check mode or on a tree, that would be taken).
  returned: always
  type: list
  elements: str
  sample: [daemon-reload]
system_slice:
  description: How C(system.slice) was kept on the housekeeping CPUs (C(mode) slice, services or null when it is not a
    housekeeping unit) and why (C(why)); see O(system_slice).
  returned: always
  type: dict
  sample: {"mode": "services", "why": "Slurm's slurmstepd.scope, which holds the job steps, runs in system.slice"}
reboot_required:
  description: Whether the C(CPUAffinity=) file was created, changed or removed (see O(cpu_affinity)).
  returned: always
  type: bool
warnings:
  description:
    - Ansible's warnings of the task - what the module could not do or check, and the C(CPUAffinity=) caveat when that
      file changed.
  returned: when there is one
  type: list
  elements: str
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.cpuset_slices import ARGUMENT_SPEC, MUTUALLY_EXCLUSIVE, converge
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with


INPUT_RULES = {
    "housekeeping_cpus": "cpulist",
    "irq_cpus": "cpulist",
    "reserved_cpus": "cpulist",
    "workload_cpus": "cpulist",
    "housekeeping_units": "unit",
    "workload_slice": "unit",
    "workload_units": "unit",
    "dropin_name": "file_name",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=MUTUALLY_EXCLUSIVE)
    params = module.params
    target = module_target(module, ("systemctl",), require=("root",))
    result, diff = run_or_fail(module, converge, params, target.run, target.check)
    exit_with(module, result, diff, result.pop("warnings"))


if __name__ == "__main__":
    main()
