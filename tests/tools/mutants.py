# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Mutation testing of the decision code with mutmut 3, one area at a time (``./run.sh mutants``).

Each area is a few ``plugins/module_utils`` files and the unit tests that cover them; a run mutates only
those files and runs only those tests, so one area takes minutes on two cores, not hours.

mutmut names a mutant after the path of its file and only sees the mutant when the tests import the
module under that same dotted name. The tests import ``ansible_collections.gpunode.tuning...``, so each
area runs in a scratch copy of the repository laid out as a collection
(``$TMPDIR/gpunode-mutants/AREA/ansible_collections/gpunode/tuning``, outside the repository: nothing
for ``ansible-test sanity`` to scan) with mutmut's ``setup.cfg`` written beside ``ansible_collections``.
The copy is the files git would ship (tracked and untracked, not ignored), as ``./run.sh sanity`` does.

Usage: ``mutants.py [AREA|PATH...]``; no argument runs every area in the order below (most central
first). A PATH (``plugins/module_utils/_parse/cpulist.py``) mutates that file only, with its area's tests.
Per area, ``reports/mutants/AREA.json`` and ``AREA.md`` (git-ignored) get the counts and every
surviving mutant with its diff. Exit status 0 when every area ran (survivors are a result, not an
error), 1 when mutmut failed, 2 for an unknown argument. ``MUTANTS_JOBS`` (default 2) mutants run in parallel;
``MUTANTS_KEEP=1`` keeps the scratch copy (for ``mutmut show NAME`` or ``mutmut browse`` there).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTION = os.path.join("ansible_collections", "gpunode", "tuning")
MU = "plugins/module_utils/"
UT = "tests/unit/plugins/module_utils/"
UM = "tests/unit/plugins/modules/"

# area -> (files to mutate, tests that cover them), most central first.
AREAS = {
    "validate": ([MU + "_host/validate.py"],
                 [UT + "test_validate.py", UT + "test_validate_mutants.py", UM + "test_hostile_options.py"]),
    "cpulist": ([MU + "_parse/cpulist.py"],
                [UT + "test_cpulist.py", UT + "test_cpulist_mutants.py", UT + "test_slurm_cpus.py",
                 UT + "test_cpu_partition.py"]),
    "ckpt_copier": (
        [MU + "_checkpoint/copier.py", MU + "_checkpoint/config.py", MU + "_checkpoint/entries.py",
         MU + "_checkpoint/passes.py", MU + "_checkpoint/state.py"],
        [UT + "test_ckpt_copier.py", UT + "test_ckpt_copier_hostile.py"],
    ),
    "irq_placement": (
        [MU + "_nic_irq/affinity.py", MU + "_nic_irq/pin_plan.py", MU + "_host/topology.py"],
        [UT + "test_irq_affinity.py", UT + "test_irq_affinity_numa_local.py", UT + "test_topology.py",
         UT + "test_irq_affinity_results.py", UT + "test_rps.py", UM + "test_nic_irq_persist.py",
         UM + "test_nic_irq_persist_rps.py"],
    ),
    "slurm": (
        [MU + "_slurm/conf.py", MU + "_slurm/cpus.py", MU + "_slurm/view.py", MU + "_slurm/sysfs.py",
         MU + "_slurm/topology.py", MU + "_slurm/scontrol.py"],
        [UT + "test_slurm_conf.py", UT + "test_slurm_cpus.py", UT + "test_slurm_inputs_results.py",
         UT + "test_slurm_sysfs_reader.py", UT + "test_slurm_spec_results.py", UT + "test_slurm_conf_results.py",
         UM + "test_slurm_cpuspec.py"],
    ),
    "kernel_cmdline": (
        [MU + "_boot/kernel_cmdline.py", MU + "_boot/args.py", MU + "_boot/grub.py", MU + "_boot/grub_eval.py",
         MU + "_boot/grub_cfg.py", MU + "_boot/grubby.py"],
        [UT + "test_kernel_cmdline.py", UT + "test_kernel_cmdline_results.py", UM + "test_kernel_cmdline.py"],
    ),
    "cpu_power": ([MU + "_cpu/power.py"], [UT + "test_cpu_power.py", UM + "test_cpu_power_modules.py"]),
    "gpu_findings": (
        [MU + "_gpu/nvidia_smi.py", MU + "_gpu/dcgmi.py", MU + "_gpu/health.py"],
        [UT + "test_nvidia_smi.py", UT + "test_dcgmi.py", UT + "test_gpu_health_results.py",
         UM + "test_preflight_modules.py"],
    ),
    "preflight": (
        [MU + "_report/preflight.py"],
        [UT + "test_preflight.py", UT + "test_preflight_findings.py", UM + "test_preflight_modules.py"],
    ),
    "softnet_verdict": (
        [MU + "_softnet/verdict.py"],
        [UT + "test_softnet_verdict.py", UT + "test_softnet.py", UT + "test_softnet_issue28.py",
         UT + "test_softnet_verdict_numbers.py"],
    ),
}

