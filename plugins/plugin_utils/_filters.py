# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way a filter of the collection turns a module_utils error into an ``AnsibleFilterError``.

Every filter plugin is a thin table of module_utils functions (``FilterModule.filters`` returns
:func:`filter_table`); what differs between plugins is which errors they expect and how each is worded, given as
``(exception types, message function)`` pairs tried in order. An error of no listed type propagates unchanged.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def detailed(name, exc):
    """A ``DetailedError`` with its value and what was expected: ``MESSAGE (FILTER: got VALUE, expected WHAT)``."""
    return "%s (%s: got %r, expected %s)" % (exc, name, exc.value, exc.expected)


def plain(name, exc):  # pylint: disable=unused-argument
    """The error's own message (it names the filter already)."""
    return str(exc)


def named(name, exc):
    """``FILTER: MESSAGE``."""
    return "%s: %s" % (name, exc)


def malformed(what, with_type=True):
    """A message function for input of the wrong shape (a ``KeyError`` or ``TypeError`` inside the renderer):
    ``FILTER: malformed WHAT (TYPE: MESSAGE)``, or ``(MESSAGE)`` without ``with_type``."""

    def message(name, exc):
        if with_type:
            return "%s: malformed %s (%s: %s)" % (name, what, type(exc).__name__, exc)
        return "%s: malformed %s (%s)" % (name, what, exc)

    return message


def wrap(name, func, handlers):
    """``func`` as the filter ``name``: an exception of a handler's types becomes an ``AnsibleFilterError`` worded by
    that handler's message function, with the original exception attached."""

    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            for types, message in handlers:
                if isinstance(exc, types):
                    raise AnsibleFilterError(message(name, exc), orig_exc=exc) from exc
            raise

    wrapper.__name__ = name
    wrapper.__doc__ = func.__doc__
    return wrapper


def filter_table(functions, handlers):
    """``{filter name: wrapped function}`` for ``FilterModule.filters``; ``functions`` maps names to functions."""
    return dict((name, wrap(name, func, handlers)) for name, func in functions.items())
