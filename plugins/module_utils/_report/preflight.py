# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight gate and the drift report: module results turned into findings, a policy deciding which are fatal.

Private module_utils of gpunode.tuning, standard library only, no Ansible
imports; used on the controller by the ``preflight_collect`` and ``drift_collect``
filters, which hand the result to :func:`_report.cluster.build_report`.

* :func:`host_findings` turns one host's module results (``{source: result}``;
  sources in :data:`SOURCES`) into findings ``{check, status, message,
  evidence, fix, gpu}`` with ``check`` prefixed by its source
  (``platform:thp``, ``gpu:remapped_rows``, ``dcgm:memory``).
* :func:`check_policy` validates a policy; :func:`apply_policy` marks each
  finding ``fatal``. A policy is an ordered list of rules ``{check: <fnmatch
  pattern>, fatal: [statuses]}``; the first rule whose pattern matches a
  finding's check decides; a check no rule matches is fatal when it fails.
* :func:`drift_findings` turns the roles' ``*_report`` facts (their modules'
  own check-mode plans) into one finding per role: ``pass`` in sync, ``warn``
  with every planned change.
"""

from __future__ import annotations

import fnmatch
import math
import time

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import CpuListError, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._host.errors import DetailedError
from ansible_collections.gpunode.tuning.plugins.module_utils._report.findings import FATAL_STATUSES, finding

SOURCES = ("platform", "gpu", "cpu_power", "nic", "softnet", "nccl", "checkpoint")
# The default policy is playbooks/files/preflight_policy.yml (documented there); a unit test checks it.
# A failed module (its error message) is fatal whatever the policy says: a check that did not run cannot pass a gate.
CPU_POWER_STATUS = {"pass": "pass", "fail": "fail", "not_visible": "not_applicable", "unknown": "unknown"}
# idle: no user work and no traffic, nothing could be judged (a node before its job starts): not applicable.
SOFTNET_STATUS = {"no_contention": "pass", "contention": "fail", "inconclusive": "unknown", "idle": "not_applicable"}
# The roles' report facts, in tune.yml's order, and what in each is a change.
DRIFT_ROLES = ("nic_irq_pinning", "irqbalance", "isolcpus", "cpusets", "cpu_power", "slurm_cpuspec", "nccl_topology",
               "checkpoint_staging")
# checkpoint:durable: a complete checkpoint staged longer than this is late (preflight.yml passes
# preflight_checkpoint_max_pending_seconds as the result's preflight_max_pending_seconds).
CHECKPOINT_MAX_PENDING_SECONDS = 900
CHECKPOINT_FIX = "run tune.yml with gpunode_tune_checkpoint_staging"


class PreflightError(DetailedError):
    """A policy or a results structure that is not what the preflight playbook builds."""


# -------------------------------------------------------------------- policy --

def check_policy(policy):
    """The policy, validated: ``{"rules": [{"check": str, "fatal": [status...]}...]}``; raises PreflightError naming the
    rule, the value and what was expected."""
    if not isinstance(policy, dict) or set(policy) - {"rules"} or not isinstance(policy.get("rules"), list):
        raise PreflightError("the preflight policy must be a mapping with one key, rules (a list)", value=policy,
                             expected="{rules: [{check: PATTERN, fatal: [STATUS, ...]}, ...]}")
    rules = []
    for index, rule in enumerate(policy["rules"]):
        where = "rules[%d]" % index
        if not isinstance(rule, dict) or set(rule) != {"check", "fatal"}:
            raise PreflightError("policy %s must have exactly the keys check and fatal" % where, rule=where, value=rule,
                                 expected="{check: PATTERN, fatal: [STATUS, ...]}")
        if not isinstance(rule["check"], str) or not rule["check"].strip():
            raise PreflightError("policy %s check %r is not a check pattern" % (where, rule["check"]), rule=where,
                                 value=rule["check"], expected="a check id or fnmatch pattern such as gpu:* or platform:thp")
        fatal = rule["fatal"]
        if not isinstance(fatal, list):
            raise PreflightError("policy %s (check %s) fatal %r is not a list of statuses" % (where, rule["check"], fatal),
                                 rule=where, value=fatal, expected="a list drawn from %s" % ", ".join(FATAL_STATUSES))
        bad = [s for s in fatal if s not in FATAL_STATUSES]
        if bad:
            raise PreflightError("policy %s (check %s) fatal has %s, which is not a status that can be fatal; the "
                                 "statuses are %s" % (where, rule["check"], ", ".join(repr(s) for s in bad),
                                                      ", ".join(FATAL_STATUSES)),
                                 rule=where, value=bad[0], expected="a list drawn from %s" % ", ".join(FATAL_STATUSES))
        rules.append({"check": rule["check"].strip(), "fatal": list(fatal)})
    return {"rules": rules}


def fatal_statuses(policy, check):
    for rule in policy["rules"]:
        if fnmatch.fnmatchcase(check, rule["check"]):
            return rule["fatal"]
    return ["fail"]


def apply_policy(findings, policy):
    """Each finding with ``fatal`` set by the first matching rule (a new list)."""
    return [dict(f, fatal=f["status"] in fatal_statuses(policy, f["check"])) for f in findings]


# ------------------------------------------------------------------ adapters --

def _prefixed(source, findings):
    out = []
    for item in findings:
        check = item["check"] if ":" in item["check"] else "%s:%s" % (source, item["check"])
        out.append(dict(item, check=check, source=source))
    return out


def _cpu_power(result):
    out = []
    for item in result.get("findings") or []:
        status = CPU_POWER_STATUS.get(item["status"], "unknown")
        message = item["message"]
        if item["status"] == "not_visible":
            message = "not visible: %s" % message
        extra = {"pid": item["pid"]} if "pid" in item else {}
        out.append(finding("cpu_power:%s" % item["check"], status, message, evidence=item.get("verdict"), **extra))
    return out


def _softnet(result):
    verdict = result.get("verdict")
    status = SOFTNET_STATUS.get(verdict, "unknown")
    reasons = result.get("reasons") or []
    fix = None
    if status == "fail":
        fix = "pin the NIC queue IRQs to dedicated CPUs and fence the workload off them (tune.yml: nic_irq_pinning, cpusets)"
    evidence = {"verdict_rule": result.get("verdict_rule"), "irq_cpus": result.get("irq_cpus"), "hot_cpus": result.get("hot_cpus"),
                "irq_cpus_source": result.get("irq_cpus_source"), "totals": result.get("totals")}
    out = [finding("softnet:contention", status, "%s: %s" % (verdict or "no verdict", "; ".join(reasons) or "no reasons"),
                   evidence=evidence, fix=fix)]
    # IRQ CPUs saturated by packet rate: reported beside the verdict (warn), with its own remedy.
    for item in result.get("findings") or []:
        if item.get("name") == "irq_cpus_saturated":
            out.append(finding("softnet:irq_saturation", "warn", "%s: %s" % (item.get("title"), item.get("reason")),
                               evidence={"cpus": item.get("cpus")}, fix=item.get("remedy")))
    return out


def _nic(result):
    """IRQ layout: one queue IRQ per CPU on distinct CPUs passes; shared CPUs or IRQs spread over many CPUs warn;
    irqbalance running without banning the IRQ CPUs warns (it will move them)."""
    facts = (result.get("ansible_facts") or {}).get("nic_irq") or result
    queues = [i for i in facts.get("irqs") or [] if i.get("kind") == "queue"]
    name = "%s (%s, %s)" % (facts.get("interface"), facts.get("driver"), facts.get("pci_address"))
    if not queues:
        return [finding("irq:layout", "warn", "%s has no queue IRQs" % name, evidence=None,
                        fix="check that the NIC is up and uses MSI-X (some NICs request IRQs only when opened)")]
    where = {}
    for irq in queues:
        cpus = irq.get("effective_affinity_list") or irq.get("affinity_list") or "?"
        where[irq["irq"]] = cpus
    single = all(c.isdigit() for c in where.values())
    shared = len(set(where.values())) < len(where)
    evidence = {"interface": facts.get("interface"), "pci_address": facts.get("pci_address"),
                "irq_cpus": dict((str(k), v) for k, v in sorted(where.items()))}
    found = []
    if single and not shared:
        found.append(finding("irq:layout", "pass", "%s: %d queue IRQs, one per CPU (%s)" % (
            name, len(where), ",".join(where[k] for k in sorted(where))), evidence=evidence))
    else:
        why = "several queue IRQs share a CPU" if single else "queue IRQs may land on several CPUs each"
        found.append(finding("irq:layout", "warn", "%s: %s" % (name, why), evidence=evidence,
                             fix="pin one queue IRQ per dedicated CPU (the nic_irq_pinning role)"))
    balance = facts.get("irqbalance") or {}
    if balance.get("active"):
        banned = set(balance.get("banned_cpus") or [])
        used = set()
        for cpus in where.values():
            try:
                used.update(parse_cpulist(cpus))
            except CpuListError:
                continue
        if not used:
            found.append(finding("irq:irqbalance", "unknown", "irqbalance runs, and the CPUs of the queue IRQs could not be "
                                 "read: whether it bans them is not known", evidence=balance,
                                 fix="check /proc/irq/N/effective_affinity_list of the queue IRQs"))
        elif used - banned:
            found.append(finding("irq:irqbalance", "warn", "irqbalance runs and does not ban the IRQ CPUs %s: it may move the IRQs" % (
                ",".join(str(c) for c in sorted(used - banned))), evidence=balance,
                fix="ban the IRQ CPUs (irqbalance role, mode banned) or stop irqbalance"))
        else:
            found.append(finding("irq:irqbalance", "pass", "irqbalance runs and bans the IRQ CPUs", evidence=balance))
    else:
        found.append(finding("irq:irqbalance", "pass", "irqbalance does not run", evidence=balance))
    return found


def _nccl(result):
    """nccl_topo_mount run in check mode with verify: the topology in the container, the HCAs and the NCCL variables."""
    verify = result.get("verify") or {}
    out = []
    if result.get("failed") and not verify:
        return [finding("nccl:topology", "fail", result.get("msg") or "nccl_topo_mount failed",
                        fix="run tune.yml with gpunode_tune_nccl_topology")]
    drift = [f for f in result.get("files") or [] if f.get("action") != "unchanged"]
    if result.get("failed"):
        out.append(finding("nccl:topology", "fail", result.get("msg") or verify.get("message"), evidence=verify,
                           fix="run tune.yml with gpunode_tune_nccl_topology"))
    elif drift:
        out.append(finding("nccl:topology", "fail", "the NCCL topology files differ from the desired state: %s" % ", ".join(
            "%s %s" % (f["action"], f["path"]) for f in drift), evidence=drift, fix="run tune.yml with gpunode_tune_nccl_topology"))
    elif verify:
        out.append(finding("nccl:topology", "pass", verify.get("message"), evidence={"command": verify.get("command")}))
    else:
        out.append(finding("nccl:topology", "unknown", "the files are in place but no container was started to check them",
                           fix="give nccl_topo_mount verify (runtime and image)"))
    if verify.get("hcas") is not None:
        missing = verify.get("hcas_missing") or []
        hosts = verify.get("host_hcas") or []
        if not hosts:
            out.append(finding("nccl:container_hcas", "not_applicable", "the host has no RDMA device (/sys/class/infiniband is empty)"))
        elif missing:
            out.append(finding("nccl:container_hcas", "fail", "the container does not see the HCAs %s" % ", ".join(missing),
                               evidence={"host": hosts, "container": verify["hcas"]},
                               fix="pass the RDMA devices into the container (CDI, --device /dev/infiniband, pyxis/enroot hooks)"))
        else:
            out.append(finding("nccl:container_hcas", "pass", "the container sees every host HCA: %s" % ", ".join(hosts),
                               evidence={"host": hosts, "container": verify["hcas"]}))
    if verify.get("variables") is not None:
        variables = verify["variables"]
        out.append(finding("nccl:variables", "pass", "NCCL variables inside: %s" % (
            ", ".join("%s=%s" % kv for kv in sorted(variables.items())) or "none"), evidence=variables))
    return out


def _utc(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _number(value):
    return "%d" % value if float(value).is_integer() else "%s" % value


def _max_pending(result):
    """The checkpoint:durable threshold in seconds: preflight_max_pending_seconds (a number, or its text as -e gives
    it), else CHECKPOINT_MAX_PENDING_SECONDS."""
    value = result.get("preflight_max_pending_seconds")
    if value is None:
        return CHECKPOINT_MAX_PENDING_SECONDS
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            seconds = None
    if seconds is None or math.isnan(seconds) or seconds < 0:
        raise PreflightError("preflight_checkpoint_max_pending_seconds %r is not a number of seconds" % (value,),
                             option="preflight_checkpoint_max_pending_seconds", value=value, expected="seconds, 0 or more")
    return seconds


def _checkpoint_copier(result):
    """Installed as configured: the module's plan (files, the staging directory, systemd) is empty."""
    if result.get("failed"):
        return finding("checkpoint:copier", "fail", result.get("msg") or "checkpoint_staging failed",
                       evidence={k: v for k, v in result.items() if k in ("option", "value", "expected")} or None,
                       fix="fix what the message names, then %s" % CHECKPOINT_FIX)
    if "config" not in result:
        return finding("checkpoint:copier", "not_applicable", "checkpoint_staging_state is absent: no copier is wanted here")
    files = result.get("files") or []
    changes = ["%s %s (%s)" % (f["action"], f["path"], f["reason"]) for f in files if f.get("action") != "unchanged"]
    others = []
    staging = result.get("staging") or {}
    if staging.get("action", "unchanged") != "unchanged":
        others.append("%s staging directory %s (%s)" % (staging["action"], staging.get("path"), staging.get("reason")))
    others += ["systemctl %s" % action for action in result.get("systemd") or []]
    cfg = result["config"]
    if files and all(f.get("action") == "create" for f in files):
        # Nothing of it on the node: the count of files, not each library file.
        return finding("checkpoint:copier", "fail", "the copier is not installed: %d file(s) to create; %s" % (
            len(files), "; ".join(others)), evidence=changes + others, fix=CHECKPOINT_FIX)
    changes += others
    if changes:
        shown = "; ".join(changes[:5]) + ("; and %d more" % (len(changes) - 5) if len(changes) > 5 else "")
        return finding("checkpoint:copier", "fail", "the copier differs from the desired state: %d change(s): %s" % (
            len(changes), shown), evidence=changes, fix=CHECKPOINT_FIX)
    placement = result.get("placement") or {}
    return finding("checkpoint:copier", "pass", "installed and running: %s -> %s (%s %s on %s)" % (
        cfg.get("staging_dir"), cfg.get("target_dir"), placement.get("target_fstype"), placement.get("target_source"),
        placement.get("target_mount")), evidence={"placement": placement, "completion": cfg.get("completion")})


