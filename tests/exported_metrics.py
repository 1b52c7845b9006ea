"""Which metric names a query in ``deploy/`` may read: those the router and the emulated
SGLang server export, and the recording rules of ``deploy/prometheus/rules.yml``.

``scrape`` starts a router (with a profile, so that the profile's gauges show) in front of a
pair of emulated servers and returns their three ``/metrics`` pages; ``exported`` reads the
names off a page; ``metric_names`` reads the names off a PromQL expression.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from tests.processes import emulator_pair, specroute

PROMETHEUS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULE_FILES = [PROMETHEUS / "rules.yml", PROMETHEUS / "alerts.yml"]
# what the router's profile gauges are read from while it is scraped
PROFILE = {
    "schema": "specroute.profile/v1",
    "created": "2026-11-30T00:00:00+00:00",
    "crossover": {"value": 5, "ci": [4, 6], "bands": [[None, 5]]},  # bands: their edge gauge
    "acceptance": {"mean_accept_length": 3.0},
    "workload": {"mean_prompt_tokens": 512, "mean_output_tokens": 128},
}

# what in an expression is not a metric name: label matchers and lists, functions, keywords
_NOT_NAMES = re.compile(
    r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\[[^\]]*\]"
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}


def metric_names(expr: str) -> set[str]:
    text = _NOT_NAMES.sub(" ", expr)
    names = {
        m.group()
        for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text)
        if not text[m.end() :].lstrip().startswith("(")  # a function or an aggregation
    }
    return names - _KEYWORDS


def exported(text: str) -> set[str]:
    """Every name a /metrics page can carry: its samples, and its declared families (a
    labelled counter shows no sample before its first increment)."""
    names = set()
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            _, kind, name, *rest = line.split()
            names.add(name)
            if kind == "TYPE" and rest == ["histogram"]:
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            if kind == "TYPE" and rest == ["counter"]:
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def rules(path: Path) -> list[dict[str, str]]:
    """The rules of one of deploy/prometheus's files: ``record`` or ``alert``, and ``expr``.
    (Read without a YAML parser: promtool reads the files whole, and these are written
    one key a line, an ``expr`` either on its line or as a ``|`` block.)"""
    found: list[dict[str, str]] = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        key, _, value = line.strip().removeprefix("- ").partition(": ")
        if key in ("record", "alert"):
            found.append({key: value})
        elif key == "expr":
            if value == "|":
                indent = len(line) - len(line.lstrip()) + 1
                block = lines[i + 1 :]
                end = next(
                    (
                        j
                        for j, x in enumerate(block)
                        if x.strip() and len(x) - len(x.lstrip()) < indent
                    ),
                    len(block),
                )
                value = " ".join(x.strip() for x in block[:end])
            found[-1]["expr"] = value
    return found


def recorded() -> set[str]:
    """The names the recording rules write."""
    return {rule["record"] for path in RULE_FILES for rule in rules(path) if "record" in rule}


async def scrape(folder: Path) -> list[str]:
    """The ``/metrics`` pages of a router, its speculative and its plain emulated server, in
    that order; the router's profile (``PROFILE``) is written into ``folder``."""
    profile = folder / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    async with (
        emulator_pair("--time-scale", "0.05") as (spec, base),
        specroute("serve", "--spec", spec, "--base", base, "--profile", str(profile)) as (
            router,
            _,
        ),
        aiohttp.ClientSession() as session,
    ):
        pages = []
        for url in (router, spec, base):
            async with session.get(f"{url}/metrics") as answer:
                pages.append(await answer.text())
    return pages
