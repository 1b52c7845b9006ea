"""Placement within a pool: the policy's least-loaded pick, or prefix affinity."""

from __future__ import annotations

from typing import Any

import pytest

from specroute.cli import parser
from specroute.policies.decision import Decision
from specroute.policies.placement import LeastLoad, PrefixAffinity
from specroute.policies.view import BackendView, ConcurrencySource, RequestInfo, View
from specroute.router.components import placer
from specroute.router.proxy.request import prefix, request_info
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings

AFFINITY = PrefixAffinity(prefix_bytes=64, balance_abs=4, balance_rel=1.5)


def server(name: str, load: int = 0, **kw: Any) -> BackendView:
    pool = kw.pop("pool", "spec")
    return BackendView(f"{pool}:{name}", pool, kw.pop("healthy", True), load, **kw)


def view(*backends: BackendView) -> View:
    return View(backends, ConcurrencySource.ROUTER)


def placed(v: View, key: bytes, policy_pick: str | None = None) -> tuple[str | None, str]:
    """Where ``AFFINITY`` puts a request whose prefix is ``key``, after a policy that chose
    the spec pool's least-loaded server."""
    pick = policy_pick or v.least_loaded("spec")
    name = pick if isinstance(pick, str) or pick is None else pick.name
    decision, outcome = AFFINITY.place(
        Decision("spec", name, "below_crossover"), RequestInfo("/v1/chat", prefix=key), v
    )
    assert decision.pool == "spec" and decision.reason == "below_crossover"
    return decision.backend, outcome


KEYS = [f"system prompt {i}".encode() for i in range(40)]


def test_one_prefix_one_server_and_prefixes_spread() -> None:
    v = view(server("a"), server("b"), server("c"))
    homes = {key: placed(v, key)[0] for key in KEYS}
    assert len(set(homes.values())) == 3  # forty prefixes over three servers
    busier = view(server("a", 3), server("b", 1), server("c", 2))  # within the thresholds
    assert all(placed(busier, key) == (homes[key], "affinity") for key in KEYS)


def test_a_server_leaving_moves_only_its_own_prefixes() -> None:
    v = view(server("a"), server("b"), server("c"))
    before = {key: placed(v, key)[0] for key in KEYS}
    ejected = view(server("a"), server("b", healthy=False), server("c"))
    after = {key: placed(ejected, key)[0] for key in KEYS}
    assert "spec:b" not in after.values()
    assert all(after[k] == before[k] for k in KEYS if before[k] != "spec:b")


@pytest.mark.parametrize(
    ("home_load", "other_load", "outcome"),
    [
        pytest.param(4, 0, "affinity", id="at-the-absolute-threshold"),
        pytest.param(5, 0, "balance", id="past-both"),
        pytest.param(20, 14, "affinity", id="past-absolute-not-relative"),
        pytest.param(22, 14, "balance", id="past-both-busy"),
    ],
)
def test_too_busy_a_home_gives_way_to_the_least_loaded(
    home_load: int, other_load: int, outcome: str
) -> None:
    key = KEYS[0]
    home = placed(view(server("a"), server("b")), key)[0]
    assert home is not None
    other = "spec:b" if home == "spec:a" else "spec:a"
    loads = {home: home_load, other: other_load}
    v = view(server("a", loads["spec:a"]), server("b", loads["spec:b"]))
    assert placed(v, key) == ((home, outcome) if outcome == "affinity" else (other, outcome))


def test_a_full_server_is_never_its_prefixes_home() -> None:
    key = KEYS[0]
    home = placed(view(server("a"), server("b")), key)[0]
    capped = [
        server(n, 8 if f"spec:{n}" == home else 0, max_running_requests=8) for n in ("a", "b")
    ]
    where, outcome = placed(view(*capped), key)
    assert where != home and outcome == "full"


