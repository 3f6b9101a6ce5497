# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel parameters through grubby (the RHEL family, Boot Loader Specification entries), for kernel_cmdline.

Private module_utils of gpunode.tuning, standard library only, no Ansible imports.

* :func:`parse_info` reads ``grubby --info=...``: blocks that start with
  ``index=``, with ``kernel=``, ``args="..."``, ``root=``, ``initrd=``,
  ``title=`` and ``id=`` (values quoted by the BLS grubby of RHEL 8 and later,
  bare by the older C grubby, which also prints ``non linux entry``);
* :func:`plan_present` and :func:`plan_absent` decide the ``grubby
  --update-kernel=... --remove-args=... --args=...`` calls and what the marker
  keeps: per kernel, the tokens a managed key had before this module first set
  it, so that state=absent puts them back.
"""

from __future__ import annotations

import collections

from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import (
    KernelCmdlineError,
    is_removal,
    norm,
    param_key,
    split_cmdline,
)

GRUBBY = "grubby"
FIELDS = ("kernel", "args", "root", "initrd", "title", "id")


def parse_info(text):
    """Entries of ``grubby --info`` output: dicts with index, linux (False for "non linux entry") and FIELDS."""
    entries, cur = [], None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("index="):
            try:
                index = int(line[len("index="):])
            except ValueError:
                raise KernelCmdlineError("grubby --info printed %r: expected index=<number>" % line, value=line)
            cur = dict((f, None) for f in FIELDS)
            cur.update(index=index, linux=True)
            entries.append(cur)
        elif cur is not None and line == "non linux entry":
            cur["linux"] = False
        elif cur is not None and "=" in line:
            key, value = line.split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if key in FIELDS:
                cur[key] = value
    return entries


def entry_tokens(entry):
    return split_cmdline(entry.get("args") or "")


def boot_tokens(entry):
    """What the entry passes to the kernel after the image: root= (grubby prints it apart) and the args."""
    tokens = entry_tokens(entry)
    if entry.get("root") and not any(param_key(t) == "root" for t in tokens):
        tokens.insert(0, "root=%s" % entry["root"])
    return tokens


def _have(tokens, key):
    return [t for t in tokens if param_key(t) == key]


def _same(a, b):
    return [norm(t) for t in a] == [norm(t) for t in b]


def read(run):
    """(linux entries of --info=ALL, the default entry) through grubby; raises KernelCmdlineError."""
    rc, out, err = run([GRUBBY, "--info=ALL"])
    if rc != 0:
        raise KernelCmdlineError("grubby --info=ALL failed (rc %d): %s" % (rc, (err or out).strip()), command="grubby --info=ALL")
    entries = [e for e in parse_info(out) if e["linux"] and e["kernel"]]
    if not entries:
        raise KernelCmdlineError("grubby --info=ALL lists no Linux boot entry", command="grubby --info=ALL", value=out)
    rc, out, err = run([GRUBBY, "--default-kernel"])
    kernel = (out or "").strip()
    if rc != 0 or not kernel:
        raise KernelCmdlineError("grubby --default-kernel failed (rc %d): %s" % (rc, (err or out).strip() or "no output"),
                                 command="grubby --default-kernel")
    default = next((e for e in entries if e["kernel"] == kernel), None)
    if default is None:
        raise KernelCmdlineError("grubby --default-kernel names %s, which no entry of --info=ALL has" % kernel, value=kernel)
    return entries, default


def command(target, remove, add):
    argv = [GRUBBY, "--update-kernel=%s" % target]
    if remove:
        argv.append("--remove-args=%s" % " ".join(remove))
    if add:
        argv.append("--args=%s" % " ".join(add))
    return argv


def _dedup(tokens):
    out = []
    for token in tokens:
        if token not in out:
            out.append(token)
    return out


def plan_present(entries, managed, previous):
    """(commands, previous, after): the grubby call that gives every entry each managed key once with its value,
    the marker's per-kernel record of what the keys were before, and each entry's args after (by kernel).

    One ``--update-kernel=ALL`` call: grubby removes first (the tokens of a
    managed key with another value), then adds (replacing a key in place, else
    appending), so a key ends up once.
    """
    previous = dict((k, dict(v)) for k, v in previous.items())
    remove, add, after = [], [], {}
    for entry in entries:
        tokens = entry_tokens(entry)
        record = previous.setdefault(entry["kernel"], {})
        gone, new = [], []
        for key, token in managed.items():
            have = _have(tokens, key)
            record.setdefault(key, have)
            if is_removal(token):
                gone += have
                continue
            if not _same(have, [token]):
                gone += [t for t in have if norm(t) != norm(token)]
                new.append(token)
        remove += gone
        add += new
        kept = [t for t in tokens if t not in gone]
        after[entry["kernel"]] = kept + [t for t in new if norm(t) not in [norm(k) for k in kept]]
    add = [t for t in managed.values() if t in add and not is_removal(t)]
    commands = [command("ALL", _dedup(remove), add)] if add or remove else []
    return commands, previous, after


def plan_absent(entries, released, set_before, previous, warnings):
    """(commands, previous, after) for the keys this run stops managing: where an entry still has the value
    this module set (``set_before``: key -> parameter), the recorded tokens come back."""
    previous = dict((k, dict(v)) for k, v in previous.items())
    ops, after = collections.OrderedDict(), {}
    for entry in entries:
        tokens = entry_tokens(entry)
        record = previous.get(entry["kernel"], {})
        remove, add = [], []
        for key in released:
            have, ours, before = _have(tokens, key), set_before[key], list(record.get(key, []))
            if is_removal(ours) and not have:
                add += before
            elif _same(have, [ours]):
                remove += have
                add += before
            elif not _same(have, before):
                warnings.append("grubby entry %s: %s is %s, not %s as this module set it; left as it is" % (
                    entry["kernel"], key, " ".join(have) or "not set", ours))
        for key in released:
            record.pop(key, None)
        if not record:
            previous.pop(entry["kernel"], None)
        if remove or add:
            ops[entry["kernel"]] = (remove, add)
        kept = [t for t in tokens if t not in remove]
        after[entry["kernel"]] = kept + [t for t in add if t not in kept]
    groups = set((tuple(r), tuple(a)) for r, a in ops.values())
    if len(ops) == len(entries) and len(groups) == 1:
        remove, add = next(iter(groups))
        commands = [command("ALL", list(remove), list(add))]
    else:
        commands = [command(kernel, remove, add) for kernel, (remove, add) in ops.items()]
    return commands, previous, after


def verify(entries, managed, released, after, warnings):
    """Failures (strings) where grubby did not leave what was planned: each managed key once with its value, and
    for released keys the planned args."""
    problems = []
    for entry in entries:
        tokens = entry_tokens(entry)
        for key, token in managed.items():
            if is_removal(token):
                if _have(tokens, key):
                    problems.append("%s: %s is still there, removed by this module" % (entry["kernel"], " ".join(_have(tokens, key))))
                continue
            if not _same(_have(tokens, key), [token]):
                problems.append("%s: %s instead of %s" % (entry["kernel"], " ".join(_have(tokens, key)) or "no %s" % key, token))
        planned = after.get(entry["kernel"])
        for key in released:
            if planned is not None and not _same(_have(tokens, key), _have(planned, key)):
                problems.append("%s: %s instead of %s" % (entry["kernel"], " ".join(_have(tokens, key)) or "no %s" % key,
                                                          " ".join(_have(planned, key)) or "no %s" % key))
    return problems
