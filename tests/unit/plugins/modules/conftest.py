# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the module-test harness (modharness); a test file opts in with
``pytestmark = pytest.mark.usefixtures("fake_exits")`` (test_softnet_check needs the real exits)."""

from __future__ import annotations

import pytest

import modharness


@pytest.fixture
def fake_exits(monkeypatch):
    """exit_json/fail_json raise modharness.Exit/Fail; Fail carries fail_json's arguments as they are."""
    modharness.install_fake_exits(monkeypatch)


@pytest.fixture
def fake_exits_json(monkeypatch):
    """As fake_exits, but Fail carries fail_json's arguments as JSON would."""
    modharness.install_fake_exits(monkeypatch, fail_as_json=True)
