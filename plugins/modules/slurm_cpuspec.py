#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_cpuspec
short_description: Keep Slurm jobs off a node's IRQ CPUs with CpuSpecList on its NodeName line, prerequisites checked
version_added: 0.2.0
description:
  - Sets C(CpuSpecList=) on the C(NodeName) lines of C(slurm.conf) (and the files it includes) for the nodes given, so
    that Slurm keeps those CPUs for the system and never gives them to a job. Runs where C(slurm.conf) lives.
  - Each node's CPUs are given as B(Linux) CPU ids (the IRQ CPUs from C(gpunode.tuning.nic_irq_facts) or the
    C(nic_irq_pinning) role) with the node's topology. C(CpuSpecList) takes Slurm's B(abstract) ids, which differ from
    Linux ids wherever SMT siblings are numbered C(i) and C(i+N); the module translates them, and since Slurm widens the
    list to whole cores it reports the extra Linux CPUs that adds (C(extra_os_cpus) in RV(nodes)).
  - The file is read as Slurm reads it - case-insensitive keys, C(\) continuations, comments, C(Include) files,
    C(NodeName=DEFAULT), host ranges such as C(gpu[001-128]) and C(node[01,05-09]). Lines it does not change come back
    byte for byte. When only some nodes of a line need a new value the line is split, every other attribute kept
    (C(NodeAddr) and C(NodeHostname) split with the names), with a comment naming the original line.
  - B(Prerequisites), each checked and reported in RV(prerequisites) - C(TaskPlugin) including C(task/cgroup),
    C(ConstrainCores=yes) in C(cgroup.conf), C(SelectType=select/cons_tres), and no C(CoreSpecCount) on the node
    (CpuSpecList and CoreSpecCount on one node is an error in Slurm). Without them CpuSpecList has no effect, so a missing
    one fails the module with nothing written, unless O(set_prerequisites) sets it (or O(require_prerequisites=false)
    turns the failure into a warning). Nothing is set silently. A node with C(MemSpecLimit) is also checked for
    C(ConstrainRAMSpace=yes) and memory as a consumable resource (C(SelectTypeParameters) with C(Memory)), without
    which it does not confine slurmd; that one is reported and warned about, never set.
  - Everything is read and checked before anything is written - an unknown node, a CPU the node does not have, a
    malformed hostlist, a file that does not parse, a node on two lines, CoreSpecCount on the node, a reservation
    that leaves the node no CPU for jobs.
  - Nothing is reconfigured. RV(reconfigure_required) says that slurmctld and the slurmds must read the new file
    (C(scontrol reconfigure), or a restart where the node definitions changed); the C(gpunode.tuning.slurm_cpuspec)
    role does that through a handler when allowed.
attributes:
  check_mode:
    support: full
    details: The same plan as a real run, files and per-node values; nothing is written.
  diff_mode:
    support: full
    details: Before and after of every file that changes (slurm.conf, an include, cgroup.conf).
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.target.root
options:
  path:
    description: The main C(slurm.conf). Relative C(Include) names are read from its directory, as Slurm does.
    type: path
    default: /etc/slurm/slurm.conf
  cgroup_conf:
    description: The C(cgroup.conf) whose C(ConstrainCores) is checked (and set with O(set_prerequisites)). Default - C(cgroup.conf)
      next to O(path).
    type: path
  nodes:
    description:
      - The nodes to set, each a dict with C(name) (as on its NodeName line), C(cpus) (the Linux CPU ids to keep for the
        system, a list or a CPU list string such as C(4-5)) and C(topology).
      - >-
        C(topology) is one of - C({lscpu: TEXT}), the output of C(lscpu --parse=CPU,CORE,SOCKET) on the node (what the
        C(gpunode.tuning.slurm_cpuspec) role passes); C({sysfs: PATH}), a sysfs tree (C(/sys) when the module runs on
        the node itself); C({sockets: [CPU lists], cores: [CPU lists]}) or a list of C({cpu, socket, core}); or
        C({sockets: N, cores_per_socket: N, threads_per_core: N}) for a node whose Linux ids already are Slurm's (QEMU
        guests, machines with adjacent siblings). Slurm numbers sockets and cores in hwloc's logical order (lowest CPU
        first) - see module_utils/_slurm/cpus.
      - A node whose line has C(CPUs=) equal to its core count on SMT hardware gets core ids, as Slurm then counts
        cores (RV(nodes) C(ids=cores)).
      - With O(state=absent) only C(name) counts.
    type: list
    elements: dict
    required: true
  state:
    description: V(present) sets CpuSpecList on the nodes' lines; V(absent) takes it off their lines (a value from
      C(NodeName=DEFAULT) stays, with a warning).
    type: str
    choices: [present, absent]
    default: present
  set_prerequisites:
    description: Set the missing prerequisites - C(task/cgroup) added to C(TaskPlugin), C(SelectType=select/cons_tres),
      C(ConstrainCores=yes) in C(cgroup.conf) (created when missing). Each one set is reported.
    type: bool
    default: false
  require_prerequisites:
    description: Fail, with nothing written, when a prerequisite is missing and O(set_prerequisites) is false. With V(false) a warning
      instead.
    type: bool
    default: true
  slurmd_off_spec:
    description: Also require (and with O(set_prerequisites) or this option set, add) C(SlurmdOffSpec) in
      C(TaskPluginParam), so that slurmd itself does not run on the specialised CPUs.
    type: bool
    default: false
  backup:
    description: Copy each file to a timestamped backup before changing it (RV(backups)).
    type: bool
    default: false
  verify:
    description:
      - When the file already has what is asked, also ask slurmctld (C(scontrol show node -o)) and fail unless it reports
        each node's C(CPUSpecList) as planned - a file that was changed but never reconfigured. When the file changes
        (or would, in check mode) there is nothing to verify yet, and a warning says so.
      - Only with O(root=/), on a host where C(scontrol) reaches slurmctld.
    type: bool
    default: false
