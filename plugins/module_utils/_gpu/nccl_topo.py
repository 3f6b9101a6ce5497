# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An NCCL topology file made visible in containers (the nccl_topo_mount module).

Private module_utils of gpunode.tuning, standard library only.

* :func:`check_params` - every option checked before anything is read or written;
* :func:`read_topology` - the XML on the host: a regular file, well formed, root
  ``<system version=...>``; its sha256 and every ``busid`` attribute in it;
* :func:`render` - the files: enroot's ``mounts.d`` fstab and ``environ.d`` env
  files, a CDI spec (JSON, which is YAML), and with ``nccl_conf`` the
  ``/etc/nccl.conf`` NCCL reads (``KEY=VALUE`` lines, ``#`` a comment only in
  column 0, nothing trimmed);
* :func:`converge` - plan (``_host.files.plan_files``), write (``_host.files.apply_files``:
  atomic, all or nothing), and with ``verify`` start a container and prove from
  inside it that ``NCCL_TOPO_FILE`` is set and names the same bytes
  (:func:`parse_probe`).

:func:`nccl_log_loaded` reads an ``NCCL_DEBUG=INFO`` log for whether NCCL loaded
the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import xml.etree.ElementTree as ET

from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import target_spec
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._host.fileio import join, list_dir
from ansible_collections.gpunode.tuning.plugins.module_utils._host.target import is_live_root
from ansible_collections.gpunode.tuning.plugins.module_utils._host.files import PersistError, apply_files, plan_files, rooted
from ansible_collections.gpunode.tuning.plugins.module_utils._host.validate import InputError, check_own_file, has_control, is_valid

RUNTIMES = ("enroot", "cdi")
VERIFY_RUNTIMES = ("podman", "enroot")
STATES = ("present", "absent")
DEFAULT_CONTAINER_PATH = "/etc/nccl/topo.xml"
DEFAULT_PREFIX = "50-gpunode-nccl"
DEFAULT_CDI_KIND = "gpunode.io/nccl"
CDI_DEVICE = "topo"
CDI_VERSION = "0.5.0"
CDI_FILE = "gpunode-nccl.yaml"
NCCL_CONF_CONTAINER = "/etc/nccl.conf"
MOUNT_OPTIONS = ["ro", "bind", "nosuid", "nodev"]
ENROOT_OPTIONS = "x-create=file,bind,ro,nosuid,nodev"
HEADER = "# Managed by gpunode.tuning (nccl_topo_mount module): local changes are overwritten.\n"

ARGUMENT_SPEC = dict(
    src=dict(type="path"),
    content=dict(type="str"),
    state=dict(type="str", choices=list(STATES), default="present"),
    container_path=dict(type="str", default=DEFAULT_CONTAINER_PATH),
    runtimes=dict(type="list", elements="str", choices=list(RUNTIMES), default=list(RUNTIMES)),
    enroot_sysconf_path=dict(type="path", default="/etc/enroot"),
    file_prefix=dict(type="str", default=DEFAULT_PREFIX),
    cdi_spec_dir=dict(type="path", default="/etc/cdi"),
    cdi_kind=dict(type="str", default=DEFAULT_CDI_KIND),
    nccl_conf=dict(type="dict"),
    nccl_conf_path=dict(type="path", default="/etc/nccl.conf"),
    validate_pci=dict(type="bool", default=False),
    verify=dict(type="dict", options=dict(
        runtime=dict(type="str", choices=list(VERIFY_RUNTIMES), required=True),
        image=dict(type="str", required=True),
    )),
    nccl_log=dict(type="str"),
    **target_spec("sysfs_path", "root")
)
REQUIRED_IF = [("state", "present", ("src",))]

# NCCL's src/misc/param.cc reads nccl.conf lines as KEY=VALUE, no trimming, "#" a comment only in column 0.
_NCCL_VAR = re.compile(r"NCCL_[A-Z0-9_]+\Z")
# CDI's kind: vendor (a domain name) "/" class (pkg/parser in container-device-interface).
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_BUSID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])\Z")
_SHA = re.compile(r"^([0-9a-f]{64})\s")
# PCI domains NCCL's published topology files use for switches that are no host PCI device (Azure's ffff:ff:XX.0).
VIRTUAL_DOMAIN = "ffff"


