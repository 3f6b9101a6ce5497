#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Add, replace or remove kernel parameters for the next boot, keeping every other one as it was
version_added: 0.1.0
description:
  - Sets kernel parameters such as C(isolcpus=domain,managed_irq,2-3), C(nohz_full=2-3), C(rcu_nocbs=2-3),
    C(irqaffinity=0-1) or a bare flag for the next boot, idempotently. Every other parameter stays as it was.
  - With O(state=present) each key of O(parameters) ends up on the next boot's command line exactly once, with exactly
    the value given; an occurrence of the same key anywhere in the configured line is replaced. Keys are matched as
    the kernel matches them (before the first C(=), C(-) and C(_) the same). The module manages the union of the
    parameters of all its runs; O(state=absent) removes the keys named (values ignored) from that set and puts back
    what the module replaced for them.
  - B(grub_debian) (Debian, Ubuntu). The configured line is what C(grub-mkconfig) builds - it sources
    C(/etc/default/grub) and then C(/etc/default/grub.d/*.cfg) in glob order - evaluated with C(/bin/sh) on the live
    system and without any shell under a O(root) (see the notes) (GRUB_CMDLINE_LINUX, then GRUB_CMDLINE_LINUX_DEFAULT).
    The module's parameters live in the drop-in
    C(/etc/default/grub.d/DROPIN_NAME) (C(GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX ...")), removed when nothing is left to
    manage. A managed key set in an earlier file is removed from the assignment line that sets it - that token only,
    quoting and C($VAR) references kept - and the line before and after is recorded in C(STATE_DIR/kernel-cmdline.json);
    O(state=absent) puts the line back byte for byte, when it is still what the module left (otherwise it warns and
    leaves it). A line that is not one simple C(VAR="..."), C(VAR='...') or C(VAR=word) assignment fails, naming file
    and line. After writing, C(update-grub) (or C(grub-mkconfig -o /boot/grub/grub.cfg)) runs, and the next boot's
    line is read back from the default entry of C(/boot/grub/grub.cfg) (C(GRUB_DEFAULT) as a number, a title or id,
    C(>) paths into submenus, C(saved) and C(next_entry) from C(/boot/grub/grubenv)). When update-grub fails, the
    files are put back.
  - B(grubby) (the RHEL family, Boot Loader Specification entries). Reads C(grubby --info=ALL) and
    C(grubby --default-kernel), applies with C(grubby --update-kernel=ALL --remove-args=... --args=...), checks every
    entry afterwards and reads back C(grubby --info=DEFAULT). The tokens a key had on each kernel before the module
    first set it are kept in the same marker, and O(state=absent) gives them back.
  - Every input is checked before anything changes - each parameter (no blanks, quotes, C($), backticks,
    backslashes, C(;), C(|), C(&), C(<) or C(>), no empty or repeated key), the C(isolcpus) flags (C(domain),
    C(managed_irq), C(nohz)) and the CPU lists of C(isolcpus), C(nohz_full), C(rcu_nocbs) and C(irqaffinity), every GRUB
    file (C(sh -n)), and the result grub-mkconfig would build (each managed parameter on it exactly once).
attributes:
  check_mode:
    support: full
    details: The same plan as a real run - files, the configured line before and after (evaluated, not written) and
      the grubby calls; writes nothing, runs no update-grub and no changing grubby call.
  diff_mode:
    support: full
    details: Before and after of every file that differs (the drop-in, an edited C(/etc/default/grub) line, the
      marker); for grubby also the args of every boot entry that changes.
extends_documentation_fragment:
  - gpunode.tuning.attributes
  - gpunode.tuning.target.root
options:
  parameters:
    description:
      - Kernel parameters, each C(key=value) or a bare C(flag), for example C(isolcpus=domain,managed_irq,2-3),
        C(nohz_full=2-3), C(rcu_nocbs=2-3), C(irqaffinity=0-1), C(nosmt). Each key once.
      - The CPU lists of C(isolcpus), C(nohz_full), C(rcu_nocbs) and C(irqaffinity) are checked (C(2-3,8), the
        kernel's C(0-15:2/4) groups too; C(N) and C(all) are refused), as are the C(isolcpus) flags.
      - With O(state=absent) only the keys count.
      - O(parameters) or O(remove) (or both), or O(isolate).
    type: list
    elements: str
  remove:
    description:
      - Keys to keep off the next boot's command line, for example C(processor.max_cstate), C(intel_idle.max_cstate),
        C(idle) - what the C(gpunode.tuning.cpu_power) role's C(cpu_power_fix_kernel_limits) passes. Wherever an earlier
        GRUB file sets one, that token is taken out of its line (only that token) and recorded in the marker; on the
        RHEL family C(grubby --remove-args). The marker lists each as C(!key), and RV(managed) shows it so.
      - With O(state=absent) the recorded tokens are put back, byte for byte.
      - Keys only (no C(=value)); a key may not also be in O(parameters). Not with O(isolate).
    type: list
    elements: str
  isolate:
    description:
      - CPU isolation as one setting, what the C(gpunode.tuning.isolcpus) role passes - C(isolcpus=<flags>,<cpus>), and
        C(nohz_full=) / C(rcu_nocbs=) with the same CPUs when asked. The CPUs are checked against the node's present
        CPUs (O(sysfs_path)) - a CPU it does not have, every CPU (no housekeeping CPU left) and CPU 0 without
        O(isolate.allow_cpu0) are refused - by the collection's CPU split code (module_utils/_parse/cpu_partition).
      - With O(state=present) an isolation key not asked for any more (C(nohz_full) after O(isolate.nohz_full=false))
        is given back; with O(state=absent) every isolation key the module manages is.
    type: dict
    suboptions:
      cpus:
        description: The CPUs to isolate, a Linux CPU list (C(4-5)).
        type: str
        required: true
      flags:
        description: The C(isolcpus=) flags, out of C(domain), C(managed_irq) and C(nohz).
        type: list
        elements: str
        default: [domain]
      nohz_full:
        description: Also C(nohz_full=) the same CPUs.
        type: bool
        default: false
      rcu_nocbs:
        description: Also C(rcu_nocbs=) the same CPUs.
        type: bool
        default: false
      allow_cpu0:
        description: Allow CPU 0 in O(isolate.cpus).
        type: bool
        default: false
  sysfs_path:
    description: Root of sysfs, where O(isolate) reads C(devices/system/cpu/present). Not under O(root).
    type: path
    default: /sys
  state:
    description: Whether the keys of O(parameters) are set (V(present)) or given back (V(absent)).
    type: str
    choices: [present, absent]
    default: present
  bootloader:
    description:
      - V(auto) picks V(grub_debian) where C(update-grub) or C(grub-mkconfig) and C(/etc/default/grub) exist, else
        V(grubby) where C(grubby) exists, else fails.
      - V(grubby) works on the live system only (O(root=/)).
    type: str
    choices: [auto, grub_debian, grubby]
    default: auto
  procfs_path:
    description: Root of procfs, where C(cmdline) (the running command line) is read. Not under O(root).
    type: path
    default: /proc
  state_dir:
    description: Where the marker C(kernel-cmdline.json) lives (the parameters managed and what they replaced).
    type: path
    default: /var/lib/gpunode-tuning
  dropin_name:
    description:
      - The drop-in's file name under C(/etc/default/grub.d); must end in C(.cfg) (grub-mkconfig sources only those).
      - It must sort after every drop-in that sets GRUB_CMDLINE_LINUX outright. grub-mkconfig sources them in the C
        locale's glob order, where digits come before letters - Debian and Ubuntu ship unnumbered ones such as
        C(init-select.cfg) - so the default starts with C(zz-) (a C(99-) name, tried first, came before the lab
        image's C(gpunode-lab.cfg) and was refused).
    type: str
    default: zz-gpunode-tuning.cfg
notes:
  - Commands run through the module - C(/bin/sh) (C(sh -n) and the evaluation of the GRUB files), C(update-grub) or
    C(grub-mkconfig), and C(grubby) - on the live system only; on a tree none runs.
  - Under a O(root) other than C(/), RV(bootloader_updated) is false, C(/boot/grub/grub.cfg) under it, when there, is
    read as it is, and the tools for O(bootloader=auto) are looked for under it.
  - Under a O(root) other than C(/) the GRUB files are evaluated in Python as the assignment subset of sh - comments,
    line continuations, C(NAME=value) and C(export), quotes, C($VAR), C(${VAR}), C(${VAR:-word}) and C(${VAR:+word}) of
    earlier assignments (variables the files do not set are empty). A command substitution (C($) with parentheses, or
    backticks) is never run - the variable it sets is unknown, which fails naming the file and line only when
    GRUB_CMDLINE_LINUX or GRUB_CMDLINE_LINUX_DEFAULT depend on it. Any other command (C(if), C(.), C(echo), a pipe, a
    redirection, a function) fails, naming the file and line. On the live system (O(root=/)) C(/bin/sh) sources the
    files as update-grub does right after.
  - A file sourced after the drop-in that sets GRUB_CMDLINE_LINUX without C($GRUB_CMDLINE_LINUX) would drop the
    parameters; the module sees that in the evaluated result and fails before writing.
  - The glob order of grub.d is the C locale's, as the module runs update-grub with C(LC_ALL=C).
  - Nothing reboots. RV(reboot_required) says whether the running kernel's parameters differ from the next boot's.
seealso:
  - name: The kernel's command-line parameters
    description: isolcpus, nohz_full, rcu_nocbs, irqaffinity and the CPU list format.
    link: https://www.kernel.org/doc/html/latest/admin-guide/kernel-parameters.html
  - name: GRUB simple configuration
    description: GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT and GRUB_DEFAULT.
    link: https://www.gnu.org/software/grub/manual/grub/html_node/Simple-configuration.html
"""

EXAMPLES = r"""
- name: Isolate CPUs 2-3 for the training workers from the next boot on
  gpunode.tuning.kernel_cmdline:
    parameters:
      - isolcpus=domain,managed_irq,2-3
      - nohz_full=2-3
      - rcu_nocbs=2-3
  register: cmdline

- name: Say when a reboot is needed
  ansible.builtin.debug:
    msg: "reboot needed: {{ cmdline.reboot_required }}, next boot: {{ cmdline.next_boot_cmdline | join(' ') }}"

- name: Give back isolcpus and nohz_full (what they replaced comes back)
  gpunode.tuning.kernel_cmdline:
    parameters: [isolcpus, nohz_full]
    state: absent

- name: Plan on a copy of a node's /etc and /boot, without running anything on it
  gpunode.tuning.kernel_cmdline:
    parameters: [irqaffinity=0-1]
    bootloader: grub_debian
    root: /srv/captures/node17
  check_mode: true
"""

RETURN = r"""
bootloader:
  description: The bootloader used, V(grub_debian) or V(grubby).
  returned: success
  type: str
managed:
  description: The parameters this module manages after the run (all its runs together).
  returned: success
  type: list
  elements: str
  sample: ["isolcpus=domain,managed_irq,2-3", "nohz_full=2-3"]
configured_before:
  description:
    - The configured parameters before the run. V(grub_debian) - GRUB_CMDLINE_LINUX then GRUB_CMDLINE_LINUX_DEFAULT as
      grub-mkconfig would build them (a normal entry's line). V(grubby) - the default entry's args.
  returned: success
  type: list
  elements: str
configured_after:
  description: The same after the run (in check mode, computed from the plan).
  returned: success
  type: list
  elements: str
running:
  description: The running kernel's parameters (C(/proc/cmdline), split as the kernel splits it).
  returned: success
  type: list
  elements: str
next_boot_cmdline:
  description:
    - The parameters the next boot passes after the kernel image - the C(linux) line of grub.cfg's default entry, or
      C(grubby --info=DEFAULT) (C(root=) and args). GRUB variables (C($vt_handoff)) are shown as written. Null when
      not known (no grub.cfg).
  returned: success
  type: list
  elements: str
reboot_required:
  description:
    - Whether the running parameters differ from the next boot's (BOOT_IMAGE= and initrd= left out). In check mode,
      and when the bootloader was not updated, computed from RV(configured_after) for the keys managed or given back.
  returned: success
  type: bool
bootloader_updated:
  description: Whether update-grub (grub-mkconfig) or grubby changed the boot configuration in this run.
  returned: success
  type: bool
commands:
  description: The bootloader commands run (in check mode, that would run).
  returned: success
  type: list
  elements: str
  sample: ["update-grub"]
files:
  description:
    - The drop-in, each GRUB file edited and the marker, with action and reason as M(gpunode.tuning.cpuset_slices)
      returns its files in RV(gpunode.tuning.cpuset_slices#module:files).
  returned: success
  type: list
  elements: dict
  sample: [{"path": "/etc/default/grub.d/zz-gpunode-tuning.cfg", "action": "create", "reason": "missing"}]
marker:
  description: The marker's path.
  returned: success
  type: str
  sample: /var/lib/gpunode-tuning/kernel-cmdline.json
msg:
  description: With a root other than C(/) - that nothing ran on the live system.
  returned: when root is not /
  type: str
"""

from ansible_collections.gpunode.tuning.plugins.module_utils._host.module import module_target, new_module, run_or_fail
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import exit_with
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.kernel_cmdline import (
    ARGUMENT_SPEC, COMMANDS, MUTUALLY_EXCLUSIVE, REQUIRED_ONE_OF, TREE_COMMANDS, converge)


INPUT_RULES = {
    "parameters": "kernel_param",
    "remove": "kernel_param",
    "isolate.cpus": "cpulist",
    "isolate.flags": "identifier",
    "dropin_name": "file_name",
}


def main():
    module = new_module(ARGUMENT_SPEC, INPUT_RULES, mutually_exclusive=MUTUALLY_EXCLUSIVE, required_one_of=REQUIRED_ONE_OF)
    params = module.params
    target = module_target(module, COMMANDS, tree_commands=TREE_COMMANDS, decided_by=("root",))
    result, diff = run_or_fail(module, converge, params, target.run, target.check, target.live, target.which,
                               procfs=target.procfs)
    exit_with(module, result, diff, result.pop("warnings"))


if __name__ == "__main__":
    main()
