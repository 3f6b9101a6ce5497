# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The start of every module: the AnsibleModule, with check mode, and every option through the one validator.

Private module_utils of gpunode.tuning, imported by the modules only (it imports Ansible's ``AnsibleModule``; the
libraries installed on a node for code that runs without Ansible never import it, which ``tests/unit/test_layers.py``
holds).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import ALLOWED_COMMANDS, module_runner
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import (
    Target, is_live, is_live_root, missing_cpu_root, root_of, roots_mixed, roots_problem)
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import validate_module


def new_module(argument_spec, input_rules, **kwargs):
    """``AnsibleModule(argument_spec, supports_check_mode=True, **kwargs)`` whose options have all passed the
    validator (:func:`_host.validate.validate_module`) before the module reads or changes anything: a bad value
    fails naming the option, the value and what was expected.

    ``input_rules`` maps the options that are not plain words or paths to their rule (``cpulist``, ``cidr``,
    ``timespan``, ``user``, ``mode``, ...); every other string option gets the safe-word or path rule of its type.
    """
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **kwargs)
    validate_module(module, argument_spec, input_rules)
    return module


def _require(module, require, procfs, sysfs, root):
    failure = None
    if "cpu" in require:
        failure = missing_cpu_root(procfs, sysfs)
    if failure is None and "one_system" in require:
        why = roots_mixed(procfs, sysfs)
        if why:
            failure = dict(msg="refusing to write: %s: give both roots of one tree (T/proc and T/sys) or neither" % why,
                           option="procfs_path", value={"procfs_path": procfs, "sysfs_path": sysfs},
                           expected="procfs_path and sysfs_path of one system")
    if failure is None and "root" in require:
        failure = roots_problem(root, sysfs)
    if failure is not None:
        module.fail_json(changed=False, **failure)


def module_target(module, commands=ALLOWED_COMMANDS, tree_commands=(), decided_by=("procfs_path", "sysfs_path", "root"),
                  require=()):
    """The :class:`_host.target.Target` the module's options name, the same way for every module: ``procfs_path``
    and ``sysfs_path`` (the kernel's views) and ``root`` (the files under /etc, /usr), each left out meaning the live
    node. The listed ``commands`` run only when every root in ``decided_by`` is the live one (kernel_cmdline: only
    ``root``, where it writes; its ``procfs_path`` is read only for the running command line); on a tree only
    ``tree_commands`` (tools that read the files they are given) run, and no runner at all when there are none.

    ``require`` names what the roots must be, checked before anything is read (the module fails naming the
    option): ``cpu`` (a procfs and a sysfs with devices/system/cpu: a missing root would read as "no isolated CPUs,
    not installed"), ``one_system`` (procfs_path and sysfs_path of one system: a write never mixes a captured tree
    with the live /proc or /sys), ``root`` (root and sysfs_path are directories of one system)."""
    params = module.params
    procfs, sysfs = params.get("procfs_path") or "/proc", params.get("sysfs_path") or "/sys"
    root = params.get("root") or root_of(procfs)
    _require(module, require, procfs, sysfs, root)
    checks = (("procfs_path", lambda: is_live(procfs, "/sys")), ("sysfs_path", lambda: is_live("/proc", sysfs)),
              ("root", lambda: is_live_root(root)))
    live = all(live_one() for option, live_one in checks if option in decided_by)
    allowed = commands if live else tree_commands
    return Target(root=root, procfs=procfs, sysfs=sysfs, run=module_runner(module, allowed) if allowed else None,
                  live=live, check=module.check_mode, which=module.get_bin_path if live else None,
                  call=module.run_command if live else None, os_family=(lambda: os_family(module)) if live else None)


def os_family(module):
    """ansible_facts.os_family as setup's distribution subset works it out (the same collector)."""
    from ansible.module_utils.facts.system.distribution import DistributionFactCollector
    return DistributionFactCollector().collect(module=module).get("os_family")


def fail_with(module, exc):
    """``fail_json`` with a :class:`_host.errors.DetailedError`'s message and details (the option, the value, what
    was expected, the path); ``changed`` is False unless the error says otherwise (a rollback that could not put
    something back)."""
    details = dict(exc.details)
    details.setdefault("changed", False)
    module.fail_json(msg=str(exc), **details)


def run_or_fail(module, step, *args, **kwargs):
    """``step(*args, **kwargs)``, the module's one call into its feature; every error of the collection it raises
    (all derive from :class:`_host.errors.DetailedError`) fails the module through :func:`fail_with`."""
    try:
        return step(*args, **kwargs)
    except DetailedError as exc:
        fail_with(module, exc)