class TopoError(DetailedError):
    """Bad input, a topology file that NCCL would not load, a failed write or a failed verification; ``details``
    names the option or path, the bad value and what was expected."""


# ---------------------------------------------------------------- input --

def _path_problem(value):
    if not isinstance(value, str) or not value.startswith("/"):
        return "it is not absolute"
    if re.search(r"[\s,]", value):
        return "it has whitespace or a comma (it goes into an fstab line)"
    if "\\" in value:
        return "it has a backslash (fstab reads octal escapes)"
    return None


def check_nccl_conf(conf):
    """The NCCL settings as {KEY: str VALUE}; raises TopoError naming the first bad key or value."""
    out = {}
    for key in sorted(conf or {}, key=str):
        value = conf[key]
        if not isinstance(key, str) or not _NCCL_VAR.match(key):
            raise TopoError("nccl_conf key %r is not an NCCL variable name (NCCL_ then A-Z, 0-9, _)" % (key,),
                            option="nccl_conf", value=key, expected="a name of NCCL_ then A-Z, 0-9 or _ (NCCL_[A-Z0-9_]+)")
        if isinstance(value, bool):
            value = "1" if value else "0"
        if isinstance(value, (int, float)):
            value = str(value)
        if not isinstance(value, str):
            raise TopoError("nccl_conf %s value %r is not a string or number" % (key, value),
                            option="nccl_conf", value=value, key=key, expected="a string or number")
        why = None
        if value == "":
            why = "it is empty"
        elif "\n" in value or "\r" in value:
            why = "it has a newline"
        elif has_control(value):
            why = "it has a control character"
        elif value != value.strip():
            why = "it has leading or trailing whitespace (NCCL does not trim it)"
        if why:
            raise TopoError("nccl_conf %s value %r: %s" % (key, value, why), option="nccl_conf", value=value, key=key,
                            expected="a non-empty value without newlines or surrounding whitespace")
        out[key] = value
    return out


