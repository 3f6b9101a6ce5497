# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``dcgmi diag -r <level>`` text tables: parse them and judge the results (pure).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. ``parse_dcgmi_diag`` reads the box table; ``dcgm_findings`` turns its
tests into pass/warn/fail/not_applicable findings.

Layouts read (real captures in tests/unit/fixtures/gpu_health/dcgmi):

* 2.x/3.x: ``|-----  Deployment  ----+---|`` / ``+-----  Hardware  ---+---+``
  category borders, ``| Blacklist | Pass |`` test rows, results like
  ``Pass - All`` or ``Skip - All``, ``| Warning | ... |`` detail rows;
* 3.3+/4.x: a ``Metadata`` category (``DCGM Version``...), lower-case plugin
  names (``software``, ``memory``, ``pcie``), per-GPU rows ``| | GPU0: Pass |``
  and ``Warning``/``Info`` details wrapped over several rows, cut mid-word.

The table may be indented and surrounded by other text. ``-j`` JSON is not read.
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import finding

_CATEGORY_RE = re.compile(r"^[|+]-+\s+(\S.*?)\s+-+\+-*[|+]$")
_BORDER_RE = re.compile(r"^\+[-=+]+\+$")
_GPU_RESULT_RE = re.compile(r"^GPU(\d+):\s*(\S+)$")
RESULTS = ("Pass", "Fail", "Skip", "Warn")
_DETAIL_KINDS = frozenset(("Warning", "Info", "Error"))


class DcgmiError(DetailedError):
    """Text that is not a ``dcgmi diag`` table, or a result word that is not known.

    ``value`` is the offending input (or line) and ``expected`` says what would
    have been accepted.
    """


def _result(cell, line):
    word, dummy, scope = cell.partition(" - ")
    word = word.strip()
    if word not in RESULTS:
        raise DcgmiError(
            "dcgmi diag result %r is not one of %s" % (word, ", ".join(RESULTS)),
            value=line, expected="a result cell starting with Pass, Fail, Skip or Warn",
        )
    return word, scope.strip() or None


def _join(detail, chunk, width):
    """Glue a wrapped continuation ``chunk`` to ``detail`` (dcgmi cuts words at the cell width)."""
    if detail["_full"]:
        detail["text"] += chunk
    else:
        detail["text"] += " " + chunk.lstrip()
    detail["_full"] = len(chunk) >= width - 1


def parse_dcgmi_diag(text):
    """Parse ``dcgmi diag`` output into ``{layout, metadata, tests: [{name, category, result, scope, details, gpus}]}``."""
    if not isinstance(text, str) or "| Diagnostic" not in text:
        raise DcgmiError(
            "text is not a dcgmi diag result table", value=text if not isinstance(text, str) else text[:200],
            expected="the output of dcgmi diag -r <level> with its '| Diagnostic | Result |' header",
        )
    metadata, tests = {}, []
    category, test, detail = None, None, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] not in "|+":
            continue
        match = _CATEGORY_RE.match(line)
        if match:
            category, test, detail = match.group(1), None, None
            continue
        if _BORDER_RE.match(line) or not (line.startswith("|") and line.endswith("|")):
            continue
        inner = line[1:-1]
        left, sep, right = inner.partition("|")
        if not sep:
            continue
        name, width = left.strip(), len(right) - 2
        chunk = right[1:].rstrip() if right.startswith(" ") else right.rstrip()
        if name == "Diagnostic" and chunk.strip() == "Result":
            continue
        if category == "Metadata" and name:
            metadata[name] = chunk.strip()
            continue
        if name in _DETAIL_KINDS and test is not None:
            detail = {"kind": name, "text": chunk.strip(), "_full": len(chunk) >= width - 1}
            test["details"].append(detail)
            continue
        if name:
            result, scope = _result(chunk.strip(), raw)
            test = {"name": name, "category": category, "result": result, "scope": scope, "details": [], "gpus": {}}
            tests.append(test)
            detail = None
            continue
        if test is None:
            continue
        gpu = _GPU_RESULT_RE.match(chunk.strip())
        if gpu:
            test["gpus"][int(gpu.group(1))] = _result(gpu.group(2), raw)[0]
            detail = None
        elif detail is not None:
            _join(detail, chunk, width)
    if not tests:
        raise DcgmiError("dcgmi diag table has no test rows", value=text[:200], expected="rows such as '| memory | Pass |'")
    for test in tests:
        for detail in test["details"]:
            del detail["_full"]
    layout = "4.x" if any(t["gpus"] for t in tests) else "2.x/3.x"
    return {"layout": layout, "metadata": metadata, "tests": tests}


