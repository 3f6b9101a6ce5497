# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl_topo_mount: an NCCL topology file into enroot and CDI containers, on tmp trees.

The module's main() on a tree (root T, sysfs T/sys): the files are planned and
written under it. The topology XMLs are real published ones
(tests/unit/fixtures/nccl_topo, README.md there). The container probe is tested
through parse_probe on the output both runtimes print, and through converge()
with a fake runner; the real podman and enroot are the lab's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from ansible.module_utils import basic

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu import nccl_topo as T
from ansible_collections.gpunode.tuning.plugins.module_utils._host import files as _persist
from ansible_collections.gpunode.tuning.plugins.modules import nccl_topo_mount

pytestmark = pytest.mark.usefixtures("fake_exits", "warned")
WARNED = []

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_topo"
SRC = "/etc/gpunode/topo.xml"
FSTAB = "etc/enroot/mounts.d/50-gpunode-nccl.fstab"
ENV = "etc/enroot/environ.d/50-gpunode-nccl.env"
CDI = "etc/cdi/gpunode-nccl.yaml"
CONF = "etc/nccl.conf"
OURS = [CDI, ENV, FSTAB]
SMALL = b'<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:17:00.0" class="0x030200"/>\n' \
        b'    <pci busid="0000:3A:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0"/></nic></pci>\n  </cpu>\n</system>\n'


@pytest.fixture
def warned(monkeypatch):
    del WARNED[:]
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning: WARNED.append(warning))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())


def fixture(name):
    return (FIXTURES / name).read_bytes()


@pytest.fixture
def tree(tmp_path):
    """A root with the topology XML at SRC and a sysfs with two PCI devices."""
    root = tmp_path / "tree"
    write(str(root) + SRC, SMALL)
    for busid in ("0000:17:00.0", "0000:3a:00.0"):
        os.makedirs(root / "sys/bus/pci/devices" / busid)
    return str(root)


def snapshot(root):
    out = {}
    for base, dirs, files in os.walk(root):
        for name in files + dirs:
            path = os.path.join(base, name)
            if os.path.isdir(path):
                out[os.path.relpath(path, root)] = "dir"
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = (hashlib.sha256(handle.read()).hexdigest(), os.lstat(path).st_mode & 0o7777)
    return out


def read(root, rel):
    with open(os.path.join(root, rel)) as handle:
        return handle.read()


def run(root, check=False, diff=False, **args):
    args = dict((k, v) for k, v in dict(dict(src=SRC), **args).items() if v is not None)
    args.setdefault("root", root)
    args.setdefault("sysfs_path", os.path.join(root, "sys"))
    del WARNED[:]
    kind, result = modharness.run(nccl_topo_mount, args, check=check, diff=diff)
    if kind is Exit:
        assert "warnings" not in result
        result["warnings"] = list(WARNED)
    return kind, result


def changed_paths(result):
    return sorted(f["path"] for f in result["files"] if f["action"] != "unchanged")


# ---------------------------------------------------------------- present --

def test_check_mode_is_the_plan_and_the_run_does_it(tree):
    before = snapshot(tree)
    kind, planned = run(tree, check=True, diff=True)
    assert kind is Exit and planned["changed"] is True, planned
    assert snapshot(tree) == before
    assert [(f["path"], f["action"]) for f in planned["files"]] == [("/" + p, "create") for p in OURS]
    assert [d["before_header"] for d in planned["diff"]] == ["/" + p for p in OURS]
    kind, done = run(tree, diff=True)
    assert kind is Exit and done["changed"] is True
    assert done["files"] == planned["files"] and done["diff"] == planned["diff"]
    for rel in OURS:
        assert os.stat(os.path.join(tree, rel)).st_mode & 0o7777 == 0o644
    kind, again = run(tree, check=True)
    assert kind is Exit and again["changed"] is False and changed_paths(again) == []
    kind, again = run(tree)
    assert kind is Exit and again["changed"] is False


