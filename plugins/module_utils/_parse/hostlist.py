# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm hostlist expressions (``gpu[001-128],login1``): expand, compress, split, contains.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. The syntax is Slurm's (src/common/hostlist.c) as the PyPI package
python-hostlist implements it (``expand_hostlist``, ``collect_hostlist``),
which the unit tests compare against:

- a top-level comma separates items; inside brackets commas separate ranges:
  ``node[01,05-09]``;
- a range is ``N`` or ``LO-HI`` in decimal digits, zero padded to the width of
  ``LO`` (``[001-010]`` is 001..010, ``[098-100]`` is 098, 099, 100);
- an item may hold several bracket groups, expanded as a cartesian product,
  the first group outermost: ``a[1-2]b[3-4]`` is a1b3, a1b4, a2b3, a2b4;
- whitespace is no separator: it is kept as part of a name (``"a, b"`` is
  ``a`` and `` b``), as python-hostlist does (Slurm's own parser splits on
  it; a slurm.conf value has none); inside brackets it is an error;
- ``expand`` drops duplicate names, keeping the first, as ``expand_hostlist``
  does unless ``allow_duplicates``;
- ``compress`` returns the very string ``collect_hostlist`` returns: names
  stripped, blank ones skipped, duplicates dropped, grouped from the
  rightmost number of each name, sorted by the text around that number.

Where this module differs from python-hostlist:

- an empty or blank item (``a,,b``, ``a,``, ``a, ,b``) is an error, where
  python-hostlist skips an empty one and keeps a blank one as a name (the
  empty expression ``""`` is the empty list in both);
- a range with a trailing newline (``[1\\n]``), which python-hostlist's ``$``
  lets through, is an error;
- the cap is on the whole expression, ``MAX_NAMES`` (1,000,000) names
  counted before duplicates are dropped and before anything is built, where
  python-hostlist allows 100,000 per range and per item;
- bad input raises ``HostlistError`` (a ``DetailedError``, ``details`` with
  the offending ``value`` and what was ``expected``), never another
  exception type; a name with a newline inside is compressed, where
  python-hostlist's regular expression fails on it.