def _checkpoint_durable(result, copier):
    """Complete checkpoints staged longer than the threshold are not yet on shared storage; incomplete ones (being
    written) never fail; quarantined ones (the copier's status) always fail."""
    limit = _max_pending(result)
    staged = copier.get("staged") or []
    complete = sorted((e for e in staged if e.get("complete")), key=lambda e: -e["age_seconds"])
    writing = ["%s: %s" % (e["name"], e.get("why")) for e in staged if not e.get("complete")]
    late = [e for e in complete if e["age_seconds"] > limit]
    evidence = {"complete": ["%s %.0f s" % (e["name"], e["age_seconds"]) for e in complete], "being_written": writing,
                "max_pending_seconds": limit}
    tail = "; %d being written (never copied until complete): %s" % (len(writing), ", ".join(writing)) if writing else ""
    # Quarantined by the copier after repeated failures (or a name conflict with on_conflict keep): never durable
    # until someone acts, whatever their age.
    quarantined = [q for q in copier.get("quarantined") or [] if isinstance(q, dict)]
    if quarantined:
        evidence["quarantined"] = ["%s: %s" % (q.get("name"), q.get("reason")) for q in quarantined]
        return finding("checkpoint:durable", "fail", "%d checkpoint(s) quarantined by the copier, never copied until fixed: "
                       "%s%s" % (len(quarantined), "; ".join(evidence["quarantined"][:3]),
                                 "; and %d more" % (len(quarantined) - 3) if len(quarantined) > 3 else ""),
                       evidence=evidence, fix="fix or remove each named entry in staging (an entry that changes is tried "
                       "again; gpunode-ckpt-copier --force tries every one now); journalctl -t gpunode-ckpt-copier has "
                       "every attempt")
    if late:
        return finding("checkpoint:durable", "fail", "%d complete checkpoint(s) not yet on shared storage, oldest %s %.0f s "
                       "(limit %s s)%s" % (len(late), late[0]["name"], late[0]["age_seconds"], _number(limit), tail),
                       evidence=evidence, fix="see checkpoint:target and journalctl -t gpunode-ckpt-copier for why the "
                       "copier has not moved them")
    if complete:
        return finding("checkpoint:durable", "pass", "%d complete checkpoint(s) waiting for the copier, oldest %s %.0f s "
                       "(limit %s s)%s" % (len(complete), complete[0]["name"], complete[0]["age_seconds"], _number(limit), tail),
                       evidence=evidence)
    return finding("checkpoint:durable", "pass", "no complete checkpoint waiting: every one is on shared storage%s" % tail,
                   evidence=evidence)


