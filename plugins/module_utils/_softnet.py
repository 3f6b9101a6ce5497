# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prove or rule out NIC IRQ / compute contention on one host (seed 000, step 2).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. Split like the rest of the collection:

* **read**: ``parse_softnet_stat``, ``parse_proc_stat``, ``parse_softirqs``,
  ``parse_net_dev`` and ``read_sample`` (one snapshot of every signal, all
  files read back to back). The NIC (interface, link speed, queue IRQs and
  where they land) and the online CPUs come from ``_nic.read_nic`` and
  ``_topology.read_topology``, the same code ``nic_irq_facts`` uses.
* **compute** (pure): ``delta_u32``, ``delta_counter``, ``mpstat_percentages``,
  ``compute_signals`` (two snapshots -> per-CPU and link numbers).
* **judge** (pure): ``judge`` (numbers + IRQ CPUs + thresholds -> verdict and
  reasons that quote the numbers).
* ``run_check`` ties them together for the ``softnet_check`` module. It never
  writes anything.

``/proc/net/softnet_stat`` layouts, from ``softnet_seq_show()`` in the kernel
(net/core/dev.c until 3.9, net/core/net-procfs.c since); one row per *online*
CPU (``softnet_get_online()`` skips offline CPUs), every value ``%08x`` of a
u32 counter:

====== ====================================================================
width  columns (1-based)
====== ====================================================================
9      1 processed, 2 dropped, 3 time_squeeze, 4-8 zero (was fastroute),
       9 cpu_collision. Kernels before 2.6.35.
10     + 10 received_rps. 2.6.35 (RPS, commit 0a9627f2649a) to 3.10;
       RHEL 6 and RHEL 7 kernels keep this width.
11     + 11 flow_limit_count. 3.11 (commit 99bbc70741903c06) to 5.9.
13     + 12 backlog length, 13 CPU index ("the index is the CPU id owing this
       sd. Since offline CPUs are not displayed ..."). 5.10 (commit
       7d58e6555870d01d), backported to RHEL 8.5 (4.18.0-348). Column 9 is
       printed as 0 ("was cpu_collision").
15     + 14 input_pkt_queue length, 15 process_queue length. 6.4 (commit
       59da2d7b0e99c585).
====== ====================================================================

Wider rows (a future kernel) are accepted: the first 15 columns keep their
meaning. Where the CPU-index column exists, rows are mapped by it; otherwise by
the order of ``/sys/devices/system/cpu/online``.

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

