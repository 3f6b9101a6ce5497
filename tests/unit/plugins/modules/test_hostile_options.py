# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every str/path option of every module, fed hostile strings: a clean failure naming the option, no byte written.

The modules are found by listing plugins/modules, and each module's options by
calling its ``main()`` with ``AnsibleModule.__init__`` replaced by a recorder:
an option (or a module) added later is covered without editing this file. A
module missing from :data:`MINIMAL` fails :func:`test_every_module_has_minimal_args`.

Each run has the module's other options set to valid values (:data:`MINIMAL`,
roots pointed at a tmp tree) and runs under a guard that refuses every write:
``open`` for writing, ``os.open`` with a write flag, rename/replace, mkdir,
unlink, chmod, chown, symlink, rmtree and every command (``run_command``,
``subprocess``). A choice-typed option that AnsibleModule refuses by itself
passes too (a clean failure naming the option).
"""

from __future__ import annotations

import builtins
import importlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible.module_utils import basic

import modharness
import treegen
from modharness import Exit, Fail, install_fake_exits, patch_module_args

MODULE_DIR = Path(__file__).resolve().parents[4] / "plugins" / "modules"
PACKAGE = "ansible_collections.gpunode.tuning.plugins.modules."

HOSTILE = ("a\nb", "x\n", "a\tb", "a\x00b", ";", "|", "$(touch /tmp/x)", "`id`", '"""', "#", "rel/x", "/a/../b")


def _roots(tmp):
    return {"procfs_path": "%s/proc" % tmp, "sysfs_path": "%s/sys" % tmp}


# Minimal valid arguments per module ({tmp} is the run's tmp tree); dict options with suboptions that a hostile
# value is fed to get their valid base from SUBOPTIONS.
MINIMAL = {
    "checkpoint_staging": {"staging_dir": "{tmp}/staging", "target_dir": "{tmp}/target",
                           "mountinfo_path": "{tmp}/mountinfo"},
    "cpu_power_facts": dict(_roots("{tmp}")),
    "cpu_power_settings": dict(_roots("{tmp}")),
    "cpuset_slices": {"root": "{tmp}", "sysfs_path": "{tmp}/sys", "workload_cpus": "2-3"},
    "gpu_health": {"sysfs_path": "{tmp}/sys"},
    "irqbalance_facts": dict(_roots("{tmp}")),
    "irqbalance_state": dict(_roots("{tmp}")),
    "kernel_cmdline": {"parameters": ["quiet"], "root": "{tmp}", "procfs_path": "{tmp}/proc",
                       "sysfs_path": "{tmp}/sys", "state_dir": "{tmp}/state"},
    "nccl_topo_mount": {"src": "/etc/nccl/topo.xml", "root": "{tmp}", "sysfs_path": "{tmp}/sys"},
    "nic_irq_affinity": dict(_roots("{tmp}"), interface="eth0"),
    "nic_irq_facts": dict(_roots("{tmp}"), interface="eth0"),
    "nic_irq_persist": dict(_roots("{tmp}"), interface="eth0", cpus="2-3"),
    "platform_facts": dict(_roots("{tmp}")),
    "slurm_cpuspec": {"root": "{tmp}", "nodes": [{"name": "node1", "cpus": "0-1"}]},
    "softnet_check": dict(_roots("{tmp}"), interface="eth0"),
}
SUBOPTIONS = {
    ("kernel_cmdline", "isolate"): {"cpus": "2-3"},
    ("nccl_topo_mount", "verify"): {"runtime": "podman", "image": "busybox"},
    ("nic_irq_persist", "irqbalance"): {"mode": "disabled"},
}
# (module, option): (hostile values the option legitimately takes, why). Keep it tiny.
EXEMPT = {
    ("cpu_power_facts", "process_patterns"): (
        {";", "|", "$(touch /tmp/x)", "`id`", '"""', "#", "rel/x", "/a/../b"},
        "regular expressions matched in the module against /proc/PID/cmdline; they reach no file and no command"),
    ("nccl_topo_mount", "content"): (
        set(HOSTILE) - {"a\x00b"},
        "the topology XML itself (free text, rule 'text'): parsed as XML and written as data, never run"),
    ("nccl_topo_mount", "nccl_log"): (
        set(HOSTILE) - {"a\x00b"},
        "the text of an NCCL log (rule 'text'): searched and reported in the JSON result only"),
    ("nccl_topo_mount", "cdi_kind"): ({"rel/x"}, "a CDI kind is vendor/class: rel/x is a valid one"),
    ("nccl_topo_mount", "verify.image"): ({"rel/x"}, "rel/x is a valid image name (passed as one argv word)"),
}


def module_names():
    return sorted(p.stem for p in MODULE_DIR.glob("*.py") if not p.name.startswith("_"))


class Recorded(Exception):
    pass


