# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check, part 3 of 4: the verdict (pure).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``judge`` turns the numbers of ``_softnet.signals.compute_signals``,
the IRQ CPUs and the thresholds into a verdict and reasons that quote the
numbers. The verdict is the table ``RULES``: tried in order, the first rule
whose condition holds gives the verdict. ``describe_rules`` renders the same
table as text for the diagnose report; the module documentation lists it too
(a unit test keeps the three in step).

The question the verdict answers is seed 000's: do the NIC's interrupt work
and the workload compete for the same CPUs? ``contention`` needs, on one IRQ
CPU, softirq and user work at or above their thresholds together with
squeezes at or above ``squeeze_rate`` per second, and those CPUs must carry
most of the squeezes. When no IRQ CPU runs user work the answer is
``no_contention`` whatever the squeezes; squeezes on IRQ CPUs that run
nothing else are a separate finding (``FINDINGS``: IRQ CPUs saturated by
packet rate). ``idle`` says that nothing can be judged: no user work and no
traffic. docs/verdicts.md explains each rule and threshold.

``DEFAULT_THRESHOLDS`` is the one definition of the threshold defaults: the
module's argument spec takes its defaults from it.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._parse.cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._parse.procfs import SoftnetError

VERDICTS = ("contention", "inconclusive", "no_contention", "idle")

DEFAULT_THRESHOLDS = {
    # Squeezes per second on one CPU at or above which that CPU "squeezes". Seed 000 calls contention "hundreds
    # of squeezes per 10 seconds" on CPUs 0-10 of one 176-vCPU node at 7 Gbit/s ("100-200 squeeze events per 10
    # seconds" in its example): read as the total over its 11 IRQ CPUs that is 0.9-1.8 per CPU per second, the
    # lowest reading of the article; "a healthy machine shows +0 everywhere". The recorded lab runs
    # (benchmarks/closed_loop_results.json): 7.8 per second (78 in 10.03 s) on the one IRQ CPU that also ran a
    # worker, 18.9 in an earlier run of the same setup; an idle lab guest squeezes about 0.2 per second (3 in
    # 15 s, molecule/softnet). 0.5 sits between the noise and the article's lowest reading. A per-CPU rate does
    # not grow with the number of IRQ CPUs, which an absolute total per node did (100 per 10 s meant 0.9 per
    # second per CPU on 11 CPUs, 10 on one).
    "squeeze_rate": 0.5,
    # Share of all squeezes (every CPU) that the shared CPUs must carry: seed 000's "CPUs 0-10 show hundreds
    # ... while the rest of the machine shows none".
    "squeeze_share_pct": 50.0,
    # Seed 000: soft in the 5-20 % range together with usr in the 40-70 % range.
    "softirq_pct": 5.0,
    "user_pct": 40.0,
    # Seed 000: "only a few percent of the interface's bandwidth".
    "max_link_util_pct": 10.0,
    # Packets per second (received + sent on the interface; without one, packets processed by every CPU) below
    # which the NIC counts as idle. Seed 000: "on an idle VM every check below will correctly report nothing".
    "idle_pps": 100.0,
}


def format_number(number, digits=2, unknown="unknown"):
    """``number`` with at most ``digits`` decimals and no trailing zeros after the point (50, 12.5, 0.25);
    ``unknown`` for None. Shared by the reasons and the diagnose report."""
    if number is None:
        return unknown
    if isinstance(number, int) and not isinstance(number, bool):
        return "%d" % number
    text = "%.*f" % (digits, number)
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_fmt = format_number


def validate_thresholds(thresholds):
    """Merge ``thresholds`` over the defaults; every value must be >= 0."""
    merged = dict(DEFAULT_THRESHOLDS)
    for key, value in (thresholds or {}).items():
        if key not in DEFAULT_THRESHOLDS:
            raise SoftnetError("unknown threshold %r" % key, value=key, expected=sorted(DEFAULT_THRESHOLDS))
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SoftnetError(
                "threshold %s=%r is not a number >= 0" % (key, value), value=value, expected="a number >= 0"
            )
        merged[key] = float(value)
    return merged


# --------------------------------------------------------------------------
# the rules
# --------------------------------------------------------------------------


