# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A round-trip parser and editor of ``slurm.conf`` (and ``cgroup.conf``, which has the same syntax).

Private module_utils of gpunode.tuning, standard library only.

The reading rules are Slurm's own (``src/common/parse_config.c``, checked at
SchedMD/slurm 284c3b95):

- a line is read, a ``#`` not preceded by an odd number of ``\\`` starts a
  comment, then an odd number of ``\\`` at the end (trailing blanks ignored)
  joins the next line onto this one (``_strip_comments`` runs before
  ``_strip_continuation``, so a comment may sit before the continuation
  backslash); ``\\x`` then stands for ``x`` (``_strip_escapes``);
- pairs are ``key[op]=value`` with a key of ``[A-Za-z0-9_.]``, an optional
  operator ``+ - * /`` and a value that is either ``"quoted, with blanks"`` or
  one run of non-blanks (``keyvalue_pattern``); keys are case-insensitive;
- ``include FILE`` (case-insensitive, at the start of the logical line) reads
  another file; a relative name is taken from the directory of the main file
  (``get_extra_conf_path``); ``%c`` stands for ``ClusterName``; names with
  ``*`` are not read by Slurm and are refused here.

A file is kept as its logical lines (entries), each with its raw bytes; an
edit rewrites only the raw text of the entries it touches, so every other
line comes back byte for byte.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import rooted