import errno
import os
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import (
    CpuListError,
    format_cpulist,
    parse_cpulist,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._nic import NicError, read_nic
from ansible_collections.gpunode.tuning.plugins.module_utils._topology import read_topology

U32 = 0xFFFFFFFF

VERDICTS = ("contention", "inconclusive", "no_contention")

DEFAULT_THRESHOLDS = {
    # Seed 000: "hundreds of squeezes per 10 seconds" on the IRQ CPUs.
    "squeeze_threshold": 100.0,
    # Seed 000: "A healthy machine shows +0 everywhere"; below this total
    # (all CPUs, per 10 s) the squeezes count as near zero.
    "squeeze_quiet": 10.0,
    # Seed 000: soft in the 5-20 % range together with usr in the 40-70 % range.
    "softirq_pct": 5.0,
    "user_pct": 40.0,
    # Seed 000: "only a few percent of the interface's bandwidth".
    "max_link_util_pct": 10.0,
}

SOFTNET_LAYOUTS = {
    9: "9 columns (kernel < 2.6.35)",
    10: "10 columns (kernel 2.6.35-3.10, RHEL 6/7: + received_rps)",
    11: "11 columns (kernel 3.11-5.9: + flow_limit_count)",
    12: "12 columns (unknown layout: no CPU-index column)",
    13: "13 columns (kernel 5.10-6.3, RHEL 8.5+: + backlog_len, CPU index)",
    14: "14 columns (unknown layout: CPU index in column 13)",
    15: "15 columns (kernel >= 6.4: + input/process queue lengths)",
}

_SOFTNET_FIELDS = (
    # (0-based column, name, minimum width)
    (0, "processed", 9),
    (1, "dropped", 9),
    (2, "time_squeeze", 9),
    (8, "cpu_collision", 9),
    (9, "received_rps", 10),
    (10, "flow_limit_count", 11),
    (11, "backlog_len", 12),
    (13, "input_qlen", 14),
    (14, "process_qlen", 15),
)

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
_INTERVAL_FIELDS = ("user", "nice", "system", "iowait", "idle", "steal", "irq", "softirq")
PCT_KEYS = ("usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle")

NET_DEV_FIELDS = (
    "rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame", "rx_compressed", "rx_multicast",
    "tx_bytes", "tx_packets", "tx_errs", "tx_drop", "tx_fifo", "tx_colls", "tx_carrier", "tx_compressed",
)


class SoftnetError(Exception):
    """A proc file or an option that cannot be used.

    ``details`` holds the offending ``value`` and what was ``expected``, plus
    the ``path`` when a file is concerned.
    """

    def __init__(self, message, value=None, expected=None, path=None):
        super(SoftnetError, self).__init__(message)
        self.value = value
        self.expected = expected
        self.path = path

    @property
    def details(self):
        details = {"value": self.value, "expected": self.expected}
        if self.path is not None:
            details["path"] = self.path
        return details


# --------------------------------------------------------------------------
# read: parsers
# --------------------------------------------------------------------------


def parse_softnet_stat(text, online=None, path="/proc/net/softnet_stat"):
    """Parse ``/proc/net/softnet_stat``.

    ``online`` is the list of online CPUs in ascending order, needed when the
    rows have no CPU-index column (width < 13). Returns ``width``, ``layout``,
    ``cpu_mapping`` ("index_column" or "online_order") and ``cpus``: a dict
    CPU id -> dict of the counters this width has.
    """
    rows = [line.split() for line in text.splitlines() if line.strip()]
    if not rows:
        raise SoftnetError("%s is empty" % path, value="", expected="one row per online CPU", path=path)
    widths = sorted(set(len(row) for row in rows))
    if len(widths) != 1:
        raise SoftnetError(
            "%s has rows of different widths %s" % (path, widths),
            value=widths,
            expected="every row with the same number of columns",
            path=path,
        )
    width = widths[0]
    if width < 9:
        raise SoftnetError(
            "%s has %d columns per row" % (path, width), value=width, expected="9 or more hex columns", path=path
        )
    parsed = []
    for number, row in enumerate(rows):
        try:
            parsed.append([int(value, 16) for value in row])
        except ValueError:
            raise SoftnetError(
                "%s row %d is not hex: %r" % (path, number + 1, " ".join(row)),
                value=" ".join(row),
                expected="hex u32 columns such as 0001608c",
                path=path,
            )
    if width >= 13:
        mapping = "index_column"
        cpu_ids = [values[12] for values in parsed]
    else:
        mapping = "online_order"
        if online is None:
            raise SoftnetError(
                "%s has no CPU-index column and the online CPU list is unknown" % path,
                value=width,
                expected="the online CPU list to map rows to CPUs",
                path=path,
            )
        online = sorted(online)
        if len(online) != len(parsed):
            raise SoftnetError(
                "%s has %d rows but %d CPUs are online (%s): rows cannot be mapped to CPUs"
                % (path, len(parsed), len(online), format_cpulist(online)),
                value=len(parsed),
                expected="one row per online CPU",
                path=path,
            )
        cpu_ids = list(online)
    if len(set(cpu_ids)) != len(cpu_ids):
        raise SoftnetError(
            "%s lists a CPU index twice: %s" % (path, cpu_ids), value=cpu_ids, expected="unique CPU ids", path=path
        )
    cpus = {}
    for cpu, values in zip(cpu_ids, parsed):
        cpus[cpu] = dict((name, values[col]) for col, name, minimum in _SOFTNET_FIELDS if width >= minimum)
    layout = SOFTNET_LAYOUTS.get(width, "%d columns (newer than 6.4: columns after 15 ignored)" % width)
    return {"width": width, "layout": layout, "cpu_mapping": mapping, "cpus": cpus}


def parse_proc_stat(text):
    """Per-CPU time counters (USER_HZ ticks) of ``/proc/stat``.

    Returns a dict CPU id -> dict of ``STAT_FIELDS``; fields an older kernel
    does not print are 0. The aggregate ``cpu`` line is ignored. Offline CPUs
    have no line.
    """
    cpus = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        label = fields[0][3:]
        if not label.isdigit():
            continue
        try:
            values = [int(value) for value in fields[1:]]
        except ValueError:
            raise SoftnetError(
                "/proc/stat line is not numeric: %r" % line, value=line, expected="cpuN followed by integers"
            )
        values = (values + [0] * len(STAT_FIELDS))[: len(STAT_FIELDS)]
        cpus[int(label)] = dict(zip(STAT_FIELDS, values))
    if not cpus:
        raise SoftnetError("/proc/stat has no per-CPU lines", value=text[:200], expected="lines such as 'cpu0 1 2 3 4'")
    return cpus


def parse_softirqs(text):
    """``/proc/softirqs``: ``cpus`` (column CPU ids from the header) and
    ``counts`` (softirq name -> dict CPU id -> count)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SoftnetError("/proc/softirqs is empty", value="", expected="a CPUn header and one line per softirq")
    header = lines[0].split()
    cpus = []
    for label in header:
        if not (label.startswith("CPU") and label[3:].isdigit()):
            raise SoftnetError(
                "/proc/softirqs header has %r" % label, value=lines[0], expected="column headers CPU0 CPU1 ..."
            )
        cpus.append(int(label[3:]))
    counts = {}
    for line in lines[1:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        values = rest.split()
        try:
            numbers = [int(value) for value in values]
        except ValueError:
            raise SoftnetError("/proc/softirqs line is not numeric: %r" % line, value=line, expected="NAME: counts")
        counts[name.strip()] = dict(zip(cpus, numbers))
    return {"cpus": cpus, "counts": counts}


def parse_net_dev(text):
    """``/proc/net/dev``: interface name -> dict of ``NET_DEV_FIELDS``.

    The name is everything before the last ``:`` (alias names such as
    ``ibr10:30`` keep their colon; the counters never contain one).
    """
    interfaces = {}
    for line in text.splitlines():
        if "|" in line or ":" not in line:
            continue
        name, _sep, rest = line.rpartition(":")
        values = rest.split()
        try:
            numbers = [int(value) for value in values]
        except ValueError:
            raise SoftnetError("/proc/net/dev line is not numeric: %r" % line, value=line, expected="IFACE: counters")
        if len(numbers) < 16:
            raise SoftnetError(
                "/proc/net/dev line has %d counters: %r" % (len(numbers), line),
                value=line,
                expected="16 counters (8 receive, 8 transmit)",
            )
        interfaces[name.strip()] = dict(zip(NET_DEV_FIELDS, numbers))
    return interfaces


def _read_text(path, required=True):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        if not required and exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return None
        raise SoftnetError(
            "cannot read %s: %s" % (path, exc.strerror or exc), value=path, expected="a readable proc file", path=path
        )


def read_sample(procfs="/proc", clock=time.monotonic):
    """One snapshot: the raw text of every signal, read back to back.

    Parsing happens later (``compute_signals``) so that the four reads sit as
    close together as possible. ``softirqs`` and ``net_dev`` are None when
    the file is missing.
    """
    started = clock()
    sample = {
        "softnet_stat": _read_text(os.path.join(procfs, "net", "softnet_stat")),
        "stat": _read_text(os.path.join(procfs, "stat")),
        "softirqs": _read_text(os.path.join(procfs, "softirqs"), required=False),
        "net_dev": _read_text(os.path.join(procfs, "net", "dev"), required=False),
    }
    finished = clock()
    sample["time"] = (started + finished) / 2.0
    sample["read_seconds"] = finished - started
    return sample


# --------------------------------------------------------------------------
# compute (pure)
# --------------------------------------------------------------------------


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


def mpstat_percentages(before, after):
    """mpstat's per-CPU percentages between two ``parse_proc_stat`` rows.

    Returns a dict with ``PCT_KEYS`` (rounded to 2 decimals, like mpstat) and
    ``ticks`` (the per-CPU interval in USER_HZ ticks).
    """
    prev = dict(before)
    cur = after
    # sysstat: "CPU coming back online: some fields (user, nice, system) restart
    # from their previous value, whereas others (idle, iowait) restart from zero".
    for key in ("idle", "iowait"):
        if cur[key] < prev[key]:
            prev[key] = 0
    user_cur, user_prev = cur["user"] - cur["guest"], prev["user"] - prev["guest"]
    nice_cur, nice_prev = cur["nice"] - cur["guest_nice"], prev["nice"] - prev["guest_nice"]
    ishift = 0
    if user_cur < user_prev:
        ishift += user_prev - user_cur
    if nice_cur < nice_prev:
        ishift += nice_prev - nice_cur
    ticks = sum(cur[key] for key in _INTERVAL_FIELDS) - sum(prev[key] for key in _INTERVAL_FIELDS) + ishift
    if ticks <= 0:
        # mpstat: a tickless CPU (no tick during the interval) is 100 % idle.
        result = dict((key, 0.0) for key in PCT_KEYS)
        result["idle"] = 100.0
        result["ticks"] = 0
        return result

    def pct(old, new):
        return 0.0 if new < old else round((new - old) * 100.0 / ticks, 2)

    return {
        "usr": pct(user_prev, user_cur),
        "nice": pct(nice_prev, nice_cur),
        "sys": pct(prev["system"], cur["system"]),
        "iowait": pct(prev["iowait"], cur["iowait"]),
        "irq": pct(prev["irq"], cur["irq"]),
        "soft": pct(prev["softirq"], cur["softirq"]),
        "steal": pct(prev["steal"], cur["steal"]),
        "guest": pct(prev["guest"], cur["guest"]),
        "gnice": pct(prev["guest_nice"], cur["guest_nice"]),
        "idle": pct(prev["idle"], cur["idle"]),
        "ticks": ticks,
    }


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


def irq_cpus_from_nic(nic):
    """CPUs where the NIC's queue IRQs currently land.

    Effective affinity per IRQ, falling back to the affinity list where the
    kernel has no ``effective_affinity_list``. Returns ``(cpus, source,
    notes)``; source is "effective_affinity", "affinity", "mixed" or "none".
    """
    cpus = set()
    sources = set()
    notes = []
    queue_irqs = [irq for irq in (nic or {}).get("irqs") or [] if irq.get("kind") == "queue"]
    for irq in queue_irqs:
        effective = irq.get("effective_affinity")
        if effective:
            cpus.update(effective)
            sources.add("effective_affinity")
        else:
            cpus.update(irq.get("affinity") or [])
            sources.add("affinity")
    if not queue_irqs:
        return [], "none", notes
    if "affinity" in sources:
        notes.append(
            "effective_affinity_list is missing for some queue IRQs of %s: their smp_affinity_list was used, "
            "which can be wider than where they land" % nic.get("interface")
        )
    source = sources.pop() if len(sources) == 1 else "mixed"
    return sorted(cpus), source, notes


# --------------------------------------------------------------------------
# judge (pure)
# --------------------------------------------------------------------------


def _fmt(number):
    if number is None:
        return "unknown"
    return ("%.2f" % number).rstrip("0").rstrip(".")


def validate_thresholds(thresholds):
    """Merge ``thresholds`` over the defaults; every value must be >= 0."""
    merged = dict(DEFAULT_THRESHOLDS)
    for key, value in (thresholds or {}).items():
        if key not in DEFAULT_THRESHOLDS:
            raise SoftnetError("unknown threshold %r" % key, value=key, expected=sorted(DEFAULT_THRESHOLDS))
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SoftnetError(
                "threshold %s=%r is not a number >= 0" % (key, value), value=value, expected="a number >= 0"
            )
        merged[key] = float(value)
    if merged["squeeze_quiet"] > merged["squeeze_threshold"]:
        raise SoftnetError(
            "squeeze_quiet (%s) is above squeeze_threshold (%s)"
            % (_fmt(merged["squeeze_quiet"]), _fmt(merged["squeeze_threshold"])),
            value=merged["squeeze_quiet"],
            expected="squeeze_quiet <= squeeze_threshold",
        )
    return merged


def judge(signals, irq_cpus, thresholds=None, irq_cpus_why=None):
    """Verdict over the numbers of ``compute_signals``.

    Thresholds are per 10 s and scaled to the measured interval. Rules, in
    order:

    1. No IRQ CPUs known -> ``inconclusive`` (nothing to attribute squeezes to).
    2. All CPUs together squeeze less than ``squeeze_quiet`` per 10 s ->
       ``no_contention``.
    3. IRQ CPUs squeeze less than ``squeeze_threshold`` per 10 s ->
       ``inconclusive`` (some squeezes, below the threshold or elsewhere).
    4. No IRQ CPU has softirq >= ``softirq_pct`` and usr >= ``user_pct`` ->
       ``inconclusive`` (squeezes without user work: rate, not contention).
    5. Link speed or throughput unknown -> ``inconclusive``.
    6. Link utilisation >= ``max_link_util_pct`` -> ``inconclusive`` (the link
       is busy; squeezes are explained by rate).
    7. Otherwise ``contention``.

    Squeezes on CPUs that carry no NIC IRQ are always flagged.
    """
    limits = validate_thresholds(thresholds)
    elapsed = signals["elapsed"]
    scale = elapsed / 10.0
    irq_set = set(irq_cpus or [])
    cpus = signals["cpus"]
    link = signals.get("link")

    def per10(count):
        return count * 10.0 / elapsed

    squeezes = dict((row["cpu"], row["time_squeeze"] or 0) for row in cpus)
    total = sum(squeezes.values())
    on_irq = sum(count for cpu, count in squeezes.items() if cpu in irq_set)
    elsewhere = dict((cpu, count) for cpu, count in squeezes.items() if cpu not in irq_set and count > 0)
    busy = [
        row["cpu"]
        for row in cpus
        if row["cpu"] in irq_set
        and row["soft"] is not None
        and row["soft"] >= limits["softirq_pct"]
        and row["usr"] >= limits["user_pct"]
    ]
    hot = [
        row["cpu"]
        for row in cpus
        if (row["time_squeeze"] or 0) > 0
        and per10(row["time_squeeze"]) >= limits["squeeze_quiet"]
        or (
            row["soft"] is not None
            and row["soft"] >= limits["softirq_pct"]
            and row["usr"] >= limits["user_pct"]
        )
    ]
    irq_rows = [row for row in cpus if row["cpu"] in irq_set and row["usr"] is not None]
    window = "%s s" % _fmt(elapsed)
    reasons = []
    signal_flags = {"squeezes_on_irq_cpus": None, "irq_cpus_busy": None, "link_not_saturated": None}

    def squeeze_text(count):
        return "%s in %s (%s per 10 s)" % (_fmt(count), window, _fmt(per10(count)))

    if elsewhere:
        listed = ", ".join("CPU %d +%d" % (cpu, count) for cpu, count in sorted(elsewhere.items()))
        flagged = (
            "squeezes on CPUs that carry no NIC queue IRQ: %s (RPS/RFS, another NIC, or IRQs moved during the sample)"
            % listed
        )
    else:
        flagged = None

    if not irq_set:
        verdict = "inconclusive"
        reasons.append(
            "no NIC queue IRQ CPUs known%s: squeezes cannot be attributed; pass irq_cpus to say where the NIC's "
            "interrupts are handled" % (" (%s)" % irq_cpus_why if irq_cpus_why else "")
        )
        reasons.append("time_squeeze on all CPUs: %s" % squeeze_text(total))
    elif per10(total) < limits["squeeze_quiet"]:
        verdict = "no_contention"
        signal_flags["squeezes_on_irq_cpus"] = False
        reasons.append(
            "time_squeeze near zero: %s on all CPUs, below %s per 10 s; repinning will not make anything faster"
            % (squeeze_text(total), _fmt(limits["squeeze_quiet"]))
        )
    elif per10(on_irq) < limits["squeeze_threshold"]:
        verdict = "inconclusive"
        signal_flags["squeezes_on_irq_cpus"] = False
        reasons.append(
            "time_squeeze on IRQ CPUs %s: %s, below the contention threshold of %s per 10 s; all CPUs: %s"
            % (format_cpulist(sorted(irq_set)), squeeze_text(on_irq), _fmt(limits["squeeze_threshold"]),
               squeeze_text(total))
        )
    else:
        signal_flags["squeezes_on_irq_cpus"] = True
        reasons.append(
            "time_squeeze on IRQ CPUs %s: %s, at or above %s per 10 s"
            % (format_cpulist(sorted(irq_set)), squeeze_text(on_irq), _fmt(limits["squeeze_threshold"]))
        )
        if not busy:
            verdict = "inconclusive"
            signal_flags["irq_cpus_busy"] = False
            max_usr = max([row["usr"] for row in irq_rows] or [0.0])
            max_soft = max([row["soft"] for row in irq_rows] or [0.0])
            reasons.append(
                "no IRQ CPU is both in softirq >= %s %% and in user work >= %s %% (highest usr %s %%, highest soft "
                "%s %%): squeezes without competing user work point at packet rate, not contention"
                % (_fmt(limits["softirq_pct"]), _fmt(limits["user_pct"]), _fmt(max_usr), _fmt(max_soft))
            )
        else:
            signal_flags["irq_cpus_busy"] = True
            busy_rows = [row for row in cpus if row["cpu"] in busy]
            reasons.append(
                "IRQ CPUs %s also run user work: usr %s-%s %%, soft %s-%s %% (thresholds usr >= %s %%, soft >= %s %%)"
                % (
                    format_cpulist(busy),
                    _fmt(min(row["usr"] for row in busy_rows)),
                    _fmt(max(row["usr"] for row in busy_rows)),
                    _fmt(min(row["soft"] for row in busy_rows)),
                    _fmt(max(row["soft"] for row in busy_rows)),
                    _fmt(limits["user_pct"]),
                    _fmt(limits["softirq_pct"]),
                )
            )
            util = link.get("utilisation_pct") if link else None
            if util is None:
                verdict = "inconclusive"
                if not link:
                    why = "no interface known"
                elif link.get("speed_mbps") is None:
                    why = "link speed of %s is unknown (set link_speed_mbps)" % link["interface"]
                else:
                    why = "throughput of %s is unknown" % link["interface"]
                reasons.append("cannot rule out a saturated link: %s" % why)
            elif util >= limits["max_link_util_pct"]:
                verdict = "inconclusive"
                signal_flags["link_not_saturated"] = False
                reasons.append(
                    "link %s is busy: %s %% of %s Mbit/s (rx %s, tx %s Mbit/s), at or above %s %%: squeezes are "
                    "explained by rate"
                    % (link["interface"], _fmt(util), _fmt(link["speed_mbps"]), _fmt(link["rx_mbps"]),
                       _fmt(link["tx_mbps"]), _fmt(limits["max_link_util_pct"]))
                )
            else:
                verdict = "contention"
                signal_flags["link_not_saturated"] = True
                reasons.append(
                    "link %s far from saturated: %s %% of %s Mbit/s (rx %s, tx %s Mbit/s), below %s %%"
                    % (link["interface"], _fmt(util), _fmt(link["speed_mbps"]), _fmt(link["rx_mbps"]),
                       _fmt(link["tx_mbps"]), _fmt(limits["max_link_util_pct"]))
                )
    if flagged:
        reasons.append(flagged)
    dropped = sum(row["dropped"] or 0 for row in cpus)
    if dropped:
        reasons.append("softnet backlog drops: %s in %s (netdev_max_backlog exceeded)" % (_fmt(dropped), window))
    if verdict == "no_contention" and link and link.get("rx_packets") is not None:
        packets = (link.get("rx_packets") or 0) + (link.get("tx_packets") or 0)
        if packets * 1.0 / elapsed < 100:
            reasons.append(
                "little traffic on %s during the sample (%s packets/s): repeat under training load to rule the "
                "problem out" % (link["interface"], _fmt(round(packets * 1.0 / elapsed, 1)))
            )
    scaled = dict(limits)
    scaled["interval_scale"] = round(scale, 4)
    scaled["squeeze_threshold_in_window"] = round(limits["squeeze_threshold"] * scale, 2)
    scaled["squeeze_quiet_in_window"] = round(limits["squeeze_quiet"] * scale, 2)
    return {
        "verdict": verdict,
        "reasons": reasons,
        "signals": signal_flags,
        "hot_cpus": sorted(hot),
        "busy_irq_cpus": sorted(busy),
        "non_irq_squeeze_cpus": sorted(elsewhere),
        "totals": {
            "time_squeeze": total,
            "time_squeeze_irq_cpus": on_irq,
            "time_squeeze_other_cpus": sum(elsewhere.values()),
            "dropped": dropped,
            "time_squeeze_per_10s": round(per10(total), 1),
            "time_squeeze_irq_cpus_per_10s": round(per10(on_irq), 1),
        },
        "thresholds": scaled,
    }


# --------------------------------------------------------------------------
# orchestration for the module
# --------------------------------------------------------------------------


def parse_irq_cpus_option(value):
    """``irq_cpus`` option: a CPU list string, an int or a list of ints."""
    try:
        cpus = parse_cpulist(value)
    except CpuListError as exc:
        raise SoftnetError("irq_cpus: %s" % exc, value=value, expected=exc.expected)
    if not cpus:
        raise SoftnetError("irq_cpus is empty", value=value, expected="at least one CPU, such as '0-10'")
    return cpus


SELECTOR_KEYS = ("interface", "pci_address", "mac", "cidr")
MAX_INTERVAL = 3600.0


def validate_options(options):
    """Check every option before anything is read; raise SoftnetError.

    Returns ``(interval, irq_cpus or None, thresholds, link_speed_mbps)``.
    """
    interval = options.get("interval", 10.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= MAX_INTERVAL:
        raise SoftnetError(
            "interval %r is not a number of seconds in (0, %d]" % (interval, MAX_INTERVAL),
            value=interval,
            expected="seconds between the two samples, such as 10 or 0.5",
        )
    irq_cpus = options.get("irq_cpus")
    irq_cpus = parse_irq_cpus_option(irq_cpus) if irq_cpus not in (None, "", []) else None
    thresholds = validate_thresholds(dict((key, options.get(key)) for key in DEFAULT_THRESHOLDS))
    speed = options.get("link_speed_mbps")
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, int) or speed <= 0):
        raise SoftnetError(
            "link_speed_mbps %r is not a positive number of Mbit/s" % (speed,), value=speed, expected="such as 25000"
        )
    return float(interval), irq_cpus, thresholds, speed


def run_check(options, procfs="/proc", sysfs="/sys", run=None, sleep=time.sleep, clock=time.monotonic):
    """Read the NIC, sample every signal twice ``interval`` seconds apart, judge.

    ``options`` holds the module options (selector keys, ``irq_cpus``,
    ``interval``, the thresholds, ``link_speed_mbps``). Reads only. Raises
    SoftnetError for bad options or unreadable proc files, and NicError when
    an explicit selector matches no usable NIC. Without a selector, a missing
    default-route NIC degrades to an ``inconclusive`` verdict instead.
    """
    interval, irq_option, thresholds, speed_option = validate_options(options)
    selector = dict((key, options.get(key)) for key in SELECTOR_KEYS if options.get(key) not in (None, ""))
    notes = []
    nic = None
    why = None
    try:
        nic = read_nic(selector, procfs=procfs, sysfs=sysfs, run=run)
    except NicError as exc:
        if selector:
            raise
        why = "NIC discovery failed: %s" % exc
        notes.append(why)
    if nic is not None:
        notes.extend(nic.get("notes") or [])

    topology = read_topology(sysfs=sysfs, procfs=procfs)
    online = topology["online"]
    if irq_option is not None:
        irq_cpus, source = irq_option, "option"
        offline = sorted(set(irq_cpus) - set(online))
        if offline:
            notes.append("irq_cpus %s are not online" % format_cpulist(offline))
    else:
        irq_cpus, source, irq_notes = irq_cpus_from_nic(nic)
        notes.extend(irq_notes)
        if not irq_cpus and nic is not None:
            queue_count = len([irq for irq in nic.get("irqs") or [] if irq.get("kind") == "queue"])
            why = "%s (%s) shows %d queue IRQs%s" % (
                nic["interface"],
                nic.get("driver") or "no driver",
                queue_count,
                "" if nic.get("pci_address") else ", it has no PCI function",
            )
    interface = nic["interface"] if nic else None
    speed = speed_option if speed_option is not None else (nic or {}).get("speed_mbps")

    first = read_sample(procfs, clock=clock)
    sleep(interval)
    second = read_sample(procfs, clock=clock)

    online_after = read_topology(sysfs=sysfs, procfs=procfs)["online"]
    if online_after != online:
        notes.append(
            "online CPUs changed during the sample: %s -> %s" % (format_cpulist(online), format_cpulist(online_after))
        )
    signals = compute_signals(first, second, online, interface=interface, speed_mbps=speed)
    notes.extend(signals["notes"])
    verdict = judge(signals, irq_cpus, thresholds, irq_cpus_why=why)
    irq_set = set(irq_cpus)
    hot = set(verdict["hot_cpus"])
    for row in signals["cpus"]:
        row["irq_cpu"] = row["cpu"] in irq_set
        row["hot"] = row["cpu"] in hot
    if signals["link"] is not None:
        signals["link"]["speed_source"] = (
            "option" if speed_option is not None else ("sysfs" if speed is not None else "unknown")
        )
    return {
        "changed": False,
        "verdict": verdict["verdict"],
        "reasons": verdict["reasons"],
        "signals": verdict["signals"],
        "interface": interface,
        "pci_address": (nic or {}).get("pci_address"),
        "driver": (nic or {}).get("driver"),
        "irq_cpus": list(irq_cpus),
        "irq_cpulist": format_cpulist(irq_cpus),
        "irq_cpus_source": source,
        "hot_cpus": verdict["hot_cpus"],
        "busy_irq_cpus": verdict["busy_irq_cpus"],
        "non_irq_squeeze_cpus": verdict["non_irq_squeeze_cpus"],
        "online_cpus": list(online),
        "interval_requested": interval,
        "interval": signals["elapsed"],
        "softnet": signals["softnet"],
        "cpus": signals["cpus"],
        "link": signals["link"],
        "totals": verdict["totals"],
        "thresholds": verdict["thresholds"],
        "notes": notes,
    }
