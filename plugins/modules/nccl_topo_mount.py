#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_topo_mount
short_description: Make an NCCL topology file visible in enroot and CDI (podman) containers
version_added: 0.1.0
description:
  - Takes an NCCL topology XML already on the host (O(src)) and makes every container started by enroot or through a
    CDI device see it read-only at O(container_path), with C(NCCL_TOPO_FILE) set to that path.
  - The XML is checked first - a regular file, well-formed, root element C(<system>) with a C(version) attribute - and
    with O(validate_pci) every C(busid) in it must be a PCI device of the host (C(SYSFS/bus/pci/devices/BUSID), case and
    the 4-digit domain normalised; domain C(ffff), which NCCL topology files use for switches that are no host device,
    is not looked up).
  - For enroot (O(runtimes)) it writes C(ENROOT_SYSCONF/mounts.d/PREFIX.fstab) with the line
    C(SRC CONTAINER_PATH none x-create=file,bind,ro,nosuid,nodev 0 0) and C(ENROOT_SYSCONF/environ.d/PREFIX.env) with
    C(NCCL_TOPO_FILE=CONTAINER_PATH).
  - For CDI it writes the spec C(CDI_SPEC_DIR/gpunode-nccl.yaml) (rendered as JSON, which is YAML) with one device
    C(topo) of kind O(cdi_kind) that sets the variable and adds the bind mount; use it with
    C(podman run --device gpunode.io/nccl=topo ...).
  - With O(nccl_conf) it also writes O(nccl_conf_path) as C(KEY=VALUE) lines and mounts it read-only at C(/etc/nccl.conf)
    in both runtimes.
  - Every file is compared by content, mode (0644) and root ownership and written only when it differs, atomically,
    all or nothing (a failed write puts back every file written before it).
  - O(state=absent) removes exactly its own files - the enroot and CDI files of its names, and O(nccl_conf_path) only
    when its first line is the module's C(# Managed by gpunode.tuning) header. O(state=present) removes those of them that
    the options no longer ask for.
  - With O(verify) (only with O(root=/)) it starts a container after writing and proves from inside that
    C(NCCL_TOPO_FILE) is O(container_path), that the file there is readable and that its sha256 is the host file's;
    the module fails naming what the container lacks.
attributes:
  check_mode:
    support: full
    details: The exact plan of the files; writes nothing. O(verify) runs in check mode too, against the files as they are now
      (the drift report's question - does a job's container see it).
  diff_mode:
    support: full
    details: Before and after of every file that differs.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.target.root
options:
  src:
    description:
      - The topology XML on the host (absolute, no whitespace, commas or backslashes - it goes into an fstab line). Read
        under O(root). Required with O(state=present). With O(content) the file is installed there.
    type: path
  content:
    description:
      - The topology XML itself. Given, it is validated and installed at O(src) (mode 0644, compared and written like the
        other files, in the same all-or-nothing write); not given, O(src) must already be there.
      - O(state=absent) never removes O(src).
    type: str
  state:
    description: C(present) writes the files, C(absent) removes them (see above).
    type: str
    choices: [present, absent]
    default: present
  container_path:
    description: Where the file appears inside containers, and the value of C(NCCL_TOPO_FILE). Absolute, no whitespace or commas.
    type: str
    default: /etc/nccl/topo.xml
  runtimes:
    description: The container runtimes to configure.
    type: list
    elements: str
    choices: [enroot, cdi]
    default: [enroot, cdi]
  enroot_sysconf_path:
    description: enroot's system configuration directory (C(ENROOT_SYSCONF_PATH)).
    type: path
    default: /etc/enroot
  file_prefix:
    description: The name (without extension) of the files in C(mounts.d) and C(environ.d).
    type: str
    default: 50-gpunode-nccl
  cdi_spec_dir:
    description: The directory of CDI specs.
    type: path
    default: /etc/cdi
  cdi_kind:
    description: The CDI kind (C(vendor/class)) of the device; the device is RV(cdi_device).
    type: str
    default: gpunode.io/nccl
  nccl_conf:
    description:
      - NCCL settings written to O(nccl_conf_path), one C(KEY=VALUE) line each, sorted. Keys must match
        C(^NCCL_[A-Z0-9_]+$); values must be non-empty, without newlines or leading or trailing whitespace (NCCL trims
        nothing).
    type: dict
  nccl_conf_path:
    description: The host file for O(nccl_conf).
    type: path
    default: /etc/nccl.conf
  validate_pci:
    description: Require every C(busid) in the XML to be a PCI device under O(sysfs_path).
    type: bool
    default: false
  sysfs_path:
    description: Root of sysfs, for O(validate_pci).
    type: path
    default: /sys
  verify:
    description: Start a container and check from inside it that the file and the variable are there.
    type: dict
    suboptions:
      runtime:
        description: C(podman) (through the CDI device; needs C(cdi) in O(runtimes)) or C(enroot) (C(enroot start)).
        type: str
        choices: [podman, enroot]
        required: true
      image:
        description: The podman image, or the name of an existing enroot container.
        type: str
        required: true
  nccl_log:
    description:
      - Text of an C(NCCL_DEBUG=INFO) log; reported as RV(nccl_log_status).
      - Read for this module's topology file only, under any of its names (O(container_path) in a container, O(src) or
        the C(NCCL_TOPO_FILE) of O(nccl_conf) where NCCL runs on the host); an C(XML Parse) line counts when it follows
        that file's C(Loading topology file) line in the same thread, not when NCCL was reading another XML file.
    type: str