# Lines whose first key makes the whole line one object (read_config.c's "expline" handlers).
OBJECT_KEYS = ("nodename", "partitionname", "nodeset", "frontendname", "downnodes", "switchname", "slurmctldhost")
_PAIR_RE = re.compile(r'\s*([A-Za-z0-9_.]+)\s*([-*+/]?)=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE_RE = re.compile(r"\s*include(\s+)(\S+)", re.IGNORECASE)
MAX_INCLUDE_DEPTH = 16


class SlurmConfError(DetailedError):
    """A slurm.conf that does not parse, or an edit that cannot be made; names the file and line."""


class Pair(object):
    """One ``key=value`` of an entry: ``key`` as written, ``value`` as Slurm reads it (quotes and escapes
    removed), and the spans of the key and the value token in the entry's raw text."""

    __slots__ = ("key", "op", "value", "quoted", "key_start", "start", "end")

    def __init__(self, key, op, value, quoted, key_start, start, end):
        self.key, self.op, self.value, self.quoted = key, op, value, quoted
        self.key_start, self.start, self.end = key_start, start, end

    @property
    def name(self):
        return self.key.lower()


class Entry(object):
    """One logical line: its raw text (physical lines with their line ends), where it starts, its pairs."""

    __slots__ = ("raw", "line", "pairs", "include", "include_span")

    def __init__(self, raw, line, pairs, include=None, include_span=None):
        self.raw, self.line, self.pairs, self.include, self.include_span = raw, line, pairs, include, include_span

    @property
    def kind(self):
        """``blank`` (comments only), ``include``, ``object`` (NodeName=..., PartitionName=...) or ``global``."""
        if self.include is not None:
            return "include"
        if not self.pairs:
            return "blank"
        return "object" if self.pairs[0].name in OBJECT_KEYS else "global"

    def get(self, key):
        """The last pair named ``key`` (case-insensitive), or None."""
        key = key.lower()
        found = None
        for pair in self.pairs:
            if pair.name == key:
                found = pair
        return found


def _logical_lines(text):
    """Split ``text`` into (raw, first line number, joined content, offsets): ``content`` is what Slurm's
    reader hands the pair regex before escapes are removed, ``offsets[i]`` the raw offset of its char i."""
    physical = text.splitlines(True)
    out = []
    idx = 0
    while idx < len(physical):
        start_line = idx + 1
        raw, content, offsets = "", [], []
        while True:
            line = physical[idx]
            idx += 1
            base = len(raw)
            raw += line
            body = line.rstrip("\r\n")
            cut, backslashes = len(body), 0
            for pos, char in enumerate(body):
                if char == "#" and backslashes % 2 == 0:
                    cut = pos
                    break
                backslashes = backslashes + 1 if char == "\\" else 0
            body = body[:cut]
            stripped = body.rstrip()
            trailing = len(stripped) - len(stripped.rstrip("\\"))
            continued = trailing % 2 == 1 and idx < len(physical)
            if trailing % 2 == 1:
                body = stripped[:-1]        # the last backslash goes, the even run before it stays
            for pos, char in enumerate(body):
                content.append(char)
                offsets.append(base + pos)
            if not continued:
                break
        out.append((raw, start_line, "".join(content), offsets))
    return out


def _unescape(content, offsets):
    """Slurm's ``_strip_escapes``: ``\\x`` -> ``x``; the offsets follow the kept characters."""
    chars, kept = [], []
    pos = 0
    while pos < len(content):
        if content[pos] == "\\":
            pos += 1
            if pos >= len(content):
                break
        chars.append(content[pos])
        kept.append(offsets[pos])
        pos += 1
    return "".join(chars), kept


def _span_end(kept, end):
    return kept[end - 1] + 1


def parse_entry(raw, line, content, offsets, path):
    """Parse one logical line; raises SlurmConfError for text that is not pairs."""
    text, kept = _unescape(content, offsets)
    include = _INCLUDE_RE.match(text)
    if include and (text[:include.start(1)].strip().lower() == "include"):
        rest = text[include.end():]
        if rest.strip():
            raise SlurmConfError("%s line %d: unexpected text %r after the include file name" % (path, line, rest.strip()),
                                 path=path, line=line, value=text.strip(), expected="include FILE")
        start, end = include.span(2)
        return Entry(raw, line, [], include=include.group(2), include_span=(kept[start], _span_end(kept, end)))
    pairs, pos = [], 0
    while True:
        match = _PAIR_RE.match(text, pos)
        if not match:
            break
        quoted = match.group(3) is not None
        vstart, vend = match.span(3 if quoted else 4)
        if quoted:
            vstart, vend = vstart - 1, vend + 1
        value = match.group(3) if quoted else match.group(4)
        pairs.append(Pair(match.group(1), match.group(2), value, quoted, kept[match.start(1)], kept[vstart], _span_end(kept, vend)))
        pos = match.end()
    leftover = text[pos:].strip()
    if leftover:
        raise SlurmConfError("%s line %d: cannot parse %r in %r: expected Key=Value pairs (a value with blanks in double quotes)" % (
            path, line, leftover[:80], text.strip()[:160]), path=path, line=line, value=leftover, expected="Key=Value")
    return Entry(raw, line, pairs)


class ConfFile(object):
    """One file: its entries, in order; ``render()`` gives the text back."""

    def __init__(self, path, entries):
        self.path, self.entries = path, entries

    def render(self):
        return "".join(entry.raw for entry in self.entries)


def parse_text(text, path="slurm.conf"):
    """Parse the text of one file (includes are not followed here)."""
    return ConfFile(path, [parse_entry(raw, line, content, offsets, path) for raw, line, content, offsets in _logical_lines(text)])


# ------------------------------------------------------------------ reading --

def inside(root, path, what, where=None):
    """``path`` under ``root`` as a host path, checked: no NUL byte, and no symbolic link on the way (the file itself
    or a directory above it) that leads out of ``root`` - a captured tree's link to /etc/shadow is never read or
    written on this host. With root / every path is inside."""
    named = "%s %s%s" % (what, path, " (%s)" % where if where else "")
    if "\0" in path or "\0" in root:
        raise SlurmConfError("%s: the path contains a NUL byte" % named.replace("\0", "\\0"), path=path, value=path,
                             expected="a path without NUL bytes")
    full = rooted(root, path)
    top = os.path.realpath(root)
    real = os.path.realpath(full)
    if top != os.sep and real != top and not real.startswith(top + os.sep):
        link = full if os.path.islink(full) else None
        raise SlurmConfError("%s %s out of root %s, to %s: a link out of the configuration tree is never followed; "
                             "copy the file into the tree" % (named, "is a symbolic link (-> %s) that leads" %
                                                              os.readlink(link) if link else "leads through a symbolic "
                                                              "link", root, real),
                             path=path, value=path, target=real, expected="a file inside root %s" % root)
    return full


def _read(root, path, what, where=None):
    full = inside(root, path, what, where)
    try:
        with open(full, "rb") as handle:
            data = handle.read()
    except (IOError, OSError) as exc:
        raise SlurmConfError("cannot read %s %s: %s" % (what, path, exc), path=path, value=path, expected="a readable file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SlurmConfError("%s %s is not UTF-8 text" % (what, path), path=path, value=path, expected="UTF-8 text")


class Conf(object):
    """``slurm.conf`` with its includes: ``files`` maps each path (as on the target) to its ConfFile, in
    reading order; ``order`` lists (path, entry index) in the order Slurm reads them."""

    def __init__(self, path, root="/"):
        self.path, self.root = path, root
        self.files = {}
        self.order = []
        self._load(path, 0, (), None)

    def _cluster_name(self):
        value = None
        for path, idx in self.order:
            pair = self.files[path].entries[idx].get("clustername")
            if pair is not None and self.files[path].entries[idx].kind == "global":
                value = pair.value
        return value

    def _include_path(self, name, where):
        if "%c" in name:
            cluster = self._cluster_name()
            if not cluster:
                raise SlurmConfError("%s: include %s uses %%c but no ClusterName is set before it" % (where, name),
                                     path=where, value=name, expected="ClusterName set before the include")
            name = name.replace("%c", cluster)
        if "*" in name:
            raise SlurmConfError("%s: include %s is a glob, which Slurm does not read" % (where, name),
                                 path=where, value=name, expected="one file name")
        if not name.startswith("/"):
            name = os.path.join(os.path.dirname(self.path), name)
        return os.path.normpath(name)

    def _load(self, path, depth, stack, where):
        if path in stack:
            raise SlurmConfError("%s includes %s, which includes it again" % (where, path), path=path, value=path,
                                 expected="includes without a cycle")
        if depth > MAX_INCLUDE_DEPTH:
            raise SlurmConfError("includes nest deeper than %d at %s" % (MAX_INCLUDE_DEPTH, path), path=path, value=path,
                                 expected="at most %d levels" % MAX_INCLUDE_DEPTH)
        parsed = parse_text(_read(self.root, path, "include file" if depth else "slurm.conf", where), path)
        if path in self.files:
            raise SlurmConfError("%s is included twice" % path, path=path, value=path, expected="each file read once")
        self.files[path] = parsed
        for idx, entry in enumerate(parsed.entries):
            self.order.append((path, idx))
            if entry.kind == "include":
                self._load(self._include_path(entry.include, "%s line %d" % (path, entry.line)), depth + 1,
                           stack + (path,), "%s line %d" % (path, entry.line))

    def entries(self):
        """(path, entry) in reading order (includes where they are included)."""
        for path, idx in self.order:
            yield path, self.files[path].entries[idx]

    def get(self, key):
        """The global ``key`` as Slurm ends up reading it: (value, path, entry, pair) of its last setting, or Nones."""
        found = (None, None, None, None)
        for path, entry in self.entries():
            if entry.kind == "global":
                pair = entry.get(key)
                if pair is not None:
                    found = (pair.value, path, entry, pair)
        return found


def read_conf(path, root="/"):
    """Read ``path`` (slurm.conf or cgroup.conf) and every file it includes."""
    return Conf(path, root)


# ------------------------------------------------------------------ editing --

def _token(key, value):
    if value == "" or re.search(r'[\s"#\\]', value):
        if '"' in value or "\n" in value:
            raise SlurmConfError("value %r for %s cannot be written: it holds a double quote or a newline" % (value, key),
                                 value=value, expected="a value without double quotes or newlines")
        # Slurm strips every escaping backslash (parse_config.c _strip_escapes): a backslash is written doubled,
        # a "#" escaped, so that the value reads back as it was given.
        return '%s="%s"' % (key, value.replace("\\", "\\\\").replace("#", "\\#"))
    return "%s=%s" % (key, value)


def set_value(entry, key, value):
    """The entry's raw text with ``key`` set to ``value``: the value token of its last ``key`` replaced in
    place (quoting kept where the old value was quoted), or `` key=value`` added after the last pair."""
    pair = entry.get(key)
    if pair is not None:
        token = _token(pair.key, value).split("=", 1)[1]
        if pair.quoted and not token.startswith('"'):
            token = '"%s"' % token
        return entry.raw[:pair.start] + token + entry.raw[pair.end:]
    if not entry.pairs:
        raise SlurmConfError("line %d holds no pairs to add %s to" % (entry.line, key), value=key, expected="a line with pairs")
    end = entry.pairs[-1].end
    return entry.raw[:end] + " " + _token(key, value) + entry.raw[end:]


def remove_key(entry, key):
    """The entry's raw text without any ``key`` pair (and the blanks before each)."""
    raw = entry.raw
    for pair in sorted((p for p in entry.pairs if p.name == key.lower()), key=lambda p: p.key_start, reverse=True):
        start = pair.key_start
        while start > 0 and raw[start - 1] in " \t":
            start -= 1
        if start == 0 or raw[start - 1] == "\n":
            start = pair.key_start          # the first pair on its physical line keeps its indentation
            end = pair.end
            while end < len(raw) and raw[end] in " \t":
                end += 1
        else:
            end = pair.end
        raw = raw[:start] + raw[end:]
    return raw


def new_line(pairs, ending="\n"):
    """A new logical line from (key, value) pairs."""
    return " ".join(_token(key, value) for key, value in pairs) + ending


def line_ending(entry):
    raw = entry.raw
    if raw.endswith("\r\n"):
        return "\r\n"
    return "\n"
