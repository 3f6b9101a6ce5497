# -*- coding: utf-8 -*-
# Copyright (c) gpunode.tuning contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""softnet_check, part 3 of 4: the verdict (pure).

Private module_utils of gpunode.tuning: standard library only, no Ansible
imports. ``judge`` turns the numbers of ``_softnet_signals.compute_signals``,
the IRQ CPUs and the thresholds into a verdict and reasons that quote the
numbers. The verdict is the table ``RULES``: tried in order, the first rule
whose condition holds gives the verdict. ``describe_rules`` renders the same
table as text for the diagnose report; the module documentation lists it too
(a unit test keeps the three in step).

``DEFAULT_THRESHOLDS`` is the one definition of the threshold defaults: the
module's argument spec takes its defaults from it.
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils._cpulist import format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils._softnet_procfs import SoftnetError

VERDICTS = ("contention", "inconclusive", "no_contention")

DEFAULT_THRESHOLDS = {
    # Seed 000: "hundreds of squeezes per 10 seconds" on the IRQ CPUs.
    "squeeze_threshold": 100.0,
    # Seed 000: "A healthy machine shows +0 everywhere"; below this total
    # (all CPUs, per 10 s) the squeezes count as near zero.
    "squeeze_quiet": 10.0,
    # Seed 000: soft in the 5-20 % range together with usr in the 40-70 % range.
    "softirq_pct": 5.0,
    "user_pct": 40.0,
    # Seed 000: "only a few percent of the interface's bandwidth".
    "max_link_util_pct": 10.0,
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
    if merged["squeeze_quiet"] > merged["squeeze_threshold"]:
        raise SoftnetError(
            "squeeze_quiet (%s) is above squeeze_threshold (%s)"
            % (_fmt(merged["squeeze_quiet"]), _fmt(merged["squeeze_threshold"])),
            value=merged["squeeze_quiet"],
            expected="squeeze_quiet <= squeeze_threshold",
        )
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
        self.total = sum(squeezes.values())
        self.on_irq = sum(count for cpu, count in squeezes.items() if cpu in self.irq_set)
        self.elsewhere = dict((cpu, count) for cpu, count in squeezes.items() if cpu not in self.irq_set and count > 0)
        self.busy = [row["cpu"] for row in self.cpus if row["cpu"] in self.irq_set and self.user_and_softirq(row)]
        self.hot = [
            row["cpu"]
            for row in self.cpus
            if (row["time_squeeze"] or 0) > 0
            and self.per10(row["time_squeeze"]) >= limits["squeeze_quiet"]
            or self.user_and_softirq(row)
        ]
        self.irq_rows = [row for row in self.cpus if row["cpu"] in self.irq_set and row["usr"] is not None]
        self.util = self.link.get("utilisation_pct") if self.link else None

    def user_and_softirq(self, row):
        return (
            row["soft"] is not None
            and row["soft"] >= self.limits["softirq_pct"]
            and row["usr"] >= self.limits["user_pct"]
        )

    def per10(self, count):
        return count * 10.0 / self.elapsed

    def squeeze_text(self, count):
        return "%s in %s (%s per 10 s)" % (_fmt(count), self.window, _fmt(self.per10(count)))

    def irq_cpulist(self):
        return format_cpulist(sorted(self.irq_set))

    def link_numbers(self):
        link = self.link
        return "%s %% of %s Mbit/s (rx %s, tx %s Mbit/s)" % (
            _fmt(self.util), _fmt(link["speed_mbps"]), _fmt(link["rx_mbps"]), _fmt(link["tx_mbps"])
        )


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


def _no_irq_cpus(f):
    return [
        "no NIC queue IRQ CPUs known%s: squeezes cannot be attributed; pass irq_cpus to say where the NIC's "
        "interrupts are handled" % (" (%s)" % f.irq_cpus_why if f.irq_cpus_why else ""),
        "time_squeeze on all CPUs: %s" % f.squeeze_text(f.total),
    ]


def _quiet(f):
    return [
        "time_squeeze near zero: %s on all CPUs, below %s per 10 s; repinning will not make anything faster"
        % (f.squeeze_text(f.total), _fmt(f.limits["squeeze_quiet"]))
    ]


def _irq_squeezes_low(f):
    return [
        "time_squeeze on IRQ CPUs %s: %s, below the contention threshold of %s per 10 s; all CPUs: %s"
        % (f.irq_cpulist(), f.squeeze_text(f.on_irq), _fmt(f.limits["squeeze_threshold"]), f.squeeze_text(f.total))
    ]


def _irq_squeezes_high(f):
    return [
        "time_squeeze on IRQ CPUs %s: %s, at or above %s per 10 s"
        % (f.irq_cpulist(), f.squeeze_text(f.on_irq), _fmt(f.limits["squeeze_threshold"]))
    ]


def _not_busy(f):
    max_usr = max([row["usr"] for row in f.irq_rows] or [0.0])
    max_soft = max([row["soft"] for row in f.irq_rows] or [0.0])
    return [
        "no IRQ CPU is both in softirq >= %s %% and in user work >= %s %% (highest usr %s %%, highest soft "
        "%s %%): squeezes without competing user work point at packet rate, not contention"
        % (_fmt(f.limits["softirq_pct"]), _fmt(f.limits["user_pct"]), _fmt(max_usr), _fmt(max_soft))
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
    Rule("no_irq_cpus", "no NIC queue IRQ CPU is known", "inconclusive",
         lambda f: not f.irq_set, _no_irq_cpus),
    Rule("quiet", "all CPUs together squeeze less than {squeeze_quiet} per 10 s", "no_contention",
         lambda f: f.per10(f.total) < f.limits["squeeze_quiet"], _quiet,
         signal=("squeezes_on_irq_cpus", False, None)),
    Rule("irq_squeezes_low", "the IRQ CPUs together squeeze less than {squeeze_threshold} per 10 s", "inconclusive",
         lambda f: f.per10(f.on_irq) < f.limits["squeeze_threshold"], _irq_squeezes_low, _irq_squeezes_high,
         signal=("squeezes_on_irq_cpus", False, True)),
    Rule("irq_cpus_not_busy", "no IRQ CPU has both softirq >= {softirq_pct} % and usr >= {user_pct} %",
         "inconclusive", lambda f: not f.busy, _not_busy, _busy,
         signal=("irq_cpus_busy", False, True)),
    Rule("link_unknown", "the link speed or throughput is unknown", "inconclusive",
         lambda f: f.util is None, _link_unknown),
    Rule("link_busy", "the link is at or above {max_link_util_pct} % of its speed", "inconclusive",
         lambda f: f.util >= f.limits["max_link_util_pct"], _link_busy, _link_idle,
         signal=("link_not_saturated", False, True)),
    Rule("contention", "none of the above", "contention", lambda f: True, lambda f: []),
)

SIGNALS = ("squeezes_on_irq_cpus", "irq_cpus_busy", "link_not_saturated")


def describe_rules(thresholds=None, placeholder=None):
    """The verdict table as text: a list of ``{"number", "name", "condition", "verdict"}``, in order.

    The conditions quote ``thresholds`` (the defaults for missing keys), or, with
    ``placeholder`` (a format such as ``"O(%s)"``), the threshold names in it.
    """
    if placeholder is not None:
        values = dict((key, placeholder % key) for key in DEFAULT_THRESHOLDS)
    else:
        limits = dict(DEFAULT_THRESHOLDS)
        limits.update(dict((key, value) for key, value in (thresholds or {}).items() if value is not None))
        values = dict((key, _fmt(limits[key])) for key in DEFAULT_THRESHOLDS)
    return [
        {"number": number, "name": rule.name, "condition": rule.condition.format(**values), "verdict": rule.verdict}
        for number, rule in enumerate(RULES, 1)
    ]


def judge(signals, irq_cpus, thresholds=None, irq_cpus_why=None):
    """Verdict over the numbers of ``compute_signals``: the first rule of ``RULES`` that holds.

    Thresholds are per 10 s and scaled to the measured interval. Squeezes on
    CPUs that carry no NIC IRQ, backlog drops and a sample with little traffic
    are always reported after the rules' reasons.
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
    link = f.link
    if verdict == "no_contention" and link and link.get("rx_packets") is not None:
        packets = (link.get("rx_packets") or 0) + (link.get("tx_packets") or 0)
        if packets * 1.0 / f.elapsed < 100:
            reasons.append(
                "little traffic on %s during the sample (%s packets/s): repeat under training load to rule the "
                "problem out" % (link["interface"], _fmt(round(packets * 1.0 / f.elapsed, 1)))
            )
    scale = f.elapsed / 10.0
    scaled = dict(limits)
    scaled["interval_scale"] = round(scale, 4)
    scaled["squeeze_threshold_in_window"] = round(limits["squeeze_threshold"] * scale, 2)
    scaled["squeeze_quiet_in_window"] = round(limits["squeeze_quiet"] * scale, 2)
    return {
        "verdict": verdict,
        "verdict_rule": decided_by,
        "reasons": reasons,
        "signals": signal_flags,
        "hot_cpus": sorted(f.hot),
        "busy_irq_cpus": sorted(f.busy),
        "non_irq_squeeze_cpus": sorted(f.elsewhere),
        "totals": {
            "time_squeeze": f.total,
            "time_squeeze_irq_cpus": f.on_irq,
            "time_squeeze_other_cpus": sum(f.elsewhere.values()),
            "dropped": dropped,
            "time_squeeze_per_10s": round(f.per10(f.total), 1),
            "time_squeeze_irq_cpus_per_10s": round(f.per10(f.on_irq), 1),
        },
        "thresholds": scaled,
    }
