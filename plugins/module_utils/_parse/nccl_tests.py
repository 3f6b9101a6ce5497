# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...) parsed into runs (pure).

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. The gate and the sweep that judge the parsed busbw are
``_gpu.nccl_busbw``.

* ``parse_nccl_tests(text)`` turns a log into runs: each run's banner
  (``# nccl-tests version``, ``# Collective test starting:``), its parameter
  line (``# nThread 1 nGpus 8 minBytes ...``), its device lines
  (``#  Rank  0 Group  0 Pid ... on host device  0 [0x07] NVIDIA H100``), the
  rows of its table and its footer (``# Out of bounds values : 0 OK``,
  ``# Avg bus bandwidth    : 38.5``).

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

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

PLACEMENTS = ("out_of_place", "in_place")

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


def snippet(value):
    """``value`` as text short enough to quote in an error."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def collective_name(test):
    """``all_reduce_perf_mpi`` -> ``all_reduce``; ``all_reduce`` stays; None stays None."""
    if test is None:
        return None
    match = _COLLECTIVE_RE.match(str(test))
    return match.group(1) if match else str(test)


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
        raise NcclTestsError("nccl-tests output must be text, got %s" % type(text).__name__, value=snippet(text),
                             expected="the text an nccl-tests binary printed")
    lines = text.splitlines()
    parser = _Parser()
    for line_no, line in enumerate(lines, 1):
        parser.feed(line_no, line)
    result = parser.result(len(lines))
    if not any(run["columns"] for run in result["runs"]):
        raise NcclTestsError(
            "no nccl-tests result table in the text (%d lines)" % len(lines),
            value=snippet(text.strip()),
            expected="nccl-tests output with a column header line such as "
            "'#       size         count      type   redop    root     time   algbw   busbw #wrong ...'",
        )
    return result
