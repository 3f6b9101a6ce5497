# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node-side persistence of NIC IRQ pins: every file the nic_irq_persist module installs.

Standard library only. One definition of every file the nic_irq_persist module (and through it the
nic_irq_pinning role) puts on a node: the library (``_host.payload``, the import closure of ``_nic_irq.pin_cli``),
the entry point, the desired-state JSON, the boot unit, the quiet re-check service and its timer, the udev rule
on the PCI path, and the if-up hook for each network stack present (ifupdown, NetworkManager,
networkd-dispatcher). They are planned and written by the host layer's file engine (``_host.files``).
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import UNIT_DIR, rooted
from ansible_collections.gpunode.tuning.plugins.module_utils._host.payload import (
    MANIFEST, bytecode_of, installed_library, library_files)

UNIT = "gpunode-nic-irq-affinity.service"
RECHECK_UNIT = "gpunode-nic-irq-affinity-recheck.service"
TIMER = "gpunode-nic-irq-affinity.timer"
UDEV_RULE = "/etc/udev/rules.d/70-gpunode-nic-irq-affinity.rules"
# Network stacks whose "interface is up" hooks run a script: the directory that
# shows the stack is installed, and where the hook goes.
HOOKS = {
    "ifupdown": ("/etc/network/if-up.d", "/etc/network/if-up.d/gpunode-nic-irq-pin"),
    "networkmanager": ("/etc/NetworkManager/dispatcher.d", "/etc/NetworkManager/dispatcher.d/50-gpunode-nic-irq-pin"),
    "networkd-dispatcher": ("/etc/networkd-dispatcher", "/etc/networkd-dispatcher/routable.d/50-gpunode-nic-irq-pin"),
}

HEADER = "Managed by gpunode.tuning (nic_irq_pinning role, nic_irq_persist module): local changes are overwritten."


def _comment(text):
    return "".join("# %s\n" % line if line else "#\n" for line in text.splitlines())


def entry_point(python, lib_dir, name):
    return (
        "#!%s\n%s" % (python, _comment(HEADER))
        + '"""Apply the NIC IRQ pins of a gpunode.tuning desired-state file.\n\n'
        "The code is the collection's own module_utils, installed under %s by the\n"
        "nic_irq_persist module: the same read -> plan -> apply code as the\n"
        "gpunode.tuning.nic_irq_affinity module.\n\n"
        "Usage: %s [--quiet] [--check] [--wait SECONDS] [STATE_FILE]\n"
        '"""\n' % (lib_dir, name)
        + "import sys\n\nsys.path.insert(0, %s)\n\n" % json.dumps(lib_dir)
        + "from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq.pin_cli import main  # noqa: E402\n\n"
        + 'if __name__ == "__main__":\n    sys.exit(main())\n'
    )


def boot_unit(pci, entry, state_file, timeout, interval):
    recheck = ("# and every %s by %s (a queue-count change or a driver\n"
               "# reset re-spreads the IRQs without any udev event).\n" % (interval, TIMER)) if interval else ""
    return (
        _comment(HEADER)
        + "# Re-applies the NIC IRQ pins stored in %s.\n" % state_file
        + "# Started at boot, by the udev rule %s when the NIC's PCI\n" % UDEV_RULE
        + "# function is added again (driver rebind, hot-plug, VF re-creation), by the\n"
        + "# network stack's if-up hook when the interface comes up (drivers that request\n"
        + "# their queue IRQs only when the interface is opened),\n" + recheck
        + "# The code that runs is the collection's own module_utils.\n"
        + "[Unit]\n"
        + "Description=Pin the queue IRQs of NIC %s (gpunode.tuning)\n" % pci
        + "Documentation=file:%s\n" % state_file
        + "ConditionPathExists=%s\n" % state_file
        + "# Not on the boot's critical path: a slow or failing run never delays the boot.\n"
        + "DefaultDependencies=no\n"
        + "After=sysinit.target systemd-udev-trigger.service\n"
        + "Conflicts=shutdown.target\nBefore=shutdown.target\n\n"
        + "[Service]\nType=oneshot\n"
        + "# Waits (bounded) for IRQs that the driver requests when the interface opens.\n"
        + "ExecStart=%s --wait 20 %s\n" % (entry, state_file)
        + "TimeoutStartSec=%d\n" % timeout
        + "# A restart (udev rule, if-up hook) or stop ends a wait at once but lets the pass\n"
        + "# of pins in progress finish: SIGTERM is noted, never a half-pinned NIC. Only the\n"
        + "# main process gets it (mixed): an ethtool it runs is not killed under it.\n"
        + "KillMode=mixed\nTimeoutStopSec=%d\n" % timeout
        + "StandardOutput=journal\nStandardError=journal\nSyslogIdentifier=gpunode-nic-irq-pin\n\n"
        + "[Install]\nWantedBy=multi-user.target\n"
    )


