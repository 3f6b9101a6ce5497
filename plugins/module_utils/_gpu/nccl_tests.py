# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...): parse it, gate it, compare a sweep (pure).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports.

* ``parse_nccl_tests(text)`` turns a log into runs: each run's banner
  (``# nccl-tests version``, ``# Collective test starting:``), its parameter
  line (``# nThread 1 nGpus 8 minBytes ...``), its device lines
  (``#  Rank  0 Group  0 Pid ... on host device  0 [0x07] NVIDIA H100``), the
  rows of its table and its footer (``# Out of bounds values : 0 OK``,
  ``# Avg bus bandwidth    : 38.5``).
* ``compare_busbw(data, thresholds)`` checks measured busbw against
  ``{size_bytes: min_busbw_gbps}``.
* ``sweep_compare(labelled, baseline, sizes)`` puts several labelled runs (one
  per value of a swept setting, e.g. ``NCCL_IB_QPS_PER_CONNECTION``) side by
  side and recommends a label only when it beats the baseline by a margin at
  every named size.

What the parser relies on (``src/util.cu`` and, before 2022, ``src/common.cu``
and each ``src/<test>.cu`` of NVIDIA/nccl-tests):

* Each table is read by its own column header line (``size count type redop
  root time algbw busbw #wrong time algbw busbw #wrong``), never by position.
  The columns moved between versions: before 2019 ``bytes N type op ... res``;
  until 2022 ``error`` (the largest difference, ``2e-07``) instead of
  ``#wrong`` (a count), no ``root`` for reductions and no ``redop`` for
  ``all_gather``/``sendrecv``; ``-C 1`` prints ``cputime`` for ``time``;
  ``-I 1`` adds ``i_min i_max i_p99 i_cv%`` to each half and ``-S 1`` a
  ``timestamp`` (two words). A measurement column that repeats starts the
  in-place half; a table with one half (old ``broadcast``) has no in-place.
* ``-c 0`` prints ``N/A`` in ``#wrong`` (so do ``alltoall``/``sendrecv`` for
  in-place): it becomes ``None``.
* Launcher prefixes are removed first: Open MPI ``--tag-output``
  (``[1,0]<stdout>:``, which mpirun also repeats inside a line wherever the
  program flushed, ``-1[1,0]<stdout>:   85.70``), MPICH ``-prepend-rank``
  (``[0] ``, repeated the same way), Slurm ``srun --label`` (`` 0: ``), Ray /
  SkyPilot (``(head, rank=0, pid=3808) ``), ``kubectl logs --prefix`` and
  ``--timestamps``. Each prefix is a stream; runs are assembled per stream, so
  ranks that each print a whole run (a non-MPI build under mpirun) do not mix.
* Several runs in one log (a script running every test, repeats, several
  configurations) are told apart by their banner or parameter line, or by a
  new column header once a table has rows. Everything else (shell prompts,
  ``NCCL INFO`` lines, ssh warnings, Markdown around a pasted log) is noise;
  the last ``..._perf`` command seen before a run names it when no banner
  does.
* A row that does not fit its header (truncated by a killed job, a column
  that is not a number) is kept out of the rows and reported in ``skipped``
  with its line number and the reason.

Units as nccl-tests prints them: sizes in bytes (int), times in
microseconds, algbw and busbw in GB/s (10^9 bytes per second), floats.
"""

from __future__ import annotations

import math
import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

PLACEMENTS = ("out_of_place", "in_place")
AGGREGATES = ("min", "max", "mean", "median")

# One launcher prefix at the start of a line; the stream key keeps its text.
_PREFIX_RES = (
    re.compile(r"\([^()\n]*\bpid=\d+[^()\n]*\)\s?"),  # Ray / SkyPilot: "(head, rank=0, pid=3808) "
    re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:"),  # Open MPI --tag-output
    re.compile(r"\[\d+\](?=\s)"),  # MPICH/hydra -prepend-rank, Intel MPI -l: "[0] "
    re.compile(r"\s*\d+:\s"),  # srun --label: " 0: "
    re.compile(r"\[pod/[^\]\s]+\]\s"),  # kubectl logs --prefix
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),  # kubectl/docker --timestamps
)
_OMPI_TAG_RE = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:")
_HYDRA_TAG_RE = re.compile(r"^\[\d+\]$")

_INT_RE = re.compile(r"^-?\d+$")
_VERSION_RE = re.compile(r"^([nr]ccl-tests) version (\S+)(.*)$")
_STARTING_RE = re.compile(r"^Collective test starting:\s*(\S+)")
_CONCLUDED_RE = re.compile(r"^Collective test concluded:\s*(\S+)")
_PARAMS_RE = re.compile(r"^nThread\s+-?\d+\s+nGpus\s+-?\d+")
_PARAM_ITEM_RE = re.compile(r"([A-Za-z_][A-Za-z_ ]*?)\s*:?\s+(-?\d+)(?:\((\w+)\))?")
_DEVICE_RE = re.compile(
    r"^Rank\s+(\d+)(?:\s+Group\s+(\d+))?(?:\s+Pid\s+(\d+))?\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_OOB_RE = re.compile(r"^Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG_RE = re.compile(r"^Avg bus bandwidth\s*:\s*(\S+)(?:\s+(?:GB/s\s*)?(OK|FAILED))?")
_MEMORY_RE = re.compile(r"^GPU memory usage\s*:\s*(.*?)\s*$")
_REDUCING_RE = re.compile(r"^Reducing maxBytes to (\d+)")
_NCCL_VERSION_RE = re.compile(r"^NCCL version (\S+)")
_COMMAND_RE = re.compile(r"(?:^|[\s/])([A-Za-z0-9_]+_perf[A-Za-z0-9_]*)(?=\s|$|\\)")
_COLLECTIVE_RE = re.compile(r"^(\w+?)_perf")
_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\d$")
_TIME_RE = re.compile(r"^\d\d:\d\d:\d\d$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)

# Header word -> (key, kind). Key columns come before the measurements; the
# measurement columns form the out-of-place half, then the in-place half.
_KEY_COLUMNS = {
    "size": ("size", "int"),
    "bytes": ("size", "int"),
    "count": ("count", "int"),
    "N": ("count", "int"),
    "type": ("type", "str"),
    "redop": ("redop", "str"),
    "op": ("redop", "str"),
    "root": ("root", "int"),
    "timestamp": ("timestamp", "timestamp"),
}
_MEASURE_COLUMNS = {
    "time": ("time_us", "float"),
    "cputime": ("cputime_us", "float"),
    "algbw": ("algbw_gbps", "float"),
    "busbw": ("busbw_gbps", "float"),
    "#wrong": ("wrong", "wrong"),
    "wrong": ("wrong", "wrong"),
    "error": ("error", "error"),
    "res": ("error", "error"),
    "i_min": ("i_min_us", "float"),
    "i_max": ("i_max_us", "float"),
    "i_p99": ("i_p99_us", "float"),
    "i_cv%": ("i_cv_pct", "float"),
}
_STAGE_VERSION, _STAGE_STARTING, _STAGE_PARAMS, _STAGE_DEVICES, _STAGE_HEADER, _STAGE_ROWS, _STAGE_FOOTER, _STAGE_DONE = range(1, 9)
_SNIPPET = 120


class NcclTestsError(DetailedError):
    """Text that holds no nccl-tests table, or data a helper cannot use.

    ``value`` is the offending input (a short snippet of it for text) and
    ``expected`` says what would have been accepted.
    """


def _snippet(value):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def collective_name(test):
    """``all_reduce_perf_mpi`` -> ``all_reduce``; ``all_reduce`` stays; None stays None."""
    if test is None:
        return None
    match = _COLLECTIVE_RE.match(str(test))
    return match.group(1) if match else str(test)


def parse_size(value, what="size"):
    """Bytes as an int from an int or a string: ``1073741824``, ``"1073741824"``, ``"1G"``, ``"512M"``, ``"64KiB"``.

    Suffixes are powers of 1024, as nccl-tests reads ``-b``/``-e``.
    """
    if isinstance(value, bool):
        raise NcclTestsError("%s %r is not a size" % (what, value), value=value, expected="a size in bytes such as 1073741824 or 1G")
    if isinstance(value, int):
        if value < 0:
            raise NcclTestsError("%s %r is negative" % (what, value), value=value, expected="a size in bytes >= 0")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise NcclTestsError("%s %r is not a size" % (what, value), value=value, expected="a size in bytes such as 1073741824, or 1G / 512M / 64K")
    number = float(match.group(1))
    scaled = number * (1024 ** " KMGT".index(match.group(2).upper() or " "))
    if not scaled.is_integer():
        raise NcclTestsError("%s %r is not a whole number of bytes" % (what, value), value=value, expected="a whole number of bytes")
    return int(scaled)


def _number(value, what, expected="a number of GB/s >= 0"):
    if isinstance(value, bool):
        raise NcclTestsError("%s %r is not a number" % (what, value), value=value, expected=expected)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise NcclTestsError("%s %r is not a number" % (what, value), value=value, expected=expected) from None
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise NcclTestsError("%s %r is not a finite number >= 0" % (what, value), value=value, expected=expected)
    return number


# ---------------------------------------------------------------- lines


def _strip_prefixes(line):
    """(stream key or None, the line without launcher prefixes and without the tags repeated inside it)."""
    tags = []
    rest = line
    for dummy in range(4):
        for prefix_re in _PREFIX_RES:
            match = prefix_re.match(rest)
            if match and match.end() > 0:
                tags.append(match.group(0).strip())
                rest = rest[match.end():]
                break
        else:
            break
    for tag in tags:
        if _OMPI_TAG_RE.fullmatch(tag):
            rest = _OMPI_TAG_RE.sub("", rest)
        elif _HYDRA_TAG_RE.match(tag):
            rest = rest.replace(tag, "")
    return (" ".join(tags) or None), rest


def _find_command(text):
    """The ``..._perf`` program named on a command line (``./build/all_gather_perf -b 8``), or None."""
    found = None
    for match in _COMMAND_RE.finditer(text):
        found = match.group(1)
    return found


def _parse_params(content):
    params = {}
    for match in _PARAM_ITEM_RE.finditer(content):
        name = match.group(1).strip()
        key = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).replace(" ", "_").lower()
        key = {"n_thread": "nthread", "n_gpus": "ngpus"}.get(key, key)
        params[key] = int(match.group(2))
        if match.group(3):
            params[key + "_kind"] = match.group(3)
    return params


def _parse_version(match):
    info = {"program": match.group(1), "version": match.group(2)}
    for key, value in re.findall(r"([\w-]+)=(\S+)", match.group(3)):
        key = key.replace("-", "_")
        info[key] = int(value) if _INT_RE.match(value) else value
    build = re.search(r"\(([^)]*)\)", match.group(3))
    if build:
        info["build"] = build.group(1)
    return info


def _parse_header(tokens, line_no):
    """Column header tokens -> table layout: key columns, then one or two halves of measurements."""
    keys, groups, trailing = [], [], []
    for token in tokens:
        if token in _MEASURE_COLUMNS:
            key, kind = _MEASURE_COLUMNS[token]
            if trailing:
                raise NcclTestsError(
                    "column header on line %d has a measurement column after %s" % (line_no, trailing[-1][0]),
                    value=" ".join(tokens), expected="size count ... time algbw busbw #wrong [time algbw busbw #wrong] [timestamp]",
                )
            if not groups or any(col[0] == key for col in groups[-1]):
                groups.append([])
            groups[-1].append((key, kind))
        else:
            key, kind = _KEY_COLUMNS.get(token, (token, "str"))
            (trailing if groups else keys).append((key, kind))
    if len(groups) > 2 or not any(col[0] == "busbw_gbps" for group in groups for col in group):
        raise NcclTestsError(
            "column header on line %d is not an nccl-tests layout" % line_no,
            value=" ".join(tokens), expected="one out-of-place and at most one in-place group of time/algbw/busbw/#wrong columns",
        )
    width = sum(2 if kind == "timestamp" else 1 for key, kind in keys + trailing) + sum(len(group) for group in groups)
    return {"keys": keys, "groups": groups, "trailing": trailing, "width": width}


def _is_header(tokens):
    return bool(tokens) and "busbw" in tokens and ("size" in tokens or "bytes" in tokens)


def _convert(kind, token):
    """One cell -> value; ValueError when it is not what the column holds."""
    if kind == "int":
        if not _INT_RE.match(token):
            raise ValueError("not an integer")
        return int(token)
    if kind == "str":
        return token
    if token == "N/A":
        if kind in ("wrong", "error"):
            return None
        raise ValueError("N/A in a numeric column")
    number = float(token)
    if kind == "wrong":
        if number < 0 or not number.is_integer():
            raise ValueError("not a count")
        return int(number)
    return number


def _take_keys(columns, tokens, pos, row):
    for key, kind in columns:
        if kind == "timestamp":
            if pos + 1 >= len(tokens) or not (_DATE_RE.match(tokens[pos]) and _TIME_RE.match(tokens[pos + 1])):
                raise ValueError("%s %r is not a date and time" % (key, " ".join(tokens[pos:pos + 2])))
            row[key] = tokens[pos] + " " + tokens[pos + 1]
            pos += 2
            continue
        try:
            row[key] = _convert(kind, tokens[pos])
        except ValueError as exc:
            raise ValueError("%s %r: %s" % (key, tokens[pos], exc)) from None
        pos += 1
    return pos


def _parse_row(layout, tokens, line_no):
    """A table row -> dict; ValueError with the reason when it does not fit the header."""
    if len(tokens) != layout["width"]:
        names = [key for key, kind in layout["keys"]] + [key for group in layout["groups"] for key, kind in group]
        names += [key for key, kind in layout["trailing"]]
        raise ValueError("%s: %d fields where the header has %d (%s)" % (
            "truncated" if len(tokens) < layout["width"] else "too many fields", len(tokens), layout["width"], " ".join(names)))
    row = {"line": line_no}
    pos = _take_keys(layout["keys"], tokens, 0, row)
    for index, group in enumerate(layout["groups"]):
        values = {}
        for key, kind in group:
            try:
                values[key] = _convert(kind, tokens[pos])
            except ValueError as exc:
                raise ValueError("%s %s %r: %s" % (PLACEMENTS[index], key, tokens[pos], exc)) from None
            pos += 1
        row[PLACEMENTS[index]] = values
    for placement in PLACEMENTS[len(layout["groups"]):]:
        row[placement] = None
    _take_keys(layout["trailing"], tokens, pos, row)
    return row


# ---------------------------------------------------------------- runs


def _new_run(stream, line_no, command):
    return {
        "index": None,
        "line": line_no,
        "end_line": line_no,
        "stream": stream,
        "test": command,
        "test_source": "command" if command else None,
        "collective": None,
        "version": None,
        "nccl_version": None,
        "params": {},
        "params_line": None,
        "devices": [],
        "nranks": None,
        "columns": [],
        "time_kind": None,
        "has_in_place": None,
        "rows": [],
        "skipped": [],
        "out_of_bounds": None,
        "avg_busbw_gbps": None,
        "avg_busbw_check": None,
        "gpu_memory": None,
        "notes": [],
        "complete": False,
        "_stage": 0,
        "_layout": None,
    }


class _Parser(object):
    def __init__(self):
        self.runs = []
        self.current = {}  # stream -> run
        self.pending_command = None

    def run_for(self, stream, line_no, stage, new_if_at_least):
        """The stream's run for a line of ``stage``; a new run when the current one is already that far."""
        run = self.current.get(stream)
        if run is None or run["_stage"] >= new_if_at_least:
            run = _new_run(stream, line_no, self.pending_command)
            self.pending_command = None
            self.runs.append(run)
            self.current[stream] = run
        run["_stage"] = max(run["_stage"], stage)
        run["end_line"] = line_no
        return run

    def name_run(self, run, test, source):
        if run["test_source"] in (None, "command") or source == "banner":
            run["test"] = test
            run["test_source"] = source

    def feed(self, line_no, raw):
        stream, body = _strip_prefixes(raw.rstrip("\r\n"))
        text = body.strip()
        hashed = text.startswith("#")
        content = text.lstrip("#").strip() if hashed else text
        tokens = content.split()
        run = self.current.get(stream)
        if not tokens:
            return
        if self._banner(stream, line_no, content):
            return
        if _is_header(tokens):
            self._header(stream, line_no, tokens)
            return
        if run is not None and self._footer(run, line_no, content):
            return
        if run is not None and run["_stage"] in (_STAGE_HEADER, _STAGE_ROWS) and not hashed:
            if self._row(run, line_no, tokens, text):
                return
        if run is not None and _STAGE_PARAMS <= run["_stage"] <= _STAGE_HEADER and hashed and not content.startswith("("):
            if content not in ("Using devices",) and "out-of-place" not in content:
                run["notes"].append(content)
                match = _REDUCING_RE.match(content)
                if match:
                    run["params"]["max_bytes_effective"] = int(match.group(1))
            return
        match = _NCCL_VERSION_RE.match(content)
        if match and run is not None and run["_stage"] < _STAGE_FOOTER:
            run["nccl_version"] = match.group(1)
            return
        if not hashed:
            command = _find_command(content)
            if command:
                self.pending_command = command

    def _banner(self, stream, line_no, content):
        match = _VERSION_RE.match(content)
        if match:
            run = self.run_for(stream, line_no, _STAGE_VERSION, _STAGE_VERSION)
            run["version"] = _parse_version(match)
            return True
        match = _STARTING_RE.match(content)
        if match:
            run = self.run_for(stream, line_no, _STAGE_STARTING, _STAGE_STARTING)
            self.name_run(run, match.group(1), "banner")
            return True
        if _PARAMS_RE.match(content):
            run = self.run_for(stream, line_no, _STAGE_PARAMS, _STAGE_PARAMS)
            run["params"] = _parse_params(content)
            run["params_line"] = content
            return True
        match = _DEVICE_RE.match(content)
        if match:
            run = self.run_for(stream, line_no, _STAGE_DEVICES, _STAGE_HEADER)
            rank, group, pid, host, device, bus_id, name = match.groups()
            run["devices"].append({
                "rank": int(rank),
                "group": None if group is None else int(group),
                "pid": None if pid is None else int(pid),
                "host": host,
                "device": int(device),
                "bus_id": bus_id,
                "name": name,
            })
            return True
        match = _CONCLUDED_RE.match(content)
        if match:
            run = self.current.get(stream)
            if run is not None and run["_stage"] < _STAGE_DONE:
                self.name_run(run, match.group(1), "banner")
                run["_stage"] = _STAGE_DONE
                run["end_line"] = line_no
            return True
        return False

    def _header(self, stream, line_no, tokens):
        run = self.current.get(stream)
        if run is not None and run["_stage"] == _STAGE_HEADER and run["columns"] == tokens:
            return  # the same header printed twice (two processes each printing the whole run)
        run = self.run_for(stream, line_no, _STAGE_HEADER, _STAGE_ROWS)
        run["_layout"] = _parse_header(tokens, line_no)
        run["columns"] = tokens
        run["time_kind"] = "cputime" if "cputime" in tokens else ("time" if "time" in tokens else None)
        run["has_in_place"] = len(run["_layout"]["groups"]) == 2

    def _footer(self, run, line_no, content):
        match = _OOB_RE.match(content)
        if match:
            run["out_of_bounds"] = {"count": int(match.group(1)), "ok": match.group(2) != "FAILED" and int(match.group(1)) == 0}
        else:
            match = _AVG_RE.match(content)
            if match:
                try:
                    run["avg_busbw_gbps"] = float(match.group(1))
                except ValueError:
                    run["notes"].append(content)
                run["avg_busbw_check"] = match.group(2)
            else:
                match = _MEMORY_RE.match(content)
                if not match:
                    return False
                run["gpu_memory"] = match.group(1)
        if run["_stage"] < _STAGE_DONE:
            run["_stage"] = max(run["_stage"], _STAGE_FOOTER)
            run["complete"] = True
        run["end_line"] = line_no
        return True

    def _row(self, run, line_no, tokens, text):
        layout = run["_layout"]
        first_is_key = layout["keys"] and layout["keys"][0][1] == "timestamp"
        looks_like_row = (len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit()) or (
            first_is_key and _DATE_RE.match(tokens[0]) is not None)
        if not looks_like_row:
            return False
        try:
            row = _parse_row(layout, tokens, line_no)
        except ValueError as exc:
            run["skipped"].append({"line": line_no, "text": text, "reason": str(exc)})
        else:
            run["rows"].append(row)
            run["_stage"] = _STAGE_ROWS
        run["end_line"] = line_no
        return True

    def result(self, line_count):
        runs = []
        for run in sorted(self.runs, key=lambda item: item["line"]):
            run.pop("_stage")
            run.pop("_layout")
            run["index"] = len(runs)
            run["collective"] = collective_name(run["test"])
            run["nranks"] = len(run["devices"]) or None
            runs.append(run)
        skipped = [dict(entry, run=run["index"]) for run in runs for entry in run["skipped"]]
        return {"runs": runs, "skipped": skipped, "line_count": line_count}


def parse_nccl_tests(text):
    """Every nccl-tests run found in ``text`` (str or bytes), in the order they start.

    Returns ``{"runs": [...], "skipped": [...], "line_count": n}``. A run has
    ``test`` (``all_reduce_perf``, from the banner or the command line before
    it, or None), ``collective`` (``all_reduce``), ``version``, ``params``
    (``nthread ngpus min_bytes max_bytes step step_kind warmup_iters iters
    agg_iters validation graph``, as printed), ``devices`` (``rank group pid
    host device bus_id name``), ``nranks``, ``columns`` (the header words),
    ``rows``, ``skipped``, ``out_of_bounds`` (``{"count", "ok"}``),
    ``avg_busbw_gbps``, ``notes``, ``line``/``end_line`` (1-based) and
    ``complete`` (its footer was seen). A row has ``line``, ``size``,
    ``count``, ``type``, ``redop``, ``root`` (those the header has) and
    ``out_of_place``/``in_place``: ``{"time_us" or "cputime_us", "algbw_gbps",
    "busbw_gbps", "wrong" or "error"}`` (``None`` for the in-place half of a
    one-half table). Raises ``NcclTestsError`` when the text holds no table.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise NcclTestsError("nccl-tests output must be text, got %s" % type(text).__name__, value=_snippet(text),
                             expected="the text an nccl-tests binary printed")
    lines = text.splitlines()
    parser = _Parser()
    for line_no, line in enumerate(lines, 1):
        parser.feed(line_no, line)
    result = parser.result(len(lines))
    if not any(run["columns"] for run in result["runs"]):
        raise NcclTestsError(
            "no nccl-tests result table in the text (%d lines)" % len(lines),
            value=_snippet(text.strip()),
            expected="nccl-tests output with a column header line such as "
            "'#       size         count      type   redop    root     time   algbw   busbw #wrong ...'",
        )
    return result


# ---------------------------------------------------------------- compare


def _as_runs(data, what="data"):
    """Runs from parse output, one run, a list of either, or the raw text."""
    if isinstance(data, (str, bytes)):
        return parse_nccl_tests(data)["runs"]
    if isinstance(data, dict):
        if isinstance(data.get("runs"), list):
            return list(data["runs"])
        if isinstance(data.get("rows"), list):
            return [data]
    if isinstance(data, (list, tuple)):
        runs = []
        for item in data:
            runs.extend(_as_runs(item, what))
        return runs
    raise NcclTestsError(
        "%s is not nccl-tests output: got %s" % (what, type(data).__name__), value=_snippet(data),
        expected="the text, the result of parse_nccl_tests, one of its runs, or a list of those",
    )


def _select_runs(runs, test, what):
    with_rows = [run for run in runs if run.get("rows")]
    if test is not None:
        wanted = collective_name(test)
        chosen = [run for run in with_rows if run.get("collective") == wanted or run.get("test") == test]
        if not chosen:
            found = sorted(set(str(run.get("collective")) for run in with_rows))
            raise NcclTestsError("%s has no %s run with rows (runs: %s)" % (what, test, ", ".join(found) or "none"),
                                 value=test, expected="one of: %s" % (", ".join(found) or "a run with rows"))
        return chosen
    if not with_rows:
        raise NcclTestsError("%s has no run with rows" % what, value=len(runs), expected="at least one nccl-tests table with rows")
    names = sorted(set(str(run.get("collective")) for run in with_rows))
    if len(names) > 1:
        raise NcclTestsError("%s has runs of several tests (%s): name one with test=" % (what, ", ".join(names)),
                             value=names, expected="test= one of %s" % ", ".join(names))
    return with_rows


def _aggregate(values, how):
    values = sorted(values)
    if how == "min":
        return values[0]
    if how == "max":
        return values[-1]
    if how == "mean":
        return sum(values) / len(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2.0


def _check_choice(value, choices, what):
    if value not in choices:
        raise NcclTestsError("%s %r is not one of %s" % (what, value, ", ".join(choices)), value=value, expected="one of %s" % ", ".join(choices))


def busbw_by_size(data, placement="out_of_place", test=None, datatype=None, redop=None, aggregate="min", what="data"):
    """``{size: {"busbw_gbps", "samples_gbps", "type", "redop", "runs"}}`` over the rows of the chosen runs.

    Rows of the same size from several runs (repeats) or cycles are
    aggregated (``min`` ``max`` ``mean`` ``median``); rows of one size with
    different data types or reduction ops need ``datatype``/``redop``.
    """
    _check_choice(placement, PLACEMENTS, "placement")
    _check_choice(aggregate, AGGREGATES, "aggregate")
    runs = _select_runs(_as_runs(data, what), test, what)
    by_size = {}
    for run in runs:
        for row in run["rows"]:
            if datatype is not None and row.get("type") != datatype:
                continue
            if redop is not None and row.get("redop") != redop:
                continue
            entry = by_size.setdefault(row["size"], {"rows": [], "runs": []})
            entry["rows"].append(row)
            if run["index"] not in entry["runs"]:
                entry["runs"].append(run["index"])
    result = {}
    for size in sorted(by_size):
        rows = by_size[size]["rows"]
        kinds = sorted(set((str(row.get("type")), str(row.get("redop"))) for row in rows))
        if len(kinds) > 1:
            raise NcclTestsError(
                "%s has rows of size %d with several data types / reduction ops (%s): choose with datatype= and redop=" % (
                    what, size, ", ".join("/".join(kind) for kind in kinds)),
                value=size, expected="datatype= and redop= naming one of %s" % ", ".join("/".join(kind) for kind in kinds),
            )
        halves = [row.get(placement) for row in rows]
        if any(half is None for half in halves):
            raise NcclTestsError("%s has no %s measurement at size %d (the table has only out-of-place columns)" % (what, placement, size),
                                 value=placement, expected="out_of_place")
        samples = [half["busbw_gbps"] for half in halves]
        result[size] = {
            "busbw_gbps": _aggregate(samples, aggregate),
            "samples_gbps": samples,
            "type": rows[0].get("type"),
            "redop": rows[0].get("redop"),
            "runs": by_size[size]["runs"],
        }
    return result


def _thresholds(thresholds):
    if not isinstance(thresholds, dict) or not thresholds:
        raise NcclTestsError("thresholds must be a non-empty mapping of size to minimum busbw, got %s" % _snippet(thresholds),
                             value=_snippet(thresholds), expected="{size_bytes: min_busbw_gbps}, e.g. {1073741824: 180}")
    parsed = {}
    for key, value in thresholds.items():
        size = parse_size(key, "threshold size")
        parsed[size] = _number(value, "minimum busbw for size %s" % key)
    return parsed


def compare_busbw(data, thresholds, placement="out_of_place", test=None, datatype=None, redop=None, aggregate="min"):
    """Pass/fail per size of ``thresholds`` (``{size_bytes: min_busbw_gbps}``) against the measured busbw.

    ``data`` is the text, ``parse_nccl_tests`` output, one run or a list of
    runs; ``test`` picks the runs of one collective when the log has several.
    Several samples of a size (repeats) are reduced with ``aggregate`` (the
    worst, ``min``, by default). A size the runs have no row of raises
    ``NcclTestsError`` naming it.
    """
    wanted = _thresholds(thresholds)
    measured = busbw_by_size(data, placement, test, datatype, redop, aggregate)
    results = []
    for size in sorted(wanted):
        if size not in measured:
            raise NcclTestsError(
                "no row of size %d bytes in the nccl-tests runs (sizes measured: %s)" % (size, ", ".join(str(s) for s in sorted(measured))),
                value=size, expected="one of the measured sizes: %s" % ", ".join(str(s) for s in sorted(measured)),
            )
        got = measured[size]
        results.append({
            "size": size,
            "min_busbw_gbps": wanted[size],
            "busbw_gbps": got["busbw_gbps"],
            "samples_gbps": got["samples_gbps"],
            "type": got["type"],
            "redop": got["redop"],
            "passed": got["busbw_gbps"] >= wanted[size],
        })
    failed = [entry["size"] for entry in results if not entry["passed"]]
    runs = sorted(set(index for size in wanted for index in measured[size]["runs"]))
    return {
        "passed": not failed,
        "placement": placement,
        "aggregate": aggregate,
        "test": collective_name(test),
        "runs": runs,
        "results": results,
        "failed_sizes": failed,
        "summary": "%d of %d sizes meet their minimum busbw (%s)" % (len(results) - len(failed), len(results), placement.replace("_", "-")),
    }


# ---------------------------------------------------------------- sweep


def _labelled(labelled):
    if isinstance(labelled, dict):
        items = list(labelled.items())
    elif isinstance(labelled, (list, tuple)) and all(isinstance(item, (list, tuple)) and len(item) == 2 for item in labelled):
        items = [tuple(item) for item in labelled]
    else:
        raise NcclTestsError("labelled runs must be a mapping of label to nccl-tests output, got %s" % type(labelled).__name__,
                             value=_snippet(labelled), expected="{label: text, parse result, run or list of runs}")
    if not items:
        raise NcclTestsError("labelled runs are empty", value=labelled, expected="at least the baseline label")
    labels = [str(label) for label, dummy in items]
    if len(set(labels)) != len(labels):
        raise NcclTestsError("labels repeat: %s" % ", ".join(labels), value=labels, expected="distinct labels")
    return [(str(label), data) for label, data in items]


def _pct(value, base):
    if base == 0:
        return None
    return (value - base) / base * 100.0


def _fmt_pct(value):
    return "n/a" if value is None else "%+.1f%%" % value


def _named_sizes(measured, labels, baseline, sizes):
    """The sizes a recommendation is judged at: ``sizes`` parsed, else the sizes every label measured; each must be
    one the baseline measured."""
    if sizes is None:
        common = set(measured[labels[0]])
        for label in labels[1:]:
            common &= set(measured[label])
        if not common:
            raise NcclTestsError("the labels have no message size in common", value=labels, expected="runs that measured the same sizes")
        named = sorted(common)
    else:
        if isinstance(sizes, (str, int)):
            sizes = [sizes]
        named = sorted(set(parse_size(size) for size in sizes))
        if not named:
            raise NcclTestsError("sizes is empty", value=sizes, expected="at least one message size")
    for size in named:
        if size not in measured[baseline]:
            raise NcclTestsError(
                "baseline %r has no row of size %d bytes (sizes measured: %s)" % (
                    baseline, size, ", ".join(str(s) for s in sorted(measured[baseline]))),
                value=size, expected="one of the baseline's sizes: %s" % ", ".join(str(s) for s in sorted(measured[baseline])),
            )
    return named


def _candidate(mine, base_rows, named, margin):
    """Whether a label (its rows ``mine`` by size) beats the baseline's (``base_rows``) by ``margin`` percent at every
    named size, its smallest gain and where, and why."""
    worst, why, ok = None, None, True
    for size in named:
        got = mine.get(size)
        if got is None:
            ok, why = False, "no row of size %d" % size
            worst = (size, None)
            break
        base = base_rows[size]["busbw_gbps"]
        gain = _pct(got["busbw_gbps"], base)
        beats = got["busbw_gbps"] > 0 if gain is None else gain >= margin
        if worst is None or (gain is not None and (worst[1] is None or gain < worst[1])):
            worst = (size, gain)
        if not beats and ok:
            ok, why = False, "%s at %d B (needs %+.1f%%)" % (_fmt_pct(gain), size, margin)
    if ok:
        why = "at least %+.1f%% at every named size (smallest %s at %d B)" % (margin, _fmt_pct(worst[1]), worst[0])
    return {
        "qualifies": ok,
        "min_gain_pct": None if worst is None else worst[1],
        "worst_size": None if worst is None else worst[0],
        "why": why,
    }


def sweep_compare(labelled, baseline, sizes=None, margin_pct=5.0, placement="out_of_place", test=None, datatype=None, redop=None,
                  aggregate="median"):
    """Side by side busbw per size for several labelled runs, and a recommendation.

    ``labelled`` maps a label (``"qps_1"``, ``4``...) to that setting's runs
    (text, parse result, run or list of runs; repeats are reduced with
    ``aggregate``, the median by default). A label is recommended only when
    its busbw beats the ``baseline`` label's by at least ``margin_pct`` percent
    at every size of ``sizes`` (default: the sizes every label measured);
    among several such labels the one with the largest smallest gain wins.
    Otherwise the baseline is recommended and ``reason`` says why each label
    fell short.
    """
    items = _labelled(labelled)
    baseline = str(baseline)
    labels = [label for label, dummy in items]
    if baseline not in labels:
        raise NcclTestsError("baseline %r is not one of the labels (%s)" % (baseline, ", ".join(labels)), value=baseline,
                             expected="one of %s" % ", ".join(labels))
    margin = _number(margin_pct, "margin_pct", "a percentage >= 0, e.g. 5")
    measured = {}
    for label, data in items:
        measured[label] = busbw_by_size(data, placement, test, datatype, redop, aggregate, what="label %r" % label)
    named = _named_sizes(measured, labels, baseline, sizes)
    all_sizes = sorted(set(size for label in labels for size in measured[label]))
    table = []
    for size in all_sizes:
        base = measured[baseline].get(size)
        row = {"size": size, "named": size in named, "busbw_gbps": {}, "gain_pct": {}}
        for label in labels:
            got = measured[label].get(size)
            row["busbw_gbps"][label] = None if got is None else got["busbw_gbps"]
            row["gain_pct"][label] = None if got is None or base is None else _pct(got["busbw_gbps"], base["busbw_gbps"])
        table.append(row)
    candidates = {}
    for label in labels:
        if label == baseline:
            continue
        candidates[label] = _candidate(measured[label], measured[baseline], named, margin)
    winners = [label for label in labels if candidates.get(label, {}).get("qualifies")]
    if winners:
        best = max(winners, key=lambda label: (float("inf") if candidates[label]["min_gain_pct"] is None else candidates[label]["min_gain_pct"],
                                               -labels.index(label)))
        recommended = best
        reason = "%s beats baseline %s by at least %.1f%% at every named size (smallest gain %s at %d B)" % (
            best, baseline, margin, _fmt_pct(candidates[best]["min_gain_pct"]), candidates[best]["worst_size"])
    else:
        recommended = baseline
        if candidates:
            reason = "keep baseline %s: no label beats it by %+.1f%% at every named size (%s)" % (
                baseline, margin, "; ".join("%s: %s" % (label, candidates[label]["why"]) for label in labels if label in candidates))
        else:
            reason = "keep baseline %s: it is the only label" % baseline
    return {
        "recommended": recommended,
        "baseline": baseline,
        "changed": recommended != baseline,
        "reason": reason,
        "margin_pct": margin,
        "placement": placement,
        "aggregate": aggregate,
        "labels": labels,
        "sizes": named,
        "table": table,
        "candidates": candidates,
    }


def sweep_markdown(report):
    """The Markdown page of a sweep: :func:`sweep_compare`'s result with the playbook's ``variable``, ``host``,
    ``mode`` and ``test`` added. busbw in GB/s per size and label, the gain over the baseline in brackets, the sizes
    the recommendation is judged at marked ``*``, then the recommendation and its reason."""
    need = ("variable", "host", "mode", "labels", "baseline", "placement", "aggregate", "margin_pct", "table",
            "recommended", "changed", "reason")
    missing = [key for key in need if not isinstance(report, dict) or key not in report]
    if missing:
        raise NcclTestsError("sweep report lacks %s: expected nccl_tests_sweep's result with variable, host and mode "
                             "added" % ", ".join(missing), value=sorted(report) if isinstance(report, dict) else report,
                             expected="a sweep report with %s" % ", ".join(need))
    labels, baseline = list(report["labels"]), report["baseline"]
    lines = [
        "# %s sweep on %s" % (report["variable"], report["host"]),
        "",
        "%s, %s busbw in GB/s per value of %s (%s of the repeats; gain over baseline %s in brackets), %s runs. "
        "Sizes marked * are those the recommendation is judged at (margin %s %%)." % (
            report.get("test") or "nccl-tests", str(report["placement"]).replace("_", "-"), report["variable"],
            report["aggregate"], baseline, report["mode"], report["margin_pct"]),
        "",
        "| size (bytes) |%s" % "".join(" %s |" % label for label in labels),
        "|---:|" + "---:|" * len(labels),
    ]
    for row in report["table"]:
        cells = []
        for label in labels:
            busbw, gain = row["busbw_gbps"][label], row["gain_pct"][label]
            cells.append(" %s%s |" % ("-" if busbw is None else busbw,
                                      "" if gain is None or label == baseline else " (%+.1f%%)" % gain))
        lines.append("| %s%s |%s" % (row["size"], " *" if row["named"] else "", "".join(cells)))
    lines += [
        "",
        "**Recommendation:** `%s=%s` (%s)." % (report["variable"], report["recommended"],
                                               "change from %s" % baseline if report["changed"] else "keep the baseline"),
        "",
        str(report["reason"]),
    ]
    return "\n".join(lines) + "\n"
