# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The generated grub.cfg and grubenv: the entry GRUB boots by default and that entry's ``linux`` line.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

:func:`parse_grub_cfg` and :func:`default_entry` read the next boot's
``linux`` line from grub.cfg the way GRUB picks the default entry (number,
title or id, ``>`` paths into submenus, ``saved`` and ``next_entry`` from
grubenv); :func:`next_boot` does it for the files under a root.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._boot.grub_eval import read_text

GRUB_CFG = "/boot/grub/grub.cfg"
GRUBENV = "/boot/grub/grubenv"


# --------------------------------------------------------------- grub.cfg --

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
