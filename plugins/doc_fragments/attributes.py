# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):
    """The attributes every module of the collection shares, as community.general's attributes fragment does.

    A module states only its own C(support) and C(details); the descriptions and the platform come from here."""

    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: linux
"""

    # A module that reads and never changes the node.
    READ_ONLY = r"""
attributes:
  diff_mode:
    support: none
    details: Nothing is changed, so there is nothing to diff.
"""

    # A module that returns ansible_facts.
    FACTS = r"""
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
"""
