# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The module-test harness: exit_json/fail_json raise Exit/Fail, and run() calls a module's main().

tests/unit/conftest.py puts tests/unit on sys.path, so ``import modharness`` works from every
unit test; tests/unit/plugins/modules/conftest.py offers the fixtures ``fake_exits`` and
``fake_exits_json`` that install the fakes.
"""

from __future__ import annotations

import contextlib
import json
from unittest import mock

import pytest

from ansible.module_utils import basic

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19 has no testing helper: the module arguments as those cores read them
    @contextlib.contextmanager
    def patch_module_args(args=None):
        """Expose ``args`` to AnsibleModule instances created within this context (ansible-core < 2.19)."""
        serialized = json.dumps({"ANSIBLE_MODULE_ARGS": dict(args or {})}).encode()
        with mock.patch.object(basic, "_ANSIBLE_ARGS", serialized):
            yield


class Exit(Exception):
    pass


class Fail(Exception):
    pass


def _as_json(kwargs):
    return json.loads(json.dumps(kwargs, default=str))


def install_fake_exits(monkeypatch, fail_as_json=False):
    """exit_json raises Exit with its result as JSON would carry it; fail_json raises Fail with
    its keyword arguments as they are, or as JSON would carry them when fail_as_json."""
    def exit_json(self, **kwargs):
        raise Exit(_as_json(kwargs))

    def fail_json(self, **kwargs):
        raise Fail(_as_json(kwargs) if fail_as_json else kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run(module, args, check=False, diff=False):
    """module.main() with args (check and diff mode when asked); returns (Exit or Fail, its result)."""
    args = dict(args)
    if check:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    with patch_module_args(args):
        with pytest.raises((Exit, Fail)) as exc:
            module.main()
    return exc.type, exc.value.args[0]
