# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parsers of the proc files the softnet check and the CPU frequency check sample: pure, no I/O.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``parse_softnet_stat``, ``parse_proc_stat``, ``parse_softirqs`` and
``parse_net_dev`` turn one file's text into numbers; ``mpstat_percentages`` is
mpstat's per-CPU arithmetic between two ``parse_proc_stat`` rows (used by
softnet_check and by cpu_power_facts' busy-CPU frequency sample).
``SoftnetError`` is the error of these parsers and of every part of
softnet_check (``_softnet.sample`` reads, ``_softnet.signals`` computes,
``_softnet.verdict`` judges, ``_softnet.check`` ties them together).

``/proc/softirqs`` has the ``CPUn`` header and ``NAME: counts`` rows of
``/proc/interrupts``, so it is parsed by ``_parse.interrupts.parse_interrupts``.

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
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.interrupts import InterruptsError, parse_interrupts

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

NET_DEV_FIELDS = (
    "rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame", "rx_compressed", "rx_multicast",
    "tx_bytes", "tx_packets", "tx_errs", "tx_drop", "tx_fifo", "tx_colls", "tx_carrier", "tx_compressed",
)


class SoftnetError(DetailedError):
    """A proc file or an option that cannot be used.

    ``details`` holds the offending ``value`` and what was ``expected``, plus
    the ``path`` when a file is concerned.
    """

    def __init__(self, message, value=None, expected=None, path=None):
        details = {"value": value, "expected": expected}
        if path is not None:
            details["path"] = path
        super(SoftnetError, self).__init__(message, **details)

    @property
    def path(self):
        return self.details.get("path")


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
    ``counts`` (softirq name -> dict CPU id -> count).

    The table is parsed by ``_parse.interrupts.parse_interrupts``; a softirq row
    carries nothing after its counts, so any text there is an error.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SoftnetError("/proc/softirqs is empty", value="", expected="a CPUn header and one line per softirq")
    label = lines[0].split()[0]
    if not (label.startswith("CPU") and label[3:].isdigit()):
        raise SoftnetError("/proc/softirqs header has %r" % label, value=lines[0], expected="column headers CPU0 CPU1 ...")
    try:
        table = parse_interrupts(text)
    except InterruptsError as exc:
        raise SoftnetError(
            "/proc/softirqs header has %r" % exc.details["value"], value=lines[0], expected="column headers CPU0 CPU1 ..."
        )
    counts = {}
    for name, row in table["irqs"].items():
        if row["name"]:
            raise SoftnetError(
                "/proc/softirqs line %s is not numeric: %r" % (name, row["name"]),
                value=row["name"],
                expected="NAME: counts",
            )
        counts[name] = dict(zip(table["cpus"], row["counts"]))
    return {"cpus": table["cpus"], "counts": counts}


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


_INTERVAL_FIELDS = ("user", "nice", "system", "iowait", "idle", "steal", "irq", "softirq")
PCT_KEYS = ("usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle")


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