def test_rendered_files_are_exact(tree):
    kind, result = run(tree)
    assert kind is Exit
    assert read(tree, FSTAB) == "/etc/gpunode/topo.xml /etc/nccl/topo.xml none x-create=file,bind,ro,nosuid,nodev 0 0\n"
    assert read(tree, ENV) == "NCCL_TOPO_FILE=/etc/nccl/topo.xml\n"
    spec = read(tree, CDI)
    assert yaml.safe_load(spec) == json.loads(spec) == {
        "cdiVersion": "0.5.0",
        "kind": "gpunode.io/nccl",
        "devices": [{"name": "topo", "containerEdits": {
            "env": ["NCCL_TOPO_FILE=/etc/nccl/topo.xml"],
            "mounts": [{"hostPath": "/etc/gpunode/topo.xml", "containerPath": "/etc/nccl/topo.xml",
                        "options": ["ro", "bind", "nosuid", "nodev"]}]}}],
    }
    assert spec == json.dumps(json.loads(spec), indent=2, sort_keys=True) + "\n"
    assert not os.path.exists(os.path.join(tree, CONF))
    assert result["container_path"] == "/etc/nccl/topo.xml"
    assert result["cdi_device"] == "gpunode.io/nccl=topo"
    assert result["checksum"] == hashlib.sha256(SMALL).hexdigest()
    assert result["busids"] == ["0000:17:00.0", "0000:3A:00.0"]
    assert "missing_busids" not in result


def test_nccl_conf_is_written_sorted_and_mounted_in_both_runtimes(tree):
    kind, result = run(tree, nccl_conf={"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "WARN",
                                        "NCCL_IB_TIMEOUT": 22}, container_path="/opt/topo.xml")
    assert kind is Exit and result["changed"] is True, result
    assert read(tree, CONF) == T.HEADER + "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5_0,mlx5_1\nNCCL_IB_TIMEOUT=22\nNCCL_SOCKET_IFNAME==eth0\n"
    assert read(tree, CONF).startswith("#") and T.HEADER.startswith("# ")
    assert read(tree, FSTAB) == (
        "/etc/gpunode/topo.xml /opt/topo.xml none x-create=file,bind,ro,nosuid,nodev 0 0\n"
        "/etc/nccl.conf /etc/nccl.conf none x-create=file,bind,ro,nosuid,nodev 0 0\n")
    assert read(tree, ENV) == "NCCL_TOPO_FILE=/opt/topo.xml\n"
    mounts = json.loads(read(tree, CDI))["devices"][0]["containerEdits"]["mounts"]
    assert mounts[1] == {"hostPath": "/etc/nccl.conf", "containerPath": "/etc/nccl.conf", "options": ["ro", "bind", "nosuid", "nodev"]}
    # Dropping nccl_conf removes the module's own nccl.conf and its mounts.
    kind, result = run(tree, container_path="/opt/topo.xml")
    assert kind is Exit and result["changed"] is True
    assert {f["path"]: f["action"] for f in result["files"]}["/etc/nccl.conf"] == "remove"
    assert not os.path.exists(os.path.join(tree, CONF))
    assert len(read(tree, FSTAB).splitlines()) == 1


def test_a_foreign_nccl_conf_is_never_removed(tree):
    write(os.path.join(tree, CONF), "NCCL_DEBUG=INFO\n")
    kind, result = run(tree)
    assert kind is Exit and "/etc/nccl.conf" not in [f["path"] for f in result["files"]]
    kind, result = run(tree, state="absent", src=None)
    assert kind is Exit and read(tree, CONF) == "NCCL_DEBUG=INFO\n"


def test_runtimes_enroot_only_and_custom_paths(tree):
    run(tree)
    kind, result = run(tree, runtimes=["enroot"])
    assert kind is Exit and [(f["path"], f["action"]) for f in result["files"] if f["action"] != "unchanged"] == [("/" + CDI, "remove")]
    assert not os.path.exists(os.path.join(tree, CDI)) and os.path.exists(os.path.join(tree, FSTAB))
    kind, result = run(tree, runtimes=["cdi"], cdi_spec_dir="/var/run/cdi", cdi_kind="example.com/topo",
                       enroot_sysconf_path="/etc/enroot", file_prefix="60-site")
    assert kind is Exit, result
    assert result["cdi_device"] == "example.com/topo=topo"
    assert json.loads(read(tree, "var/run/cdi/gpunode-nccl.yaml"))["kind"] == "example.com/topo"
    assert os.path.exists(os.path.join(tree, FSTAB))  # another prefix: the old files are not its own any more


