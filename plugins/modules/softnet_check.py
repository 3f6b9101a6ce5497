#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: softnet_check
short_description: Prove or rule out contention between NIC interrupts and compute on a host
version_added: 0.1.0
description:
  - Samples, at the same two instants O(interval) seconds apart, every signal of the "confirm you actually have
    contention" step of the NIC IRQ affinity guide; no C(mpstat) or sysstat needed.
  - "Per-CPU C(time_squeeze), C(dropped) and C(processed) deltas from C(/proc/net/softnet_stat). Every layout is
    parsed (9, 10, 11, 13, 15 columns and wider). Rows are mapped to CPUs by the CPU-index column (13 columns and
    more), else by the order of C(/sys/devices/system/cpu/online). The counters are u32 and wrap."
  - Per-CPU C(%usr), C(%nice), C(%sys), C(%iowait), C(%irq), C(%soft), C(%steal) and C(%idle) from C(/proc/stat)
    deltas, computed as mpstat computes them (guest time taken out of user time).
  - Per-CPU C(NET_RX) softirq counts from C(/proc/softirqs).
  - The interface's receive and transmit throughput from C(/proc/net/dev), against its link speed from
    C(/sys/class/net/IFACE/speed). An unknown or C(-1) speed is reported as unknown, never as zero.
  - The IRQ CPUs are where the NIC's queue IRQs really fired during the sample, the CPUs whose C(/proc/interrupts)
    counts of those IRQs grew between the two samples, so a pin made a second before the window is seen at once
    (C(effective_affinity_list) follows a new pin only when each IRQ fires again). When no queue IRQ fired, they
    are where the affinity files say the IRQs land (effective affinity, else affinity), read with the same code as
    M(gpunode.tuning.nic_irq_facts). Both are returned, with the source used. O(irq_cpus) overrides them.
  - "Returns a verdict that answers the guide's question, whether NIC interrupt work and the workload compete for
    the same CPUs: V(contention), V(no_contention), V(idle) (no user work and no traffic: nothing can be judged
    until the job runs) or V(inconclusive), with reasons that quote the numbers, and flags squeezes on CPUs that
    carry no NIC IRQ."
  - "Beside the verdict, RV(findings) reports IRQ CPUs saturated by packet rate: IRQ CPUs without user work that
    squeeze at or above O(squeeze_rate). Their remedy is more IRQ CPUs or RPS, not more queues; they are not
    contention."
  - Read-only. It sleeps O(interval) seconds between the two samples, also in check mode.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.nic_selector
  - gpunode.tuning.target.procfs_sysfs
