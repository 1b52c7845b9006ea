"""A profile from production: the router's live fit written as a profile document
(``router.live_profile``), served at ``GET /router/profile/live`` and fetched by
``specroute profile --from-live``; offline from synthetic samples, and live through a
router over two emulators."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import pytest

from specroute.cli import main
from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.spawn import spawned
from specroute.model_flags import config_from_flags
from specroute.online.estimator import Online, OnlineMode, Sureness
from specroute.online.samples import Sample, Samples
from specroute.policies.curves import context_curves, curves
from specroute.policies.profile import load_profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import BackendView, RequestInfo, View
from specroute.router.online.live_profile import LiveProfileRefused, Serving, live_profile
from specroute.router.operator.openapi import document as openapi
from tests.emulators import running_emulator
from tests.router.online.test_online import (
    LEVELS,
    Model,
    dense,
    moe,
    profile_of,
    served,
    true_crossover,
)
from tests.router.online.test_online_live import streamed as streamed_with_usage
from tests.routers import running_router

SERVING = Serving(
    {"spec": ("spec:127.0.0.1:1",), "base": ("base:127.0.0.1:2",)},
    {"spec": 256, "base": None},
    2.9,
)
CREATED = "2026-12-01T21:00:00+00:00"
KEY = "adm1n-l1ve-k3y-7f"


def online(mode: OnlineMode = OnlineMode.OBSERVE, min_samples: int = 10) -> Online:
    return Online(mode, Samples(1 << 14, 600.0), Sureness(min_samples), per_level=64)


def fed(samples: list[Sample], profile: Any = None, min_samples: int = 10) -> Online:
    learning = online(min_samples=min_samples)
    for s in samples:
        learning.record(s)
    learning.refit(1.0, profile, shared=True)
    return learning


def seated(load: int) -> View:
    """A view where a new request joins ``load`` others on the one GPU group."""
    return View((BackendView("s1", "spec", True, load), BackendView("b1", "base", True, 0)))


def test_the_live_fit_is_a_profile_whose_crossover_policy_routes_at_the_live_crossover() -> None:
    learning = fed(served(dense(), 40))
    found = learning.fits[0].crossing
    assert found is not None and found.at is not None and found.low is not None
    document = live_profile(learning, None, SERVING, 2.0, CREATED)

    profile = parse_profile(json.loads(json.dumps(document)))  # as the file reads back
    described = {"$ref": "#/components/schemas/Profile", "components": openapi()["components"]}
    jsonschema.Draft202012Validator(described).validate(document)  # as the router describes it
    assert profile.crossover.value == found.at
    assert profile.crossover.ci == (found.low, found.high) == (4.0, 8.0)
    crossover = document["crossover"]
    assert crossover["source"] == "live" and crossover["metric"] == "tpot"
    assert crossover["confidence"] == 0.95 and crossover["sure"] is True
    assert "ci_open" not in crossover and crossover["samples_near"] == 40
    assert [row["concurrency"] for row in document["levels"]] == [1, 2, 4, 8, 16, 32]
    assert all(
        row[p]["from"] == "live" and row[p]["requests"] == 40
        for row in document["levels"]
        for p in ("spec", "base")
    )
    assert document["acceptance"]["mean_accept_length"] == 2.9
    assert document["acceptance"]["from"] == "live"
    assert document["servers"]["spec"] == {
        "backends": ["spec:127.0.0.1:1"],
        "max_running_requests": 256,
    }
    meta = document["measurement"]
    assert meta["online_mode"] == "observe" and meta["samples_counted"] == 40 * 12
    assert meta["window_seconds"] == 600.0 and meta["window_samples"] == 64
    assert meta["fitted_seconds_ago"] == 1.0 and meta["sureness"]["sure"] == [True]

    policy = build_policy("crossover", {}, profile)
    assert policy.crossover() == found.at
    below, above = math.floor(found.at) - 1, math.floor(found.at)  # joins floor(at) / one more
    assert policy.choose(RequestInfo("/v1/chat/completions"), seated(below)).pool == "spec"
    assert policy.choose(RequestInfo("/v1/chat/completions"), seated(above)).pool == "base"
    # the curves' own crossing is the live one: the policies that read them agree with it
    assert curves(profile).crossover() == pytest.approx(found.at, rel=1e-9)
    build_policy("expected-latency", {}, profile)
    accepting = build_policy("acceptance-crossover", {}, profile)
    assert accepting.crossover() == pytest.approx(found.at, rel=1e-9)


def test_a_live_profile_stands_only_where_both_pools_were_seen_live() -> None:
    """The plain server seen only from the level below the crossover up, the speculative
    one only up to the level above it, the plain one thrice at load 1 (too few): the live
    profile's levels are those where both pools were seen live (4 and 8), never one where a
    pool held the profile's value; no live accept length, so the profile's."""
    profiled = dense(1 / 16)
    spec = served(dense(1 / 8), 40, pools=("spec",), levels=LEVELS[:4])
    base = served(profiled, 40, pools=("base",), levels=LEVELS[2:], seed=2)
    few = served(profiled, 3, pools=("base",), levels=LEVELS[:1], start=1.0, seed=3)
    raw = profile_of(profiled, (8.0, 16.0)) | {"acceptance": {"mean_accept_length": 3.0}}
    in_force = parse_profile(raw)
    learning = fed(spec + base + few, in_force)
    document = live_profile(
        learning, in_force, Serving(SERVING.backends, SERVING.max_running, None), 1.5, CREATED
    )
    rows = {row["concurrency"]: row for row in document["levels"]}
    assert sorted(rows) == [4, 8]
    assert all(
        rows[c][p]["from"] == "live" and rows[c][p]["requests"] == 40
        for c in rows
        for p in ("spec", "base")
    )
    assert document["acceptance"]["mean_accept_length"] == 3.0
    assert document["acceptance"]["from"] == "profile"
    assert document["measurement"]["profile_in_force"] == {"created": None}
    found = learning.fits[0].crossing
    assert found is not None and found.levels == (4.0, 8.0)
    assert parse_profile(document).crossover.value == found.at
    assert curves(parse_profile(document)).crossover() == pytest.approx(found.at, rel=1e-9)


def v2_profile(models: tuple[Model, Model], contexts: tuple[float, float]) -> dict[str, Any]:
    buckets = [
        {
            "context": context,
            "crossover": {"value": true_crossover(model), "ci": [4.0, 8.0]},
            "levels": list(LEVELS),
            "tpot_ms": {p: [model(p, c) * 1000 for c in LEVELS] for p in ("spec", "base")},
        }
        for model, context in zip(models, contexts, strict=True)
    ]
    return profile_of(models[0], (4.0, 8.0)) | {
        "schema": "specroute.profile/v2",
        "context": {"tokens_per_byte": 0.27, "buckets": buckets},
    }


def test_with_context_buckets_in_force_each_bucket_is_written_from_its_own_fit() -> None:
    short, long = dense(1 / 8), dense(1 / 4)  # a longer context pays less far up
    in_force = parse_profile(v2_profile((short, long), (1000.0, 8000.0)))
    samples = [s._replace(context=900) for s in served(short, 40)]
    samples += [s._replace(context=9000, at=s.at + 1) for s in served(long, 40, seed=4)]
    learning = fed(samples, in_force)
    document = live_profile(learning, in_force, SERVING, 3.0, CREATED)
    assert document["schema"] == "specroute.profile/v2"
    axis = document["context"]
    assert axis["tokens_per_byte"] == 0.27
    assert [b["context"] for b in axis["buckets"]] == [1000.0, 8000.0]
    profile = parse_profile(json.loads(json.dumps(document)))
    assert profile.context is not None
    for bucket, fit in zip(profile.context.buckets, learning.fits, strict=True):
        assert fit.crossing is not None and bucket.crossover.value == fit.crossing.at
    assert profile.crossover.value == learning.fits[0].crossing.at  # type: ignore[union-attr]
    assert (
        profile.context.buckets[1].crossover.threshold
        < profile.context.buckets[0].crossover.threshold
    )
    assert context_curves(profile) is not None
    build_policy("expected-latency", {}, profile)


def profiled_online() -> tuple[Online, Any]:
    """A profile in force and no sample yet: its own margin makes a crossing, which is the
    profile's and not a live one."""
    in_force = parse_profile(profile_of(dense(), (4.0, 8.0)))
    return fed([], in_force), in_force


