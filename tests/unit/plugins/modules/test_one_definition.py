# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One definition of each thing: the threshold defaults, the verdict table, the selector keys, the desired-state
keys and the command allow-list. Where a second copy must exist (module DOCUMENTATION is static YAML), a test
holds it equal to the one definition; elsewhere the source is searched for a second copy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpunode.tuning.plugins.doc_fragments.nic_selector import ModuleDocFragment
from ansible_collections.gpunode.tuning.plugins.module_utils._host import fileio as _fileio
from ansible_collections.gpunode.tuning.plugins.module_utils._parse import interrupts as _interrupts
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import nic as _nic
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet import check as _softnet
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet import sample as _softnet_sample
from ansible_collections.gpunode.tuning.plugins.module_utils._parse import procfs as _softnet_procfs
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.affinity import DESIRED_KEYS
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.verdict import (
    DEFAULT_THRESHOLDS,
    RULES,
    describe_rules,
)
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_affinity, softnet_check

ROOT = Path(__file__).resolve().parents[4]
PLUGINS = ROOT / "plugins"


def literal_tuples(path):
    """Every tuple or list of string constants written in a Python file, as tuples."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(elt, ast.Constant) and isinstance(elt.value, str) for elt in node.elts
        ):
            found.append(tuple(elt.value for elt in node.elts))
    return found


def defined_in(values):
    """Python files under plugins/ that spell out ``values`` (in any order) as a literal tuple or list."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in PLUGINS.rglob("*.py")
        if any(set(found) == set(values) for found in literal_tuples(path))
    )


# ---------------------------------------------------------------- thresholds and the verdict table


def test_threshold_defaults_are_one_constant_that_spec_and_docs_repeat():
    options = yaml.safe_load(softnet_check.DOCUMENTATION)["options"]
    for key, value in DEFAULT_THRESHOLDS.items():
        assert softnet_check.ARGUMENT_SPEC[key]["default"] == value, key
        assert float(options[key]["default"]) == value, key
    assert float(options["interval"]["default"]) == softnet_check.ARGUMENT_SPEC["interval"]["default"] == _softnet.DEFAULT_INTERVAL


def test_no_other_python_file_writes_the_threshold_defaults():
    writers = []
    for path in PLUGINS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                if set(DEFAULT_THRESHOLDS) <= set(keys):
                    writers.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.keyword) and node.arg in DEFAULT_THRESHOLDS:
                value = node.value
                if isinstance(value, ast.Call) and any(
                    kw.arg == "default" and isinstance(kw.value, ast.Constant) for kw in value.keywords
                ):
                    writers.append(str(path.relative_to(ROOT)))
    assert writers == ["plugins/module_utils/_softnet/verdict.py"]


def test_module_notes_list_the_verdict_table_in_order():
    notes = yaml.safe_load(softnet_check.DOCUMENTATION)["notes"]
    listed = [note for note in notes if note[:2] in ["%d." % n for n in range(1, 10)]]
    rules = describe_rules(placeholder="O(%s)")
    assert len(listed) == len(rules)
    for note, rule in zip(listed, rules):
        assert note.startswith("%d. %s: V(%s)" % (rule["number"], rule["condition"], rule["verdict"])), note


def test_verdict_rule_return_value_names_every_rule_in_order():
    returned = yaml.safe_load(softnet_check.RETURN)["verdict_rule"]
    text = " ".join(returned["description"])
    assert text.index("V(%s)" % RULES[0].name) < text.index("V(%s)" % RULES[-1].name)
    assert [name for name in (rule.name for rule in RULES) if "V(%s)" % name in text] == [rule.name for rule in RULES]


# ---------------------------------------------------------------- keys and commands


def test_selector_keys_are_defined_once():
    assert _softnet.SELECTOR_KEYS is _nic.SELECTOR_KEYS
    assert [key for key in _nic.SELECTOR_ARGUMENT_SPEC if key in _nic.SELECTOR_KEYS] == list(_nic.SELECTOR_KEYS)
    assert defined_in(_nic.SELECTOR_KEYS) == ["plugins/module_utils/_nic_irq/nic.py"]


def test_nic_irq_affinity_passes_exactly_the_desired_state_keys():
    assert not hasattr(nic_irq_affinity, "DESIRED")
    assert set(nic_irq_affinity.ARGUMENT_SPEC) - {"procfs_path", "sysfs_path"} == set(DESIRED_KEYS)
    assert defined_in(DESIRED_KEYS) == []  # built from SELECTOR_KEYS + the policy keys, never spelled out whole


def test_command_allow_list_is_defined_once():
    assert defined_in(_fileio.ALLOWED_COMMANDS) == ["plugins/module_utils/_host/fileio.py"]
    assert _irq_pin_cli.ALLOWED_COMMANDS is _fileio.ALLOWED_COMMANDS
    for name in _fileio.ALLOWED_COMMANDS:
        assert "C(%s)" % name in ModuleDocFragment.DOCUMENTATION


@pytest.mark.parametrize("argv", [["rm", "-rf", "/"], ["ethtool2"], []])
def test_the_allow_list_refuses_everything_else(argv):
    class Module(object):
        def get_bin_path(self, name):
            raise AssertionError("never looked up")

    assert _irq_pin_cli.subprocess_run(argv)[0] == 127
    if argv:
        assert _fileio.module_runner(Module())(argv)[0] == 127


