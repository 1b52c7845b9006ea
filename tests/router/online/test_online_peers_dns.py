"""Router replicas that find each other by name (``--online-peers dns+http://NAME:PORT``), as
pods behind a headless Service do: each address of the name is a peer on the port, this
router among them, skipped quietly; a name that does not resolve keeps the peers it gave,
counted and logged once; peers gone from the name are no longer asked nor shown. Real
routers on one port of two loopback addresses, a resolver standing for the cluster's DNS."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from specroute.loadgen.spawn import free_port
from specroute.router.metrics import RouterMetrics
from specroute.router.online.peers import Peers
from specroute.router.settings import RouterSettings
from tests.conditions import until
from tests.router.online.test_online_live import streamed
from tests.router.online.test_online_peers import (
    FITTING,
    KEY,
    _row,
    answering,
    counted,
    replica,
)

NAME = "specroute-peers.specroute.svc.cluster.local"
ERRORS = "specroute_online_peer_errors_total"
TAKEN = "specroute_online_peer_samples_total"


async def test_replicas_found_by_name_take_each_other_s_samples_and_skip_themselves(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    port = free_port()
    hosts = ["127.0.0.1", "127.0.0.2"]

    async def cluster_dns(host: str, at: int) -> list[str]:
        assert (host, at) == (NAME, port)
        return hosts

    shared: dict[str, Any] = {
        "spec": [spec],
        "base": [base],
        "crossover": 2.5,
        "admin_key": KEY,
        "online_peers": [f"dns+http://{NAME}:{port}"],
        **FITTING,
    }
    async with (
        replica(port, hosts[0], cluster_dns, **shared) as (a, state_a),
        replica(port, hosts[1], cluster_dns, **shared) as (b, state_b),
    ):
        await asyncio.gather(
            *(streamed(a, usage=True) for _ in range(3)),
            *(streamed(b, usage=True) for _ in range(2)),
        )
        await until(lambda: all(len(s.online.samples) == 5 for s in (state_a, state_b)))
        await until(lambda: all(p["state"] != "new" for p in state_a.online.peers))
        async with aiohttp.ClientSession() as session, session.get(f"{a}/router/status") as r:
            shown = (await r.json())["online"]["peers"]
    by = {p["peer"]: p for p in shown}
    assert set(by) == {a, b}
    assert by[a]["state"] == "itself" and by[a]["last_error"] is None
    assert by[b]["state"] == "answering" and by[b]["samples"] == 2
    assert {p["by"] for p in shown} == {f"dns+http://{NAME}:{port}"}
    assert counted(state_a, ERRORS, peer=a, reason="itself") == 0  # quietly: not an error
    assert counted(state_a, TAKEN, peer=b) == 2 and counted(state_b, TAKEN, peer=a) == 3


async def test_a_name_that_fails_keeps_its_peers_and_one_gone_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="specroute.router")
    good = json.dumps({"epoch": "peer", "next": "peer:1", "samples": [_row()]})
    async with answering(good) as url, aiohttp.ClientSession() as session:
        port = int(url.rsplit(":", 1)[1])
        name = f"dns+http://{NAME}:{port}"
        answers: list[list[str] | OSError] = [["127.0.0.1"], OSError("no"), OSError("no"), []]

        async def cluster_dns(host: str, at: int) -> list[str]:
            answer = answers.pop(0)
            if isinstance(answer, OSError):
                raise answer
            return answer

        metrics = RouterMetrics(None)
        peers = Peers([name], metrics, "mine", 600.0, 100, cluster_dns, every=0.0)
        taken = [len(await peers.pull(session, 2.0)) for _ in range(3)]
        kept = [p["peer"] for p in peers.describe()]
        await peers.pull(session, 2.0)
    value = metrics.exposed.get_sample_value
    assert taken == [1, 1, 1] and kept == [url]  # the last answer, while the name failed
    assert value(ERRORS, {"peer": name, "reason": "resolve"}) == 2
    said = [
        r.getMessage() for r in caplog.records if "Resolving the online peers" in r.getMessage()
    ]
    assert len(said) == 1, said  # once per change
    assert peers.describe() == [] and not peers.peers  # gone from the name: not asked
    assert value(TAKEN, {"peer": url}) == 3  # its series stays


async def test_a_peer_found_under_two_names_is_one_peer_asked_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="specroute.router")
    good = json.dumps({"epoch": "peer", "next": "peer:1", "samples": [_row()]})
    async with answering(good) as url, aiohttp.ClientSession() as session:
        port = url.rsplit(":", 1)[1]
        names = [f"dns+http://{NAME}:{port}", f"dns+http://other.{NAME}:{port}"]

        async def cluster_dns(host: str, at: int) -> list[str]:
            return ["127.0.0.1"]

        metrics = RouterMetrics(None)
        peers = Peers(names, metrics, "mine", 600.0, 100, cluster_dns, every=0.0)
        taken = [len(await peers.pull(session, 2.0)) for _ in range(2)]
    found = [r.getMessage() for r in caplog.records if "found by" in r.getMessage()]
    assert taken == [1, 1]  # asked once a pull, not once a name
    assert [p["peer"] for p in peers.describe()] == [url]
    assert len(found) == 1, found
    assert metrics.exposed.get_sample_value(TAKEN, {"peer": url}) == 2


async def test_this_router_is_an_error_given_as_a_url_and_quiet_found_by_name() -> None:
    itself = json.dumps({"epoch": "mine", "next": "mine:1", "samples": [_row()]})
    async with answering(itself) as url, aiohttp.ClientSession() as session:
        name = f"dns+http://{NAME}:{url.rsplit(':', 1)[1]}"

        async def cluster_dns(host: str, at: int) -> list[str]:
            return ["127.0.0.1"]

        shown: dict[str, dict[str, Any]] = {}
        for given in (url, name):
            metrics = RouterMetrics(None)
            peers = Peers([given], metrics, "mine", 600.0, 100, cluster_dns, every=0.0)
            assert [len(await peers.pull(session, 2.0)) for _ in range(2)] == [0, 0]
            errors = metrics.exposed.get_sample_value(ERRORS, {"peer": url, "reason": "itself"})
            (shown[given],) = peers.describe()
            shown[given]["errors"] = errors
    assert shown[url]["last_error"] == "itself" and shown[url]["errors"] == 2
    assert shown[name]["state"] == "itself" and shown[name]["by"] == name
    assert shown[name]["last_error"] is None and shown[name]["errors"] is None  # never counted


def test_peers_by_name_are_settings_like_backends() -> None:
    given: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:2"], "admin_key": KEY}
    for url in (f"dns+http://{NAME}:8000", f"dns+https://{NAME}:8443"):
        assert RouterSettings(**given, online_peers=[url]).online.peers == [url]
    for bad in (f"dns+http://{NAME}", "ftp://r:1"):
        with pytest.raises(ValidationError, match="peer's"):
            RouterSettings(**given, online_peers=[bad])