def test_it_stays_in_the_pool_and_group_the_policy_chose() -> None:
    v = view(
        server("a", group="g1"),
        server("b", group="g2"),
        server("c", pool="base", group="g1"),
    )
    for key in KEYS:
        assert placed(v, key, "spec:a")[0] == "spec:a"


def test_without_a_prompt_or_a_backend_the_policy_s_pick_stands() -> None:
    v = view(server("a"), server("b", 1))
    assert placed(v, b"") == ("spec:a", "no_prefix")
    none = Decision("spec", None, "no_healthy_backend")
    assert AFFINITY.place(none, RequestInfo("/v1/chat", prefix=b"x"), v)[0] is none
    pick = Decision("spec", "spec:b", "x")
    assert LeastLoad().place(pick, RequestInfo("/", prefix=b"x"), v) == (pick, "least_load")


def test_the_prefix_is_a_chat_s_first_messages_and_grows_with_it() -> None:
    system = {"role": "system", "content": "You are terse."}
    turn = [system, {"role": "user", "content": "Hi."}]
    later = [*turn, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "?"}]
    assert prefix({"messages": turn}, 1024).startswith(b"system\x1fYou are terse.\x1e")
    assert prefix({"messages": later}, 1024).startswith(prefix({"messages": turn}, 1024))
    assert prefix({"messages": later}, 10) == prefix({"messages": turn}, 10) == b"system\x1fYou"
    other = [{"role": "user", "content": "You are terse."}]
    assert prefix({"messages": other}, 64) != prefix({"messages": turn}, 64)  # roles count
    assert prefix({"prompt": "héllo"}, 2) == "hé".encode()[:2]
    assert prefix({"input_ids": [1, 22, 333]}, 64) == b"1,22,333"
    assert prefix({"prompt": [[5, 6]]}, 64) == b"5,6"
    assert prefix({"max_tokens": 3}, 64) == b""
    assert request_info("/v1/chat/completions", {"messages": turn}).prefix == b""


def settings(**given: Any) -> RouterSettings:
    return RouterSettings(**({"spec": ["http://a:1"], "base": ["http://b:1"]} | given))


def test_the_placement_is_a_setting_and_a_flag() -> None:
    flags = ["serve", "--spec", "http://a:1", "--base", "http://b:1"]
    flags += ["--placement", "prefix-affinity", "--affinity-prefix-bytes", "256"]
    assert placer(settings(**given_settings(parser().parse_args(flags))).routing) == PrefixAffinity(
        prefix_bytes=256
    )
    assert placer(settings().routing) == LeastLoad()
    with pytest.raises(ValueError, match="placement"):
        settings(placement="random")
    with pytest.raises(ValueError, match="affinity_balance_rel"):
        settings(affinity_balance_rel=0.5)


def test_in_the_speculative_pool_no_server_at_the_crossover_is_chosen_by_its_hash() -> None:
    key = KEYS[0]
    home = placed(view(server("a"), server("b")), key)[0]
    other = "spec:b" if home == "spec:a" else "spec:a"
    loads = {home: 3, other: 1}
    v = view(server("a", loads["spec:a"]), server("b", loads["spec:b"]))
    request = RequestInfo("/v1/chat", prefix=key)
    decision = Decision("spec", other, "below_crossover")
    assert AFFINITY.place(decision, request, v)[0].backend == home  # within the thresholds
    assert AFFINITY.place(decision, request, v, ceiling=3)[0].backend == other
    assert AFFINITY.place(decision, request, v, ceiling=3.5)[0].backend == home


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "not a list"},
        {"messages": [1, None, {"role": ["x"], "content": [{"text": 3}, "part", {"text": "ok"}]}]},
        {"messages": [{"role": "user", "content": "\ud800 lone surrogate"}]},
        {"prompt": [[1, "a", None]]},
        {"prompt": ["first", "second"]},
        {"input_ids": []},
        {"text": None, "prompt": {"a": 1}},
    ],
)
def test_any_body_gives_a_prefix_of_at_most_its_size(body: dict[str, Any]) -> None:
    assert len(prefix(body, 16)) <= 16