def _checkpoint_target(copier):
    """The target's own health: its last failure (probe, mount check, hung copy, a target errno) not yet cleared by a
    copy or a successful probe. A failure of one entry (a refused link, a FIFO, a name conflict) says nothing about
    the target: it is checkpoint:durable's (failing and quarantined entries). A copier status without
    ``last_target_error`` (an older copier) is judged as before: a pending backoff or a last error newer than the
    last copy."""
    error = copier.get("last_error")
    recent = copier.get("recent") or []
    last_copy = recent[-1].get("at") if recent else None
    until = copier.get("backoff_until")
    evidence = {"last_error": error, "backoff_until": until, "last_pass": copier.get("last_pass"),
                "copied": copier.get("copied"), "retried": copier.get("retried")}
    if "last_target_error" in copier:
        target_error = copier.get("last_target_error")
        evidence["last_target_error"] = target_error
        failing = bool(target_error)
    else:
        target_error = error
        failing = bool(until or (error and (last_copy is None or error.get("at", 0) > last_copy)))
    if failing:
        target_error = target_error or {}
        what = "the copy of %s failed" % target_error["entry"] if target_error.get("entry") else \
            "the copier cannot reach the target"
        # copier_status carries no clock of its own: the backoff's end is shown, not judged against now.
        retry = "retrying (backoff until %s)" % _utc(until) if until else "retrying"
        return finding("checkpoint:target", "fail", "%s: %s, %s (%s failed attempt(s) in all)" % (
            what, target_error.get("reason") or "no reason recorded", retry, copier.get("retried")), evidence=evidence,
            fix="check the NFS mount of %s from this host (journalctl -t gpunode-ckpt-copier has every attempt)" % (
                copier.get("target_dir")))
    if error and (last_copy is None or error.get("at", 0) > last_copy):
        entry = "%s " % error["entry"] if error.get("entry") else ""
        message = ("no failure of the target pending (the last error, %sat %s, was of one entry or was cleared since "
                   "by a successful probe: %s); entries that fail are checkpoint:durable's" % (
                       entry, _utc(error.get("at", 0)), error.get("reason")))
    elif error:
        message = "no failed attempt since the last copy (%s copied; the last error, at %s, was before it: %s)" % (
            copier.get("copied"), _utc(error.get("at", 0)), error.get("reason"))
    elif copier.get("copied"):
        message = "no failed attempt: %s copied, the last at %s" % (copier.get("copied"), _utc(last_copy or 0))
    else:
        message = "nothing copied yet and no failed attempt (the copier probes the target when a checkpoint is complete)"
    return finding("checkpoint:target", "pass", message, evidence=evidence)