class Facts(object):
    """What the rules look at: the numbers of one sample, the IRQ CPUs and the thresholds (``limits``)."""

    def __init__(self, signals, irq_cpus, limits, irq_cpus_why=None):
        self.limits = limits
        self.elapsed = signals["elapsed"]
        self.irq_set = set(irq_cpus or [])
        self.irq_cpus_why = irq_cpus_why
        self.cpus = signals["cpus"]
        self.link = signals.get("link")
        self.window = "%s s" % _fmt(self.elapsed)
        squeezes = dict((row["cpu"], row["time_squeeze"] or 0) for row in self.cpus)
        self.squeezes = squeezes
        self.total = sum(squeezes.values())
        self.on_irq = sum(count for cpu, count in squeezes.items() if cpu in self.irq_set)
        self.elsewhere = dict((cpu, count) for cpu, count in squeezes.items() if cpu not in self.irq_set and count > 0)
        measured = [row for row in self.cpus if row["usr"] is not None]
        self.irq_rows = [row for row in measured if row["cpu"] in self.irq_set]
        self.user_cpus = [row["cpu"] for row in measured if row["usr"] >= limits["user_pct"]]
        self.irq_user = [row["cpu"] for row in self.irq_rows if row["usr"] >= limits["user_pct"]]
        self.busy = [row["cpu"] for row in self.irq_rows if self.user_and_softirq(row)]
        self.contended = [cpu for cpu in self.busy if self.rate(squeezes[cpu]) >= limits["squeeze_rate"]]
        # The squeezes of the IRQ CPUs that run user work, whether or not their softirq share reached softirq_pct:
        # /proc/stat samples softirq time per tick, and a user-busy IRQ CPU's squeezes are the same contention
        # (closed-loop run of 2026-12-05: CPU 5 usr 81.7 %, soft 4.17 %, 42 of 65 squeezes were "elsewhere").
        self.on_busy = sum(squeezes[cpu] for cpu in self.irq_user)
        self.share = self.on_busy * 100.0 / self.total if self.total else 0.0
        self.saturated = [
            row["cpu"] for row in self.irq_rows
            if row["usr"] < limits["user_pct"] and self.rate(squeezes[row["cpu"]]) >= limits["squeeze_rate"]
        ]
        self.hot = sorted(
            row["cpu"] for row in self.cpus
            if (row["time_squeeze"] or 0) > 0 and self.rate(row["time_squeeze"]) >= limits["squeeze_rate"]
            or (row["usr"] is not None and self.user_and_softirq(row))
        )
        self.util = self.link.get("utilisation_pct") if self.link else None
        self.pps, self.pps_source = self._packets_per_second()

    def _packets_per_second(self):
        link = self.link
        if link and link.get("rx_packets") is not None:
            packets = (link.get("rx_packets") or 0) + (link.get("tx_packets") or 0)
            return packets * 1.0 / self.elapsed, "%s rx + tx" % link["interface"]
        processed = [row.get("processed") for row in self.cpus if row.get("processed") is not None]
        if processed:
            return sum(processed) * 1.0 / self.elapsed, "packets processed by all CPUs"
        return None, None

    def user_and_softirq(self, row):
        return (
            row["soft"] is not None
            and row["soft"] >= self.limits["softirq_pct"]
            and row["usr"] >= self.limits["user_pct"]
        )

    def rate(self, count):
        """Squeezes per second."""
        return count * 1.0 / self.elapsed

    def per10(self, count):
        return count * 10.0 / self.elapsed

    def squeeze_text(self, count):
        return "%s in %s (%s per s)" % (_fmt(count), self.window, _fmt(self.rate(count)))

    def cpu_squeezes(self, cpus):
        return ", ".join("CPU %d %s" % (cpu, self.squeeze_text(self.squeezes[cpu])) for cpu in cpus)

    def irq_cpulist(self):
        return format_cpulist(sorted(self.irq_set))

    def link_numbers(self):
        link = self.link
        return "%s %% of %s Mbit/s (rx %s, tx %s Mbit/s)" % (
            _fmt(self.util), _fmt(link["speed_mbps"]), _fmt(link["rx_mbps"]), _fmt(link["tx_mbps"])
        )

    def pps_text(self):
        return "%s packets/s (%s)" % (_fmt(round(self.pps, 1)), self.pps_source)


