# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Linux CPU lists and CPU masks: parse, format, convert.

Private module_utils of gpunode.tuning. Standard library only, no Ansible
imports: the boot-time entry point of the nic_irq_pinning role imports this
file on the target without Ansible installed.

Formats follow the kernel (lib/bitmap-str.c):

* CPU list, as in ``/proc/irq/N/smp_affinity_list`` or ``isolcpus=``:
  ``0-3,8,10-11``. The kernel's group syntax ``0-15:2/4`` (use 2 CPUs of
  every group of 4 in the range) is accepted on input too.
* CPU mask, as in ``/proc/irq/N/smp_affinity``: hex, in comma separated
  32-bit words, most significant word first (``ff,ffffffff``).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

MAX_CPUS = 8192

# One region of a CPU list (lib/bitmap-str.c bitmap_parse_region): "all" (any case) or START[-END], a group suffix
# :USED/SIZE only after a range or all; N is the last CPU (bitmap_getnum).
_NUM = r"(?:\d+|N)"
_REGION_RE = re.compile(
    r"(?:(?P<all>[aA][lL][lL])(?::(?P<all_used>{n})/(?P<all_size>{n}))?"
    r"|(?P<start>{n})(?:-(?P<end>{n})(?::(?P<used>{n})/(?P<size>{n}))?)?)\Z".format(n=_NUM)
)
# Items are separated by commas and blanks; runs of them, and leading or trailing ones, are allowed (__end_of_region).
_SEPARATOR_RE = re.compile(r"[\s,]+")
_WORD_RE = re.compile(r"[0-9a-fA-F]{1,8}\Z")


class CpuListError(DetailedError):
    """A CPU list or mask that cannot be parsed.

    ``value`` is the offending input (or the offending item of it) and
    ``expected`` says what would have been accepted.
    """

    def __init__(self, message, value=None, expected=None):
        super(CpuListError, self).__init__(message, value=value, expected=expected)


def _check_limit(cpu, max_cpus, text):
    if cpu >= max_cpus:
        raise CpuListError(
            "CPU %d in %r is beyond the limit of %d CPUs" % (cpu, text, max_cpus),
            value=text,
            expected="CPU numbers from 0 to %d" % (max_cpus - 1),
        )


def _before_newline(text, what):
    """The text the kernel parses: it stops at the first newline (lib/bitmap-str.c ``end_of_str``). Anything but
    blanks after it is refused rather than silently dropped, so no hidden line reaches a file."""
    if "\0" in text:
        raise CpuListError("NUL byte in %s %r" % (what, text), value=text, expected="a %s on one line" % what)
    head, sep, tail = text.partition("\n")
    if sep and tail.strip():
        raise CpuListError(
            "%s %r goes on after a newline; the kernel would read only %r" % (what, text, head),
            value=text, expected="a %s on one line" % what,
        )
    return head


def _number(token, item, text, nbits, ncpus):
    if token != "N":
        return int(token)
    if ncpus is None:
        raise CpuListError(
            "%r in CPU list %r uses N (the last CPU) but the node's CPU count is not known here" % (item, text),
            value=item, expected="explicit CPU numbers, or the node's CPU count so that N can be resolved",
        )
    return nbits - 1


