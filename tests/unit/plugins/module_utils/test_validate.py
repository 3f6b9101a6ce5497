# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_validate: the one validator's rules, its walk over an argument_spec, and check_own_file on real files."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._host import validate as V
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

# One valid value per rule: every rule must have one (a new rule is noticed), and refuse it with a trailing newline.
VALID = {
    "path": "/usr/local/lib/gpunode-tuning",
    "word": "performance",
    "identifier": "managed_irq",
    "user": "trainer",
    "mode": "0750",
    "cpulist": "0-3,8",
    "fnmatch": "*.tmp",
    "unit": "system.slice",
    "file_name": "zz-gpunode-tuning.cfg",
    "timespan": "1min 5s",
    "kernel_param": "nohz_full=2-3",
    "shell_word": "/usr/bin/python3",
    "cidr": "10.0.0.0/24",
    "image": "docker.io/library/busybox:1.36",
    "cdi_kind": "gpunode.io/nccl",
    "keyword_or_path": "auto",
    "regex": "^python.*train\\.py",
    "text": "<system>\n</system>\n",
}


def refused(rule, value, option="opt"):
    with pytest.raises(V.InputError) as exc:
        V.check(rule, option, value)
    assert isinstance(exc.value, DetailedError)
    assert exc.value.details["option"] == option and exc.value.details["value"] == value
    assert exc.value.details["expected"]
    assert option in str(exc.value)
    return exc.value


def test_every_rule_has_a_valid_example_that_passes():
    assert sorted(VALID) == sorted(V.RULES)
    for rule, value in VALID.items():
        V.check(rule, "opt", value)


@pytest.mark.parametrize("rule", sorted(set(VALID) - {"text"}))
def test_a_trailing_newline_is_refused_by_every_rule(rule):
    """The $ anchor accepts one trailing newline; the rules are anchored with \\Z."""
    refused(rule, VALID[rule] + "\n")


@pytest.mark.parametrize("rule", sorted(VALID))
def test_nul_is_refused_by_every_rule(rule):
    refused(rule, VALID[rule][:2] + "\x00" + VALID[rule][2:])


@pytest.mark.parametrize("value", ["proc", "rel/x", "/a/../b", "/a/./b", "//etc", "/etc//x", "/usr/local/sbin/a b",
                                   "/etc/x.json\nExecStartPre=/bin/touch /pwned", "/a\tb", "/a;b", "/a|b", "/a&b",
                                   "/a<b", "/a>b", "/$(x)", "/`x`", '/lib"""', "/a#b", "/a'b", "/a\\b", "/a*b", "~/x"])
def test_path_rule_refuses(value):
    refused("path", value)


@pytest.mark.parametrize("value", ["/", "/proc", "/etc/gpunode/nic-irq-affinity.json", "/usr/local/lib/x/",
                                   "/opt/a@b/c-1.2_3+x=y:z,w"])
def test_path_rule_accepts(value):
    V.check("path", "opt", value)


@pytest.mark.parametrize("value", ["/etc/%h/x", "/usr/local/sbin/a%n", "/run/%i.sh"])
def test_path_rule_refuses_systemd_specifiers(value):
    """% is a specifier in unit files (%h, %n, %i) and a substitution in udev rules: never in a path."""
    assert "'%'" in str(refused("path", value))


def test_relative_path_message_says_so():
    assert "not absolute" in str(refused("path", "proc", "procfs_path"))


@pytest.mark.parametrize("value", ["30s", "5min", "1min 5s", "1h 30min", "2d", "1.5h", "500ms", "3 weeks", "10"])
def test_timespan_accepts_what_systemd_parses(value):
    V.check("timespan", "recheck_interval", value)


@pytest.mark.parametrize("value", ["1min\n5s", "5min\n", "1min\t5s", "5min; rm -rf /", "5 minutes please", "min",
                                   "$(x)", "-5s"])