# mutmut's own exit-code table (mutmut.stats.status_by_exit_code), read in the scratch copy.
COLLECT = r"""
import json, pathlib, sys
from difflib import unified_diff
from mutmut.stats import status_by_exit_code
from mutmut.mutation.diff_apply import get_diff_for_mutant
out = {}
for meta in sorted(pathlib.Path("mutants").rglob("*.py.meta")):
    path = str(meta.relative_to("mutants"))[:-len(".meta")]
    for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
        status = status_by_exit_code[code]
        entry = {"path": path, "status": status}
        if status not in ("killed", "timeout"):
            full = get_diff_for_mutant(name, path=path).splitlines()
            entry["diff"] = [l for l in full if l[:1] in "+-" and l[:3] not in ("+++", "---")]
        out[name] = entry
json.dump(out, sys.stdout)
"""


def shipped_files():
    """The repository's files as git would ship them: tracked and untracked, not ignored."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    return [n for n in names if n and os.path.isfile(os.path.join(ROOT, n))]


def setup_cfg(sources, tests):
    """mutmut's [mutmut] section for one area, paths relative to the scratch directory."""
    def lines(items):
        return "".join("\n    " + os.path.join(COLLECTION, i) for i in items)
    return ("[mutmut]\nsource_paths =%s\nalso_copy =\n    %s\npytest_add_cli_args_test_selection =%s\n"
            "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -o\n    tmp_path_retention_policy=failed\n"
            "use_git_change_detection = false\n"
            % (lines(sources), COLLECTION, lines(tests)))


def resolve(args):
    """[(area, files, functions)] for the command line; an unknown argument raises KeyError.

    ``AREA:f,g`` or ``PATH:f,g`` mutates only the top-level functions ``f`` and ``g`` (an area too large to run
    whole in the time there is)."""
    if not args:
        return [(name, AREAS[name][0], []) for name in AREAS]
    runs = []
    for arg in args:
        name, dummy, functions = arg.partition(":")
        functions = [f for f in functions.split(",") if f]
        rel = os.path.relpath(os.path.abspath(name), ROOT) if os.sep in name or name.endswith(".py") else name
        if rel in AREAS:
            runs.append((rel, AREAS[rel][0], functions))
            continue
        area = next((key for key, spec in AREAS.items() if rel in spec[0]), None)
        if area is None:
            raise KeyError(arg)
        runs.append((area, [rel], functions))
    return runs


def is_text_only(diff):
    """True for a mutant that only changes the text of a string literal (mutmut's ``XX..XX``, upper or lower case)."""
    minus = [line[1:] for line in diff if line.startswith("-")]
    plus = [line[1:] for line in diff if line.startswith("+")]
    return len(minus) == 1 and len(plus) == 1 and minus[0].lower() == plus[0].replace("XX", "").lower()


def summarise(mutants):
    """Counts per status and the score: killed and timed-out mutants over all mutants checked."""
    counts = {}
    for entry in mutants.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    total = len(mutants)
    caught = counts.get("killed", 0) + counts.get("timeout", 0)
    return {"mutants": total, "killed": counts.get("killed", 0), "timeout": counts.get("timeout", 0),
            "survived": counts.get("survived", 0), "other": total - caught - counts.get("survived", 0),
            "score": round(100.0 * caught / total, 1) if total else None, "statuses": counts,
            "survived_text_only": sum(1 for e in mutants.values()
                                      if e["status"] == "survived" and is_text_only(e["diff"]))}


# A mutant is code nobody reviewed, and the suite runs as root: a mutant of kernel_cmdline that dropped the root
# of a tree wrote a test's GRUB files into this machine's /etc/default/grub, /etc/default/grub.d and
# /var/lib/gpunode-tuning (2026-12-05). As root, mutmut therefore runs in a private mount namespace where / (with
# /etc, /var, /run, /boot, the repository unless under /tmp), /proc and /sys are read-only; only the scratch copy
# and /tmp (pytest's tmp_path) can be written. A mutant that writes outside them fails its tests (EROFS) and counts as killed, which is
# right: it would have written to the host.
SANDBOX = r"""
set -e
for dir in "$1" /tmp; do mount --bind "$dir" "$dir"; done
mount -o remount,bind,ro /
for dir in /proc /sys; do mount -o remount,bind,ro "$dir"; done
# the working directory was opened through the old mounts: enter it again through the new ones
cd "$PWD"
shift
exec "$@"
"""


def sandboxed(scratch, argv):
    """``argv`` in the read-only sandbox above when run as root (an unprivileged run cannot write the host's files)."""
    if os.geteuid() != 0:
        return argv
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SANDBOX, "sandbox", scratch] + argv


