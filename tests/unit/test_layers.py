# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The layers of plugins/ (#30), read from the diagram in docs/ARCHITECTURE.md and held true against every import.

* ``_parse`` (pure parsers and pure functions over kernel and tool formats) imports nothing of the collection but
  the error base ``_host.errors``;
* ``_host`` (the node or a captured tree: files, the file engine, the validator, topology) imports ``_host`` and
  ``_parse`` only;
* a feature package imports itself, ``_host``, ``_parse`` and the feature edges the diagram draws, nothing else;
* every module_utils file is in a package (no flat file); modules import the collection's module_utils only,
  filters module_utils and plugin_utils (never each other); module_utils import the standard library,
  ``ansible.module_utils`` and the collection only (what AnsiballZ ships to the node).

The diagram is the rule: an edge the code uses and the diagram lacks fails, and so does an edge the diagram draws
that no import uses (a stale diagram). The payload builder that installs a library on the node
(``_host.payload.imported_modules``) must find the same imports as Python's own parser, file by file.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload

ROOT = Path(__file__).resolve().parents[2]
MU = ROOT / "plugins" / "module_utils"
PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"
COLLECTION = "ansible_collections.gpunode.tuning"
BASE = ("_parse", "_host")
# The one import of the collection a parser may make: the error every error derives from.
PARSE_MAY_IMPORT = {"_host.errors"}


