#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: GPU health of a node from nvidia-smi -q -x and dcgmi diag, with a finding per check and GPU
version_added: 0.3.0
description:
  - "C(gpu_present): the NVIDIA GPUs on the PCI bus (vendor C(0x10de), class 0300/0302) against what
    C(nvidia-smi) lists - V(pass), V(fail) (GPUs on the bus but no driver, nvidia-smi failing, or a GPU missing
    from its list), or V(not_applicable) (no NVIDIA GPU, no driver). The gate decides whether a node without GPUs
    is fatal."
  - "Per GPU from C(nvidia-smi -q -x), read by element name so that DTD v11 (C(clocks_throttle_reasons)), v12 and
    v13 (C(clocks_event_reasons)) and pre-DTD files all parse: pending or failed row remapping, pending page
    retirement, uncorrectable ECC errors, active clock-limiting reasons (idle and application clocks are benign;
    hardware, power-brake and thermal slowdowns fail), persistence mode, temperature against the slowdown
    threshold (or, where a newer driver reports only the T.Limit form, the margin C(gpu_temp_tlimit) against
    C(gpu_temp_slow_tlimit_threshold)), application clocks against their defaults, the power limit against the GPU's maximum, and the NVLink
    fabric registration state (per-link NVLink state is not in C(nvidia-smi -q -x); it is not checked)."
  - With O(dcgm_level), C(dcgmi diag -r LEVEL), parsed for the DCGM 2.x/3.x table and the 4.x per-plugin layout;
    one finding per test, and a C(Skip) is V(not_applicable), never a pass.
  - Read-only (C(dcgmi diag) loads the GPUs for its duration; run it when no job runs).
attributes:
  check_mode:
    support: full
    details: Read-only, but check mode runs the DCGM diagnostics of O(dcgm_level) exactly as a normal run does.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.attributes.read_only
  - gpunode.tuning.target.sysfs
options:
  dcgm_level:
    description:
      - The C(dcgmi diag -r) level to run (1 quick, 2 medium, 3 and 4 long); 0 runs none.
      - On a node with GPUs, diagnostics that did not run make the C(dcgm) finding V(warn) - level 0, DCGM not
        installed, or C(dcgmi diag) skipping every test or every test beyond the Deployment checks - so that a gate is
        never GO without saying so; otherwise C(dcgm) is V(pass) and counts the tests that ran. Without GPUs, level 0
        gives no C(dcgm) finding and a missing DCGM V(not_applicable).
    type: int
    default: 0
    choices: [0, 1, 2, 3, 4]
  nvidia_smi_xml_path:
    description: A saved C(nvidia-smi -q -x) output to judge instead of running nvidia-smi.
    type: path
  dcgmi_output_path:
    description: A saved C(dcgmi diag) output to judge instead of running dcgmi.
    type: path
notes:
  - Commands, only against the live C(/sys) - C(nvidia-smi -q -x) and, with O(dcgm_level), C(dcgmi diag -r LEVEL). On a
    captured tree (O(sysfs_path), where the PCI bus is read) give their outputs as files, O(nvidia_smi_xml_path) and
    O(dcgmi_output_path).
  - Tested on real C(nvidia-smi -q -x) and C(dcgmi diag) captures from public sources
    (C(tests/unit/fixtures/gpu_health/README.md)); the project's lab has no GPU.
seealso:
  - module: gpunode.tuning.platform_facts
  - module: gpunode.tuning.cpu_power_facts
"""

EXAMPLES = r"""
- name: GPU health with the quick DCGM diagnostic
  gpunode.tuning.gpu_health:
    dcgm_level: 1
  register: gpu

- name: Judge a saved nvidia-smi output
  gpunode.tuning.gpu_health:
    sysfs_path: /srv/capture/node17/sys
    nvidia_smi_xml_path: /srv/capture/node17/nvidia-smi-q-x.xml
"""

RETURN = r"""
findings:
  description:
    - C(check) (C(gpu_present), C(remapped_rows), C(retired_pages), C(ecc_uncorrectable), C(clock_event_reasons),
      C(persistence_mode), C(temperature), C(applications_clocks), C(power_limit), C(fabric), C(dcgm), C(dcgm:<test>)),
      C(status), C(message),
      C(evidence), C(fix) and C(gpu) (the PCI bus id, or the failing GPU indexes for DCGM).
  returned: always
  type: list
  elements: dict
pci_gpus:
  description: PCI addresses of the NVIDIA GPUs on the bus.
  returned: always
  type: list
  elements: str
nvidia_smi:
  description: The parsed C(nvidia-smi -q -x) - driver and CUDA versions, DTD version, per GPU clocks, power, temperature, ECC,
    remapped rows, retired pages, clock-event reasons, NVLink and fabric - or null.
  returned: always
  type: dict
dcgm:
  description: The parsed C(dcgmi diag) - layout, metadata and tests - or null.
  returned: always
  type: dict
sources:
  description: Where the nvidia-smi and DCGM outputs came from.
  returned: always
  type: dict
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.health import gpu_health

ARGUMENT_SPEC = dict(
    dcgm_level=dict(type="int", default=0, choices=[0, 1, 2, 3, 4]),
    nvidia_smi_xml_path=dict(type="path"),
    dcgmi_output_path=dict(type="path"),
    **target_spec("sysfs_path")
)


INPUT_RULES = {}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    params = module.params
    run = module_target(module, ("nvidia-smi", "dcgmi")).run
    result = run_or_fail(module, gpu_health, params["sysfs_path"], run, params["nvidia_smi_xml_path"], params["dcgm_level"],
                         params["dcgmi_output_path"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
