"""``specroute serve``: its flags, and the handler that reads them with the environment and
the ``--config`` file into the router's settings and runs it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from specroute.policies.params import pairs
from specroute.policies.registry import help_text
from specroute.settings_flags import add_settings_flags

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from specroute.flags import Subcommands

_DISPATCH = ("command", "handler")  # the parser's own entries, no settings

_POLICY_PARAMETERS = """\
policy parameters: --policy-param KEY=VALUE (repeatable); in the environment as JSON,
SPECROUTE_POLICY_PARAMS='{"crossover": 40}'; in the --config file as a table:
  [policy]
  name = "crossover"
  [policy.params]
  crossover = 40
flag over environment over file, key by key. Each policy's:
"""


def add_serve(sub: Subcommands) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the router in front of speculative and plain backends",
        description="An OpenAI-compatible proxy that routes by live concurrency. Every "
        "setting is also read from SPECROUTE_ and its name in capitals, and from the "
        "--config file (its name, or its part's table: [health] interval = 2).",
        epilog=_POLICY_PARAMETERS + help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_flags(serve)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from specroute.router.serve import run
    from specroute.router.settings import RouterSettings

    try:
        settings = RouterSettings(**given_settings(args))
    except ValidationError as exc:
        for error in exc.errors():
            print(f"specroute serve: {_refused(error)}", file=sys.stderr)
        return 2
    for key in settings.deprecated():
        print(
            f"specroute serve: the setting {key} is deprecated; give it as a policy parameter "
            f"(--policy-param {key}=VALUE, SPECROUTE_POLICY_PARAMS or [policy.params])",
            file=sys.stderr,
        )
    for caution in settings.cautions():
        print(f"specroute serve: warning: {caution}", file=sys.stderr)
    return run(settings)


def _refused(error: ErrorDetails) -> str:
    """One refused setting in a line: its key and value, unless it is a key (a secret) or
    a peer's URL (which may hold a password); a check of settings together says what it
    found, and never echoes them all."""
    key = ".".join(str(p) for p in error["loc"])
    if not key:
        return str(error.get("ctx", {}).get("error", error["msg"]))
    value = "***" if "key" in key or key.startswith("online_peers") else error.get("input")
    return f"bad setting {key}={value!r}: {error['msg']}"


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``serve``'s flags set: every flag given, none of the parser's own entries; the
    policy's parameters as a table."""
    given = {k: v for k, v in vars(args).items() if k not in _DISPATCH and v is not None}
    if "given_params" in given:
        given["given_params"] = pairs(given["given_params"], "--policy-param")
    return given
