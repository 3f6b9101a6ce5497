# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""slurm_cpuspec on configuration trees: the lab cluster's files (molecule/slurm_cpuspec/files, the admin's
configuration the real daemons run with), real public slurm.conf files and real topologies
(tests/unit/fixtures/slurm, see the README there). The daemons themselves are the lab's."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm import cpuspec as S
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.conf import SlurmConfError
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.scontrol import parse_scontrol_nodes
from ansible_collections.gpunode.tuning.plugins.modules import slurm_cpuspec

pytestmark = pytest.mark.usefixtures("fake_exits")

REPO = Path(__file__).resolve().parents[4]
LAB = REPO / "molecule" / "slurm_cpuspec" / "files"
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "slurm"
QEMU = {"sockets": 2, "cores_per_socket": 2, "threads_per_core": 2}


def lab_tree(tmp_path, **replace):
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True)
    for name in ("slurm.conf", "nodes.conf", "cgroup.conf"):
        text = (LAB / name).read_text()
        for old, new in replace.get(name, []):
            assert old in text
            text = text.replace(old, new)
        (etc / name).write_text(text)
        os.chmod(str(etc / name), 0o640)
    return str(tmp_path)


def sums(root):
    out = {}
    for dirpath, dummy, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def params(root, **extra):
    base = {"path": "/etc/slurm/slurm.conf", "nodes": [{"name": "gpu-node", "cpus": "4,6", "topology": QEMU}],
            "state": "present", "set_prerequisites": True, "require_prerequisites": True, "slurmd_off_spec": False,
            "backup": False, "root": root, "verify": False, "cgroup_conf": None}
    base.update(extra)
    return base


def read(root, name):
    return (Path(root) / "etc" / "slurm" / name).read_text()


def test_check_mode_is_the_exact_plan_then_the_run_then_nothing(tmp_path):
    root = lab_tree(tmp_path)
    before = sums(root)
    kind, planned = modharness.run(slurm_cpuspec, params(root), check=True, diff=True)
    assert kind is Exit and planned["changed"]
    assert sums(root) == before
    kind, done = modharness.run(slurm_cpuspec, params(root), diff=True)
    assert kind is Exit and done["changed"]
    assert planned["diff"] == done["diff"] and planned["nodes"] == done["nodes"]
    for item in done["diff"]:
        assert read(root, os.path.basename(item["after_header"])) == item["after"]
    node = done["nodes"][0]
    assert (node["os_cpus"], node["whole_core_os_cpus"], node["extra_os_cpus"], node["cpu_spec_list"]) == ("4,6", "4-7", "5,7", "4-7")
    assert node["cpus_for_jobs"] == 4 and node["line"] == "/etc/slurm/nodes.conf line 3"
    assert sorted(done["files"]) == ["/etc/slurm/cgroup.conf", "/etc/slurm/nodes.conf", "/etc/slurm/slurm.conf"]
    admin = (LAB / "slurm.conf").read_text()
    assert read(root, "slurm.conf") == admin.replace("TaskPlugin=task/affinity\n", "TaskPlugin=task/affinity,task/cgroup\n")
    assert read(root, "cgroup.conf") == (LAB / "cgroup.conf").read_text() + "ConstrainCores=yes\n"
    nodes = read(root, "nodes.conf").splitlines(True)
    assert nodes[:2] == (LAB / "nodes.conf").read_text().splitlines(True)[:2]
    assert nodes[3:] == [
        "nodename=gpu-node NodeAddr=127.0.1.1 CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2 CpuSpecList=4-7\n",
        "nodename=spare[01-02] NodeAddr=127.0.0.[2-3] CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2\n"]
    for name in ("slurm.conf", "nodes.conf", "cgroup.conf"):
        assert os.stat(str(Path(root) / "etc" / "slurm" / name)).st_mode & 0o777 == 0o640      # mode kept
    again = sums(root)
    kind, second = modharness.run(slurm_cpuspec, params(root))
    assert kind is Exit and not second["changed"] and second["files"] == [] and sums(root) == again
    oks = {p["name"]: p["ok"] for p in second["prerequisites"]}
    assert oks == {"task_cgroup": True, "select_cons_tres": True, "constrain_cores": True}


