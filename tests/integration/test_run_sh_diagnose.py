# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""./run.sh diagnose (issue 28, item 6): with -i, the inventory's hosts over their own connection; without, this
machine with -c local.

run.sh's ``diagnose_argv`` (the function its diagnose command runs) is taken from run.sh as it is and run in
bash, so the test sees the command run.sh builds without installing anything. The command it builds for a fake
inventory is then run for real: a host whose ssh port refuses connections is reported as a host whose check did
not run, under its name, never judged with the controller's numbers (``-c local`` did that: two unreachable hosts
came out as "no contention" with this machine's numbers).
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
# The Ansible of the interpreter that runs the tests (the CI matrix runs them on each supported ansible-core).
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402
import treegen  # noqa: E402


def diagnose_argv(*args, venv="/opt/venv"):
    """The ansible-playbook argv that ./run.sh diagnose ARGS runs, from run.sh's own diagnose_argv."""
    text = (ROOT / "run.sh").read_text()
    match = re.search(r"^diagnose_argv\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert match, "run.sh has no diagnose_argv function"
    script = match.group(0) + 'VENV=%s\ndiagnose_argv "$@"\nprintf "%%s\\0" "${DIAGNOSE_ARGV[@]}"\n' % venv
    out = subprocess.run(["bash", "-c", script, "run.sh"] + list(args), capture_output=True, text=True, check=True,
                         timeout=30).stdout
    return out.split("\0")[:-1]


def test_without_an_inventory_it_diagnoses_this_machine_locally():
    assert diagnose_argv("--check", "-e", "diagnose_interval=2") == [
        "ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=/opt/venv/bin/python",
        "playbooks/diagnose.yml", "--check", "-e", "diagnose_interval=2",
    ]


@pytest.mark.parametrize("inventory", [["-i", "cluster.ini"], ["-icluster.ini"], ["--inventory", "cluster.ini"],
                                       ["--inventory=cluster.ini"]])
def test_with_an_inventory_it_runs_against_its_hosts_over_their_own_connection(inventory):
    argv = diagnose_argv(*(inventory + ["-e", "x=1 y"]))
    assert argv == ["ansible-playbook", "playbooks/diagnose.yml"] + inventory + ["-e", "x=1 y"]
    assert "-c" not in argv and "local" not in argv and "localhost," not in argv
    assert not [arg for arg in argv if arg.startswith("ansible_python_interpreter")]


@pytest.mark.playbook
def test_an_unreachable_inventory_host_is_reported_unreachable_not_judged(tmp_path):
    # a reachable host reading a generated tree whose counters do not move (idle), beside one whose ssh port
    # refuses connections
    tree = treegen.build_tree(tmp_path / "here", treegen.lab_virtio())
    softnet_load.write_counters(tree.proc, softnet_load.healthy(list(range(8)), [4, 5], "enp66s1", 10000), 0.0)
    inventory = tmp_path / "cluster.ini"
    inventory.write_text(
        "[gpu]\n"
        "node-down ansible_host=127.0.0.1 ansible_port=1 ansible_user=nobody\n"
        "here ansible_connection=local ansible_python_interpreter=%s diagnose_procfs_path=%s diagnose_sysfs_path=%s "
        "diagnose_interface=enp66s1 diagnose_link_speed_mbps=10000\n" % (sys.executable, tree.proc, tree.sys)
    )
    report_dir = tmp_path / "report"
    argv = diagnose_argv("-i", str(inventory), "-e", "diagnose_interval=1", "-e", "diagnose_report_dir=%s" % report_dir)
    assert "-c" not in argv
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_SSH_ARGS="-o ConnectTimeout=5 -o BatchMode=yes",
               PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    result = subprocess.run(argv, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300, check=False)
    recap = [line for line in result.stdout.splitlines() if line.startswith("node-down ") and "unreachable=" in line]
    assert recap and "unreachable=1" in recap[0], result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((report_dir / "cluster.json").read_text())
    hosts = dict((host["host"], host) for host in report["hosts"])
    assert hosts["node-down"]["verdict"] == "failed", hosts["node-down"]
    assert hosts["node-down"]["cpus"] == [] and hosts["node-down"]["irq_cpus"] == []
    # the connection's own error, under the host's name
    assert "Failed to connect to the host via ssh" in hosts["node-down"]["reasons"][0], hosts["node-down"]["reasons"]
    # the reachable host was judged on its own (generated) numbers
    assert hosts["here"]["verdict"] == "idle", hosts["here"]["reasons"]
    assert hosts["here"]["interface"] == "enp66s1"