notes:
  - "enroot's fstab targets are relative to the container root (a leading C(/) is accepted); C(x-create=file) creates the
    missing target file."
  - CDI rejects unknown fields, so the spec holds only C(cdiVersion), C(kind) and C(devices).
seealso:
  - name: NCCL environment variables, NCCL_TOPO_FILE
    description: The variable this module sets in containers.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
"""

EXAMPLES = r"""
- name: The topology file into every enroot and podman container
  gpunode.tuning.nccl_topo_mount:
    src: /etc/gpunode/ndv5-topo.xml
    validate_pci: true

- name: With NCCL settings, proved from inside a podman container
  gpunode.tuning.nccl_topo_mount:
    src: /etc/gpunode/ndv5-topo.xml
    nccl_conf:
      NCCL_IB_PCI_RELAXED_ORDERING: 1
      NCCL_SOCKET_IFNAME: eth0
    verify:
      runtime: podman
      image: docker.io/library/busybox:1.36

- name: Undo
  gpunode.tuning.nccl_topo_mount:
    state: absent
"""

RETURN = r"""
files:
  description:
    - The enroot and CDI files, O(nccl_conf_path) and, with O(content), O(src), with action and reason as
      M(gpunode.tuning.cpuset_slices) returns its files in RV(gpunode.tuning.cpuset_slices#module:files).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/cdi/gpunode-nccl.yaml", "action": "create", "reason": "missing"}]
container_path:
  description: Where the file is inside containers (the value of C(NCCL_TOPO_FILE)).
  returned: always
  type: str
  sample: /etc/nccl/topo.xml
cdi_device:
  description: The CDI device name for C(podman run --device).
  returned: always
  type: str
  sample: gpunode.io/nccl=topo
checksum:
  description: sha256 of O(src).
  returned: with O(state=present)
  type: str
busids:
  description: Every C(busid) in the XML, in document order.
  returned: with O(state=present)
  type: list
  elements: str
  sample: ["ffff:ff:01.0", "0001:00:00.0"]
missing_busids:
  description: The busids not found under O(sysfs_path) (empty on success; the failure names them).
  returned: with O(validate_pci)
  type: list
  elements: str
verify:
  description:
    - The container check - C(variable_ok), C(file_ok), C(checksum_ok), C(message), C(command).
    - What the container sees besides - C(variables) (every C(NCCL_*) variable inside), C(hcas) (its
      C(/sys/class/infiniband)), C(host_hcas) (the host's) and C(hcas_missing) (the host's HCAs the container does
      not see); the preflight playbook judges these.
  returned: when O(verify) ran
  type: dict
verified:
  description: Whether the container check ran and passed (false when it was skipped, with a warning; a failed check fails the module).
  returned: with O(verify)
  type: bool
nccl_log_status:
  description: C(loaded), C(not_found), C(parse_error) or C(not_seen), from O(nccl_log), for this module's topology file.
  returned: with O(nccl_log)
  type: str
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._gpu.nccl_topo import ARGUMENT_SPEC, REQUIRED_IF, converge


INPUT_RULES = {
    "content": "text",
    "container_path": "path",
    "file_prefix": "file_name",
    "cdi_kind": "cdi_kind",
    "verify.image": "image",
    "nccl_log": "text",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, required_if=REQUIRED_IF)
    params = module.params
    target = module_target(module, ("podman", "enroot"))
    result, diff = run_or_fail(module, converge, params, target.run, target.check)
    exit_with(module, result, diff, result.pop("warnings"))


if __name__ == "__main__":
    main()
