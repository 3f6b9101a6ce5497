#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_staging
short_description: Stage checkpoints on local storage and copy complete ones to shared storage without losing one
version_added: 0.4.0
description:
  - "Installs the checkpoint copier: the staging directory (owner, group, mode), the copier's configuration, the
    collection's own copier code as a small library with an entry point, and three systemd units: a oneshot
    C(gpunode-ckpt-copier.service), a C(.path) unit that starts it when the staging directory changes and a C(.timer)
    that starts it every O(interval) seconds and after boot (quiet-time completions, retries, copies a reboot
    interrupted)."
  - "The copier moves only complete checkpoints (O(completion)): into a partial name on the target, every file
    fsync'd, verified (O(verify)), renamed to its final name, the target directory fsync'd; only then is the staged
    copy removed. A sharded checkpoint (a directory) moves as a unit. Operations on the target run in a child killed
    when it makes no progress for O(op_timeout) seconds (a hung NFS mount), and a failed pass backs off from
    O(retry_min) to O(retry_max) seconds, logging the reason to the journal."
  - "The copier reads what an unprivileged training job writes, so it never runs as root: the service runs as
    O(staging_owner) and O(staging_group) (C(User=), C(Group=), names resolved on the node), which also makes NFS
    C(root_squash) exports work as the job's own, inside systemd's sandbox (C(ProtectSystem=strict),
    C(NoNewPrivileges), no capabilities, C(PrivateTmp), C(PrivateDevices), C(PrivateNetwork), C(ProtectHome), a system
    call filter and the other directives the role's README lists with the unit's C(systemd-analyze security) exposure
    score). It may write only the staging directory, the mount that holds O(target_dir) (the mount point, so the
    copier's mount check sees the mount it recorded), its state directory (C(StateDirectory=), from O(state_file))
    and, for a O(pause_file) under C(/run), that file's directory (C(RuntimeDirectory=))."
  - "Every value is checked before anything is written: a staging directory on the target's filesystem, a target
    that is not on a mounted filesystem, a percentage outside 0-100, a completion rule that cannot be met, root as
    the copier's user, a state or pause file the sandboxed copier could not write, or a path that cannot go into a
    unit file fails naming the value, with nothing changed. So does a node without C(systemctl) or without a working
    O(python)."
  - "All or nothing: when a later step fails (a file write, C(systemctl)), every file is put back (content, mode,
    owner; a file the run created is removed), the staging directory gets its mode and owner back (one the run
    created is removed), and the units the run started are stopped again."
  - "Returns the copier's status: what is staged, what was copied, the oldest checkpoint not yet durable and the
    last error. In check mode the same run is the exact plan, with C(--diff)."
attributes:
  check_mode:
    support: full
    details: The plan of files, the staging directory and systemd actions, exactly as a run would carry it out.
  diff_mode:
    support: full
    details: The configuration and unit files before and after (the library source is not shown).
extends_documentation_fragment:
  - gpunode.tuning.attributes
