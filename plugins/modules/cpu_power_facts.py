#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_power_facts
short_description: C-states, turbo, frequency and NUMA placement of a GPU node, with a verdict and the evidence
version_added: 0.2.0
description:
  - "Idle: the cpuidle driver and governor, every CPU's idle states (name, exit latency, target residency, disable,
    usage), the deepest state enabled and the deepest entered, and a verdict - V(deep_cstate_reachable),
    V(limited) with each cause and its evidence (the BIOS exposes none, a kernel parameter such as
    C(intel_idle.max_cstate=1), a state disabled in sysfs, the ladder governor behind a disabled shallow state, a
    C(/dev/cpu_dma_latency) request and the processes holding it, C(power/pm_qos_resume_latency_us), an active
    tuned profile with C(force_latency)), or V(not_visible) in a VM without idle-state passthrough (no states, or
    only C(haltpoll)): the host's C-states are what matter there, and that is never reported as a pass."
  - NVIDIA's dgxc-benchmarking rule (warn when CPU 0 exposes two or fewer states or any state is disabled) is a note.
  - "Frequency: cpufreq driver and governor per policy, C(intel_pstate/no_turbo), C(cpufreq/boost),
    C(max_perf_pct), C(scaling_max_freq) against C(cpuinfo_max_freq), C(intel_pstate=disable) on the command line;
    verdict V(ok), V(limited) or V(not_visible)."
  - With O(sample_seconds), the frequency of the busy CPUs measured over that interval - APERF/MPERF through
    C(/dev/cpu/N/msr) as turbostat computes it, else the mean of C(scaling_cur_freq) - against the rated maximum.
  - "NUMA placement: C(kernel.numa_balancing), and for the processes chosen by O(pids) and O(process_patterns)
    the share of resident memory on nodes that are not local to their allowed CPUs (C(/proc/PID/numa_maps),
    C(Cpus_allowed_list)), flagged above O(remote_threshold_pct), and whether they may run on O(irq_cpus)."
  - "GPU locality where GPUs exist: C(nvidia-smi topo -m) parsed - each GPU's local CPUs and NUMA node, and the
    path class to each NIC."
  - Read-only.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.attributes.facts
  - gpunode.tuning.target.procfs_sysfs
options:
  governor:
    description:
      - The cpufreq governor every policy is expected to run; another one is a cause of a V(limited) frequency
        verdict. Empty checks no governor. A governor that the driver does not offer fails, naming it.
    type: str
    default: performance
  sample_seconds:
    description:
      - Measure the busy CPUs' frequency over this many seconds (0 to 600); 0 does not measure.
    type: float
    default: 0
  busy_pct:
    description: A CPU at least this busy (percent, 0-100) during O(sample_seconds) counts as busy.
    type: float
    default: 50
  min_frequency_pct:
    description: The busy CPUs' mean frequency, in percent of the rated maximum (0-100), below which it is V(low).
    type: float
    default: 90
  pids:
    description: Processes whose NUMA placement is checked, by pid. A pid that does not exist fails, naming it.
    type: list
    elements: int
    default: []
  process_patterns:
    description:
      - Processes whose NUMA placement is checked, by Python regular expression searched in their C(comm) and full
        command line. An invalid expression fails, naming it.
    type: list
    elements: str
    default: []
  remote_threshold_pct:
    description: Percent (0-100) of a process's resident memory on remote nodes above which it is flagged.
    type: float
    default: 10
  irq_cpus:
    description:
      - CPUs that carry NIC interrupts, a CPU list (C(0-10)) or a list of integers; a checked process allowed on any
        of them is flagged.
    type: raw
  gpu_topology:
    description:
      - V(auto) runs C(nvidia-smi topo -m) where C(nvidia-smi) is installed (live roots only); V(never) does not.
      - A path reads that file instead, a saved C(nvidia-smi topo -m) output.
    type: str
    default: auto
notes:
  - On a captured tree (O(procfs_path), O(sysfs_path)) C(dev/cpu_dma_latency) and C(etc/tuned) are read under the
    tree's root, the parent of O(procfs_path).
  - BIOS settings cannot be read from the OS. What the firmware allows is inferred from the states the idle driver
    exposes and their latencies, and reported with that evidence.
  - On a VM the idle and frequency verdicts are V(not_visible); check the host.
seealso:
  - module: gpunode.tuning.kernel_cmdline
"""

EXAMPLES = r"""
- name: Read C-states, turbo and frequency
  gpunode.tuning.cpu_power_facts:
  register: power

