# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node-side persistence of NIC IRQ pins: what is installed, compared and (un)installed.

Standard library only. One definition of every file the nic_irq_persist module
(and through it the nic_irq_pinning role) puts on a node:

* the library: the collection's module_utils that the boot-time entry point
  imports (the import closure of ``_irq_pin_cli``), as a package tree, plus a
  manifest of what was installed, so that pruning and removal only ever touch
  files the collection put there (the lib dir may be shared);
* the entry point, the desired-state JSON, the boot unit, the quiet re-check
  service and its timer, the udev rule on the PCI path, and the if-up hook for
  each network stack present (ifupdown, NetworkManager, networkd-dispatcher).

:func:`plan_files` compares every file with what is on disk (bytes, mode,
root ownership); :func:`apply_files` writes them atomically (temp file in the
same directory, fsync, rename) and rolls every file back when one write fails.
All paths are resolved under one ``root`` ("/" on a node, a temp dir in tests).
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from ansible_collections.gpunode.tuning.plugins.module_utils._errors import DetailedError

PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"
PKG_DIR = PKG.replace(".", "/")
INIT_DIRS = [
    "ansible_collections",
    "ansible_collections/gpunode",
    "ansible_collections/gpunode/tuning",
    "ansible_collections/gpunode/tuning/plugins",
    "ansible_collections/gpunode/tuning/plugins/module_utils",
]
MANIFEST = ".gpunode-tuning-installed.json"

UNIT = "gpunode-nic-irq-affinity.service"
RECHECK_UNIT = "gpunode-nic-irq-affinity-recheck.service"
TIMER = "gpunode-nic-irq-affinity.timer"
UNIT_DIR = "/etc/systemd/system"
UDEV_RULE = "/etc/udev/rules.d/70-gpunode-nic-irq-affinity.rules"
# Network stacks whose "interface is up" hooks run a script: the directory that
# shows the stack is installed, and where the hook goes.
HOOKS = {
    "ifupdown": ("/etc/network/if-up.d", "/etc/network/if-up.d/gpunode-nic-irq-pin"),
    "networkmanager": ("/etc/NetworkManager/dispatcher.d", "/etc/NetworkManager/dispatcher.d/50-gpunode-nic-irq-pin"),
    "networkd-dispatcher": ("/etc/networkd-dispatcher", "/etc/networkd-dispatcher/routable.d/50-gpunode-nic-irq-pin"),
}

HEADER = "Managed by gpunode.tuning (nic_irq_pinning role, nic_irq_persist module): local changes are overwritten."

_IMPORT = re.compile(r"^from ansible_collections\.gpunode\.tuning\.plugins\.module_utils\.(_\w+) import", re.M)


class PersistError(DetailedError):
    """A file that cannot be read, written or rolled back; ``details`` names the path."""