options:
  state:
    description: V(present) installs and starts the copier; V(absent) stops it and removes what it installed (never
      the staging directory, the checkpoints or the state file).
    type: str
    choices: [present, absent]
    default: present
  staging_dir:
    description: The staging directory on local storage (local NVMe). Required with O(state=present).
    type: path
  staging_owner:
    description:
      - "Owner of the staging directory and the user the copier runs as (a user name or uid, resolved on the node):
        the training job's user. Required with O(state=present); there is no default, because the only user every
        node has is root."
      - Root (or uid 0) is refused unless O(allow_root_copier=true).
      - With O(completion=quiescent) the training job must run as this user too (a non-root copier sees only its
        own user's open files).
      - On the target's shared filesystem, O(target_dir) must be writable by this user (with NFS C(root_squash),
        create it on the server owned by this user's uid).
    type: str
  staging_group:
    description: Group of the staging directory and the copier's group (a group name or gid). Default the primary
      group of O(staging_owner). Group root (gid 0) is refused unless O(allow_root_copier=true).
    type: str
  allow_root_copier:
    description: Let the copier run as root (O(staging_owner) root or uid 0, or O(staging_group) gid 0). Root is a
      privilege, not a default; the sandbox still applies (no capabilities, writes only where listed above), but a
      root copier can still write any root-owned file inside the staging directory and the target's mount.
    type: bool
    default: false
  staging_mode:
    description: Mode of the staging directory, octal.
    type: str
    default: "0750"
  target_dir:
    description: The durable directory on shared storage (an NFS mount). Required with O(state=present).
    type: path
  completion:
    description:
      - When a staged entry is complete. V(rename) (the copier's default) - its name does not match O(temp_patterns)
        (the trainer writes under a temporary name and renames). V(marker) - C(<name><marker_suffix>) exists.
        V(quiescent) - no process holds a file of it open and nothing in it changed for O(quiet_seconds).
      - A name matching O(temp_patterns) is never complete, whatever the rule.
    type: str
    choices: [rename, marker, quiescent]
  temp_patterns:
    description: fnmatch patterns of temporary names (default C(*.tmp), C(*.partial), C(*.incomplete), C(.*)).
    type: list
    elements: str
  marker_suffix:
    description: The marker's suffix for O(completion=marker) (default C(.done)).
    type: str
  quiet_seconds:
    description: Seconds without change for O(completion=quiescent) (default 60).
    type: int
  verify:
    description: V(sha256) reads the target back past the page cache and compares checksums (the default);
      V(size_mtime) compares size and mtime of the fsync'd copy (for checkpoints too large to read twice).
    type: str
    choices: [sha256, size_mtime]
  op_timeout:
    description: Seconds an operation on the target (a copy, its read-back, the probe) may go without progress - no
      4 MiB chunk written or read back, no 64 MiB flush completed - before it is killed (default 120). A copy that
      keeps moving is never cut off, however large the checkpoint.
    type: int
  retry_min:
    description: First wait in seconds after a failed copy (default 10); doubled on each failure.
    type: int
  retry_max:
    description: Longest wait in seconds between retries (default 600).
    type: int
  watermark_percent:
    description: Usage of the staging filesystem, in percent, above which the copier warns in the journal (default 80).
    type: int
  on_conflict:
    description:
      - What happens when a checkpoint's name already exists on the target with other content (a reused name such as
        Lightning's C(last.ckpt) saved as a file).
      - V(version) (the copier's default, loses nothing) renames the copy on the target aside to C(<name>.~N~) first.
        V(replace) replaces it (for names the framework reuses on purpose). V(keep) leaves both where they are and
        quarantines the staged entry.
    type: str
    choices: [version, replace, keep]
  quarantine_after:
    description: Failures of one entry after which it is quarantined (not tried again until it changes, listed in the
      status and failed by preflight's C(checkpoint:durable)); default 5. A failing entry never blocks the others.
    type: int
  kill_grace:
    description: Seconds the copier waits for a killed child to end (default 5); a child stuck in uninterruptible
      sleep (a frozen or hung target) is abandoned after it and the target reported hung, so no pass hangs.
    type: int
  pause_file:
    description:
      - A flag file the copier creates while usage is above O(watermark_percent) and removes below it, for the
        trainer to poll and pause checkpointing.
      - It must be where the sandboxed copier may write, else it is refused; under C(/run/<directory>/) (the
        service's C(RuntimeDirectory=), kept between runs, mode 0750 for the copier's user and group; not under
        C(/run/user)), or in the state file's directory.
    type: path
  interval:
    description: Seconds between timer-started passes (retries, quiet-time completions).
    type: int
    default: 30
  timeout:
    description: TimeoutStartSec of one service run, seconds.
    type: int
    default: 3600
  config_file:
    description: The copier's configuration (JSON).
    type: path
    default: /etc/gpunode/ckpt-copier.json
  state_file:
    description:
      - The copier's state (counts, history, last error, backoff).
      - "Must be C(/var/lib/<directory>/<file>): that directory is the service's C(StateDirectory=), which systemd
        creates and gives to the copier's user (mode 0750); the sandboxed copier can write nowhere else for its
        state. Any other path is refused."
    type: path
    default: /var/lib/gpunode-ckpt/state.json
  lib_dir:
    description: Where the copier's library is installed (not shared with other entry points).
    type: path
    default: /usr/local/lib/gpunode-ckpt-copier
  entry_point:
    description: The copier's command.
    type: path
    default: /usr/local/sbin/gpunode-ckpt-copier
  python:
    description: The interpreter of the entry point; checked before anything is written (an executable file that
      runs Python 3.7 or later).
    type: path
    default: /usr/bin/python3
  mountinfo_path:
    description: The mount table read for the placement checks (a captured one in tests). The copier reads the
      same table before each pass and copies only while O(target_dir) is on the mount found here (same mount point,
      filesystem type and source).
    type: path
    default: /proc/self/mountinfo
  unit_dir:
    description: Where the systemd units are installed (another directory for an image build or a test).
    type: path
    default: /etc/systemd/system
notes:
  - The staging directory's content is never changed by the module; only the copier moves checkpoints.
  - The paths that go into the units and the entry point (O(staging_dir), O(target_dir) and its mount point,
    O(state_file), O(pause_file), O(config_file), O(entry_point), O(lib_dir), O(python), O(unit_dir)) must be
    absolute, normalised and free of whitespace, quotes, backslashes, C(%), C(;), C($) and backticks.
seealso:
  - name: The checkpoint_staging role
    description: Applies this module from inventory variables.
    link: https://github.com/gpunode/tuning/tree/main/roles/checkpoint_staging
"""

EXAMPLES = r"""
- name: Stage checkpoints on local NVMe, copy complete ones to NFS
  gpunode.tuning.checkpoint_staging:
    staging_dir: /mnt/nvme/ckpt
    staging_owner: trainer
    target_dir: /mnt/nfs/ckpt
    completion: marker
    watermark_percent: 70
    pause_file: /run/gpunode-ckpt/pause
"""

RETURN = r"""
staging:
  description: The staging directory's action (V(create), V(update) with the reason, V(unchanged)).
  returned: state is present
  type: dict
files:
  description:
    - Every installed file (the copier's configuration, library and entry point, the units) with its action and
      reason, as M(gpunode.tuning.cpuset_slices) returns its files in RV(gpunode.tuning.cpuset_slices#module:files).
  returned: always
  type: list
  elements: dict
systemd:
  description: The systemd actions run (in check mode, that would run).
  returned: always
  type: list
  elements: str
config:
  description: The copier's configuration with its defaults filled in.
  returned: state is present
  type: dict
placement:
  description: The target's mount point, filesystem type and source, and the staging directory's mount point.
  returned: state is present
  type: dict
copier_status:
  description:
    - What is staged (C(staged)), what was copied (C(copied), C(recent)), the oldest checkpoint not yet durable
      (C(oldest_not_durable)), the backoff (C(backoff_until)).
    - C(last_error) - the last failure of any kind (an entry or the target), for the log.
    - C(last_target_error) - the last failure of the target itself (mount check, probe, a hung copy, an I/O error of
      the target), null once a copy or a probe of the target has succeeded since; preflight's C(checkpoint:target)
      judges only this one.
    - C(failing) - entries that failed and are retried with their own backoff (C(name), C(reason), C(failures),
      C(retry_at)).
    - C(quarantined) - entries not tried again until they change (C(name), C(reason), C(failures), C(since));
      preflight's C(checkpoint:durable) fails on them.
  returned: state is present and the staging directory exists
  type: dict
service_user:
  description: The user and group the copier's service runs as (names, as in C(User=) and C(Group=)).
  returned: state is present
  type: dict
  sample: {"user": "trainer", "group": "trainer"}
drift:
  description: One line per difference from the desired state (empty when converged).
  returned: always
  type: list
  elements: str
"""

# Imported so that AnsiballZ ships the copier's command line (and its import closure) with this module: the
# library installed on the node is built from those files (_host.payload.library_files).
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.cli import main as _copier_main  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.install import UNIT_DIR
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint.staging import converge
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import install_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    staging_dir=dict(type="path"),
    staging_owner=dict(type="str"),
    staging_group=dict(type="str"),
    allow_root_copier=dict(type="bool", default=False),
    staging_mode=dict(type="str", default="0750"),
    target_dir=dict(type="path"),
    completion=dict(type="str", choices=["rename", "marker", "quiescent"]),
    temp_patterns=dict(type="list", elements="str"),
    marker_suffix=dict(type="str"),
    quiet_seconds=dict(type="int"),
    verify=dict(type="str", choices=["sha256", "size_mtime"]),
    op_timeout=dict(type="int"),
    retry_min=dict(type="int"),
    retry_max=dict(type="int"),
    watermark_percent=dict(type="int"),
    on_conflict=dict(type="str", choices=["version", "replace", "keep"]),
    quarantine_after=dict(type="int"),
    kill_grace=dict(type="int"),
    pause_file=dict(type="path"),
    interval=dict(type="int", default=30),
    timeout=dict(type="int", default=3600),
    config_file=dict(type="path", default="/etc/gpunode/ckpt-copier.json"),
    state_file=dict(type="path", default="/var/lib/gpunode-ckpt/state.json"),
    mountinfo_path=dict(type="path", default="/proc/self/mountinfo"),
    unit_dir=dict(type="path", default=UNIT_DIR),
    **install_spec("/usr/local/lib/gpunode-ckpt-copier", "/usr/local/sbin/gpunode-ckpt-copier")
)
INPUT_RULES = {
    "staging_owner": "user",
    "staging_group": "user",
    "staging_mode": "mode",
    "temp_patterns": "fnmatch",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES)
    result, diff = run_or_fail(module, converge, module.params, module_target(module, commands=("systemctl",)))
    exit_with(module, result, diff)


if __name__ == "__main__":
    main()