- name: Fail where deep C-states are not reachable on bare metal
  ansible.builtin.assert:
    that: power.idle.verdict != 'limited'
    fail_msg: "{{ power.idle.causes | map(attribute='message') | join('; ') }}"

- name: Measure the busy-core frequency and check where the trainer's memory is
  gpunode.tuning.cpu_power_facts:
    sample_seconds: 5
    process_patterns: ['^python.*train\.py']
    irq_cpus: "{{ gpunode_irq_cpus }}"
"""

RETURN = r"""
idle:
  description: The idle reading and verdict.
  returned: always
  type: dict
  contains:
    verdict:
      description: V(deep_cstate_reachable), V(limited) or V(not_visible).
      type: str
    causes:
      description: What limits the deep states, each C(cause) (bios, no_driver, kernel_parameter, sysfs_disabled,
        ladder, pm_qos, resume_latency, tuned, vm) with a C(message) quoting the evidence (and C(param), C(cpus),
        C(states) where the cause has them).
      type: list
      elements: dict
    notes:
      description: Observations that do not change the verdict (the dgxc-benchmarking rule, states never entered).
      type: list
      elements: str
    states_cpu0:
      description: The states CPU 0 (the first CPU read) exposes, with latency, residency, disable and usage.
      type: list
      elements: dict
    deepest_enabled:
      description: The deepest state enabled on some CPU, or null.
      type: str
    deepest_entered:
      description: The deepest state some CPU has entered (usage above 0), or null.
      type: str
    reachable_cpus:
      description: The CPUs whose deepest enabled state is deep (CPU list); only where deep states exist.
      type: str
      returned: when a CPU exposes a deep state
    driver:
      description: The cpuidle driver (C(intel_idle), C(acpi_idle), C(haltpoll), C(none)), null without cpuidle.
      type: str
    governor:
      description: The cpuidle governor.
      type: str
    cpus:
      description: Every online CPU's states as read from sysfs (CPU number as a string -> list of states with
        C(time), C(default_status), C(above) and C(below) too).
      type: dict
    cmdline_limits:
      description: Kernel parameters on the command line that limit C-states (C(param), C(effect)).
      type: list
      elements: dict
    module_params:
      description: The idle drivers' module parameters that limit states (intel_idle C(max_cstate), ...).
      type: dict
    cpu_dma_latency_us:
      description: The PM QoS CPU latency request now in force (C(/dev/cpu_dma_latency)), or null if unreadable.
      type: int
    pm_qos_holders:
      description: The processes holding C(/dev/cpu_dma_latency) open (C(pid), C(comm)).
      type: list
      elements: dict
    tuned:
      description: tuned's C(profiles) in use, whether it is C(running), the C(force_latency) they set and the profile
        it comes C(from); null without tuned.
      type: dict
    resume_latency_us:
      description: Per CPU (number as a string), the device PM QoS resume latency limit where one is set.
      type: dict
  sample: {"verdict": "not_visible", "driver": "none", "causes": [{"cause": "vm", "message": "a kvm guest ..."}]}
frequency:
  description: The frequency reading and verdict.
  returned: always
  type: dict
  contains:
    verdict:
      description: V(ok), V(limited) or V(not_visible).
      type: str
    causes:
      description: What limits the frequency, each C(cause) with a C(message) quoting the evidence.
      type: list
      elements: dict
    notes:
      description: Observations that do not change the verdict.
      type: list
      elements: str
    drivers:
      description: The cpufreq scaling drivers in use.
      type: list
      elements: str
    governors:
      description: Governor -> CPU list.
      type: dict
    policies:
      description: Every cpufreq policy as read from sysfs (policy number as a string -> its CPUs, driver, governor,
        available governors, minimum and maximum frequencies).
      type: dict
    boost:
      description: C(/sys/devices/system/cpu/cpufreq/boost), null if absent.
      type: int
    intel_pstate:
      description: intel_pstate's global files (C(no_turbo), C(status), ...), null without intel_pstate.
      type: dict
    amd_pstate:
      description: amd_pstate's C(status), null without amd_pstate.
      type: str
    cmdline:
      description: Kernel parameters on the command line that bear on frequency (intel_pstate=, cpufreq.default_governor=, ...).
      type: list
      elements: str