def marker_bytes(data):
    """A marker or state file's bytes as Ansible's ``to_nice_json`` writes them, plus a newline (the irqbalance
    role's copy tasks wrote its markers so; kernel_cmdline's marker has the same form)."""
    return (json.dumps(data, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n").encode("utf-8")


def rooted(root, path):
    return os.path.join(root, path.lstrip("/"))


# ------------------------------------------------------------------ library --

def _source(name):
    """Source bytes of module_utils ``name`` from wherever it was imported (a file, or AnsiballZ's zip)."""
    module = __import__("%s.%s" % (PKG, name), fromlist=["_"])
    loader = getattr(module, "__loader__", None)
    data = loader.get_data(module.__file__) if loader is not None and hasattr(loader, "get_data") else None
    if data is None:
        with open(module.__file__, "rb") as handle:
            data = handle.read()
    return data


def library_files(entry_module="_irq_pin_cli"):
    """{relative path: bytes} of the library: the import closure of ``entry_module`` plus the package markers."""
    todo, seen = [entry_module], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = _source(name)
        todo.extend(_IMPORT.findall(seen[name].decode("utf-8")))
    files = dict(("%s/__init__.py" % d, b"") for d in INIT_DIRS)
    for name, data in seen.items():
        files["%s/%s.py" % (PKG_DIR, name)] = data
    return files


# ------------------------------------------------------------------- render --

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
        + "from ansible_collections.gpunode.tuning.plugins.module_utils._irq_pin_cli import main  # noqa: E402\n\n"
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


def installed_library(lib_dir, root="/"):
    """Absolute paths of the library files a previous run installed (from its manifest)."""
    path = rooted(root, "%s/%s" % (lib_dir.rstrip("/"), MANIFEST))
    try:
        with open(path) as handle:
            names = json.load(handle)
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return ["%s/%s" % (lib_dir.rstrip("/"), n) for n in names
            if isinstance(n, str) and not n.startswith("/") and ".." not in n.split("/")]


def bytecode_of(paths, root="/"):
    """The __pycache__ files Python wrote for the given .py files (their bytecode is ours too)."""
    out = []
    for path in paths:
        if not path.endswith(".py"):
            continue
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        stem = os.path.basename(path)[:-3] + "."
        try:
            names = os.listdir(rooted(root, cache))
        except OSError:
            continue
        out += ["%s/%s" % (cache, n) for n in sorted(names) if n.startswith(stem) and n.endswith(".pyc")]
    return out


def owned_paths(settings, root="/"):
    """Every path a present state may have installed (for removal): only the collection's own,
    with the bytecode Python wrote for its library files."""
    lib = settings["lib_dir"].rstrip("/")
    paths = [settings["entry_point"], settings["state_file"], UDEV_RULE] + \
        ["%s/%s" % (UNIT_DIR, u) for u in (UNIT, RECHECK_UNIT, TIMER)] + [h[1] for h in HOOKS.values()]
    library = installed_library(lib, root)
    return paths + library + bytecode_of(library, root) + ["%s/%s" % (lib, MANIFEST)]


def systemctl_show(out):
    """``systemctl show --property=... UNIT...`` output: one dict of properties per unit, in the order asked
    (systemd separates the units' blocks by an empty line)."""
    return [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in out.strip().split("\n\n")]


# ------------------------------------------------------------- plan / apply --

def _current(path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        return {"data": None, "mode": st.st_mode & 0o7777, "owner": (st.st_uid, st.st_gid), "regular": False}
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise PersistError("cannot read %s: %s" % (path, exc), path=path)
    return {"data": data, "mode": st.st_mode & 0o7777, "owner": (st.st_uid, st.st_gid), "regular": True}


def _text(data):
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "<binary, %d bytes>\n" % len(data)


def plan_files(files, remove=(), root="/", diff_skip=()):
    """Compare ``files`` ({path: (bytes, mode)}) and ``remove`` (paths) with the tree under ``root``.

    Returns a list of actions ``{path, action, reason, before, after}`` with
    action ``create``, ``update``, ``remove`` or ``unchanged``; ``before`` and
    ``after`` are the texts for ``--diff`` (left empty for paths that start
    with one of ``diff_skip``: the collection's own library source).
    """
    actions = []
    for path in sorted(files):
        data, mode = files[path]
        cur = _current(rooted(root, path))
        quiet = any(path.startswith(p) for p in diff_skip)
        if cur is None:
            action, reason = "create", "missing"
        elif not cur["regular"]:
            action, reason = "update", "not a regular file"
        elif cur["data"] != data:
            action, reason = "update", "content differs"
        elif cur["mode"] != mode or cur["owner"] != (0, 0):
            action, reason = "update", "mode %04o owner %d:%d, want %04o root:root" % (cur["mode"], cur["owner"][0], cur["owner"][1], mode)
        else:
            action, reason = "unchanged", ""
        actions.append({"path": path, "action": action, "reason": reason, "mode": "%04o" % mode,
                        "before": "" if quiet or cur is None else _text(cur["data"]),
                        "after": "" if quiet else _text(data)})
    for path in sorted(set(remove) - set(files)):
        cur = _current(rooted(root, path))
        if cur is not None:
            quiet = any(path.startswith(p) for p in diff_skip)
            actions.append({"path": path, "action": "remove", "reason": "no longer installed", "mode": "",
                            "before": "" if quiet else _text(cur["data"]), "after": ""})
    return actions


def write_atomic(path, data, mode, owner=(0, 0)):
    """Write ``data`` to ``path`` through a temporary file in its directory, fsync'd and renamed over it, with
    ``mode`` and (when running as root) ``owner`` (uid, gid)."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), owner[0], owner[1])
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def fsync_dir(directory):
    """fsync a directory, so that a rename or unlink in it is durable."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _makedirs(path, created):
    """mkdir -p with 0755, remembering what it created (for rollback)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.chmod(directory, 0o755)
        created.append(directory)


def apply_files(files, actions, root="/", write=None, prune_within=None):
    """Carry out ``actions`` from :func:`plan_files`. All or nothing: on a failed
    write every file already written is put back (or removed) and the error raised.
    Directories that removals left empty are removed up to and including
    ``prune_within`` (the lib dir), never above it.

    Returns the undo record of what was done, for :func:`rollback_files` when a later step of the caller fails."""
    write = write or write_atomic
    done, created_dirs = [], []
    try:
        for act in actions:
            path = rooted(root, act["path"])
            if act["action"] in ("create", "update"):
                data, mode = files[act["path"]]
                old = _current(path) if act["action"] == "update" else None
                _makedirs(os.path.dirname(path), created_dirs)
                if old is not None and not old["regular"] and os.path.isdir(path):
                    raise PersistError("%s is a directory, expected a file the collection installs" % act["path"],
                                       path=act["path"])
                write(path, data, mode)
                done.append((path, old))
            elif act["action"] == "remove":
                old = _current(path)
                os.unlink(path)
                done.append((path, old))
    except (OSError, PersistError) as exc:
        problems = _rollback(done, created_dirs)
        raise PersistError("writing %s failed (%s); %s" % (
            act["path"], exc, "rolled back every file written before" if not problems
            else "rollback failed for %s" % ", ".join(problems)), path=act["path"], rollback_failed=problems)
    removed = [a["path"] for a in actions if a["action"] == "remove"]
    if prune_within:
        _prune_empty_dirs(removed, root, prune_within)
    return {"done": done, "created_dirs": created_dirs}


def rollback_files(undo):
    """Put back every file of an :func:`apply_files` that succeeded (``undo``, what it returned): the bytes, mode and
    owner of each file it wrote or removed, and the absence of each file it created (with the directories it made).
    Returns ``restored`` and ``failed`` (paths); a file that was not a regular file before cannot be put back."""
    failed = _rollback(undo["done"], undo["created_dirs"])
    return {"restored": [path for path, _old in undo["done"] if path not in failed], "failed": failed}


def _rollback(done, created_dirs):
    problems = []
    for path, old in reversed(done):
        try:
            if old is None:
                os.unlink(path)
            elif old["regular"]:
                _makedirs(os.path.dirname(path), [])        # a removal may have pruned its directory
                write_atomic(path, old["data"], old["mode"])
                if os.geteuid() == 0:
                    os.chown(path, old["owner"][0], old["owner"][1])
            else:
                problems.append(path)                       # a link or special file: not put back
        except OSError:
            problems.append(path)
    for directory in reversed(created_dirs):
        try:
            os.rmdir(directory)
        except OSError:
            pass
    return problems


def _prune_empty_dirs(removed, root, top):
    """Remove the directories under ``top`` (``top`` included) that removal left empty.
    A directory holding anything the collection did not install is never empty, so it stays."""
    top = top.rstrip("/")
    for path in sorted(set(os.path.dirname(p) for p in removed if p.startswith(top + "/")), key=len, reverse=True):
        while path == top or path.startswith(top + "/"):
            try:
                os.rmdir(rooted(root, path))
            except OSError:
                break
            path = os.path.dirname(path)