_STATUS = {"Pass": "pass", "Fail": "fail", "Warn": "warn", "Skip": "not_applicable"}


def dcgm_findings(parsed):
    """One finding ``{check, gpu, status, message, evidence, fix}`` per test of ``parse_dcgmi_diag``'s result."""
    if not isinstance(parsed, dict) or not isinstance(parsed.get("tests"), list):
        raise DcgmiError("dcgm_findings needs the result of parse_dcgmi_diag", value=parsed, expected="a dict with a 'tests' list")
    findings = []
    for test in parsed["tests"]:
        status = _STATUS[test["result"]]
        bad_gpus = sorted(g for g, r in test["gpus"].items() if r != "Pass")
        message = "dcgmi diag %s (%s): %s" % (test["name"], test["category"], test["result"])
        if status == "not_applicable":
            message += "; skipped is not a pass"
        if test["details"]:
            message += "; " + " | ".join("%s: %s" % (d["kind"], d["text"]) for d in test["details"])
        fix = None
        if status in ("fail", "warn"):
            fix = "read the nvvs/DCGM logs, reset the GPU and rerun dcgmi diag; a repeated hardware failure needs an RMA"
        elif status == "not_applicable":
            fix = "find out why the test was skipped (level, allow-list, MIG, permissions) and run it"
        evidence = {"category": test["category"], "result": test["result"], "scope": test["scope"], "gpus": test["gpus"], "details": test["details"]}
        findings.append(finding("dcgm:%s" % test["name"], status, message, evidence=evidence, fix=fix, gpu=bad_gpus or None))
    return findings


# The Deployment category (2.x/3.x rows such as "Blacklist", "NVML Library"; 4.x "software") checks the software
# around the GPUs; every other category (Hardware, Integration, Stress, Performance) runs the GPUs themselves.
DEPLOYMENT = "Deployment"


def dcgm_coverage(parsed):
    """One finding ``dcgm`` saying whether the diagnostics ran: ``warn`` when every test was skipped, or when every test
    beyond the Deployment checks was (DCGM#55: a level 3 run whose Integration, Hardware and Stress tests all say
    Skip); ``pass`` otherwise, counting what was skipped. A skip is never a pass of the gate (issue 29)."""
    if not isinstance(parsed, dict) or not isinstance(parsed.get("tests"), list):
        raise DcgmiError("dcgm_coverage needs the result of parse_dcgmi_diag", value=parsed, expected="a dict with a 'tests' list")
    tests = parsed["tests"]
    skipped = [t["name"] for t in tests if t["result"] == "Skip"]
    gpu_tests = [t for t in tests if t["category"] != DEPLOYMENT]
    gpu_skipped = [t["name"] for t in gpu_tests if t["result"] == "Skip"]
    evidence = {"tests": len(tests), "skipped": skipped, "gpu_tests": len(gpu_tests), "gpu_tests_skipped": gpu_skipped}
    fix = ("find out why dcgmi diag skipped them (DCGM#55: a missing is_allowed or allow-list entry for the GPU, MIG mode, "
           "no CUDA, too little free memory) and rerun; a skipped diagnostic is not a pass")
    if tests and len(skipped) == len(tests):
        return finding("dcgm", "warn", "dcgmi diag ran no test: all %d were skipped (%s)" % (len(tests), ", ".join(skipped)),
                       evidence=evidence, fix=fix)
    if gpu_tests and len(gpu_skipped) == len(gpu_tests):
        return finding("dcgm", "warn", "the GPU diagnostics did not run: all %d tests beyond the Deployment checks were "
                       "skipped (%s)" % (len(gpu_tests), ", ".join(gpu_skipped)), evidence=evidence, fix=fix)
    message = "dcgmi diag ran %d of %d tests" % (len(tests) - len(skipped), len(tests))
    if skipped:
        message += "; skipped (see their dcgm: findings): %s" % ", ".join(skipped)
    return finding("dcgm", "pass", message, evidence=evidence)