options:
  irq_cpus:
    description:
      - CPUs that handle the NIC's interrupts, as a CPU list (C(0-10)) or a list of integers.
      - Overrides the CPUs read from the NIC's queue IRQs.
    type: raw
  interval:
    description:
      - Seconds between the two samples. Fractions are allowed. At most 3600.
    type: float
    default: 10
  squeeze_rate:
    description:
      - C(time_squeeze) events per second on one CPU at or above which that CPU squeezes (signal 1), for the
        contention rule (on a CPU that also has softirq and user work) and for the saturation finding (on an IRQ
        CPU without user work). Measured over the actual interval.
      - "Why 0.5 per second: the guide's example is 100-200 squeezes per 10 seconds on the 11 IRQ CPUs 0-10 of
        one 176-vCPU node at 7 Gbit/s, which is 0.9-1.8 per CPU per second when read as their total (its lowest
        reading), and a healthy machine shows +0 everywhere; an idle lab guest squeezes about 0.2 per second. The
        recorded lab runs (C(benchmarks/closed_loop_results.json)) had 7.8 per second (78 in 10.03 s) on the one
        IRQ CPU that also ran a worker before tuning, and 13.4 per second on the dedicated IRQ CPU without user
        work after it. A rate per CPU does not depend on how many IRQ CPUs a node has, which the earlier total of
        100 per 10 s over all IRQ CPUs did (0.9 per second per CPU on 11 CPUs, 10 on one)."
    type: float
    default: 0.5
  squeeze_share_pct:
    description:
      - Percent of all squeezes (every CPU) that the IRQ CPUs with usr >= O(user_pct) must carry for V(contention), the
        guide's "CPUs 0-10 show hundreds ... while the rest of the machine shows none". Below it the verdict is
        V(inconclusive).
    type: float
    default: 50
  idle_pps:
    description:
      - Packets per second (received plus sent on the interface; without an interface, packets processed by
        every CPU) below which the NIC counts as idle. With no CPU at or above O(user_pct) as well, the verdict
        is V(idle); a V(no_contention) verdict under it carries a note to repeat under load.
    type: float
    default: 100
  softirq_pct:
    description:
      - Minimum C(%soft) of an IRQ CPU for signal 2 (softirq on CPUs that also run user work). The guide's
        pattern is 5-20 %.
    type: float
    default: 5
  user_pct:
    description:
      - Minimum C(%usr) of a CPU for it to run user work (signal 2 on an IRQ CPU; any CPU for a host that is not
        V(idle)). The guide's pattern is 40-70 %.
    type: float
    default: 40
  max_link_util_pct:
    description:
      - Link utilisation (the busier direction, in percent of the link speed) below which signal 3 (the link is
        far from saturated) holds.
    type: float
    default: 10
  link_speed_mbps:
    description:
      - Link speed in Mbit/s, for NICs whose C(speed) file is unknown or C(-1) (virtio, some VFs).
    type: int
  fail_on_contention:
    description:
      - Fail the task when the verdict is V(contention), for pipelines that gate on it. All return values are
        still returned.
    type: bool
    default: false
notes:
  - Every threshold must be a finite number >= 0, and O(softirq_pct), O(user_pct), O(max_link_util_pct) and
    O(squeeze_share_pct) at most 100; NaN, infinity and anything else fail before sampling.
  - Take the measurement while the training job runs and moves storage traffic; on an idle host every check
    correctly reports nothing wrong.
  - "Verdict rules, tried in order; the first whose condition holds gives the verdict. RV(verdict_rule) names it, and
    the diagnose playbook's report prints the same table:"
  - "1. no CPU has usr >= O(user_pct) % and the NIC moves less than O(idle_pps) packets/s: V(idle) (nothing can
    be judged until the job runs)."
  - "2. no NIC queue IRQ CPU is known: V(inconclusive)."
  - "3. no IRQ CPU has usr >= O(user_pct) %: V(no_contention) (whatever the squeezes; see RV(findings))."
  - "4. no IRQ CPU has both softirq >= O(softirq_pct) % and usr >= O(user_pct) %: V(no_contention) (the NIC's
    work on the shared CPUs is light)."
  - "5. no such shared CPU squeezes O(squeeze_rate) times per second or more: V(no_contention) (packets do not
    wait)."
  - "6. the IRQ CPUs with usr >= O(user_pct) % carry less than O(squeeze_share_pct) % of all squeezes:
    V(inconclusive) (most squeezes are elsewhere)."
  - "7. the link speed or throughput is unknown: V(inconclusive)."
  - "8. the link is at or above O(max_link_util_pct) % of its speed: V(inconclusive) (the link is busy)."
  - "9. none of the above: softirq, user work and squeezes on the same IRQ CPUs: V(contention)."
  - The rules, the thresholds and the measurements behind them are explained in the collection's
    C(docs/verdicts.md).
  - The threshold defaults above are the ones the verdict code uses (C(DEFAULT_THRESHOLDS) in the collection's
    C(_softnet.verdict) module_utils); a unit test keeps the two equal.
seealso:
  - module: gpunode.tuning.nic_irq_facts
  - module: gpunode.tuning.nic_irq_affinity