def test_a_second_node_of_the_split_line_gets_its_own_value_and_absent_takes_both_off(tmp_path):
    root = lab_tree(tmp_path)
    S.converge(params(root), False)
    nodes = [{"name": "gpu-node", "cpus": "4,6", "topology": QEMU}, {"name": "spare02", "cpus": "0", "topology": QEMU}]
    S.converge(params(root, nodes=nodes), False)
    lines = read(root, "nodes.conf").splitlines()
    assert [line for line in lines if not line.startswith("#")][1:] == [
        "nodename=gpu-node NodeAddr=127.0.1.1 CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2 CpuSpecList=4-7",
        "nodename=spare01 NodeAddr=127.0.0.2 CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2",
        "nodename=spare02 NodeAddr=127.0.0.3 CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2 CpuSpecList=0-1"]
    result, dummy, dummy2 = S.converge(params(root, nodes=nodes), False)
    assert not result["changed"]
    result, dummy, dummy2 = S.converge(params(root, nodes=[{"name": "gpu-node"}, {"name": "spare02"}], state="absent"), False)
    assert result["changed"] and "CpuSpecList" not in read(root, "nodes.conf")


def test_linux_ids_become_slurms_abstract_ids_on_a_real_i_i_plus_n_server(tmp_path):
    # util-linux's lscpu -p capture of a 2-socket EPYC 7451: siblings i and i+48
    text = (FIXTURES / "lscpu" / "util-linux_lscpu-x86_64-epyc_7451.txt").read_text().split("\n\n")[1]
    rows = [line.split(",")[:3] for line in text.splitlines() if line and not line.startswith("#")]
    lscpu = "# CPU,Core,Socket\n" + "".join(",".join(r) + "\n" for r in rows)
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True)
    (etc / "slurm.conf").write_text("TaskPlugin=task/cgroup\nSelectType=select/cons_tres\n"
                                    "NodeName=epyc[1-2] CPUs=96 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2\n")
    (etc / "cgroup.conf").write_text("ConstrainCores=yes\n")
    nodes = [{"name": "epyc1", "cpus": "24", "topology": {"lscpu": lscpu}}]
    result, dummy, dummy2 = S.converge(params(str(tmp_path), nodes=nodes), False)
    node = result["nodes"][0]
    # Linux 24 is core 0 of socket 1 (its sibling 72): abstract ((1*24)+0)*2 + 0 = 48, and 49
    assert (node["cpu_spec_list"], node["whole_core_os_cpus"], node["extra_os_cpus"]) == ("48-49", "24,72", "72")
    assert (etc / "slurm.conf").read_text().splitlines()[2:] == [
        "# NodeName=epyc[1-2] (was /etc/slurm/slurm.conf line 3) split by gpunode.tuning slurm_cpuspec: the nodes need different core specialisation",
        "NodeName=epyc1 CPUs=96 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2 CpuSpecList=48-49",
        "NodeName=epyc2 CPUs=96 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2"]


def test_a_real_cluster_config_changes_one_line_and_cpus_as_cores_give_core_ids(tmp_path):
    # EPCC Cirrus: CPUs=36 on 2 x 18 cores x 2 threads, so Slurm counts cores and CpuSpecList ids are core indices
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True)
    original = (FIXTURES / "slurm_conf" / "epcc_cirrus_slurm.conf").read_text()
    (etc / "slurm.conf").write_text(original)
    (etc / "cgroup.conf").write_text("ConstrainCores=yes\n")
    shape = {"sockets": 2, "cores_per_socket": 18, "threads_per_core": 2}
    nodes = [{"name": "r1i0n%d" % i, "cpus": "2-3", "topology": shape} for i in range(36)]
    result, dummy, dummy2 = S.converge(params(str(tmp_path), nodes=nodes, set_prerequisites=True), False)
    assert {n["cpu_spec_list"] for n in result["nodes"]} == {"1"} and {n["ids"] for n in result["nodes"]} == {"cores"}
    after = (etc / "slurm.conf").read_text()
    changed = [(a, b) for a, b in zip(original.splitlines(True), after.splitlines(True)) if a != b]
    assert changed[0] == ("NodeName=r1i0n[0-35] CPUs=36 RealMemory=257400 Sockets=2 CoresPerSocket=18 ThreadsPerCore=2 State=UNKNOWN\n",
                          "NodeName=r1i0n[0-35] CPUs=36 RealMemory=257400 Sockets=2 CoresPerSocket=18 ThreadsPerCore=2 State=UNKNOWN CpuSpecList=1\n")
    assert len(changed) == 1 and len(after.splitlines()) == len(original.splitlines())       # every other line byte for byte
    assert result["files"] == ["/etc/slurm/slurm.conf"] and all(p["ok"] for p in result["prerequisites"])


