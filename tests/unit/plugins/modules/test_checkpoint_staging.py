# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""checkpoint_staging through its main(): the check-mode plan (every file, the staging directory, the systemd
actions) and bad input failing with nothing written. The mount tables are SYNTHETIC (written for these tests). The
installed entry point is run as the node would run it, against real directories. Applying with real systemd needs
the lab (no systemd runs as PID 1 here): where a run applies, a stand-in ``systemctl`` on PATH (a shell script
that logs its arguments and fails where a test asks it to) takes systemd's place, and the units go to a
temporary ``unit_dir``. The copier's user is a real non-root user of this host (``daemon`` on Debian)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys

import pytest

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import install as _ckpt_install
from ansible_collections.gpunode.tuning.plugins.modules import checkpoint_staging

pytestmark = pytest.mark.usefixtures("fake_exits")

# The exposure score of the copier's service as systemd-analyze security --offline=yes measures it (systemd 252,
# Debian 12); the role's README records the same number.
EXPOSURE = 0.4
STATE_FILE = "/var/lib/gpunode-ckpt-unit-test/state.json"  # read by the module (status), never written in a test
STAND_IN = """#!/bin/sh
echo "$*" >> %(log)s
case "$1" in show) echo "System has not been booted with systemd" >&2; exit 1;; esac
if [ -f %(fail)s ] && [ "$1" = "$(cat %(fail)s)" ]; then echo "Failed to $1: stand-in failure" >&2; exit 1; fi
exit 0
"""


def _user():
    """A non-root user of this host whose primary group is not gid 0 (daemon on Debian)."""
    for entry in [pwd.getpwnam(n) for n in ("daemon", "nobody") if n in [p.pw_name for p in pwd.getpwall()]]:
        if entry.pw_uid and entry.pw_gid:
            return entry
    return next(p for p in pwd.getpwall() if p.pw_uid and p.pw_gid)


USER = _user()
# Applying gives the staging directory to USER (chown): root only, as on a node.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="applying chowns the staging directory: needs root")


@pytest.fixture(autouse=True)
def systemctl(tmp_path, monkeypatch):
    """A stand-in systemctl on PATH: {"log": its calls, "fail": a file naming the verb to fail}."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    paths = {"log": tmp_path / "systemctl.log", "fail": tmp_path / "systemctl.fail"}
    (bin_dir / "systemctl").write_text(STAND_IN % paths)
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    return paths


def calls(paths):
    return paths["log"].read_text().splitlines() if paths["log"].exists() else []


def setup(tmp_path, target_fs="nfs4"):
    staging, target = tmp_path / "nvme" / "ckpt", tmp_path / "nfs" / "ckpt"
    target.mkdir(parents=True)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:45 / %s rw,relatime shared:20 - %s server:/export rw,vers=4.2,hard\n" % (tmp_path / "nfs", target_fs))
    args = dict(staging_dir=str(staging), target_dir=str(target), mountinfo_path=str(mountinfo),
                config_file=str(tmp_path / "etc" / "ckpt-copier.json"), state_file=STATE_FILE,
                lib_dir=str(tmp_path / "lib"), entry_point=str(tmp_path / "sbin" / "gpunode-ckpt-copier"),
                python=sys.executable, staging_owner=USER.pw_name, unit_dir=str(tmp_path / "units"))
    return staging, target, args


def written(tmp_path):
    """Every file a run may have written under tmp_path (the stand-in's own files and the inputs left out)."""
    out = []
    for top in ("etc", "lib", "sbin", "units"):
        for dirpath, _dirs, files in os.walk(str(tmp_path / top)):
            out += [os.path.join(dirpath, f) for f in files]
    return sorted(out)


def unit_text(res, args):
    return [d for d in res["diff"] if d["after_header"] == args["unit_dir"] + "/" + _ckpt_install.SERVICE][0]["after"]


def test_check_mode_is_the_exact_plan_and_writes_nothing(tmp_path):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, completion="marker", watermark_percent=70), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    assert res["staging"]["action"] == "create" and res["staging"]["mode"] == "0750"
    created = dict((f["path"], f["action"]) for f in res["files"])
    assert created[args["config_file"]] == "create" and created[args["entry_point"]] == "create"
    for unit in _ckpt_install.UNITS:
        assert "%s/%s" % (args["unit_dir"], unit) in created
    assert any(p.endswith("/_checkpoint/copier.py") for p in created) and not any(p.endswith("/_nic_irq/nic.py") for p in created)
    assert res["systemd"][0] == "daemon-reload" and "enable --now gpunode-ckpt-copier.path" in res["systemd"]
    assert res["placement"]["target_fstype"] == "nfs4"
    assert res["config"]["completion"] == "marker" and res["config"]["marker_suffix"] == ".done"
    config_diff = [d for d in res["diff"] if d["after_header"] == args["config_file"]][0]
    written = json.loads(config_diff["after"])
    assert written["watermark_percent"] == 70
    # The copier will only copy while the target is on the mount found now.
    assert written["target_mount"] == {"point": str(tmp_path / "nfs"), "fstype": "nfs4", "source": "server:/export"}
    assert written["mountinfo_path"] == args["mountinfo_path"]
    assert not staging.exists() and not os.path.exists(args["config_file"]) and not os.path.exists(args["lib_dir"])


