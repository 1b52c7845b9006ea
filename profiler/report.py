"""The profile in words: what the crossover is, how sure the measurement is, what to check."""

from __future__ import annotations

from typing import Any

from specroute.loadgen.fairness import adaptive_note


def interval_text(ci: list[float | None]) -> str:
    """A crossover's interval in words: an open end reads "at least" or "at most"."""
    low, high = ci
    if low is None and high is None:
        return "anywhere: the replicates found it below and above the levels measured"
    if high is None:
        return f"at least {low:.1f}"
    if low is None:
        return f"at most {high:.1f}"
    return f"{low:.1f} to {high:.1f}"


def _runs_text(levels: list[dict[str, Any]]) -> str:
    """How many runs each level had, per backend, grouped: "1 at 1, 2, 4; 3 at 8, 6"."""
    groups: dict[str, list[str]] = {}
    for row in levels:
        runs = {row[b].get("runs") for b in ("spec", "base")}
        key = "/".join(str(r) for r in sorted(runs, key=str))
        groups.setdefault(key, []).append(str(row["concurrency"]))
    return "; ".join(f"{k} at {', '.join(v)}" for k, v in groups.items())


def banded(c: dict[str, Any]) -> bool:
    """Whether the crossover's bands are more than one crossover's: speculation paying from
    a load above the lowest, or in more than one span."""
    paying = c.get("bands") or []
    return len(paying) > 1 or (len(paying) == 1 and paying[0][0] is not None)


def edge_text(c: dict[str, Any], at: float) -> str:
    """A band's edge with its interval, from the crossing it is."""
    for turn in c.get("crossings", []):
        if abs(turn["at"] - at) < 1e-3 and turn.get("ci"):
            low, high = turn["ci"]
            return f"{at:.1f} (95% {low:.1f} to {high:.1f})"
    return f"{at:.1f}"


def crossover_text(c: dict[str, Any]) -> str:
    """A crossover in a table cell: the value and its interval, the bands, or the bound."""
    if banded(c):
        return "pays " + "; ".join(
            f"{'1' if a is None else edge_text(c, a)} to {edge_text(c, b)}" for a, b in c["bands"]
        )
    if c["value"] is None:
        where = "every" if c["bound"] == "above" else "no"
        side = "above" if c["bound"] == "above" else "below"
        return f"{side} {c['limit']:g} (paid at {where} level measured)"
    return f"{c['value']:.1f} (95% {interval_text(c['ci'])})"


def context_lines(profile: dict[str, Any]) -> list[str]:
    """The crossover by context as a markdown table and what it says; nothing for v1."""
    axis = profile.get("context")
    if not axis:
        return []
    buckets = axis["buckets"]
    lines = [
        "| context (KV tokens per request) | per-request (TPOT) crossover | throughput crossover |",
        "|---:|---|---|",
    ]
    for b in buckets:
        throughput = b.get("throughput_crossover")
        lines.append(
            f"| {b['context']:g} | {crossover_text(b['crossover'])} | "
            f"{'-' if throughput is None else crossover_text(throughput)} |"
        )
    first, last = buckets[0], buckets[-1]
    ends = [
        c["value"]
        for c in (first["crossover"], last["crossover"])
        if not banded(c) and c["value"] is not None
    ]
    if len(ends) == 2 and ends[0] != ends[1]:
        way = "falls" if ends[1] < ends[0] else "rises"
        lines += [
            "",
            f"From {first['context']:g} to {last['context']:g} tokens of context the "
            f"per-request crossover {way} from {ends[0]:.1f} to {ends[1]:.1f}.",
        ]
    lines += [
        "",
        f"A request's context: its prompt tokens and half its answer; estimated "
        f"from its text at {axis['tokens_per_byte']:.4f} prompt tokens per byte, as "
        "measured here.",
    ]
    return lines


def _bands_sentence(c: dict[str, Any], what: str, levels: list[int]) -> str:
    spans = []
    for start, end in c["bands"]:
        begin = "the lowest load" if start is None else edge_text(c, start)
        finish = f"{end:g}, the highest level measured" if end == levels[-1] else edge_text(c, end)
        spans.append(f"from {begin} to {finish}")
    return (
        f"Speculation gives better {what} in {len(spans)} band(s) of load, "
        f"{'; '.join(spans)} concurrent requests, and worse outside "
        f"{'it' if len(spans) == 1 else 'them'}."
    )


def _crossover_sentence(c: dict[str, Any], what: str, levels: list[int]) -> str:
    if banded(c):
        return _bands_sentence(c, what, levels)
    if c["value"] is None:
        if c["bound"] == "above":
            return (
                f"Speculation gave better {what} at every level measured (up to "
                f"{c['limit']:g} concurrent requests): the crossover is above {c['limit']:g}, "
                "if there is one. Measure higher levels to find it."
            )
        return (
            f"Speculation gave worse {what} at every level measured (from "
            f"{c['limit']:g}): it does not pay here, even at the lowest load."
        )
    low, high = c["ci"]
    if low is None or high is None:
        sure = "open: the crossover may lie outside the levels measured; measure further out"
    else:
        width = (high - low) / c["value"]
        sure = (
            "narrow"
            if width < 0.25
            else "moderately wide"
            if width < 0.6
            else "wide: measure more requests per level or more levels around it"
        )
    return (
        f"Speculation gives better {what} below about **{c['value']:.1f}** concurrent "
        f"requests, worse above (95% interval {interval_text(c['ci'])}, {sure})."
    )