def test_absent_removes_only_its_files(tree):
    foreign = os.path.join(tree, "etc/enroot/mounts.d/10-site.fstab")
    write(foreign, "/data /data none bind 0 0\n")
    run(tree, nccl_conf={"NCCL_DEBUG": "WARN"})
    kind, planned = run(tree, state="absent", src=None, check=True, diff=True)
    assert kind is Exit and planned["changed"] is True
    assert sorted((f["path"], f["action"]) for f in planned["files"]) == sorted(("/" + p, "remove") for p in OURS + [CONF])
    assert all(os.path.exists(os.path.join(tree, p)) for p in OURS)
    assert all(d["after_header"] == "(absent)" for d in planned["diff"])
    kind, done = run(tree, state="absent", src=None)
    assert kind is Exit and done["changed"] is True and done["files"] == planned["files"]
    assert not any(os.path.exists(os.path.join(tree, p)) for p in OURS + [CONF])
    assert read(tree, "etc/enroot/mounts.d/10-site.fstab") == "/data /data none bind 0 0\n"
    assert os.path.exists(os.path.join(tree, SRC.lstrip("/")))
    kind, again = run(tree, state="absent", src=None)
    assert kind is Exit and again["changed"] is False and again["files"] == []


def test_hand_edit_is_repaired(tree):
    run(tree)
    write(os.path.join(tree, ENV), "NCCL_TOPO_FILE=/elsewhere\n")
    kind, result = run(tree, check=True, diff=True)
    assert kind is Exit and changed_paths(result) == ["/" + ENV]
    assert result["diff"][0]["before"] == "NCCL_TOPO_FILE=/elsewhere\n"
    run(tree)
    assert read(tree, ENV) == "NCCL_TOPO_FILE=/etc/nccl/topo.xml\n"


def test_a_changed_topology_changes_only_the_checksum(tree):
    kind, first = run(tree)
    write(tree + SRC, SMALL.replace(b'class="0x020700"', b'class="0x020000"'))
    kind, second = run(tree)
    assert kind is Exit and second["changed"] is False and second["checksum"] != first["checksum"]


# ------------------------------------------------------------- validate_pci --

def test_validate_pci_passes_with_case_and_domain_normalised(tree):
    write(tree + SRC, SMALL.replace(b"0000:17:00.0", b"17:00.0"))
    kind, result = run(tree, validate_pci=True)
    assert kind is Exit and result["missing_busids"] == [] and result["busids"] == ["17:00.0", "0000:3A:00.0"]


def test_validate_pci_fails_naming_the_missing_busid_and_writes_nothing(tree):
    os.rmdir(os.path.join(tree, "sys/bus/pci/devices/0000:3a:00.0"))
    before = snapshot(tree)
    kind, result = run(tree, validate_pci=True)
    assert kind is Fail and "0000:3A:00.0" in result["msg"] and result["changed"] is False, result
    assert result["missing_busids"] == ["0000:3A:00.0"]
    assert snapshot(tree) == before


def test_validate_pci_needs_a_sysfs_with_pci_devices(tree, tmp_path):
    kind, result = run(tree, validate_pci=True, sysfs_path=str(tmp_path / "nosys"))
    assert kind is Fail and "bus/pci/devices" in result["msg"]


def test_normalise_busid():
    assert T.normalise_busid("0000:3A:00.0") == "0000:3a:00.0"
    assert T.normalise_busid("3a:00.1") == "0000:3a:00.1"
    assert T.normalise_busid("1:3a:00.1") == "0001:3a:00.1"
    assert T.normalise_busid("not-a-bus") is None


# ------------------------------------------------------------- bad input --

BAD_XML = [
    (b'<system version="1"><cpu></system>', "not well-formed", "line 1"),
    (b'<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:17:00.0"\n  </cpu>\n</system>\n', "not well-formed", "line 4"),
    (b'', "not well-formed", "no element found"),
    (fixture("azure-ncv4-graph.xml"), "root element <graphs>", "<system>"),
    (b'<system><cpu numaid="0"/></system>', "no version attribute", SRC),
]


