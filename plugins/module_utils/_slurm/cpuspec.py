# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plan and apply ``CpuSpecList=`` on the NodeName lines of ``slurm.conf``, with its prerequisites.

Private module_utils of gpunode.tuning, standard library only. The
``slurm_cpuspec`` module is a thin wrapper around :func:`plan` and
:func:`apply`.

Rules (Slurm's ``slurm.conf.5``, ``cgroup.conf.5``, ``core_spec.shtml``):

- ``CpuSpecList`` holds Slurm's abstract CPU ids; Slurm widens it to whole
  cores. The caller gives the CPUs to keep for the system as OS ids with the
  node's topology; they are translated here (``_slurm.cpus``) and the CPUs the
  whole-core rule adds are reported.
- It has an effect only with ``TaskPlugin`` including ``task/cgroup`` and
  ``ConstrainCores=yes`` in ``cgroup.conf``; core specialisation needs
  ``SelectType=select/cons_tres``; ``CpuSpecList`` and ``CoreSpecCount`` on
  one node is an error; slurmd is confined to the specialised CPUs unless
  ``TaskPluginParam`` has ``SlurmdOffSpec``.
- A node may be on one NodeName line only. ``NodeName=DEFAULT`` lines set
  what later lines do not.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, format_cpulist, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.hostlist import HostlistError, compress, expand
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import PersistError, apply_files, rooted, write_atomic
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.conf import (
    Conf,
    inside,
    line_ending,
    new_line,
    parse_text,
    remove_key,
    set_value,
)
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.cpus import SlurmCpuError, cpu_list, cpu_spec_list
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.scontrol import parse_scontrol_nodes
from ansible_collections.gpunode.tuning.plugins.module_utils._slurm.topology import topology_view

# Attributes that name one thing per node of the line: they are split with NodeName.
PER_NODE_KEYS = ("nodehostname", "nodeaddr")
TRUE_WORDS = ("yes", "true", "1", "up")


class CpuSpecError(DetailedError):
    """Bad input or a configuration the plan cannot be made on; nothing was written."""


# ------------------------------------------------------------ the node lines --

class NodeLine(object):
    """A NodeName line (not DEFAULT): where it is, its nodes in order, and the DEFAULT pairs it inherits."""

    def __init__(self, path, entry, names, defaults):
        self.path, self.entry, self.names, self.defaults = path, entry, names, defaults

    def attr(self, key):
        """(value, source) of ``key`` for the line's nodes: its own pair, else the DEFAULT's, else (None, None)."""
        pair = self.entry.get(key)
        if pair is not None:
            return pair.value, "line"
        if key.lower() in self.defaults:
            return self.defaults[key.lower()], "default"
        return None, None

    @property
    def where(self):
        return "%s line %d" % (self.path, self.entry.line)


def node_lines(conf):
    """Every NodeName line in reading order, with the DEFAULT values that apply to it."""
    defaults, lines = {}, []
    for path, entry in conf.entries():
        if entry.kind != "object" or entry.pairs[0].name != "nodename":
            continue
        value = entry.pairs[0].value
        if value.upper() == "DEFAULT":
            for pair in entry.pairs[1:]:
                defaults[pair.name] = pair.value
            continue
        try:
            names = expand(value)
        except HostlistError as exc:
            raise CpuSpecError("%s line %d: NodeName=%s is not a hostlist: %s" % (path, entry.line, value, exc),
                               path=path, line=entry.line, value=value, expected="a Slurm hostlist such as gpu[001-128]")
        lines.append(NodeLine(path, entry, names, dict(defaults)))
    return lines


def node_index(lines):
    """Node name -> its NodeLine; a node on two lines is an error naming both."""
    index = {}
    for line in lines:
        for name in line.names:
            if name in index and index[name] is not line:
                raise CpuSpecError("node %s is on two NodeName lines (%s and %s); Slurm allows one" % (name, index[name].where, line.where),
                                   value=name, expected="each node on one NodeName line")
            index[name] = line
    return index


# --------------------------------------------------------------- the inputs --

def desired_nodes(nodes, index, state):
    """Validate the ``nodes`` option against the file; per node: the OS CPUs, the abstract list to set."""
    out, seen = [], set()
    if not nodes:
        raise CpuSpecError("nodes is empty: expected at least one node with its CPUs", value=nodes, expected="a non-empty list")
    for item in nodes:
        name = item.get("name")
        if not name or not isinstance(name, str):
            raise CpuSpecError("a node without a name: %r" % (item,), value=item, expected="name: the node's NodeName")
        if name in seen:
            raise CpuSpecError("node %s is given twice" % name, value=name, expected="each node once")
        seen.add(name)
        if name not in index:
            raise CpuSpecError("node %s is on no NodeName line of the configuration" % name, value=name,
                               expected="one of the nodes defined in slurm.conf")
        line = index[name]
        core_count, source = line.attr("CoreSpecCount")
        if state == "present" and core_count not in (None, "", "0"):
            raise CpuSpecError("node %s has CoreSpecCount=%s (%s of %s); CpuSpecList and CoreSpecCount on one node is an error in Slurm" % (
                name, core_count, "on its line" if source == "line" else "from NodeName=DEFAULT", line.where),
                value=core_count, expected="no CoreSpecCount on the node (remove it, or leave the node out)")
        result = {"name": name, "line": line.where}
        if state == "present":
            if item.get("cpus") in (None, "", []):
                raise CpuSpecError("node %s has no cpus: expected the OS CPU ids to keep for the system" % name, value=item.get("cpus"),
                                   expected="a CPU list such as 4-5")
            try:
                os_cpus = cpu_list(item["cpus"], "node %s cpus" % name)
                view = topology_view(item.get("topology"), name=name)
                by_core = _cpus_are_cores(line, view)
                spec = cpu_spec_list(view, os_cpus, cpus_are_cores=by_core)
            except SlurmCpuError as exc:
                raise CpuSpecError(str(exc) if str(exc).startswith("node ") else "node %s: %s" % (name, exc), **exc.details)
            if spec["cpus_effective"] <= 0:
                raise CpuSpecError("node %s: reserving %s (whole cores: OS CPUs %s) leaves no CPU for jobs out of %d" % (
                    name, format_cpulist(os_cpus), format_cpulist(spec["os_cpus"]), view["cpus"]),
                    value=format_cpulist(os_cpus), expected="fewer CPUs than the node has")
            result.update({"os_cpus": format_cpulist(os_cpus), "whole_core_os_cpus": format_cpulist(spec["os_cpus"]),
                           "extra_os_cpus": format_cpulist(spec["extra_os_cpus"]),
                           "cpu_spec_list": spec["cpu_spec_list"], "cpus_for_jobs": spec["cpus_effective"],
                           "ids": "cores" if by_core else "cpus",
                           "topology": {k: view[k] for k in ("sockets", "cores_per_socket", "threads_per_core", "cpus")}})
            result["mismatch"] = _line_topology_mismatch(line, view)
        else:
            result["cpu_spec_list"] = None
        out.append(result)
    return out


def _cpus_are_cores(line, view):
    """Whether the line's ``CPUs=`` is the node's core count on SMT hardware: Slurm then counts CPUs as cores, and
    CpuSpecList ids are core indices (node_conf.c, ``tpc`` 1 when CPUs equals the cores)."""
    value, dummy = line.attr("CPUs")
    cores = view["sockets"] * view["cores_per_socket"]
    return view["threads_per_core"] > 1 and value is not None and value.isdigit() and int(value) == cores


def _line_topology_mismatch(line, view):
    """What the NodeName line says about CPUs/Sockets/CoresPerSocket/ThreadsPerCore that the node does not have."""
    notes = []
    for key, want in (("Sockets", view["sockets"]), ("CoresPerSocket", view["cores_per_socket"]),
                      ("ThreadsPerCore", view["threads_per_core"]), ("CPUs", view["cpus"])):
        value, dummy = line.attr(key)
        if key == "CPUs" and _cpus_are_cores(line, view):
            continue
        if value not in (None, "") and value.isdigit() and int(value) != want:
            notes.append("%s=%s on %s, the node has %d" % (key, value, line.where, want))
    return notes


def _same_cpus(left, right):
    if left in (None, "") or right in (None, ""):
        return left in (None, "") and right in (None, "")
    try:
        return parse_cpulist(left) == parse_cpulist(right)
    except CpuListError:
        return False


# -------------------------------------------------------------- node edits --

def _normal(value):
    try:
        return format_cpulist(parse_cpulist(value))
    except CpuListError:
        return value


def _split_values(line, key, count):
    pair = line.entry.get(key)
    if pair is None:
        return None
    try:
        values = expand(pair.value)
    except HostlistError as exc:
        raise CpuSpecError("%s: %s=%s is not a hostlist: %s" % (line.where, pair.key, pair.value, exc), value=pair.value,
                           expected="a hostlist with one entry per node of the line")
    if len(values) != count:
        raise CpuSpecError("%s: %s=%s names %d hosts for %d nodes; the line cannot be split by node" % (
            line.where, pair.key, pair.value, len(values), count), value=pair.value, expected="one entry per node")
    return values


def _split_line(line, groups):
    """New raw text for ``line`` split into ``groups`` [(names, CpuSpecList value or None)], every other pair kept."""
    per_node = {key: _split_values(line, key, len(line.names)) for key in PER_NODE_KEYS}
    position = {name: i for i, name in enumerate(line.names)}
    ending = line_ending(line.entry)
    out = ["# NodeName=%s (was %s) split by gpunode.tuning slurm_cpuspec: the nodes need different core specialisation%s" % (
        line.entry.pairs[0].value, line.where, ending)]
    for names, value in groups:
        pairs, done = [], False
        for pair in line.entry.pairs:
            if pair.name == "nodename":
                pairs.append((pair.key, compress(names)))
            elif pair.name in PER_NODE_KEYS and per_node[pair.name] is not None:
                pairs.append((pair.key, compress([per_node[pair.name][position[n]] for n in names])))
            elif pair.name == "cpuspeclist":
                if value is not None and not done:
                    pairs.append((pair.key, value))
                    done = True
            else:
                pairs.append((pair.key, pair.value))
        if value is not None and not done:
            pairs.append(("CpuSpecList", value))
        out.append(new_line(pairs, ending))
    return "".join(out)


def plan_nodes(lines, wanted):
    """Per NodeName line touched: (line, new raw text or None, per-node notes). ``wanted``: name -> value or None."""
    edits = []
    for line in lines:
        mine = [n for n in line.names if n in wanted]
        if not mine:
            continue
        own = line.entry.get("CpuSpecList")
        current, dummy = line.attr("CpuSpecList")
        kept = _normal(own.value) if own is not None else None
        target = {}
        for name in line.names:
            target[name] = wanted[name] if name in wanted else kept
        values = []
        for name in line.names:
            if target[name] not in values:
                values.append(target[name])
        if all(_same_cpus(current, wanted[n]) for n in mine):
            edits.append((line, None))
            continue
        if len(values) == 1:
            value = values[0]
            raw = remove_key(line.entry, "CpuSpecList") if value is None else set_value(line.entry, "CpuSpecList", value)
        else:
            groups = [([n for n in line.names if target[n] == v], v) for v in values]
            raw = _split_line(line, groups)
        edits.append((line, raw))
    return edits


# ------------------------------------------------------------ prerequisites --

def _words(value):
    return [w.strip() for w in (value or "").split(",") if w.strip()]


def prerequisites(conf, cgroup, options):
    """Each prerequisite: {name, ok, current, wanted, where, fix}; ``fix`` is (file, key, new value) when it can be set."""
    checks = []
    value, path, dummy, dummy2 = conf.get("TaskPlugin")
    plugins = _words(value)
    ok = any(w.lower() in ("task/cgroup", "cgroup") for w in plugins)
    checks.append({"name": "task_cgroup", "ok": ok, "current": value, "where": path or conf.path,
                   "wanted": "TaskPlugin including task/cgroup",
                   "fix": None if ok else ("slurm", "TaskPlugin", ",".join(plugins + ["task/cgroup"]))})
    value, path, dummy, dummy2 = conf.get("SelectType")
    ok = (value or "").lower() == "select/cons_tres"
    checks.append({"name": "select_cons_tres", "ok": ok, "current": value, "where": path or conf.path,
                   "wanted": "SelectType=select/cons_tres", "fix": None if ok else ("slurm", "SelectType", "select/cons_tres")})
    value, path = (None, cgroup["path"])
    if cgroup["conf"] is not None:
        value, found, dummy, dummy2 = cgroup["conf"].get("ConstrainCores")
        path = found or path
    ok = (value or "").lower() in TRUE_WORDS
    checks.append({"name": "constrain_cores", "ok": ok, "current": value, "where": path,
                   "wanted": "ConstrainCores=yes in cgroup.conf", "fix": None if ok else ("cgroup", "ConstrainCores", "yes")})
    if options.get("slurmd_off_spec"):
        value, path, dummy, dummy2 = conf.get("TaskPluginParam")
        params = _words(value)
        ok = any(w.lower() == "slurmdoffspec" for w in params)
        checks.append({"name": "slurmd_off_spec", "ok": ok, "current": value, "where": path or conf.path,
                       "wanted": "TaskPluginParam including SlurmdOffSpec",
                       "fix": None if ok else ("slurm", "TaskPluginParam", ",".join(params + ["SlurmdOffSpec"]))})
    return checks


def mem_spec_check(conf, cgroup, lines):
    """For nodes with ``MemSpecLimit``: it confines slurmd only with ``ConstrainRAMSpace=yes`` and memory as a
    consumable resource (``SelectTypeParameters`` with ``Memory``). Reported, never set; None when no node has it."""
    limits = sorted(set("%s on %s" % (line.attr("MemSpecLimit")[0], line.where) for line in lines if line.attr("MemSpecLimit")[0]))
    if not limits:
        return None
    ram = None
    if cgroup["conf"] is not None:
        ram = cgroup["conf"].get("ConstrainRAMSpace")[0]
    params, dummy, dummy2, dummy3 = conf.get("SelectTypeParameters")
    ok = (ram or "").lower() in TRUE_WORDS and "memory" in (params or "").lower()
    return {"name": "mem_spec_limit", "ok": ok, "current": "; ".join(limits), "where": cgroup["path"],
            "wanted": "ConstrainRAMSpace=yes in cgroup.conf and SelectTypeParameters with Memory (now %s, %s)" % (
                "ConstrainRAMSpace=%s" % ram if ram is not None else "ConstrainRAMSpace unset", params or "SelectTypeParameters unset"),
            "fix": None}


def _set_global(conf_obj, texts, key, value):
    """Set global ``key`` in the file that sets it last, else in the main file before its first object line."""
    dummy, path, entry, dummy2 = conf_obj.get(key)
    if entry is not None:
        texts.setdefault(path, {})[id(entry)] = (entry, set_value(entry, key, value))
        return path
    main = conf_obj.files[conf_obj.path]
    target = None
    for entry in main.entries:
        if entry.kind == "object":
            target = entry
            break
    line = new_line([(key, value)])
    if target is None:
        if main.entries and not main.entries[-1].raw.endswith("\n"):
            line = "\n" + line
        texts.setdefault(conf_obj.path, {})["append"] = (None, line)
    else:
        prior = texts.setdefault(conf_obj.path, {}).get(id(target))
        raw = prior[1] if prior else target.raw
        texts[conf_obj.path][id(target)] = (target, line + raw)
    return conf_obj.path


def _render(conf_obj, path, edits):
    out = []
    for entry in conf_obj.files[path].entries:
        change = edits.get(id(entry))
        out.append(change[1] if change else entry.raw)
    if "append" in edits:
        out.append(edits["append"][1])
    return "".join(out)


# --------------------------------------------------------------------- plan --

def writable(path, root):
    """Refuse to write ``path`` when it is a symbolic link (never replaced by a regular file, never written through)
    or when its directory leads out of ``root`` through a link."""
    full = rooted(root, path)
    if os.path.islink(full):
        target = os.readlink(full)
        raise CpuSpecError("%s is a symbolic link (-> %s): this module never replaces a link with a regular file nor "
                           "writes through it; point path (or the include) at the file itself" % (path, target),
                           path=path, value=path, target=target, expected="a regular file, not a link")
    inside(root, os.path.dirname(path) or "/", "the directory of")


def read_cgroup(path, root):
    inside(root, path, "cgroup.conf")
    if not os.path.exists(rooted(root, path)):
        return {"path": path, "conf": None}
    conf = Conf(path, root)
    return {"path": path, "conf": conf}


def plan(params, root="/"):
    """Read, validate and plan; returns {files: {path: (before, after)}, nodes, prerequisites, warnings}.
    Raises CpuSpecError / SlurmConfError before anything is written."""
    state = params.get("state", "present")
    conf = Conf(params["path"], root)
    cgroup_path = params.get("cgroup_conf") or os.path.join(os.path.dirname(params["path"]), "cgroup.conf")
    cgroup = read_cgroup(cgroup_path, root)
    lines = node_lines(conf)
    index = node_index(lines)
    nodes = desired_nodes(params.get("nodes"), index, state)
    wanted = {n["name"]: n["cpu_spec_list"] for n in nodes}
    warnings = []
    edits = {}
    for line, raw in plan_nodes(lines, wanted):
        if raw is not None:
            edits.setdefault(line.path, {})[id(line.entry)] = (line.entry, raw)
        if state == "absent":
            value, source = line.attr("CpuSpecList")
            if source == "default":
                warnings.append("%s: CpuSpecList=%s comes from NodeName=DEFAULT and stays for %s" % (
                    line.where, value, compress([n for n in line.names if n in wanted])))
    for node in nodes:
        for note in node.get("mismatch") or []:
            warnings.append("node %s: %s; slurmd uses what it detects, check the NodeName line" % (node["name"], note))
    checks = []
    cgroup_edits = {}
    if state == "present":
        checks = prerequisites(conf, cgroup, params)
        memspec = mem_spec_check(conf, cgroup, [index[n["name"]] for n in nodes])
        missing = [c for c in checks if not c["ok"]]
        allowed = {"task_cgroup", "select_cons_tres", "constrain_cores"} if params.get("set_prerequisites") else set()
        if params.get("slurmd_off_spec"):
            allowed.add("slurmd_off_spec")
        unfixed = [c for c in missing if c["name"] not in allowed]
        if unfixed and params.get("require_prerequisites", True):
            raise CpuSpecError("CpuSpecList would have no effect: %s; set them, or set_prerequisites: true to have them set" % (
                "; ".join("%s (%s: %s)" % (c["wanted"], c["where"], "unset" if c["current"] is None else c["current"]) for c in unfixed)),
                value=[c["name"] for c in unfixed], expected=[c["wanted"] for c in unfixed], prerequisites=checks)
        for check in missing:
            if check["name"] not in allowed:
                warnings.append("prerequisite missing: %s (%s)" % (check["wanted"], check["where"]))
                continue
            kind, key, value = check["fix"]
            if kind == "slurm":
                check["set_in"] = _set_global(conf, edits, key, value)
            else:
                check["set_in"] = _plan_cgroup(cgroup, cgroup_edits, key, value)
            check["action"] = "set"
        if memspec is not None:
            checks.append(memspec)
            if not memspec["ok"]:
                warnings.append("MemSpecLimit is set (%s) but confines slurmd only with %s" % (memspec["current"], memspec["wanted"]))
    files = {}
    for path, change in edits.items():
        before = conf.files[path].render()
        files[path] = (before, _render(conf, path, change))
    if cgroup_edits:
        path = cgroup["path"]
        before = cgroup["conf"].files[path].render() if cgroup["conf"] is not None else None
        files[path] = (before, cgroup_edits[path])
    for path, (before, after) in list(files.items()):
        if before == after:
            del files[path]
        else:
            parse_text(after, path)          # what is written must read back
            writable(path, root)
    return {"files": files, "nodes": nodes, "prerequisites": checks, "warnings": warnings,
            "conf_files": list(conf.files), "cgroup_conf": cgroup["path"]}


def _plan_cgroup(cgroup, cgroup_edits, key, value):
    path = cgroup["path"]
    if cgroup["conf"] is None:
        cgroup_edits[path] = "# cgroup.conf: written by gpunode.tuning slurm_cpuspec\n" + new_line([(key, value)])
        return path
    edits = {}
    found = _set_global(cgroup["conf"], edits, key, value)
    cgroup_edits[found] = _render(cgroup["conf"], found, edits[found])
    cgroup["path"] = found
    return found


def verify_scontrol(records, nodes):
    """Compare ``scontrol show node -o`` records with the planned nodes: per node, what Slurm reports."""
    by_name = {r.get("NodeName"): r for r in records}
    out = []
    for node in nodes:
        record = by_name.get(node["name"])
        if record is None:
            out.append({"name": node["name"], "ok": False, "reported": None, "message": "scontrol does not list node %s" % node["name"]})
            continue
        reported = record.get("CPUSpecList") or record.get("CpuSpecList")
        ok = _same_cpus(reported, node["cpu_spec_list"])
        out.append({"name": node["name"], "ok": ok, "reported": reported,
                    "message": "" if ok else "scontrol reports CPUSpecList=%s, expected %s" % (reported, node["cpu_spec_list"])})
    return out


# -------------------------------------------------------------------- apply --

def apply(files, root="/", backup=None, write=None):
    """Write each planned file with ``_host.files.apply_files`` (atomic, all or nothing: a failed write puts the
    files already written back), keeping each file's mode and owner (a new one: 0644 root); with ``backup`` (a
    function path -> backup path) each existing file is copied first. Returns {path: backup path}."""
    write = write or write_atomic
    data, actions, owners, backups = {}, [], {}, {}
    for path in sorted(files):
        full = rooted(root, path)
        writable(path, root)
        if os.path.lexists(full) and not os.path.isfile(full):
            raise CpuSpecError("%s is not a regular file" % path, path=path, value=path, expected="a regular file")
        stat = os.stat(full) if os.path.exists(full) else None
        data[path] = (files[path][1].encode("utf-8"), stat.st_mode & 0o7777 if stat else 0o644)
        owners[full] = (stat.st_uid, stat.st_gid) if stat else (0, 0)
        actions.append({"path": path, "action": "update" if stat else "create"})
    errors = []

    def write_keeping_owner(full, content, mode):
        try:
            write(full, content, mode, owners[full])
        except (IOError, OSError) as exc:
            errors.append(exc)
            raise

    try:
        for act in actions:
            if act["action"] == "update" and backup is not None:
                backups[act["path"]] = backup(rooted(root, act["path"]))
        apply_files(data, actions, root, write=write_keeping_owner)
    except (IOError, OSError, PersistError) as exc:
        failed = exc.details.get("rollback_failed") or [] if isinstance(exc, PersistError) else []
        path = exc.details.get("path") if isinstance(exc, PersistError) else None
        raise CpuSpecError("writing %s failed (%s); %s" % (path, errors[-1] if errors else exc, "every file written before was put back"
                                                           if not failed else "putting back failed for %s" % ", ".join(failed)),
                           path=path, rollback_failed=failed)
    return backups


ARGUMENT_SPEC = {
    "path": {"type": "path", "default": "/etc/slurm/slurm.conf"},
    "cgroup_conf": {"type": "path"},
    "nodes": {"type": "list", "elements": "dict", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "set_prerequisites": {"type": "bool", "default": False},
    "require_prerequisites": {"type": "bool", "default": True},
    "slurmd_off_spec": {"type": "bool", "default": False},
    "backup": {"type": "bool", "default": False},
    "root": {"type": "path", "default": "/"},
    "verify": {"type": "bool", "default": False},
}


def verify(run, nodes):
    """What slurmctld reports for ``nodes`` (``scontrol show node -o``) against the planned CpuSpecList."""
    rc, out, err = run(["scontrol", "show", "node", "-o", compress([n["name"] for n in nodes])])
    if rc != 0:
        raise CpuSpecError("scontrol show node failed (rc %d): %s" % (rc, (err or out).strip()), value="scontrol show node",
                           expected="scontrol answering on this host (slurmctld reachable)")
    return verify_scontrol(parse_scontrol_nodes(out), nodes)


def converge(params, check, backup=None, write=None, run=None):
    """Plan, then (unless ``check``) apply; with ``verify`` and nothing to change, compare with scontrol.
    Returns (result, diff, warnings)."""
    root = params.get("root") or "/"
    if params.get("verify") and root not in ("", "/"):
        raise CpuSpecError("verify asks the running slurmctld, which a root other than / does not have", value=root, expected="root: /")
    planned = plan(params, root)
    changed = bool(planned["files"])
    backups = {}
    if changed and not check:
        backups = apply(planned["files"], root, backup=backup if params.get("backup") else None, write=write)
    verified = None
    if params.get("verify"):
        if changed:
            planned["warnings"].append("not verified against scontrol: the configuration %s, and slurmctld has not read it yet" % (
                "would change" if check else "changed"))
        else:
            verified = verify(run, planned["nodes"]) if params.get("state", "present") == "present" else None
            bad = [v for v in verified or [] if not v["ok"]]
            if bad:
                raise CpuSpecError("slurm.conf has the CpuSpecList asked for, but slurmctld reports otherwise: %s; "
                                   "has it been reconfigured since the file changed?" % "; ".join("%s: %s" % (v["name"], v["message"]) for v in bad),
                                   value=[v["reported"] for v in bad], expected=[n["cpu_spec_list"] for n in planned["nodes"]],
                                   verified=verified)
    diff = [{"before_header": path, "after_header": path, "before": before or "", "after": after}
            for path, (before, after) in sorted(planned["files"].items())]
    result = {
        "changed": changed,
        "nodes": planned["nodes"],
        "prerequisites": planned["prerequisites"],
        "files": sorted(planned["files"]),
        "conf_files": planned["conf_files"],
        "reconfigure_required": changed,
        "backups": backups,
        "verified": verified,
    }
    return result, diff, planned["warnings"]
