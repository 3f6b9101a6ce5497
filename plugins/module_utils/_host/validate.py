# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one validator of every option string that may reach a file that root runs or parses.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports, no feature imports (a later redesign moves it into a host layer).

* :func:`check_params` walks a module's ``argument_spec`` (``str``, ``path``,
  ``raw``, lists of them, dict suboptions) and checks EVERY string with a named
  rule of :data:`RULES`: ``path`` options with the path rule, ``str`` options
  with the safe-word rule, unless the module names another rule for the option
  in ``special`` (``{"temp_patterns": "fnmatch", "irqbalance.policy_script":
  "path"}``). Modules call :func:`validate_module` first thing in ``main()``,
  before anything is read or written.
* :func:`check_own_file` refuses a file a module would write (or remove) as its
  own when something else is there: a symlink, a non-regular file, or a regular
  file without the module's marker.

Every regular expression here is anchored with ``\\Z`` (``$`` also matches
before one trailing newline). Every failure is an :class:`InputError` whose
``details`` name the option, the value and what was expected. An empty string
passes every rule: the modules use ``""`` for "not set" and check it themselves.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

# The conservative character set of a word and of a path: no blanks, quotes, shell or GRUB metacharacters, and no
# % (a specifier in systemd unit files, a substitution in udev rules).
WORD_CHARS = "A-Za-z0-9._@+=:,-"
_WORD = re.compile(r"[%s]+\Z" % WORD_CHARS)
_PATH = re.compile(r"[%s/]+\Z" % WORD_CHARS)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# POSIX portable user names (3.437), plus the trailing $ of machine accounts that useradd accepts.
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}\$?\Z")
_MODE = re.compile(r"0?[0-7]{3,4}\Z")
# A CPU list as the kernel writes it (0-3,8; 0-15:2/4), blanks after commas tolerated.
_CPULIST = re.compile(r"[0-9][0-9,:/ -]*\Z")
# fnmatch patterns of file names: no directory separator, no blanks or shell characters beside * ? [ ] !.
_FNMATCH = re.compile(r"[A-Za-z0-9._@%+=:,*?\[\]!-]+\Z")
# systemd's unit-name.c VALID_CHARS plus @; the suffix is checked apart.
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+\.(service|socket|device|mount|automount|swap|target|path|timer|slice|scope)\Z")
UNIT_NAME_MAX = 255
# A drop-in or generated file name: starts with a letter or digit, no separator.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
# systemd.time(7) parse_sec(): numbers (decimals allowed) each with an optional unit, separated by spaces.
_SPAN_UNITS = ("usec", "us", "\u00b5s", "msec", "ms", "seconds", "second", "sec", "s", "minutes", "minute", "min",
               "months", "month", "M", "years", "year", "y", "weeks", "week", "w", "days", "day", "d", "hours", "hour",
               "hr", "h", "m")
_SPAN = re.compile(r"(?:[0-9]+(?:\.[0-9]+)? ?(?:%s)? *)+\Z" % "|".join(_SPAN_UNITS))
# A kernel parameter's key (module.param, dashes and underscores the same); the value is checked by characters.
_KPARAM_KEY = re.compile(r"[A-Za-z0-9_.-]+\Z")
# Refused in a kernel parameter besides blanks and control characters. The drop-in is sourced by /bin/sh inside
# double quotes ($ ` \ " end or expand there), grub.cfg is read by GRUB's script lexer (' " ; | & < > are its
# metacharacters, # starts a comment that drops the rest of the line) and grubby passes arguments through sed.
KPARAM_FORBIDDEN = "\"'$`\\;|&<>#"
KPARAM_FORBIDDEN_TEXT = "blanks, quotes, $, backticks, backslashes, ;, |, &, <, > or #"
# A container image reference or an enroot container name: registry/name:tag@digest.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+:/-]*\Z")
# A CDI kind, vendor/class (CDI spec: vendor a domain-like name, class a name).
_CDI_KIND = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")


class InputError(DetailedError):
    """An option value refused by a rule; ``details``: option, value, expected."""


