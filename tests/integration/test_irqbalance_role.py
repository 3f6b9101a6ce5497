# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The irqbalance role's ban planning and config-file choice, run by ansible-playbook on localhost.

Only read-only task files of the role run (tasks_from: plan_banned, config_path),
in check mode: gpunode.tuning.irqbalance_facts reads a generated tree (play
module_defaults point it there), setup reads /etc/os-release. Nothing on this
host is written. The policy script is rendered from the role's template with
the role's result and executed with /bin/sh, the way irqbalance calls it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import treegen  # noqa: E402

pytestmark = pytest.mark.playbook

PLAN_PLAY = """
- name: The irqbalance role's ban planning over a generated tree
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    gpunode.tuning.irqbalance_facts:
      procfs_path: {proc}
      sysfs_path: {sys}
  tasks:
    - name: Plan the ban
      ansible.builtin.include_role:
        name: gpunode.tuning.irqbalance
        tasks_from: plan_banned
      vars:
        __irqbalance_config: /etc/default/irqbalance
    - name: Show the result
      ansible.builtin.debug:
        msg: "RESULT {{{{ {{'cpulist': __irqbalance_banned_cpulist, 'devices': __irqbalance_banned_devices,
               'script': lookup('ansible.builtin.template', '{template}')}} | to_json }}}}"
"""

CONFIG_PLAY = """
- name: The irqbalance role's choice of config file
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Pretend to be another OS family
      fake_os_family:
        family: "{{{{ fake_family }}}}"
      when: fake_family is defined
    - name: Pick the config file
      ansible.builtin.include_role:
        name: gpunode.tuning.irqbalance
        tasks_from: config_path
    - name: Show the result
      ansible.builtin.debug:
        msg: "RESULT {{{{ {{'config': __irqbalance_config, 'os_family': ansible_facts.os_family | default(None)}} | to_json }}}}"
"""

