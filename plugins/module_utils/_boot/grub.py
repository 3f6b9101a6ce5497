# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel parameters through GRUB's /etc/default/grub (Debian and Ubuntu: update-grub): the files and the plan.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

* The configured command line is what grub-mkconfig builds: it sources
  /etc/default/grub, then every /etc/default/grub.d/*.cfg in glob order (the
  loop in Debian's grub-mkconfig, grub2 2.06-13+deb12u2, lines 160-167;
  :func:`config_files`), and 10_linux passes
  "${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}" to the normal entries.
  Evaluating those files (/bin/sh on the live system, Python on a captured
  tree) is ``_boot.grub_eval``'s.
* The module's parameters live in one drop-in that appends to
  GRUB_CMDLINE_LINUX. A managed key found in an earlier file is removed from the
  assignment line that sets it, that token only (:func:`remove_keys`), and the
  line is recorded so that it can be put back byte for byte (:func:`plan`).
* The next boot's ``linux`` line in the generated grub.cfg is read by
  ``_boot.grub_cfg``.
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
    token_spans,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.grub_eval import VARIABLES, _read, check_syntax, configured, evaluate
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import rooted

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
DROPIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\.cfg\Z")
DROPIN_HEADER = (
    "# Managed by gpunode.tuning (kernel_cmdline module): local changes are overwritten.\n"
    "# Kernel parameters for the next boot, appended to GRUB_CMDLINE_LINUX. What this module removed from the\n"
    "# files sourced before it is recorded in %s and put back by state=absent.\n"
)


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


def _record(path, var, idx, before, after, removed):
    for text in (before, after):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise KernelCmdlineError("%s line %d is not UTF-8 text: this module does not edit it; move the managed "
                                     "parameters out of it by hand" % (path, idx + 1), path=path, line=idx + 1)
    return {"file": path, "variable": var, "line": idx + 1, "before": before, "after": after, "removed": removed}


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
