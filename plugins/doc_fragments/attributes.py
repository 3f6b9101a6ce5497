# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):
    """The attributes every module of the collection shares, as community.general's attributes fragment does.

    A module states only its own C(support) and C(details) where they say more than the fragment's; the author,
    the descriptions and the platform come from here. A facts module (READ_ONLY and FACTS) states none of them."""

    DOCUMENTATION = r"""
author:
  - gpunode.tuning contributors (@gpunode)
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
  check_mode:
    support: full
    details: Read-only; check mode reads and samples exactly as a normal run does and changes nothing.
  diff_mode:
    support: none
    details: Nothing is changed, so there is nothing to diff.
"""

    # A module that returns ansible_facts: one key, the module's name without C(_facts) (irqbalance_state, which
    # changes the node, states its own details).
    FACTS = r"""
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
    details: Sets one key of C(ansible_facts), the module's name without C(_facts) (M(gpunode.tuning.cpu_power_facts)
      sets C(ansible_facts.cpu_power)).
"""