notes:
  - Runs no command but C(scontrol show node) with O(verify). Writes are atomic, keep each file's owner and mode, and are all or nothing.
  - Slurm's parsing rules are those of C(src/common/parse_config.c); glob includes are refused (Slurm skips them).
seealso:
  - name: Slurm core specialization
    description: CpuSpecList, CoreSpecCount and what they need.
    link: https://slurm.schedmd.com/core_spec.html
  - name: slurm.conf
    description: NodeName, CpuSpecList, TaskPluginParam=SlurmdOffSpec.
    link: https://slurm.schedmd.com/slurm.conf.html
"""

EXAMPLES = r"""
- name: Keep jobs off the IRQ CPUs of gpu001 and gpu002 (lscpu --parse=CPU,CORE,SOCKET registered on gpu001)
  gpunode.tuning.slurm_cpuspec:
    nodes:
      - name: gpu001
        cpus: "{{ hostvars['gpu001'].nic_irq_pinning_cpus }}"
        topology: {lscpu: "{{ hostvars['gpu001'].lscpu_parse.stdout }}"}
      - name: gpu002
        cpus: "4-5"
        topology: {sockets: 2, cores_per_socket: 2, threads_per_core: 2}
    set_prerequisites: true
  register: cpuspec

- name: Take it off again
  gpunode.tuning.slurm_cpuspec:
    nodes: [{name: gpu001}, {name: gpu002}]
    state: absent
"""

RETURN = r"""
nodes:
  description: Per node given - C(name), C(line) (file and line), C(os_cpus), C(whole_core_os_cpus) (Linux CPUs the
    whole-core rule reserves), C(extra_os_cpus) (those not asked for), C(cpu_spec_list) (the abstract ids written),
    C(topology).
  returned: success
  type: list
  elements: dict
  sample: [{"name": "gpu001", "os_cpus": "4", "whole_core_os_cpus": "4,100", "extra_os_cpus": "100", "cpu_spec_list": "8-9"}]
prerequisites:
  description: Each prerequisite - C(name), C(ok), C(current), C(wanted), C(where), and C(action=set) with C(set_in) when
    the module set it.
  returned: state is present
  type: list
  elements: dict
files:
  description: The files changed (in check mode, that would change).
  returned: success
  type: list
  elements: str
conf_files:
  description: Every file read - slurm.conf and its includes, in reading order.
  returned: success
  type: list
  elements: str
reconfigure_required:
  description: Whether the configuration changed, so that slurmctld and slurmd must read it again.
  returned: success
  type: bool
backups:
  description: Each changed file's backup, with O(backup).
  returned: success
  type: dict
verified:
  description: With O(verify) and nothing to change, per node C(name), C(ok), C(reported) (what scontrol shows) and C(message).
  returned: success
  type: list
  elements: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with, module_runner
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpuspec import ARGUMENT_SPEC, converge


INPUT_RULES = {}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    result, diff, warnings = run_or_fail(module, converge, module.params, module.check_mode, backup=module.backup_local,
                                         run=module_runner(module, commands=("scontrol",)))
    exit_with(module, result, diff, warnings)


if __name__ == "__main__":
    main()