def check_params(params):
    """The options checked and normalised; raises TopoError (before any read or write) naming the bad value."""
    p = dict(params)
    p["root"] = p.get("root") or "/"
    if not os.path.isdir(p["root"]):
        raise TopoError("root %s is not a directory" % p["root"], option="root", value=p["root"], expected="/ or the root of a tree")
    runtimes = list(p.get("runtimes") if p.get("runtimes") is not None else RUNTIMES)
    for name in runtimes:
        if name not in RUNTIMES:
            raise TopoError("runtimes: %r is not one of %s" % (name, ", ".join(RUNTIMES)), option="runtimes", value=name,
                            expected="one of %s" % ", ".join(RUNTIMES))
    p["runtimes"] = [r for r in RUNTIMES if r in runtimes]
    why = _path_problem(p.get("container_path"))
    if why:
        raise TopoError("container_path %r: %s" % (p.get("container_path"), why), option="container_path",
                        value=p.get("container_path"), expected="an absolute path without whitespace, commas or backslashes")
    if os.path.normpath(p["container_path"]) != p["container_path"] or p["container_path"] == "/":
        raise TopoError("container_path %r is not a normalised file path" % p["container_path"], option="container_path",
                        value=p["container_path"], expected="a path such as %s" % DEFAULT_CONTAINER_PATH)
    for option in ("file_prefix",):
        if not isinstance(p.get(option), str) or not _PREFIX.match(p[option]):
            raise TopoError("%s %r is not a plain file name" % (option, p.get(option)), option=option, value=p.get(option),
                            expected="letters, digits and ._- only, not starting with . or -")
    if not isinstance(p.get("cdi_kind"), str) or not is_valid("cdi_kind", p["cdi_kind"]):
        raise TopoError("cdi_kind %r is not a CDI kind (vendor/class)" % (p.get("cdi_kind"),), option="cdi_kind",
                        value=p.get("cdi_kind"), expected="vendor/class such as %s" % DEFAULT_CDI_KIND)
    for option in ("enroot_sysconf_path", "cdi_spec_dir", "nccl_conf_path"):
        if not isinstance(p.get(option), str) or not p[option].startswith("/"):
            raise TopoError("%s %r is not absolute" % (option, p.get(option)), option=option, value=p.get(option),
                            expected="an absolute path")
    p["nccl_conf"] = check_nccl_conf(p.get("nccl_conf")) if p.get("nccl_conf") else {}
    present = p.get("state", "present") == "present"
    if present:
        src = p.get("src")
        why = _path_problem(src)
        if why:
            raise TopoError("src %r: %s" % (src, why), option="src", value=src,
                            expected="the absolute path of the topology XML on the host")
        if p["nccl_conf"] and "enroot" in p["runtimes"]:
            why = _path_problem(p["nccl_conf_path"])
            if why:
                raise TopoError("nccl_conf_path %r: %s" % (p["nccl_conf_path"], why), option="nccl_conf_path",
                                value=p["nccl_conf_path"], expected="an absolute path without whitespace or commas")
    verify = p.get("verify")
    if verify and present:
        if not is_live_root(p["root"]):
            raise TopoError("verify starts a container on this host, so it needs root /, not %s" % p["root"], option="verify",
                            value=verify, expected="root /")
        need = "cdi" if verify["runtime"] == "podman" else "enroot"
        if need not in p["runtimes"]:
            raise TopoError("verify with %s needs %s in runtimes (%s)" % (verify["runtime"], need, ", ".join(p["runtimes"])),
                            option="verify", value=verify, expected="runtimes with %s" % need)
        if not isinstance(verify.get("image"), str) or not verify["image"].strip() or verify["image"].startswith("-"):
            raise TopoError("verify image %r is not an image or container name" % (verify.get("image"),), option="verify",
                            value=verify, expected="an image (podman) or an enroot container name")
    return p


# ------------------------------------------------------------- topology --

def normalise_busid(busid):
    """``busid`` as sysfs names it (lower case, 4-digit domain), or None when it is not a PCI address."""
    m = _BUSID.match(busid.strip().lower()) if isinstance(busid, str) else None
    if not m:
        return None
    domain = (m.group(1) or "0").rjust(4, "0")
    return "%s:%s:%s.%s" % (domain, m.group(2), m.group(3), m.group(4))


def parse_topology(data, path):
    """(busids as written, in document order, without repeats) of topology XML ``data``; raises TopoError
    naming ``path`` and the parse error with its line when NCCL could not read it."""
    try:
        top = ET.fromstring(data)
    except ET.ParseError as exc:
        line, column = getattr(exc, "position", (None, None))
        raise TopoError("%s is not well-formed XML: %s" % (path, exc), path=path, line=line, column=column,
                        expected="a well-formed NCCL topology XML")
    if top.tag != "system":
        raise TopoError("%s has root element <%s>, not <system> (an NCCL topology file, NCCL_TOPO_FILE, starts with "
                        "<system version=\"1\">)" % (path, top.tag), path=path, value=top.tag, expected="<system>")
    if "version" not in top.attrib:
        raise TopoError("%s: <system> has no version attribute" % path, path=path, value=dict(top.attrib),
                        expected="<system version=\"1\">")
    found = []
    for elem in top.iter():
        busid = elem.attrib.get("busid")
        if busid is not None and busid not in found:
            found.append(busid)
    return found