def module_kwargs(name):
    """The keyword arguments the module passes to AnsibleModule (argument_spec, mutually_exclusive...)."""
    module = importlib.import_module(PACKAGE + name)
    seen = {}

    def record(self, *args, **kwargs):
        seen.update(kwargs)
        raise Recorded()

    saved = basic.AnsibleModule.__init__
    basic.AnsibleModule.__init__ = record
    try:
        with patch_module_args({}):
            with pytest.raises(Recorded):
                module.main()
    finally:
        basic.AnsibleModule.__init__ = saved
    return module, seen


def _string_options(spec, prefix=""):
    """(dotted option, its spec, parent dict option or None) of every str/path/raw option, suboptions included."""
    out = []
    for key, opt in spec.items():
        kind = opt.get("type", "str")
        if opt.get("options") and kind == "dict":
            out += [(o, s, prefix + key) for o, s, _p in _string_options(opt["options"], prefix + key + ".")]
        elif kind in ("str", "path", "raw") or (kind == "list" and opt.get("elements", "str") in ("str", "path")):
            out.append((prefix + key, opt, None))
    return out


def cases():
    out = []
    for name in module_names():
        if name not in MINIMAL:
            continue
        _module, kwargs = module_kwargs(name)
        for option, spec, parent in _string_options(kwargs["argument_spec"]):
            allowed = EXEMPT.get((name, option), (set(), ""))[0]
            out += [pytest.param(name, option, spec, parent, value, id="%s-%s-%r" % (name, option, value))
                    for value in HOSTILE if value not in allowed]
    return out


class Guarded(Exception):
    """A write or a command the guard refused: the module went past its validation."""


@pytest.fixture
def guard(monkeypatch):
    """Refuse every write and every command while a module runs; record what was tried."""
    tried = []
    real_open, real_os_open = builtins.open, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT

    def refuse(what):
        def refused(*args, **kwargs):
            tried.append("%s %r" % (what, args[:2]))
            raise Guarded("%s %r" % (what, args[:2]))
        return refused

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            return refuse("open")(file, mode)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if flags & writes:
            return refuse("os.open")(path, flags)
        return real_os_open(path, flags, *args, **kwargs)

    install_fake_exits(monkeypatch, fail_as_json=False)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    for name in ("rename", "replace", "mkdir", "makedirs", "unlink", "remove", "rmdir", "chmod", "chown", "lchown",
                 "symlink", "link", "truncate", "mkfifo"):
        monkeypatch.setattr(os, name, refuse("os." + name))
    monkeypatch.setattr(shutil, "rmtree", refuse("shutil.rmtree"))
    monkeypatch.setattr(shutil, "copyfile", refuse("shutil.copyfile"))
    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess.Popen"))
    monkeypatch.setattr(basic.AnsibleModule, "run_command", refuse("run_command"))
    return tried


def test_every_module_has_minimal_args():
    """A new module must get an entry in MINIMAL (and so be fed the hostile set)."""
    missing = [name for name in module_names() if name not in MINIMAL]
    assert not missing, "add minimal valid arguments for %s to MINIMAL" % missing
    assert len(module_names()) >= 15


def test_every_dict_option_has_a_base():
    """A dict option with suboptions needs a valid base value in SUBOPTIONS."""
    missing = []
    for name in module_names():
        _module, kwargs = module_kwargs(name)
        missing += [(name, key) for key, opt in kwargs["argument_spec"].items()
                    if opt.get("options") and opt.get("type") == "dict" and (name, key) not in SUBOPTIONS]
    assert not missing, "add a valid base value to SUBOPTIONS for %s" % missing


@pytest.mark.parametrize("name, option, spec, parent, value", cases())
def test_hostile_value_fails_naming_the_option_and_writes_nothing(tmp_path, guard, name, option, spec, parent, value):
    module, kwargs = module_kwargs(name)
    tmp = str(tmp_path)
    args = dict((k, v.replace("{tmp}", tmp) if isinstance(v, str) else v) for k, v in MINIMAL[name].items())
    leaf = option.rsplit(".", 1)[-1]
    top = parent or option
    # Options sharing a mutually exclusive group with the one under test are left out.
    for group in kwargs.get("mutually_exclusive") or []:
        if top in group:
            for other in group:
                if other != top:
                    args.pop(other, None)
    hostile = [value] if spec.get("type") == "list" else value
    if parent:
        args[parent] = dict(SUBOPTIONS[(name, parent)], **{leaf: hostile})
    else:
        args[option] = hostile
    with patch_module_args(args):
        with pytest.raises((Exit, Fail, Guarded)) as exc:
            module.main()
    assert not guard, "%s %s=%r: the module went past its validation and tried %s" % (name, option, value, guard)
    assert exc.type is Fail, "%s %s=%r: expected fail_json, got %s" % (name, option, value, exc.value.args[0])
    result = exc.value.args[0]
    assert leaf in str(result.get("msg", "")), "%s %s=%r: the message does not name the option: %s" % (
        name, option, value, result.get("msg"))
    assert not result.get("changed"), result
    assert sorted(os.listdir(tmp)) == [], "%s %s=%r wrote %s" % (name, option, value, os.listdir(tmp))


# ------------------------------------------------- issue 27, section 4, one by one --