"""

from __future__ import annotations

import itertools
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

MAX_NAMES = 1000000

_DIGITS = "0123456789"
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?\Z")
_SYNTAX = "NAME or NAME[LO-HI,N,...] items separated by commas, e.g. gpu[001-128],login1"


class HostlistError(DetailedError):
    """A bad hostlist expression or host name; ``details`` name the ``value`` and what was ``expected``."""


def _error(message, value, expected, **details):
    return HostlistError("%s: expected %s" % (message, expected), value=value, expected=expected, **details)


def _check_expr(expr):
    if not isinstance(expr, str):
        raise _error("hostlist %r is of type %s, not a string" % (expr, type(expr).__name__), expr, "a string: " + _SYNTAX)


def _split_items(expr):
    """The top-level items of ``expr`` as written, with bracket balance checked."""
    items = []
    depth = 0
    start = 0
    for pos, char in enumerate(expr):
        if char == "[":
            if depth:
                raise _error("hostlist %r has nested brackets at position %d" % (expr, pos + 1), expr,
                             "one level of brackets, NAME[LO-HI,...][LO-HI,...]", position=pos + 1)
            depth = 1
        elif char == "]":
            if not depth:
                raise _error("hostlist %r has a ']' without a '[' before it at position %d" % (expr, pos + 1), expr,
                             "NAME[LO-HI,...]", position=pos + 1)
            depth = 0
        elif char == "," and not depth:
            items.append(expr[start:pos])
            start = pos + 1
    if depth:
        raise _error("hostlist %r has an unclosed '['" % expr, expr, "NAME[LO-HI,...]")
    items.append(expr[start:])
    for index, item in enumerate(items):
        if not item.strip():
            raise _error("hostlist %r has an empty item (item %d of %d)" % (expr, index + 1, len(items)), expr,
                         "a name or NAME[LO-HI,...] between each pair of commas, e.g. gpu[001-128],login1", item=index + 1)
    return items


def _parse_group(expr, inner):
    """``[(lo, hi, width), ...]`` for the text between one pair of brackets."""
    ranges = []
    for text in inner.split(","):
        if not text:
            raise _error("hostlist %r has an empty range in '[%s]'" % (expr, inner), expr,
                         "N or LO-HI between the brackets and commas, e.g. [1-4,7]", range=text)
        match = _RANGE_RE.match(text)
        if not match:
            raise _error("range %r in hostlist %r is not a number or LO-HI" % (text, expr), expr,
                         "decimal digits, N or LO-HI, e.g. [001-128,130]", range=text)
        try:
            low = int(match.group(1))
            high = low if match.group(2) is None else int(match.group(2))
        except ValueError:  # Python 3.11+ refuses to read more than 4300 digits
            raise _error("range %r in hostlist %r has a number too long to read" % (text, expr), expr,
                         "numbers of at most a few hundred digits", range=text) from None
        if high < low:
            raise _error("range %r in hostlist %r ends below its start" % (text, expr), expr, "LO-HI with LO <= HI", range=text)
        ranges.append((low, high, len(match.group(1))))
    return ranges


def _parse_item(expr, item):
    """``[segment, ...]``: a literal string, or the ``[(lo, hi, width), ...]`` of a bracket group."""
    segments = []
    pos = 0
    while True:
        opening = item.find("[", pos)
        if opening < 0:
            break
        closing = item.find("]", opening)  # _split_items checked the balance
        if opening > pos:
            segments.append(item[pos:opening])
        segments.append(_parse_group(expr, item[opening + 1:closing]))
        pos = closing + 1
    if pos < len(item):
        segments.append(item[pos:])
    return segments


def _group_size(group):
    return sum(high - low + 1 for low, high, dummy in group)


def _parse(expr):
    """``[(item, segments, count), ...]`` for ``expr``; checks the syntax and the cap, builds no names."""
    _check_expr(expr)
    if expr == "":
        return []
    parsed = []
    total = 0
    for item in _split_items(expr):
        segments = _parse_item(expr, item)
        item_count = 1
        for segment in segments:
            if not isinstance(segment, str):
                item_count *= _group_size(segment)
        total += item_count
        if total > MAX_NAMES:
            raise _error("hostlist %r expands to more than the cap of %d names (MAX_NAMES)" % (expr, MAX_NAMES), expr,
                         "at most %d names (MAX_NAMES)" % MAX_NAMES, cap=MAX_NAMES)
        parsed.append((item, segments, item_count))
    return parsed


def _format_group(group):
    names = []
    for low, high, width in group:
        names.extend("%0*d" % (width, number) for number in range(low, high + 1))
    return names


def split(expr):
    """The top-level items of the hostlist ``expr``, as written: ``'a[1-2],b'`` gives ``['a[1-2]', 'b']``.

    The whole expression is checked first (HostlistError as for ``expand``).
    """
    return [item for item, dummy, dummy_count in _parse(expr)]


def count(expr):
    """How many names ``expr`` expands to, duplicates included, without building them."""
    return sum(item_count for dummy, dummy_segments, item_count in _parse(expr))


def expand(expr, allow_duplicates=False):
    """The host names of the hostlist ``expr`` in order: ``'n[9-11],d[01-02]'`` gives n9 n10 n11 d01 d02.

    Duplicates are dropped (the first kept) unless ``allow_duplicates``, as
    python-hostlist's ``expand_hostlist`` does. ``""`` is ``[]``. Bad syntax,
    or more than ``MAX_NAMES`` names, raises HostlistError.
    """
    names = []
    for dummy, segments, dummy_count in _parse(expr):
        if len(segments) == 1 and isinstance(segments[0], str):
            names.append(segments[0])
            continue
        pieces = [(segment,) if isinstance(segment, str) else _format_group(segment) for segment in segments]
        names.extend("".join(parts) for parts in itertools.product(*pieces))
    if allow_duplicates:
        return names
    seen = set()
    unique = []
    for name in names:
        if name not in seen:
            seen.add(name)
            unique.append(name)
    return unique


def _match(segments, index, name, pos):
    if index == len(segments):
        return pos == len(name)
    segment = segments[index]
    if isinstance(segment, str):
        return name.startswith(segment, pos) and _match(segments, index + 1, name, pos + len(segment))
    run_end = pos
    while run_end < len(name) and name[run_end] in _DIGITS:
        run_end += 1
    for low, high, width in segment:
        longest = min(run_end, pos + max(width, len(str(high))))
        for end in range(pos + width, longest + 1):
            digits = name[pos:end]
            number = int(digits)
            if low <= number <= high and "%0*d" % (width, number) == digits and _match(segments, index + 1, name, end):
                return True
    return False


def contains(expr, name):
    """Whether ``name`` is one of the names of the hostlist ``expr``, matched without expanding it.

    ``contains('gpu[001-128]', 'gpu017')`` is True, ``contains('gpu[001-128]', 'gpu17')`` False.
    The expression is checked as for ``expand`` (HostlistError).
    """
    parsed = _parse(expr)
    if not isinstance(name, str):
        raise _error("host name %r is of type %s, not a string" % (name, type(name).__name__), name, "a host name string")
    return any(_match(segments, 0, name, 0) for dummy, segments, dummy_count in parsed)


def _rightmost_number(text):
    """``(prefix, digits, suffix)`` around the last run of digits of ``text``, or None without digits."""
    end = len(text)
    while end and text[end - 1] not in _DIGITS:
        end -= 1
    if not end:
        return None
    start = end
    while start and text[start - 1] in _DIGITS:
        start -= 1
    return text[:start], text[start:end], text[end:]


def _collect_pass(entries):
    """One pass of python-hostlist's ``collect_hostlist_1``: group the rightmost number of each left part.

    ``entries`` are ``(left, right)``: ``right`` is already collected text,
    ``left`` still to be looked at. Returns the new entries and whether
    another pass is needed.
    """
    keyed = []
    remaining = set()
    for left, right in entries:
        host = left + right
        remaining.add(host)
        parts = _rightmost_number(left)
        if parts is None:
            keyed.append(((host, ""), -1, -1, host, False))
        else:
            prefix, digits, suffix = parts
            try:
                number = int(digits)
            except ValueError:  # Python 3.11+ refuses to read more than 4300 digits
                raise _error("host name %r has a number too long to read" % host, host, "numbers of at most a few hundred digits") from None
            keyed.append(((prefix, suffix + right), number, len(digits), host, True))
    keyed.sort(key=lambda entry: entry[:4])
    results = []
    again = False
    for (key, numeric), group in itertools.groupby(keyed, key=lambda entry: (entry[0], entry[4])):
        if not numeric:
            results.append(("", key[0]))
            remaining.discard(key[0])
            continue
        prefix, suffix = key
        ranges = []
        for dummy, number, width, host, dummy_numeric in group:
            if host not in remaining:
                continue
            low = number
            while True:
                candidate = "%s%0*d%s" % (prefix, width, number, suffix)
                if candidate not in remaining:
                    break
                remaining.discard(candidate)
                number += 1
            ranges.append((low, number - 1, width))
        again = True
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            results.append((prefix, "%0*d%s" % (ranges[0][2], ranges[0][0], suffix)))
        else:
            text = ",".join("%0*d" % (width, low) if low == high else "%0*d-%0*d" % (width, low, width, high) for low, high, width in ranges)
            results.append((prefix, "[" + text + "]" + suffix))
    return results, again


def compress(names):
    """A hostlist expression for the host names ``names``, the one python-hostlist's ``collect_hostlist`` gives.

    ``['n1', 'n2', 'n3', 'n7']`` gives ``'n[1-3,7]'``. Names are stripped and
    blank ones skipped; duplicates are dropped; the result is sorted by the
    text around each name's numbers. A name with ``,``, ``[`` or ``]``, a
    name that is not a string, or a string passed instead of a list raises
    HostlistError.
    """
    if isinstance(names, str):
        raise _error("compress() takes a list of host names, not the string %r" % names, names, "a list of host names, e.g. ['gpu001', 'gpu002']")
    entries = []
    for name in names:
        if not isinstance(name, str):
            raise _error("host name %r is of type %s, not a string" % (name, type(name).__name__), name, "a host name string")
        host = name.strip()
        if not host:
            continue
        if "," in host or "[" in host or "]" in host:
            raise _error("host name %r has a ',', '[' or ']'" % name, name, "a host name without ',', '[' and ']'")
        entries.append((host, ""))
    again = True
    while again:
        entries, again = _collect_pass(entries)
    return ",".join(left + right for left, right in entries)
