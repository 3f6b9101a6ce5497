# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check, part 2 of 4: two snapshots -> per-CPU and link numbers (pure).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``delta_u32`` and ``delta_counter`` take counter deltas across a
wrap; ``mpstat_percentages`` is mpstat's per-CPU arithmetic;
``compute_signals`` turns two ``_softnet.sample.read_sample`` snapshots into
the numbers ``_softnet.verdict.judge`` decides on.

``/proc/stat`` percentages are computed as sysstat's mpstat does
(``get_per_cpu_interval()`` in rd_stats.c and ``write_cpu_stats()`` in
mpstat.c): the per-CPU interval is the sum of user, nice, system, iowait,
idle, steal, irq and softirq deltas (guest and guest_nice are already inside
user and nice, so they are not added again); %usr is (user - guest) and %nice
is (nice - guest_nice); a counter that went backwards counts as 0 % (and its
guest shift is added to the interval, as mpstat does); a CPU whose interval is
0 is tickless and reported 100 % idle.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import (
    PCT_KEYS,
    SoftnetError,
    mpstat_percentages,
    parse_net_dev,
    parse_proc_stat,
    parse_softirqs,
    parse_softnet_stat,
)

U32 = 0xFFFFFFFF


def delta_u32(before, after):
    """Delta of a u32 counter that may have wrapped once (softnet_stat, softirqs)."""
    return (after - before) & U32


def delta_counter(before, after):
    """Delta of a /proc/net/dev counter (u64 on 64-bit kernels, unsigned long on
    32-bit ones): a value that went backwards from within u32 range wrapped at
    2**32 (as sysstat's ll_sp_value assumes); otherwise the counter was reset
    and the delta is unknown (None)."""
    if after >= before:
        return after - before
    if before <= U32:
        return (after - before) & U32
    return None


def compute_signals(first, second, online, interface=None, speed_mbps=None):
    """Turn two ``read_sample`` snapshots into numbers.

    ``online`` is the online CPU list (used to map softnet rows without a CPU
    column, and to list the CPUs). Returns ``elapsed`` (seconds between the
    snapshots), ``softnet`` (width, layout, cpu_mapping), ``cpus`` (list of
    per-CPU dicts, ascending) , ``link`` (or None without an interface) and
    ``notes``.
    """
    elapsed = second["time"] - first["time"]
    if elapsed <= 0:
        raise SoftnetError(
            "the two samples are %.3f s apart" % elapsed, value=elapsed, expected="a positive sampling interval"
        )
    notes = []
    soft1 = parse_softnet_stat(first["softnet_stat"], online)
    soft2 = parse_softnet_stat(second["softnet_stat"], online)
    stat1 = parse_proc_stat(first["stat"])
    stat2 = parse_proc_stat(second["stat"])
    net_rx1 = net_rx2 = None
    if first["softirqs"] is not None and second["softirqs"] is not None:
        net_rx1 = parse_softirqs(first["softirqs"])["counts"].get("NET_RX")
        net_rx2 = parse_softirqs(second["softirqs"])["counts"].get("NET_RX")
    if net_rx1 is None or net_rx2 is None:
        notes.append("/proc/softirqs has no NET_RX line: per-CPU NET_RX is unknown")

    cpu_ids = sorted(set(soft1["cpus"]) | set(soft2["cpus"]) | set(stat1) | set(stat2) | set(online or []))
    cpus = []
    for cpu in cpu_ids:
        row = {"cpu": cpu, "online": cpu in (online or cpu_ids)}
        if cpu in stat1 and cpu in stat2:
            row.update(mpstat_percentages(stat1[cpu], stat2[cpu]))
        else:
            row.update(dict((key, None) for key in PCT_KEYS))
            row["ticks"] = None
        if cpu in soft1["cpus"] and cpu in soft2["cpus"]:
            for key in ("time_squeeze", "dropped", "processed"):
                row[key] = delta_u32(soft1["cpus"][cpu][key], soft2["cpus"][cpu][key])
            row["squeeze_per_10s"] = round(row["time_squeeze"] * 10.0 / elapsed, 1)
        else:
            row.update({"time_squeeze": None, "dropped": None, "processed": None, "squeeze_per_10s": None})
        if net_rx1 is not None and net_rx2 is not None and cpu in net_rx1 and cpu in net_rx2:
            row["net_rx"] = delta_u32(net_rx1[cpu], net_rx2[cpu])
            row["net_rx_per_s"] = round(row["net_rx"] / elapsed, 1)
        else:
            row["net_rx"] = row["net_rx_per_s"] = None
        cpus.append(row)
    changed = sorted(set(soft1["cpus"]) ^ set(soft2["cpus"]))
    if changed:
        notes.append("CPUs %s went online or offline during the sample" % format_cpulist(changed))

    link = None
    if interface:
        link = {"interface": interface, "speed_mbps": speed_mbps}
        dev1 = parse_net_dev(first["net_dev"]) if first["net_dev"] is not None else {}
        dev2 = parse_net_dev(second["net_dev"]) if second["net_dev"] is not None else {}
        if interface in dev1 and interface in dev2:
            for direction in ("rx", "tx"):
                delta = delta_counter(dev1[interface][direction + "_bytes"], dev2[interface][direction + "_bytes"])
                packets = delta_counter(dev1[interface][direction + "_packets"], dev2[interface][direction + "_packets"])
                link[direction + "_bytes"] = delta
                link[direction + "_packets"] = packets
                link[direction + "_mbps"] = None if delta is None else round(delta * 8.0 / elapsed / 1e6, 3)
            rates = [link[d + "_mbps"] for d in ("rx", "tx") if link[d + "_mbps"] is not None]
            if speed_mbps and rates:
                link["utilisation_pct"] = round(max(rates) * 100.0 / speed_mbps, 2)
            else:
                link["utilisation_pct"] = None
        else:
            notes.append("%s is not in /proc/net/dev: link throughput is unknown" % interface)
            for key in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_mbps", "tx_mbps", "utilisation_pct"):
                link[key] = None
    return {
        "elapsed": round(elapsed, 3),
        "softnet": {"width": soft2["width"], "layout": soft2["layout"], "cpu_mapping": soft2["cpu_mapping"]},
        "cpus": cpus,
        "link": link,
        "notes": notes,
    }
