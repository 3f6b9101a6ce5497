# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The library the collection installs on a node for the code that runs there without Ansible.

Standard library only. A boot-time entry point (the NIC IRQ pins' ``_nic_irq.pin_cli``) or a service (the
checkpoint copier's ``_checkpoint.cli``) runs the collection's own module_utils, installed as a package tree under
a lib dir: :func:`library_files` is the import closure of the entry module, found by reading each file's imports
(``tests/unit/test_layers.py`` holds the reading equal to Python's own parser), plus the empty package markers. A
manifest lists what was installed, so that pruning and removal only ever touch files the collection put there
(the lib dir may be shared); :func:`bytecode_of` names the ``__pycache__`` files Python wrote for them.
"""

from __future__ import annotations

import json
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import rooted

PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"
PKG_DIR = PKG.replace(".", "/")
INIT_DIRS = [
    "ansible_collections",
    "ansible_collections/gpunode",
    "ansible_collections/gpunode/tuning",
    "ansible_collections/gpunode/tuning/plugins",
    "ansible_collections/gpunode/tuning/plugins/module_utils",
]
MANIFEST = ".gpunode-tuning-installed.json"

# ``from <PKG>._pkg.mod import names`` (a module) or ``from <PKG>._pkg import mod as alias`` (modules of a package).
_IMPORT = re.compile(r"^[ \t]*from ansible_collections\.gpunode\.tuning\.plugins\.module_utils\.(_\w+(?:\.\w+)?) import \(?([\w ,]*)", re.M)


def install_spec(lib_dir, entry_point, python="/usr/bin/python3"):
    """The argument spec of the options that say where a module installs the library and its entry point on the
    node and which Python runs it (checkpoint_staging's copier, nic_irq_persist's boot-time pinner), each with the
    module's default."""
    return dict(lib_dir=dict(type="path", default=lib_dir), entry_point=dict(type="path", default=entry_point),
                python=dict(type="path", default=python))


def _source(name):
    """Source bytes of module_utils ``name`` (dotted, ``_pkg.mod``) from wherever it was imported (a file, or
    AnsiballZ's zip)."""
    module = __import__("%s.%s" % (PKG, name), fromlist=["_"])
    loader = getattr(module, "__loader__", None)
    data = loader.get_data(module.__file__) if loader is not None and hasattr(loader, "get_data") else None
    if data is None:
        with open(module.__file__, "rb") as handle:
            data = handle.read()
    return data


def imported_modules(source):
    """The module_utils modules (``_pkg.mod``) that ``source`` imports, in either spelling: ``from <PKG>._pkg.mod
    import names`` or ``from <PKG>._pkg import mod [as alias], ...``."""
    out = []
    for target, names in _IMPORT.findall(source):
        if "." in target:
            out.append(target)
        else:
            out.extend("%s.%s" % (target, name.split(" as ")[0].strip()) for name in names.split(",") if name.strip())
    return out


def library_files(entry_module="_nic_irq.pin_cli"):
    """{relative path: bytes} of the library: the import closure of ``entry_module`` (``_pkg.mod``) plus the
    package markers of every package on the way."""
    todo, seen = [entry_module], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = _source(name)
        todo.extend(imported_modules(seen[name].decode("utf-8")))
    files = dict(("%s/__init__.py" % d, b"") for d in INIT_DIRS)
    for name, data in seen.items():
        package, module = name.split(".")
        files["%s/%s/__init__.py" % (PKG_DIR, package)] = b""
        files["%s/%s/%s.py" % (PKG_DIR, package, module)] = data
    return files


def installed_library(lib_dir, root="/"):
    """Absolute paths of the library files a previous run installed (from its manifest)."""
    path = rooted(root, "%s/%s" % (lib_dir.rstrip("/"), MANIFEST))
    try:
        with open(path) as handle:
            names = json.load(handle)
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return ["%s/%s" % (lib_dir.rstrip("/"), n) for n in names
            if isinstance(n, str) and not n.startswith("/") and ".." not in n.split("/")]


def bytecode_of(paths, root="/"):
    """The __pycache__ files Python wrote for the given .py files (their bytecode is ours too)."""
    out = []
    for path in paths:
        if not path.endswith(".py"):
            continue
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        stem = os.path.basename(path)[:-3] + "."
        try:
            names = os.listdir(rooted(root, cache))
        except OSError:
            continue
        out += ["%s/%s" % (cache, n) for n in sorted(names) if n.startswith(stem) and n.endswith(".pyc")]
    return out
