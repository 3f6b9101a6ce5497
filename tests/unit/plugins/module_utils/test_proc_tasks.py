# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 28: whose user work runs on the IRQ CPUs (``_host.proc_tasks``), on this machine's real /proc and in run_check.

The live tests start a real CPU-bound process bound to one CPU and find it, by pid and CPU, in the attribution of
two real readings of /proc. The stat lines with odd names are synthetic (named as such below); the field layout is
proc(5)'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils._host.proc_tasks import (
    attribute,
    describe,
    on_cpus,
    parse_task_stat,
    read_cgroup,
    read_tasks,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_softnet_issue28  # noqa: E402

from ansible_collections.gpunode.tuning.plugins.module_utils._softnet.check import run_check  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "softnet_load"))

import softnet_load  # noqa: E402

grow = test_softnet_issue28.grow
lab_node = test_softnet_issue28.lab_node     # the same fixture: the lab gpu-node tree in contention on CPUs 2-3

BUSY = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.time() + 30\nwhile time.time() < end:\n    pass\n"


def synthetic_stat(pid, comm, utime, stime=0, starttime=500, processor=0):
    """A synthetic stat line in proc(5)'s layout (52 fields): pid (comm) state ... utime stime ... processor ..."""
    fields = ["S"] + ["0"] * 49
    fields[14 - 3], fields[15 - 3], fields[22 - 3], fields[39 - 3] = str(utime), str(stime), str(starttime), str(processor)
    return "%d (%s) %s\n" % (pid, comm, " ".join(fields))


def test_parse_reads_this_process_real_stat_line():
    line = Path("/proc/self/stat").read_text()
    parsed = parse_task_stat(line)
    assert parsed["comm"] == Path("/proc/self/comm").read_text().strip()
    assert parsed["processor"] in os.sched_getaffinity(0) or parsed["processor"] < os.cpu_count()
    assert parsed["starttime"] > 0 and parsed["utime"] >= 0


def test_parse_takes_the_name_up_to_the_last_parenthesis():
    # synthetic: a thread name may hold spaces and ")" (proc(5): "comm ... in parentheses")
    parsed = parse_task_stat(synthetic_stat(77, "a) (b c", 123, 4, 999, 6))
    assert parsed == {"comm": "a) (b c", "utime": 123, "stime": 4, "starttime": 999, "processor": 6}
    assert parse_task_stat("77 no name here") is None
    assert parse_task_stat("77 (short) S 1 2") is None


def test_attribute_charges_growth_to_the_last_cpu_and_sees_new_and_reused_threads():
    # synthetic readings: pid 10 with two threads (one moved to CPU 3), pid 20 started in the window,
    # tid 30 reused by a new thread (other starttime), pid 40 idle
    first = {(10, 10): synthetic_stat(10, "loader", 100, processor=2), (10, 11): synthetic_stat(11, "worker", 50, processor=2),
             (30, 30): synthetic_stat(30, "old", 900, starttime=1), (40, 40): synthetic_stat(40, "idle", 5)}
    second = {(10, 10): synthetic_stat(10, "loader", 160, processor=2), (10, 11): synthetic_stat(11, "worker", 90, processor=3),
              (20, 20): synthetic_stat(20, "sshd", 7, stime=3, starttime=800, processor=2),
              (30, 30): synthetic_stat(30, "new", 12, starttime=700, processor=2), (40, 40): synthetic_stat(40, "idle", 5),
              (50, 50): "garbage"}
    rows, unreadable = attribute(first, second)
    assert unreadable == 1
    got = dict(((row["pid"], row["cpu"]), (row["comm"], row["user_ticks"], row["system_ticks"])) for row in rows)
    assert got == {(10, 2): ("loader", 60, 0), (10, 3): ("worker", 40, 0), (20, 2): ("sshd", 7, 3), (30, 2): ("new", 12, 0)}
    assert [row["pid"] for row in rows][:2] == [10, 10]   # largest user work first


def test_on_cpus_gives_time_shares_cgroups_and_the_unexplained_rest(tmp_path):
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text("0::/gpunode-workload.slice/loader.service\n")
    rows = [{"pid": 10, "comm": "loader", "cpu": 2, "user_ticks": 300, "system_ticks": 0, "threads": 1},
            {"pid": 11, "comm": "x", "cpu": 5, "user_ticks": 99, "system_ticks": 0, "threads": 1}]
    # 10 s at USER_HZ 100: 300 ticks are 30 % of the window; CPU 2's usr was 60 %, CPU 3's 2 % with no thread seen
    items = on_cpus(rows, {2: 60.0, 3: 2.0}, 10.0, procfs=str(tmp_path), hz=100)
    assert items == [
        {"cpu": 2, "user_pct": 60.0, "attributed_pct": 50.0, "processes": [
            {"pid": 10, "comm": "loader", "cgroup": "/gpunode-workload.slice/loader.service", "user_ticks": 300, "user_pct": 30.0}]},
        {"cpu": 3, "user_pct": 2.0, "attributed_pct": 0.0, "processes": []}]
    text = describe(items[0])
    assert text.startswith("CPU 2 (usr 60.0 %): loader (pid 10, /gpunode-workload.slice/loader.service) usr 30.0 %")
    assert "explain 50.0 % of its usr" in text
    assert describe(items[1]) == ("CPU 3 (usr 2.0 %): no process seen (these explain 0.0 % of its usr; the rest ran in "
                                  "threads that ended inside the window)")
    # a guest that lost ticks: utime (runtime) over the window can exceed usr (ticks): capped at 100
    assert on_cpus(rows, {2: 20.0}, 10.0, procfs=str(tmp_path), hz=100)[0]["attributed_pct"] == 100.0
    assert read_cgroup(str(tmp_path), 99) is None