def has_control(value):
    """Whether ``value`` has a control character (C0, DEL): newline, TAB, NUL..."""
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


_control = has_control


def _show(value):
    return repr(value)


def _fail(option, value, why, expected):
    raise InputError("%s %s: %s; expected %s" % (option, _show(value), why, expected),
                     option=option, value=value, expected=expected)


def _chars(option, value, pattern, expected, why="not of the expected form"):
    if not value.strip():
        _fail(option, value, "it is empty (blanks only)", expected)
    if _control(value):
        _fail(option, value, "a control character (newline, TAB, NUL...) is not allowed", expected)
    if not pattern.match(value) and (any(c.isspace() and c != " " for c in value)
                                     or (" " in value and pattern.match(value.replace(" ", "a")))):
        _fail(option, value, "whitespace is not allowed", expected)
    if not pattern.match(value):
        bad = [c for c in value if not pattern.match(c)] if pattern in (_WORD, _PATH) else []
        _fail(option, value, "%r is not allowed" % bad[0] if bad else why, expected)


# -------------------------------------------------------------------- rules --

def check_path(option, value):
    """An absolute, normalised path of word characters: no blanks, quotes, shell characters, //, . or .."""
    expected = "an absolute path, normalised, of letters, digits and ._@+=:,-/ (no whitespace, quotes, //, . or ..)"
    if not value.startswith("/"):
        _fail(option, value, "not absolute: a relative path is refused (it would resolve against the working "
              "directory)", expected)
    _chars(option, value, _PATH, expected)
    if "//" in value:
        _fail(option, value, "// is refused", expected)
    if any(part in (".", "..") for part in value.split("/")):
        _fail(option, value, "a . or .. component is refused", expected)


def check_word(option, value):
    """A safe word: letters, digits and ._@%+=:,- only (no blanks, control or shell characters, no /)."""
    _chars(option, value, _WORD, "letters, digits and ._@%+=:,- only (no blanks, quotes, / or shell characters)")


def check_identifier(option, value):
    """A plain identifier: a letter or _ then letters, digits, _."""
    _chars(option, value, _IDENTIFIER, "an identifier (a letter or _, then letters, digits or _)")


def check_user(option, value):
    """A user or group name (POSIX portable, as useradd/groupadd take it) or a numeric id."""
    expected = "a user or group name (letters, digits, ._-, not starting with -) or a numeric id"
    _chars(option, value, _USER, expected)


def check_mode(option, value):
    """An octal mode such as 0750."""
    _chars(option, value, _MODE, "an octal mode such as 0750")


def check_cpulist(option, value):
    """A CPU list such as 0-3,8 (digits, ``,``, ``-``, ``:`` and ``/`` only)."""
    _chars(option, value, _CPULIST, "a CPU list such as 0-3,8", "is not a CPU list")


def check_fnmatch(option, value):
    """A file-name pattern such as ``*.tmp``: word characters and * ? [ ] !, no /."""
    _chars(option, value, _FNMATCH, "a file-name pattern such as *.tmp (letters, digits, ._@%+=:,- and *?[]!)")


def check_unit(option, value):
    """A systemd unit name with its suffix (``name.slice``, ``init.scope``, ``foo@bar.service``)."""
    expected = "a systemd unit name such as system.slice (letters, digits and :_.\\@- with a unit suffix)"
    stem, dot, suffix = value.rpartition(".")
    if not dot or not _UNIT.match("x." + suffix):
        _fail(option, value, "it does not end in a unit suffix (.slice, .scope, .service...)", expected)
    if not stem:
        _fail(option, value, "it has nothing before .%s" % suffix, expected)
    if _control(value) or not _UNIT.match(value):
        _fail(option, value, "it has characters systemd does not allow in a unit name", expected)
    if len(value) > UNIT_NAME_MAX:
        _fail(option, value, "longer than %d characters" % UNIT_NAME_MAX, expected)


def check_file_name(option, value):
    """A file name (a drop-in, a prefix): a letter or digit, then letters, digits and _.+-; no /."""
    expected = "a file name of letters, digits and _.+- starting with a letter or digit"
    _chars(option, value, _FILE_NAME, expected)
    if len(value) > 255:
        _fail(option, value, "longer than 255 bytes", expected)


