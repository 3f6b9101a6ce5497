# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel parameters through GRUB's /etc/default/grub (Debian and Ubuntu: update-grub), for the kernel_cmdline module.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

* The configured command line is what grub-mkconfig builds: it sources
  /etc/default/grub, then every /etc/default/grub.d/*.cfg in glob order (the
  loop in Debian's grub-mkconfig, grub2 2.06-13+deb12u2, lines 160-167), and
  10_linux passes "${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}" to the
  normal entries. On the live system (root /) :func:`evaluate` runs the same
  sourcing with /bin/sh (a fixed script; the files are its arguments): these
  are the files update-grub sources as root right after. On a captured tree
  (``run`` None) no process runs at all: :func:`evaluate_tree` reads the
  assignment subset in Python, never runs a command substitution, and fails
  naming the file and line for anything else (the notes before it).
* The module's parameters live in one drop-in that appends to
  GRUB_CMDLINE_LINUX. A managed key found in an earlier file is removed from the
  assignment line that sets it, that token only (:func:`remove_keys`), and the
  line is recorded so that it can be put back byte for byte (:func:`plan`).
* :func:`parse_grub_cfg` and :func:`default_entry` read the next boot's
  ``linux`` line from grub.cfg the way GRUB picks the default entry (number,
  title or id, ``>`` paths into submenus, ``saved`` and ``next_entry`` from
  grubenv).
"""

from __future__ import annotations

import collections
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import list_dir
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import (
    KernelCmdlineError,
    is_removal,
    norm,
    param_key,
    split_cmdline,
    token_spans,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import rooted

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
GRUB_CFG = "/boot/grub/grub.cfg"
GRUBENV = "/boot/grub/grubenv"
VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
SH = "/bin/sh"
DROPIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\.cfg\Z")
DROPIN_HEADER = (
    "# Managed by gpunode.tuning (kernel_cmdline module): local changes are overwritten.\n"
    "# Kernel parameters for the next boot, appended to GRUB_CMDLINE_LINUX. What this module removed from the\n"
    "# files sourced before it is recorded in %s and put back by state=absent.\n"
)

# Sources (or evals) its arguments in order, as grub-mkconfig sources /etc/default/grub and grub.d/*.cfg
# (set -e, no positional parameters), and prints the two variables NUL-terminated on the saved stdout;
# anything the files print goes to stderr. Arguments: pairs of "source PATH" or "eval TEXT".
EVAL_SCRIPT = r"""exec 3>&1 1>&2
set -e
__gpunode_n=0
for __gpunode_a in "$@"; do
  __gpunode_n=$((__gpunode_n + 1))
  eval "__gpunode_item_$__gpunode_n=\$__gpunode_a"
done
set --
__gpunode_i=1
while [ "$__gpunode_i" -lt "$__gpunode_n" ]; do
  eval "__gpunode_kind=\$__gpunode_item_$__gpunode_i"
  eval "__gpunode_what=\$__gpunode_item_$((__gpunode_i + 1))"
  __gpunode_i=$((__gpunode_i + 2))
  case "$__gpunode_kind" in
    source) . "$__gpunode_what" ;;
    eval) eval "$__gpunode_what" ;;
  esac
done
printf '%s\0%s\0' "${GRUB_CMDLINE_LINUX-}" "${GRUB_CMDLINE_LINUX_DEFAULT-}" >&3
"""


# ------------------------------------------------------------ configuration --

def dropin_path(name):
    return "%s/%s" % (GRUB_DROPIN_DIR, name)


def config_files(root, extra=None):
    """The files grub-mkconfig sources, in its order: /etc/default/grub (when a file), then grub.d/*.cfg in
    glob order (C locale, no names starting with a dot). ``extra`` (a grub.d path) is put in its place too."""
    out = [GRUB_DEFAULTS] if os.path.isfile(rooted(root, GRUB_DEFAULTS)) else []
    names = set(n for n in list_dir(rooted(root, GRUB_DROPIN_DIR))
                if n.endswith(".cfg") and not n.startswith(".") and os.path.exists(rooted(root, dropin_path(n))))
    if extra:
        names.add(os.path.basename(extra))
    return out + [dropin_path(n) for n in sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape"))]


def read_text(root, path):
    with open(rooted(root, path), "rb") as handle:
        return handle.read().decode("utf-8", "surrogateescape")


def _read(root, path):
    try:
        return read_text(root, path)
    except (IOError, OSError) as exc:
        raise KernelCmdlineError("cannot read %s: %s" % (path, exc), path=path)


def _record(path, var, idx, before, after, removed):
    for text in (before, after):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise KernelCmdlineError("%s line %d is not UTF-8 text: this module does not edit it; move the managed "
                                     "parameters out of it by hand" % (path, idx + 1), path=path, line=idx + 1)
    return {"file": path, "variable": var, "line": idx + 1, "before": before, "after": after, "removed": removed}


def check_syntax(run, root, path):
    """``sh -n`` on a file grub-mkconfig sources: a file that does not parse fails, naming it. Without ``run`` (a
    captured tree) no process runs: the file is read as :func:`evaluate_subset` reads it."""
    if run is None:
        _Reader(path, _read(root, path)).commands()
        return
    rc, out, err = run([SH, "-n", rooted(root, path)])
    if rc != 0:
        raise KernelCmdlineError("%s does not parse as a shell script (sh -n: %s); grub-mkconfig would fail on it: fix it first"
                                 % (path, (err or out).strip() or "rc %d" % rc), path=path, expected="a file that sh -n accepts")


def evaluate(run, root, items):
    """(GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT) after sourcing ``items`` in order with /bin/sh.

    ``items``: (path, text) pairs; text None sources the file under ``root``,
    a string is evaluated instead (a planned content, nothing is written).
    Without ``run`` (a captured tree) nothing is run: :func:`evaluate_tree`.
    """
    if run is None:
        return evaluate_tree(root, items)
    argv = [SH, "-c", EVAL_SCRIPT, "sh"]
    for path, text in items:
        argv += ["source", rooted(root, path)] if text is None else ["eval", text]
    rc, out, err = run(argv)
    fields = (out or "").split("\0")
    if rc != 0 or len(fields) < 3:
        raise KernelCmdlineError("sourcing %s as grub-mkconfig does failed (rc %d): %s" % (
            ", ".join(p for p, _t in items) or "(nothing)", rc, (err or out or "").strip() or "no output"),
            paths=[p for p, _t in items])
    return fields[-3], fields[-2]


def configured(values):
    """The parameters of a normal entry: GRUB_CMDLINE_LINUX, then GRUB_CMDLINE_LINUX_DEFAULT (10_linux)."""
    return split_cmdline(values[0]) + split_cmdline(values[1])


# ------------------------------------------------ tree mode: no shell at all --
#
# With a root other than / the tree's files are never given to a shell: they are evaluated here, in Python, as the
# subset of sh that /etc/default/grub and grub.d/*.cfg are written in. Supported: comments, blank lines, ``;`` and
# newlines between commands, backslash-newline continuations, assignments ``NAME=word`` (several in one command),
# ``export``/``readonly`` of names and assignments, words of bare text, ``\x``, '...' and "..." with ``$NAME``,
# ``${NAME}``, ``${NAME-word}``, ``${NAME:-word}``, ``${NAME+word}`` and ``${NAME:+word}``; variables not set in the
# files are empty (the environment is not read). A command substitution (``$(...)``, backticks), an arithmetic
# expansion or a special parameter in an assignment is never run: that variable's value is unknown, and only if
# GRUB_CMDLINE_LINUX(_DEFAULT) depend on it does the evaluation fail, naming the file and line (stock Debian files set
# GRUB_DISTRIBUTOR with backticks). Any other command (``if``, ``.``, ``echo``, a function, a pipe, a redirection)
# fails, naming the file and line.

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_OPERATORS = "&|<>()"
_DECLARE = ("export", "readonly")


class Unknown(object):
    """The value of a word that only running code would give: where (path, line) and why."""

    def __init__(self, path, line, why):
        self.path, self.line, self.why = path, line, why


class _Word(object):
    """One shell word as read: ``raw`` (its text), ``parts`` (str, ("var", name, op, parts) or Unknown) and
    ``lead`` (the bare text it starts with, for NAME=)."""

    def __init__(self, line):
        self.line, self.raw, self.parts, self.lead, self.plain = line, [], [], [], True

    def add(self, raw, part, plain=False):
        self.raw.append(raw)
        self.parts.append(part)
        self.plain = self.plain and plain
        if self.plain:
            self.lead.append(part)

    def text(self):
        return "".join(self.raw)

    def assignment(self):
        """The NAME of a NAME=... word (NAME= written as bare text), else None."""
        match = _ASSIGN_WORD.match("".join(self.lead))
        return match.group(1) if match else None


def _tree_error(path, line, msg, **extra):
    return KernelCmdlineError("%s line %d: %s; with a root other than / the GRUB files are evaluated without a shell "
                              "(nothing of a captured tree runs on this host)" % (path, line, msg),
                              path=path, line=line, **extra)


class _Reader(object):
    """Splits a file into simple commands (lists of _Word) as sh's lexer does, for the supported subset."""

    def __init__(self, path, text, line=1):
        self.path, self.text, self.pos, self.line = path, text, 0, line

    def peek(self, ahead=0):
        pos = self.pos + ahead
        return self.text[pos] if pos < len(self.text) else ""

    def take(self):
        char = self.text[self.pos]
        self.pos += 1
        if char == "\n":
            self.line += 1
        return char

    def skip_to(self, end):
        while self.pos < end:
            self.take()

    def syntax(self, what, line):
        return KernelCmdlineError("%s does not parse as a shell script (line %d: %s); grub-mkconfig would fail on it: "
                                  "fix it first" % (self.path, line, what), path=self.path, line=line,
                                  expected="a file that sh -n accepts")

    def commands(self):
        """[(line, [_Word, ...]), ...]: the simple commands of the file, in order."""
        out, words = [], []
        while self.pos < len(self.text):
            char = self.peek()
            if char == "\\" and self.peek(1) == "\n":
                self.skip_to(self.pos + 2)
            elif char in " \t\r":
                self.take()
            elif char == "#":                       # a word never starts here otherwise: a comment
                end = self.text.find("\n", self.pos)
                self.skip_to(len(self.text) if end < 0 else end)
            elif char in "\n;":
                if char == ";" and not words:
                    raise self.syntax("';' without a command before it", self.line)
                self.take()
                if words:
                    out.append((words[0].line, words))
                    words = []
            elif char in _OPERATORS:
                raise _tree_error(self.path, self.line, "%r (a pipe, list, redirection, subshell or function) is not "
                                  "supported" % char, value=char, expected="assignments only")
            else:
                words.append(self.word())
        if words:
            out.append((words[0].line, words))
        return out

    def word(self, stop=" \t\r\n;" + _OPERATORS):
        word = _Word(self.line)
        while self.pos < len(self.text) and self.peek() not in stop:
            char = self.peek()
            if char == "\\":
                self.take()
                nxt = self.take() if self.pos < len(self.text) else ""
                if nxt != "\n":
                    word.add("\\" + nxt, nxt)
            elif char == "'":
                start = self.line
                self.take()
                end = self.text.find("'", self.pos)
                if end < 0:
                    raise self.syntax("unterminated '", start)
                chunk = self.text[self.pos:end]
                self.skip_to(end + 1)
                word.add("'%s'" % chunk, chunk)
            elif char == '"':
                self.double(word)
            elif char == "$":
                self.dollar(word)
            elif char == "`":
                self.backtick(word)
            else:
                word.add(self.take(), char, plain=True)
        return word

    def double(self, word):
        start = self.line
        self.take()
        word.add('"', "")
        while True:
            if self.pos >= len(self.text):
                raise self.syntax('unterminated "', start)
            char = self.peek()
            if char == '"':
                word.add(self.take(), "")
                return
            if char == "\\" and self.peek(1) and self.peek(1) in '$`"\\\n':
                self.take()
                nxt = self.take()
                if nxt != "\n":
                    word.add("\\" + nxt, nxt)
            elif char == "$":
                self.dollar(word)
            elif char == "`":
                self.backtick(word)
            else:
                word.add(self.take(), char)

    def backtick(self, word):
        start = self.line
        self.take()
        end = self.pos
        while end < len(self.text) and self.text[end] != "`":
            end += 2 if self.text[end] == "\\" else 1
        if end >= len(self.text):
            raise self.syntax("unterminated `", start)
        self.skip_to(end + 1)
        word.add("`...`", Unknown(self.path, start, "a command substitution (`...`)"))

    def balanced(self, start, opening, closing, what):
        """The text up to the ``closing`` that matches an ``opening`` already taken (quotes minded); skips it."""
        depth, begin = 1, self.pos
        while self.pos < len(self.text):
            char = self.take()
            if char == "\\" and self.pos < len(self.text):
                self.take()
            elif char == "'":
                end = self.text.find("'", self.pos)
                if end < 0:
                    break
                self.skip_to(end + 1)
            elif char == opening:
                depth += 1
            elif char == closing:
                depth -= 1
                if depth == 0:
                    return self.text[begin:self.pos - 1]
        raise self.syntax("unterminated %s" % what, start)

    def dollar(self, word):
        start = self.line
        self.take()
        char = self.peek()
        if char == "(":
            self.take()
            arith = self.peek() == "("
            self.balanced(start, "(", ")", "$(")
            word.add("$(...)", Unknown(self.path, start, "an arithmetic expansion ($((...)))" if arith
                                       else "a command substitution ($(...))"))
        elif char == "{":
            self.take()
            body = self.balanced(start, "{", "}", "${")
            word.add("${%s}" % body, self.braced(body, start))
        elif _NAME.match(char):
            name = _NAME.match(self.text, self.pos).group(0)
            self.skip_to(self.pos + len(name))
            word.add("$" + name, ("var", name, None, None))
        elif char and char in "0123456789@*#?$!-":
            self.take()
            word.add("$" + char, Unknown(self.path, start, "the special parameter $%s" % char))
        else:
            word.add("$", "$")

    def braced(self, body, line):
        match = _NAME.match(body)
        if not match:
            return Unknown(self.path, line, "the expansion ${%s}" % body)
        name, rest = match.group(0), body[match.end():]
        if not rest:
            return ("var", name, None, None)
        op = rest[:2] if rest[:2] in (":-", ":+") else rest[:1]
        if op not in ("-", "+", ":-", ":+"):
            return Unknown(self.path, line, "the expansion ${%s} (only ${NAME}, ${NAME-word}, ${NAME:-word}, "
                                            "${NAME+word} and ${NAME:+word} are evaluated)" % body)
        inner = _Reader(self.path, rest[len(op):], line)
        parts = []
        while inner.pos < len(inner.text):          # the word of ${NAME:-word}: quotes and expansions, blanks kept
            if inner.peek() in " \t\r\n":
                parts.append(inner.take())
            else:
                parts.extend(inner.word(stop=" \t\r\n").parts)
        return ("var", name, op, parts)


def _expand(parts, env):
    """The value of a word's parts in ``env`` (name -> str or Unknown): a str, or the first Unknown it needs."""
    out = []
    for part in parts:
        if isinstance(part, Unknown):
            return part
        if not isinstance(part, tuple):
            out.append(part)
            continue
        _kind, name, op, word = part
        value = env.get(name)
        if isinstance(value, Unknown):
            return value
        if op is not None:
            is_set = value is not None and (value != "" or ":" not in op)
            if is_set == op.endswith("+"):
                value = _expand(word, env)
                if isinstance(value, Unknown):
                    return value
            elif op.endswith("+"):
                value = ""
        out.append(value or "")
    return "".join(out)


def evaluate_subset(path, text, env):
    """Evaluate one file's ``text`` (as ``path``) into ``env`` (name -> str or Unknown) without a shell."""
    for line, words in _Reader(path, text).commands():
        head = 0
        while head < len(words) and words[head].assignment():
            head += 1
        assigns, rest = words[:head], words[head:]
        if rest:
            name = rest[0].text()
            if assigns or name not in _DECLARE:
                raise _tree_error(path, line, "the command %r is not supported: only assignments (NAME=value) and "
                                  "export/readonly are evaluated" % name, value=name, expected="assignments only")
            for word in rest[1:]:
                if word.assignment():
                    assigns.append(word)
                elif not (_NAME.match(word.text()) and _NAME.match(word.text()).end() == len(word.text())):
                    raise _tree_error(path, line, "%s %s is not supported: expected NAME or NAME=value"
                                      % (name, word.text()), value=word.text(), expected="NAME or NAME=value")
        for word in assigns:
            name = word.assignment()
            env[name] = _expand(word.parts[len(name) + 1:], env)


def evaluate_tree(root, items):
    """(GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT) after evaluating ``items`` (as :func:`evaluate`) without a
    shell. A value that only running the files' code would give fails, naming the file and line it comes from."""
    env = {}
    for path, text in items:
        evaluate_subset(path, _read(root, path) if text is None else text, env)
    out = []
    for var in VARIABLES:
        value = env.get(var)
        if isinstance(value, Unknown):
            raise _tree_error(value.path, value.line, "%s depends on %s, which is never run for a captured tree"
                              % (var, value.why), value=var, expected="a value without command substitutions")
        out.append(value or "")
    return tuple(out)


# ------------------------------------------------------- assignment lines --

_ASSIGN = re.compile(r"^(?P<lead>[ \t]*(?:export[ \t]+)?)(?P<var>GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(?P<rest>.*)$")
_TRAIL = re.compile(r"^[ \t]*(?:#.*)?$")
_BARE = re.compile(r"^[^ \t\"'\\`;&|<>()]*")

Assignment = collections.namedtuple("Assignment", "var prefix content suffix")


def parse_assignment(line):
    """(var, Assignment or None) for a line assigning GRUB_CMDLINE_LINUX(_DEFAULT), (None, None) otherwise.

    The Assignment is set only for the simple forms this module edits: one
    line ``VAR="..."`` (no backslash, backtick or ``$(`` inside), ``VAR='...'``
    or ``VAR=word``, optionally ``export``-ed and followed by a comment;
    ``line == prefix + content + suffix``.
    """
    match = _ASSIGN.match(line)
    if not match:
        return None, None
    var, rest = match.group("var"), match.group("rest")
    head = match.group("lead") + var + "="
    if rest[:1] in ('"', "'"):
        quote = rest[0]
        end = rest.find(quote, 1)
        if end < 0:
            return var, None
        content, suffix = rest[1:end], rest[end:]
        if quote == '"' and ("\\" in content or "`" in content or "$(" in content):
            return var, None
        if not _TRAIL.match(suffix[1:]):
            return var, None
        return var, Assignment(var, head + quote, content, suffix)
    content = _BARE.match(rest).group(0)
    suffix = rest[len(content):]
    if not _TRAIL.match(suffix):
        return var, None
    return var, Assignment(var, head, content, suffix)


def remove_keys(content, keys):
    """(content without the parameters whose key is in ``keys``, removed parameters). Only those tokens and one
    run of blanks next to each go; ``$VAR`` references, quotes and every other byte stay."""
    removed = []
    out = content
    for start, end in reversed(token_spans(content)):
        word = content[start:end]
        if word.startswith("$") or param_key(word) not in keys:
            continue
        removed.insert(0, word)
        before, after = out[:start], out[end:]
        if before.rstrip(" \t") != before:
            out = before.rstrip(" \t") + after
        else:
            out = before + after.lstrip(" \t")
    return out, removed


def _mentions(line, keys):
    """Whether an assignment line names one of ``keys`` (a cheap test for lines this module cannot parse)."""
    rest = line.split("=", 1)[1] if "=" in line else ""
    return any(param_key(word) in keys for word in re.split(r"[\s\"'$`{}()\\;]+", rest) if word)


def _ending(raw):
    body = raw.rstrip("\r\n")
    return body, raw[len(body):]


def _find_line(lines, text, hint):
    """Index of the line equal to ``text`` (line number ``hint`` first, else the only such line), or None."""
    bodies = [_ending(raw)[0] for raw in lines]
    if isinstance(hint, int) and 0 < hint <= len(bodies) and bodies[hint - 1] == text:
        return hint - 1
    hits = [n for n, body in enumerate(bodies) if body == text]
    return hits[0] if len(hits) == 1 else None


def _check_record(rec, marker):
    ok = isinstance(rec, dict) and all(isinstance(rec.get(k), str) for k in ("file", "variable", "before", "after"))
    if not ok or rec["variable"] not in VARIABLES or parse_assignment(rec["before"])[1] is None:
        raise KernelCmdlineError("marker %s: edit %r is not a record of this module (file, variable, before, after): "
                                 "fix or remove it" % (marker, rec), path=marker, value=rec)


# ------------------------------------------------------------------ plan --

def _put_back(previous, new, keys, marker, warnings):
    """Lines this module edited before (the marker's records ``previous``): back to the recorded line, less the keys
    still managed, in ``new`` ({path: text}). Returns (records, restored parameters, {(path, index): record})."""
    records, restored, owner = [], [], {}
    for rec in previous:
        _check_record(rec, marker)
        path = rec["file"]
        if path not in new:
            warnings.append("%s (edited by this module, recorded in %s) is gone; its line %r was not put back"
                            % (path, marker, rec["before"]))
            continue
        lines = new[path].splitlines(True)
        idx = _find_line(lines, rec["after"], rec.get("line"))
        if idx is None:
            if _find_line(lines, rec["before"], rec.get("line")) is None:
                warnings.append("%s: the line this module left (%r) was changed since; left as it is (the line before "
                                "this module edited it was %r)" % (path, rec["after"], rec["before"]))
            continue
        orig = parse_assignment(rec["before"])[1]
        content, removed = remove_keys(orig.content, keys)
        target = orig.prefix + content + orig.suffix
        lines[idx] = target + _ending(lines[idx])[1]
        new[path] = "".join(lines)
        restored += [t for t in rec.get("removed", []) if isinstance(t, str) and param_key(t) not in keys]
        if target != rec["before"]:
            record = _record(path, rec["variable"], idx, rec["before"], target, removed)
            records.append(record)
            owner[(path, idx)] = record
    return records, restored, owner


def _strip_managed(base_paths, new, keys, records, owner):
    """Managed keys anywhere else in the files sourced before the drop-in: removed from the line that sets them (in
    ``new``), each edit recorded; a line this module cannot edit safely fails."""
    for path in base_paths:
        lines = new[path].splitlines(True)
        continued = False
        for idx, raw in enumerate(lines):
            line = _ending(raw)[0]
            was_continued, continued = continued, line.endswith("\\")
            var, assign = parse_assignment(line)
            if var is None or not _mentions(line, keys):
                continue
            if was_continued or assign is None:
                raise KernelCmdlineError(
                    "%s line %d sets %s in a form this module cannot edit safely (%r); expected one line VAR=\"...\", "
                    "VAR='...' or VAR=word: move the managed parameters (%s) out of it by hand"
                    % (path, idx + 1, var, line, ", ".join(sorted(keys))), path=path, line=idx + 1, value=line)
            content, removed = remove_keys(assign.content, keys)
            if not removed:
                continue
            target = assign.prefix + content + assign.suffix
            lines[idx] = target + _ending(raw)[1]
            if (path, idx) in owner:
                owner[(path, idx)]["after"] = target
                owner[(path, idx)]["removed"] += removed
            else:
                record = _record(path, var, idx, line, target, removed)
                records.append(record)
                owner[(path, idx)] = record
        new[path] = "".join(lines)


def plan(root, run, managed, previous, dropin_name, marker, warnings):
    """Everything a grub_debian run changes, checked before anything is written.

    ``managed``: key -> parameter the module manages after this run;
    ``previous``: the edit records of the marker. Returns a dict with
    ``files`` ({path: text}) and ``remove`` (paths) for the configuration,
    ``edits`` (records for the marker), ``before``/``after`` (the configured
    parameters), and the texts as found (``texts``). Raises KernelCmdlineError.
    """
    dropin = dropin_path(dropin_name)
    paths = config_files(root)
    base_paths = [p for p in paths if p != dropin]
    for path in base_paths:
        check_syntax(run, root, path)
    texts = dict((p, _read(root, p)) for p in paths)
    keys = set(managed)
    base = configured(evaluate(run, root, [(p, None) for p in base_paths]))
    before = base
    if dropin in paths:
        try:
            before = configured(evaluate(run, root, [(p, None) for p in paths]))
        except KernelCmdlineError as exc:
            warnings.append("the drop-in %s does not evaluate (%s); it is rewritten" % (dropin, exc))

    new = dict((p, texts[p]) for p in base_paths)
    records, restored, owner = _put_back(previous, new, keys, marker, warnings)
    _strip_managed(base_paths, new, keys, records, owner)

    changed = [p for p in base_paths if new[p] != texts[p]]
    after_base = configured(evaluate(run, root, [(p, new[p] if p in changed else None) for p in base_paths])) \
        if changed else base
    _verify_base(base, after_base, keys, restored, base_paths, new)

    dropin_text = None
    setting = [t for t in managed.values() if not is_removal(t)]
    if setting:
        dropin_text = DROPIN_HEADER % marker + 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX %s"\n' % " ".join(setting)
    order = config_files(root, extra=dropin if dropin_text else None)
    items = []
    for path in order:
        if path == dropin:
            if dropin_text is not None:
                items.append((path, None if texts.get(path) == dropin_text else dropin_text))
        else:
            items.append((path, new[path] if path in changed else None))
    after = configured(evaluate(run, root, items))
    _verify_after(after, managed, order, dropin)

    files = dict((p, new[p]) for p in changed)
    remove = []
    if dropin_text is not None:
        files[dropin] = dropin_text
    else:
        remove.append(dropin)
    return {"files": files, "remove": remove, "edits": records, "before": before, "after": after, "texts": texts}


def _assign_lines(paths, texts):
    out = []
    for path in paths:
        for idx, raw in enumerate(texts[path].splitlines()):
            if parse_assignment(raw)[0]:
                out.append("%s:%d" % (path, idx + 1))
    return out


def _verify_base(base, after_base, keys, restored, paths, texts):
    left = [t for t in after_base if param_key(t) in keys]
    if left:
        raise KernelCmdlineError(
            "%s would still be on the configured command line after removing the managed keys from the assignment "
            "lines: it is set in a way this module cannot edit (GRUB_CMDLINE_LINUX/_DEFAULT are assigned at %s); "
            "remove it by hand" % (" ".join(left), ", ".join(_assign_lines(paths, texts)) or "no line"),
            value=left, paths=paths)
    kept_before = collections.Counter(norm(t) for t in base if param_key(t) not in keys)
    kept_after = collections.Counter(norm(t) for t in after_base if param_key(t) not in keys)
    lost = kept_before - kept_after
    gained = (kept_after - kept_before) - collections.Counter(norm(t) for t in restored)
    if lost or gained:
        raise KernelCmdlineError(
            "editing the GRUB_CMDLINE_LINUX/_DEFAULT lines would change other parameters too (lost: %s, gained: %s); "
            "nothing was changed" % (" ".join(sorted(lost.elements())) or "none", " ".join(sorted(gained.elements())) or "none"),
            lost=sorted(lost.elements()), gained=sorted(gained.elements()))


def _verify_after(after, managed, order, dropin):
    later = order[order.index(dropin) + 1:] if dropin in order else []
    for key, token in managed.items():
        found = [t for t in after if param_key(t) == key]
        if is_removal(token):
            if found:
                raise KernelCmdlineError(
                    "%s would still be on the command line grub-mkconfig builds after this module removes it: %s sourced "
                    "after the drop-in set%s it; nothing was changed" % (" ".join(found), ", ".join(later) or "a file",
                                                                         "s" if len(later) == 1 else ""),
                    value=found, expected="no %s" % key, later=later)
            continue
        if [norm(t) for t in found] != [norm(token)]:
            raise KernelCmdlineError(
                "with the drop-in %s the command line grub-mkconfig builds would have %s instead of %s once: %s "
                "sourced after it set%s GRUB_CMDLINE_LINUX or GRUB_CMDLINE_LINUX_DEFAULT without keeping it; nothing "
                "was changed" % (dropin, " ".join(found) or "no %s" % key, token, ", ".join(later) or "a file",
                                 "s" if len(later) == 1 else ""),
                value=found, expected=token, later=later)


# --------------------------------------------------------------- grub.cfg --

def _var(line, pos):
    """(name, end) of a ``$name`` or ``${name}`` reference at ``pos``, or (None, pos + 1)."""
    if line.startswith("${", pos):
        end = line.find("}", pos + 2)
        if end > pos + 2:
            return line[pos + 2:end], end + 1
        return None, pos + 1
    match = re.match(r"[A-Za-z0-9_?#@]+", line[pos + 1:])
    if match:
        return match.group(0), pos + 1 + match.end()
    return None, pos + 1


def grub_words(line):
    """Words of one grub.cfg command as GRUB's lexer reads them: blanks separate words, '...' is literal,
    "..." and bare text allow backslash escapes, ``#`` starts a comment. Variable references are kept as
    written (``$vt_handoff``): their value is only known when GRUB runs."""
    words, cur, has, pos, size = [], [], False, 0, len(line)
    while pos < size:
        char = line[pos]
        if char in " \t":
            if has:
                words.append("".join(cur))
                cur, has = [], False
            pos += 1
        elif char == "#" and not has:
            break
        elif char == "\\" and pos + 1 < size:
            cur.append(line[pos + 1])
            has, pos = True, pos + 2
        elif char == "'":
            end = line.find("'", pos + 1)
            end = size if end < 0 else end
            cur.append(line[pos + 1:end])
            has, pos = True, end + 1
        elif char == '"':
            pos, has = pos + 1, True
            while pos < size and line[pos] != '"':
                if line[pos] == "\\" and pos + 1 < size and line[pos + 1] in '$"\\':
                    cur.append(line[pos + 1])
                    pos += 2
                else:
                    cur.append(line[pos])
                    pos += 1
            pos += 1
        else:
            cur.append(char)
            has, pos = True, pos + 1
    if has:
        words.append("".join(cur))
    return words


def _entry_id(words):
    for n, word in enumerate(words):
        if word in ("--id", "$menuentry_id_option", "${menuentry_id_option}") and n + 1 < len(words):
            return words[n + 1]
        if word.startswith("--id="):
            return word[5:]
    return None


def parse_grub_cfg(text):
    """{"entries": top-level menu (entries and submenus, nested), "defaults": the ``set default=`` values
    written outside any entry, in order}. An entry has kind, title, id, children, kernel and args (the
    words after the kernel path of its first linux/linux16/linuxefi line)."""
    top = {"children": []}
    stack, defaults = [top], []
    for raw in text.splitlines():
        words = grub_words(raw.strip())
        if not words:
            continue
        head = words[0]
        if head == "}":
            if len(stack) > 1:
                stack.pop()
            continue
        if head in ("menuentry", "submenu") and words[-1] == "{":
            node = {"kind": "submenu" if head == "submenu" else "entry", "title": words[1] if len(words) > 2 else "",
                    "id": _entry_id(words[2:-1]), "children": [], "kernel": None, "args": None}
            container = next(n for n in reversed(stack) if n is not None)
            container["children"].append(node)
            stack.append(node)
            continue
        if words[-1] == "{":
            stack.append(None)                      # function and other blocks
            continue
        inside = [n for n in stack[1:] if n is not None]
        if not inside and head == "set" and len(words) > 1 and words[1].startswith("default="):
            defaults.append(words[1][len("default="):])
        elif inside and head in ("linux", "linux16", "linuxefi") and len(words) > 1 and inside[-1]["kernel"] is None:
            inside[-1]["kernel"], inside[-1]["args"] = words[1], words[2:]
    return {"entries": top["children"], "defaults": defaults}


def parse_grubenv(text):
    """Variables of a grubenv block (grub-editenv's format: name=value lines, ``\\`` and newline escaped)."""
    out = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        out[name] = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)
    return out


def _resolve(nodes, parts):
    part = parts[0]
    node = None
    if re.match(r"^[0-9]+$", part):
        node = nodes[int(part)] if int(part) < len(nodes) else None
    else:
        node = next((n for n in nodes if part in (n["title"], n["id"])), None)
    if node is None:
        return None
    if node["kind"] == "submenu":
        return _resolve(node["children"], parts[1:] or ["0"]) if node["children"] else None
    return node


def default_entry(cfg, env, warnings=None):
    """(entry, spec): the entry GRUB boots by default and the default it resolved.

    The standard header sets ``default`` to grubenv's ``next_entry`` when set
    (grub-reboot), else to GRUB_DEFAULT (``${saved_entry}`` for ``saved``). A
    number counts entries of the menu, a title or id names one, ``>`` walks
    into submenus; a default that names nothing falls back to the first entry,
    as GRUB does.
    """
    warnings = warnings if warnings is not None else []
    if env.get("next_entry"):
        spec = env["next_entry"]
    else:
        values = [v for v in cfg["defaults"] if v not in ("${next_entry}", "$next_entry")]
        spec = values[-1] if values else "0"
        if spec in ("${saved_entry}", "$saved_entry"):
            spec = env.get("saved_entry", "")
        elif "$" in spec:
            warnings.append("grub.cfg sets default=%s, which this module cannot resolve; the first entry is assumed" % spec)
            spec = "0"
    spec = spec or "0"
    entry = _resolve(cfg["entries"], spec.split(">"))
    if entry is None:
        if spec != "0":
            warnings.append("the default entry %r is not in grub.cfg; GRUB falls back to the first entry" % spec)
        entry = _resolve(cfg["entries"], ["0"]) if cfg["entries"] else None
    return entry, spec


def next_boot(root, warnings):
    """(parameters after the kernel path of the default entry, entry title) from grub.cfg, or (None, None)."""
    try:
        text = read_text(root, GRUB_CFG)
    except (IOError, OSError):
        warnings.append("%s is missing: the next boot's command line is not known" % GRUB_CFG)
        return None, None
    try:
        env = parse_grubenv(read_text(root, GRUBENV))
    except (IOError, OSError):
        env = {}
    entry, _spec = default_entry(parse_grub_cfg(text), env, warnings)
    if entry is None or entry["args"] is None:
        warnings.append("%s has no linux line for the default entry%s" % (
            GRUB_CFG, " %r" % entry["title"] if entry else ""))
        return None, entry["title"] if entry else None
    return list(entry["args"]), entry["title"]