SECTION4 = [
    ("checkpoint_staging", "config_file", "/etc/gpunode/c.json\nExecStartPre=/bin/touch /pwned"),
    ("checkpoint_staging", "python", "/usr/bin/python3\nimport os; os.system('touch /pwned')"),
    ("checkpoint_staging", "lib_dir", '/usr/local/lib/x"""'),
    ("checkpoint_staging", "entry_point", "/usr/local/sbin/a b"),
    ("nic_irq_persist", "state_file", "/etc/gpunode/a\tb.json"),
    ("nic_irq_persist", "state_file", "/etc/gpunode/a.json;/bin/touch"),
    ("nic_irq_persist", "recheck_interval", "1min\n5s"),
    ("irqbalance_state", "policy_script", "/usr/local/libexec/p|x"),
    ("irqbalance_state", "policy_script", "/usr/local/libexec/p&x"),
    ("irqbalance_state", "policy_script", "/usr/local/libexec/p;x"),
    ("irqbalance_state", "policy_script", "/usr/local/libexec/p<x"),
    ("irqbalance_state", "policy_script", "/usr/local/libexec/p>x"),
    ("cpuset_slices", "workload_slice", "gpunode-workload.slice\n"),
    ("cpuset_slices", "housekeeping_units", ["init.scope\n"]),
    ("cpuset_slices", "dropin_name", "50-gpunode-cpuset.conf\n"),
    ("kernel_cmdline", "dropin_name", "zz-gpunode-tuning.cfg\n"),
    ("kernel_cmdline", "parameters", ["mitigations=off#x"]),
    ("cpu_power_facts", "procfs_path", "proc"),
    ("irqbalance_facts", "config_file", "etc/default/irqbalance"),
    ("irqbalance_state", "config_file", "etc/default/irqbalance"),
    ("slurm_cpuspec", "path", "etc/slurm/slurm.conf"),
]


@pytest.mark.parametrize("name, option, value", SECTION4, ids=["%s-%s-%r" % c for c in SECTION4])
def test_section4_value_is_refused_naming_the_option(tmp_path, guard, name, option, value):
    module = importlib.import_module(PACKAGE + name)
    args = dict((k, v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v) for k, v in MINIMAL[name].items())
    args[option] = value
    with patch_module_args(args):
        with pytest.raises((Exit, Fail, Guarded)) as exc:
            module.main()
    assert exc.type is Fail and not guard, (exc.value.args[0], guard)
    result = exc.value.args[0]
    assert result["option"].split("[")[0] == option
    assert result["value"] in (value, value[0] if isinstance(value, list) else None)
    assert result["expected"] and not result["changed"]
    assert os.listdir(str(tmp_path)) == []


def test_nccl_conf_key_with_a_trailing_newline_is_refused(tmp_path):
    from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nccl_topo import TopoError, check_nccl_conf
    assert check_nccl_conf({"NCCL_DEBUG": "INFO"}) == {"NCCL_DEBUG": "INFO"}
    for conf in ({"NCCL_DEBUG\n": "INFO"}, {"NCCL_DEBUG": "IN\x00FO"}):
        with pytest.raises(TopoError) as exc:
            check_nccl_conf(conf)
        assert exc.value.details["option"] == "nccl_conf"


def _irqbalance_tree(path):
    """A tree with irqbalance installed and the package's config (as test_irqbalance_state's lab)."""
    spec = treegen.lab_virtio()
    spec.update(isolated=[2], nohz_full=[3])
    spec["irqbalance"] = dict(spec["irqbalance"], config="#IRQBALANCE_ARGS=\n", running=True, unit="enabled",
                              systemd=False)
    tree = treegen.build_tree(path, spec)
    os.makedirs(os.path.join(tree.root, "usr/sbin"), exist_ok=True)
    builtins.open(os.path.join(tree.root, "usr/sbin/irqbalance"), "w").close()
    os.makedirs(os.path.join(tree.root, "etc"), exist_ok=True)
    with builtins.open(os.path.join(tree.root, "etc/passwd"), "w") as handle:
        handle.write("root:x:0:0:root:/root:/bin/bash\n")
    return tree


@pytest.mark.parametrize("check", [False, True])
def test_policy_script_at_a_file_that_is_not_ours_is_refused(tmp_path, fake_exits, check):
    """policy_script=/etc/passwd planned "update" (and a banned run overwrote it): refused, in check mode too."""
    tree = _irqbalance_tree(tmp_path / "tree")
    passwd = os.path.join(tree.root, "etc/passwd")
    kind, res = modharness.run(importlib.import_module(PACKAGE + "irqbalance_state"), dict(
        mode="banned", banned_cpus="4-7", banned_devices=["42:01.0"], os_family="Debian", policy_script="/etc/passwd",
        procfs_path=tree.proc, sysfs_path=tree.sys), check=check)
    assert kind is Fail and res["option"] == "policy_script" and "not this module's" in res["msg"], res
    assert not res["changed"]
    with builtins.open(passwd) as handle:
        assert handle.read() == "root:x:0:0:root:/root:/bin/bash\n"
    assert not os.path.exists(os.path.join(tree.root, "etc/gpunode"))
