"""How many drafted tokens the target accepts, per prompt, changeable while serving.

In an EAGLE chain of ``S`` drafts each draft is accepted, given that all before it were,
with probability alpha; a verify step yields the accepted prefix plus one bonus token, so
the mean accept length is ``tau = (1 - alpha**(S+1)) / (1 - alpha)``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from specroute.emulator.memo import by_text


class AcceptanceError(ValueError):
    """An acceptance setting that cannot be used, with the reason."""


def accept_length(rate: float, steps: int) -> float:
    """Mean tokens per verify step (bonus token included) for a per-draft accept rate."""
    if rate >= 1.0:
        return float(steps + 1)
    return (1.0 - rate ** (steps + 1)) / (1.0 - rate)


def accept_rate(length: float, steps: int) -> float:
    """The per-draft accept rate whose mean accept length is ``length``."""
    if not 1.0 <= length <= steps + 1:
        raise AcceptanceError(
            f"accept length {length} is outside [1, {steps + 1}] for {steps} steps"
        )
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if accept_length(mid, steps) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def accepted_drafts(rng: random.Random, rate: float, steps: int) -> int:
    """Leading drafts accepted in one verify step."""
    k = 0
    while k < steps and rng.random() < rate:
        k += 1
    return k


@dataclass(frozen=True)
class Rule:
    """Prompts matching ``pattern`` are accepted at ``rate`` instead of the default."""

    name: str
    pattern: re.Pattern[str]
    rate: float

    def describe(self, steps: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "pattern": self.pattern.pattern,
            "accept_rate": round(self.rate, 6),
            "accept_length": round(accept_length(self.rate, steps), 6),
        }


@dataclass(frozen=True)
class Acceptance:
    """The default accept rate and the per-prompt rules; replaced whole when changed."""

    steps: int
    rate: float
    rules: tuple[Rule, ...] = ()

    def rate_for(self, prompt: str) -> float:
        """The first matching rule's rate, else the default."""
        return _rate_for(prompt, self.rules, self.rate) if self.rules else self.rate

    def describe(self) -> dict[str, Any]:
        return {
            "speculative_num_steps": self.steps,
            "accept_rate": round(self.rate, 6),
            "accept_length": round(accept_length(self.rate, self.steps), 6),
            "rules": [rule.describe(self.steps) for rule in self.rules],
        }

    def updated(self, change: Any) -> Acceptance:
        """A copy changed by an admin request: ``accept_length`` or ``accept_rate`` sets the
        default, ``rules`` (a list) replaces the rules."""
        if not isinstance(change, dict):
            raise AcceptanceError("expected a JSON object")
        unknown = set(change) - {"accept_length", "accept_rate", "rules"}
        if unknown:
            raise AcceptanceError(f"unknown field(s): {', '.join(sorted(unknown))}")
        rate = self.rate
        if "accept_length" in change or "accept_rate" in change:
            rate = parse_rate(change, self.steps, "acceptance")
        rules = self.rules
        if "rules" in change:
            rules = parse_rules(change["rules"], self.steps)
        return Acceptance(self.steps, rate, rules)


def parse_rate(spec: dict[str, Any], steps: int, where: str) -> float:
    """``accept_rate`` or ``accept_length`` (exactly one) from a mapping."""
    has_rate, has_length = (
        spec.get("accept_rate") is not None,
        spec.get("accept_length") is not None,
    )
    if has_rate == has_length:
        raise AcceptanceError(f"{where}: give exactly one of accept_rate and accept_length")
    try:
        if has_rate:
            rate = float(spec["accept_rate"])
            if not 0.0 <= rate <= 1.0:
                raise AcceptanceError(f"{where}: accept_rate {rate} is outside [0, 1]")
            return rate
        return accept_rate(float(spec["accept_length"]), steps)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AcceptanceError):
            raise AcceptanceError(f"{where}: {exc}") from None
        raise AcceptanceError(f"{where}: not a number ({exc})") from None


def parse_rules(rules: Any, steps: int) -> tuple[Rule, ...]:
    if not isinstance(rules, list):
        raise AcceptanceError(
            "rules: expected a list of {name, pattern, accept_length|accept_rate}"
        )
    parsed = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or not isinstance(rule.get("pattern"), str):
            raise AcceptanceError(f"rules[{i}]: expected an object with a string 'pattern'")
        try:
            pattern = re.compile(rule["pattern"])
        except re.error as exc:
            raise AcceptanceError(f"rules[{i}]: bad pattern: {exc}") from None
        name = str(rule.get("name", f"rule{i}"))
        parsed.append(Rule(name, pattern, parse_rate(rule, steps, f"rules[{i}]")))
    return tuple(parsed)


@by_text
def _rate_for(prompt: str, rules: tuple[Rule, ...], default: float) -> float:
    return next((rule.rate for rule in rules if rule.pattern.search(prompt)), default)