@pytest.mark.parametrize("over,option,words", [
    ({"watermark_percent": 101}, "watermark_percent", "is not a percentage"),
    ({"watermark_percent": -5}, "watermark_percent", "is not a percentage"),
    ({"completion": "marker", "marker_suffix": ".tmp"}, "marker_suffix", "no marker would ever count"),
    ({"completion": "quiescent", "quiet_seconds": 0}, "quiet_seconds", "not a positive number"),
    ({"staging_owner": "no-such-user-gpunode"}, "staging_owner", "does not exist"),
    ({"staging_mode": "rwx"}, "staging_mode", "octal mode"),
    ({"interval": 0}, "interval", "not a positive number"),
])
def test_bad_input_names_the_value_and_writes_nothing(tmp_path, over, option, words):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, **over))
    assert kind is Fail and res["option"] == option and words in res["msg"] and res["changed"] is False
    assert not staging.exists() and not os.path.exists(args["config_file"])


def test_target_not_mounted_and_staging_on_the_target_fs(tmp_path):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, target_dir=str(tmp_path / "elsewhere")))
    assert kind is Fail and res["option"] == "target_dir" and "not on a mounted shared filesystem" in res["msg"]
    kind, res = modharness.run(checkpoint_staging, dict(args, staging_dir=str(tmp_path / "nfs" / "stage")))
    assert kind is Fail and res["option"] == "staging_dir" and "same filesystem" in res["msg"]
    kind, res = modharness.run(checkpoint_staging, dict(args, staging_dir=str(tmp_path / "nfs" / "ckpt" / "s")))
    assert kind is Fail and "that is no staging" in res["msg"]
    assert not staging.exists() and not os.path.exists(args["config_file"])


def test_the_rendered_entry_point_runs_the_collections_copier(tmp_path):
    """The files the module would install, written to a temp tree and run as the node runs them."""
    staging, target, args = setup(tmp_path)
    staging.mkdir(parents=True)
    cfg = {"staging_dir": str(staging), "target_dir": str(target), "state_file": str(tmp_path / "var" / "state.json"),
           "mountinfo_path": args["mountinfo_path"]}
    settings = dict(config_file=args["config_file"], lib_dir=args["lib_dir"], entry_point=args["entry_point"],
                    python=sys.executable, interval=30, timeout=600, user={"user": USER.pw_name, "group": "daemon"},
                    access={"read_write": [str(staging), str(target)], "state_directory": "x",
                            "runtime_directory": None, "protect_home": "yes"})
    for path, (data, mode) in _ckpt_install.render(cfg, settings).items():
        if path.startswith("/etc/systemd/"):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)
    (staging / "step1.pt").write_bytes(b"w" * 12345)
    (staging / "step2.pt.tmp").write_bytes(b"v")
    env = dict(os.environ, PYTHONPATH="")  # only the installed library
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a node: Python writes the library's bytecode
    out = subprocess.run([args["entry_point"], args["config_file"]], capture_output=True, text=True, env=env, check=True)
    assert "copied step1.pt" in out.stdout
    assert sorted(os.listdir(target)) == ["step1.pt"] and sorted(os.listdir(staging)) == ["step2.pt.tmp"]
    out = subprocess.run([args["entry_point"], "--status", args["config_file"]], capture_output=True, text=True, env=env,
                         check=True)
    report = json.loads(out.stdout)
    assert report["copied"] == 1 and report["oldest_not_durable"]["name"] == "step2.pt.tmp"
    # The bytecode Python wrote for the installed library is not drift: the module's next plan leaves the library
    # alone (it used to plan removing every .pyc, so a converged node was never idempotent; found in the lab).
    pycs = [os.path.join(d, f) for d, _s, fs in os.walk(args["lib_dir"]) for f in fs if f.endswith(".pyc")]
    assert pycs, "the copier wrote no bytecode: nothing tested"
    _kind, res = modharness.run(checkpoint_staging, dict(args, python=sys.executable), check=True)
    lib_actions = dict((f["path"], f["action"]) for f in res["files"] if f["path"].startswith(args["lib_dir"]))
    assert lib_actions and set(lib_actions.values()) == {"unchanged"}, lib_actions


