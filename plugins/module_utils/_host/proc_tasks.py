# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which processes ran user work on which CPUs during a sampling window (seed 000, step 2: "data loaders on those CPUs").

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``/proc/stat`` says how much user work a CPU ran; this says whose.

* ``read_tasks`` reads ``/proc/PID/task/TID/stat`` of every thread (the raw
  lines, under ``procfs``: a captured tree works the same; a thread that ends
  while it is read is skipped). A captured tree is data: directories that are
  links are not entered, files are opened without following links and read
  only when regular (``_host.fileio.read_data``).
* ``parse_task_stat`` (pure) reads one line: the command name is the text
  between the first ``(`` and the *last* ``)``, since a name may hold spaces
  and parentheses (proc(5)); after it, field 14 ``utime``, 15 ``stime``, 22
  ``starttime`` and 39 ``processor`` (the CPU the thread last ran on).
* ``attribute`` (pure) turns two readings into per-process, per-CPU user
  ticks: a thread's ``utime`` growth is charged to the CPU it last ran on. A
  thread bound to one CPU (a pinned data loader, a fenced unit) is charged
  exactly; one that moved during the window is charged to where it ended, and
  a thread that started and ended inside the window is not seen at all (its
  time reaches its parent's ``cutime`` only when reaped). So the per-CPU sums
  are a lower bound, and the report gives the share of the CPU's user ticks
  they explain. The same thread id with another ``starttime`` is a new thread.

Ticks are USER_HZ (``user_hz``); the report gives percentages of the window's time, as mpstat does.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import read_data, real_dir

# Field numbers of proc(5), counted from 1; after the ")" of the name, field 3 (state) is index 0.
UTIME, STIME, STARTTIME, PROCESSOR = 14, 15, 22, 39


def _digits(names):
    return sorted((name for name in names if name.isdigit()), key=int)


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def read_tasks(procfs="/proc"):
    """``{(pid, tid): stat line}`` of every thread under ``procfs``; threads that vanish while read are left out."""
    tasks = {}
    for pid in _digits(_listdir(procfs)):
        task_dir = os.path.join(procfs, pid, "task")
        if not (real_dir(os.path.join(procfs, pid)) and real_dir(task_dir)):
            continue    # a captured tree is data: a link is never followed
        for tid in _digits(_listdir(task_dir)):
            if not real_dir(os.path.join(task_dir, tid)):
                continue
            text = read_data(os.path.join(task_dir, tid, "stat"), limit=4096)
            if text:
                tasks[(int(pid), int(tid))] = text
    return tasks


def parse_task_stat(text):
    """``{comm, utime, stime, starttime, processor}`` of one stat line; None for a line that is not one."""
    opened, closed = text.find("("), text.rfind(")")
    if opened < 0 or closed < opened:
        return None
    fields = text[closed + 1:].split()
    try:
        return {
            "comm": text[opened + 1:closed],
            "utime": int(fields[UTIME - 3]),
            "stime": int(fields[STIME - 3]),
            "starttime": int(fields[STARTTIME - 3]),
            "processor": int(fields[PROCESSOR - 3]),
        }
    except (IndexError, ValueError):
        return None


def attribute(first, second):
    """Per (pid, cpu): the user ticks that the process's threads ran between two ``read_tasks`` readings.

    Returns ``(rows, unreadable)``: rows ``{pid, comm, cpu, user_ticks, system_ticks, threads}`` with user or system
    ticks, largest user first; ``unreadable`` counts the lines of ``second`` that are not stat lines. A thread only
    in ``second`` (started in the window) is charged all its ticks.
    """
    rows = {}
    unreadable = 0
    for key, text in second.items():
        now = parse_task_stat(text)
        if now is None:
            unreadable += 1
            continue
        then = parse_task_stat(first[key]) if key in first else None
        if then is not None and then["starttime"] != now["starttime"]:
            then = None     # the thread id was reused: a new thread
        user = now["utime"] - (then["utime"] if then else 0)
        system = now["stime"] - (then["stime"] if then else 0)
        if user <= 0 and system <= 0:
            continue
        pid = key[0]
        row = rows.setdefault((pid, now["processor"]), {
            "pid": pid, "comm": None, "cpu": now["processor"], "user_ticks": 0, "system_ticks": 0, "threads": 0})
        if key[0] == key[1] or row["comm"] is None:
            row["comm"] = now["comm"]  # the process's name is its main thread's
        row["user_ticks"] += max(user, 0)
        row["system_ticks"] += max(system, 0)
        row["threads"] += 1
    ordered = sorted(rows.values(), key=lambda row: (-row["user_ticks"], -row["system_ticks"], row["pid"], row["cpu"]))
    return ordered, unreadable


def read_cgroup(procfs, pid):
    """The process's cgroup v2 path (``0::/system.slice/x.service``), else its first hierarchy's; None if unreadable."""
    text = read_data(os.path.join(procfs, str(pid), "cgroup"), limit=65536) if real_dir(os.path.join(procfs, str(pid))) else None
    if not text:
        return None
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for number, _controllers, path in lines:
        if number == "0":
            return path
    return lines[0][2] if lines else None


def user_hz():
    """USER_HZ, the unit of utime and /proc/stat (``SC_CLK_TCK``; 100 on every architecture Linux runs GPUs on)."""
    try:
        return os.sysconf("SC_CLK_TCK") or 100
    except (AttributeError, ValueError, OSError):
        return 100


def on_cpus(rows, cpu_user_pct, elapsed, procfs="/proc", top=5, hz=None):
    """What ran user work on the CPUs of ``cpu_user_pct`` ({cpu: usr + nice % of the window, from /proc/stat}).

    Per CPU, in CPU order: ``{cpu, user_pct, attributed_pct, processes: [{pid, comm, cgroup, user_ticks, user_pct}]}``
    with at most ``top`` processes, largest first (cgroups read now, from ``procfs``). A process's ``user_pct`` is its
    user time over the window's ``elapsed`` seconds, like mpstat's; ``attributed_pct`` is the share of the CPU's usr
    that the listed threads explain (at most 100). Both are percentages of time: /proc/stat counts the ticks a CPU
    received, and a guest whose vCPU is not scheduled loses ticks, while utime follows the task's measured runtime,
    so ticks are never compared with ticks across the two.
    """
    hz = hz or user_hz()
    result = []
    cgroups = {}
    for cpu in sorted(cpu_user_pct):
        mine = [row for row in rows if row["cpu"] == cpu and row["user_ticks"] > 0]
        processes = []
        for row in mine[:top]:
            if row["pid"] not in cgroups:
                cgroups[row["pid"]] = read_cgroup(procfs, row["pid"])
            processes.append({
                "pid": row["pid"], "comm": row["comm"], "cgroup": cgroups[row["pid"]], "user_ticks": row["user_ticks"],
                "user_pct": round(100.0 * row["user_ticks"] / (elapsed * hz), 1) if elapsed > 0 else None,
            })
        usr = cpu_user_pct[cpu]
        attributed = 100.0 * sum(row["user_ticks"] for row in mine) / (elapsed * hz) if elapsed > 0 else 0.0
        result.append({
            "cpu": cpu, "user_pct": usr, "processes": processes,
            "attributed_pct": round(min(100.0, 100.0 * attributed / usr), 1) if usr else None,
        })
    return result


def describe(item):
    """One line for a report: ``CPU 2 (usr 46.8 %): systemd (pid 1203, /user.slice/...) 40.1 %, ...``."""
    parts = []
    for proc in item["processes"]:
        share = "" if proc["user_pct"] is None else " usr %s %%" % proc["user_pct"]
        parts.append("%s (pid %d, %s)%s" % (proc["comm"], proc["pid"], proc["cgroup"] or "cgroup unknown", share))
    text = "CPU %d (usr %s %%): %s" % (item["cpu"], item["user_pct"], ", ".join(parts) or "no process seen")
    if item["attributed_pct"] is not None and item["attributed_pct"] < 90:
        text += " (these explain %s %% of its usr; the rest ran in threads that ended inside the window)" % (
            item["attributed_pct"])
    return text
