# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parse ``/proc/interrupts`` in every layout the kernel has printed.

Private module_utils of gpunode.tuning, standard library only.

Layouts handled (see ``kernel/irq/proc.c:show_interrupts`` and the arch
``arch_show_interrupts``):

* a header of ``CPUn`` column names (only online CPUs appear, so the ids can
  have gaps) or no header at all (then columns are numbered 0..n-1);
* numeric rows ``N: counts chip [hwirq][-flow|Level|Edge]  action[, action]``,
  where the action names may be blank or contain spaces;
* old chips with the flow in the chip name (``IO-APIC-edge  timer``), per
  device MSI domains (``IR-PCI-MSIX-0000:00:08.0  30-edge``), out-of-band
  flows (``0 oob-edge``);
* arch rows (``NMI:``, ``LOC:``, ``IPI0:``, s390x ``EXT:``/``I/O:`` and
  ``[EXT] ...`` descriptions) whose text after the counts is a description;
* rows with a single number (``ERR:``, ``MIS:``);
* any number of CPU columns (1000+ is routine on large NUMA machines).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

_FLOWS = frozenset(
    ["edge", "level", "fasteoi", "simple", "percpu", "percpu_devid", "eoi", "untracked", "bad", "nested", "ioapic", "msi", "Edge", "Level"]
)


class InterruptsError(DetailedError):
    """A /proc/interrupts text that cannot be read; ``details`` hold the ``value`` and what was ``expected``."""

    def __init__(self, message, value=None, expected=None):
        super(InterruptsError, self).__init__(message, value=value, expected=expected)


def _is_flow(token):
    """True for the hwirq / flow tokens between the chip and the action names."""
    if token.isdigit() or token in ("Level", "Edge", "oob"):
        return True
    if "-" in token:
        head, _sep, tail = token.rpartition("-")
        if head.endswith("oob"):
            head = head[:-3]
        if tail in _FLOWS and (head == "" or head.isdigit()):
            return True
    return False


# " 524288-edge  " / " -fasteoi " / " oob-edge ": the flow handler token that ends the chip/hwirq part
_FLOW_TOKEN = re.compile(r"\s(\d*(?:oob)?-(?:edge|level|fasteoi|simple|percpu|percpu_devid|eoi|untracked|nested))(?:\s+|$)")


def _split_tail(key, tail):
    """Return (chip, name) for the text after the counts of one row."""
    tail = tail.strip()
    if not key.isdigit():
        return "", tail
    if not tail:
        return "", ""
    match = _FLOW_TOKEN.search(" " + tail)
    if match:
        # chip names may contain spaces ("Hyper-V PCIe MSI"); a trailing hwirq column is dropped
        words = tail[:match.start()].split()
        while len(words) > 1 and (words[-1].isdigit() or words[-1] in ("Level", "Edge")):
            words.pop()
        return " ".join(words), tail[match.end() - 1:].strip()
    parts = tail.split(None, 1)
    chip = parts[0]
    rest = parts[1] if len(parts) > 1 else ""
    # at most three flow/hwirq tokens (hwirq, Level/Edge, -flow) sit before the names
    for _dummy in range(3):
        if not rest:
            break
        pieces = rest.split(None, 1)
        if _is_flow(pieces[0]):
            rest = pieces[1] if len(pieces) > 1 else ""
        else:
            break
    return chip, rest.strip()


def parse_interrupts(text, keys=None):
    """Parse the text of ``/proc/interrupts``.

    Returns ``{"cpus": [...], "irqs": {key: {"counts", "total", "chip", "name"}}}``.
    ``cpus`` lists the CPU id of each count column. ``keys``, when given, is a
    collection of row keys (``"45"``, ``"NMI"``) to parse; other rows are
    skipped cheaply, which matters with thousands of CPU columns.
    """
    if not isinstance(text, str):
        raise InterruptsError("/proc/interrupts content must be text, got %r" % type(text).__name__, value=text, expected="str")
    wanted = None if keys is None else set(str(k) for k in keys)
    lines = text.splitlines()
    cpus = None
    start = 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("CPU"):
            cpus = []
            for token in stripped.split():
                if not (token.startswith("CPU") and token[3:].isdigit()):
                    raise InterruptsError("bad column %r in /proc/interrupts header" % token, value=token, expected="CPUn column names")
                if cpus and int(token[3:]) <= cpus[-1]:
                    # the kernel prints online CPUs in ascending order, each once
                    raise InterruptsError("column %r after CPU%d in /proc/interrupts header" % (token, cpus[-1]), value=token,
                                          expected="CPUn column names in ascending order, each once")
                cpus.append(int(token[3:]))
            start = index + 1
        break
    ncpu = len(cpus) if cpus is not None else None
    irqs = {}
    widest = 0
    for line in lines[start:]:
        head, sep, rest = line.partition(":")
        if not sep:
            continue
        key = head.strip()
        if not key or " " in key:
            continue
        if wanted is not None and key not in wanted:
            continue
        if ncpu is not None:
            parts = rest.split(None, ncpu)
            count_n = 0
            limit = min(ncpu, len(parts))
            while count_n < limit and parts[count_n].isdigit():
                count_n += 1
            counts = [int(p) for p in parts[:count_n]]
            if count_n == ncpu and len(parts) > ncpu:
                tail = parts[ncpu]
            else:
                tail = " ".join(parts[count_n:])
        else:
            parts = rest.split()
            count_n = 0
            while count_n < len(parts) and parts[count_n].isdigit():
                count_n += 1
            counts = [int(p) for p in parts[:count_n]]
            tail = " ".join(parts[count_n:])
        chip, name = _split_tail(key, tail)
        irqs[key] = {"counts": counts, "total": sum(counts), "chip": chip, "name": name}
        if key.isdigit() and len(counts) > widest:
            widest = len(counts)
    if cpus is None:
        if not widest:
            widest = max([len(v["counts"]) for v in irqs.values()] or [0])
        cpus = list(range(widest))
    return {"cpus": cpus, "irqs": irqs}


def per_cpu_counts(row, cpus):
    """Dict CPU -> count for the non-zero counts of one parsed row."""
    return dict((cpus[i], c) for i, c in enumerate(row["counts"]) if c and i < len(cpus))
