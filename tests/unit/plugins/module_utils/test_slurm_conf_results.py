# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""slurm.conf reading and writing, exactly: which files are read in which order, where an include is looked for,
what each refusal says and names, and the tokens the editor writes.

The files are synthetic, written here; the real public slurm.conf files and their round trip are in
test_slurm_conf.py. Include rules as Slurm's parser has them (src/common/parse_config.c: ``include`` at the start of
a line, ``%c`` replaced by ClusterName, no globbing). Written for #34: the mutation run left the include walk
(``Conf._load``, ``_include_path``), the reader (``_read``, ``inside``) and ``_token`` without exact assertions.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.conf import (
    MAX_INCLUDE_DEPTH, Conf, SlurmConfError, inside, new_line, parse_text, set_value)


def _etc(tmp_path, files):
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = etc / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(tmp_path)


def _refusal(root, path="/etc/slurm/slurm.conf"):
    with pytest.raises(SlurmConfError) as err:
        Conf(path, root)
    return err.value


# ------------------------------------------------------------------ the include walk

def test_files_and_entries_in_slurms_reading_order(tmp_path):
    root = _etc(tmp_path, {
        "slurm.conf": "ClusterName=lab\ninclude a.conf\nTaskPlugin=task/affinity\ninclude sub/../b.conf\n",
        "a.conf": "include /etc/slurm/c.conf\nNodeName=n1 CPUs=4\n",
        "b.conf": "TaskPlugin=task/cgroup\n",
        "c.conf": "PartitionName=p Nodes=n1\n",
    })
    conf = Conf("/etc/slurm/slurm.conf", root)
    assert list(conf.files) == ["/etc/slurm/slurm.conf", "/etc/slurm/a.conf", "/etc/slurm/c.conf", "/etc/slurm/b.conf"]
    assert conf.order == [("/etc/slurm/slurm.conf", 0), ("/etc/slurm/slurm.conf", 1), ("/etc/slurm/a.conf", 0),
                          ("/etc/slurm/c.conf", 0), ("/etc/slurm/a.conf", 1), ("/etc/slurm/slurm.conf", 2),
                          ("/etc/slurm/slurm.conf", 3), ("/etc/slurm/b.conf", 0)]
    assert [(path, entry.kind) for path, entry in conf.entries()] == [
        ("/etc/slurm/slurm.conf", "global"), ("/etc/slurm/slurm.conf", "include"), ("/etc/slurm/a.conf", "include"),
        ("/etc/slurm/c.conf", "object"), ("/etc/slurm/a.conf", "object"), ("/etc/slurm/slurm.conf", "global"),
        ("/etc/slurm/slurm.conf", "include"), ("/etc/slurm/b.conf", "global")]
    value, path, entry, pair = conf.get("TASKPLUGIN")
    assert (value, path, entry.line, pair.key) == ("task/cgroup", "/etc/slurm/b.conf", 1, "TaskPlugin")
    assert conf.get("CPUs") == (None, None, None, None)  # a node's key is not a global one
    assert conf.get("nothing") == (None, None, None, None)


def test_a_relative_include_is_looked_for_beside_slurm_conf_and_an_absolute_one_where_it_says(tmp_path):
    root = _etc(tmp_path, {"slurm.conf": "include parts/nodes.conf\n", "parts/nodes.conf": "include /etc/slurm/x.conf\n",
                           "x.conf": "MaxJobCount=5\n"})
    conf = Conf("/etc/slurm/slurm.conf", root)
    assert list(conf.files) == ["/etc/slurm/slurm.conf", "/etc/slurm/parts/nodes.conf", "/etc/slurm/x.conf"]
    assert conf.get("maxjobcount")[0] == "5"


def test_percent_c_is_the_last_cluster_name_set_on_a_global_line_before_the_include(tmp_path):
    root = _etc(tmp_path, {"slurm.conf": "ClusterName=one\nClusterName=two\nNodeName=n1 ClusterName=three\n"
                                         "include %c-nodes.conf\n",
                           "two-nodes.conf": "MaxJobCount=2\n"})
    conf = Conf("/etc/slurm/slurm.conf", root)
    assert "/etc/slurm/two-nodes.conf" in conf.files


def test_percent_c_without_a_cluster_name_before_it_is_refused(tmp_path):
    err = _refusal(_etc(tmp_path, {"slurm.conf": "NodeName=n1 ClusterName=x\ninclude %c.conf\nClusterName=late\n"}))
    assert str(err) == "/etc/slurm/slurm.conf line 2: include %c.conf uses %c but no ClusterName is set before it"
    assert err.details["path"] == "/etc/slurm/slurm.conf line 2"
    assert err.details["value"] == "%c.conf"
    assert err.details["expected"] == "ClusterName set before the include"


