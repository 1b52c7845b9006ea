"""A profile from production in words (``specroute profile --from-live --report``), and
beside a calibrated one (``--compare``): the crossover, how sure the live fit is, and each
level's time per output token, live or held from the profile."""

from __future__ import annotations

from typing import Any

from specroute.profiler.report import context_lines, crossover_text, interval_text


def render_live_report(live: dict[str, Any], calibrated: dict[str, Any] | None = None) -> str:
    meta = live["measurement"]
    by_context = context_lines(live)
    lines = [
        "# Speculative decoding crossover, from live traffic",
        "",
        f"Fitted from {meta['samples_counted']} requests the router served "
        f"(online calibration, --online {meta['online_mode']}): each pool and level's last "
        f"{meta['window_samples']} samples, none older than {meta['window_seconds']:g} s; "
        f"a pool's level counted live from {meta['min_samples']} samples. Written "
        f"{live.get('created')}, {meta.get('fitted_seconds_ago')} s after the fit.",
        "",
        "## What it means",
        "",
        f"- {_sentence(live['crossover'], meta['sureness'])}",
        f"- {_accept_sentence(live['acceptance'])}",
    ]
    if any(row[p]["from"] == "profile" for row in live["levels"] for p in ("spec", "base")):
        lines.append(
            "- Levels where a pool was seen too seldom hold the profile in force's value "
            "there (*from* below): under a crossover policy the plain server is seldom seen "
            "at low load, nor the speculative one at high load."
        )
    if by_context:
        lines += ["", "## Crossover by context", "", *by_context]
    lines += ["", *level_table(live["levels"])]
    if calibrated is not None:
        lines += ["", *comparison_lines(live, calibrated)]
    return "\n".join(lines) + "\n"


def _sentence(c: dict[str, Any], sureness: dict[str, Any]) -> str:
    sure = (
        "sure, by the rule --online adopt routes by"
        if all(sureness["sure"])
        else f"not yet sure, by the rule --online adopt routes by (at least "
        f"{sureness['min_samples']} live samples around it, and an interval at most "
        f"{sureness['max_ratio']:g} times as high as low): serve longer before trusting it"
    )
    if c["value"] is None:
        where = "every" if c["bound"] == "above" else "no"
        return (
            f"Speculation gave better time per output token at {where} level seen (limit "
            f"{c['limit']:g}): {sure}."
        )
    return (
        f"Speculation gives better time per output token below about **{c['value']:.1f}** "
        f"concurrent requests, worse above (95% interval {interval_text(c['ci'])}): {sure}."
    )


def _accept_sentence(acceptance: dict[str, Any]) -> str:
    accept = acceptance.get("mean_accept_length")
    if accept is None:
        return "Accept length: none known (the acceptance-crossover policy needs one)."
    live = acceptance.get("from") == "live"
    where = "live, from the speculative servers" if live else "the profile's: no live one"
    return f"Accept length {accept:.2f} tokens per decoding step ({where})."


def level_table(levels: list[dict[str, Any]]) -> list[str]:
    """Each level the crossover was taken at: each pool's median TPOT, its samples and
    where the value came from."""
    lines = [
        "## Per level (median TPOT ms, 95% bootstrap intervals)",
        "",
        "| conc. | spec TPOT ms | spec samples | spec from | base TPOT ms | base samples "
        "| base from | spec/base |",
        "|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for row in levels:
        s, b = row["spec"], row["base"]
        ratio = s["tpot_ms"]["median"] / b["tpot_ms"]["median"]
        lines.append(
            f"| {row['concurrency']:g} | {_tpot(s['tpot_ms'])} | {s['requests']} | {s['from']} "
            f"| {_tpot(b['tpot_ms'])} | {b['requests']} | {b['from']} | {ratio:.2f} |"
        )
    return lines


def comparison_lines(live: dict[str, Any], calibrated: dict[str, Any]) -> list[str]:
    """A calibrated profile's crossover, interval and per-level TPOT beside the live one's,
    as markdown tables."""
    lines = [
        "## Live beside calibrated",
        "",
        "| | calibrated | live |",
        "|---|---|---|",
        f"| crossover (TPOT) | {crossover_text(calibrated['crossover'])} "
        f"| {crossover_text(live['crossover'])} |",
    ]
    for k, (c, b) in enumerate(_buckets(calibrated, live)):
        lines.append(
            f"| context bucket {k} ({c['context']:g} / {b['context']:g} KV tokens) "
            f"| {crossover_text(c['crossover'])} | {crossover_text(b['crossover'])} |"
        )
    accepts = [(p.get("acceptance") or {}).get("mean_accept_length") for p in (calibrated, live)]
    accept = " | ".join("-" if a is None else f"{a:.2f}" for a in accepts)
    lines += [
        f"| accept length | {accept} |",
        f"| created | {calibrated.get('created') or '-'} | {live.get('created') or '-'} |",
        "",
        "| conc. | spec TPOT ms, calibrated | spec, live | base TPOT ms, calibrated | base, live |",
        "|---:|---:|---:|---:|---:|",
    ]
    ours = {row["concurrency"]: row for row in calibrated.get("levels") or []}
    theirs = {row["concurrency"]: row for row in live["levels"]}
    for level in sorted(set(ours) | set(theirs)):
        cells = []
        for pool in ("spec", "base"):
            cal, got = ours.get(level), theirs.get(level)
            cells.append("-" if cal is None else _tpot(cal[pool]["tpot_ms"]))
            cells.append("-" if got is None else _live_cell(got[pool]))
        lines.append(f"| {level:g} | " + " | ".join(cells) + " |")
    return lines


def _buckets(
    calibrated: dict[str, Any], live: dict[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The two profiles' context buckets side by side, when both have the same number."""
    ours = (calibrated.get("context") or {}).get("buckets") or []
    theirs = (live.get("context") or {}).get("buckets") or []
    return list(zip(ours, theirs, strict=True)) if len(ours) == len(theirs) else []


def _live_cell(cell: dict[str, Any]) -> str:
    if cell["from"] == "live":
        return f"{_tpot(cell['tpot_ms'])} (n={cell['requests']})"
    return f"{cell['tpot_ms']['median']:.2f} (profile's; {cell['requests']} live)"


def _tpot(stat: dict[str, Any]) -> str:
    ci = stat.get("ci")
    if not ci or ci[0] is None or ci[1] is None:
        return f"{stat['median']:.2f}"
    return f"{stat['median']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
