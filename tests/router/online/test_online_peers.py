"""Several router replicas in front of the same servers learning as one: each serves its own
samples to the others (``GET /router/online/samples``), each leader takes the others' before
each fit (``--online-peers``), and a sample's load counts the other replicas' requests as
the policy does under ``--concurrency-source replicas``. Real emulators and real routers on
loopback ports, at a twentieth of real time."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from specroute.cli import main
from specroute.loadgen.spawn import free_port
from specroute.online.samples import Sample, Samples, beside_other
from specroute.router.app import create_app
from specroute.router.backends.discovery import Resolve, resolve_ipv4
from specroute.router.http.runner import RouterRunner
from specroute.router.online.peer_answer import SAMPLES_PATH, answer, parse
from specroute.router.online.rings import Rings
from specroute.router.settings import RouterSettings
from specroute.router.state import STATE, RouterState
from specroute.router.tasks.online_fits import fit_now
from specroute.router.workers.board import Board
from tests.apps import serving
from tests.conditions import until
from tests.router.online.test_online_live import streamed

KEY = "peer-admin-k3y"
FITTING: dict[str, Any] = {"online_interval": 0.1, "poll_interval": 0.02, "stale_after": 0.5}
# a health check that a busy machine made fail at the start is retried within a fraction
HEALING: dict[str, Any] = {"health_interval": 0.2, "eject_seconds": 0.2}


@asynccontextmanager
async def replica(
    port: int = 0, host: str = "127.0.0.1", resolve: Resolve = resolve_ipv4, **settings: Any
) -> AsyncIterator[tuple[str, RouterState]]:
    """A router on ``port`` (chosen before, so that replicas can name each other) of
    ``host``, resolving names with ``resolve``, once it sees every backend healthy."""
    app = create_app(RouterSettings(**HEALING, **settings), resolve=resolve)
    async with serving(app, RouterRunner, port, host) as url:
        state = app[STATE]
        await until(lambda: all(b.healthy for b in state.roster.backends))
        yield url, state


def counted(state: RouterState, name: str, **labels: str) -> float:
    """A counter's value in the router's registry (0 when it has no such sample)."""
    found = state.metrics.exposed.get_sample_value(name, labels)
    return 0.0 if found is None else found


def now() -> float:
    return time.monotonic()


# the answer's shape, pure


def _row(**given: Any) -> dict[str, Any]:
    row = {"age": 1.0, "pool": "spec", "load": 2.0, "tpot": 0.01, "context": 300, "beside": 0.5}
    return row | given


@pytest.mark.parametrize(
    "row",
    [
        _row(pool="draft"),
        _row(load=-1.0),
        _row(tpot=0.0),
        _row(tpot=math.inf),
        _row(age=-0.5),
        _row(age=601.0),  # older than the window
        _row(context=True),
        _row(context=1.5),
        _row(load="2"),
        _row(beside=-0.1),
        _row(beside="0"),
        _row(depth=-1.0),
        _row(depth="3"),
        _row(accept_length=0.0),
        _row(accept_length="2"),
        "not a row",
    ],
    ids=[
        "pool",
        "negative-load",
        "zero-tpot",
        "infinite-tpot",
        "negative-age",
        "too-old",
        "bool-context",
        "fractional-context",
        "string-load",
        "negative-beside",
        "string-beside",
        "negative-depth",
        "string-depth",
        "zero-accept-length",
        "string-accept-length",
        "string",
    ],
)
def test_a_peer_s_bad_row_is_dropped_and_counted(row: Any) -> None:
    read = parse({"epoch": "e", "next": "e:1", "samples": [_row(), row]}, 100.0, 600.0)
    assert read.dropped == 1
    assert read.samples == [Sample(99.0, "spec", 2.0, 0.01, 300, beside=0.5)]  # age at receipt


def test_an_answer_written_reads_back_at_the_reader_s_times() -> None:
    written = answer("e", "e:2", [Sample(10.0, "base", 3.0, 0.02, 40, beside=1.5)], now=12.0)
    read = parse(written, received=500.0, max_age=600.0)
    assert (read.epoch, read.next, read.dropped) == ("e", "e:2", 0)
    assert read.samples == [Sample(498.0, "base", 3.0, 0.02, 40, beside=1.5)]


def test_a_row_without_its_load_beside_is_never_taken_for_one_alone_on_its_gpus() -> None:
    """A replica that does not send the other pool's load beside a sample (an older one):
    unknown, so on shared GPUs the fit leaves it out rather than take it for one alone."""
    row = {k: v for k, v in _row().items() if k != "beside"}
    (read,) = parse({"epoch": "e", "next": "e:1", "samples": [row]}, 100.0, 600.0).samples
    assert read.beside == math.inf and beside_other(read)
    assert not beside_other(read._replace(beside=0.0))


def test_a_peer_s_depth_comes_with_its_sample_and_a_row_without_one_is_unknown() -> None:
    """A replica sends its samples' draft depths, so that accept lengths read at another
    depth are not taken for another drafter's; an older one's rows, without, read as
    unknown."""
    spec = Sample(5.0, "spec", 2.0, 0.01, 300, 2.4, 0.0, 3.0)
    (row,) = answer("e", "e:1", [spec], 6.0)["samples"]
    (read,) = parse({"epoch": "e", "next": "e:1", "samples": [row]}, 100.0, 600.0).samples
    assert read.depth == 3.0 and read.accept_length == 2.4 and row["age"] == 1.0
    (older,) = parse({"epoch": "e", "next": "e:1", "samples": [_row()]}, 100.0, 600.0).samples
    assert older.depth is None


def test_samples_taken_late_are_kept_in_time_order() -> None:
    """Peers' samples come a fit late: the window still forgets the oldest first."""
    samples = Samples(keep=3, max_age=10.0)
    for at in (1.0, 4.0):
        samples.add(Sample(at, "spec", 1.0, 0.01, 0))
    samples.merge([Sample(3.0, "base", 1.0, 0.01, 0), Sample(2.0, "base", 1.0, 0.01, 0)])
    assert [s.at for s in samples.window(4.0)] == [2.0, 3.0, 4.0]  # 1.0 forgotten by count
    assert [s.at for s in samples.window(13.5)] == [4.0]  # and by age