def read_topology(root, src, content=None):
    """The topology file ``src`` under ``root`` (or ``content``, the text to install there):
    {path, data, checksum, busids}; raises TopoError."""
    path = rooted(root, src)
    if content is not None:
        if os.path.isdir(path):
            raise TopoError("src %s is a directory, expected the path to install content at" % src, option="src", value=src,
                            path=path, expected="a file path")
        data = content.encode("utf-8")
        return {"path": src, "data": data, "checksum": hashlib.sha256(data).hexdigest(), "busids": parse_topology(data, src)}
    if not os.path.lexists(path):
        raise TopoError("src %s does not exist" % src, option="src", value=src, path=path, expected="an existing topology XML")
    if not os.path.isfile(path):
        raise TopoError("src %s is not a regular file" % src, option="src", value=src, path=path, expected="a regular file")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise TopoError("cannot read src %s: %s" % (src, exc), option="src", value=src, path=path)
    busids = parse_topology(data, src)
    return {"path": src, "data": data, "checksum": hashlib.sha256(data).hexdigest(), "busids": busids}


def missing_busids(busids, sysfs):
    """The busids that are no ``bus/pci/devices`` entry under ``sysfs`` (domain ffff switches skipped), and the
    ones that are no PCI address at all."""
    missing, bad = [], []
    for busid in busids:
        norm = normalise_busid(busid)
        if norm is None:
            bad.append(busid)
        elif norm.split(":")[0] != VIRTUAL_DOMAIN and not os.path.exists(join(sysfs, "bus/pci/devices", norm)):
            missing.append(busid)
    return missing, bad


# ---------------------------------------------------------------- render --

def paths(p):
    """{kind: absolute path} of every file the module may own, from the options."""
    enroot = p["enroot_sysconf_path"].rstrip("/")
    return {
        "fstab": "%s/mounts.d/%s.fstab" % (enroot, p["file_prefix"]),
        "env": "%s/environ.d/%s.env" % (enroot, p["file_prefix"]),
        "cdi": "%s/%s" % (p["cdi_spec_dir"].rstrip("/"), CDI_FILE),
        "nccl_conf": p["nccl_conf_path"],
    }


def render_fstab(src, container_path, nccl_conf_path=None):
    lines = ["%s %s none %s 0 0\n" % (src, container_path, ENROOT_OPTIONS)]
    if nccl_conf_path:
        lines.append("%s %s none %s 0 0\n" % (nccl_conf_path, NCCL_CONF_CONTAINER, ENROOT_OPTIONS))
    return "".join(lines)


def render_env(container_path):
    return "NCCL_TOPO_FILE=%s\n" % container_path


def render_cdi(kind, src, container_path, nccl_conf_path=None):
    """The CDI spec as JSON (valid YAML): only the fields CDI knows, keys sorted, 2-space indent."""
    mounts = [{"hostPath": src, "containerPath": container_path, "options": list(MOUNT_OPTIONS)}]
    if nccl_conf_path:
        mounts.append({"hostPath": nccl_conf_path, "containerPath": NCCL_CONF_CONTAINER, "options": list(MOUNT_OPTIONS)})
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": CDI_DEVICE, "containerEdits": {"env": ["NCCL_TOPO_FILE=%s" % container_path], "mounts": mounts}}],
    }
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"


def render_nccl_conf(conf):
    return HEADER + "".join("%s=%s\n" % (k, conf[k]) for k in sorted(conf))


def _ours_nccl_conf(root, path):
    """Whether the nccl.conf at ``path`` was written by this module (its first line is HEADER)."""
    try:
        with open(rooted(root, path), "rb") as handle:
            return handle.readline() == HEADER.encode()
    except OSError:
        return False


def render(p, topo):
    """{path: (bytes, mode)} of what a present state installs."""
    where = paths(p)
    conf = where["nccl_conf"] if p["nccl_conf"] else None
    files = {}
    if "enroot" in p["runtimes"]:
        files[where["fstab"]] = (render_fstab(topo["path"], p["container_path"], conf).encode(), 0o644)
        files[where["env"]] = (render_env(p["container_path"]).encode(), 0o644)
    if "cdi" in p["runtimes"]:
        files[where["cdi"]] = (render_cdi(p["cdi_kind"], topo["path"], p["container_path"], conf).encode(), 0o644)
    if conf:
        files[conf] = (render_nccl_conf(p["nccl_conf"]).encode(), 0o644)
    return files


