# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Grace and VM readiness of the host: architecture, virtualisation, page size, hugepages, THP, SMT, mitigations.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports. Read-only; every path is under ``procfs``/``sysfs`` so a captured or
generated tree answers as the live host would. What needs a command (``getconf
PAGESIZE``, ``uname -m``, ``dmesg``/``journalctl -k``, the kernel config) is
passed in as text by the caller. The IOMMU and SMMUv3/CMDQV checks are
``_gpu.iommu``; ``_gpu.platform_facts`` runs them all and gathers their inputs.

Each reader returns its values and one or more findings
``{"check", "status", "message", "evidence", "fix"}`` with ``status`` one of
:data:`STATUSES`. Facts used:

- hugepages: ``/sys/kernel/mm/hugepages/hugepages-<N>kB/{nr,free,resv,surplus}_hugepages`` and per NUMA node
  ``/sys/devices/system/node/nodeK/hugepages/hugepages-<N>kB/{nr,free,surplus}_hugepages``;
- THP: ``/sys/kernel/mm/transparent_hugepage/{enabled,defrag}``, the choice in ``[brackets]``; ``defrag`` lists
  ``always defer defer+madvise madvise never`` on current kernels, ``always madvise never`` on old ones;
- SMT: ``/sys/devices/system/cpu/smt/{control,active}``; mitigations: ``/sys/devices/system/cpu/vulnerabilities/*``
  whose text starts with ``Not affected``, ``Vulnerable`` or ``Mitigation:`` (``itlb_multihit`` prefixes ``KVM: ``).
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir, read_int, read_text
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import STATUSES, FindingError  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import finding as _finding
from ansible_collections.gpunode.tuning.plugins.module_utils._boot.args import norm, split_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils._host.virt import architecture as cpuinfo_architecture
from ansible_collections.gpunode.tuning.plugins.module_utils._host.virt import detect_virt

MACHINE_ALIASES = {"arm64": "aarch64", "aarch64": "aarch64", "x86_64": "x86_64", "amd64": "x86_64"}
GRACE_PAGE_SIZE = 65536
THP_DEFRAG_CURRENT = ("always", "defer", "defer+madvise", "madvise", "never")
THP_DEFRAG_OLD = ("always", "madvise", "never")
THP_ENABLED = ("always", "madvise", "never")
SMT_CONTROLS = ("on", "off", "forceoff", "notsupported", "notimplemented")
HUGEPAGE_FILES = ("nr_hugepages", "free_hugepages", "resv_hugepages", "surplus_hugepages", "nr_overcommit_hugepages")
NODE_HUGEPAGE_FILES = ("nr_hugepages", "free_hugepages", "surplus_hugepages")

_HUGEPAGES_DIR_RE = re.compile(r"^hugepages-(\d+)kB$")
_NODE_RE = re.compile(r"^node(\d+)$")
_CHOICE_RE = re.compile(r"\[([^\[\]\s]+)\]")


class PlatformError(DetailedError):
    """Bad input for the platform readers (a page size, a machine, kernel text or a sysfs value not of the kernel's
    format); ``details`` names the option or path, the ``value`` and what was ``expected``."""


def finding(check, status, message, evidence=None, fix=None):
    """One finding (``_report.findings.finding``), its evidence a list of lines; a bad status is a PlatformError."""
    try:
        return _finding(check, status, message, evidence=list(evidence or []), fix=fix)
    except FindingError as exc:
        raise PlatformError(str(exc), **exc.details)


def text_arg(option, value):
    """``value`` (a command's output) as given, None as None; not text is a PlatformError naming ``option``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise PlatformError("%s must be text (the command's output), not %s" % (option, type(value).__name__),
                            option=option, value=repr(value), expected="a string")
    return value


# ------------------------------------------------------------- architecture --

def read_architecture(procfs="/proc", machine=None):
    """``{"architecture": "x86_64"|"aarch64"|other|None, "source": "uname"|"cpuinfo"|None, "findings": [...]}``.

    ``machine`` is ``uname -m`` (``arm64`` and ``amd64`` are read as ``aarch64``/``x86_64``); without it the
    architecture is guessed from ``/proc/cpuinfo`` (:func:`_host.virt.architecture`)."""
    machine = text_arg("machine", machine)
    if machine is not None:
        machine = machine.strip()
        if not machine or any(c.isspace() for c in machine):
            raise PlatformError("machine %r is not a uname -m value" % machine, option="machine", value=machine,
                                expected="one word such as x86_64 or aarch64")
        arch, source = MACHINE_ALIASES.get(machine.lower(), machine), "uname"
    else:
        arch = cpuinfo_architecture(procfs)
        source = "cpuinfo" if arch else None
    if arch is None:
        found = finding("architecture", "unknown", "the architecture is not known: no machine given and /proc/cpuinfo "
                        "has neither vendor_id nor CPU implementer", fix="pass machine (uname -m)")
    else:
        found = finding("architecture", "pass", "architecture %s (from %s)" % (arch, source),
                        evidence=["%s: %s" % (source, machine if source == "uname" else arch)])
    return {"architecture": arch, "source": source, "findings": [found]}


def read_virtualisation(sysfs="/sys", procfs="/proc"):
    """:func:`_host.virt.detect_virt` plus an informational finding (a VM is not a failure; the checks below say what it
    changes)."""
    virt = detect_virt(sysfs, procfs)
    message = ("virtual machine (%s)" % virt["type"]) if virt["virtualized"] else "bare metal (no hypervisor detected)"
    return dict(virt, findings=[finding("virtualisation", "pass", message, evidence=virt["evidence"])])


# ---------------------------------------------------------------- page size --

def parse_page_size(value):
    """``getconf PAGESIZE`` output (or an int) as an int; None stays None; anything else raises PlatformError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise PlatformError("page_size %r is not a number of bytes" % value, option="page_size", value=value,
                            expected="a power of two such as 4096 or 65536")
    if isinstance(value, str):
        text = value.strip()
        if not re.match(r"\d+\Z", text):
            raise PlatformError("page_size %r is not a number of bytes" % value, option="page_size", value=value,
                                expected="getconf PAGESIZE output such as 4096 or 65536")
        value = int(text)
    if not isinstance(value, int) or value < 1024 or value & (value - 1):
        raise PlatformError("page_size %r is not a page size" % (value,), option="page_size", value=value,
                            expected="a power of two of at least 1024 such as 4096 or 65536")
    return value


def read_page_size(page_size=None, architecture=None):
    """``{"page_size": int|None, "findings": [...]}``: on aarch64 65536 (the Grace ``-64k`` kernels) passes and a
    smaller page warns; on x86_64 (4 KiB only) it passes; without a value it is unknown."""
    size = parse_page_size(page_size)
    if size is None:
        found = finding("page_size", "unknown", "the page size was not given", fix="pass page_size (getconf PAGESIZE)")
    elif architecture == "aarch64" and size != GRACE_PAGE_SIZE:
        found = finding("page_size", "warn", "aarch64 kernel with %d-byte pages; Grace is tuned for 64 KiB pages" % size,
                        evidence=["getconf PAGESIZE: %d" % size],
                        fix="boot the distribution's 64k-page kernel flavour (for example linux-nvidia-64k or kernel-64k)")
    elif architecture == "aarch64":
        found = finding("page_size", "pass", "aarch64 kernel with 64 KiB pages", evidence=["getconf PAGESIZE: %d" % size])
    else:
        found = finding("page_size", "pass", "%d-byte pages" % size, evidence=["getconf PAGESIZE: %d" % size])
    return {"page_size": size, "findings": [found]}


# ---------------------------------------------------------------- hugepages --

def _hugepage_dirs(base):
    out = []
    for entry in list_dir(base):
        match = _HUGEPAGES_DIR_RE.match(entry)
        if match:
            out.append((int(match.group(1)), join(base, entry)))
    return sorted(out)


def read_hugepages(sysfs="/sys"):
    """``{"sizes_kb": [...], "pools": [{"size_kb", "nr_hugepages", ...}], "nodes": [{"node", "size_kb",
    "nr_hugepages", "free_hugepages", "surplus_hugepages"}], "findings": [...]}``.

    Warns when a size has pages reserved on some NUMA nodes but none on others (allocations on those nodes fall
    back to base pages or fail)."""
    pools = []
    for size, path in _hugepage_dirs(join(sysfs, "kernel/mm/hugepages")):
        pool = {"size_kb": size}
        for name in HUGEPAGE_FILES:
            pool[name] = read_int(join(path, name))
        pools.append(pool)
    nodes = []
    node_base = join(sysfs, "devices/system/node")
    for entry in list_dir(node_base):
        match = _NODE_RE.match(entry)
        if not match:
            continue
        for size, path in _hugepage_dirs(join(node_base, entry, "hugepages")):
            row = {"node": int(match.group(1)), "size_kb": size}
            for name in NODE_HUGEPAGE_FILES:
                row[name] = read_int(join(path, name))
            nodes.append(row)
    nodes.sort(key=lambda row: (row["size_kb"], row["node"]))
    result = {"sizes_kb": [pool["size_kb"] for pool in pools], "pools": pools, "nodes": nodes}
    if not pools:
        found = [finding("hugepages", "unknown", "no hugepage sizes under /sys/kernel/mm/hugepages (hugetlbfs not built?)")]
    else:
        found = []
        evidence = ["%d kB: %s reserved, %s free" % (p["size_kb"], p["nr_hugepages"], p["free_hugepages"]) for p in pools]
        uneven = []
        for pool in pools:
            rows = [row for row in nodes if row["size_kb"] == pool["size_kb"]]
            have = [row["node"] for row in rows if row["nr_hugepages"]]
            if have and len(have) < len(rows):
                nodes_text = ",".join(str(n) for n in have)
                uneven.append("%d kB on node%s %s only" % (pool["size_kb"], "s" if len(have) > 1 else "", nodes_text))
        reserved = [p for p in pools if p["nr_hugepages"]]
        if uneven:
            found.append(finding("hugepages", "warn", "hugepages reserved unevenly across NUMA nodes: %s" % "; ".join(uneven),
                                 evidence=evidence + ["node%d %d kB: %s" % (r["node"], r["size_kb"], r["nr_hugepages"]) for r in nodes],
                                 fix="reserve per node (/sys/devices/system/node/nodeN/hugepages/.../nr_hugepages) or "
                                     "with hugepagesz=/hugepages= on the command line"))
        else:
            message = ("hugepages reserved: %s" % ", ".join("%d x %d kB" % (p["nr_hugepages"], p["size_kb"]) for p in reserved)
                       if reserved else "no hugepages reserved (sizes %s kB available)" % ", ".join(str(p["size_kb"]) for p in pools))
            found.append(finding("hugepages", "pass", message, evidence=evidence))
    result["findings"] = found
    return result


def parse_choice(text, path=None, allowed=None):
    """``"always [madvise] never"`` -> ``("madvise", ["always", "madvise", "never"])``; the kernel's format for
    THP's ``enabled``/``defrag``. Raises PlatformError without exactly one ``[choice]`` or with an unknown word."""
    if not isinstance(text, str):
        raise PlatformError("%s is not text" % (path or "the value"), path=path, value=repr(text), expected="text")
    marked = _CHOICE_RE.findall(text)
    options = [word.strip("[]") for word in text.split()]
    if len(marked) != 1 or not options:
        raise PlatformError("%s %r does not mark exactly one choice in [brackets]" % (path or "value", text),
                            path=path, value=text, expected="words with one of them in [brackets], e.g. always [madvise] never")
    if allowed is not None and any(word not in allowed for word in options):
        raise PlatformError("%s %r has a word that is not one of %s" % (path or "value", text, " ".join(allowed)),
                            path=path, value=text, expected=list(allowed))
    return marked[0], options


def read_thp(sysfs="/sys"):
    """``{"enabled", "enabled_options", "defrag", "defrag_options", "defrag_format": "current"|"old"|None,
    "findings"}``; each None when the file is missing. ``enabled=never`` and ``defrag=always`` (direct compaction
    stalls in the allocating thread) warn."""
    base = join(sysfs, "kernel/mm/transparent_hugepage")
    result = {"enabled": None, "enabled_options": None, "defrag": None, "defrag_options": None, "defrag_format": None}
    enabled_text, defrag_text = read_text(join(base, "enabled")), read_text(join(base, "defrag"))
    if enabled_text is not None:
        result["enabled"], result["enabled_options"] = parse_choice(enabled_text, join(base, "enabled"), THP_ENABLED)
    if defrag_text is not None:
        result["defrag"], result["defrag_options"] = parse_choice(defrag_text, join(base, "defrag"), THP_DEFRAG_CURRENT)
        if tuple(result["defrag_options"]) == THP_DEFRAG_CURRENT:
            result["defrag_format"] = "current"
        elif tuple(result["defrag_options"]) == THP_DEFRAG_OLD:
            result["defrag_format"] = "old"
        else:
            result["defrag_format"] = "other"
    evidence = ["enabled: %s" % enabled_text, "defrag: %s" % defrag_text]
    if enabled_text is None:
        found = finding("transparent_hugepages", "unknown", "no /sys/kernel/mm/transparent_hugepage/enabled (THP not built)")
    elif result["enabled"] == "never":
        found = finding("transparent_hugepages", "warn", "transparent hugepages are off (enabled=never)", evidence=evidence,
                        fix="echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (or transparent_hugepage=madvise)")
    elif result["defrag"] == "always":
        found = finding("transparent_hugepages", "warn", "THP enabled=%s with defrag=always: page faults may stall "
                        "in direct compaction" % result["enabled"], evidence=evidence,
                        fix="echo madvise > /sys/kernel/mm/transparent_hugepage/defrag")
    else:
        found = finding("transparent_hugepages", "pass", "THP enabled=%s, defrag=%s" % (result["enabled"], result["defrag"]),
                        evidence=evidence)
    result["findings"] = [found]
    return result


# ---------------------------------------------------------------------- SMT --

def read_smt(sysfs="/sys"):
    """``{"control": ...|None, "active": 0|1|None, "findings"}``; a control value the kernel does not write raises."""
    base = join(sysfs, "devices/system/cpu/smt")
    control, active = read_text(join(base, "control")), read_int(join(base, "active"))
    if control is not None and control not in SMT_CONTROLS:
        raise PlatformError("SMT control %r is not a kernel value" % control, path=join(base, "control"), value=control,
                            expected=list(SMT_CONTROLS))
    evidence = ["control: %s" % control, "active: %s" % active]
    if control is None:
        found = finding("smt", "unknown", "no /sys/devices/system/cpu/smt/control")
    elif control in ("notsupported", "notimplemented"):
        found = finding("smt", "not_applicable", "the CPU has no SMT (control %s)" % control, evidence=evidence)
    else:
        found = finding("smt", "pass", "SMT control %s, %s" % (control, "active" if active else "not active"), evidence=evidence)
    return {"control": control, "active": active, "findings": [found]}


# -------------------------------------------------------------- mitigations --

# The SMT clause the kernel appends to a state (arch/x86/kernel/cpu/bugs.c, torvalds/linux: mds/taa/mmio/retbleed
# ``"%s; SMT %s"`` with vulnerable/mitigated/disabled/"enabled with STIBP protection", ``"%s; SMT Host state
# unknown"`` in a guest, l1tf ``"%s; VMX: %s, SMT %s"``); read from the stored copies of bugs.c via the search tool.
_SMT_CLAUSE_RE = re.compile(r"[;,]\s*SMT (vulnerable|mitigated|disabled|Host state unknown|enabled with STIBP protection)")
SMT_CLAUSES = {"vulnerable": "vulnerable", "mitigated": "mitigated", "disabled": "disabled",
               "Host state unknown": "host_state_unknown", "enabled with STIBP protection": "stibp"}


def classify_vulnerability(text):
    """``not_affected``, ``vulnerable``, ``mitigated`` or ``unknown`` by the prefix of a vulnerabilities file."""
    text = (text or "").strip()
    if text.startswith("KVM: "):
        text = text[len("KVM: "):]
    if text.startswith("Not affected"):
        return "not_affected"
    if text.startswith("Vulnerable") or text.startswith("Processor vulnerable"):
        return "vulnerable"
    if text.startswith("Mitigation:"):
        return "mitigated"
    return "unknown"


def smt_clause(text):
    """What the kernel's ``SMT ...`` clause of a vulnerabilities file says: ``vulnerable`` (the sibling thread can
    still attack: the mitigation covers only the same thread), ``mitigated``, ``disabled``, ``host_state_unknown``
    (a guest), ``stibp`` (enabled with STIBP protection), or None when the text has no such clause."""
    match = _SMT_CLAUSE_RE.search(text or "")
    return SMT_CLAUSES[match.group(1)] if match else None


def parse_vulnerabilities_grep(text):
    """``{name: text}`` from ``grep . /sys/devices/system/cpu/vulnerabilities/*`` output (``path:text`` lines)."""
    text = text_arg("vulnerabilities", text) or ""
    out = {}
    for line in text.splitlines():
        path, sep, value = line.partition(":")
        if not sep or "/vulnerabilities/" not in path:
            raise PlatformError("line %r is not path:text of a vulnerabilities file" % line, value=line,
                                expected="/sys/devices/system/cpu/vulnerabilities/NAME:TEXT")
        out[path.rsplit("/", 1)[1]] = value.strip()
    return out


# Boot parameters that turn mitigations off (Documentation/admin-guide/kernel-parameters.txt): all of them, or one
# vulnerability's (x86 and arm64 spellings).
MITIGATION_OFF_PARAMS = ("mitigations=off", "nopti", "pti=off", "kpti=0", "nospectre_v1", "nospectre_v2",
                         "spectre_v2=off", "spectre_v2_user=off", "spectre_bhi=off", "nospectre_bhb",
                         "nospec_store_bypass_disable", "spec_store_bypass_disable=off", "ssbd=force-off", "l1tf=off",
                         "mds=off", "tsx_async_abort=off", "mmio_stale_data=off", "retbleed=off", "srbds=off",
                         "gather_data_sampling=off", "spec_rstack_overflow=off", "reg_file_data_sampling=off",
                         "indirect_target_selection=off", "kvm.nx_huge_pages=off")


def mitigations_off_params(cmdline):
    """The tokens of a kernel command line that turn mitigations off, in order (``mitigations=`` counts as its last
    occurrence only: a later ``mitigations=auto`` undoes an earlier ``off``)."""
    tokens = [norm(token) for token in split_cmdline(text_arg("cmdline", cmdline) or "")]
    last_mode = [t for t in tokens if t.startswith("mitigations=")][-1:]
    return [t for t in tokens if t in MITIGATION_OFF_PARAMS and (not t.startswith("mitigations=") or [t] == last_mode)]


def mitigations_fix(cmdline):
    """What to do about a vulnerable CPU, true for the running command line (``cmdline`` text, None: unknown)."""
    if cmdline is None:
        return ("update the kernel and microcode; if the kernel command line turns mitigations off (mitigations=off, "
                "or one such as mds=off) and that is not deliberate, drop it")
    off = mitigations_off_params(cmdline)
    if off:
        return ("the running kernel command line has %s: drop %s unless that is deliberate (a dedicated node), and "
                "update the kernel and microcode" % (" ".join(off), "it" if len(off) == 1 else "them"))
    modes = [norm(t).partition("=")[2] for t in split_cmdline(cmdline) if norm(t).startswith("mitigations=")]
    return ("the running kernel command line turns no mitigation off (it runs %s): the kernel or the microcode lacks "
            "the mitigation; update the kernel and the microcode (intel-microcode or amd64-microcode, or the "
            "firmware)" % ("mitigations=%s" % modes[-1] if modes else "the default, mitigations=auto"))


def read_mitigations(sysfs="/sys", procfs=None, cmdline=None):
    """``{"vulnerabilities": {name: {"text", "state"}}, "vulnerable": [names], "findings"}``, one entry per file.

    The fix of a vulnerable CPU is said for the running command line: ``cmdline`` (text), else ``procfs``/cmdline;
    with neither it is not known and the fix says so."""
    if cmdline is None and procfs is not None:
        cmdline = read_text(join(procfs, "cmdline"))
    base = join(sysfs, "devices/system/cpu/vulnerabilities")
    files = {}
    for name in list_dir(base):
        text = read_text(join(base, name))
        if text is not None:
            files[name] = {"text": text, "state": classify_vulnerability(text), "smt": smt_clause(text)}
    vulnerable = sorted(name for name, item in files.items() if item["state"] == "vulnerable")
    # A mitigation that leaves the sibling thread open ("Mitigation: Clear CPU buffers; SMT vulnerable") is not a pass.
    smt_vulnerable = sorted(name for name, item in files.items() if item["state"] != "vulnerable" and item["smt"] == "vulnerable")
    smt_unknown = sorted(name for name, item in files.items() if item["smt"] == "host_state_unknown")
    unknown = sorted(name for name, item in files.items() if item["state"] == "unknown")
    evidence = ["%s: %s" % (name, files[name]["text"]) for name in sorted(files)]
    notes = []
    if smt_unknown:
        notes.append("SMT state of the host unknown to this guest: %s" % ", ".join(smt_unknown))
    if unknown:
        notes.append("%s unknown" % ", ".join(unknown))
    suffix = (" (%s)" % "; ".join(notes)) if notes else ""
    if not files:
        found = finding("mitigations", "unknown", "no /sys/devices/system/cpu/vulnerabilities files")
    elif vulnerable or smt_vulnerable:
        parts = (["vulnerable: %s" % ", ".join(vulnerable)] if vulnerable else []) + (
            ["SMT vulnerable (mitigated for the same thread only, SMT on): %s" % ", ".join(smt_vulnerable)]
            if smt_vulnerable else [])
        fixes = ([mitigations_fix(cmdline)] if vulnerable else []) + (
            ["for SMT vulnerable: disable SMT (nosmt, or mitigations=auto,nosmt) or accept the cross-thread risk"]
            if smt_vulnerable else [])
        found = finding("mitigations", "warn", "; ".join(parts) + suffix, evidence=evidence, fix="; ".join(fixes))
    else:
        found = finding("mitigations", "pass", "%d files, none vulnerable%s" % (len(files), suffix), evidence=evidence)
    return {"vulnerabilities": files, "vulnerable": vulnerable, "smt_vulnerable": smt_vulnerable, "findings": [found]}
