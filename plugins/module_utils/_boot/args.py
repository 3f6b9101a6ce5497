# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel parameters as the kernel reads them: split a command line, name a parameter, check the module's input.

Private module_utils of gpunode.tuning (the kernel_cmdline module), standard
library only, no Ansible imports.

* :func:`split_cmdline` splits as the kernel's ``next_arg()`` (lib/cmdline.c)
  does: blanks separate parameters, double quotes group (and are kept here, so
  a parameter can be written back byte for byte);
* :func:`param_key` is the name the kernel matches on: the text before the
  first ``=``, with ``-`` and ``_`` the same (``parameq()`` in kernel/params.c);
* :func:`parse_parameters` checks the ``parameters`` option before anything is
  read or written: characters, empty or repeated keys, and the CPU lists and
  flags of ``isolcpus=``, ``nohz_full=``, ``rcu_nocbs=`` and ``irqaffinity=``
  (Documentation/admin-guide/kernel-parameters.txt).
"""

from __future__ import annotations

import collections
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import MAX_CPUS, CpuListError, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_kernel_param

MANAGED_BY = "gpunode.tuning.kernel_cmdline"
# Parameters whose value is a CPU list (kernel-parameters.txt: "[KNL] ... <cpu list>").
CPULIST_KEYS = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity")
# isolcpus=[flag-list,]<cpu-list>: the flags housekeeping_isolcpus_setup() knows.
ISOLCPUS_FLAGS = ("nohz", "domain", "managed_irq")
# rcu_nocbs may stand alone (every CPU may be offloaded); the others need a value.
BARE_ALLOWED = ("rcu_nocbs",)
# /proc/cmdline parameters that name the boot, not a kernel setting: BOOT_IMAGE= (GRUB) and initrd= (EFI stub).
BOOT_KEYS = ("BOOT_IMAGE", "initrd")


class KernelCmdlineError(DetailedError):
    """Bad input or a configuration this module cannot change safely; ``details`` names the value or path."""


Param = collections.namedtuple("Param", "key text name value")


def split_cmdline(text):
    """Parameters of a kernel command line, split as the kernel does (blanks outside double quotes)."""
    tokens, cur, quoted = [], [], False
    for char in text or "":
        if char == '"':
            quoted = not quoted
        elif char.isspace() and not quoted:
            if cur:
                tokens.append("".join(cur))
                cur = []
            continue
        cur.append(char)
    if cur:
        tokens.append("".join(cur))
    return tokens


def token_spans(text):
    """(start, end) of every parameter in ``text``, split as :func:`split_cmdline` splits."""
    spans, start, quoted = [], None, False
    for pos, char in enumerate(text):
        if char.isspace() and not quoted:
            if start is not None:
                spans.append((start, pos))
                start = None
            continue
        if start is None:
            start = pos
        if char == '"':
            quoted = not quoted
    if start is not None:
        spans.append((start, len(text)))
    return spans


def norm(token):
    """A parameter as the kernel sees it: the double quotes only group, they are not part of the value."""
    return token.replace('"', "")


# A managed key the module keeps OFF the command line (the ``remove`` option) is recorded as ``!key``.
REMOVED = "!"


def is_removal(token):
    """Whether a managed token stands for "this key is taken out" rather than a parameter to set."""
    return token.startswith(REMOVED)


def param_key(token):
    """The name the kernel matches a parameter on: before the first ``=``, with ``-`` read as ``_`` (a ``!key``
    removal record has the key's name)."""
    return norm(token)[len(REMOVED):].split("=", 1)[0].replace("-", "_") if is_removal(token) else \
        norm(token).split("=", 1)[0].replace("-", "_")


def parse_removals(values):
    """The ``remove`` option (keys, no values) as :class:`Param` records with the text ``!key``."""
    params = parse_parameters(values, check_values=False, option="remove")
    for index, param in enumerate(params):
        if param.value is not None or is_removal(param.text):
            raise KernelCmdlineError("remove[%d] %s: remove takes keys only; expected a key such as processor.max_cstate"
                                     % (index, _show(param.text)), option="remove", value=param.text,
                                     expected="a key without =")
    return [Param(p.key, REMOVED + p.name, p.name, None) for p in params]


def comparable(tokens):
    """Parameters for comparing two command lines: quotes dropped, BOOT_IMAGE= and initrd= left out."""
    return [norm(t) for t in tokens if param_key(t) not in BOOT_KEYS]


def _fail(index, text, why, expected, option="parameters", **extra):
    raise KernelCmdlineError("%s[%d] %s: %s; expected %s" % (option, index, _show(text), why, expected),
                             option=option, value=text, expected=expected, **extra)


def _show(text):
    return '"%s"' % text.encode("unicode_escape").decode("ascii").replace('"', '\\"')


def _check_cpulist(index, text, key, cpus):
    expected = "%s=<CPU list> such as %s=2-3,8" % (key, key)
    if cpus.strip() == "":
        _fail(index, text, "the CPU list is empty", expected)
    try:
        # Syntax as the kernel's cpulist_parse takes it, N (last CPU) and all included: the node that boots with
        # this line has its own CPU count, so CPU numbers are bounded by the largest the kernel supports.
        parse_cpulist(cpus, ncpus=MAX_CPUS)
    except CpuListError as exc:
        _fail(index, text, "%r is not a CPU list (%s)" % (cpus, exc), expected)


def _check_isolcpus(index, text, value):
    items = value.split(",")
    flags = []
    while items and re.match(r"[A-Za-z_]+\Z", items[0]):
        flags.append(items.pop(0))
    bad = [flag for flag in flags if flag not in ISOLCPUS_FLAGS]
    if bad:
        _fail(index, text, "isolcpus flag %r is not one the kernel knows" % bad[0],
              "isolcpus=[flag,...,]<CPU list> with flags from %s (kernel-parameters.txt)" % ", ".join(ISOLCPUS_FLAGS),
              flag=bad[0], flags=list(ISOLCPUS_FLAGS))
    if not items:
        _fail(index, text, "isolcpus has flags but no CPU list", "isolcpus=[flag,...,]<CPU list> such as isolcpus=domain,managed_irq,2-3")
    _check_cpulist(index, text, "isolcpus", ",".join(items))


def parse_parameters(values, check_values=True, option="parameters"):
    """The ``parameters`` option (or ``option``: remove) as a list of :class:`Param`; raises KernelCmdlineError
    naming the first bad entry.

    ``check_values`` is False for state=absent, where only the keys matter: the
    characters and keys are checked, the CPU lists and flags are not.
    """
    if not isinstance(values, (list, tuple)):
        raise KernelCmdlineError("%s %r: expected a list of key=value or flag strings" % (option, values),
                                 option=option, value=values, expected="a list of strings")
    out, seen = [], {}
    for index, text in enumerate(values):
        if not isinstance(text, str):
            _fail(index, repr(text), "not a string", "a string key=value or flag", option)
        if text == "":
            _fail(index, text, "empty", "key=value or a flag such as nohz_full=2-3", option)
        try:
            # The one rule of kernel parameters (_validate): no blanks, quotes, shell or GRUB metacharacters, no #.
            check_kernel_param("%s[%d]" % (option, index), text[len(REMOVED):] if is_removal(text) else text)
        except InputError as exc:
            raise KernelCmdlineError(str(exc), **dict(exc.details, option=option))
        name, sep, value = text.partition("=")
        if name == "":
            _fail(index, text, "the key is empty", "key=value or a flag such as nohz_full=2-3", option)
        key = name.replace("-", "_")
        if key in seen:
            _fail(index, text, "key %s is already given by %s[%d] %s" % (name, option, seen[key], _show(values[seen[key]])),
                  "each key once", option, duplicate_of=seen[key])
        seen[key] = index
        if check_values and key in CPULIST_KEYS:
            if not sep and key not in BARE_ALLOWED:
                _fail(index, text, "%s needs a CPU list" % name, "%s=<CPU list> such as %s=2-3" % (name, name))
            if sep:
                if key == "isolcpus":
                    _check_isolcpus(index, text, value)
                else:
                    _check_cpulist(index, text, name, value)
        out.append(Param(key, text, name, value if sep else None))
    return out


def merge(previous, params, state):
    """(managed, released): key -> parameter the module manages after this run, and the keys it gives up.

    ``previous`` are the parameters of the marker, in order. state=present adds
    ``params`` (a key already managed keeps its place, with the new value);
    state=absent removes the keys named.
    """
    managed = collections.OrderedDict((param_key(t), t) for t in previous)
    released = []
    for param in params:
        if state == "present":
            managed[param.key] = param.text
        elif param.key in managed:
            del managed[param.key]
            released.append(param.key)
    return managed, released