class Rule(object):
    """One row of the verdict table.

    ``condition`` says in words when the rule holds, with ``{threshold}``
    placeholders; ``holds(facts)`` decides it. When it holds the verdict is
    ``verdict`` and ``because(facts)`` gives the reasons; when it does not,
    ``passed(facts)`` gives the reasons (if any) and the next rule is tried.
    ``signal`` is ``(name, value when it holds, value when it does not)``;
    None leaves that signal as it is.
    """

    def __init__(self, name, condition, verdict, holds, because, passed=None, signal=(None, None, None)):
        self.name = name
        self.condition = condition
        self.verdict = verdict
        self.holds = holds
        self.because = because
        self.passed = passed or (lambda facts: [])
        self.signal = signal


def _max(rows, key):
    return max([row[key] for row in rows] or [0.0])


def _idle(f):
    return [
        "idle: no CPU has usr >= %s %% (highest usr %s %%) and the NIC moves %s, below %s packets/s: nothing can "
        "be judged until the job runs; repeat while it runs and moves storage traffic"
        % (_fmt(f.limits["user_pct"]), _fmt(_max([r for r in f.cpus if r["usr"] is not None], "usr")),
           f.pps_text(), _fmt(f.limits["idle_pps"]))
    ]


def _no_irq_cpus(f):
    return [
        "no NIC queue IRQ CPUs known%s: squeezes cannot be attributed; pass irq_cpus to say where the NIC's "
        "interrupts are handled" % (" (%s)" % f.irq_cpus_why if f.irq_cpus_why else ""),
        "time_squeeze on all CPUs: %s" % f.squeeze_text(f.total),
    ]


def _no_user_work(f):
    return [
        "no IRQ CPU (%s) runs user work: highest usr %s %%, below %s %%: the workload does not compete with the "
        "NIC's interrupt work, whatever the squeezes (time_squeeze on IRQ CPUs: %s)"
        % (f.irq_cpulist(), _fmt(_max(f.irq_rows, "usr")), _fmt(f.limits["user_pct"]), f.squeeze_text(f.on_irq))
    ]


def _user_work(f):
    return ["IRQ CPUs %s run user work (usr >= %s %%)" % (format_cpulist(f.irq_user), _fmt(f.limits["user_pct"]))]


def _no_joint(f):
    rows = [row for row in f.irq_rows if row["cpu"] in f.irq_user]
    return [
        "no IRQ CPU has both softirq >= %s %% and usr >= %s %%: the user-busy IRQ CPUs %s have at most %s %% "
        "softirq: the NIC's work there is light; contention would show if traffic on them rose"
        % (_fmt(f.limits["softirq_pct"]), _fmt(f.limits["user_pct"]), format_cpulist(f.irq_user),
           _fmt(_max(rows, "soft")))
    ]


def _busy(f):
    rows = [row for row in f.cpus if row["cpu"] in f.busy]
    return [
        "IRQ CPUs %s also run user work: usr %s-%s %%, soft %s-%s %% (thresholds usr >= %s %%, soft >= %s %%)"
        % (
            format_cpulist(f.busy),
            _fmt(min(row["usr"] for row in rows)),
            _fmt(max(row["usr"] for row in rows)),
            _fmt(min(row["soft"] for row in rows)),
            _fmt(max(row["soft"] for row in rows)),
            _fmt(f.limits["user_pct"]),
            _fmt(f.limits["softirq_pct"]),
        )
    ]


def _squeezes_low(f):
    return [
        "the shared CPUs %s squeeze below %s per s (%s): packets do not wait; repinning will not make anything "
        "faster" % (format_cpulist(f.busy), _fmt(f.limits["squeeze_rate"]), f.cpu_squeezes(f.busy))
    ]


def _squeezes_high(f):
    return [
        "time_squeeze on the shared CPUs %s at or above %s per s: %s"
        % (format_cpulist(f.contended), _fmt(f.limits["squeeze_rate"]), f.cpu_squeezes(f.contended))
    ]


def _share_low(f):
    return [
        "the shared CPUs %s carry %s %% of all squeezes (%s of %s), below %s %%: most squeezes are elsewhere "
        "(another NIC, RPS, IRQs moved during the sample)"
        % (format_cpulist(f.irq_user), _fmt(f.share, 1), _fmt(f.on_busy), _fmt(f.total),
           _fmt(f.limits["squeeze_share_pct"]))
    ]