def _checkpoint_usage(result, copier):
    """The staging filesystem at or above the watermark: the copier warns and raises the pause flag."""
    cfg = result.get("config") or {}
    usage, mark, pause = copier.get("usage_percent"), cfg.get("watermark_percent"), cfg.get("pause_file")
    evidence = {"usage_percent": usage, "watermark_percent": mark, "pause_file": pause, "staged_bytes": copier.get("staged_bytes")}
    if usage is None or mark is None:
        return finding("checkpoint:staging_usage", "unknown", "the staging filesystem's usage was not read", evidence=evidence)
    if usage >= mark:
        told = ("the copier creates %s: the trainer is told to pause checkpointing" % pause if pause
                else "no pause_file is set: the trainer is not told to pause")
        return finding("checkpoint:staging_usage", "fail", "staging %s is %.1f %% full, at or above the watermark %s %%: %s" % (
            copier.get("staging_dir"), usage, mark, told), evidence=evidence,
            fix="free the staging filesystem (checkpoint:durable and checkpoint:target say whether the copier is behind) "
                "or keep fewer checkpoints on it")
    return finding("checkpoint:staging_usage", "pass", "staging %s is %.1f %% full, watermark %s %%" % (
        copier.get("staging_dir"), usage, mark), evidence=evidence)