# A module, not a mock: it sets ansible_facts.os_family the way setup would on that OS.
FAKE_OS_FAMILY = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
module = AnsibleModule(argument_spec=dict(family=dict(type="str", required=True)), supports_check_mode=True)
module.exit_json(changed=False, ansible_facts={"os_family": module.params["family"]})
"""


def playbook(tmp_path, text, *extra):
    play = tmp_path / "play.yml"
    play.write_text(text)
    (tmp_path / "library").mkdir(exist_ok=True)
    (tmp_path / "library" / "fake_os_family.py").write_text(FAKE_OS_FAMILY)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (Path(sys.executable).parent, os.environ.get("PATH", "")))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play), "--check",
            "-e", "ansible_python_interpreter=%s" % sys.executable] + list(extra)
    res = subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300, check=False)
    found = re.search(r'"msg": "RESULT (.*)"\s*$', res.stdout, re.M)
    return res, json.loads(json.loads('"%s"' % found.group(1))) if found else None


def tree_with(tmp_path, isolated, nohz_full):
    tree = treegen.build_tree(tmp_path / "tree", treegen.lab_virtio())
    cpu = Path(tree.sys) / "devices/system/cpu"
    (cpu / "isolated").write_text(isolated + "\n")
    (cpu / "nohz_full").write_text(nohz_full + "\n")
    return tree


def plan_play(tree):
    template = ROOT / "roles" / "irqbalance" / "templates" / "irqbalance-policy.sh.j2"
    return PLAN_PLAY.format(proc=tree.proc, sys=tree.sys, template=template)


def policy(script, tmp_path, device_path):
    path = tmp_path / "policy.sh"
    path.write_text(script)
    res = subprocess.run(["/bin/sh", str(path), device_path, "42"], capture_output=True, text=True, timeout=30, check=True)
    return res.stdout.strip()


# The old YAML joined the raw texts: "" and "3" made ",3", "(null)" was passed on as is; both crashed the cpulist filter.
@pytest.mark.parametrize("isolated,nohz_full,expected", [
    ("", "3", "3-7"),
    ("", "(null)", "4-7"),
    ("2", "3", "2-7"),
])
def test_plan_bans_the_nic_cpus_plus_isolated_and_nohz_full(tmp_path, isolated, nohz_full, expected):
    tree = tree_with(tmp_path, isolated, nohz_full)
    res, result = playbook(tmp_path, plan_play(tree), "-e", '{"irqbalance_banned_cpus": "4-7", "irqbalance_banned_devices": ["42:01.0"]}')
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert result["cpulist"] == expected
    assert result["devices"] == ["0000:42:01.0"]


def test_policy_script_bans_exactly_the_named_function(tmp_path):
    tree = tree_with(tmp_path, "", "")
    res, result = playbook(tmp_path, plan_play(tree), "-e", '{"irqbalance_banned_cpus": [4, 5], "irqbalance_banned_devices": ["42:01.0"]}')
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    script = result["script"]
    assert policy(script, tmp_path, "/sys/bus/pci/devices/0000:42:01.0") == "ban=true"   # the short form was normalised
    assert policy(script, tmp_path, "/sys/bus/pci/devices/0000:42:01.1") == ""
    assert policy(script, tmp_path, "/sys") == ""


@pytest.mark.parametrize("devices,bad", [
    (["*"], "*"),
    (["0000:42:01.0", "0000:42:0[0-9].0"], "0000:42:0[0-9].0"),
    (["42:01"], "42:01"),
    (["0000:42:01.0) echo ban=true ;; x"], "0000:42:01.0) echo ban=true ;; x"),
])
def test_a_device_that_is_not_a_pci_address_fails_the_role_naming_it(tmp_path, devices, bad):
    tree = tree_with(tmp_path, "", "")
    res, result = playbook(tmp_path, plan_play(tree), "-e", json.dumps({"irqbalance_banned_cpus": "4-7", "irqbalance_banned_devices": devices}))
    assert res.returncode != 0 and result is None
    assert "banned_devices entry %r is not a PCI address" % bad in res.stdout


def test_a_bad_cpu_list_fails_the_role_naming_it(tmp_path):
    tree = tree_with(tmp_path, "", "")
    res, result = playbook(tmp_path, plan_play(tree), "-e", '{"irqbalance_banned_cpus": "4-x"}')
    assert res.returncode != 0 and result is None
    assert "banned_cpus '4-x' is not a CPU list" in res.stdout


def test_without_gathered_facts_the_os_family_is_gathered(tmp_path):
    res, result = playbook(tmp_path, CONFIG_PLAY.format())
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    family = open("/etc/os-release").read()
    expected = "/etc/default/irqbalance" if re.search(r"(?m)^ID(_LIKE)?=.*debian", family) else "/etc/sysconfig/irqbalance"
    assert result["os_family"] is not None
    assert result["config"] == expected


@pytest.mark.parametrize("family,config", [("RedHat", "/etc/sysconfig/irqbalance"), ("Suse", "/etc/sysconfig/irqbalance"),
                                           ("Debian", "/etc/default/irqbalance")])
def test_the_config_file_follows_the_os_family(tmp_path, family, config):
    res, result = playbook(tmp_path, CONFIG_PLAY.format(), "-e", "fake_family=%s" % family)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert result == {"config": config, "os_family": family}


def test_an_unknown_os_family_fails_instead_of_guessing(tmp_path):
    res, result = playbook(tmp_path, CONFIG_PLAY.format(), "-e", "fake_family=Gentoo")
    assert res.returncode != 0 and result is None
    assert 'no config file is known for OS family "Gentoo"' in res.stdout


def test_an_explicit_config_file_needs_no_facts(tmp_path):
    res, result = playbook(tmp_path, CONFIG_PLAY.format(), "-e", "irqbalance_config_file=/etc/irqbalance.env")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert result == {"config": "/etc/irqbalance.env", "os_family": None}
