# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every ``delegate_to`` of every role names a host with the role's own defaults (#29, first-run trip 1).

Ansible templates ``delegate_to`` before it looks at ``when``, so an expression that is empty with a documented
default fails the play with "Empty hostname produced from delegate_to" even where ``when`` would skip the task.
slurm_cpuspec's ``slurm_cpuspec_conf_host: ""`` did that in a task (fixed in the tasks) and, until this test, in
its "Restart slurmctld" handler. Each expression is rendered here with the role's defaults, as Ansible would.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


def _tasks(items):
    for item in items or []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("block", "rescue", "always"):
            yield from _tasks(item.get(key))


def delegations():
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for task in _tasks(yaml.safe_load(path.read_text())):
            if "delegate_to" in task:
                yield pytest.param(path, task["delegate_to"], id="%s:%s" % (path.relative_to(ROOT), task.get("name")))


DELEGATIONS = list(delegations())


def test_the_roles_delegate_somewhere():
    assert any("slurm_cpuspec/handlers" in str(param.values[0]) for param in DELEGATIONS), DELEGATIONS


@pytest.mark.parametrize("path, expression", DELEGATIONS)
def test_every_delegate_to_names_a_host_with_the_role_defaults(path, expression):
    defaults = yaml.safe_load((path.parents[1] / "defaults" / "main.yml").read_text()) or {}
    facts = dict(defaults, inventory_hostname="node1", ansible_play_hosts=["node1"])
    host = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(str(expression)).render(facts)
    assert host.strip(), "%s: delegate_to %r is empty with the role's defaults" % (path.relative_to(ROOT), expression)