@pytest.mark.parametrize("name, replace, extra, fragment", [
    ("unknown node", {}, {"nodes": [{"name": "gpu-nod", "cpus": "4", "topology": QEMU}]}, "node gpu-nod is on no NodeName line"),
    ("cpu the node lacks", {}, {"nodes": [{"name": "gpu-node", "cpus": "8", "topology": QEMU}]}, "CPU 8 is not an online CPU"),
    ("not a cpu list", {}, {"nodes": [{"name": "gpu-node", "cpus": "4-", "topology": QEMU}]}, "'4-' is not a CPU list"),
    ("malformed hostlist", {"nodes.conf": [("spare[01-02]", "spare[01-02")]}, {}, "NodeName=gpu-node,spare[01-02 is not a hostlist"),
    ("does not parse", {"slurm.conf": [("ClusterName=lab", "ClusterName lab")]}, {}, "cannot parse 'ClusterName lab'"),
    ("node on two lines", {"nodes.conf": [("nodename=gpu-node,", "NodeName=spare01 CPUs=8\nnodename=gpu-node,")]}, {},
     "node spare01 is on two NodeName lines (/etc/slurm/nodes.conf line 3 and /etc/slurm/nodes.conf line 4)"),
    ("core spec count on the line", {"nodes.conf": [("CPUs=8 ", "CPUs=8 CoreSpecCount=1 ")]}, {}, "node gpu-node has CoreSpecCount=1 (on its line"),
    ("core spec count from default", {"nodes.conf": [("State=UNKNOWN", "State=UNKNOWN CoreSpecCount=2")]}, {},
     "CoreSpecCount=2 (from NodeName=DEFAULT"),
    ("no cpu left for jobs", {}, {"nodes": [{"name": "gpu-node", "cpus": "0,2,4,6", "topology": QEMU}]}, "leaves no CPU for jobs out of 8"),
    ("no topology", {}, {"nodes": [{"name": "gpu-node", "cpus": "4"}]}, "node gpu-node: the topology must be"),
    ("missing prerequisite", {"cgroup.conf": [("CgroupPlugin=cgroup/v2\n", "CgroupPlugin=cgroup/v2\nConstrainCores=no\n")]},
     {"set_prerequisites": False},
     "TaskPlugin including task/cgroup (/etc/slurm/slurm.conf: task/affinity); ConstrainCores=yes in cgroup.conf (/etc/slurm/cgroup.conf: no)"),
    ("glob include", {"slurm.conf": [("Include nodes.conf", "Include nodes*.conf")]}, {}, "is a glob, which Slurm does not read"),
])
def test_bad_input_fails_naming_it_and_changes_nothing(tmp_path, name, replace, extra, fragment):
    root = lab_tree(tmp_path, **replace)
    before = sums(root)
    kind, result = modharness.run(slurm_cpuspec, params(root, **extra))
    assert kind is Fail, name
    assert fragment in result["msg"], (name, result["msg"])
    assert "value" in result and "expected" in result, result
    assert sums(root) == before


def test_without_require_prerequisites_a_missing_one_is_a_warning(tmp_path):
    root = lab_tree(tmp_path)
    result, dummy, warnings = S.converge(params(root, set_prerequisites=False, require_prerequisites=False), False)
    assert result["files"] == ["/etc/slurm/nodes.conf"]
    assert any("prerequisite missing: ConstrainCores=yes" in w for w in warnings), warnings


def test_slurmd_off_spec_is_added_to_task_plugin_param(tmp_path):
    root = lab_tree(tmp_path, **{"slurm.conf": [("TaskPlugin=task/affinity\n", "TaskPlugin=task/affinity\nTaskPluginParam=Cores\n")]})
    S.converge(params(root, slurmd_off_spec=True), False)
    assert "TaskPluginParam=Cores,SlurmdOffSpec\n" in read(root, "slurm.conf")


