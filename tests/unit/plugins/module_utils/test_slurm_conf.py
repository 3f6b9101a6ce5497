# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""slurm.conf reading and editing: Slurm's reading rules on small texts written for the rule (synthetic, named
per test), and the real public files of tests/unit/fixtures/slurm (see the README there) read and given back."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.conf import (
    Conf,
    SlurmConfError,
    parse_text,
    remove_key,
    set_value,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
REAL_CONFS = sorted(p for p in FIXTURES.glob("**/*") if p.is_file() and p.suffix in (".conf", ".example") and "SYNTHETIC" not in p.name)


def _pairs(entry):
    return [(p.key, p.op, p.value) for p in entry.pairs]


def test_pairs_comments_continuations_and_case():
    text = ("# a comment\n"
            "ClusterName=lab   # trailing comment\n"
            "NodeName=gpu[01-04] CPUs=8 \\\n"
            "   Sockets=2 CoresPerSocket=2 \\\n"
            "   ThreadsPerCore=2 State=UNKNOWN\n"
            'Features="a b" Weight+=3\n'
            "\n")
    parsed = parse_text(text)
    kinds = [e.kind for e in parsed.entries]
    assert kinds == ["blank", "global", "object", "global", "blank"]
    assert parsed.render() == text
    node = parsed.entries[2]
    assert node.line == 3
    assert _pairs(node) == [("NodeName", "", "gpu[01-04]"), ("CPUs", "", "8"), ("Sockets", "", "2"),
                            ("CoresPerSocket", "", "2"), ("ThreadsPerCore", "", "2"), ("State", "", "UNKNOWN")]
    assert node.get("threadspercore").value == "2"
    assert _pairs(parsed.entries[3]) == [("Features", "", "a b"), ("Weight", "+", "3")]


def test_escapes_and_a_comment_before_the_continuation_backslash():
    # parse_config.c strips the comment first, then looks for the continuation backslash
    parsed = parse_text("A=x\\#y B=1 \\ # why\nC=2\nD=\\\\\n")
    assert _pairs(parsed.entries[0]) == [("A", "", "x#y"), ("B", "", "1"), ("C", "", "2")]
    assert _pairs(parsed.entries[1]) == [("D", "", "\\")]


def test_include_lines():
    parsed = parse_text("include nodes.conf\nInclude   /etc/slurm/%c-parts.conf\nincludes=1\n")
    assert [e.include for e in parsed.entries] == ["nodes.conf", "/etc/slurm/%c-parts.conf", None]
    assert parsed.entries[2].pairs[0].key == "includes"


@pytest.mark.parametrize("text, fragment", [
    ("NodeName=a CPUs 8\n", "'CPUs 8'"),
    ('Features="a b\n', '\'Features="a b\''),
    ("include\n", "'include'"),
    ("include a.conf b.conf\n", "'b.conf'"),
    ("=3\n", "'=3'"),
])
def test_text_that_is_not_pairs_is_an_error_naming_it_and_the_line(text, fragment):
    with pytest.raises(SlurmConfError) as err:
        parse_text("ClusterName=x\n" + text, "/etc/slurm/slurm.conf")
    assert fragment in str(err.value) and "/etc/slurm/slurm.conf line 2" in str(err.value)


def test_set_value_in_place_keeps_the_rest_of_the_line_byte_for_byte():
    entry = parse_text("NodeName=n[1-2]  CpuSpecList=0,1   RealMemory=900 # keep\n").entries[0]
    assert set_value(entry, "cpuspeclist", "6-7") == "NodeName=n[1-2]  CpuSpecList=6-7   RealMemory=900 # keep\n"
    entry = parse_text("NodeName=n1 \\\n  RealMemory=900 # keep\n").entries[0]
    assert set_value(entry, "CpuSpecList", "6-7") == "NodeName=n1 \\\n  RealMemory=900 CpuSpecList=6-7 # keep\n"
    entry = parse_text('NodeName=n1 Features="x y"\n').entries[0]
    assert set_value(entry, "Features", "z") == 'NodeName=n1 Features="z"\n'


def test_remove_key_takes_the_pair_and_its_blanks():
    entry = parse_text("NodeName=n1 CpuSpecList=6,7 RealMemory=900\n").entries[0]
    assert remove_key(entry, "CPUSPECLIST") == "NodeName=n1 RealMemory=900\n"
    entry = parse_text("NodeName=n1 \\\n  CpuSpecList=6,7 \\\n  RealMemory=900\n").entries[0]
    assert remove_key(entry, "CpuSpecList") == "NodeName=n1 \\\n  \\\n  RealMemory=900\n"
    assert _pairs(parse_text(remove_key(entry, "CpuSpecList")).entries[0]) == [("NodeName", "", "n1"), ("RealMemory", "", "900")]


def test_includes_are_read_from_the_main_files_directory_with_cluster_name(tmp_path):
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True)
    (etc / "slurm.conf").write_text("ClusterName=lab\nTaskPlugin=task/affinity\ninclude nodes.conf\ninclude /etc/slurm/%c.conf\n")
    (etc / "nodes.conf").write_text("NodeName=n[1-2] CPUs=8\nTaskPlugin=task/cgroup\n")
    (etc / "lab.conf").write_text("PartitionName=all Nodes=ALL\n")
    conf = Conf("/etc/slurm/slurm.conf", str(tmp_path))
    assert list(conf.files) == ["/etc/slurm/slurm.conf", "/etc/slurm/nodes.conf", "/etc/slurm/lab.conf"]
    value, path, dummy, dummy2 = conf.get("taskplugin")
    assert (value, path) == ("task/cgroup", "/etc/slurm/nodes.conf")


@pytest.mark.parametrize("main, extra, fragment", [
    ("include a.conf\n", {"a.conf": "include slurm.conf\n"}, "includes it again"),
    ("include missing.conf\n", {}, "cannot read include file /etc/slurm/missing.conf"),
    ("include nodes*.conf\n", {}, "is a glob"),
    ("include %c.conf\n", {}, "no ClusterName"),
])
def test_bad_includes_are_errors_naming_the_file(tmp_path, main, extra, fragment):
    etc = tmp_path / "etc" / "slurm"
    etc.mkdir(parents=True)
    (etc / "slurm.conf").write_text(main)
    for name, text in extra.items():
        (etc / name).write_text(text)
    with pytest.raises(SlurmConfError) as err:
        Conf("/etc/slurm/slurm.conf", str(tmp_path))
    assert fragment in str(err.value)


def test_there_are_real_public_files_to_read():
    assert len(REAL_CONFS) >= 5, REAL_CONFS


@pytest.mark.parametrize("path", REAL_CONFS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_real_public_files_round_trip_and_every_line_parses(path):
    text = path.read_text()
    parsed = parse_text(text, str(path))
    assert parsed.render() == text
    for entry in parsed.entries:
        if entry.pairs:
            assert all(p.key for p in entry.pairs)
    # an edit of one value changes that line only
    objects = [e for e in parsed.entries if e.kind in ("global", "object")]
    if objects:
        first = objects[0]
        edited = set_value(first, first.pairs[-1].key, "gpunode")
        after = parse_text(text.replace(first.raw, edited, 1))
        assert [e.raw for e in after.entries if e.line != first.line] == [e.raw for e in parsed.entries if e.line != first.line]