def _share_high(f):
    return [
        "the shared CPUs carry %s %% of all squeezes (%s of %s), at or above %s %%"
        % (_fmt(f.share, 1), _fmt(f.on_busy), _fmt(f.total), _fmt(f.limits["squeeze_share_pct"]))
    ]


def _link_unknown(f):
    if not f.link:
        why = "no interface known"
    elif f.link.get("speed_mbps") is None:
        why = "link speed of %s is unknown (set link_speed_mbps)" % f.link["interface"]
    else:
        why = "throughput of %s is unknown" % f.link["interface"]
    return ["cannot rule out a saturated link: %s" % why]


def _link_busy(f):
    return [
        "link %s is busy: %s, at or above %s %%: squeezes are explained by rate"
        % (f.link["interface"], f.link_numbers(), _fmt(f.limits["max_link_util_pct"]))
    ]


def _link_idle(f):
    return [
        "link %s far from saturated: %s, below %s %%"
        % (f.link["interface"], f.link_numbers(), _fmt(f.limits["max_link_util_pct"]))
    ]


RULES = (
    Rule("idle", "no CPU has usr >= {user_pct} % and the NIC moves less than {idle_pps} packets/s", "idle",
         lambda f: not f.user_cpus and f.pps is not None and f.pps < f.limits["idle_pps"], _idle),
    Rule("no_irq_cpus", "no NIC queue IRQ CPU is known", "inconclusive",
         lambda f: not f.irq_set, _no_irq_cpus),
    Rule("irq_cpus_no_user_work", "no IRQ CPU has usr >= {user_pct} %", "no_contention",
         lambda f: not f.irq_user, _no_user_work, _user_work),
    Rule("no_shared_cpu", "no IRQ CPU has both softirq >= {softirq_pct} % and usr >= {user_pct} %",
         "no_contention", lambda f: not f.busy, _no_joint, _busy,
         signal=("irq_cpus_busy", False, True)),
    Rule("squeezes_low", "no such shared CPU squeezes {squeeze_rate} times per second or more", "no_contention",
         lambda f: not f.contended, _squeezes_low, _squeezes_high,
         signal=("squeezes_on_irq_cpus", False, True)),
    Rule("squeezes_elsewhere", "the IRQ CPUs with usr >= {user_pct} % carry less than {squeeze_share_pct} % of all squeezes",
         "inconclusive", lambda f: f.share < f.limits["squeeze_share_pct"], _share_low, _share_high),
    Rule("link_unknown", "the link speed or throughput is unknown", "inconclusive",
         lambda f: f.util is None, _link_unknown),
    Rule("link_busy", "the link is at or above {max_link_util_pct} % of its speed", "inconclusive",
         lambda f: f.util >= f.limits["max_link_util_pct"], _link_busy, _link_idle,
         signal=("link_not_saturated", False, True)),
    Rule("contention", "none of the above: softirq, user work and squeezes on the same IRQ CPUs", "contention",
         lambda f: True, lambda f: []),
)

SIGNALS = ("squeezes_on_irq_cpus", "irq_cpus_busy", "link_not_saturated")

# Findings reported beside the verdict, whatever it is: (name, title, condition, remedy).
FINDINGS = (
    ("irq_cpus_saturated", "IRQ CPUs saturated by packet rate",
     "an IRQ CPU with usr below {user_pct} % squeezes {squeeze_rate} times per second or more",
     "give the NIC's queue IRQs more CPUs (a wider IRQ CPU list for nic_irq_pinning), or spread the receive "
     "softirq over housekeeping CPUs with RPS (nic_irq_pinning_rps_cpus, the RX queues' rps_cpus; it costs an "
     "inter-CPU hop per packet, an IPI and a cache-line transfer). More queues do not help: the CPUs that take the "
     "interrupts are what is short."),
)


def _values(thresholds=None, placeholder=None):
    if placeholder is not None:
        return dict((key, placeholder % key) for key in DEFAULT_THRESHOLDS)
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(dict((key, value) for key, value in (thresholds or {}).items() if value is not None))
    return dict((key, _fmt(limits[key])) for key in DEFAULT_THRESHOLDS)