# ------------------------------------------------ the copier runs unprivileged, sandboxed (issue 27) --

def test_the_service_runs_as_the_staging_owner_in_systemds_sandbox(tmp_path):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, args, check=True, diff=True)
    assert kind is Exit, res
    group = grp.getgrgid(USER.pw_gid).gr_name
    assert res["service_user"] == {"user": USER.pw_name, "group": group}
    assert res["staging"]["owner"] == [USER.pw_uid, USER.pw_gid]  # the staging directory is the same user's
    lines = unit_text(res, args).splitlines()
    directives = [line for line in lines if not line.startswith("#")]
    assert "User=%s" % USER.pw_name in directives and "Group=%s" % group in directives
    for key, value in _ckpt_install.SANDBOX:
        assert "%s=%s" % (key, value) in directives, key
    for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes",
                "RestrictSUIDSGID=yes", "PrivateDevices=yes", "CapabilityBoundingSet=", "AmbientCapabilities=",
                "RestrictAddressFamilies=AF_UNIX", "SystemCallFilter=@system-service", "UMask=0027"):
        assert key in directives, key
    # It writes only staging, the target's mount (the mount point: see _ckpt_install.writable) and its state.
    assert "ReadWritePaths=%s -%s" % (staging, tmp_path / "nfs") in directives
    assert "StateDirectory=gpunode-ckpt-unit-test" in directives
    assert not any(line.startswith("RuntimeDirectory=") for line in directives)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_units_exposure_score_is_at_most_the_recorded_one(tmp_path):
    _staging, _target, args = setup(tmp_path)
    _kind, res = modharness.run(checkpoint_staging, dict(args, pause_file="/run/gpunode-ckpt/pause"), check=True,
                                diff=True)
    unit = tmp_path / _ckpt_install.SERVICE
    unit.write_text(unit_text(res, args))
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True,
                         check=False, cwd=str(tmp_path))
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout)
    if out.returncode != 0 and found is None:
        pytest.skip("systemd-analyze cannot score a unit offline here: %s" % out.stderr.strip()[:200])
    assert found, out.stdout
    assert float(found.group(1)) <= EXPOSURE, out.stdout


@pytest.mark.parametrize("owner,group", [("root", None), ("0", None), (None, "root"), (None, "0")])
def test_root_is_refused_as_the_copiers_user_or_group_unless_opted_in(tmp_path, owner, group):
    staging, _target, args = setup(tmp_path)
    over = dict(staging_owner=owner or USER.pw_name, staging_group=group)
    kind, res = modharness.run(checkpoint_staging, dict(args, **over), check=True)
    assert kind is Fail and res["option"] == ("staging_owner" if owner else "staging_group") and res["changed"] is False
    assert "allow_root_copier" in res["msg"]
    # The explicit, documented opt-in: root, still inside the sandbox.
    kind, res = modharness.run(checkpoint_staging, dict(args, allow_root_copier=True, **over), check=True, diff=True)
    assert kind is Exit, res
    directives = unit_text(res, args).splitlines()
    assert ("User=root" if owner else "Group=root") in directives and "CapabilityBoundingSet=" in directives
    # The state writer's fchown as root stays allowed (the strace of a pass as a non-root user used none).
    assert ("SystemCallFilter=@chown" in directives) == bool(owner)
    assert not staging.exists() and written(tmp_path) == []


