# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT as grub-mkconfig gets them by sourcing its files.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

On the live system (root /) :func:`evaluate` runs the same sourcing as
grub-mkconfig with /bin/sh (a fixed script; the files are its arguments):
these are the files update-grub sources as root right after, and
:func:`check_syntax` runs ``sh -n`` on each. On a captured tree (``run``
None) no process runs at all: :func:`evaluate_tree` reads the assignment
subset in Python, never runs a command substitution, and fails naming the
file and line for anything else (the notes before it). :func:`configured`
gives the parameters of a normal entry from the two values.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import KernelCmdlineError, split_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import rooted

VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
SH = "/bin/sh"

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


def read_text(root, path):
    with open(rooted(root, path), "rb") as handle:
        return handle.read().decode("utf-8", "surrogateescape")


def _read(root, path):
    try:
        return read_text(root, path)
    except (IOError, OSError) as exc:
        raise KernelCmdlineError("cannot read %s: %s" % (path, exc), path=path)


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
