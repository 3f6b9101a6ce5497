# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one command-line parser of the node's entry points (#30): ``_host.cli.parse_args``, and the usage lines and
exit codes of the two entry points that use it (the checkpoint copier and the boot-time IRQ pins)."""

from __future__ import annotations

import io

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._checkpoint import cli as _ckpt_cli
from ansible_collections.gpunode.tuning.plugins.module_utils._host.cli import UsageError, parse_args
from ansible_collections.gpunode.tuning.plugins.module_utils._nic_irq import pin_cli as _irq_pin_cli


def _positive(value):
    number = float(value)
    if number <= 0:
        raise ValueError(value)
    return number


SPEC = dict(flags=("--a", "--b"), options={"--n": _positive})


@pytest.mark.parametrize("argv, values, positionals", [
    ([], {}, []),
    (["x", "--a", "y", "--n", "2", "--n", "3"], {"--a": True, "--n": 3.0}, ["x", "y"]),
    (["--n", "--a"], None, None),                  # the value is whatever follows, even an option
    (["--b", "-"], None, None),                   # "-" starts with the prefix: an option, and not a known one
])
def test_mixed_options_and_positionals(argv, values, positionals):
    if values is None:
        with pytest.raises(UsageError):
            parse_args(argv, **SPEC)
        return
    given = list(argv)
    assert parse_args(given, **SPEC) == (values, positionals)
    assert given == argv, "the argument list is not changed"


def test_options_first_ends_the_options_at_the_first_positional():
    assert parse_args(["--a", "-x", "--b", "--zz"], prefix="--", options_first=True, **SPEC) == (
        {"--a": True}, ["-x", "--b", "--zz"])
    assert parse_args(["--a", "-x", "--b"], prefix="--", **SPEC) == ({"--a": True, "--b": True}, ["-x"])


@pytest.mark.parametrize("argv, option, value", [
    (["--zz", "--n", "0"], "--zz", None),          # the first refused argument is the one raised
    (["--n", "0", "--zz"], "--n", "0"),            # a converter's ValueError names the value
    (["--n", "abc"], "--n", "abc"),
    (["--a", "--n"], "--n", None),                 # a valued option given last has no value
])
def test_the_refused_argument(argv, option, value):
    with pytest.raises(UsageError) as caught:
        parse_args(argv, **SPEC)
    assert (caught.value.option, caught.value.value) == (option, value)


@pytest.mark.parametrize("argv, stderr", [
    (["--bogus", "c.json"], "unknown option --bogus\n"),
    (["--deadline"], "unknown option --deadline\n"),
    (["--deadline", "0", "c.json"], "--deadline '0' is not a number of seconds above 0\n"),
    (["--deadline", "inf", "c.json"], "--deadline 'inf' is not a number of seconds above 0\n"),
    (["--deadline", "nan", "c.json"], "--deadline 'nan' is not a number of seconds above 0\n"),
    (["--deadline", "x", "c.json"], "--deadline 'x' is not a number of seconds above 0\n"),
    ([], "usage: gpunode-ckpt-copier [--status] [--force] [--deadline SECONDS] CONFIG\n"),
    (["c.json", "--status"], "usage: gpunode-ckpt-copier [--status] [--force] [--deadline SECONDS] CONFIG\n"),
])
def test_the_copier_refuses_its_command_line_with_2(argv, stderr, capsys):
    assert _ckpt_cli.main(argv) == 2
    assert capsys.readouterr() == ("", stderr)


USAGE = "usage: _irq_pin_cli [--check] [--quiet] [--wait SECONDS] [STATE.json]\n"


@pytest.mark.parametrize("argv, out", [
    (["--bogus"], USAGE),
    (["a.json", "-"], USAGE),
    (["--wait"], USAGE),
    (["--wait", "soon", "--bogus"], "usage: --wait takes seconds\n"),
])
def test_the_pin_entry_point_refuses_its_command_line_with_2(argv, out):
    written = io.StringIO()
    assert _irq_pin_cli.main(argv, out=written) == 2
    assert written.getvalue() == out


@pytest.mark.parametrize("argv, parsed", [
    ([], (False, False, 5.0, _irq_pin_cli.DEFAULT_STATE)),
    (["a.json", "--quiet", "--wait", "99", "b.json"], (False, True, 30.0, "b.json")),
    (["--check", "--wait", "-1"], (True, False, 0.0, _irq_pin_cli.DEFAULT_STATE)),
])
def test_the_pin_entry_point_reads_its_options_anywhere(argv, parsed):
    assert _irq_pin_cli._parse(argv, io.StringIO()) == parsed