def measured_when(meta: dict[str, Any]) -> str:
    """When the profile was measured, or that it was rehearsed (``emulate --calibrate``)."""
    if meta.get("started"):
        return f"measured {meta['started']} to {meta.get('ended')}"
    return "rehearsed in virtual time (specroute emulate --calibrate)"


def render_report(profile: dict[str, Any]) -> str:
    by_context = context_lines(profile)
    lines = [*_heading(profile, bool(by_context)), *_meaning(profile)]
    if by_context:
        lines += ["", "## Crossover by context", "", *by_context]
    lines += _caveats(profile)
    lines += _level_table(profile["levels"])
    lines += _setup(profile)
    return "\n".join(lines)


def _heading(profile: dict[str, Any], by_context: bool) -> list[str]:
    """The title, and what was measured, when and for how long."""
    levels = profile["levels"]
    concurrency = [row["concurrency"] for row in levels]
    meta = profile["measurement"]
    shortest = (
        [
            "The sections below are of the shortest context measured, "
            f"{profile['context']['buckets'][0]['context']:g} KV tokens per request; "
            "*Crossover by context* gives each.",
            "",
        ]
        if by_context
        else []
    )
    return [
        "# Speculative decoding crossover",
        "",
        *shortest,
        f"Model `{meta.get('model')}`, {measured_when(meta)} "
        f"at {len(levels)} concurrency levels ({', '.join(map(str, concurrency))}); "
        f"runs per level and backend: {_runs_text(levels)}; "
        f"{(meta.get('backend_seconds') or 0) / 60:.1f} minutes of backend time.",
        "",
    ]


def _meaning(profile: dict[str, Any]) -> list[str]:
    """Both crossovers in words, what the router does with them, and what moves them."""
    concurrency = [row["concurrency"] for row in profile["levels"]]
    lines = [
        "## What it means",
        "",
        "- Per-request speed (time per output token, TPOT): "
        + _crossover_sentence(profile["crossover"], "time per output token", concurrency),
        "- Total throughput (output tokens per second over all requests): "
        + _crossover_sentence(profile["throughput_crossover"], "throughput", concurrency),
        "- The router's `crossover` policy uses the first: it sends a request to the "
        "speculative server while the concurrency it would join lies in a band where "
        "speculation pays (for one crossover: at or below it).",
    ]
    if banded(profile["crossover"]):
        lines.append(
            "- Bands, not one crossover below which speculation pays, as for a dense model: a "
            "mixture of experts reads few experts per step at low load, where verifying "
            "drafts touches many more, and nearly all of them at any load past a few hundred "
            "tokens per step, where verifying costs little more than decoding."
        )
    accept = profile["acceptance"]["mean_accept_length"]
    if accept is not None:
        lines.append(
            f"- Accept length measured over the windows: {accept:.2f} tokens per decoding "
            "step (over every step, from counter deltas). Traffic with a different accept "
            "length (code versus chat) moves the crossover: recalibrate with your own prompts."
        )
    return lines


def _caveats(profile: dict[str, Any]) -> list[str]:
    """Why the comparison may be unfair, and the runs left out."""
    lines: list[str] = []
    warnings = profile["measurement"].get("fairness_warnings") or []
    if warnings:
        lines += ["", "## Warnings: the comparison may be unfair", ""]
        lines += [f"- {w}" for w in warnings]
    invalid = [
        (row["concurrency"], b)
        for row in profile["levels"]
        for b in ("spec", "base")
        if row[b]["invalid_runs"]
    ]
    if invalid:
        lines += [
            "",
            "Runs with failed requests were left out: "
            + ", ".join(f"{b} at {c}" for c, b in invalid)
            + ".",
        ]
    return lines


def _level_table(levels: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Per level (medians, 95% bootstrap intervals)",
        "",
        "| conc. | runs | spec TPOT ms | base TPOT ms | spec/base | spec tok/s | base tok/s | "
        "spec total | base total | accept |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in levels:
        s, b = row["spec"], row["base"]
        ratio = s["tpot_ms"]["median"] / b["tpot_ms"]["median"]
        lines.append(
            f"| {row['concurrency']} | {s.get('runs', '-')} | {_ci(s['tpot_ms'])} "
            f"| {_ci(b['tpot_ms'])} | {ratio:.2f} "
            f"| {s['decode_tps']['median']:.1f} | {b['decode_tps']['median']:.1f} "
            f"| {_ci(s['output_tps'], 0)} | {_ci(b['output_tps'], 0)} "
            f"| {s['accept_length'] if s['accept_length'] is not None else '-'} |"
        )
    return lines


def _setup(profile: dict[str, Any]) -> list[str]:
    """The workload and the servers measured."""
    workload = profile["workload"]
    spec, base = profile["servers"]["spec"], profile["servers"]["base"]
    adaptive = (
        [f"- {adaptive_note(spec.get('speculative_adaptive_config'))}."]
        if spec.get("speculative_adaptive") is True
        else []
    )
    return [
        "",
        f"Workload: {workload.get('kind')} ({workload.get('source')}), mean "
        f"{workload.get('mean_prompt_tokens')} prompt and {workload.get('mean_output_tokens')} "
        f"output tokens, fingerprint `{workload.get('fingerprint')}`.",
        f"Servers: spec {spec.get('url')} ({spec.get('speculative_algorithm')}, max running "
        f"{spec.get('max_running_requests')}), base {base.get('url')} (max running "
        f"{base.get('max_running_requests')}).",
        *adaptive,
        "",
    ]


def _ci(stat: dict[str, Any], digits: int = 2) -> str:
    low, high = stat["ci"]
    return f"{stat['median']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