@pytest.mark.parametrize("files, message, details", [
    ({"slurm.conf": "\ninclude nodes*.conf\n"},
     "/etc/slurm/slurm.conf line 2: include nodes*.conf is a glob, which Slurm does not read",
     ("/etc/slurm/slurm.conf line 2", "nodes*.conf", "one file name")),
    ({"slurm.conf": "include a.conf\n", "a.conf": "\n\ninclude b.conf\n", "b.conf": "include a.conf\n"},
     "/etc/slurm/b.conf line 1 includes /etc/slurm/a.conf, which includes it again",
     ("/etc/slurm/a.conf", "/etc/slurm/a.conf", "includes without a cycle")),
    ({"slurm.conf": "include a.conf\ninclude b.conf\n", "a.conf": "MaxJobCount=1\n", "b.conf": "include a.conf\n"},
     "/etc/slurm/a.conf is included twice",
     ("/etc/slurm/a.conf", "/etc/slurm/a.conf", "each file read once")),
], ids=["glob", "cycle", "twice"])
def test_a_glob_a_cycle_and_a_file_included_twice_are_refused_naming_where(tmp_path, files, message, details):
    err = _refusal(_etc(tmp_path, files))
    assert str(err) == message
    assert (err.details["path"], err.details["value"], err.details["expected"]) == details


def _chain(levels):
    files = {"slurm.conf": "include l1.conf\n"}
    for level in range(1, levels):
        files["l%d.conf" % level] = "include l%d.conf\n" % (level + 1)
    files["l%d.conf" % levels] = "MaxJobCount=1\n"
    return files


def test_includes_may_nest_max_include_depth_levels_and_no_deeper(tmp_path):
    conf = Conf("/etc/slurm/slurm.conf", _etc(tmp_path / "ok", _chain(MAX_INCLUDE_DEPTH)))
    assert len(conf.files) == MAX_INCLUDE_DEPTH + 1
    err = _refusal(_etc(tmp_path / "deep", _chain(MAX_INCLUDE_DEPTH + 1)))
    assert str(err) == "includes nest deeper than %d at /etc/slurm/l%d.conf" % (MAX_INCLUDE_DEPTH, MAX_INCLUDE_DEPTH + 1)
    assert err.details["expected"] == "at most %d levels" % MAX_INCLUDE_DEPTH


# ------------------------------------------------------------------ reading one file

def test_a_missing_main_file_and_a_missing_include_are_named_as_what_they_are(tmp_path):
    err = _refusal(_etc(tmp_path, {}))
    assert str(err).startswith("cannot read slurm.conf /etc/slurm/slurm.conf: ")
    assert (err.details["path"], err.details["value"], err.details["expected"]) == (
        "/etc/slurm/slurm.conf", "/etc/slurm/slurm.conf", "a readable file")
    err = _refusal(_etc(tmp_path / "b", {"slurm.conf": "include gone.conf\n"}))
    assert str(err).startswith("cannot read include file /etc/slurm/gone.conf: ")


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    err = _refusal(_etc(tmp_path, {"slurm.conf": b"ClusterName=\xff\n"}))
    assert str(err) == "slurm.conf /etc/slurm/slurm.conf is not UTF-8 text"
    assert (err.details["path"], err.details["value"], err.details["expected"]) == (
        "/etc/slurm/slurm.conf", "/etc/slurm/slurm.conf", "UTF-8 text")
    err = _refusal(_etc(tmp_path / "b", {"slurm.conf": "include x.conf\n", "x.conf": b"\xfe"}))
    assert str(err) == "include file /etc/slurm/x.conf is not UTF-8 text"


def test_a_path_with_a_nul_byte_is_refused_with_the_byte_shown(tmp_path):
    with pytest.raises(SlurmConfError) as err:
        inside(str(tmp_path), "/etc/slurm/a\0b.conf", "include file", "slurm.conf line 3")
    assert str(err.value) == "include file /etc/slurm/a\\0b.conf (slurm.conf line 3): the path contains a NUL byte"
    assert err.value.details["expected"] == "a path without NUL bytes"
    with pytest.raises(SlurmConfError):
        inside(str(tmp_path) + "\0", "/etc/slurm/slurm.conf", "slurm.conf")


def test_a_link_out_of_the_tree_is_never_followed_and_a_link_inside_is(tmp_path):
    root = _etc(tmp_path, {"real.conf": "MaxJobCount=3\n"})
    outside = tmp_path.parent / ("outside-%s.conf" % tmp_path.name)
    outside.write_text("MaxJobCount=9\n")
    os.symlink(str(outside), str(tmp_path / "etc/slurm/slurm.conf"))
    with pytest.raises(SlurmConfError) as err:
        inside(root, "/etc/slurm/slurm.conf", "slurm.conf")
    assert str(err.value) == ("slurm.conf /etc/slurm/slurm.conf is a symbolic link (-> %s) that leads out of root %s, to %s: "
                              "a link out of the configuration tree is never followed; copy the file into the tree"
                              % (outside, root, os.path.realpath(str(outside))))
    assert err.value.details["target"] == os.path.realpath(str(outside))
    assert err.value.details["expected"] == "a file inside root %s" % root
    os.unlink(str(tmp_path / "etc/slurm/slurm.conf"))
    os.symlink("real.conf", str(tmp_path / "etc/slurm/slurm.conf"))
    assert inside(root, "/etc/slurm/slurm.conf", "slurm.conf") == str(tmp_path / "etc/slurm/slurm.conf")
    assert Conf("/etc/slurm/slurm.conf", root).get("maxjobcount")[0] == "3"


