"""``specroute serve``: its flags, and the handler that reads them with the environment and
the ``--config`` file into the router's settings and runs it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from specroute.policies.params import pairs
from specroute.policies.registry import FLAT_KEYS, REGISTRY, help_text, kind_of
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
        description="An OpenAI-compatible proxy that routes by live concurrency.",
        epilog=_POLICY_PARAMETERS + help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_backend_flags(serve.add_argument_group("backends"))
    _add_policy_flags(serve.add_argument_group("routing"))
    _add_serving_flags(serve.add_argument_group("serving"))
    _add_admission_flags(serve.add_argument_group("admission (default: no limit)"))
    _add_timing_flags(serve.add_argument_group("timing, in seconds"))
    _add_online_flags(serve.add_argument_group("online calibration"))
    add_settings_flags(
        serve.add_argument_group("limits and timings (also in the environment or file)")
    )
    serve.set_defaults(handler=_serve)


def _add_backend_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--spec",
        action="append",
        metavar="URL",
        help="a speculative backend (repeatable); dns+http://NAME:PORT: each address of NAME",
    )
    group.add_argument("--base", action="append", metavar="URL", help="a plain backend, likewise")
    group.add_argument(
        "--backends-file",
        metavar="FILE",
        help="backends from a watched file_sd JSON file (labels pool=spec|base, group)",
    )
    group.add_argument(
        "--group",
        dest="groups",
        action="append",
        metavar="URL,URL",
        type=_urls,
        help="servers sharing GPUs (the shared topology), compared with the crossover together",
    )


def _add_policy_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--policy",
        help=", ".join(f"{name} (default)" if name == "crossover" else name for name in REGISTRY),
    )
    group.add_argument(
        "--policy-param",
        dest="given_params",
        action="append",
        metavar="KEY=VALUE",
        help="a parameter of the policy (repeatable); each policy's are listed below",
    )
    for key in FLAT_KEYS:  # each a setting of its own once; kept for one release
        group.add_argument(
            f"--{key.replace('_', '-')}",
            metavar=kind_of(key),
            help=f"deprecated: use --policy-param {key}=VALUE",
        )
    group.add_argument("--profile", metavar="FILE", help="a specroute.profile/v1 file")
    group.add_argument(
        "--concurrency-source",
        choices=["router", "backend", "max", "replicas"],
        help="replicas: for several routers in front of the same servers",
    )
    group.add_argument(
        "--placement",
        choices=["least-load", "prefix-affinity"],
        help="within the pool chosen: its least-loaded server (default), or the one the "
        "prompt's first bytes hash to, for its prefix cache",
    )
    group.add_argument(
        "--affinity-prefix-bytes",
        type=int,
        metavar="N",
        help="prefix-affinity: the prompt's bytes hashed (default 1024)",
    )
    group.add_argument(
        "--affinity-balance-abs",
        type=int,
        metavar="N",
        help="prefix-affinity: requests by which the hashed server may be busier than the "
        "least-loaded one (default 16) ...",
    )
    group.add_argument(
        "--affinity-balance-rel",
        type=float,
        metavar="X",
        help="... and how many times as busy (default 1.5); past both, least load wins",
    )


def _add_serving_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--host")
    group.add_argument("--port", type=int)
    group.add_argument("--config", metavar="FILE", help="a TOML file of settings")
    keys = "prefer the environment (SPECROUTE_API_KEYS='[\"k\"]', SPECROUTE_ADMIN_KEY) over flags"
    group.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        metavar="KEY",
        help=f"a client key (repeatable); {keys}",
    )
    group.add_argument(
        "--admin-key",
        metavar="KEY",
        help="the key for POST /router/profile, GET /router/profile/live and the peers' "
        "GET /router/online/samples",
    )
    group.add_argument("--backend-api-key", metavar="KEY", help="sent to the backends")
    group.add_argument(
        "--request-id-header",
        dest="request_id_headers",
        action="append",
        metavar="NAME",
        help="a header a client's request id is read from (repeatable; default x-request-id)",
    )
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as text (default) or as one JSON object a line",
    )
    group.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one line for each request as it ends (default on)",
    )
    group.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="router processes sharing the port and one view of load (default 1)",
    )
    group.add_argument(
        "--front",
        choices=("own", "aiohttp"),
        help="what serves the proxied paths: the router's own HTTP/1.1 front (default), a "
        "fraction of aiohttp's CPU a request (other paths stay aiohttp's), or aiohttp's server",
    )
    group.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="export OpenTelemetry traces to this OTLP/HTTP URL (needs specroute[otel])",
    )


def _add_admission_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--max-concurrent-requests",
        type=int,
        metavar="N",
        help="requests served at once, through every worker; more wait in the queue",
    )
    group.add_argument(
        "--queue-size", type=int, metavar="N", help="requests that may wait; then 429 (100)"
    )
    group.add_argument(
        "--queue-timeout", type=float, metavar="S", help="longest wait; then 503 (60)"
    )
    group.add_argument(
        "--queue-at-capacity",
        action="store_const",
        const=True,
        help="wait while every server of the pool chosen runs its max_running_requests",
    )
    group.add_argument(
        "--rate-limit", type=float, metavar="R", help="requests a second each API key may send"
    )
    group.add_argument(
        "--rate-limit-burst", type=int, metavar="N", help="requests a key may send at once"
    )


_TIMES = (
    (
        "--watch-interval",
        "between readings of names, the backends file and the profile (default 5)",
    ),
    ("--poll-interval", "between readings of each backend's load and metrics (default 0.5)"),
    ("--drain-grace", "after SIGTERM: answering not-ready, still serving (default 5)"),
    ("--drain-timeout", "then: the longest the requests in flight get to finish (default 30)"),
)


def _add_timing_flags(group: argparse._ArgumentGroup) -> None:
    for flag, about in _TIMES:
        group.add_argument(flag, type=float, metavar="S", help=about)


def _add_online_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--online",
        choices=["off", "observe", "adopt"],
        help="the crossover learned from live traffic: observe (default) estimates and "
        "flags drift; adopt routes by it once sure",
    )
    for flag, kind, metavar, about in (
        ("--online-interval", float, "S", "seconds between fits (default 5)"),
        ("--online-window-seconds", float, "S", "samples older do not count (default 3600)"),
        ("--online-window-samples", int, "N", "the last samples per pool and level (64)"),
        ("--online-min-samples", int, "N", "adopt: live samples per level around it (16)"),
        ("--online-max-ratio", float, "R", "adopt: the widest interval, high / low (2)"),
        ("--online-explore-share", float, "F", "the most explored, in turns (0.02; 0: none)"),
        ("--online-explore-span", float, "F", "explored within this factor of it (4)"),
        ("--online-accept-tolerance", float, "X", "another drafter's past this, relative (0.25)"),
    ):
        group.add_argument(flag, type=kind, metavar=metavar, help=about)
    group.add_argument(
        "--online-peers",
        action="extend",
        metavar="URL,URL",
        type=_urls,
        help="the other router replicas, whose samples each fit takes too, by URL or by "
        "name (dns+http://NAME:PORT: each address a replica, this one skipped); repeatable; "
        "needs --admin-key",
    )


def _urls(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


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