def _checkpoint(result):
    """checkpoint_staging run in check mode (the role): installed as configured, checkpoints durable in time, the
    target reachable, staging below the watermark. Without the copier's status (the module failed, or the staging
    directory is missing so nothing was ever staged) only checkpoint:copier is reported."""
    out = [_checkpoint_copier(result)]
    copier = result.get("copier_status")
    if result.get("failed") or not isinstance(copier, dict):
        return out
    out.append(_checkpoint_durable(result, copier))
    out.append(_checkpoint_target(copier))
    out.append(_checkpoint_usage(result, copier))
    return out


def _module_findings(source, result):
    if not isinstance(result, dict):
        raise PreflightError("the %s result is not a mapping" % source, source=source, value=result, expected="a module result")
    if result.get("skipped"):
        return []
    if source == "nccl":
        return _prefixed(source, _nccl(result))
    if source == "checkpoint":
        return _prefixed(source, _checkpoint(result))
    if result.get("failed"):
        return _prefixed(source, [finding(
            "%s:check" % source, "fail", "the %s check failed: %s" % (source, result.get("msg") or "no message"),
            evidence={k: v for k, v in result.items() if k in ("option", "value", "expected", "path")} or None,
            fix="fix the error above and rerun the preflight")])
    if source == "cpu_power":
        return _prefixed(source, _cpu_power(result))
    if source == "softnet":
        return _prefixed(source, _softnet(result))
    if source == "nic":
        return _prefixed(source, _nic(result))
    return _prefixed(source, result.get("findings") or [])


