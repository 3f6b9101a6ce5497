# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The generated trees the IRQ pin tests share: the seed article's VM and the 8-GPU node (``treegen``)."""

from __future__ import annotations

import pytest

import treegen


@pytest.fixture
def seed(tmp_path):
    return treegen.build_tree(tmp_path / "seed", treegen.seed_vm())


@pytest.fixture
def gpu(tmp_path):
    return treegen.build_tree(tmp_path / "gpu", treegen.gpu_node())