# ----------------------------------------------------------------- probe --

PROBE = ('echo "NCCL_TOPO_FILE=$NCCL_TOPO_FILE"; sha256sum "$NCCL_TOPO_FILE" 2>&1 || echo MISSING; '
         # Shell builtins and ls only: a minimal image (busybox) has no env or grep.
         'echo "%s"; export -p; echo "%s"; ls -1 /sys/class/infiniband 2>/dev/null; echo "%s"' % (
             "--gpunode-env--", "--gpunode-hca--", "--gpunode-end--"))
_EXPORT = re.compile(r"^(?:export|declare -x)\s+(NCCL_[A-Za-z0-9_]*)(?:=(.*))?$")


def _unquote(value):
    try:
        parts = shlex.split(value)
    except ValueError:
        return value
    return parts[0] if len(parts) == 1 else value


def parse_probe_extras(out):
    """The NCCL variables (``export -p`` of bash, dash or busybox) and the HCAs (``/sys/class/infiniband``) the probe
    saw inside the container: ``{"variables": {name: value}, "hcas": [...]}``; None for each part it did not print."""
    section, variables, hcas = None, None, None
    for line in (out or "").splitlines():
        line = line.rstrip("\r")
        if line == "--gpunode-env--":
            section, variables = "env", {}
            continue
        if line == "--gpunode-hca--":
            section, hcas = "hca", []
            continue
        if line == "--gpunode-end--":
            section = None
            continue
        if section == "env":
            m = _EXPORT.match(line)
            if m:
                variables[m.group(1)] = _unquote(m.group(2) or "")
        elif section == "hca" and line.strip():
            hcas.append(line.strip())
    return {"variables": variables, "hcas": None if hcas is None else sorted(hcas)}


def probe_command(verify, cdi_device):
    if verify["runtime"] == "podman":
        return ["podman", "run", "--rm", "--network", "none", "--device", cdi_device, verify["image"], "sh", "-c", PROBE]
    return ["enroot", "start", verify["image"], "sh", "-c", PROBE]


def parse_probe(out, container_path, want_sha):
    """What the probe printed inside the container: {variable_ok, file_ok, checksum_ok, message, variable, checksum}.

    ``message`` names the missing half: "the variable", "the file", or "a stale copy (checksum differs)"."""
    variable, checksum, missing = None, None, False
    for line in (out or "").splitlines():
        line = line.rstrip("\r")
        if variable is None and line.startswith("NCCL_TOPO_FILE="):
            variable = line[len("NCCL_TOPO_FILE="):]
            continue
        m = _SHA.match(line)
        if m and checksum is None:
            checksum = m.group(1)
        elif line.strip() == "MISSING":
            missing = True
    variable_ok = variable == container_path
    file_ok = checksum is not None and not missing
    checksum_ok = file_ok and checksum == want_sha
    if not variable_ok:
        message = ("the container lacks the variable: NCCL_TOPO_FILE is %s, want %s"
                   % ("unset or empty" if not variable else repr(variable), container_path))
        if not file_ok:
            message += ", and the file it names is not readable"
    elif not file_ok:
        message = "the container lacks the file: NCCL_TOPO_FILE=%s but %s is not readable there" % (container_path, container_path)
    elif not checksum_ok:
        message = ("the container has a stale copy (checksum differs): %s has sha256 %s there, the host file %s"
                   % (container_path, checksum, want_sha))
    else:
        message = "NCCL_TOPO_FILE=%s is set and the file there has the host file's sha256 %s" % (container_path, want_sha)
    return {"variable_ok": variable_ok, "file_ok": file_ok, "checksum_ok": checksum_ok, "message": message,
            "variable": variable, "checksum": checksum}