def test_a_failed_write_puts_back_the_files_written_before(tmp_path):
    root = lab_tree(tmp_path)
    before = sums(root)
    calls = []

    def flaky(path, data, mode, owner):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        S.write_atomic(path, data, mode, owner)

    with pytest.raises(S.CpuSpecError) as err:
        S.converge(params(root), False, write=flaky)
    assert "No space left on device" in str(err.value) and "put back" in str(err.value)
    assert sums(root) == before


def test_backup_copies_each_file_before_it_changes(tmp_path):
    root = lab_tree(tmp_path)
    kind, result = modharness.run(slurm_cpuspec, params(root, backup=True))
    assert kind is Exit and sorted(result["backups"]) == sorted(result["files"])
    for path, copy in result["backups"].items():
        assert open(copy).read() == (LAB / os.path.basename(path)).read_text()


def test_a_new_cgroup_conf_is_created_with_constrain_cores(tmp_path):
    root = lab_tree(tmp_path)
    os.unlink(os.path.join(root, "etc/slurm/cgroup.conf"))
    S.converge(params(root), False)
    assert read(root, "cgroup.conf").endswith("ConstrainCores=yes\n")
    assert os.stat(os.path.join(root, "etc/slurm/cgroup.conf")).st_mode & 0o777 == 0o644


def test_verify_compares_what_a_real_scontrol_reports():
    # gpu010 of the UNIGE Bamboo cluster (25.11.3): CoreSpecCount=2 shown as CPUSpecList=71,95
    text = (FIXTURES / "scontrol" / "show_node_gpu010_25.11.3_unige_bamboo_noindent.txt").read_text()
    records = parse_scontrol_nodes(text)
    good = S.verify_scontrol(records, [{"name": "gpu010", "cpu_spec_list": "71,95"}])
    bad = S.verify_scontrol(records, [{"name": "gpu010", "cpu_spec_list": "94-95"}, {"name": "gpu011", "cpu_spec_list": "0"}])
    assert good == [{"name": "gpu010", "ok": True, "reported": "71,95", "message": ""}]
    assert [b["ok"] for b in bad] == [False, False]
    assert bad[0]["message"] == "scontrol reports CPUSpecList=71,95, expected 94-95"
    assert bad[1]["message"] == "scontrol does not list node gpu011"


def test_verify_needs_the_live_root(tmp_path):
    root = lab_tree(tmp_path)
    kind, result = modharness.run(slurm_cpuspec, params(root, verify=True))
    assert kind is Fail and "verify asks the running slurmctld" in result["msg"]


def test_mem_spec_limit_without_ram_constraint_is_reported_not_set(tmp_path):
    root = lab_tree(tmp_path, **{"nodes.conf": [("RealMemory=900", "RealMemory=900 MemSpecLimit=200")]})
    result, dummy, warnings = S.converge(params(root), False)
    memspec = [p for p in result["prerequisites"] if p["name"] == "mem_spec_limit"]
    assert memspec and not memspec[0]["ok"] and memspec[0]["current"] == "200 on /etc/slurm/nodes.conf line 3"
    assert any("MemSpecLimit is set (200 on /etc/slurm/nodes.conf line 3) but confines slurmd only with ConstrainRAMSpace=yes" in w
               for w in warnings), warnings
    assert "ConstrainRAMSpace" not in read(root, "cgroup.conf")


# ------------------------------------------------------- links, NUL bytes, binary text (issue 27) --

