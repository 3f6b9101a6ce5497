"""NCCL_TOPO_FILE and the topology file inside real containers: podman 4.3 with CDI and enroot 4.1.2, one small-node.

Runs after prepare (a busybox image: localhost/bb:1 in podman, /root/bb.sqsh for
enroot), converge (tune.yml: the nccl_topology role with a real Azure ND H100 v5
topology file, /etc/nccl.conf keys and a podman verification), idempotence and
the check-mode pass. Seed 002's case 4 is the negative: a file configured on the
host that never reached the container. The tests run in file order:

  1  podman with the CDI device: the variable and a file with the host's
     checksum; without the device: neither (the case-study failure)
  2  enroot start and a pyxis job (srun --container-image): the same through
     mounts.d/environ.d, and nccl.conf too; without the module's two entries:
     neither
  3  playbooks/preflight.yml (the nccl_topology role in check mode, its probe):
     nccl:topology passes with the host file's checksum inside, the NCCL
     variables inside are reported, no RDMA device so container_hcas is
     not_applicable; with the CDI spec taken away the container lacks the
     variable, nccl:topology is fatal, the playbook exits non-zero and nothing
     was written back
  4  the mount taken away by hand: the role's verification fails, naming the
     file as the missing half, and check mode wrote nothing back
  5  state=absent removes every file the module wrote
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import EPHEMERAL, REPO, playbook, ssh  # noqa: E402

NAME = "small-node"
TOPO = REPO / "tests" / "unit" / "fixtures" / "nccl_topo" / "azure-ndv5-topo.xml"
SHA = hashlib.sha256(TOPO.read_bytes()).hexdigest()
PROBE = "echo VAR=$NCCL_TOPO_FILE; sha256sum /etc/nccl/topo.xml 2>&1; cat /etc/nccl.conf 2>&1"
FSTAB = "/etc/enroot/mounts.d/50-gpunode-nccl.fstab"
ENV = "/etc/enroot/environ.d/50-gpunode-nccl.env"
CDI = "/etc/cdi/gpunode-nccl.yaml"
CONF = "/etc/nccl.conf"


def podman(device):
    flag = "--device gpunode.io/nccl=topo " if device else ""
    return ssh(NAME, "podman run --rm --network none %slocalhost/bb:1 sh -c '%s' 2>/dev/null" % (flag, PROBE), check=False).stdout


def enroot():
    """A fresh enroot container each time (x-create leaves a placeholder in a kept one: ../shared/LAB.md)."""
    return ssh(NAME, "enroot remove -f probe >/dev/null 2>&1; enroot create -n probe /root/bb.sqsh >/dev/null 2>&1 && "
                     "enroot start probe sh -c '%s'; enroot remove -f probe >/dev/null 2>&1" % PROBE, check=False).stdout


def pyxis():
    """A Slurm job in an enroot container through pyxis (srun --container-image)."""
    return ssh(NAME, "timeout 120 srun --container-image=/root/bb.sqsh sh -c '%s'" % PROBE, check=False).stdout


def nccl_report():
    return json.loads((EPHEMERAL / ("nccl-%s-run.json" % NAME)).read_text())


def test_podman_sees_both_with_the_cdi_device_and_neither_without_it():
    assert ssh(NAME, "sha256sum /etc/nccl/topo.xml").stdout.split()[0] == SHA     # installed byte for byte
    seen = podman(device=True)
    assert "VAR=/etc/nccl/topo.xml" in seen and SHA in seen, seen
    assert "NCCL_IB_QPS_PER_CONNECTION=4" in seen, seen
    bare = podman(device=False)
    assert "VAR=\n" in bare and SHA not in bare and "No such file" in bare, bare
    report = nccl_report()
    assert report["checksum"] == SHA and report["cdi_device"] == "gpunode.io/nccl=topo", report


def test_enroot_sees_both_through_mounts_d_and_environ_d_and_neither_without_them():
    seen = enroot()
    assert "VAR=/etc/nccl/topo.xml" in seen and SHA in seen and "NCCL_IB_SPLIT_DATA_ON_QPS=0" in seen, seen
    assert ssh(NAME, "cat %s" % CONF).stdout.splitlines()[1:] == ["NCCL_IB_QPS_PER_CONNECTION=4", "NCCL_IB_SPLIT_DATA_ON_QPS=0"]
    job = pyxis()
    assert "VAR=/etc/nccl/topo.xml" in job and SHA in job and "NCCL_IB_QPS_PER_CONNECTION=4" in job, job
    ssh(NAME, "mkdir -p /root/away && mv %s %s /root/away/" % (FSTAB, ENV))
    try:
        bare = enroot()
        assert "VAR=\n" in bare and SHA not in bare, bare
        job = pyxis()
        assert "VAR=\n" in job and SHA not in job, job
    finally:
        ssh(NAME, "mv /root/away/* /etc/enroot/mounts.d/ && mv /etc/enroot/mounts.d/50-gpunode-nccl.env /etc/enroot/environ.d/")


def preflight(tag):
    report_dir = EPHEMERAL / ("preflight-%s" % tag)
    res, recap = playbook("--extra-vars", "diagnose_interval=2 preflight_report_dir=%s" % report_dir,
                          path=REPO / "playbooks" / "preflight.yml")
    report = json.loads((report_dir / "cluster.json").read_text())
    return res, recap, dict((f["check"], f) for f in report["hosts"][0]["findings"])


def test_preflight_checks_the_topology_inside_the_container():
    res, recap, found = preflight("nccl")
    assert res.returncode == 0 and recap[NAME] == 0, res.stdout[-3000:]
    assert found["nccl:topology"]["status"] == "pass" and SHA in found["nccl:topology"]["message"], found["nccl:topology"]
    assert found["nccl:container_hcas"]["status"] == "not_applicable", found["nccl:container_hcas"]
    assert "NCCL_TOPO_FILE=/etc/nccl/topo.xml" in found["nccl:variables"]["message"], found["nccl:variables"]
    ssh(NAME, "mv %s /root/" % CDI)
    try:
        res, recap, found = preflight("nocdi")
        assert res.returncode != 0 and recap[NAME] == 0, res.stdout[-3000:]
        topo = found["nccl:topology"]
        assert topo["status"] == "fail" and topo["fatal"], topo
        assert "NO-GO" in res.stdout + res.stderr and "nccl:topology" in res.stdout + res.stderr
        assert ssh(NAME, "test -e %s || echo gone" % CDI).stdout.strip() == "gone"       # check mode put nothing back
    finally:
        ssh(NAME, "mv /root/%s %s" % (Path(CDI).name, CDI))


def test_without_the_mount_the_verification_names_the_missing_file():
    before = ssh(NAME, "ls /etc/enroot/mounts.d/").stdout
    ssh(NAME, "enroot remove -f probe >/dev/null 2>&1; enroot create -n probe /root/bb.sqsh >/dev/null 2>&1; mv %s /root/" % FSTAB)
    try:
        res, dummy = playbook("--extra-vars", "nccl_topology_verify_runtime=enroot nccl_topology_verify_image=probe", check=True, tag="nomount")
        out = res.stdout + res.stderr
        assert res.returncode != 0, out[-3000:]
        assert "the file" in out, out[-3000:]
        assert ssh(NAME, "test -e %s || echo gone" % FSTAB).stdout.strip() == "gone"       # check mode put nothing back
    finally:
        ssh(NAME, "mv /root/%s %s; enroot remove -f probe >/dev/null 2>&1 || true" % (Path(FSTAB).name, FSTAB))
    assert ssh(NAME, "ls /etc/enroot/mounts.d/").stdout == before


def test_absent_removes_every_file_it_wrote():
    res, recap = playbook("--extra-vars", "nccl_topology_state=absent", tag="absent")
    assert res.returncode == 0 and recap[NAME] > 0, res.stdout[-3000:]
    left = ssh(NAME, "ls %s %s %s %s 2>/dev/null; true" % (FSTAB, ENV, CDI, CONF)).stdout
    assert left.strip() == "", left
    bare = podman(device=False)
    assert "VAR=\n" in bare, bare