_LOG_THREAD = re.compile(r"^(\S+:\d+:\d+)\s")
_LOG_LOADING = re.compile(r"Loading topology file (\S+)")
_LOG_NOT_OPEN = re.compile(r"Could not open XML topology file (\S+)")
_LOG_ENV = re.compile(r"NCCL_TOPO_FILE set by environment to (\S+)")
# Lines NCCL prints once a topology file has been read, or when it starts on another XML file (the graph file):
# an "XML Parse" line after one of these, in the same thread, is not about the topology file.
_LOG_TOPO_DONE = ("=== System", "TOPO/NET", "NCCL_GRAPH_FILE", "Loading graphs", "XML graph file")


def nccl_log_loaded(text, path=None):
    """From ``NCCL_DEBUG=INFO`` log text: "parse_error", "not_found", "loaded" or "not_seen" for the configured
    topology file.

    ``path`` is the configured file, or a list of the names it goes by (the container path, and the host path where
    NCCL runs on the host); without it, the file the log's ``NCCL_TOPO_FILE set by environment to`` line names, else
    any. "loaded" is a ``Loading topology file`` line naming one of them; "not_found" a ``Could not open XML topology
    file`` line naming one; "parse_error" an ``XML Parse`` line (NCCL does not name the file in it) that follows, in
    the same thread (``host:pid:tid``), the loading line of one of them before NCCL went on to another file. An error
    wins over a loading line: NCCL logs that it loads a file before it fails to read it."""
    lines = (text or "").splitlines()
    if isinstance(path, str):
        wanted = {path}
    else:
        wanted = {item for item in (path or ()) if item}
    if not wanted:
        wanted = {m.group(1) for m in (_LOG_ENV.search(line) for line in lines) if m}

    def ours(name):
        return not wanted or name in wanted

    reading = {}  # thread -> the topology file NCCL is reading there (None once it has moved on)
    loaded = not_found = parse_error = False
    for line in lines:
        m = _LOG_THREAD.match(line)
        thread = m.group(1) if m else None
        m = _LOG_LOADING.search(line)
        if m:
            reading[thread] = m.group(1)
            loaded = loaded or ours(m.group(1))
            continue
        m = _LOG_NOT_OPEN.search(line)
        if m:
            not_found = not_found or ours(m.group(1))
            continue
        if "XML Parse" in line:
            name = reading.get(thread)
            parse_error = parse_error or (name is not None and ours(name))
        elif any(marker in line for marker in _LOG_TOPO_DONE):
            reading[thread] = None
    if parse_error:
        return "parse_error"
    if not_found:
        return "not_found"
    return "loaded" if loaded else "not_seen"


# -------------------------------------------------------------- converge --

def plan(params):
    """Decide one pass; raises TopoError before any change. Returns params, topology, files and actions."""
    p = check_params(params)
    root, where = p["root"], paths(p)
    topo, missing, bad = None, [], []
    files = {}
    if p["state"] == "present":
        topo = read_topology(root, p["src"], p.get("content"))
        if p["validate_pci"]:
            sysfs = p.get("sysfs_path") or "/sys"
            if not os.path.isdir(join(sysfs, "bus/pci/devices")):
                raise TopoError("sysfs_path %s has no bus/pci/devices" % sysfs, option="sysfs_path", value=sysfs,
                                path=join(sysfs, "bus/pci/devices"), expected="a sysfs root with bus/pci/devices")
            missing, bad = missing_busids(topo["busids"], sysfs)
            if bad or missing:
                raise TopoError(
                    "%s names PCI devices this host does not have: %s%s" % (
                        p["src"], ", ".join(missing) or "none missing",
                        "; not PCI addresses: %s" % ", ".join(bad) if bad else ""),
                    path=p["src"], value=missing + bad, missing_busids=missing, busids=topo["busids"],
                    expected="every busid under %s/bus/pci/devices" % sysfs)
        files = render(p, topo)
        if p.get("content") is not None:
            if p["src"] in files:
                raise TopoError("src %s is also a file this module writes" % p["src"], option="src", value=p["src"],
                                expected="a path other than %s" % ", ".join(sorted(files)))
            files[p["src"]] = (topo["data"], 0o644)
    if where["nccl_conf"] in files:
        # The nccl.conf is written whole, as the module's own (issue 27): one it did not write is refused.
        try:
            check_own_file("nccl_conf_path", rooted(root, where["nccl_conf"]), HEADER)
        except InputError as exc:
            raise TopoError(str(exc), **exc.details)
    owned = [where["fstab"], where["env"], where["cdi"]]
    if _ours_nccl_conf(root, where["nccl_conf"]):
        owned.append(where["nccl_conf"])
    remove = [path for path in owned if path not in files]
    actions = plan_files(files, remove, root)
    return {"params": p, "topo": topo, "files": files, "actions": actions, "missing": missing}