@pytest.mark.parametrize("data,fragment,more", BAD_XML)
def test_a_bad_topology_fails_naming_the_file_and_writes_nothing(tree, data, fragment, more):
    write(tree + SRC, data)
    before = snapshot(tree)
    kind, result = run(tree)
    assert kind is Fail and result["changed"] is False, result
    assert SRC in result["msg"] and fragment in result["msg"] and more in result["msg"], result["msg"]
    assert snapshot(tree) == before


BAD_INPUT = [
    (dict(container_path="etc/nccl/topo.xml"), "etc/nccl/topo.xml", "container_path"),
    (dict(container_path="/etc/nccl/my topo.xml"), "my topo.xml", "whitespace"),
    (dict(container_path="/etc/nccl/a,b.xml"), "a,b.xml", "comma"),
    (dict(nccl_conf={"nccl_debug": "INFO"}), "nccl_debug", "NCCL variable name"),
    (dict(nccl_conf={"NCCL DEBUG": "INFO"}), "NCCL DEBUG", "NCCL variable name"),
    (dict(nccl_conf={"NCCL_DEBUG": "INFO\nNCCL_P2P_DISABLE=1"}), "NCCL_DEBUG", "newline"),
    (dict(nccl_conf={"NCCL_DEBUG": " INFO"}), "' INFO'", "whitespace"),
    (dict(nccl_conf={"NCCL_DEBUG": ""}), "NCCL_DEBUG", "empty"),
    (dict(src="/etc/gpunode/missing.xml"), "/etc/gpunode/missing.xml", "does not exist"),
    (dict(src="/etc/gpunode"), "/etc/gpunode", "not a regular file"),
    (dict(src="etc/gpunode/topo.xml"), "etc/gpunode/topo.xml", "not absolute"),
    (dict(file_prefix="../x"), "../x", "file_prefix"),
    (dict(cdi_kind="nccl"), "nccl", "cdi_kind"),
    (dict(verify={"runtime": "podman", "image": "busybox"}), "verify", "root /"),
]


@pytest.mark.parametrize("args,value,fragment", BAD_INPUT)
def test_bad_input_fails_naming_the_value_and_writes_nothing(tree, args, value, fragment):
    before = snapshot(tree)
    kind, result = run(tree, **args)
    assert kind is Fail and result["changed"] is False, result
    assert value in result["msg"] and fragment in result["msg"], result["msg"]
    assert snapshot(tree) == before


def test_present_needs_src(tree):
    kind, result = run(tree, src=None)
    assert kind is Fail and "src" in result["msg"]


# ------------------------------------------------------------ real files --

