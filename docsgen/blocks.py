"""What a ``<!-- docsgen: NAME ARGS -->`` marker becomes: one dict, filled here."""

from __future__ import annotations

from collections.abc import Callable

from docsgen import results
from docsgen.cli_reference import cli_reference
from docsgen.deploy_reference import alerts_reference, include, recording_reference
from docsgen.endpoints_reference import endpoints_reference
from docsgen.imports_reference import imports_reference
from docsgen.metrics_reference import metrics_reference
from docsgen.policy_reference import policy_params_reference
from docsgen.profile_reference import profile_example, profile_reference
from docsgen.runs import DATA
from docsgen.settings_reference import settings_reference

Block = Callable[..., str]

BLOCKS: dict[str, Block] = {
    "cli": cli_reference,
    "settings": settings_reference,
    "metrics": metrics_reference,
    "profile": profile_reference,
    "profile-example": lambda path: profile_example(DATA / path),
    "endpoints": endpoints_reference,
    "alerts": alerts_reference,
    "recording-rules": recording_reference,
    "include": include,
    "imports": imports_reference,
    "policy-params": policy_params_reference,
    **results.BLOCKS,
}


def render(name: str, args: list[str]) -> str:
    """The block ``name`` with ``args``; a name no block has is an error, so that a
    misspelt marker fails the build instead of vanishing from the page."""
    block = BLOCKS.get(name)
    if block is None:
        raise KeyError(f"no docs block named {name!r}; known: {', '.join(sorted(BLOCKS))}")
    return block(*args)