def test_live_bands_are_written_as_bands_each_edge_with_its_interval() -> None:
    """A mixture of experts' pair, speculation paying in a band only: the live profile
    writes the bands (and each edge's interval), it reads back as a profile with bands,
    the openapi schema describes it, and the crossover policy routes by them."""
    raw = profile_of(dense(), (4.0, 8.0))  # a mixture of experts' profile: bands, off by 2x
    in_force = parse_profile(raw | {"crossover": raw["crossover"] | {"bands": [[6, 24]]}})
    learning = fed(served(moe, 40), in_force)
    found = learning.fits[0].crossing
    assert found is not None and found.edges
    document = live_profile(learning, in_force, SERVING, 2.0, CREATED)
    described = {"$ref": "#/components/schemas/Profile", "components": openapi()["components"]}
    jsonschema.Draft202012Validator(described).validate(document)
    crossover = document["crossover"]
    assert crossover["bands"] == [list(b) for b in found.bands]
    assert [e["direction"] for e in crossover["edges"]] == ["up", "down"]
    assert [e["ci"] for e in crossover["edges"]] == [[2.0, 4.0], [8.0, 16.0]]
    assert crossover["value"] is None and crossover["bound"] == "below"  # not paying at 1
    profile = parse_profile(json.loads(json.dumps(document)))
    assert profile.crossover.bands == found.bands
    policy = build_policy("crossover", {}, profile)
    request = RequestInfo("/v1/chat/completions")
    assert [policy.choose(request, seated(n)).pool for n in (0, 4, 20)] == ["base", "spec", "base"]