def test_timespan_refuses(value):
    refused("timespan", value, "recheck_interval")


@pytest.mark.parametrize("value", ["nohz_full=2-3", "isolcpus=domain,managed_irq,2-3", "root=/dev/sda1", "quiet",
                                   "processor.max_cstate=1", "intel_idle.max_cstate=0", "console=ttyS0,115200n8"])
def test_kernel_param_accepts(value):
    V.check("kernel_param", "parameters[0]", value)


@pytest.mark.parametrize("value", ["quiet#rest", "#", "a b", 'x="y"', "x='y'", "x=$(id)", "x=`id`", "x=\\y", "x=a;b",
                                   "x=a|b", "x=a&b", "x=a<b", "x=a>b", "x\n", "rel/x=1", "/a/../b"])
def test_kernel_param_refuses(value):
    refused("kernel_param", value, "parameters[0]")


def test_kernel_param_hash_is_named():
    exc = refused("kernel_param", "mitigations=off#comment", "parameters[0]")
    assert exc.details["character"] == "#" and "'#'" in str(exc)


@pytest.mark.parametrize("rule, value", [("unit", "system.slice\n"), ("unit", "init.scope\n"), ("unit", "a b.slice"),
                                         ("unit", ".slice"), ("unit", "work"), ("file_name", "50-x.conf\n"),
                                         ("file_name", "../x.conf"), ("file_name", ".hidden"), ("user", "-rf"),
                                         ("user", "root\n"), ("mode", "0750\n"), ("mode", "999"), ("cpulist", "0-3\n"),
                                         ("cpulist", "all;"), ("fnmatch", "a/b*"), ("fnmatch", "*.tmp\n"),
                                         ("cidr", "10.0.0.0/33"), ("cdi_kind", "rel/x\n"), ("image", "-rm"),
                                         ("keyword_or_path", "rel/x"), ("regex", "("), ("identifier", "a-b")])
def test_named_rules_refuse(rule, value):
    refused(rule, value)


def test_empty_passes_every_rule():
    for rule in V.RULES:
        V.check(rule, "opt", "")


SPEC = dict(
    name=dict(type="str"),
    root=dict(type="path"),
    level=dict(type="int"),
    flag=dict(type="bool"),
    choice=dict(type="str", choices=["a", "b"]),
    patterns=dict(type="list", elements="str"),
    paths=dict(type="list", elements="path"),
    cpus=dict(type="raw"),
    sub=dict(type="dict", options=dict(script=dict(type="path"), interval=dict(type="str"))),
)


def test_check_params_checks_every_string_of_the_spec():
    good = dict(name="eth0", root="/", level=3, flag=True, choice="a", patterns=["*.tmp"], paths=["/a"], cpus="0-3",
                sub=dict(script="/usr/local/libexec/p", interval="5min"))
    special = {"patterns": "fnmatch", "cpus": "cpulist", "sub.interval": "timespan"}
    V.check_params(good, SPEC, special)
    for key, value, option in [("name", "eth0\n", "name"), ("root", "rel", "root"),
                               ("patterns", ["ok", "a;b"], "patterns[1]"),
                               ("paths", ["/a/../b"], "paths[0]"), ("cpus", "0-3;x", "cpus"),
                               ("cpus", ["0", "1\n"], "cpus[1]"),
                               ("sub", dict(script="/a b", interval="5min"), "sub.script"),
                               ("sub", dict(script="/p", interval="1min\n5s"), "sub.interval")]:
        with pytest.raises(V.InputError) as exc:
            V.check_params(dict(good, **{key: value}), SPEC, special)
        assert exc.value.details["option"] == option, (key, value, exc.value.details)


def test_check_params_default_rules_are_word_and_path():
    with pytest.raises(V.InputError):
        V.check_params({"name": "a/b"}, SPEC)        # no / in a word
    with pytest.raises(V.InputError):
        V.check_params({"patterns": ["*.tmp"]}, SPEC)  # * only with the fnmatch rule
    V.check_params({"level": "x\n", "flag": "x\n"}, SPEC)   # not strings by type: not this walk's
    with pytest.raises(ValueError):
        V.check_params({}, SPEC, {"name": "no-such-rule"})


