# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Mutation guards for _validate (issue 34): what ``./run.sh mutants validate`` found the tests did not pin.

Every refusal names the option, the value and what was expected (the project's rule for domain errors), on real
files for check_own_file; image references with a ``.``/``..`` component or ``//``; free text with DEL; is_valid.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._host import validate as V

MARK = "# Managed by gpunode.tuning (test)"
OWN_EXPECTED = "a path where nothing exists yet or a file this module wrote (with its marker)"


def own_file_refusal(option, path, marker=MARK):
    with pytest.raises(V.InputError) as exc:
        V.check_own_file(option, path, marker)
    assert exc.value.details == {"option": option, "value": path, "expected": OWN_EXPECTED}
    assert str(exc.value).startswith("%s %s " % (option, path))
    return str(exc.value)


def test_check_own_file_refusals_name_option_path_and_expected(tmp_path):
    own = tmp_path / "own"
    own.write_text(MARK + "\n")
    link = tmp_path / "link"
    link.symlink_to(own)
    assert "is a symlink" in own_file_refusal("state_file", str(link))
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    assert "not a regular file" in own_file_refusal("config_file", str(fifo))
    foreign = tmp_path / "passwd"
    foreign.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert "(no %r marker)" % MARK in own_file_refusal("policy_script", str(foreign))
    assert "(no gpunode.tuning marker)" in own_file_refusal("state_file", str(foreign), lambda data: False)
    # lstat itself fails (a name longer than NAME_MAX): "cannot be inspected", not "absent".
    too_long = str(tmp_path / ("x" * 300))
    assert "cannot be inspected" in own_file_refusal("entry_point", too_long)
    assert foreign.read_text() == "root:x:0:0:root:/root:/bin/bash\n" and own.read_text() == MARK + "\n"


def test_check_own_file_takes_a_bytes_marker(tmp_path):
    path = tmp_path / "unit"
    path.write_bytes(b"[Unit]\n" + MARK.encode() + b"\n")
    assert V.check_own_file("unit_file", str(path), MARK.encode()) == "own"


@pytest.mark.parametrize("value", ["localhost/../bb:1", "localhost/./bb:1", "localhost//bb:1", "registry.io/x/../y"])
def test_an_image_with_a_dot_component_or_an_empty_one_is_refused(value):
    with pytest.raises(V.InputError) as exc:
        V.check("image", "verify.image", value)
    assert exc.value.details["option"] == "verify.image" and exc.value.details["value"] == value
    assert exc.value.details["expected"].startswith("an image reference")
    assert "empty, . or .. components are refused" in str(exc.value)


def test_text_takes_blanks_and_refuses_del():
    V.check("text", "content", "a b\tc\r\n~")
    with pytest.raises(V.InputError) as exc:
        V.check("text", "content", "a\x7fb")
    assert exc.value.details["expected"] == "text without NUL or control characters"
    assert "a control character other than TAB, LF or CR is not allowed" in str(exc.value)


def test_is_valid_answers_without_raising():
    assert V.is_valid("cpulist", "0-3,8") is True
    assert V.is_valid("cpulist", "four") is False
    assert V.is_valid("word", "") is False
