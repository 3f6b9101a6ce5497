# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""checkpoint_staging through its main(): the check-mode plan (every file, the staging directory, the systemd
actions) and bad input failing with nothing written. The mount tables are SYNTHETIC (written for these tests). The
installed entry point is run as the node would run it, against real directories. Applying with real systemd needs
the lab (no systemd runs as PID 1 here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import modharness
from modharness import Exit, Fail
from ansible_collections.gpunode.tuning.plugins.module_utils import _ckpt_install
from ansible_collections.gpunode.tuning.plugins.modules import checkpoint_staging

pytestmark = pytest.mark.usefixtures("fake_exits")


def setup(tmp_path, target_fs="nfs4"):
    staging, target = tmp_path / "nvme" / "ckpt", tmp_path / "nfs" / "ckpt"
    target.mkdir(parents=True)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:45 / %s rw,relatime shared:20 - %s server:/export rw,vers=4.2,hard\n" % (tmp_path / "nfs", target_fs))
    args = dict(staging_dir=str(staging), target_dir=str(target), mountinfo_path=str(mountinfo),
                config_file=str(tmp_path / "etc" / "ckpt-copier.json"), state_file=str(tmp_path / "var" / "state.json"),
                lib_dir=str(tmp_path / "lib"), entry_point=str(tmp_path / "sbin" / "gpunode-ckpt-copier"),
                python=sys.executable)
    return staging, target, args


def test_check_mode_is_the_exact_plan_and_writes_nothing(tmp_path):
    staging, _target, args = setup(tmp_path)
    kind, res = modharness.run(checkpoint_staging, dict(args, completion="marker", watermark_percent=70), check=True, diff=True)
    assert kind is Exit and res["changed"] is True
    assert res["staging"]["action"] == "create" and res["staging"]["mode"] == "0750"
    created = dict((f["path"], f["action"]) for f in res["files"])
    assert created[args["config_file"]] == "create" and created[args["entry_point"]] == "create"
    for unit in _ckpt_install.UNITS:
        assert "/etc/systemd/system/%s" % unit in created
    assert any(p.endswith("/_ckpt_copier.py") for p in created) and not any(p.endswith("/_nic.py") for p in created)
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
    ({"staging_mode": "rwx"}, "staging_mode", "not an octal mode"),
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
    cfg = {"staging_dir": str(staging), "target_dir": str(target), "state_file": args["state_file"],
           "mountinfo_path": args["mountinfo_path"]}
    settings = dict(config_file=args["config_file"], lib_dir=args["lib_dir"], entry_point=args["entry_point"],
                    python=sys.executable, interval=30, timeout=600)
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