def _host_file(tmp_path, text):
    """A file outside the tree, standing for a host file such as /etc/shadow."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "nodes.conf").write_text(text)
    return str(outside / "nodes.conf")


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_an_include_linked_out_of_the_tree_is_refused_never_read_or_replaced(tmp_path, check):
    """Issue 27 section 4: nodes.conf -> a host file was read and replaced by a regular file."""
    root = lab_tree(tmp_path / "tree")
    host = _host_file(tmp_path, (LAB / "nodes.conf").read_text())
    with open(host, "rb") as handle:
        host_bytes = handle.read()
    link = os.path.join(root, "etc/slurm/nodes.conf")
    os.unlink(link)
    os.symlink(host, link)
    kind, result = modharness.run(slurm_cpuspec, params(root), check=check)
    assert kind is Fail and result["changed"] is False, result
    assert "include file /etc/slurm/nodes.conf (/etc/slurm/slurm.conf line" in result["msg"], result["msg"]
    assert "is a symbolic link (-> %s)" % host in result["msg"] and "out of root" in result["msg"]
    assert result["target"] == host and result["path"] == "/etc/slurm/nodes.conf"
    assert os.path.islink(link) and os.readlink(link) == host
    with open(host, "rb") as handle:
        assert handle.read() == host_bytes


def test_a_directory_link_out_of_the_tree_is_refused(tmp_path):
    root = lab_tree(tmp_path / "tree")
    host = _host_file(tmp_path, (LAB / "nodes.conf").read_text())
    os.makedirs(os.path.join(root, "etc/other"))
    os.symlink(os.path.dirname(host), os.path.join(root, "etc/other/shared"))
    text = read(root, "slurm.conf").replace("Include nodes.conf", "Include /etc/other/shared/nodes.conf")
    (Path(root) / "etc/slurm/slurm.conf").write_text(text)
    kind, result = modharness.run(slurm_cpuspec, params(root))
    assert kind is Fail and "leads through a symbolic link out of root" in result["msg"], result["msg"]


@pytest.mark.parametrize("name", ["nodes.conf", "cgroup.conf"])
def test_a_link_inside_the_tree_is_read_but_never_replaced_by_a_file(tmp_path, name):
    root = lab_tree(tmp_path)
    real = os.path.join(root, "etc/slurm/real-" + name)
    os.rename(os.path.join(root, "etc/slurm", name), real)
    os.symlink("real-" + name, os.path.join(root, "etc/slurm", name))
    before = sums(root)
    for check in (True, False):
        kind, result = modharness.run(slurm_cpuspec, params(root), check=check)
        assert kind is Fail and "/etc/slurm/%s is a symbolic link (-> real-%s)" % (name, name) in result["msg"], result
        assert "never replaces a link" in result["msg"] and result["expected"] == "a regular file, not a link"
    assert os.path.islink(os.path.join(root, "etc/slurm", name)) and sums(root) == before


def test_a_link_elsewhere_that_needs_no_change_is_fine(tmp_path):
    """Only files the run writes must be regular: a linked cgroup.conf that already has what is needed stays."""
    root = lab_tree(tmp_path, **{"cgroup.conf": [("CgroupPlugin=cgroup/v2\n", "CgroupPlugin=cgroup/v2\nConstrainCores=yes\n")]})
    os.rename(os.path.join(root, "etc/slurm/cgroup.conf"), os.path.join(root, "etc/slurm/real-cgroup.conf"))
    os.symlink("real-cgroup.conf", os.path.join(root, "etc/slurm/cgroup.conf"))
    kind, result = modharness.run(slurm_cpuspec, params(root))
    assert kind is Exit and "/etc/slurm/cgroup.conf" not in result["files"], result
    assert os.path.islink(os.path.join(root, "etc/slurm/cgroup.conf"))


@pytest.mark.parametrize("where", ["path", "include", "cgroup_conf"])
def test_a_nul_byte_is_a_clean_failure(tmp_path, where):
    root = lab_tree(tmp_path)
    extra = {}
    if where == "path":
        extra = {"path": "/etc/slurm/slurm.conf\0x"}
    elif where == "cgroup_conf":
        extra = {"cgroup_conf": "/etc/slurm/cgroup\0.conf"}
    else:
        text = read(root, "slurm.conf").replace("Include nodes.conf", "Include nodes\0.conf")
        (Path(root) / "etc/slurm/slurm.conf").write_text(text)
    before = sums(root)
    kind, result = modharness.run(slurm_cpuspec, params(root, **extra))
    assert kind is Fail and "NUL" in result["msg"] and "expected" in result, result      # options: the module's validator
    with pytest.raises(SlurmConfError) as exc:                                           # and module_utils on its own
        S.converge(params(root, **extra), True)
    assert "contains a NUL byte" in str(exc.value) and exc.value.expected == "a path without NUL bytes"
    assert sums(root) == before


@pytest.mark.parametrize("name", ["slurm.conf", "nodes.conf"])
def test_a_file_that_is_not_utf8_is_a_clean_failure(tmp_path, name):
    root = lab_tree(tmp_path)
    with open(os.path.join(root, "etc/slurm", name), "ab") as handle:
        handle.write(b"# \xff\xfe\x00 binary\n")
    before = sums(root)
    kind, result = modharness.run(slurm_cpuspec, params(root))
    assert kind is Fail and "/etc/slurm/%s is not UTF-8 text" % name in result["msg"], result
    assert sums(root) == before
