# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check, part 1 of 4: read and parse the proc files it samples.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``read_sample`` takes one snapshot (the raw text of every file, read
back to back); ``parse_softnet_stat``, ``parse_proc_stat``, ``parse_softirqs``
and ``parse_net_dev`` turn one file's text into numbers. ``SoftnetError`` is
the error of every part of softnet_check (``_softnet_signals`` computes,
``_softnet_verdict`` judges, ``_softnet`` ties them together).

``/proc/softirqs`` has the ``CPUn`` header and ``NAME: counts`` rows of
``/proc/interrupts``, so it is parsed by ``_interrupts.parse_interrupts``.

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

import os
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._fileio import read_raw
from ansible_collections.gpunode.tuning.plugins.module_utils._interrupts import InterruptsError, parse_interrupts

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

    The table is parsed by ``_interrupts.parse_interrupts``; a softirq row
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


def _read_text(path, required=True):
    """The file's text (``_fileio.read_raw``); None for an optional file that cannot be read."""
    text = read_raw(path)
    if text is None and required:
        why = "no such file" if not os.path.lexists(path) else "not readable"
        raise SoftnetError("cannot read %s: %s" % (path, why), value=path, expected="a readable proc file", path=path)
    return text


def read_sample(procfs="/proc", clock=time.monotonic):
    """One snapshot: the raw text of every signal, read back to back.

    Parsing happens later (``compute_signals``, ``_softnet.irq_cpus_fired``) so
    that the five reads sit as close together as possible. ``softirqs``,
    ``net_dev`` and ``interrupts`` are None when the file is missing.
    """
    started = clock()
    sample = {
        "softnet_stat": _read_text(os.path.join(procfs, "net", "softnet_stat")),
        "stat": _read_text(os.path.join(procfs, "stat")),
        "softirqs": _read_text(os.path.join(procfs, "softirqs"), required=False),
        "net_dev": _read_text(os.path.join(procfs, "net", "dev"), required=False),
        # Where the NIC's queue IRQs really fire during the window (``_softnet.irq_cpus_fired``).
        "interrupts": _read_text(os.path.join(procfs, "interrupts"), required=False),
    }
    finished = clock()
    sample["time"] = (started + finished) / 2.0
    sample["read_seconds"] = finished - started
    # Wall-clock instant of the sample (the report's sampling window; lines up
    # other tools' per-second output, mpstat's, with this window).
    sample["wall"] = time.time() - (clock() - sample["time"])
    return sample
