"""Put tests/unit on sys.path so ``import treegen`` works from every unit test and benchmark."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