def test_a_directory_link_out_of_the_tree_is_named_as_the_way_out(tmp_path):
    root = _etc(tmp_path, {})
    away = tmp_path.parent / ("away-%s" % tmp_path.name)
    away.mkdir()
    (away / "slurm.conf").write_text("MaxJobCount=9\n")
    os.symlink(str(away), str(tmp_path / "etc/slurm/parts"))
    with pytest.raises(SlurmConfError) as err:
        inside(root, "/etc/slurm/parts/slurm.conf", "include file", "slurm.conf line 1")
    assert str(err.value).startswith("include file /etc/slurm/parts/slurm.conf (slurm.conf line 1) leads through a symbolic "
                                     "link out of root %s, to " % root)


def test_with_root_slash_every_path_is_inside():
    assert inside("/", "/etc/hostname", "slurm.conf") == "/etc/hostname"


# ------------------------------------------------------------------ one logical line

def test_text_after_an_include_file_name_is_refused(tmp_path):
    with pytest.raises(SlurmConfError) as err:
        parse_text("MaxJobCount=1\ninclude a.conf b.conf\n", "/etc/slurm/slurm.conf")
    assert str(err.value) == "/etc/slurm/slurm.conf line 2: unexpected text 'b.conf' after the include file name"
    assert (err.value.details["line"], err.value.details["value"], err.value.details["expected"]) == (
        2, "include a.conf b.conf", "include FILE")


def test_an_include_is_only_the_word_include_at_the_start():
    parsed = parse_text("Include  a.conf\nincludes=1\nMaxJobCount=1 include=b\n")
    assert [(e.kind, e.include) for e in parsed.entries] == [("include", "a.conf"), ("global", None), ("global", None)]
    assert parsed.entries[0].include_span == (9, 15)


def test_text_that_is_not_pairs_is_refused_quoting_it():
    with pytest.raises(SlurmConfError) as err:
        parse_text("\nNodeName=n1 CPUs 8\n", "s.conf")
    assert str(err.value) == ("s.conf line 2: cannot parse 'CPUs 8' in 'NodeName=n1 CPUs 8': expected Key=Value pairs "
                              "(a value with blanks in double quotes)")
    assert (err.value.details["line"], err.value.details["value"], err.value.details["expected"]) == (2, "CPUs 8", "Key=Value")


# ------------------------------------------------------------------ writing

@pytest.mark.parametrize("value, token", [
    ("0-3", "CpuSpecList=0-3"),
    ("", 'CpuSpecList=""'),
    ("a b", 'CpuSpecList="a b"'),
    ("a\tb", 'CpuSpecList="a\tb"'),
    ("x#y", 'CpuSpecList="x\\#y"'),
    ("back\\slash", 'CpuSpecList="back\\\\slash"'),
    ("a\\#b", 'CpuSpecList="a\\\\\\#b"'),
])
def test_new_values_are_written_as_slurm_reads_them_back(value, token):
    line = new_line([("CpuSpecList", value)])
    assert line == token + "\n"
    reread = parse_text("NodeName=n1 " + line).entries[0].get("cpuspeclist")
    assert reread.value == value


@pytest.mark.parametrize("value", ['say "x"', "two\nlines", '"'])
def test_a_value_with_a_double_quote_or_newline_cannot_be_written(value):
    with pytest.raises(SlurmConfError) as err:
        new_line([("Features", value)])
    assert str(err.value) == "value %r for Features cannot be written: it holds a double quote or a newline" % value
    assert err.value.details["value"] == value
    assert err.value.details["expected"] == "a value without double quotes or newlines"


def test_set_value_keeps_quotes_and_a_line_without_pairs_is_refused():
    entry = parse_text('NodeName=n1 Features="a b" CPUs=4\n').entries[0]
    assert set_value(entry, "features", "c") == 'NodeName=n1 Features="c" CPUs=4\n'
    assert set_value(entry, "cpus", "8 9") == 'NodeName=n1 Features="a b" CPUs="8 9"\n'
    assert set_value(entry, "CpuSpecList", "0") == 'NodeName=n1 Features="a b" CPUs=4 CpuSpecList=0\n'
    blank = parse_text("\n# only a comment\n").entries[1]
    with pytest.raises(SlurmConfError) as err:
        set_value(blank, "CpuSpecList", "0")
    assert str(err.value) == "line 2 holds no pairs to add CpuSpecList to"
    assert (err.value.details["value"], err.value.details["expected"]) == ("CpuSpecList", "a line with pairs")