def describe_rules(thresholds=None, placeholder=None):
    """The verdict table as text: a list of ``{"number", "name", "condition", "verdict"}``, in order.

    The conditions quote ``thresholds`` (the defaults for missing keys), or, with
    ``placeholder`` (a format such as ``"O(%s)"``), the threshold names in it.
    """
    values = _values(thresholds, placeholder)
    return [
        {"number": number, "name": rule.name, "condition": rule.condition.format(**values), "verdict": rule.verdict}
        for number, rule in enumerate(RULES, 1)
    ]


def describe_findings(thresholds=None, placeholder=None):
    """The findings reported beside the verdict: a list of ``{"name", "title", "condition", "remedy"}``."""
    values = _values(thresholds, placeholder)
    return [
        {"name": name, "title": title, "condition": condition.format(**values), "remedy": remedy}
        for name, title, condition, remedy in FINDINGS
    ]


def _findings(f):
    out = []
    if f.saturated:
        name, title, _condition, remedy = FINDINGS[0]
        out.append({
            "name": name,
            "title": title,
            "cpus": sorted(f.saturated),
            "reason": "IRQ CPUs %s squeeze at or above %s per s with usr below %s %%: %s"
            % (format_cpulist(sorted(f.saturated)), _fmt(f.limits["squeeze_rate"]), _fmt(f.limits["user_pct"]),
               ", ".join("CPU %d %s, usr %s %%, soft %s %%" % (
                   row["cpu"], f.squeeze_text(f.squeezes[row["cpu"]]), _fmt(row["usr"]), _fmt(row["soft"]))
                   for row in f.irq_rows if row["cpu"] in f.saturated)),
            "remedy": remedy,
        })
    return out


def judge(signals, irq_cpus, thresholds=None, irq_cpus_why=None):
    """Verdict over the numbers of ``compute_signals``: the first rule of ``RULES`` that holds.

    Squeeze rates are per second of the measured interval, per CPU. Squeezes on
    CPUs that carry no NIC IRQ, backlog drops and a sample with little traffic
    are always reported after the rules' reasons; ``findings`` (IRQ CPUs
    saturated by packet rate) are reported whatever the verdict.
    """
    limits = validate_thresholds(thresholds)
    f = Facts(signals, irq_cpus, limits, irq_cpus_why)
    reasons = []
    signal_flags = dict((name, None) for name in SIGNALS)
    for rule in RULES:
        name, if_holds, if_not = rule.signal
        if rule.holds(f):
            verdict = rule.verdict
            decided_by = rule.name
            reasons.extend(rule.because(f))
            if name is not None and if_holds is not None:
                signal_flags[name] = if_holds
            break
        reasons.extend(rule.passed(f))
        if name is not None and if_not is not None:
            signal_flags[name] = if_not

    if f.elsewhere:
        listed = ", ".join("CPU %d +%d" % (cpu, count) for cpu, count in sorted(f.elsewhere.items()))
        reasons.append(
            "squeezes on CPUs that carry no NIC queue IRQ: %s (RPS/RFS, another NIC, or IRQs moved during the sample)"
            % listed
        )
    dropped = sum(row["dropped"] or 0 for row in f.cpus)
    if dropped:
        reasons.append("softnet backlog drops: %s in %s (netdev_max_backlog exceeded)" % (_fmt(dropped), f.window))
    if verdict == "no_contention" and f.pps is not None and f.pps < limits["idle_pps"]:
        reasons.append(
            "little traffic during the sample (%s, below %s): repeat under training load to rule the problem out"
            % (f.pps_text(), _fmt(limits["idle_pps"]))
        )
    return {
        "verdict": verdict,
        "verdict_rule": decided_by,
        "reasons": reasons,
        "findings": _findings(f) if f.irq_set else [],
        "signals": signal_flags,
        "hot_cpus": f.hot,
        "busy_irq_cpus": sorted(f.busy),
        "contended_cpus": sorted(f.contended),
        "non_irq_squeeze_cpus": sorted(f.elsewhere),
        "totals": {
            "time_squeeze": f.total,
            "time_squeeze_irq_cpus": f.on_irq,
            "time_squeeze_other_cpus": sum(f.elsewhere.values()),
            "dropped": dropped,
            "time_squeeze_per_10s": round(f.per10(f.total), 1),
            "time_squeeze_irq_cpus_per_10s": round(f.per10(f.on_irq), 1),
            "time_squeeze_shared_share_pct": round(f.share, 1),
            "packets_per_s": None if f.pps is None else round(f.pps, 1),
        },
        "thresholds": dict(limits),
    }