def host_findings(results):
    """Every finding of one host's ``{source: module result}``, in :data:`SOURCES` order."""
    if not isinstance(results, dict):
        raise PreflightError("a host's results are not a mapping", value=results, expected="{source: module result}")
    unknown = sorted(set(results) - set(SOURCES))
    if unknown:
        raise PreflightError("unknown preflight sources %s" % ", ".join(unknown), value=unknown, expected=list(SOURCES))
    out = []
    for source in SOURCES:
        if source in results and results[source] is not None:
            out.extend(_module_findings(source, results[source]))
    return out


def collect(results, policy):
    """``{host: {"results": {source: result}, "error": str|None}}`` -> build_report's ``hosts`` (findings with
    ``fatal``)."""
    policy = check_policy(policy)
    hosts = {}
    for host, data in results.items():
        if not isinstance(data, dict):
            raise PreflightError("host %s has no results mapping" % host, host=host, value=data, expected="{results, error}")
        hosts[host] = {"findings": apply_policy(host_findings(data.get("results") or {}), policy), "error": data.get("error")}
    return hosts


# --------------------------------------------------------------------- drift --

# The collection's own library as nic_irq_persist and checkpoint_staging install it (lib_dir/ansible_collections/...,
# its manifest and the bytecode Python wrote): summarised in one line of the drift report, never listed file by file.
LIBRARY_MARK = "/ansible_collections/"
LIBRARY_MANIFEST = ".gpunode-tuning-installed.json"
# The drift report's order: what changes how the node runs first, the files that carry it after.
CHANGE_KINDS = ("irq", "value", "unit", "file", "library")


def _library_dir(path):
    """The lib_dir of a library file of the collection, or None for any other path."""
    if LIBRARY_MARK in path:
        return path.split(LIBRARY_MARK, 1)[0] or "/"
    if path.rsplit("/", 1)[-1] == LIBRARY_MANIFEST:
        return path.rsplit("/", 1)[0] or "/"
    return None


def _change_kinds(report, kinds):
    """Every planned change in one role's report fact, sorted into ``kinds`` ({kind: [line or file action]})."""
    if not isinstance(report, dict):
        return
    for item in report.get("files") or []:
        if isinstance(item, str):
            # slurm_cpuspec lists the files it changes (would change) by name.
            kinds["file"].append("change %s" % item)
        elif isinstance(item, dict) and item.get("action", "unchanged") != "unchanged":
            if _library_dir(str(item.get("path"))) is not None:
                kinds["library"].append(item)
            else:
                kinds["file"].append("%s %s%s" % (item["action"], item.get("path"),
                                                  (" (%s)" % item["reason"]) if item.get("reason") else ""))
    for item in report.get("drift") or []:
        kinds["irq"].append("IRQ %s" % item)
    for item in report.get("writes") or []:
        kinds["value"].append("write %s: %s -> %s" % (item.get("path"), item.get("before"), item.get("after")))
    for key in ("systemd", "systemctl"):
        for item in report.get(key) or []:
            kinds["unit"].append("%s %s" % (key, item))
    if report.get("restart"):
        kinds["unit"].append("restart the service")
    settings = report.get("settings")
    if isinstance(settings, dict):
        _change_kinds(settings, kinds)
        _change_kinds(settings.get("kernel_cmdline"), kinds)