def check_timespan(option, value):
    """A systemd time span as systemd parses it (``30s``, ``5min``, ``1min 5s``, ``1h 30min``); blanks are spaces."""
    _chars(option, value, _SPAN, "a systemd time span such as 30s, 5min or 1min 5s (units of systemd.time(7))",
           "is not a systemd time span")


def check_kernel_param(option, value):
    """A kernel parameter ``key[=value]``: printable ASCII, a key of letters, digits, ``_.-``, and none of
    :data:`KPARAM_FORBIDDEN` (quotes, shell and GRUB metacharacters, ``#``)."""
    expected = "key=value or a flag without %s (printable ASCII)" % KPARAM_FORBIDDEN_TEXT
    bad = [c for c in value if c in KPARAM_FORBIDDEN or not ("!" <= c <= "~")]
    if bad:
        why = "a blank or control character" if not ("!" <= bad[0] <= "~") else "%r" % bad[0]
        message = "%s %s: %s is not allowed in a kernel parameter; expected %s" % (option, _show(value), why, expected)
        raise InputError(message, option=option, value=value, expected=expected, character=bad[0])
    key = value.split("=", 1)[0]
    if key and not _KPARAM_KEY.match(key):
        _fail(option, value, "the key %s is not a parameter name" % _show(key),
              "a key of letters, digits and _.- (such as nohz_full or processor.max_cstate)")


def check_shell_word(option, value):
    """A word a shell passes through unchanged, unquoted (the safe-word set plus /)."""
    _chars(option, value, _PATH, "letters, digits and ._@+=:,-/ only (a word the shell leaves as it is)")


def check_cidr(option, value):
    """An IPv4 or IPv6 address or network (``10.0.0.0/24``, ``fd00::1``)."""
    expected = "an IP address or network such as 10.0.0.0/24"
    _chars(option, value, _PATH, expected)
    try:
        ipaddress.ip_interface(value)
    except ValueError:
        _fail(option, value, "not an IP address or network", expected)


def check_image(option, value):
    """A container image (``docker.io/library/busybox:1.36``) or an enroot container name."""
    expected = "an image reference such as docker.io/library/busybox:1.36 or an enroot container name"
    _chars(option, value, _IMAGE, expected)
    if any(part in (".", "..") for part in value.split("/")) or "//" in value:
        _fail(option, value, "empty, . or .. components are refused", expected)


def check_cdi_kind(option, value):
    """A CDI kind ``vendor/class`` such as gpunode.io/nccl."""
    _chars(option, value, _CDI_KIND, "vendor/class such as gpunode.io/nccl")


def check_keyword_or_path(option, value):
    """A keyword (``auto``, ``never``) or, starting with /, a path (the path rule)."""
    if value.startswith("/"):
        check_path(option, value)
    else:
        check_word(option, value)


def check_regex(option, value):
    """A regular expression matched inside the module (never written to a file): no control characters, compiles."""
    expected = "a Python regular expression without control characters"
    if _control(value):
        _fail(option, value, "a control character (newline, TAB, NUL...) is not allowed", expected)
    try:
        re.compile(value)
    except re.error as exc:
        _fail(option, value, "not a regular expression (%s)" % exc, expected)


def check_text(option, value):
    """Free text (a file's content, a log): any character but NUL and the C0 controls other than TAB, LF and CR."""
    if any((ord(c) < 32 and c not in "\t\n\r") or ord(c) == 127 for c in value):
        _fail(option, value, "a control character other than TAB, LF or CR is not allowed",
              "text without NUL or control characters")


RULES = {
    "path": check_path,
    "word": check_word,
    "identifier": check_identifier,
    "user": check_user,
    "mode": check_mode,
    "cpulist": check_cpulist,
    "fnmatch": check_fnmatch,
    "unit": check_unit,
    "file_name": check_file_name,
    "timespan": check_timespan,
    "kernel_param": check_kernel_param,
    "shell_word": check_shell_word,
    "cidr": check_cidr,
    "image": check_image,
    "cdi_kind": check_cdi_kind,
    "keyword_or_path": check_keyword_or_path,
    "regex": check_regex,
    "text": check_text,
}