class _Module(object):
    def __init__(self, params):
        self.params = params

    def fail_json(self, **kwargs):
        raise RuntimeError(kwargs)


def test_validate_module_fails_naming_option_value_and_expected():
    with pytest.raises(RuntimeError) as exc:
        V.validate_module(_Module({"root": "proc"}), SPEC)
    kwargs = exc.value.args[0]
    assert kwargs["option"] == "root" and kwargs["value"] == "proc" and kwargs["expected"] and not kwargs["changed"]
    assert "root" in kwargs["msg"] and "'proc'" in kwargs["msg"]


# ---------------------------------------------------------------- own files --

MARK = "# Managed by gpunode.tuning (test)"


def test_check_own_file_absent_and_own(tmp_path):
    path = tmp_path / "entry"
    assert V.check_own_file("entry_point", str(path), MARK) == "absent"
    assert V.check_own_file("entry_point", str(tmp_path / "no-dir" / "x"), MARK) == "absent"
    path.write_text("#!/usr/bin/python3\n%s\nprint()\n" % MARK)
    assert V.check_own_file("entry_point", str(path), MARK) == "own"


def test_check_own_file_refuses_a_file_that_is_not_ours(tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(V.InputError) as exc:
        V.check_own_file("policy_script", str(passwd), MARK)
    assert exc.value.details["option"] == "policy_script" and exc.value.details["value"] == str(passwd)
    assert "not this module's" in str(exc.value)
    assert passwd.read_text() == "root:x:0:0:root:/root:/bin/bash\n"


def test_check_own_file_refuses_a_symlink_even_to_our_own_file(tmp_path):
    own = tmp_path / "own"
    own.write_text(MARK + "\n")
    link = tmp_path / "link"
    link.symlink_to(own)
    with pytest.raises(V.InputError) as exc:
        V.check_own_file("state_file", str(link), MARK)
    assert "symlink" in str(exc.value)


def test_check_own_file_refuses_a_fifo_and_a_directory_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    with pytest.raises(V.InputError) as exc:
        V.check_own_file("config_file", str(fifo), MARK)
    assert "not a regular file" in str(exc.value)
    with pytest.raises(V.InputError):
        V.check_own_file("config_file", str(tmp_path), MARK)


def test_check_own_file_with_a_callable_marker(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"pci_address": "0000:3b:00.0"}\n')
    assert V.check_own_file("state_file", str(path), lambda data: b"pci_address" in data) == "own"
    with pytest.raises(V.InputError):
        V.check_own_file("state_file", str(path), lambda data: False)


def test_a_rule_named_for_a_suboption_applies_to_it():
    """special names suboptions as parent.name: nccl_topo_mount's verify.image ('localhost/bb:1', the lab's image)
    takes the image rule, not the word rule (found in the lab: the word rule refused its '/')."""
    spec = {"verify": {"type": "dict", "options": {"image": {"type": "str"}, "command": {"type": "str"}}},
            "items": {"type": "list", "elements": "dict", "options": {"image": {"type": "str"}}}}
    special = {"verify.image": "image", "items.image": "image"}
    V.check_params({"verify": {"image": "localhost/bb:1", "command": "sh"}, "items": [{"image": "docker.io/x/y:2"}]},
                   spec, special)
    with pytest.raises(V.InputError) as exc:
        V.check_params({"verify": {"image": "localhost/bb:1", "command": "a/b"}}, spec, special)
    assert exc.value.details["option"] == "verify.command"
    with pytest.raises(V.InputError) as exc:
        V.check_params({"items": [{"image": "x;y"}]}, spec, special)
    assert exc.value.details["option"] == "items[0].image"