def diagram_edges():
    """(package, package) edges between feature packages, from the mermaid block of docs/ARCHITECTURE.md."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no mermaid diagram"
    edges = set(re.findall(r"^\s*(_\w+)\s*-->\s*(_\w+)\s*$", block.group(1), re.M))
    assert edges, "the diagram draws no edge"
    return edges


def imports_of(path):
    return imports_of_text(path.read_text())


def imports_of_text(source):
    """[(line, dotted target)] of a Python file: ``_pkg.mod`` for the collection's module_utils, the full name for
    the rest (``os``, ``ansible.module_utils.basic``, ``ansible_collections.gpunode.tuning.plugins.modules.x``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith(PKG + "."):
                parts = node.module[len(PKG) + 1:].split(".")
                if len(parts) == 1:
                    out.extend((node.lineno, "%s.%s" % (parts[0], alias.name)) for alias in node.names)
                else:
                    out.append((node.lineno, ".".join(parts[:2])))
            else:
                out.append((node.lineno, node.module))
    return out


def ours(target):
    """Whether an import target of :func:`imports_of` is the collection's module_utils (``_pkg.mod``)."""
    return target.startswith("_") and not target.startswith("__")


def module_utils_files():
    files = sorted(p for p in MU.glob("_*/*.py") if p.name != "__init__.py")
    assert len(files) > 40, files
    return files


def package_edges():
    """{(from package, to package): [file:line imports ...]} over module_utils, packages only."""
    edges = {}
    for path in module_utils_files():
        here = path.parent.name
        for line, target in imports_of(path):
            if ours(target) and target.split(".")[0] != here:
                edges.setdefault((here, target.split(".")[0]), []).append("%s:%d %s" % (path.relative_to(ROOT), line, target))
    return edges


def test_every_module_utils_file_is_in_a_package_and_every_package_has_its_marker():
    flat = sorted(p.name for p in MU.glob("*.py") if p.name != "__init__.py")
    assert flat == [], "module_utils files outside a package: %s" % flat
    for package in sorted(p for p in MU.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert package.name.startswith("_"), "%s: a private package's name starts with _" % package.name
        marker = package / "__init__.py"
        assert marker.is_file() and marker.read_bytes() == b"", "%s/__init__.py is missing or not empty" % package.name


def test_parsers_import_nothing_of_the_collection_but_the_error_base():
    bad = []
    for path in module_utils_files():
        if path.parent.name != "_parse":
            continue
        for line, target in imports_of(path):
            if ours(target) and not target.startswith("_parse.") and target not in PARSE_MAY_IMPORT:
                bad.append("%s:%d imports %s" % (path.relative_to(ROOT), line, target))
    assert bad == [], "a parser imports more than _parse and %s:\n%s" % (sorted(PARSE_MAY_IMPORT), "\n".join(bad))


def test_the_host_layer_imports_only_itself_and_the_parsers():
    bad = ["; ".join(where) for (src, dst), where in package_edges().items() if src == "_host" and dst not in BASE]
    assert bad == [], "the host layer imports a feature package:\n%s" % "\n".join(bad)


def test_features_import_the_base_and_only_the_edges_the_diagram_draws():
    allowed = diagram_edges()
    used = {}
    bad = []
    for (src, dst), where in sorted(package_edges().items()):
        if src in BASE or dst in BASE:
            continue
        used[(src, dst)] = where
        if (src, dst) not in allowed:
            bad.append("%s -> %s, not in docs/ARCHITECTURE.md: %s" % (src, dst, "; ".join(where)))
    assert bad == [], "imports across feature packages that the diagram does not draw:\n%s" % "\n".join(bad)
    stale = sorted(allowed - set(used))
    assert stale == [], "the diagram draws edges no import uses (update docs/ARCHITECTURE.md): %s" % stale


def test_the_feature_graph_has_no_cycle():
    edges = diagram_edges()
    graph = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "cycle: %s" % " -> ".join(path + [node])
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        state[node] = "done"

    for node in sorted(graph):
        visit(node, [])


def test_every_package_of_the_diagram_exists_and_every_package_is_in_the_diagram():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(p.name for p in MU.iterdir() if p.is_dir() and p.name.startswith("_"))
    missing = [p for p in packages if "`%s/`" % p not in text]
    assert missing == [], "packages docs/ARCHITECTURE.md does not describe: %s" % missing
    drawn = set(n for edge in diagram_edges() for n in edge)
    assert drawn <= set(packages), "the diagram names packages that do not exist: %s" % sorted(drawn - set(packages))


def test_module_utils_import_only_the_standard_library_ansible_module_utils_and_the_collection():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for path in module_utils_files():
        for line, target in imports_of(path):
            if ours(target):
                continue
            top = target.split(".")[0]
            if top not in stdlib and not target.startswith("ansible.module_utils."):
                bad.append("%s:%d imports %s" % (path.relative_to(ROOT), line, target))
    assert bad == [], "module_utils import outside the standard library:\n%s" % "\n".join(bad)


def test_modules_and_filters_import_the_collection_only_through_module_utils_and_filters_plugin_utils():
    bad = []
    for kind in ("modules", "filter"):
        for path in sorted((ROOT / "plugins" / kind).glob("*.py")):
            for line, target in imports_of(path):
                allowed = (COLLECTION + ".plugins.module_utils",) + ((COLLECTION + ".plugins.plugin_utils",) if kind == "filter" else ())
                if target.startswith(COLLECTION + ".") and not target.startswith(allowed):
                    bad.append("%s:%d imports %s" % (path.relative_to(ROOT), line, target))
                if kind == "modules" and target.startswith("ansible.") and not target.startswith("ansible.module_utils"):
                    bad.append("%s:%d imports %s (a module runs on the node)" % (path.relative_to(ROOT), line, target))
    assert bad == [], "\n".join(bad)


def test_the_payload_builder_finds_every_import_python_finds():
    """The library installed on a node is the import closure the builder computes; a spelling of an import that it
    missed would install a library that fails at boot. Python's parser is the reference, file by file."""
    for path in module_utils_files():
        by_ast = sorted(set(t for _line, t in imports_of(path) if ours(t)))
        by_builder = sorted(set(_payload.imported_modules(path.read_text())))
        assert by_builder == by_ast, path.relative_to(ROOT)


def test_the_installed_libraries_are_exactly_their_entry_points_closures():
    for entry in ("_nic_irq.pin_cli", "_checkpoint.cli"):
        files = _payload.library_files(entry)
        modules = sorted(k for k in files if k.endswith(".py") and not k.endswith("__init__.py"))
        closure, todo = set(), [entry]
        while todo:
            name = todo.pop()
            if name in closure:
                continue
            closure.add(name)
            path = MU / (name.replace(".", "/") + ".py")
            todo.extend(t for _line, t in imports_of(path) if ours(t))
        assert modules == sorted("%s/%s.py" % (_payload.PKG_DIR, n.replace(".", "/")) for n in closure), entry
        for package in set(n.split(".")[0] for n in closure):
            assert files["%s/%s/__init__.py" % (_payload.PKG_DIR, package)] == b""


def test_code_that_runs_on_a_node_without_ansible_imports_no_ansible():
    """The installed libraries (the NIC IRQ pins' entry point, the checkpoint copier) run with the node's Python and
    no Ansible: nothing in their closure may import ``ansible`` (``_host.module``, the modules' start, does)."""
    for entry in ("_nic_irq.pin_cli", "_checkpoint.cli"):
        for rel, data in _payload.library_files(entry).items():
            if rel.endswith(".py"):
                found = [t for _line, t in imports_of_text(data.decode("utf-8")) if t == "ansible" or t.startswith("ansible.")]
                assert found == [], (entry, rel, found)
