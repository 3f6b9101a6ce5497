# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""run.sh's failure digest: a failed scenario's fatal task and failing assertions are printed again at the end of
the molecule step, because a CI log is often kept only as its tail (a CI failure of workload_fence's converge could
not be diagnosed: the fatal task had scrolled out)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOG = """\
[+  12 s] INFO     [workload_fence > converge] Executing
FAILED - RETRYING: [localhost]: Wait for every guest to answer SSH (780 retries left).
TASK [gpunode.tuning.nic_irq_pinning : Pin the NIC IRQs] ******
ok: [gpu-node]
TASK [gpunode.tuning.nic_irq_pinning : Take irqbalance out of the way, pin the queue IRQs] ******
fatal: [gpu-node]: FAILED! => {"changed": false, "msg": "queue IRQs not on their planned CPUs: 41 virtio2-input.2: 2, planned 4"}

PLAY RECAP *********************************************************************
gpu-node                   : ok=31   changed=12   unreachable=0    failed=1
TASK [a later task that did not fail] ***
ok: [gpu-node]
E       AssertionError: cpu 4 soft: module 91.21, mpstat 94.17
FAILED tests/test_softnet.py::test_flood - AssertionError: cpu 4 soft
"""


def test_the_digest_names_the_failed_task_its_result_and_the_assertions(tmp_path):
    log = tmp_path / "scenario.log"
    log.write_text(LOG)
    script = 'source <(sed -n "/^failure_digest()/,/^}/p" run.sh); failure_digest workload_fence "%s"' % log
    out = subprocess.run(["bash", "-c", script], cwd=str(ROOT), capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert "=== scenario workload_fence failed: what failed ===" in lines
    at = lines.index("TASK [gpunode.tuning.nic_irq_pinning : Take irqbalance out of the way, pin the queue IRQs] ******")
    assert lines[at + 1].startswith("fatal: [gpu-node]: FAILED! =>") and "planned 4" in lines[at + 1]
    assert "TASK [gpunode.tuning.nic_irq_pinning : Pin the NIC IRQs] ******" not in lines     # only the failed task
    assert not [x for x in lines if x.startswith("gpu-node ")]                                # the window ends at RECAP
    assert lines.count("E       AssertionError: cpu 4 soft: module 91.21, mpstat 94.17") == 1
    assert "FAILED tests/test_softnet.py::test_flood - AssertionError: cpu 4 soft" in lines
    assert not [x for x in lines if "RETRYING" in x]                                          # until: retries, no failure
    assert lines[-1] == "=== end of scenario workload_fence ==="
