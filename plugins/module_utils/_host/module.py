# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The start of every module: the AnsibleModule, with check mode, and every option through the one validator.

Private module_utils of gpunode.tuning, imported by the modules only (it imports Ansible's ``AnsibleModule``; the
libraries installed on a node for code that runs without Ansible never import it, which ``tests/unit/test_layers.py``
holds).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import validate_module


def new_module(argument_spec, input_rules, **kwargs):
    """``AnsibleModule(argument_spec, supports_check_mode=True, **kwargs)`` whose options have all passed the
    validator (:func:`_host.validate.validate_module`) before the module reads or changes anything: a bad value
    fails naming the option, the value and what was expected.

    ``input_rules`` maps the options that are not plain words or paths to their rule (``cpulist``, ``cidr``,
    ``timespan``, ``user``, ``mode``, ...); every other string option gets the safe-word or path rule of its type.
    """
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **kwargs)
    validate_module(module, argument_spec, input_rules)
    return module