def test_the_owner_is_required_and_the_group_defaults_to_its_primary_group(tmp_path):
    _staging, _target, args = setup(tmp_path)
    del args["staging_owner"]
    kind, res = modharness.run(checkpoint_staging, args, check=True)
    assert kind is Fail and res["option"] == "staging_owner" and "required" in res["msg"] and res["changed"] is False
    kind, res = modharness.run(checkpoint_staging, dict(args, staging_owner=str(USER.pw_uid)), check=True)
    assert kind is Exit and res["service_user"]["user"] == USER.pw_name  # a uid is resolved to its name


@pytest.mark.parametrize("value", ["a\x00b", "\u00b2", "99999999999999999999", "-rf", "%i", "daemon\n"])
@pytest.mark.parametrize("option", ["staging_owner", "staging_group"])
def test_odd_owner_and_group_names_fail_cleanly(tmp_path, systemctl, option, value):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, **{option: value}))
    assert kind is Fail and res["option"] == option and res["changed"] is False, res
    assert "does not exist" not in res["msg"] and "Traceback" not in res["msg"]
    assert not staging.exists() and written(tmp_path) == [] and calls(systemctl) == []


@pytest.mark.parametrize("over,option", [
    ({"state_file": "/etc/gpunode/state.json"}, "state_file"),
    ({"state_file": "/var/lib/state.json"}, "state_file"),
    ({"pause_file": "/etc/nologin"}, "pause_file"),
    ({"pause_file": "/var/tmp/pause"}, "pause_file"),
    ({"pause_file": "/run/user/1000/pause"}, "pause_file"),
    ({"pause_file": STATE_FILE}, "pause_file"),
    ({"entry_point": "/usr/local/sbin/a b"}, "entry_point"),
    ({"config_file": "/etc/gpunode/%h.json"}, "config_file"),
])
def test_every_path_the_copier_writes_is_in_its_sandbox_and_every_unit_path_is_plain(tmp_path, over, option):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, **over), check=True)
    assert kind is Fail and res["option"] == option and res["changed"] is False, res
    assert not staging.exists() and written(tmp_path) == []


def test_a_pause_file_under_run_gets_a_runtime_directory_and_home_stays_reachable(tmp_path):
    _staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, pause_file="/run/gpunode-ckpt-t/pause"), check=True,
                               diff=True)
    assert kind is Exit, res
    directives = unit_text(res, args).splitlines()
    assert "RuntimeDirectory=gpunode-ckpt-t" in directives and "RuntimeDirectoryPreserve=yes" in directives
    kind, res = modharness.run(checkpoint_staging, dict(args, pause_file=STATE_FILE + ".pause"), check=True, diff=True)
    assert kind is Exit, res
    # A staging directory under /home: ProtectHome=read-only keeps it reachable, ReadWritePaths= writable.
    kind, res = modharness.run(checkpoint_staging, dict(args, staging_dir="/home/gpunode-unit-test/ckpt"), check=True,
                               diff=True)
    assert kind is Exit, res
    directives = unit_text(res, args).splitlines()
    assert "ProtectHome=read-only" in directives
    assert "ReadWritePaths=/home/gpunode-unit-test/ckpt -%s" % (tmp_path / "nfs") in directives


# --------------------------------------------- every tool checked first, everything put back (issue 27) --

def test_a_missing_systemctl_fails_before_anything_is_written(tmp_path, monkeypatch):
    staging, _target, args = setup(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for check in (False, True):
        kind, res = modharness.run(checkpoint_staging, args, check=check)
        assert kind is Fail and "systemctl not found" in res["msg"] and res["changed"] is False
        assert not staging.exists() and written(tmp_path) == []


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
def test_an_interpreter_that_cannot_run_the_copier_fails_before_anything_is_written(tmp_path, python):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, python=python))
    assert kind is Fail and res["option"] == "python" and res["changed"] is False
    assert not staging.exists() and written(tmp_path) == []


@needs_root
def test_apply_installs_the_copier_for_its_user(tmp_path, systemctl):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, args)
    assert kind is Exit and res["changed"] is True, res
    st = os.stat(str(staging))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (USER.pw_uid, USER.pw_gid, 0o750)
    assert "User=%s" % USER.pw_name in (tmp_path / "units" / _ckpt_install.SERVICE).read_text().splitlines()
    assert calls(systemctl)[1:] == ["daemon-reload", "enable --now gpunode-ckpt-copier.path",
                                    "enable --now gpunode-ckpt-copier.timer"]