def sweep_sessions(temproot, done, every=5.0):
    """Until ``done``, every ``every`` seconds: remove each pytest session directory under ``temproot``
    (``pytest-of-USER/pytest-N``) whose ``.lock`` names a process that has ended (or that has had no lock for a
    minute)."""
    while True:
        for owner in glob.glob(os.path.join(temproot, "pytest-of-*")):
            for session in glob.glob(os.path.join(owner, "pytest-*")):
                if os.path.islink(session):
                    continue
                try:
                    with open(os.path.join(session, ".lock"), encoding="ascii") as handle:
                        pid = int(handle.read().strip() or 0)
                except (OSError, ValueError):
                    pid = None
                if pid is None:
                    # no lock yet (a session being made) or none left: only once it is a minute old
                    try:
                        ended = time.time() - os.lstat(session).st_mtime > 60
                    except OSError:
                        ended = False
                else:
                    ended = not os.path.exists("/proc/%d" % pid)
                if ended:
                    shutil.rmtree(session, ignore_errors=True)
        if done.wait(every):
            return


def run_area(area, files, functions, scratch, reports):
    """Lay out the scratch copy, run mutmut, write the area's report; return the summary or None."""
    work = os.path.join(scratch, area)
    shutil.rmtree(work, ignore_errors=True)
    tree = os.path.join(work, COLLECTION)
    for name in shipped_files():
        os.makedirs(os.path.join(tree, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), os.path.join(tree, name))
    with open(os.path.join(work, "setup.cfg"), "w", encoding="utf-8") as handle:
        handle.write(setup_cfg(files, AREAS[area][1]))
    log_path = os.path.join(reports, area + ".log")
    started = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        # Every mutant is a pytest session of its own, in a child that ends without running atexit, so pytest
        # never drops the session's lock and never removes its tmp_path trees (a generated 176-CPU sysfs is tens
        # of MB): two runs of irq_placement filled this machine's disk (2026-12-07). The trees go under the area's
        # scratch copy, a passing test's tree is removed at its teardown (retention "failed"), and the janitor
        # removes every session whose process has ended.
        temproot = os.path.join(work, "pytest-tmp")
        os.makedirs(temproot)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DEBUG_TEMPROOT=temproot)
        done = threading.Event()
        janitor = threading.Thread(target=sweep_sessions, args=(temproot, done), daemon=True)
        janitor.start()
        jobs = os.environ.get("MUTANTS_JOBS", "2")
        globs = ["*.x_%s__mutmut_*" % f for f in functions]
        mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
        rc = subprocess.call(sandboxed(scratch, [mutmut, "run", "--max-children", jobs] + globs), cwd=work, stdout=log,
                             stderr=subprocess.STDOUT, env=env)
        done.set()
        janitor.join()
    if rc != 0:
        print("%s: mutmut run failed (exit %d); see %s" % (area, rc, log_path))
        return None
    found = subprocess.run([sys.executable, "-c", COLLECT], cwd=work, check=True, capture_output=True, text=True)
    mutants = json.loads(found.stdout)
    if functions:
        mutants = {k: v for k, v in mutants.items() if any(fnmatch.fnmatch(k, g) for g in globs)}
    summary = summarise(mutants)
    summary.update(area=area, files=files, functions=functions, tests=AREAS[area][1],
                   seconds=round(time.time() - started))
    summary["survivors"] = {k: v for k, v in sorted(mutants.items()) if v["status"] not in ("killed", "timeout")}
    with open(os.path.join(reports, area + ".json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    with open(os.path.join(reports, area + ".md"), "w", encoding="utf-8") as handle:
        handle.write("# %s: %s\n\n" % (area, " ".join(files)))
        for name, entry in summary["survivors"].items():
            handle.write("- `%s` (%s)\n\n```diff\n%s\n```\n\n" % (name, entry["status"], "\n".join(entry["diff"])))
    if not os.environ.get("MUTANTS_KEEP"):
        shutil.rmtree(work, ignore_errors=True)
    return summary


def main(argv):
    """Run the areas named on the command line (default: all) and print one line per area."""
    try:
        runs = resolve(argv)
    except KeyError as exc:
        print("mutants: unknown area or file %s; areas: %s; or a file of an area" % (exc, " ".join(AREAS)))
        return 2
    scratch = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gpunode-mutants")
    reports = os.path.join(ROOT, "reports", "mutants")
    os.makedirs(reports, exist_ok=True)
    failed = 0
    print("%-16s %8s %7s %9s %8s %6s %7s %6s"
          % ("area", "mutants", "killed", "survived", "timeout", "other", "score", "secs"))
    for area, files, functions in runs:
        summary = run_area(area, files, functions, scratch, reports)
        if summary is None:
            failed += 1
            continue
        print("%-16s %8d %7d %9d %8d %6d %6s%% %6d  (%d survivors change a string literal only)" % (
            area, summary["mutants"], summary["killed"], summary["survived"], summary["timeout"], summary["other"],
            summary["score"], summary["seconds"], summary["survived_text_only"]), flush=True)
        for name, entry in summary["survivors"].items():
            print("    %s (%s): %s" % (name, entry["status"], " | ".join(entry["diff"])[:200]))
    print("reports: %s" % reports)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