def parse_cpulist(text, max_cpus=MAX_CPUS, ncpus=None):
    """Return the sorted, de-duplicated CPUs of a Linux CPU list, as the kernel's ``bitmap_parselist`` reads it.

    Accepted as the kernel accepts them (lib/bitmap-str.c, Documentation/admin-guide/kernel-parameters.rst "CPU
    lists"): ``0-3,8``, groups ``0-15:2/4`` (including ``:0/N``, which selects no CPU), ``all`` (also with a group:
    ``all:1/2``), ``N`` for the last CPU (``1-N``, ``0-0:1/N``), empty items and commas or blanks between items
    (``"  ,, 0-3 ,, "``). ``N`` and ``all`` need ``ncpus``, the node's CPU count (``nr_cpu_ids``), which also bounds
    every CPU number as the kernel does; without it ``max_cpus`` does. ``""`` (and blanks only) is the empty list.
    Refused as the kernel refuses them: negative or non-numeric items, reversed ranges, a group size of 0, a group
    that uses more CPUs than its size, a CPU beyond the last one, a number alone with a group (``5:1/2``), a
    trailing ``-``; and text after a newline (the kernel would ignore it). Integers and lists of integers are
    accepted too, so callers can pass inventory values through unchanged.
    """
    if isinstance(text, bool):
        raise CpuListError("%r is not a CPU list" % (text,), value=text, expected="a CPU list such as '0-3,8'")
    if isinstance(text, int):
        text = str(text)
    if isinstance(text, (list, tuple, set, frozenset)):
        return _parse_cpu_iterable(text, ncpus if ncpus is not None else max_cpus)
    if not isinstance(text, str):
        raise CpuListError(
            "%r is not a CPU list" % (text,), value=text, expected="a CPU list string such as '0-3,8' or a list of integers"
        )
    if ncpus is not None and (isinstance(ncpus, bool) or not isinstance(ncpus, int) or ncpus < 1 or ncpus > MAX_CPUS):
        raise CpuListError("bad CPU count %r" % (ncpus,), value=ncpus, expected="an integer from 1 to %d" % MAX_CPUS)
    nbits = ncpus if ncpus is not None else max_cpus
    cpus = set()
    for item in _SEPARATOR_RE.split(_before_newline(text, "CPU list")):
        if not item:
            continue
        match = _REGION_RE.match(item)
        if not match:
            expected = "a CPU number or range such as 4, 0-3, 0-15:2/4, 1-N or all"
            if item.startswith("-"):
                message = "negative CPU number %r in CPU list %r" % (item, text)
            else:
                message = "cannot parse %r in CPU list %r" % (item, text)
            raise CpuListError(message, value=item, expected=expected)
        if match.group("all"):
            if ncpus is None:
                raise CpuListError(
                    "%r in CPU list %r means every CPU but the node's CPU count is not known here" % (item, text),
                    value=item, expected="explicit CPU numbers, or the node's CPU count so that all can be resolved",
                )
            first, last = 0, nbits - 1
        else:
            first = _number(match.group("start"), item, text, nbits, ncpus)
            last = _number(match.group("end"), item, text, nbits, ncpus) if match.group("end") is not None else first
        if last < first:
            raise CpuListError(
                "reversed range %r in CPU list %r" % (item, text),
                value=item,
                expected="a range whose start is not above its end, such as %d-%d" % (last, first),
            )
        used_text, size_text = match.group("used") or match.group("all_used"), match.group("size") or match.group("all_size")
        if used_text is not None:
            used = _number(used_text, item, text, nbits, ncpus)
            group = _number(size_text, item, text, nbits, ncpus)
            if group == 0 or used > group:
                raise CpuListError(
                    "bad group %r in CPU list %r" % (item, text), value=item,
                    expected="a group suffix :used/size with size > 0 and used <= size",
                )
        else:
            used = group = last - first + 1
        _check_limit(last, nbits, text)
        for base in range(first, last + 1, group):
            cpus.update(range(base, min(base + used, last + 1)))
    return sorted(cpus)


def _parse_cpu_iterable(values, max_cpus):
    cpus = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            else:
                raise CpuListError("%r is not a CPU number" % (value,), value=value, expected="a non-negative integer")
        if value < 0:
            raise CpuListError("negative CPU number %d" % value, value=value, expected="a non-negative integer")
        _check_limit(value, max_cpus, str(value))
        cpus.add(value)
    return sorted(cpus)


def format_cpulist(cpus):
    """Format CPUs as the kernel does: ascending, ranges for runs of 2 or more."""
    ordered = sorted(set(_parse_cpu_iterable(cpus, MAX_CPUS)))
    parts = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(_span(start, prev))
            start = prev = cpu
    if start is not None:
        parts.append(_span(start, prev))
    return ",".join(parts)


