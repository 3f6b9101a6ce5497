# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one base of the collection's bad-input and bad-text errors.

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``details`` are the keyword arguments a module passes on to
``fail_json`` (the option, the offending ``value``, what was ``expected``,
the path...).
"""

from __future__ import annotations


class DetailedError(ValueError):
    """An error with ``details`` for ``fail_json``; ``value`` and ``expected`` read them."""

    def __init__(self, message, **details):
        super(DetailedError, self).__init__(message)
        self.details = details

    @property
    def value(self):
        return self.details.get("value")

    @property
    def expected(self):
        return self.details.get("expected")