def test_the_rings_cursor_gives_only_newer_samples_and_another_epoch_gives_all() -> None:
    rings = Rings(2, 4)
    rings.add(Sample(1.0, "spec", 1.0, 0.01, 0))
    first, cursor = rings.after(None)
    rings.become(1)
    rings.add(Sample(2.0, "base", 1.0, 0.01, 0))
    newer, _ = rings.after(cursor)
    assert [s.at for s in first] == [1.0] and [s.at for s in newer] == [2.0]
    assert [s.at for s in rings.after("another-epoch:5.5")[0]] == [1.0, 2.0]
    assert rings.fresh() and not rings.fresh()  # the leader's reading is apart
    with pytest.raises(ValueError, match="2 counts"):
        rings.after(f"{rings.epoch}:1")


def test_the_other_routers_requests_are_held_between_readings_while_believed() -> None:
    """The others' part of a server's load is its report less this router's own then, held
    from one reading to the next, and for no longer than a reading is believed."""
    board = Board(1, 1)
    board.add_inflight(0, 1, 0)  # this router's one request
    board.publish_reading(0, (5.0, 1.0, None, None, None), None, None, at=10.0, believed_for=2.0)
    assert board.others(0, 10.5) == 5.0  # 5 running + 1 queued - 1 of its own
    start = board.others_lived(0, 10.0)
    board.publish_reading(0, (2.0, 0.0, None, None, None), None, None, at=11.0, believed_for=2.0)
    assert board.others_lived(0, 12.0) - start == pytest.approx(5.0 + 1.0)
    assert board.others_lived(0, 20.0) - start == pytest.approx(5.0 + 2 * 1.0)  # then stale
    assert board.others(0, 20.0) == 0.0
    board.publish_reading(0, (None, None, None, None, None), None, None, at=21.0, believed_for=2.0)
    assert board.others(0, 21.5) == 0.0  # no running count: none, as the policy counts


# a sample's load under replicas


