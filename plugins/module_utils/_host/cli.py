# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one command-line parser of the entry points that run on the node without Ansible.

Standard library and the error base only (the entry points' library is installed by :mod:`_host.payload`).
``argparse`` is not used because each entry point keeps its own usage and error lines, byte for byte, and its own
exit codes: this parser only splits the arguments and says which one it refuses; the caller writes the message.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError


class UsageError(DetailedError):
    """An argument the parser refuses.

    ``option`` is the argument at fault; ``value`` is the value that ``option``'s converter refused, or None when
    ``option`` is not known or is a valued option given last, without its value.
    """

    def __init__(self, option, value=None):
        super(UsageError, self).__init__(option if value is None else "%s %s" % (option, value),
                                         option=option, value=value)

    @property
    def option(self):
        return self.details["option"]


def parse_args(args, flags=(), options=None, prefix="-", options_first=False):
    """``(values, positionals)`` of the argument list ``args`` (not changed).

    An argument that starts with ``prefix`` is an option: one of ``flags`` (``values[flag]`` is True) or a key of
    ``options``, which maps an option to the converter of the argument that follows it, whatever that argument
    is (``values[option]`` is the converted value; the last one given wins). A converter that raises
    ``ValueError`` raises :class:`UsageError` with the value; any other option, or a valued option with nothing
    after it, raises :class:`UsageError` without one. The first refused argument is the one raised.

    With ``options_first`` the options end at the first argument that does not start with ``prefix``: it and
    every argument after it are positionals. Otherwise options and positionals mix in any order. Options not
    given are absent from ``values``.
    """
    options = options or {}
    rest = list(args)
    values, positionals = {}, []
    while rest:
        if not rest[0].startswith(prefix):
            if options_first:
                positionals.extend(rest)
                break
            positionals.append(rest.pop(0))
            continue
        arg = rest.pop(0)
        if arg in flags:
            values[arg] = True
        elif arg in options and rest:
            value = rest.pop(0)
            try:
                values[arg] = options[arg](value)
            except ValueError:
                raise UsageError(arg, value) from None
        else:
            raise UsageError(arg)
    return values, positionals