"""

EXAMPLES = r"""
- name: Check the default-route NIC for 10 seconds
  gpunode.tuning.softnet_check:
  register: softnet

- name: Show the verdict
  ansible.builtin.debug:
    msg: "{{ softnet.verdict }}: {{ softnet.reasons | join('; ') }}"

- name: Gate a pipeline on the storage NIC, with the seed's CPUs 0-10 as IRQ CPUs
  gpunode.tuning.softnet_check:
    pci_address: "0000:42:01.0"
    irq_cpus: 0-10
    interval: 10
    fail_on_contention: true

- name: Quick look at a virtio NIC that reports no speed
  gpunode.tuning.softnet_check:
    interface: enp66s1
    interval: 2.5
    link_speed_mbps: 10000
"""

RETURN = r"""
changed:
  description: Always false; the module only reads.
  returned: always
  type: bool
  sample: false
verdict:
  description: V(contention), V(no_contention), V(idle) or V(inconclusive).
  returned: always
  type: str
  sample: contention
verdict_rule:
  description:
    - The rule of the verdict table (see the notes) that gave the verdict, by name, in table order V(idle),
      V(no_irq_cpus), V(irq_cpus_no_user_work), V(no_shared_cpu), V(squeezes_low), V(squeezes_elsewhere),
      V(link_unknown), V(link_busy), V(contention).
  returned: always
  type: str
  sample: contention
reasons:
  description: Why, in sentences that quote the measured numbers and the thresholds.
  returned: always
  type: list
  elements: str
  sample:
    - "IRQ CPUs 4 run user work (usr >= 40 %)"
    - "IRQ CPUs 4 also run user work: usr 55.13-55.13 %, soft 28.97-28.97 % (thresholds usr >= 40 %, soft >= 5 %)"
    - "time_squeeze on the shared CPUs 4 at or above 0.5 per s: CPU 4 78 in 10.03 s (7.78 per s)"
    - "the shared CPUs carry 98.7 % of all squeezes (78 of 79), at or above 50 %"
    - "link enp66s1 far from saturated: 0.24 % of 10000 Mbit/s (rx 24, tx 0.1 Mbit/s), below 10 %"
findings:
  description:
    - Findings beside the verdict, whatever it is. V(irq_cpus_saturated) (IRQ CPUs saturated by packet rate) lists
      the IRQ CPUs with usr below O(user_pct) that squeeze at or above O(squeeze_rate) per second; its remedy is
      more IRQ CPUs or RPS, never more queues. Empty when there is nothing to report.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: V(irq_cpus_saturated).
      type: str
      returned: always
    title:
      description: The finding in words.
      type: str
      returned: always
    cpus:
      description: The CPUs concerned.
      type: list
      elements: int
      returned: always
    reason:
      description: The numbers, quoted.
      type: str
      returned: always
    remedy:
      description: What to do about it.
      type: str
      returned: always
irq_cpu_processes:
  description:
    - Whose user work ran on the IRQ CPUs during the window, for each IRQ CPU with usr + nice of 1 % or more.
    - Read from C(/proc/PID/task/TID/stat) just before and just after the window; a thread's C(utime) growth is
      charged to the CPU it last ran on (exact for a thread bound to one CPU). A process's C(user_pct) is its user
      time over the window, as mpstat's. A thread that started and ended inside the window is not seen, so
      C(attributed_pct) is the share of the CPU's usr that the listed processes explain.
    - When an IRQ CPU's usr reaches O(user_pct), the reasons name these processes.
  returned: always
  type: list
  elements: dict
  sample:
    - cpu: 4
      user_pct: 83.52
      attributed_pct: 97.5
      processes:
        - {pid: 499, comm: python3, cgroup: /gpunode.slice/gpunode-workload.slice/loader-4.service, user_ticks: 814, user_pct: 81.4}
task_notes:
  description: Why the processes on the IRQ CPUs are unknown or partly unknown (no readable thread, unreadable lines).
  returned: always
  type: list
  elements: str