REAL = {
    "azure-ndv2-topo.xml": 9,
    "azure-ndv4-topo.xml": 20,
    "azure-ndv5-topo.xml": 24,
    "azure-ncv4-topo.xml": 4,
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_topology_files_parse_and_list_their_busids(tree, name):
    data = fixture(name)
    assert data.startswith(b'<system version="1">')
    busids = T.parse_topology(data, name)
    assert len(busids) == REAL[name]
    assert busids == [b.decode() for b in _busids_by_regex(data)]
    assert all(T.normalise_busid(b) for b in busids)
    write(tree + SRC, data)
    kind, result = run(tree)
    assert kind is Exit and result["busids"] == busids and result["checksum"] == hashlib.sha256(data).hexdigest()


def _busids_by_regex(data):
    out = []
    for b in re.findall(rb'busid="([^"]+)"', data):
        if b not in out:
            out.append(b)
    return out


def test_real_file_with_validate_pci_names_what_the_host_lacks(tree):
    """NDv4: the ffff domain switches are not looked up; the GPUs and NICs are."""
    data = fixture("azure-ndv4-topo.xml")
    write(tree + SRC, data)
    for busid in T.parse_topology(data, "x"):
        if not busid.startswith("ffff:") and busid != "0108:00:00.0":
            os.makedirs(os.path.join(tree, "sys/bus/pci/devices", busid), exist_ok=True)
    kind, result = run(tree, validate_pci=True)
    assert kind is Fail and result["missing_busids"] == ["0108:00:00.0"], result
    os.makedirs(os.path.join(tree, "sys/bus/pci/devices/0108:00:00.0"))
    kind, result = run(tree, validate_pci=True)
    assert kind is Exit and result["missing_busids"] == []


# -------------------------------------------------------------- rollback --

def test_a_failed_write_rolls_back_every_file(tree, monkeypatch):
    run(tree, runtimes=["enroot"])
    before = snapshot(tree)
    calls = []
    real = _persist.write_atomic

    def flaky(path, data, mode):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(_persist, "write_atomic", flaky)
    kind, result = run(tree, container_path="/opt/topo.xml", nccl_conf={"NCCL_DEBUG": "WARN"})
    assert kind is Fail and "rolled back" in result["msg"] and "No space left" in result["msg"], result["msg"]
    monkeypatch.setattr(_persist, "write_atomic", real)
    assert snapshot(tree) == before


# ----------------------------------------------------------------- probe --

SHA = hashlib.sha256(SMALL).hexdigest()
OTHER = "0" * 64


@pytest.mark.parametrize("out,ok,half", [
    ("NCCL_TOPO_FILE=/etc/nccl/topo.xml\n%s  /etc/nccl/topo.xml\n" % SHA, (True, True, True), "is set"),
    # podman without the CDI device, or enroot without environ.d: empty variable, sha256sum "" fails.
    ("NCCL_TOPO_FILE=\nsha256sum: : No such file or directory\nMISSING\n", (False, False, False), "the variable"),
    # The variable but no mount (mounts.d missing): busybox and coreutils messages.
    ("NCCL_TOPO_FILE=/etc/nccl/topo.xml\nsha256sum: /etc/nccl/topo.xml: No such file or directory\nMISSING\n",
     (True, False, False), "the file"),
    ("NCCL_TOPO_FILE=/etc/nccl/topo.xml\nsha256sum: can't open '/etc/nccl/topo.xml': No such file or directory\nMISSING\n",
     (True, False, False), "the file"),
    ("NCCL_TOPO_FILE=/etc/nccl/topo.xml\r\n%s  /etc/nccl/topo.xml\r\n" % OTHER, (True, True, False), "a stale copy (checksum differs)"),
    ("NCCL_TOPO_FILE=/other.xml\n%s  /other.xml\n" % SHA, (False, True, True), "the variable"),
    ("", (False, False, False), "the variable"),
])
def test_parse_probe(out, ok, half):
    probe = T.parse_probe(out, "/etc/nccl/topo.xml", SHA)
    assert (probe["variable_ok"], probe["file_ok"], probe["checksum_ok"]) == ok
    assert half in probe["message"]


@pytest.mark.parametrize("exports", [
    # busybox ash / dash
    "export HOME='/root'\nexport NCCL_TOPO_FILE='/etc/nccl/topo.xml'\nexport NCCL_IB_HCA='=mlx5_0,mlx5_1'\nexport NCCL_DEBUG",
    # bash
    'declare -x HOME="/root"\ndeclare -x NCCL_TOPO_FILE="/etc/nccl/topo.xml"\ndeclare -x NCCL_IB_HCA="=mlx5_0,mlx5_1"\ndeclare -x NCCL_DEBUG',
])
def test_parse_probe_extras_reads_both_export_formats_and_the_hcas(exports):
    out = ("NCCL_TOPO_FILE=/etc/nccl/topo.xml\n%s  /etc/nccl/topo.xml\n--gpunode-env--\n%s\n--gpunode-hca--\nmlx5_1\nmlx5_0\n"
           "--gpunode-end--\n" % (SHA, exports))
    extras = T.parse_probe_extras(out)
    assert extras == {"variables": {"NCCL_TOPO_FILE": "/etc/nccl/topo.xml", "NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_DEBUG": ""},
                      "hcas": ["mlx5_0", "mlx5_1"]}
    assert T.parse_probe(out, "/etc/nccl/topo.xml", SHA)["checksum_ok"]
    assert T.parse_probe_extras("NCCL_TOPO_FILE=\n") == {"variables": None, "hcas": None}


def test_probe_commands():
    assert T.probe_command({"runtime": "podman", "image": "busybox"}, "gpunode.io/nccl=topo") == [
        "podman", "run", "--rm", "--network", "none", "--device", "gpunode.io/nccl=topo", "busybox", "sh", "-c", T.PROBE]
    assert T.PROBE.startswith('echo "NCCL_TOPO_FILE=$NCCL_TOPO_FILE"; sha256sum "$NCCL_TOPO_FILE" 2>&1 || echo MISSING; ')
    assert T.probe_command({"runtime": "enroot", "image": "pytorch"}, "x")[:3] == ["enroot", "start", "pytorch"]


def _params(tree, **extra):
    params = dict((k, v["default"] if "default" in v else None) for k, v in T.ARGUMENT_SPEC.items())
    params.update(src=SRC, root=tree, sysfs_path=os.path.join(tree, "sys"))
    params.update(extra)
    return params


def test_converge_verify_runs_the_probe_after_writing(tree, monkeypatch):
    monkeypatch.setattr(T, "is_live_root", lambda root: True)
    seen = []

    def fake(argv):
        seen.append((argv, os.path.exists(os.path.join(tree, CDI))))
        return 0, "NCCL_TOPO_FILE=/etc/nccl/topo.xml\n%s  /etc/nccl/topo.xml\n" % SHA, ""

    verify = {"runtime": "podman", "image": "busybox"}
    result, dummy = T.converge(_params(tree, verify=verify), None, True)
    assert "verify" not in result and result["verified"] is False and "no command runner" in result["warnings"][0]
    # check mode with changes pending: the probe runs against the files as they are now (none written yet)
    result, dummy = T.converge(_params(tree, verify=verify), fake, True)
    assert result["changed"] and result["verified"] is True and seen[0][1] is False and "check mode wrote none" in result["warnings"][0]
    result, dummy = T.converge(_params(tree, verify=verify), fake, False)
    assert result["verify"]["checksum_ok"] is True and result["verified"] is True and seen[1][1] is True and seen[1][0][0] == "podman"
    result, dummy = T.converge(_params(tree, verify=verify), fake, True)
    assert result["changed"] is False and "verify" in result and len(seen) == 3

    def stale(argv):
        return 0, "NCCL_TOPO_FILE=/etc/nccl/topo.xml\n%s  /etc/nccl/topo.xml\n" % OTHER, ""

    with pytest.raises(T.TopoError, match=r"stale copy \(checksum differs\)"):
        T.converge(_params(tree, verify={"runtime": "enroot", "image": "pyt"}), stale, False)

    def broken(argv):
        return 125, "", "Error: unresolvable CDI devices gpunode.io/nccl=topo"

    with pytest.raises(T.TopoError, match="unresolvable CDI devices"):
        T.converge(_params(tree, verify=verify), broken, False)
    with pytest.raises(T.TopoError, match="needs cdi in runtimes"):
        T.converge(_params(tree, verify=verify, runtimes=["enroot"]), fake, False)


# ------------------------------------------------------------------- log --

@pytest.mark.parametrize("text,path,status", [
    ("host:1:1 [0] NCCL INFO NCCL_TOPO_FILE set by environment to /etc/nccl/topo.xml\n"
     "host:1:1 [0] NCCL INFO Loading topology file /etc/nccl/topo.xml\n", "/etc/nccl/topo.xml", "loaded"),
    ("host:1:1 [0] NCCL INFO Loading topology file /etc/nccl/topo.xml\n", None, "loaded"),
    ("host:1:1 [0] NCCL INFO Loading topology file /other.xml\n", "/etc/nccl/topo.xml", "not_seen"),
    ("host:1:1 [0] NCCL WARN Could not open XML topology file /etc/nccl/topo.xml : No such file or directory\n",
     "/etc/nccl/topo.xml", "not_found"),
    ("host:1:1 [0] NCCL INFO Loading topology file /etc/nccl/topo.xml\n"
     "host:1:1 [0] NCCL WARN XML Parse : Unexpected value with name cpu\n", "/etc/nccl/topo.xml", "parse_error"),
    ("host:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.4<0>\n", None, "not_seen"),
    ("", None, "not_seen"),
])
def test_nccl_log_loaded(text, path, status):
    assert T.nccl_log_loaded(text, path) == status


def _log(name):
    return (FIXTURES / "logs" / name).read_text()


def test_real_log_parse_error_is_keyed_on_the_configured_file():
    """NCCL 2.18.3 failing to parse a host-path NCCL_TOPO_FILE (fixtures/nccl_topo/logs): its "XML Parse" line
    names no file; it is this file's error only when it follows this file's loading line."""
    text = _log("nccl_2.18.3_host_topo_file_xml_parse.log")
    host = "/root/rdma-bench/NCCL_GP/test2/nccl_topo.xml"
    assert T.nccl_log_loaded(text, ["/etc/nccl/topo.xml", host]) == "parse_error"
    assert T.nccl_log_loaded(text, host) == "parse_error"
    assert T.nccl_log_loaded(text) == "parse_error"  # the file the log's NCCL_TOPO_FILE line names
    # a log about another file says nothing about ours
    assert T.nccl_log_loaded(text, "/etc/nccl/topo.xml") == "not_seen"


def test_real_log_xml_parse_of_another_file_is_not_ours():
    """The real RCCL log (four ranks load the host file, then build the system) followed by a parse error of the
    graph file, and one of NCCL's default virtual topology file: neither is the configured topology file's."""
    text = _log("rccl_4ranks_host_topo_file_loaded.log")
    ours = "/root/rccl_topo_fixed.xml"
    assert T.nccl_log_loaded(text, ours) == "loaded"
    graph = text + ("macpro2019-01:254561:254699 [0] NCCL INFO NCCL_GRAPH_FILE set by environment to /root/graph.xml\n"
                    "macpro2019-01:254561:254699 [0] graph/xml.cc:155 NCCL WARN XML Parse : expected >, got '\n'\n")
    assert T.nccl_log_loaded(graph, ours) == "loaded"
    other = ("h:1:2 [0] NCCL INFO Loading topology file /var/run/nvidia-topologyd/virtualTopology.xml\n"
             "h:1:2 [0] graph/xml.cc:155 NCCL WARN XML Parse : Unexpected EOF\n") + text
    assert T.nccl_log_loaded(other, ours) == "loaded"
    assert T.nccl_log_loaded(text.replace("Loading topology file", "Could not open XML topology file"), ours) == "not_found"


def test_real_log_host_path_is_loaded_through_the_module(tree):
    """NCCL run on the host reads NCCL_TOPO_FILE=src, not the container path: the module keys on both."""
    write(tree + "/root/rccl_topo_fixed.xml", SMALL)
    kind, result = run(tree, src="/root/rccl_topo_fixed.xml", nccl_log=_log("rccl_4ranks_host_topo_file_loaded.log"))
    assert kind is Exit and result["nccl_log_status"] == "loaded"
    kind, result = run(tree, nccl_log=_log("rccl_4ranks_host_topo_file_loaded.log"))
    assert kind is Exit and result["nccl_log_status"] == "not_seen"


def test_nccl_log_is_reported(tree):
    kind, result = run(tree, nccl_log="x NCCL INFO Loading topology file /etc/nccl/topo.xml\n")
    assert kind is Exit and result["nccl_log_status"] == "loaded"


# --------------------------------------------------------------- content --

def test_content_is_validated_and_installed_at_src(tree):
    data = fixture("azure-ndv5-topo.xml")
    src = "/etc/gpunode/ndv5-topo.xml"
    kind, planned = run(tree, src=src, content=data.decode(), check=True)
    assert kind is Exit and not os.path.exists(tree + src)
    assert ("/etc/gpunode/ndv5-topo.xml", "create") in [(f["path"], f["action"]) for f in planned["files"]]
    kind, done = run(tree, src=src, content=data.decode())
    assert kind is Exit and done["files"] == planned["files"] and done["checksum"] == hashlib.sha256(data).hexdigest()
    with open(tree + src, "rb") as handle:
        assert handle.read() == data
    assert read(tree, FSTAB).startswith(src + " /etc/nccl/topo.xml ")
    kind, again = run(tree, src=src, content=data.decode())
    assert kind is Exit and again["changed"] is False
    kind, gone = run(tree, state="absent", src=src)
    assert kind is Exit and os.path.exists(tree + src) and src not in [f["path"] for f in gone["files"]]


def test_bad_content_fails_naming_src_and_writes_nothing(tree):
    before = snapshot(tree)
    kind, result = run(tree, src="/etc/gpunode/new.xml", content=fixture("azure-ncv4-graph.xml").decode())
    assert kind is Fail and "/etc/gpunode/new.xml" in result["msg"] and "<graphs>" in result["msg"], result
    assert snapshot(tree) == before
