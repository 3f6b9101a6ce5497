# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tune.yml's drift report on the real nic_irq_persist plan of a generated node (issue 29, trip 5): a node tune.yml
never ran on says "not tuned yet", its IRQ moves come first and the collection's library is one line with its count;
a node someone changed after tuning is drift, with the IRQ move first."""

from __future__ import annotations

import os

import pytest

import modharness
import treegen
from modharness import Exit
from ansible_collections.gpunode.tuning.plugins.filter.preflight import drift_collect
from ansible_collections.gpunode.tuning.plugins.module_utils._report import render as _report_render
from ansible_collections.gpunode.tuning.plugins.module_utils._host import payload as _payload
from ansible_collections.gpunode.tuning.plugins.module_utils._report import preflight as P
from ansible_collections.gpunode.tuning.plugins.modules import nic_irq_persist

pytestmark = pytest.mark.usefixtures("fake_exits_json")


@pytest.fixture
def lab(tmp_path):
    tree = treegen.build_tree(tmp_path / "t", treegen.lab_virtio())
    os.makedirs(os.path.join(tree.root, "etc/network/if-up.d"))      # an ifupdown node
    return tree


def pin(tree, check):
    args = dict(pci_address="0000:42:01.0", count=4, allow_irqbalance=True, recheck_interval="1min",
                procfs_path=tree.proc, sysfs_path=tree.sys)
    kind, res = modharness.run(nic_irq_persist, args, check=check)
    assert kind is Exit, res
    return res


def role_report(res):
    """nic_irq_pinning_report as roles/nic_irq_pinning/tasks/present.yml builds it from the module's result."""
    return {"state": "present", "check_mode": True, "interface": res["interface"], "drift": res["drift"],
            "files": [f for f in res["files"] if f["action"] != "unchanged"], "systemd": res["systemd"]}


def library(res):
    return [f["path"] for f in res["files"] if f["action"] != "unchanged"
            and ("/ansible_collections/" in f["path"] or f["path"].endswith("/" + _payload.MANIFEST))]


def test_a_never_tuned_node_is_not_tuned_yet_with_the_irq_moves_first_and_the_library_in_one_line(lab):
    res = pin(lab, check=True)
    libs = library(res)
    assert len(libs) > 10 and len(res["drift"]) == 6           # the library is most of the plan's files
    found = P.drift_findings({"nic_irq_pinning": role_report(res)})[0]
    assert found["status"] == "warn" and found["fatal"] is True
    assert found["message"].startswith("not tuned yet: ") and "drift" not in found["message"]
    assert found["fix"] == "run tune.yml without --check to tune this node"
    lines = found["evidence"]
    assert lines[:6] == ["IRQ %s" % move for move in res["drift"]]
    assert lines[-1] == "%d library files of the collection under /usr/local/lib/gpunode-tuning (create %d)" % (
        len(libs), len(libs))
    assert not [line for line in lines + [found["message"]] if "module_utils/" in line or _payload.MANIFEST in line]
    assert "create /etc/gpunode/nic-irq-affinity.json (missing)" in lines[6:-1]
    # The rendered report says it in that order too: the first IRQ move before any file.
    report = drift_collect({"gpu-01": {"reports": {"nic_irq_pinning": role_report(res)}, "error": None}},
                           "2026-12-03T17:00:00Z")
    text = _report_render.render_markdown(report)
    assert "not tuned yet" in text and "find who" not in text
    assert text.index("IRQ %s" % res["drift"][0]) < text.index("/etc/gpunode/nic-irq-affinity.json")
    assert "module_utils/_parse/cpulist.py" not in text


def test_a_tuned_node_that_someone_changed_is_drift_with_the_irq_move_first(lab):
    pin(lab, check=False)
    assert P.drift_findings({"nic_irq_pinning": role_report(pin(lab, check=True))})[0]["message"] == "in sync"
    queue = [i for i in pin(lab, check=True)["irqs"] if i["kind"] == "queue"]
    lab.set_affinity(queue[0]["irq"], [0])                      # someone moved a queue back to CPU 0
    unit = os.path.join(lab.root, "etc/systemd/system/gpunode-nic-irq-affinity.service")
    with open(unit, "a") as handle:
        handle.write("# local edit\n")
    res = pin(lab, check=True)
    found = P.drift_findings({"nic_irq_pinning": role_report(res)})[0]
    assert found["message"].startswith("drift: 3 change(s): IRQ %s" % res["drift"][0]) and found["fatal"] is True
    assert found["evidence"] == ["IRQ %s" % res["drift"][0], "systemd daemon-reload (captured tree: not run)",
                                 "update /etc/systemd/system/gpunode-nic-irq-affinity.service (content differs)"]
    assert "find who or what changed the host" in found["fix"]


def test_library_changes_of_a_tuned_node_are_one_line_whatever_the_actions():
    lib = "/opt/gpunode/ansible_collections/gpunode/tuning/plugins/module_utils/"
    report = {"files": [{"path": lib + "_cpulist.py", "action": "update", "reason": "content differs"},
                        {"path": lib + "_nic.py", "action": "update", "reason": "content differs"},
                        {"path": lib + "_old.py", "action": "remove", "reason": "no longer installed"},
                        {"path": "/etc/gpunode/nic-irq-affinity.json", "action": "update",
                         "reason": "content differs"}]}
    found = P.drift_findings({"nic_irq_pinning": report})[0]
    assert found["message"].startswith("drift: 2 change(s): ")
    assert found["evidence"] == ["update /etc/gpunode/nic-irq-affinity.json (content differs)",
                                 "3 library files of the collection under /opt/gpunode (remove 1, update 2)"]


def test_a_run_that_applied_its_changes_lists_them_as_made_not_as_drift(lab):
    """The report of tune.yml without --check on a node it tuned: the same plan, made; no fatal finding, no fix.
    (Before, a run that had just tuned the node said "DRIFT ... not tuned yet ... run tune.yml without --check".)"""
    res = pin(lab, check=True)
    found = P.drift_findings({"nic_irq_pinning": role_report(res)}, applied=True)[0]
    assert found["status"] == "pass" and found["fatal"] is False and not found.get("fix")
    assert found["message"].startswith("tuned: %d change(s) made: IRQ %s" % (len(found["evidence"]), res["drift"][0]))
    hosts = P.drift_collect_hosts({"n1": {"reports": {"nic_irq_pinning": role_report(res)}, "error": None}}, applied=True)
    assert [f["fatal"] for f in hosts["n1"]["findings"]] == [False]
    # in check mode the same plan stays "not tuned yet", fatal
    assert P.drift_collect_hosts({"n1": {"reports": {"nic_irq_pinning": role_report(res)}, "error": None}})["n1"][
        "findings"][0]["fatal"] is True
