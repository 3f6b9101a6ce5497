"""CpuSpecList with real Slurm daemons: slurmctld and slurmd 22.05 in one gpu-node guest (cgroup v2).

Runs after prepare (the admin's configuration, daemons started), converge
(tune.yml: the NIC IRQs pinned on 2 CPUs, then the slurm_cpuspec role with the
prerequisites set and scontrol reconfigure allowed), idempotence and the
check-mode pass. The tests run in file order:

  1  slurmctld reports CPUSpecList = the cores of the IRQ CPUs, what the role
     planned; the prerequisites it set are in the files; nodes.conf was split
     for gpu-node only, the spares keep their own line (and NodeAddr), every
     other line is byte for byte the admin's
  2  real jobs (srun -c1 and srun -c<every other CPU>) never get a reserved
     CPU; slurmd itself is confined to them (no SlurmdOffSpec)
  3  ConstrainCores=no put back by hand, and the prerequisites not to be set:
     the role fails naming ConstrainCores, and no file changed
  4  a hand edit of the node's CpuSpecList is drift in check mode
  5  state=absent: CpuSpecList is off the line and, after the handler restarted
     slurmd and slurmctld, slurmd runs on every CPU and jobs get all 8
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from labtest import EPHEMERAL, GPU, SCENARIO, cpus, playbook, report, ssh  # noqa: E402

NAME = GPU["name"]
FILES = ("/etc/slurm/slurm.conf", "/etc/slurm/nodes.conf", "/etc/slurm/cgroup.conf")
ADMIN = SCENARIO / "files"


def slurm_report(tag):
    return json.loads((EPHEMERAL / ("slurm-%s-%s.json" % (NAME, tag))).read_text())


def node_record():
    line = ssh(NAME, "scontrol show node -o gpu-node").stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


def job_cpus(ncpus):
    out = ssh(NAME, "timeout 60 srun --immediate=30 -n1 -c%d grep Cpus_allowed_list /proc/self/status" % ncpus).stdout
    return cpus(out.split()[-1])


def wait_idle():
    ssh(NAME, "for i in $(seq 60); do sinfo -h -N -n gpu-node -o %t | grep -qx idle && exit 0; sleep 1; done; sinfo -N; exit 1")


def sums():
    return ssh(NAME, "sha256sum %s" % " ".join(FILES)).stdout


def whole_cores(irq):
    return set().union(*({cpu, cpu ^ 1} for cpu in irq))       # QEMU numbers SMT siblings 0-1, 2-3, ...


def test_slurmctld_reports_the_irq_cpus_cores_and_the_files_say_why():
    irq = cpus(report(NAME, "run")["cpus"])
    assert len(irq) == 2 and irq <= GPU["cpus"], irq
    reserved = whole_cores(irq)
    planned = slurm_report("run")
    node = planned["nodes"][0]
    assert node["name"] == NAME and cpus(node["os_cpus"]) == irq
    assert cpus(node["cpu_spec_list"]) == reserved           # abstract ids equal OS ids in the guest
    assert cpus(node["extra_os_cpus"]) == reserved - irq
    record = node_record()
    assert cpus(record["CPUSpecList"]) == reserved, record
    assert int(record["CoreSpecCount"]) == len(reserved) // 2, record
    # the report is the idempotence pass's: every prerequisite is met (converge set two of them, see the files)
    assert {p["name"]: p["ok"] for p in planned["prerequisites"]} == {"task_cgroup": True, "select_cons_tres": True,
                                                                      "constrain_cores": True}
    assert planned["verified"] == [{"name": NAME, "ok": True, "reported": node["cpu_spec_list"], "message": ""}]

    slurm_conf = ssh(NAME, "cat /etc/slurm/slurm.conf").stdout
    assert "TaskPlugin=task/affinity,task/cgroup\n" in slurm_conf
    assert slurm_conf.replace("task/affinity,task/cgroup", "task/affinity") == (ADMIN / "slurm.conf").read_text()
    assert ssh(NAME, "cat /etc/slurm/cgroup.conf").stdout == (ADMIN / "cgroup.conf").read_text() + "ConstrainCores=yes\n"
    nodes = ssh(NAME, "cat /etc/slurm/nodes.conf").stdout.splitlines(True)
    admin = (ADMIN / "nodes.conf").read_text().splitlines(True)
    assert nodes[:2] == admin[:2]                             # DEFAULT line and comment, byte for byte
    assert nodes[2].startswith("# NodeName=gpu-node,spare[01-02] (was /etc/slurm/nodes.conf line 3) split")
    assert nodes[3:] == [
        "nodename=gpu-node NodeAddr=127.0.1.1 CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2 CpuSpecList=%s\n" % (
            node["cpu_spec_list"]),
        "nodename=spare[01-02] NodeAddr=127.0.0.[2-3] CPUs=8 Sockets=2 CoresPerSocket=2 ThreadsPerCore=2\n",
    ], nodes
    spare = ssh(NAME, "scontrol show node -o spare02").stdout
    assert "NodeAddr=127.0.0.3 " in spare and "CPUSpecList" not in spare, spare
    backups = ssh(NAME, "ls /etc/slurm/").stdout.split()
    assert any(name.startswith("nodes.conf.") and name.endswith("~") for name in backups), backups


def test_jobs_never_get_a_reserved_cpu_and_slurmd_runs_on_them():
    reserved = cpus(node_record()["CPUSpecList"])
    free = set(range(8)) - reserved
    assert job_cpus(1) <= free
    assert job_cpus(len(free)) == free
    slurmd = ssh(NAME, "cat /sys/fs/cgroup/system.slice/slurmd.service/cpuset.cpus.effective").stdout
    assert cpus(slurmd) == reserved, slurmd


def test_constrain_cores_no_by_hand_is_a_missing_prerequisite_and_nothing_is_written():
    ssh(NAME, "sed -i 's/^ConstrainCores=yes$/ConstrainCores=no/' /etc/slurm/cgroup.conf")
    before = sums()
    try:
        res, dummy = playbook("--extra-vars", "slurm_cpuspec_set_prerequisites=false", tag="noprereq")
        assert res.returncode != 0, res.stdout
        out = res.stdout + res.stderr
        assert "ConstrainCores=yes in cgroup.conf (/etc/slurm/cgroup.conf: no)" in out, out[-3000:]
        assert sums() == before
    finally:
        ssh(NAME, "sed -i 's/^ConstrainCores=no$/ConstrainCores=yes/' /etc/slurm/cgroup.conf")


def test_a_hand_edit_of_the_node_line_is_drift_in_check_mode():
    nodes = ssh(NAME, "cat /etc/slurm/nodes.conf").stdout
    ssh(NAME, "sed -i 's/ CpuSpecList=[^ ]*$/ CpuSpecList=0-1/' /etc/slurm/nodes.conf")
    try:
        res, recap = playbook(check=True, tag="drift")
        assert res.returncode == 0, res.stdout[-3000:]
        assert recap[NAME] > 0, res.stdout[-3000:]
        assert re.search(r"(?m)^-nodename=gpu-node .*CpuSpecList=0-1$", res.stdout), res.stdout[-3000:]
        assert ssh(NAME, "grep -c 'CpuSpecList=0-1' /etc/slurm/nodes.conf").stdout.strip() == "1"     # nothing written
        # tune.yml's drift report says so, from the module's own plan: DRIFT, slurm_cpuspec on gpu-node, the file.
        drift = json.loads((EPHEMERAL / "tune-drift" / "cluster.json").read_text())
        assert drift["gate"] == "no_go" and "DRIFT" in drift["gate_text"], drift["gate_text"]
        found = {f["check"]: f for f in drift["hosts"][0]["findings"]}
        assert found["slurm_cpuspec"]["status"] == "warn" and found["slurm_cpuspec"]["fatal"], found
        assert "change /etc/slurm/nodes.conf" in found["slurm_cpuspec"]["message"], found
        assert found["nic_irq_pinning"]["status"] == "pass", found
        junit = (EPHEMERAL / "tune-drift" / "cluster.junit.xml").read_text()
        assert 'failures="1"' in junit and "slurm_cpuspec" in junit
    finally:
        ssh(NAME, "cat > /etc/slurm/nodes.conf <<'EOF'\n%sEOF" % nodes)


def test_absent_gives_every_cpu_back_to_jobs():
    res, recap = playbook("--extra-vars", "slurm_cpuspec_state=absent", tag="absent")
    assert res.returncode == 0 and recap[NAME] > 0, res.stdout[-3000:]
    assert "CpuSpecList" not in ssh(NAME, "cat /etc/slurm/nodes.conf").stdout
    wait_idle()
    record = node_record()
    assert "CPUSpecList" not in record and record.get("CoreSpecCount") in (None, "0"), record
    assert record["CPUEfctv"] == "8", record
    assert cpus(ssh(NAME, "cat /sys/fs/cgroup/system.slice/slurmd.service/cpuset.cpus.effective").stdout) == set(range(8))
    assert job_cpus(8) == set(range(8))