def test_a_real_busy_process_bound_to_a_cpu_is_found_there():
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)])
    try:
        time.sleep(0.5)         # bound and busy
        first = read_tasks("/proc")
        time.sleep(1.5)
        second = read_tasks("/proc")
    finally:
        child.kill()
        child.wait()
    rows, unreadable = attribute(first, second)
    assert unreadable == 0
    mine = [row for row in rows if row["pid"] == child.pid]
    assert [row["cpu"] for row in mine] == [cpu]
    # 1.5 s of a busy loop is 150 USER_HZ ticks when it has the CPU alone; this machine is shared, so at least 30
    assert mine[0]["user_ticks"] >= 30, mine
    item = on_cpus(rows, {cpu: 50.0}, 1.5, procfs="/proc")[0]
    found = [p for p in item["processes"] if p["pid"] == child.pid]
    assert found and found[0]["user_pct"] >= 20.0, item
    assert found[0]["cgroup"] is None or found[0]["cgroup"].startswith("/")


def test_run_check_names_the_process_behind_the_user_work_on_the_irq_cpus(lab_node):
    """The lab tree in contention on CPUs 2-3 (usr 55-65 %), a worker bound to CPU 2 whose utime grows in the window."""
    tree, queue_irqs, profile = lab_node
    task = Path(tree.proc, "814", "task", "814")
    task.mkdir(parents=True)
    (task / "stat").write_text(synthetic_stat(814, "python3", 1000, processor=2))
    Path(tree.proc, "814", "cgroup").write_text("0::/gpunode-workload.slice/gpunode-loop-worker-2.service\n")
    second_interrupts = grow(Path(tree.proc, "interrupts").read_text(), set(queue_irqs), {2: 40000, 3: 1200})
    now = {"t": 1000.0}

    def sleep(seconds):
        softnet_load.write_counters(tree.proc, profile, seconds)
        Path(tree.proc, "interrupts").write_text(second_interrupts)
        (task / "stat").write_text(synthetic_stat(814, "python3", 1000 + int(50 * seconds), processor=2))
        now["t"] += seconds

    options = {"interface": "enp66s1", "interval": 10.0, "link_speed_mbps": 10000}
    result = run_check(options, procfs=tree.proc, sysfs=tree.sys, run=tree.run, sleep=sleep, clock=lambda: now["t"])
    assert result["verdict"] == "contention"
    cpu2 = [item for item in result["irq_cpu_processes"] if item["cpu"] == 2][0]
    assert cpu2["processes"][0]["pid"] == 814 and cpu2["processes"][0]["user_ticks"] == 500
    assert cpu2["processes"][0]["user_pct"] == 50.0      # 500 ticks in the 10 s window
    assert cpu2["processes"][0]["cgroup"] == "/gpunode-workload.slice/gpunode-loop-worker-2.service"
    assert any(reason.startswith("user work on the IRQ CPUs, by process: CPU 2 (usr 55.0 %): python3 (pid 814, "
                                 "/gpunode-workload.slice/gpunode-loop-worker-2.service)") for reason in result["reasons"]), result["reasons"]
    # CPU 3 runs user work too, but no thread seen: said so, not invented
    cpu3 = [item for item in result["irq_cpu_processes"] if item["cpu"] == 3][0]
    assert cpu3["processes"] == [] and cpu3["attributed_pct"] == 0.0


def test_a_captured_tree_with_planted_links_and_a_fifo_is_read_as_data(tmp_path):
    """A captured tree whose thread files are links to files of this machine, a linked process directory, and a FIFO:
    none is followed or opened for reading (a FIFO would hang a plain open), and the real thread is still read."""
    secret = tmp_path / "secret"
    secret.write_text(synthetic_stat(1, "SECRET", 999, processor=0))
    proc = tmp_path / "proc"
    (proc / "10" / "task" / "10").mkdir(parents=True)
    (proc / "10" / "task" / "10" / "stat").write_text(synthetic_stat(10, "real", 5, processor=1))
    (proc / "11" / "task" / "11").mkdir(parents=True)
    (proc / "11" / "task" / "11" / "stat").symlink_to(secret)
    (proc / "12").symlink_to(proc / "10")
    (proc / "13" / "task" / "13").mkdir(parents=True)
    os.mkfifo(str(proc / "13" / "task" / "13" / "stat"))
    (proc / "14" / "task").mkdir(parents=True)
    (proc / "14" / "task" / "14").symlink_to(proc / "10" / "task" / "10")
    (proc / "10" / "cgroup").symlink_to(secret)
    tasks = read_tasks(str(proc))
    assert list(tasks) == [(10, 10)] and "real" in tasks[(10, 10)]
    assert read_cgroup(str(proc), 10) is None
    assert read_cgroup(str(proc), 12) is None