signals:
  description: The three signals of the guide; null where the rules did not get that far.
  returned: always
  type: dict
  contains:
    squeezes_on_irq_cpus:
      description: A shared IRQ CPU (softirq and user work) squeezes at or above O(squeeze_rate) per second.
      type: bool
      returned: always
    irq_cpus_busy:
      description: At least one IRQ CPU at or above both O(softirq_pct) and O(user_pct).
      type: bool
      returned: always
    link_not_saturated:
      description: Link utilisation below O(max_link_util_pct).
      type: bool
      returned: always
interface:
  description: The interface checked; null when no NIC could be found (then the verdict is V(inconclusive)).
  returned: always
  type: str
  sample: ens7
pci_address:
  description: PCI address of the interface's function, or null.
  returned: always
  type: str
  sample: "0000:42:01.0"
driver:
  description: Driver of the interface, or null.
  returned: always
  type: str
  sample: mlx5_core
irq_cpus:
  description: The IRQ CPUs the verdict used (see RV(irq_cpus_source)).
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
irq_cpulist:
  description: O(irq_cpus) as a CPU list string.
  returned: always
  type: str
  sample: 0-10
irq_cpus_source:
  description:
    - Where the IRQ CPUs came from. V(option), V(interrupts) (the CPUs where the queue IRQs fired during the
      sample, RV(irq_cpus_fired)), or, when no queue IRQ fired, the affinity files (RV(irq_cpus_affinity_source))
      with V(effective_affinity), V(affinity) (the kernel has no effective affinity list), V(mixed) or V(none) (no
      queue IRQs found).
  returned: always
  type: str
  sample: interrupts
irq_cpus_fired:
  description:
    - CPUs whose C(/proc/interrupts) counts of the NIC's queue IRQs grew during the sample; empty when none fired,
      null when it cannot be told (no queue IRQs, C(/proc/interrupts) unreadable).
  returned: always
  type: list
  elements: int
  sample: [2, 3]
irq_cpus_affinity:
  description: Where the affinity files say the queue IRQs land (effective affinity, else affinity).
  returned: always
  type: list
  elements: int
  sample: [2, 3, 4, 5, 6, 7]
irq_cpus_affinity_source:
  description: V(effective_affinity), V(affinity), V(mixed) or V(none), as for RV(irq_cpus_source).
  returned: always
  type: str
  sample: effective_affinity
hot_cpus:
  description: CPUs with squeezes at or above O(squeeze_rate) per second, or with both softirq and user time at or
    above their thresholds.
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2]
busy_irq_cpus:
  description: IRQ CPUs at or above both O(softirq_pct) and O(user_pct) (the shared CPUs).
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2]
contended_cpus:
  description: Shared CPUs (RV(busy_irq_cpus)) that also squeeze at or above O(squeeze_rate) per second.
  returned: always
  type: list
  elements: int
  sample: [0, 1]
non_irq_squeeze_cpus:
  description: CPUs that squeezed during the sample but carry no NIC queue IRQ.
  returned: always
  type: list
  elements: int
  sample: [12]
online_cpus:
  description: Online CPUs at the first sample.
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2, 3]
interval_requested:
  description: O(interval) as given.
  returned: always
  type: float
  sample: 10.0
interval:
  description: Measured seconds between the two samples; every rate uses it.
  returned: always
  type: float
  sample: 10.001
window:
  description: >-
    Wall-clock instants (seconds since the epoch) of the two samples, so that other per-second measurements
    (mpstat, sar, a cluster-wide report) can be lined up with this window.
  returned: always
  type: dict
  contains:
    start:
      description: The first sample.
      type: float
    end:
      description: The second sample.
      type: float