def recheck_unit(pci, entry, state_file, timeout):
    return (
        _comment(HEADER)
        + "# Started by %s. Same code and state file as %s, but quiet:\n" % (TIMER, UNIT)
        + "# it logs only when it had to restore a pin or failed.\n"
        + "[Unit]\n"
        + "Description=Re-check the NIC IRQ pins of %s (gpunode.tuning)\n" % pci
        + "Documentation=file:%s\n" % state_file
        + "ConditionPathExists=%s\n" % state_file
        + "DefaultDependencies=no\nAfter=sysinit.target\nConflicts=shutdown.target\nBefore=shutdown.target\n\n"
        + "[Service]\nType=oneshot\n"
        + "ExecStart=%s --quiet %s\n" % (entry, state_file)
        + "TimeoutStartSec=%d\n" % timeout
        + "KillMode=mixed\nTimeoutStopSec=%d\n" % timeout
        + "StandardOutput=journal\nStandardError=journal\nSyslogIdentifier=gpunode-nic-irq-pin\n"
        + "SyslogLevel=notice\nLogLevelMax=notice\n"
    )


def timer_unit(interval):
    return (
        _comment(HEADER)
        + "# Re-checks the NIC IRQ pins: ethtool -L and some driver resets re-spread the IRQs\n"
        + "# without any udev event. A run on a converged node writes and logs nothing.\n"
        + "[Unit]\nDescription=Re-check the NIC IRQ pins every %s (gpunode.tuning)\n\n" % interval
        + "[Timer]\nOnBootSec=%s\nOnUnitInactiveSec=%s\nAccuracySec=5s\nUnit=%s\n\n" % (interval, interval, RECHECK_UNIT)
        + "[Install]\nWantedBy=timers.target\n"
    )


def udev_rule(pci):
    return (
        _comment(HEADER)
        + "# Re-apply the NIC IRQ pins when the network device of PCI function %s is\n" % pci
        + "# added again (driver rebind, hot-plug, VF re-creation). Matched on the PCI path\n"
        + "# (KERNELS), not the name: at \"add\" time the interface is still called eth0.\n"
        + 'ACTION=="add", SUBSYSTEM=="net", KERNELS=="%s", RUN+="/usr/bin/systemctl --no-block restart %s"\n' % (pci, UNIT)
        + 'ACTION=="move", SUBSYSTEM=="net", KERNELS=="%s", RUN+="/usr/bin/systemctl --no-block start %s"\n' % (pci, UNIT)
    )


def if_up_hook(pci):
    """One script for the three network stacks' hooks: ifupdown's if-up.d ($IFACE),
    NetworkManager's dispatcher ($1 interface, $2 action) and networkd-dispatcher ($IFACE)."""
    return (
        "#!/bin/sh\n" + _comment(HEADER)
        + "# The interface of PCI function %s came up: re-apply its IRQ pins. Many drivers\n" % pci
        + "# (ena, ixgbe, i40e, ice, bnxt_en, e1000e, vmxnet3, mlx5) request their queue IRQs\n"
        + "# only when the interface is opened, after the boot unit and the udev rule ran.\n"
        + 'iface="${IFACE:-${1:-}}"\n'
        + '[ -n "$iface" ] || exit 0\n'
        + '[ "${2:-up}" = up ] || exit 0\n'
        + 'dev=$(readlink -f "/sys/class/net/$iface/device" 2>/dev/null) || exit 0\n'
        + 'case "$dev/" in\n'
        + '    */%s/*) exec /usr/bin/systemctl --no-block restart %s ;;\n' % (pci, UNIT)
        + "esac\nexit 0\n"
    )


def render(desired, settings, root="/"):
    """{absolute path: (bytes, mode)} of everything a present state installs.

    ``settings``: state_file, lib_dir, entry_point, python, timeout, recheck_interval.
    Hooks are rendered for the network stacks installed under ``root``.
    """
    pci = desired["pci_address"]
    entry, state_file, interval = settings["entry_point"], settings["state_file"], settings["recheck_interval"]
    files = {
        entry: (entry_point(settings["python"], settings["lib_dir"], os.path.basename(entry)).encode(), 0o755),
        state_file: ((json.dumps(desired, indent=4, sort_keys=True) + "\n").encode(), 0o644),
        "%s/%s" % (UNIT_DIR, UNIT): (boot_unit(pci, entry, state_file, settings["timeout"], interval).encode(), 0o644),
        UDEV_RULE: (udev_rule(pci).encode(), 0o644),
    }
    if interval:
        files["%s/%s" % (UNIT_DIR, RECHECK_UNIT)] = (recheck_unit(pci, entry, state_file, settings["timeout"]).encode(), 0o644)
        files["%s/%s" % (UNIT_DIR, TIMER)] = (timer_unit(interval).encode(), 0o644)
    for marker, path in HOOKS.values():
        if os.path.isdir(rooted(root, marker)):
            files[path] = (if_up_hook(pci).encode(), 0o755)
    lib = settings["lib_dir"].rstrip("/")
    library = library_files()
    for rel, data in library.items():
        files["%s/%s" % (lib, rel)] = (data, 0o644)
    files["%s/%s" % (lib, MANIFEST)] = ((json.dumps(sorted(library), indent=1) + "\n").encode(), 0o644)
    return files


def owned_paths(settings, root="/"):
    """Every path a present state may have installed (for removal): only the collection's own,
    with the bytecode Python wrote for its library files."""
    lib = settings["lib_dir"].rstrip("/")
    paths = [settings["entry_point"], settings["state_file"], UDEV_RULE] + \
        ["%s/%s" % (UNIT_DIR, u) for u in (UNIT, RECHECK_UNIT, TIMER)] + [h[1] for h in HOOKS.values()]
    library = installed_library(lib, root)
    return paths + library + bytecode_of(library, root) + ["%s/%s" % (lib, MANIFEST)]