async def test_under_replicas_a_sample_counts_the_other_replica_s_requests(
    backends: tuple[str, str],
) -> None:
    """Replica B keeps four streams on the speculative server; replica A sends one at a
    time. Counted as the policy counts it under ``replicas``, A's samples decoded among
    about five; B, counting by ``router``, sees its own four alone."""
    spec, base = backends
    both: dict[str, Any] = {"spec": [spec], "base": [base], "crossover": 64, **FITTING}
    async with (
        replica(**both, concurrency_source="replicas") as (a, state_a),
        replica(**both, concurrency_source="router") as (b, state_b),
    ):
        await until(lambda: state_a.roster.backends[0].reading(1.0, time.monotonic()))
        stop = asyncio.Event()

        async def busy() -> None:
            while not stop.is_set():
                await streamed(b, usage=True, max_tokens=160)

        crowd = [asyncio.create_task(busy()) for _ in range(4)]
        await asyncio.sleep(0.3)  # the four running, and read by A's leader
        for _ in range(4):
            await streamed(a, usage=True, max_tokens=160)
        stop.set()
        await asyncio.gather(*crowd)
        now = time.monotonic()
        loads_a = [s.load for s in state_a.online.samples.window(now)]
        loads_b = [s.load for s in state_b.online.samples.window(now)]
    # counted by router, A's would be 1; B's four, with the gaps between their streams
    assert len(loads_a) == 4 and all(s >= 2.0 for s in loads_a), loads_a
    assert sum(loads_a) / 4 >= 2.5, loads_a
    assert loads_b and all(s <= 4.5 for s in loads_b), loads_b


# merged estimates


async def test_two_replicas_as_each_other_s_peers_fit_from_both_s_samples(
    backends: tuple[str, str],
) -> None:
    """Traffic split between two replicas that name each other: each fits from the samples
    of both, and their fits agree level by level; a third without peers counts its own."""
    spec, base = backends
    ports = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    shared: dict[str, Any] = {  # servers on GPUs of their own: every sample alone on its GPUs
        "spec": [spec],
        "base": [base],
        "crossover": 2.5,
        "given_params": {"topology": "partitioned"},
        "concurrency_source": "replicas",
        "admin_key": KEY,
        **FITTING,
    }
    async with (
        replica(ports[0], **shared, online_peers=[urls[1]]) as (a, state_a),
        replica(ports[1], **shared, online_peers=[urls[0]]) as (b, state_b),
        replica(**shared) as (c, state_c),
    ):
        await asyncio.gather(
            *(streamed(a, usage=True) for _ in range(6)),
            *(streamed(b, usage=True) for _ in range(4)),
            *(streamed(c, usage=True) for _ in range(3)),
        )
        states = state_a, state_b
        await until(lambda: all(len(s.online.samples) == 10 for s in states))
        for state in (*states, state_c):
            await fit_now(state)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{a}/router/status") as r:
                peers = (await r.json())["online"]["peers"]
            own = await _pulled(session, a, None)
    assert [f.samples for f in state_a.online.fits] == [10]
    assert [f.samples for f in state_c.online.fits] == [3]  # no peers: its own alone
    assert state_a.online.fits[0].curves == state_b.online.fits[0].curves
    assert state_a.online.fits[0].crossing == state_b.online.fits[0].crossing
    assert counted(state_a, "specroute_online_peer_samples_total", peer=urls[1]) == 4
    assert peers[0]["peer"] == urls[1] and peers[0]["samples"] == 4
    assert peers[0]["state"] == "answering"  # (it may have failed once, before B was up)
    assert len(own["samples"]) == 6  # its own: never those it took from B


async def _pulled(session: aiohttp.ClientSession, url: str, after: str | None) -> Any:
    params = {} if after is None else {"after": after}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with session.get(url + SAMPLES_PATH, params=params, headers=headers) as r:
        assert r.status == 200
        return await r.json()


