# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``nvidia-smi topo -m``: parse the GPU/NIC matrix (pure).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``parse_topo_matrix`` turns the text into per-GPU and per-NIC links
and affinities; ``gpu_local_cpus`` and ``nic_paths`` read the result.

The layouts this accepts, all seen in published captures:

* Header ``GPU0 GPU1 ... NIC0 ... CPU Affinity NUMA Affinity GPU NUMA ID``.
  ``GPU NUMA ID`` only on newer drivers (and their rows carry an extra empty
  cell before it); older drivers name the RDMA devices (``mlx5_0``) as
  columns and print no ``NIC Legend:``; newer ones print ``NICn`` columns
  and map them in ``NIC Legend:`` (``NIC0: mlx5_0``).
* Cells separated by tabs (nvidia-smi's own output), by doubled tabs or by
  spaces (copies through a terminal or a web page), so rows are split on
  white space: no link code, CPU list or NUMA id contains a space.
* A terminal's underline escape around the header (``ESC[4m ... ESC[0m``),
  with or without the ESC byte, is removed.
* Copy damage that glues two link codes together (``PIXNODE``) is split back
  into its codes; every row is then checked to have ``X`` on its own column,
  so a row that still does not line up raises ``TopoError``.

Link codes, from the legend: ``X`` self, ``NV#`` a bonded set of # NVLinks,
``PIX`` at most one PCIe bridge, ``PXB`` several PCIe bridges without the host
bridge, ``PHB`` through a PCIe host bridge, ``NODE`` between host bridges in a
NUMA node, ``SYS`` across the SMP interconnect between NUMA nodes (older
drivers: ``SOC`` for the socket link, ``PSB`` for a single PCIe switch).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError

_ANSI_RE = re.compile(r"(?:\x1b)?\[[0-9;]*m")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_CODE_RE = re.compile(r"^(?:X|SYS|SOC|NODE|PHB|PXB|PSB|PIX|NV\d+)$")
_CODES_RE = re.compile(r"X|SYS|SOC|NODE|PHB|PXB|PSB|PIX|NV\d+")
_TRAILING_RE = re.compile(r"CPU\s*Affinity|NUMA\s*Affinity|GPU\s*NUMA\s*ID")
_TRAILING_NAMES = {"cpuaffinity": "CPU Affinity", "numaaffinity": "NUMA Affinity", "gpunumaid": "GPU NUMA ID"}
_LEGEND_RE = re.compile(r"^\s*(\S+)\s+=\s+(.+?)\s*$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_NA = ("N/A", "")

# Path classes from closest to farthest, as NCCL ranks them (PATH_PIX ... PATH_SYS).
PATH_ORDER = ("NV", "PIX", "PSB", "PXB", "PHB", "NODE", "SOC", "SYS")


class TopoError(DetailedError):
    """Text that is not an ``nvidia-smi topo -m`` matrix, or one that does not line up.

    ``value`` is the offending input (or line of it) and ``expected`` says
    what would have been accepted.
    """


def _is_header(tokens):
    if not tokens or not _GPU_RE.match(tokens[0]):
        return False
    return not any(_CODE_RE.match(t) or _CODES_RE.fullmatch(t) for t in tokens)


def _parse_header(tokens, line):
    devices = []
    rest = []
    for index, token in enumerate(tokens):
        if token.startswith(("CPU", "NUMA")) or (token == "GPU" and index + 1 < len(tokens) and tokens[index + 1].startswith("NUMA")):
            rest = tokens[index:]
            break
        devices.append(token)
    trailing = [_TRAILING_NAMES[re.sub(r"\s+", "", m).lower()] for m in _TRAILING_RE.findall(" ".join(rest))]
    if len(set(devices)) != len(devices):
        raise TopoError("repeated device column in topo header %r" % line, value=line, expected="each GPUn/NIC column once")
    return devices, trailing


def _int_or_none(token, what, label):
    if token in _NA:
        return None
    try:
        return int(token)
    except ValueError:
        raise TopoError("%s of %s is %r, not a number" % (what, label, token), value=token, expected="an integer or N/A") from None


def _row_links(label, tokens, devices, line):
    links = []
    rest = list(tokens)
    while rest and len(links) < len(devices):
        token = rest.pop(0)
        if _CODE_RE.match(token):
            links.append(token)
        elif _CODES_RE.fullmatch(token) is None and "".join(_CODES_RE.findall(token)) == token and token:
            links.extend(_CODES_RE.findall(token))  # copy damage: "PIXNODE" is PIX then NODE
        elif token in _NA:
            links.append(None)
        else:
            raise TopoError(
                "row %s: %r where a link code was expected (cell %d of %d)" % (label, token, len(links) + 1, len(devices)),
                value=line,
                expected="one of X, NV#, PIX, PXB, PHB, NODE, SYS per device column",
            )
    if len(links) != len(devices):
        raise TopoError(
            "row %s has %d link cells for %d device columns" % (label, len(links), len(devices)),
            value=line,
            expected="%d link cells" % len(devices),
        )
    own = devices.index(label)
    if links[own] != "X":
        raise TopoError(
            "row %s has %r, not X, in its own column %s: the cells do not line up with the header" % (label, links[own], label),
            value=line,
            expected="X on the diagonal",
        )
    return dict((dev, link) for dev, link in zip(devices, links) if dev != label), rest


def _read_sections(lines, devices):
    """The lines after the header: the matrix rows (``{device: (links, rest, line)}``), then the ``Legend:`` and
    ``NIC Legend:`` sections; anything else ends the section it is in (a prompt, the next command)."""
    rows, legend, nic_legend = {}, {}, {}
    legends = {"legend": (_LEGEND_RE, legend), "nic_legend": (_NIC_LEGEND_RE, nic_legend)}
    section = "matrix"
    for line in lines:
        stripped = line.strip()
        if stripped == "Legend:":
            section = "legend"
            continue
        if stripped == "NIC Legend:":
            section = "nic_legend"
            continue
        if not stripped:
            continue
        if section == "matrix":
            tokens = stripped.split()
            if tokens[0] in devices:
                if tokens[0] in rows:
                    raise TopoError("row %s appears twice" % tokens[0], value=line, expected="one row per device")
                rows[tokens[0]] = _row_links(tokens[0], tokens[1:], devices, line) + (line,)
            else:
                section = "after"  # the matrix ended (prompt, next command)
        elif section in legends:
            pattern, entries = legends[section]
            match = pattern.match(line)
            if match:
                entries[match.group(1)] = match.group(2)
            else:
                section = "after"
    return rows, legend, nic_legend


def _gpu_row(name, row, trailing, notes):
    """One GPU's entry from its row ``(links, rest, line)``: the links and the values after them (CPU and NUMA
    affinity, GPU NUMA ID). A value that cannot be read is None, kept under ``unreadable`` and said in ``notes``."""
    links, rest, line = row
    if len(rest) > len(trailing):
        raise TopoError(
            "row %s has %d cells after its links for the %d columns %s" % (name, len(rest), len(trailing), ", ".join(trailing) or "(none)"),
            value=line,
            expected="one value per column after the links",
        )
    values = dict(zip(trailing, rest))
    unreadable = {}
    cpus = values.get("CPU Affinity")
    cpu_affinity = None
    if cpus not in _NA:
        try:
            cpu_affinity = set(parse_cpulist(cpus))
        except CpuListError as exc:
            # A clipped or damaged cell (``0-23,48-``): the links of the row still hold; only this GPU's
            # affinity is unknown.
            unreadable["CPU Affinity"] = cpus
            notes.append("CPU Affinity of %s is %r, not a CPU list (%s): its CPU affinity is unknown, its links are "
                         "kept" % (name, cpus, exc))
    numa = {}
    for column in ("NUMA Affinity", "GPU NUMA ID"):
        try:
            numa[column] = _int_or_none(values.get(column, ""), column, name)
        except TopoError as exc:
            numa[column] = None
            unreadable[column] = values[column]
            notes.append("%s: it is unknown, the links of %s are kept" % (exc, name))
    return {
        "name": name,
        "links": links,
        "cpu_affinity": cpu_affinity,
        "numa_affinity": numa["NUMA Affinity"],
        "gpu_numa_id": numa["GPU NUMA ID"],
        "unreadable": unreadable,
    }


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m`` output.

    Returns ``{"devices": [column names], "gpus": {index: {"name", "links":
    {device: code}, "cpu_affinity": set of ints or None, "numa_affinity": int
    or None, "gpu_numa_id": int or None, "unreadable": {column: cell}}},
    "nics": {column: {"name": "mlx5_0", "links": {device: code}}}, "legend":
    {code: meaning}, "nic_legend": {"NIC0": "mlx5_0"}, "notes": [text]}``. A
    NIC's links come from its own row or, where the capture has none, from the
    GPU rows.

    An affinity cell that cannot be read (a clipped ``0-23,48-``, a damaged
    NUMA id) does not lose the matrix: that GPU's value is None (unknown, as
    for ``N/A``), the cell is kept under ``unreadable`` and ``notes`` says so.
    A link cell that cannot be read still raises ``TopoError``: the rows would
    not line up.
    """
    if not isinstance(text, str):
        raise TopoError("topo output must be text, not %s" % type(text).__name__, value=text, expected="the text nvidia-smi topo -m printed")
    lines = _ANSI_RE.sub("", text).splitlines()
    header_at = None
    for number, line in enumerate(lines):
        if _is_header(line.split()):
            header_at = number
            break
    if header_at is None:
        first = text.strip().splitlines()[:1]
        raise TopoError(
            "no nvidia-smi topo matrix found: no header line starting with GPU0 (first line: %r)" % (first[0] if first else ""),
            value=text[:200],
            expected="a header such as 'GPU0 GPU1 NIC0 CPU Affinity NUMA Affinity' and one row per device",
        )
    devices, trailing = _parse_header(lines[header_at].split(), lines[header_at])
    rows, legend, nic_legend = _read_sections(lines[header_at + 1:], devices)
    gpu_columns = [d for d in devices if _GPU_RE.match(d)]
    missing = [d for d in gpu_columns if d not in rows]
    if missing:
        raise TopoError(
            "topo matrix has no row for %s" % ", ".join(missing), value=text[:200], expected="a row for every GPU column of the header"
        )
    notes = []
    gpus = dict((int(_GPU_RE.match(name).group(1)), _gpu_row(name, rows[name], trailing, notes)) for name in gpu_columns)
    nics = {}
    for name in devices:
        if _GPU_RE.match(name):
            continue
        if name in rows:
            links = rows[name][0]
        else:
            links = dict((gpu["name"], gpu["links"][name]) for gpu in gpus.values())
        nics[name] = {"name": nic_legend.get(name, name), "links": links}
    return {"devices": devices, "gpus": gpus, "nics": nics, "legend": legend, "nic_legend": nic_legend, "notes": notes}


def gpu_local_cpus(parsed):
    """``{gpu index: set of CPUs}`` from the CPU Affinity column (None where N/A)."""
    return dict((index, None if gpu["cpu_affinity"] is None else set(gpu["cpu_affinity"])) for index, gpu in sorted(parsed["gpus"].items()))


def path_rank(code):
    """Position of a link code in ``PATH_ORDER`` (closest first); unknown codes rank last."""
    if code is None:
        return len(PATH_ORDER)
    key = "NV" if code.startswith("NV") else code
    return PATH_ORDER.index(key) if key in PATH_ORDER else len(PATH_ORDER)


def nic_paths(parsed):
    """For each GPU, its path class to every NIC and the closest ones.

    Returns ``{gpu index: {"links": {nic name: code}, "best_class": code or
    None, "best_nics": [nic names]}}``; NICs are named as the NIC legend names
    them (``mlx5_0``), or by their column where there is no legend.
    """
    result = {}
    for index, gpu in sorted(parsed["gpus"].items()):
        links = {}
        for column, nic in parsed["nics"].items():
            links[nic["name"]] = gpu["links"].get(column)
        best = min((path_rank(code) for code in links.values()), default=None)
        if best is None or best >= len(PATH_ORDER):
            result[index] = {"links": links, "best_class": None, "best_nics": []}
            continue
        best_nics = sorted((name for name, code in links.items() if path_rank(code) == best), key=_natural)
        result[index] = {"links": links, "best_class": links[best_nics[0]], "best_nics": best_nics}
    return result


def _natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