def _library_line(items):
    """One line for every library file change: the count, where, and how many of each action."""
    dirs = sorted(set(_library_dir(str(item.get("path"))) for item in items))
    actions = {}
    for item in items:
        actions[item["action"]] = actions.get(item["action"], 0) + 1
    return "%d library file%s of the collection under %s (%s)" % (
        len(items), "" if len(items) == 1 else "s", ", ".join(dirs),
        ", ".join("%s %d" % (action, actions[action]) for action in sorted(actions)))


def _changes(report):
    """Every planned change in one role's report fact, as text lines: IRQ moves, values, units, files, then the
    collection's library in one line."""
    kinds = dict((kind, []) for kind in CHANGE_KINDS)
    _change_kinds(report, kinds)
    lines = kinds["irq"] + kinds["value"] + kinds["unit"] + kinds["file"]
    if kinds["library"]:
        lines.append(_library_line(kinds["library"]))
    return lines


def _file_actions(report, out):
    """Every changed file's action in one role's report fact (nested settings too), as (action, reason)."""
    if not isinstance(report, dict):
        return out
    for item in report.get("files") or []:
        if isinstance(item, str):
            out.append(("change", ""))
        elif isinstance(item, dict) and item.get("action", "unchanged") != "unchanged":
            out.append((item["action"], item.get("reason") or ""))
    settings = report.get("settings")
    if isinstance(settings, dict):
        _file_actions(settings, out)
        _file_actions(settings.get("kernel_cmdline"), out)
    return out


def never_tuned(report):
    """True when the role has installed nothing yet: it plans files and every one is a create of a missing file
    (a node tune.yml never ran on, not a node someone changed)."""
    actions = _file_actions(report, [])
    return bool(actions) and all(action == ("create", "missing") for action in actions)


def drift_findings(reports, applied=False):
    """One finding per role that ran (``{role: its report fact}``, DRIFT_ROLES order): pass when in sync, warn with
    every planned change (IRQ moves, values and units first, the library in one line); ``fatal`` true on drift (the
    drift report's gate says DRIFT). A role that has installed nothing yet says "not tuned yet", not drift.

    ``applied``: the reports of a run without --check, whose changes were made (a role that failed fails the play):
    every change is listed as made, and none is drift."""
    out = []
    for role in DRIFT_ROLES:
        report = reports.get(role)
        if report is None or isinstance(report, str):
            continue
        lines = _changes(report)
        if lines and applied:
            message = "tuned: %d change(s) made: %s" % (len(lines), "; ".join(lines))
            out.append(dict(finding(role, "pass", message, evidence=lines), fatal=False))
        elif lines and never_tuned(report):
            message = "not tuned yet: %d change(s) to make: %s" % (len(lines), "; ".join(lines))
            out.append(dict(finding(role, "warn", message, evidence=lines,
                                    fix="run tune.yml without --check to tune this node"), fatal=True))
        elif lines:
            message = "drift: %d change(s): %s" % (len(lines), "; ".join(lines))
            out.append(dict(finding(role, "warn", message, evidence=lines,
                                    fix="run tune.yml without --check to put it back, then find who or what changed "
                                        "the host (a package update, a hand edit, another tool)"), fatal=True))
        else:
            out.append(dict(finding(role, "pass", "in sync", evidence=None), fatal=False))
    return out


def drift_collect_hosts(results, applied=False):
    """``{host: {"reports": {role: report}, "error": str|None}}`` -> build_report's ``hosts`` (``applied``: as
    ``drift_findings``)."""
    hosts = {}
    for host, data in results.items():
        if not isinstance(data, dict):
            raise PreflightError("host %s has no reports mapping" % host, host=host, value=data, expected="{reports, error}")
        hosts[host] = {"findings": drift_findings(data.get("reports") or {}, applied), "error": data.get("error")}
    return hosts