softnet:
  description: The C(/proc/net/softnet_stat) layout found.
  returned: always
  type: dict
  contains:
    width:
      description: Columns per row.
      type: int
      returned: always
      sample: 13
    layout:
      description: Which kernels print this width.
      type: str
      returned: always
      sample: "13 columns (kernel 5.10-6.3, RHEL 8.5+: + backlog_len, CPU index)"
    cpu_mapping:
      description: V(index_column) (rows carry their CPU id) or V(online_order).
      type: str
      returned: always
      sample: index_column
cpus:
  description: One entry per CPU, ascending. Percentages are null for a CPU without a C(/proc/stat) line.
  returned: always
  type: list
  elements: dict
  contains:
    cpu:
      description: CPU id.
      type: int
      returned: always
    online:
      description: Whether the CPU was online.
      type: bool
      returned: always
    irq_cpu:
      description: Whether the CPU is one of the IRQ CPUs.
      type: bool
      returned: always
    hot:
      description: Whether the CPU is in RV(hot_cpus).
      type: bool
      returned: always
    usr:
      description: "%usr as mpstat computes it (user minus guest)."
      type: float
      returned: always
    nice:
      description: "%nice (nice minus guest_nice)."
      type: float
      returned: always
    sys:
      description: "%sys."
      type: float
      returned: always
    iowait:
      description: "%iowait."
      type: float
      returned: always
    irq:
      description: "%irq (hard interrupts)."
      type: float
      returned: always
    soft:
      description: "%soft (all softirqs)."
      type: float
      returned: always
    steal:
      description: "%steal."
      type: float
      returned: always
    guest:
      description: "%guest."
      type: float
      returned: always
    gnice:
      description: "%gnice."
      type: float
      returned: always
    idle:
      description: "%idle."
      type: float
      returned: always
    ticks:
      description: USER_HZ ticks of this CPU in the interval (mpstat's per-CPU interval).
      type: int
      returned: always
    time_squeeze:
      description: C(time_squeeze) delta (u32 wrap handled); null when the CPU has no softnet row.
      type: int
      returned: always
    squeeze_per_10s:
      description: C(time_squeeze) scaled to 10 seconds.
      type: float
      returned: always
    dropped:
      description: Backlog drops (C(netdev_max_backlog) exceeded) delta.
      type: int
      returned: always
    processed:
      description: Packets processed delta.
      type: int
      returned: always
    net_rx:
      description: C(NET_RX) softirqs in the interval; null when C(/proc/softirqs) has none.
      type: int
      returned: always
    net_rx_per_s:
      description: C(NET_RX) softirqs per second.
      type: float
      returned: always
link:
  description: Throughput of the interface; null without an interface.
  returned: always
  type: dict
  contains:
    interface:
      description: Interface name.
      type: str
      returned: always
    speed_mbps:
      description: Link speed in Mbit/s, or null when unknown (never 0 for unknown).
      type: int
      returned: always
    speed_source:
      description: V(sysfs), V(option) or V(unknown).
      type: str
      returned: always
    rx_bytes:
      description: Bytes received in the interval.
      type: int
      returned: always
    tx_bytes:
      description: Bytes sent in the interval.
      type: int
      returned: always
    rx_packets:
      description: Packets received in the interval.
      type: int
      returned: always
    tx_packets:
      description: Packets sent in the interval.
      type: int
      returned: always
    rx_mbps:
      description: Receive rate in Mbit/s.
      type: float
      returned: always
    tx_mbps:
      description: Transmit rate in Mbit/s.
      type: float
      returned: always
    utilisation_pct:
      description: The busier direction in percent of the link speed, or null when the speed is unknown.
      type: float
      returned: always
totals:
  description: Sums over the CPUs.
  returned: always
  type: dict
  contains:
    time_squeeze:
      description: Squeezes on all CPUs.
      type: int
      returned: always
    time_squeeze_irq_cpus:
      description: Squeezes on the IRQ CPUs.
      type: int
      returned: always
    time_squeeze_other_cpus:
      description: Squeezes on CPUs without NIC IRQs.
      type: int
      returned: always
    time_squeeze_per_10s:
      description: All squeezes scaled to 10 seconds.
      type: float
      returned: always
    time_squeeze_irq_cpus_per_10s:
      description: IRQ-CPU squeezes scaled to 10 seconds.
      type: float
      returned: always
    time_squeeze_shared_share_pct:
      description: Percent of all squeezes on the IRQ CPUs that run user work (usr >= O(user_pct)), whatever their softirq.
      type: float
      returned: always
    packets_per_s:
      description: Packets per second that O(idle_pps) is compared with; null when unknown.
      type: float
      returned: always
    dropped:
      description: Backlog drops on all CPUs.
      type: int
      returned: always
thresholds:
  description: The thresholds used.
  returned: always
  type: dict
  sample:
    squeeze_rate: 0.5
    squeeze_share_pct: 50.0
    softirq_pct: 5.0
    user_pct: 40.0
    max_link_util_pct: 10.0
    idle_pps: 100.0
notes:
  description: What could not be read or was guessed (missing effective affinity, NUMA hint, NET_RX line ...).
  returned: always
  type: list
  elements: str
"""

import math


from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import TreeError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import check_roots, roots_mixed
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.nic import SELECTOR_ARGUMENT_SPEC, SELECTOR_MUTUALLY_EXCLUSIVE, NicError, check_selector
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import DEFAULT_INTERVAL, SoftnetError, run_check
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import DEFAULT_THRESHOLDS

ARGUMENT_SPEC = dict(
    SELECTOR_ARGUMENT_SPEC,
    irq_cpus=dict(type="raw"),
    interval=dict(type="float", default=DEFAULT_INTERVAL),
    link_speed_mbps=dict(type="int"),
    fail_on_contention=dict(type="bool", default=False),
)
# The threshold defaults are defined once, in _softnet_verdict. DOCUMENTATION states them literally:
# validate-modules compares it with this spec, and a unit test compares it with DEFAULT_THRESHOLDS.
ARGUMENT_SPEC.update((key, dict(type="float", default=value)) for key, value in DEFAULT_THRESHOLDS.items())


PERCENT_OPTIONS = ("softirq_pct", "user_pct", "max_link_util_pct", "squeeze_share_pct")
RATE_OPTIONS = ("squeeze_rate", "idle_pps")


def check_thresholds(params):
    """Raise SoftnetError for a threshold that is NaN, infinite, negative, or a percentage above 100.

    NaN compares false with everything, so a NaN threshold would silently turn
    every comparison of the verdict rules (0 squeezes became contention).
    """
    for key in RATE_OPTIONS + PERCENT_OPTIONS:
        value = params.get(key)
        if value is None:
            continue
        if key in PERCENT_OPTIONS:
            if not (math.isfinite(value) and 0 <= value <= 100):
                raise SoftnetError("%s %r is not a percentage from 0 to 100" % (key, value), value=value, expected="0 <= %s <= 100" % key)
        elif not (math.isfinite(value) and value >= 0):
            raise SoftnetError("%s %r is not a finite number >= 0 (events per second)" % (key, value), value=value,
                               expected="a finite %s >= 0" % key)


INPUT_RULES = {
    "cidr": "cidr",
    "irq_cpus": "cpulist",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE)
    params = module.params
    procfs, sysfs = params["procfs_path"], params["sysfs_path"]
    try:
        check_roots(procfs, sysfs)
        check_selector(params)
        check_thresholds(params)
        mixed = roots_mixed(procfs, sysfs)
        if mixed:
            module.warn("%s: the sample mixes two systems" % mixed)
        result = run_check(params, procfs=procfs, sysfs=sysfs, run=module_target(module).run)
    except (SoftnetError, NicError, TreeError) as exc:
        module.fail_json(msg=str(exc), changed=False, **getattr(exc, "details", {}))
    if params["fail_on_contention"] and result["verdict"] == "contention":
        module.fail_json(msg="contention: " + "; ".join(result["reasons"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