def verify_live(p, topo, run):
    """Start the probe container; raises TopoError with :func:`parse_probe`'s message when it fails."""
    cdi_device = "%s=%s" % (p["cdi_kind"], CDI_DEVICE)
    argv = probe_command(p["verify"], cdi_device)
    rc, out, err = run(argv)
    probe = parse_probe(out, p["container_path"], topo["checksum"])
    probe.update(parse_probe_extras(out))
    host_hcas = sorted(list_dir(join(p.get("sysfs_path") or "/sys", "class/infiniband")))
    probe["host_hcas"] = host_hcas
    probe["hcas_missing"] = None if probe["hcas"] is None else [h for h in host_hcas if h not in probe["hcas"]]
    report = dict(probe, runtime=p["verify"]["runtime"], image=p["verify"]["image"], command=argv, rc=rc)
    if rc != 0 and probe["variable"] is None:
        raise TopoError("verification failed: %s exited %d: %s" % (argv[0], rc, (err or out or "").strip()),
                        verify=report, command=" ".join(argv))
    if not (probe["variable_ok"] and probe["file_ok"] and probe["checksum_ok"]):
        raise TopoError("verification failed: %s" % probe["message"], verify=report, command=" ".join(argv))
    return report


def converge(params, run, check):
    """One pass: plan, write, verify. ``run`` runs podman/enroot (module_runner), None when not live.
    Returns the module's result (without ``diff``) and the diff list."""
    decided = plan(params)
    p, topo = decided["params"], decided["topo"]
    changes = [a for a in decided["actions"] if a["action"] != "unchanged"]
    if changes and not check:
        try:
            apply_files(decided["files"], changes, p["root"])
        except PersistError as exc:
            raise TopoError(str(exc), **exc.details)
    warnings = []
    result = {
        "changed": bool(changes),
        "files": [{k: a[k] for k in ("path", "action", "reason")} for a in decided["actions"]],
        "container_path": p["container_path"],
        "cdi_device": "%s=%s" % (p["cdi_kind"], CDI_DEVICE),
    }
    if topo is not None:
        result.update(checksum=topo["checksum"], busids=topo["busids"])
        if p["validate_pci"]:
            result["missing_busids"] = decided["missing"]
    if p.get("verify") and p["state"] == "present":
        result["verified"] = False
        if run is None:
            warnings.append("verify skipped: no command runner (root is not /)")
        else:
            if check and changes:
                # the drift report's question: does a job's container see it now? (check mode wrote nothing)
                warnings.append("verified against the files as they are now: check mode wrote none of the %d changes" % len(changes))
            result["verify"] = verify_live(p, topo, run)
            result["verified"] = True
    if p.get("nccl_log") is not None:
        # NCCL names the file as NCCL_TOPO_FILE does: the container path in a job's container, the host path where
        # NCCL runs on the host (src, or what the managed nccl.conf sets).
        names = [p["container_path"], topo["path"] if topo is not None else p.get("src"),
                 (p.get("nccl_conf") or {}).get("NCCL_TOPO_FILE")]
        result["nccl_log_status"] = nccl_log_loaded(p["nccl_log"], [name for name in names if name])
    result["warnings"] = warnings
    diff = [{"before_header": a["path"], "after_header": a["path"] if a["action"] != "remove" else "(absent)",
             "before": a["before"], "after": a["after"]} for a in changes]
    return result, diff