def _span(start, end):
    return str(start) if start == end else "%d-%d" % (start, end)


def parse_cpumask(text, ncpus=None):
    """Return the CPUs set in a hex CPU mask such as ``ff,ffffffff``, as the kernel's ``bitmap_parse`` reads it.

    Words of 1 to 8 hex digits, most significant first; commas and blanks around words may repeat and lead or
    trail (``" , badf00d, ,, deadbeef,1,0 , "``); ``""`` (and blanks only) is the empty mask. ``ncpus`` is the number
    of CPU ids the machine has (``nr_cpu_ids``): a bit set at or above it, or more words than it needs, is an error.
    """
    if not isinstance(text, str):
        raise CpuListError("%r is not a CPU mask" % (text,), value=text, expected="hex words separated by commas, such as ff,ffffffff")
    words = [word for word in _SEPARATOR_RE.split(_before_newline(text, "CPU mask")) if word]
    limit = MAX_CPUS if ncpus is None else ncpus
    if len(words) * 32 > MAX_CPUS + 31:
        raise CpuListError(
            "CPU mask %r has %d words, more than %d CPUs" % (text, len(words), MAX_CPUS), value=text, expected="at most %d CPUs" % MAX_CPUS
        )
    value = 0
    for word in words:
        if not _WORD_RE.match(word):
            raise CpuListError(
                "bad word %r in CPU mask %r" % (word, text), value=word, expected="1 to 8 hex digits per comma separated 32-bit word"
            )
        value = (value << 32) | int(word, 16)
    cpus = []
    bit = 0
    while value:
        if value & 1:
            cpus.append(bit)
        value >>= 1
        bit += 1
    if cpus and cpus[-1] >= limit:
        raise CpuListError(
            "CPU mask %r sets CPU %d, wider than the %d CPUs of this machine" % (text, cpus[-1], limit),
            value=text,
            expected="bits only for CPUs 0 to %d" % (limit - 1),
        )
    if len(words) > (limit + 31) // 32:
        raise CpuListError(
            "CPU mask %r has %d words, more than the %d CPUs of this machine need" % (text, len(words), limit),
            value=text, expected="at most %d comma separated 32-bit words" % ((limit + 31) // 32),
        )
    return cpus


def format_cpumask(cpus, ncpus):
    """Format CPUs as the kernel prints a cpumask of ``ncpus`` bits.

    Every 32-bit word has 8 hex digits except the most significant, which
    has as many as its bits need, exactly like ``/proc/irq/N/smp_affinity``.
    """
    if isinstance(ncpus, bool) or not isinstance(ncpus, int) or ncpus < 1 or ncpus > MAX_CPUS:
        raise CpuListError("bad CPU count %r" % (ncpus,), value=ncpus, expected="an integer from 1 to %d" % MAX_CPUS)
    ordered = _parse_cpu_iterable(cpus, MAX_CPUS)
    if ordered and ordered[-1] >= ncpus:
        raise CpuListError(
            "CPU %d does not fit a mask of %d CPUs" % (ordered[-1], ncpus), value=ordered[-1], expected="CPUs 0 to %d" % (ncpus - 1)
        )
    value = 0
    for cpu in ordered:
        value |= 1 << cpu
    nwords = (ncpus + 31) // 32
    top_bits = ncpus - (nwords - 1) * 32
    words = []
    for index in range(nwords - 1, -1, -1):
        word = (value >> (32 * index)) & 0xFFFFFFFF
        width = (top_bits + 3) // 4 if index == nwords - 1 else 8
        words.append("%0*x" % (width, word))
    return ",".join(words)


def cpulist_difference(left, right):
    """CPUs of ``left`` that are not in ``right``, as a sorted list."""
    return sorted(set(parse_cpulist(left)) - set(parse_cpulist(right)))


def cpulist_union(left, right):
    return sorted(set(parse_cpulist(left)) | set(parse_cpulist(right)))


def cpulist_intersection(left, right):
    return sorted(set(parse_cpulist(left)) & set(parse_cpulist(right)))
