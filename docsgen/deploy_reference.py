"""The alerts and recording rules, read from ``deploy/prometheus/``: each rule's name, what
it guards (the comment written beside it) and its expression; and the runbook,
``deploy/README.md``, included whole so it is written once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from docsgen.markdown import code, table

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"


def _comments(path: Path) -> dict[str, str]:
    """The comment lines written with each rule (just before or just after its name)."""
    found: dict[str, str] = {}
    pending: list[str] = []
    current = None
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("# "))
            continue
        key, _, value = text.removeprefix("- ").partition(": ")
        if key in ("alert", "record"):
            current = value
            found[current] = " ".join(pending)
        elif current is not None and pending:
            found[current] = " ".join(x for x in (found[current], *pending) if x)
        pending = []
    return found


def _rules(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS / name).read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts_reference() -> str:
    why = _comments(PROMETHEUS / "alerts.yml")
    rows = []
    for rule in _rules("alerts.yml"):
        summary = rule.get("annotations", {}).get("summary", "")
        severity = rule.get("labels", {}).get("severity", "")
        guards = why.get(rule["alert"], "")
        rows.append([code(rule["alert"]), severity, rule.get("for", ""), guards, code(summary)])
    return table(["alert", "severity", "for", "what it guards", "summary"], rows)


def recording_reference() -> str:
    why = _comments(PROMETHEUS / "rules.yml")
    rows = [
        [code(rule["record"]), why.get(rule["record"], ""), code(" ".join(rule["expr"].split()))]
        for rule in _rules("rules.yml")
    ]
    return table(["recorded", "what", "expression"], rows)


def include(relative: str) -> str:
    """A file of the repository, its headings one level down (the page has its own)."""
    text = (ROOT / relative).read_text()
    lines = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#"):
            line = f"#{line}"
        lines.append(line)
    return "\n".join(lines) + "\n"