async def test_the_samples_endpoint_needs_the_key_and_gives_only_newer_samples(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    given: dict[str, Any] = {"spec": [spec], "base": [base], "crossover": 8, "admin_key": KEY}
    unkeyed = given | {"admin_key": None, "api_keys": ["client-key"]}
    async with (
        replica(**given) as (url, _),
        replica(**unkeyed) as (closed, _),
        replica(**given, online="off") as (off, _),
        aiohttp.ClientSession() as session,
    ):
        async with session.get(off + SAMPLES_PATH, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 409  # online off: it records none, and says so
            assert "records no samples" in (await r.json())["error"]["message"]
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with session.get(url + SAMPLES_PATH, headers=headers) as r:
                assert r.status == 401
                assert KEY not in await r.text()
        for headers in ({}, {"Authorization": "Bearer client-key"}):  # fails closed
            async with session.get(closed + SAMPLES_PATH, headers=headers) as r:
                assert r.status == 403
        await streamed(url, usage=True)
        first = await _pulled(session, url, None)
        await streamed(url, usage=True)
        await streamed(url, usage=True)
        newer = await _pulled(session, url, first["next"])
        again = await _pulled(session, url, newer["next"])
        stale = await _pulled(session, url, "an-epoch-before:7")
    assert len(first["samples"]) == 1 and len(newer["samples"]) == 2
    assert again["samples"] == [] and newer["epoch"] == first["epoch"]
    assert len(stale["samples"]) == 3  # a cursor from before a restart: all it keeps
    row = newer["samples"][0]
    assert set(row) == {
        "age",
        "pool",
        "load",
        "tpot",
        "context",
        "accept_length",
        "beside",
        "depth",
        "prefill",
    }
    assert row["prefill"] is not None and row["prefill"] >= 0  # known: the router sent them
    assert row["age"] >= 0


# failing peers


@asynccontextmanager
async def answering(body: str) -> AsyncIterator[str]:
    """A server that gives ``body`` at the samples' path, whatever it is asked."""

    async def given(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get(SAMPLES_PATH, given)
    async with serving(app) as url:
        yield url


HALF_BAD = json.dumps({"epoch": "p", "next": "p:0", "samples": [_row(), _row(tpot=-1)]})


async def test_failing_peers_are_counted_by_reason_logged_once_and_serving_goes_on(
    backends: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="specroute.router")
    spec, base = backends
    given: dict[str, Any] = {"spec": [spec], "base": [base], "crossover": 8, **FITTING}
    nowhere = f"http://127.0.0.1:{free_port()}"
    async with (
        replica(**given, admin_key="another-key") as (keyed_otherwise, _),
        answering("<html>not the samples</html>") as garbage,
        answering(HALF_BAD) as half_bad,
    ):
        peers = [keyed_otherwise, nowhere, garbage, half_bad]
        secret = f"http://user:pa55w0rd@{keyed_otherwise.removeprefix('http://')}"
        async with replica(**given, admin_key=KEY, online_peers=[secret, *peers[1:]]) as (
            url,
            state,
        ):
            await until(lambda: counted(state, _ERRORS, peer=garbage, reason="not_json") >= 3)
            await streamed(url, usage=True)  # it serves on, and records its own
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{url}/router/status") as r:
                    status = await r.text()
                    shown = (await r.json())["online"]["peers"]
                async with session.get(f"{url}/metrics") as r:
                    metrics = await r.text()
            await until(lambda: any(s.tpot != 0.01 for s in state.online.samples.window(now())))
    reasons = ("refused", "unreachable", "not_json", "bad_row")
    for peer, reason in zip(peers, reasons, strict=True):
        assert counted(state, _ERRORS, peer=peer, reason=reason) >= 1, (peer, reason)
        taken = counted(state, "specroute_online_peer_samples_total", peer=peer)
        assert taken == 0 if reason != "bad_row" else taken >= 1  # its good row, each pull
        said = [r for r in caplog.records if f"Online peer {peer}: " in r.getMessage()]
        assert len(said) == 1 and reason in said[0].getMessage(), [r.getMessage() for r in said]
    assert [p["last_error"] for p in shown] == list(reasons)
    assert [p["samples"] for p in shown][:3] == [0, 0, 0]
    text = "\n".join(r.getMessage() for r in caplog.records)
    exposed = generate_latest(state.metrics.exposed).decode()
    for hidden in (KEY, "pa55w0rd"):
        assert all(hidden not in shown for shown in (text, status, metrics, exposed))


_ERRORS = "specroute_online_peer_errors_total"


def test_serve_refuses_peers_without_an_admin_key(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "--spec", "http://a:1", "--base", "http://b:2"]
    assert main([*argv, "--online-peers", "http://r2:8000,http://r3:8000"]) == 2
    assert "online_peers needs the router's admin key" in capsys.readouterr().err
    settings = RouterSettings.model_validate(
        {"spec": ["http://a:1"], "base": ["http://b:2"], "admin_key": KEY}
        | {"online_peers": ["http://r2:1/", "http://r2:1"]}
    )
    assert settings.online.peers == ["http://r2:1"]
