"""The collection builds, installs from its tarball, and documents what exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args, **kwargs):
    proc = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, "%s failed:\n%s\n%s" % (args, proc.stdout, proc.stderr)
    return proc.stdout


def test_build_install_and_ansible_doc_list_every_plugin(tmp_path):
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(ROOT), "--output-path", str(tmp_path / "dist")])
    tarballs = list((tmp_path / "dist").glob("gpunode-tuning-*.tar.gz"))
    assert len(tarballs) == 1
    members = run(["tar", "-tzf", str(tarballs[0])]).split()
    # Dev-only files stay out of the artifact (galaxy.yml build_ignore).
    assert not [m for m in members if m.startswith((".venv", "build/", "molecule/", "tests/lab", ".ci"))]
    assert "plugins/module_utils/_parse/cpulist.py" in members

    install_root = tmp_path / "collections"
    # Only the fresh install is visible: not the checkout the other tests use.
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(install_root), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarballs[0]), "-p", str(install_root)], env=env)
    assert (install_root / "ansible_collections" / "gpunode" / "tuning" / "MANIFEST.json").is_file()

    modules = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
    if modules:
        listed = json.loads(run([str(BIN / "ansible-doc"), "-l", "gpunode.tuning", "-j"], env=env, cwd=str(tmp_path)))
        assert sorted(name.split(".")[-1] for name in listed) == modules

    filters = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.yml"))
    listed = json.loads(run([str(BIN / "ansible-doc"), "-t", "filter", "-l", "gpunode.tuning", "-j"], env=env, cwd=str(tmp_path)))
    assert sorted(name.split(".")[-1] for name in listed) == filters
    assert "cpulist_difference" in filters