# ---------------------------------------------------------------- readers


def test_softnet_reads_with_the_shared_reader_and_parses_softirqs_as_a_cpu_table(tmp_path, monkeypatch):
    assert _softnet_sample.read_raw is _fileio.read_raw
    calls = []
    monkeypatch.setattr(_softnet_sample, "read_raw", lambda path: calls.append(path) or "")
    _softnet_sample.read_sample(str(tmp_path))
    assert len(calls) == 5  # softnet_stat, stat, softirqs, net/dev, interrupts
    text = "                    CPU0       CPU2\n          HI:          1          0\n      NET_RX:        10         20\n"
    assert _softnet_procfs.parse_softirqs(text)["counts"] == {"HI": {0: 1, 2: 0}, "NET_RX": {0: 10, 2: 20}}
    parsed = []
    monkeypatch.setattr(_softnet_procfs, "parse_interrupts", lambda text: parsed.append(text) or _interrupts.parse_interrupts(text))
    assert _softnet_procfs.parse_softirqs(text)["cpus"] == [0, 2]
    assert parsed == [text]


def test_every_error_of_module_utils_derives_from_the_one_base():
    """#30: one error base. Every ``*Error`` class of module_utils derives from ``_host.errors.DetailedError`` (so a module
    catches one type and passes ``details`` to fail_json), and none sets ``self.details`` itself: the base does."""
    import importlib
    import inspect

    from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

    offenders, copies = [], []
    paths = sorted((PLUGINS / "module_utils").glob("_*/*.py"))
    assert len(paths) > 40, paths
    for path in paths:
        dotted = "%s.%s" % (path.parent.name, path.stem)
        module = importlib.import_module("ansible_collections.gpunode.tuning.plugins.module_utils.%s" % dotted)
        for name, klass in inspect.getmembers(module, inspect.isclass):
            if klass.__module__ != module.__name__ or not name.endswith("Error") or klass is DetailedError:
                continue
            if not issubclass(klass, DetailedError):
                offenders.append("%s.%s" % (dotted, name))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "details" and isinstance(t.value, ast.Name) and t.value.id == "self"
                for t in node.targets
            ) and dotted != "_host.errors":
                copies.append("%s:%d" % (path.name, node.lineno))
    assert offenders == [], "errors that do not derive from DetailedError: %s" % offenders
    assert copies == [], "self.details set outside _host.errors.DetailedError: %s" % copies


# ---------------------------------------------------------------- the modules' attributes


def _fragment_docs():
    """Each variable of doc_fragments/attributes.py (``""`` for DOCUMENTATION, else ``read_only``, ``facts``) as
    YAML, read from its source as ansible-doc would load it."""
    source = ast.parse((PLUGINS / "doc_fragments" / "attributes.py").read_text())
    cls = next(node for node in source.body if isinstance(node, ast.ClassDef))
    return dict(("" if node.targets[0].id == "DOCUMENTATION" else node.targets[0].id.lower(),
                 yaml.safe_load(node.value.value)) for node in cls.body if isinstance(node, ast.Assign))


def test_every_module_takes_the_shared_attribute_descriptions_and_states_only_its_support():
    """The author, check_mode, diff_mode, facts and platform are described once (doc_fragments/attributes.py, as
    community.general's attributes fragment); a module says only its support and the details that say more than
    the fragment's. A read-only module takes the fragment's read_only check and diff mode, a facts module the facts
    description, support and details. Checked on the documentation as ansible-doc merges it (the module's keys
    over the fragments')."""
    fragment_docs = _fragment_docs()
    for path in sorted((PLUGINS / "modules").glob("*.py")):
        module = ast.parse(path.read_text())
        doc = next(node.value.value for node in module.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", None) == "DOCUMENTATION")
        data = yaml.safe_load(doc)
        fragments = data.get("extends_documentation_fragment") or []
        assert "gpunode.tuning.attributes" in fragments, path.name
        assert "author" not in data, path.name
        own = data.get("attributes") or {}
        merged = {}
        for fragment in fragments:
            if fragment == "gpunode.tuning.attributes" or fragment.startswith("gpunode.tuning.attributes."):
                for name, attribute in fragment_docs[fragment[len("gpunode.tuning.attributes."):]]["attributes"].items():
                    merged.setdefault(name, {}).update(attribute)
        for name, attribute in own.items():
            assert "description" not in attribute, (path.name, name)
            assert attribute != merged.get(name), (path.name, name, "restates the fragment")
            merged.setdefault(name, {}).update(attribute)
        assert merged["check_mode"]["support"] == "full", path.name
        assert all(attribute.get("description") for attribute in merged.values()), path.name
        read_only = "gpunode.tuning.attributes.read_only" in fragments
        assert read_only == (merged["diff_mode"]["support"] == "none"), path.name
        assert ("gpunode.tuning.attributes.facts" in fragments) == ("facts" in merged), path.name
        if "facts" in merged:
            assert merged["facts"]["support"] == "full" and merged["facts"]["details"], path.name