def check(rule, option, value):
    """Check one string ``value`` of ``option`` with the named ``rule``; "" passes (unset)."""
    if value == "":
        return
    RULES[rule](option, value)


def is_valid(rule, value, option="value"):
    """Whether ``value`` passes the named ``rule`` (for code that words its own error); "" does not."""
    try:
        RULES[rule](option, value)
    except InputError:
        return False
    return True


def _check_value(option, value, rule):
    if isinstance(value, str):
        check(rule, option, value)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if isinstance(item, str):
                check(rule, "%s[%d]" % (option, index), item)


def check_params(params, argument_spec, special=None, prefix="", key_prefix=""):
    """Check every string of ``params`` (as AnsibleModule converted them) against ``argument_spec``.

    ``special`` maps an option (``name`` or ``parent.name`` for suboptions) to a
    rule name of :data:`RULES`; without an entry a ``path`` option takes the
    path rule and any other string the word rule. Raises InputError naming the
    first offending option.
    """
    special = special or {}
    unknown = [name for name in special if special[name] not in RULES]
    if unknown:
        raise ValueError("unknown rule for %s: %s" % (unknown[0], special[unknown[0]]))
    for name, spec in argument_spec.items():
        option = prefix + name  # as the error names it (list items with their index)
        key = key_prefix + name  # as ``special`` names it (parent.name)
        value = (params or {}).get(name)
        if value is None:
            continue
        kind = spec.get("type", "str")
        elements = spec.get("elements")
        if spec.get("options"):
            items = value if kind == "list" else [value]
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    sub = "%s[%d]." % (option, index) if kind == "list" else option + "."
                    check_params(item, spec["options"], special, sub, key + ".")
            continue
        if kind == "path" or (kind == "list" and elements == "path"):
            rule = special.get(key, "path")
        elif kind in ("str", "raw") or (kind == "list" and elements in ("str", None)):
            rule = special.get(key, "word")
        else:
            continue
        _check_value(option, value, rule)


def validate_module(module, argument_spec, special=None):
    """:func:`check_params` on ``module.params``; fails the module naming the option, value and what was expected."""
    try:
        check_params(module.params, argument_spec, special)
    except InputError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)


# ---------------------------------------------------------------- own files --

def check_own_file(option, path, marker, limit=65536):
    """Refuse writing (or removing) ``path`` as the module's own unless it is absent or the module's own.

    ``marker``: text the module's file carries in its first ``limit`` bytes
    (its "Managed by gpunode.tuning" header), or a callable taking the bytes and
    answering whether they are the module's. Symlinks and non-regular files are
    always refused. Returns "absent" or "own"; raises InputError otherwise.
    """
    expected = "a path where nothing exists yet or a file this module wrote (with its marker)"
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "absent"  # nothing there (a file where a parent directory should be fails the write, rolled back)
    except OSError as exc:
        raise InputError("%s %s cannot be inspected: %s" % (option, path, exc.strerror), option=option, value=path,
                         expected=expected)
    if stat.S_ISLNK(st.st_mode):
        raise InputError("%s %s is a symlink: refusing to write through it" % (option, path), option=option, value=path,
                         expected=expected)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("%s %s exists and is not a regular file: refusing to replace it" % (option, path),
                         option=option, value=path, expected=expected)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            data = os.read(fd, limit)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InputError("%s %s cannot be read: %s" % (option, path, exc.strerror), option=option, value=path,
                         expected=expected)
    if callable(marker):
        own = marker(data)
    else:
        own = (marker.encode("utf-8") if isinstance(marker, str) else marker) in data
    if not own:
        raise InputError("%s %s exists and is not this module's file (no %s marker): refusing to overwrite it"
                         % (option, path, "gpunode.tuning" if callable(marker) else repr(marker)), option=option,
                         value=path, expected=expected)
    return "own"