measured:
  description: With O(sample_seconds), the busy CPUs' frequency.
  returned: when O(sample_seconds) is above 0
  type: dict
  contains:
    verdict:
      description: V(ok), V(low) or V(unknown).
      type: str
    message:
      description: The verdict in words, with the numbers.
      type: str
    method:
      description: How the frequency was measured, V(aperf_mperf) (through the msr device) or V(scaling_cur_freq);
        null when it could not be.
      type: str
    busy_cpus:
      description: The CPUs at least O(busy_pct) busy with a measured frequency (CPU list).
      type: str
    busy_mhz:
      description: Their mean frequency in MHz, null when none.
      type: float
    rated_mhz:
      description: Their rated maximum (cpuinfo_max_freq) in MHz, null when none.
      type: float
    cpus:
      description: Per CPU (number as a string), C(busy_pct) and C(mhz) over the sample.
      type: dict
    seconds:
      description: The sample's measured length.
      type: float
numa:
  description: NUMA placement of the selected processes.
  returned: always
  type: dict
  contains:
    numa_balancing:
      description: C(/proc/sys/kernel/numa_balancing) as C(value) and C(name), null if absent.
      type: dict
    processes:
      description: Each selected process's placement (C(pid), C(name), C(cpus_allowed), C(mems_allowed),
        C(local_nodes), memory per node from numa_maps, C(remote_pct), C(policies), C(notes)).
      type: list
      elements: dict
    irq_cpus:
      description: O(irq_cpus) as a CPU list, null when not given.
      type: str
    findings:
      description: Per process, C(flagged), the C(rules) it broke (V(remote_memory), V(irq_cpus)) and the C(reasons).
      type: list
      elements: dict
gpus:
  description: C(nvidia-smi topo -m) parsed, or C(available) false with the C(reason).
  returned: always
  type: dict
  contains:
    available:
      description: Whether a topology was read.
      type: bool
    reason:
      description: Why not.
      type: str
      returned: when C(available) is false
    source:
      description: C(nvidia-smi topo -m) or the file of O(gpu_topology).
      type: str
      returned: when C(available) is true
    topology:
      description: The matrix (C(gpus) with their CPU affinity and NUMA node, C(nics), the link of each pair).
      type: dict
      returned: when C(available) is true
    local_cpus:
      description: GPU index -> the CPUs local to it.
      type: dict
      returned: when C(available) is true
    nic_paths:
      description: GPU index -> C(links) (NIC -> link class), the C(best_class) and the C(best_nics).
      type: dict
      returned: when C(available) is true
virtualization:
  description: Whether this is a virtual machine.
  returned: always
  type: dict
  contains:
    virtualized:
      description: True in a VM.
      type: bool
    type:
      description: kvm, qemu, vmware, amazon, microsoft, xen, vm or none.
      type: str
    evidence:
      description: What showed it (DMI strings, the hypervisor CPU flag).
      type: list
      elements: str
findings:
  description: One line per check for a gate (the preflight playbook's C(cpu_power:*) findings).
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: V(idle), V(frequency), V(measured), V(numa_remote) or V(numa_irq_cpus).
      type: str
    status:
      description: V(pass), V(fail), V(not_visible) or V(unknown); V(not_visible) is never a pass.
      type: str
    verdict:
      description: The check's own verdict.
      type: str
    message:
      description: The verdict in words, with its evidence.
      type: str
    pid:
      description: The process judged (the NUMA checks).
      type: int
      returned: for V(numa_remote) and V(numa_irq_cpus)
ansible_facts:
  description: C(cpu_power), the whole result.
  returned: always
  type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._cpu.power import cpu_power_facts

ARGUMENT_SPEC = dict(
    governor=dict(type="str", default="performance"),
    sample_seconds=dict(type="float", default=0),
    busy_pct=dict(type="float", default=50),
    min_frequency_pct=dict(type="float", default=90),
    pids=dict(type="list", elements="int", default=[]),
    process_patterns=dict(type="list", elements="str", default=[]),
    remote_threshold_pct=dict(type="float", default=10),
    irq_cpus=dict(type="raw"),
    gpu_topology=dict(type="str", default="auto"),
    **target_spec("procfs_path", "sysfs_path")
)


INPUT_RULES = {
    "process_patterns": "regex",
    "irq_cpus": "cpulist",
    "gpu_topology": "keyword_or_path",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    facts = run_or_fail(module, cpu_power_facts, params, module_target(module, ("nvidia-smi",), require=("cpu",)).run)
    module.exit_json(changed=False, ansible_facts={"cpu_power": facts}, **facts)


if __name__ == "__main__":
    main()