def _tree(top):
    """{relative path: (mode, uid, gid, bytes or None)} of everything under ``top``."""
    out = {}
    for dirpath, dirs, files in os.walk(str(top)):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    data = handle.read()
            out[os.path.relpath(path, str(top))] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, data)
    return out


@needs_root
@pytest.mark.parametrize("staging_exists", [True, False])
@pytest.mark.parametrize("fail_on", ["daemon-reload", "enable"])
def test_a_failed_systemctl_puts_back_the_files_and_the_staging_directory(tmp_path, systemctl, staging_exists,
                                                                          fail_on):
    staging, _target, args = setup(tmp_path)
    if staging_exists:
        staging.mkdir(parents=True, mode=0o700)
        os.chmod(str(staging), 0o700)
        (staging / "step1.pt").write_bytes(b"checkpoint")
    # An earlier install: its configuration and units must come back byte for byte, mode and owner.
    (tmp_path / "etc").mkdir()
    # (with the module's marks: what is not its own is refused, issue 27)
    (tmp_path / "etc" / "ckpt-copier.json").write_text('{"earlier": true, "staging_dir": "/s", "target_dir": "/t"}\n')
    os.chmod(args["config_file"], 0o600)
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / _ckpt_install.SERVICE).write_text("# %s\n[Service]\nExecStart=/bin/true\n" % _ckpt_install.HEADER)
    before = _tree(tmp_path / "etc"), _tree(tmp_path / "units")
    staging_before = _tree(tmp_path / "nvme") if staging_exists else None
    systemctl["fail"].write_text(fail_on)
    kind, res = modharness.run(checkpoint_staging, args)
    assert kind is Fail and "stand-in failure" in res["msg"] and "put back" in res["msg"], res
    assert res["changed"] is False and res["rollback_failed"] == []
    assert (_tree(tmp_path / "etc"), _tree(tmp_path / "units")) == before
    assert not os.path.exists(args["lib_dir"]) and not (tmp_path / "sbin").exists()
    if staging_exists:
        assert _tree(tmp_path / "nvme") == staging_before
        st = os.stat(str(staging))
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o700)
    else:
        assert not (tmp_path / "nvme").exists()  # created by this run (with its parent): removed again
    assert calls(systemctl)[-1] == "daemon-reload"  # systemd re-reads the units put back


@needs_root
def test_a_failed_write_puts_the_staging_directory_back(tmp_path, systemctl):
    staging, _target, args = setup(tmp_path)
    staging.mkdir(parents=True)
    os.chmod(str(staging), 0o755)
    (tmp_path / "sbin").write_text("a file where the entry point's directory should be")
    kind, res = modharness.run(checkpoint_staging, args)
    assert kind is Fail and "rolled back" in res["msg"] and res["changed"] is False, res
    st = os.stat(str(staging))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)
    assert written(tmp_path) == [] and calls(systemctl)[1:] == []


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x01" * 64, b"22 1 254:1 / / rw - ext4 /dev/vda rw\n\x00\x00"])
def test_a_binary_mount_table_fails_cleanly(tmp_path, content):
    staging, _target, args = setup(tmp_path)
    (tmp_path / "mountinfo").write_bytes(content)
    kind, res = modharness.run(checkpoint_staging, args, check=True)
    assert kind is Fail and res["option"] == "mountinfo_path" and res["changed"] is False, res
    assert not staging.exists()


def test_a_mount_table_with_bytes_that_are_not_utf8_still_places_the_target(tmp_path):
    _staging, _target, args = setup(tmp_path)
    with open(args["mountinfo_path"], "ab") as handle:
        handle.write(b"50 22 0:46 / /mnt/caf\xe9 rw - ext4 /dev/vdb rw\n")
    kind, res = modharness.run(checkpoint_staging, args, check=True)
    assert kind is Exit and res["placement"]["target_mount"] == str(tmp_path / "nfs"), res


def test_a_fifo_or_a_directory_as_mount_table_fails_without_blocking(tmp_path):
    _staging, _target, args = setup(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    for path in (str(fifo), str(tmp_path)):
        kind, res = modharness.run(checkpoint_staging, dict(args, mountinfo_path=path), check=True)
        assert kind is Fail and res["option"] == "mountinfo_path" and res["changed"] is False, res
