"""Make ``ansible_collections.gpunode.tuning`` importable for plain pytest.

The repository root is the collection root. When it is not already checked
out under ``ansible_collections/gpunode/tuning``, a symlink tree is made
under ``build/collections`` (git-ignored) and put first on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collections_root():
    if ROOT.parent.name == "gpunode" and ROOT.parent.parent.name == "ansible_collections" and ROOT.name == "tuning":
        return ROOT.parent.parent.parent
    base = ROOT / "build" / "collections"
    link = base / "ansible_collections" / "gpunode" / "tuning"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(ROOT, link)
    return base


COLLECTIONS = collections_root()
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