REFUSALS: list[tuple[str, Any, str]] = [
    ("online off", lambda: (online(OnlineMode.OFF), None), "Online calibration is off"),
    ("before the first fit", lambda: (online(), None), "No live fit yet"),
    (
        "too few samples",
        lambda: (fed(served(dense(), 3)), None),
        "the last fit counted 36 samples: spec 18 (no level with 10), base 18 (no level with 10)",
    ),
    (
        "only the profile's crossing",
        profiled_online,
        "the last fit counted 0 samples: spec 0 (no level with 10), base 0",
    ),
]


def test_a_refusal_says_how_the_missing_pool_comes_to_be_seen() -> None:
    """Exploration's turns where it runs; where it is off, that it is."""
    for exploring, said in (
        (True, "exploration (--online-explore-share) sends turns"),
        (False, "exploration is off (--online-explore-share 0)"),
    ):
        with pytest.raises(LiveProfileRefused) as refused:
            live_profile(fed(served(dense(), 3)), None, SERVING, 2.0, CREATED, exploring)
        assert said in str(refused.value)


@pytest.mark.parametrize(("made", "said"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_no_half_profile_is_written(made: Any, said: str) -> None:
    learning, in_force = made()
    with pytest.raises(LiveProfileRefused) as refused:
        live_profile(learning, in_force, SERVING, 2.0, CREATED)
    assert said in str(refused.value)


# The command's refusals, before any router is asked or when none answers


def test_profile_takes_a_sweep_or_from_live_not_both_nor_neither(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, said in (
        (["profile", "-o", "p.json"], "one of the arguments DIR --from-live is required"),
        (
            ["profile", "sweep", "--from-live", "http://127.0.0.1:1", "-o", "p.json"],
            "not allowed with",
        ),
    ):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["sweep", "--compare", "c.json"], "--compare goes with --from-live"),
        (["--from-live", "http://127.0.0.1:1"], "needs the router's admin key"),
        (["--from-live", "http://127.0.0.1:1", "--admin-key-file", "{empty}"], "is empty"),
        (
            ["--from-live", "http://127.0.0.1:1", "--admin-key-file", "{key}", "--plot", "x.png"],
            "--plot is for a sweep's profile",
        ),
        (["--from-live", "127.0.0.1:1", "--admin-key-file", "{key}"], "takes the router's URL"),
        (
            ["--from-live", "http://127.0.0.1:1", "--admin-key-file", "{key}"],
            "the router at http://127.0.0.1:1 did not answer",
        ),
    ],
)
def test_profile_from_live_says_what_is_wrong_in_one_line_never_the_key(
    flags: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPECROUTE_ADMIN_KEY", raising=False)
    (tmp_path / "key").write_text(KEY)
    (tmp_path / "empty").write_text("\n")
    given = [f.format(key=tmp_path / "key", empty=tmp_path / "empty") for f in flags]
    assert main(["profile", *given, "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specroute profile: ") and said in err and KEY not in err
    assert not (tmp_path / "p.json").exists()


# Live: a router serving through two emulators, and the command that fetches its profile

SCALE = 0.05
KIMI = ("--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256")


async def command(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """``specroute ARGS`` as a process with ``env``: its exit code and all it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specroute", *args, stdout=PIPE, stderr=PIPE, env=env
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode() + err.decode()


async def answer(url: str, key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{url}/router/profile/live", headers=headers) as r,
    ):
        return r.status, await r.json()


async def until(url: str, ok: Any, seconds: float = 5.0) -> tuple[int, dict[str, Any]]:
    """The endpoint's answer once ``ok(status, body)``; the last one after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        status, body = await answer(url, KEY)
        if ok(status, body) or time.monotonic() > deadline:
            return status, body
        await asyncio.sleep(0.1)


async def streamed(url: str, words: str) -> None:
    await streamed_with_usage(url, True, words, max_tokens=96)


async def test_profile_from_live_fetches_a_serving_router_s_fit_and_serve_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiled = config_from_flags((*KIMI, "--accept-length", "3.0"), "spec")
    document: dict[str, Any] = as_profile(predict(profiled, [1, 2, 4, 8], 128, 96), profiled)
    for row in document["levels"]:  # the servers run at SCALE: so do their TPOTs
        for pool in ("spec", "base"):
            row[pool]["tpot_ms"]["median"] *= SCALE
    calibrated = tmp_path / "profile.json"
    calibrated.write_text(json.dumps(document))
    key_file = tmp_path / "admin.key"
    key_file.write_text(KEY + "\n")
    bare = {k: v for k, v in os.environ.items() if k != "SPECROUTE_ADMIN_KEY"}
    live, report = tmp_path / "live.json", tmp_path / "live.md"
    said: list[str] = []
    timing = ("--time-scale", str(SCALE), "--stream-interval", "4")
    async with (
        running_emulator("--mode", "spec", *KIMI, *timing) as spec,
        running_emulator("--mode", "base", *KIMI, *timing) as base,
    ):
        monkeypatch.setenv("SPECROUTE_ADMIN_KEY", KEY)  # the router's key, from its environment
        apart = ("--policy-param", "topology=partitioned")  # each emulator on GPUs of its own
        pair = ("--spec", spec, "--base", base, "--profile", str(calibrated), *apart)
        online = (
            *("--online", "observe", "--online-interval", "0.2", "--online-min-samples", "4"),
            *("--online-explore-share", "0.5"),  # both pools on each side, in seconds
        )
        serving = spawned("serve", *pair, *online, stop=signal.SIGKILL)  # no drain waited for
        async with serving as router:
            monkeypatch.delenv("SPECROUTE_ADMIN_KEY")
            url = router.url
            assert (await answer(url, "not-the-key"))[0] == 401
            assert (await answer(url, None))[0] == 401
            await asyncio.gather(streamed(url, "one"), streamed(url, "two"))
            # once a fit has run: before it, the answer says none has (with 2 samples kept)
            status, body = await until(url, lambda s, b: "counted 2" in json.dumps(b))
            said_why = body["error"]["message"]
            assert status == 409 and "counted 2 samples: spec 2 (no level with 4), " in said_why
            assert "base 0 (no level with 4)" in said_why and "usage" not in said_why
            code, early = await command(
                "profile",
                "--from-live",
                url,
                "-o",
                str(tmp_path / "early.json"),
                env=bare | {"SPECROUTE_ADMIN_KEY": KEY},
            )
            said.append(early)
            assert code != 0 and "the router refused (409)" in early and "2 samples" in early
            assert not (tmp_path / "early.json").exists()  # never half a profile

            served: asyncio.Event = asyncio.Event()

            async def client_loop(k: int) -> None:
                n = 0
                while not served.is_set():
                    n += 1
                    await streamed(url, f"client {k} request {n}: say something")

            async def watch() -> tuple[int, dict[str, Any]]:
                """Traffic until a crossover stands on live samples (a slow machine serves
                fewer a second), 20 s at most."""
                found = await until(url, lambda s, b: s == 200, seconds=20.0)
                served.set()
                return found

            watching = asyncio.create_task(watch())
            await asyncio.gather(*(client_loop(k) for k in range(8)))
            status, body = await watching
            assert status == 200, body["error"]["message"]
            given = ("-o", str(live), "--admin-key-file", str(key_file), "--report", str(report))
            code, out = await command(
                "profile", "--from-live", url, *given, "--compare", str(calibrated), env=bare
            )
            said.append(out)
            assert code == 0, out
            said.append(router.said(1 << 20))
        async with running_router(spec=[spec], base=[base], profile=live) as (again, state):
            loaded = load_profile(live)  # as serve --profile loads it
            assert state.in_force.policy.crossover() == loaded.crossover.threshold
            status, body = await answer(again, KEY)
            assert status == 403 and "none is configured" in body["error"]["message"]

    written = json.loads(live.read_text())
    assert written["crossover"]["source"] == "live"
    assert written["measurement"]["online_mode"] == "observe"
    froms = {row[p]["from"] for row in written["levels"] for p in ("spec", "base")}
    assert "live" in froms, written["levels"]
    assert written["acceptance"]["mean_accept_length"] is not None
    assert "Live beside calibrated" in out and "| crossover (TPOT) |" in out
    text = report.read_text()
    assert "from live traffic" in text and "Live beside calibrated" in text
    for policy in ("crossover", "expected-latency", "acceptance-crossover"):
        build_policy(policy, {}, load_profile(live))
    for text in (*said, live.read_text(), report.read_text()):
        assert KEY not in text


async def test_with_online_off_the_live_profile_is_refused_with_409() -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.05") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.05") as base,
        running_router(spec=[spec], base=[base], crossover=4, online="off", admin_key=KEY) as (
            url,
            _,
        ),
    ):
        status, body = await answer(url, KEY)
    assert status == 409 and "Online calibration is off" in body["error"]["message"]
