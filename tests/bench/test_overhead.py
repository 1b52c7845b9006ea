"""``specroute bench overhead``: a quick run from the command line against real processes
(stub backends, a bare proxy, specroute, smg when installed), checked for what
holds on any machine; and the order in which windows interleave."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, AsyncStream
from openai.types.chat import ChatCompletionStreamOptionsParam

from specroute.bench import overhead_targets
from specroute.bench.overhead import OverheadPlan, pinning, schedule
from specroute.bench.overhead_report import as_json, command_line
from specroute.bench.overhead_targets import GATEWAYS, installed
from specroute.cli import main, parser
from specroute.loadgen.spawn import spawned
from tests.emulator.test_emulator_api import metric
from tests.routers import running_router

PROXIES = ("bare", "specroute-w1")


def _run(tmp_path: Path, *flags: str) -> dict[str, Any]:
    out = tmp_path / "overhead.json"
    assert main(["bench", "overhead", *flags, "--out", str(out)]) == 0
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def _rows(document: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}


def test_a_quick_run_measures_every_target_at_every_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _run(tmp_path, "--quick")
    said = capsys.readouterr()
    targets = document["targets"]
    expected = {"direct", *PROXIES} | ({"smg"} if installed("smg") else set())
    assert expected <= set(targets)
    assert "pinned" in said.out and "TTFC p50" in said.out and "router CPU ms/request" in said.out
    assert document["command"].startswith("specroute bench overhead --levels 1,16 ")
    rows = _rows(document)
    for mode in ("stream", "whole"):
        for level in (1, 16):
            for target in targets:
                r = rows[mode, level, target]
                assert r["errors"]["max"] == 0
                assert r["ttfc_p50"]["median"] > 0 and r["requests_per_s"]["median"] > 0
                assert r["backend_cores"]["max"] < 0.9  # the stub is never the bottleneck
                if target == "direct":
                    assert r["router_cpu_ms_per_request"] is None
                    assert r["router_wakes_per_request"] is None
                else:
                    assert r["router_cpu_ms_per_request"]["min"] > 0
                    assert r["router_wakes_per_request"]["min"] > 0  # woken for every request
                    assert r["added_ttfc_p50"] is not None
            if mode == "stream":  # chunks arrive paced by the backend, proxied or not
                assert rows[mode, level, "direct"]["gap_p50"]["median"] == pytest.approx(20, abs=5)
    wake = document["wake"]  # measured once, before any load, and said
    assert wake["busy_us"] > 0 and set(wake["woken_us"]) == {"0.1", "1", "20"}
    assert all(us > 0 for us in wake["woken_us"].values())
    assert "what waking costs" in said.out


def test_a_gateway_not_installed_is_skipped_with_how_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(overhead_targets, "installed", lambda gateway: False)
    document = _run(
        tmp_path,
        "--levels",
        "64",
        "--modes",
        "whole",
        "--workers",
        "1",
        "--repeats",
        "1",
        "--warmup",
        "0.3",
        "--seconds",
        "0.3",
        "--profile-dir",
        str(tmp_path / "profiles"),
        "--profile-levels",
        "64",
        "--profile-format",
        "raw",
        "--profile-seconds",
        "3",
    )
    assert document["targets"] == ["direct", "bare", "specroute-w1"]
    # one window more each, py-spy on the Python routers: the router's own frames sampled
    # (at 64 whole answers for 3 s, about a hundred samples of the router: at 16 for 1 s
    # its few samples could all be the event loop's own)
    assert document["profiles"] == ["bare-whole-64.txt", "specroute-w1-whole-64.txt"]
    stacks = (tmp_path / "profiles" / "specroute-w1-whole-64.txt").read_text()
    assert "specroute serve" in stacks and "router/proxy/handler.py:" in stacks
    hint = GATEWAYS["smg"].install
    assert hint in capsys.readouterr().err
    assert any(hint in note for note in document["notes"])
    assert document["plan"]["gateways"] == ["smg"]  # the default, when installed


def test_the_bare_pass_through_forked_into_workers_is_a_target_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--bare-workers 1,2``: the pass-through once as one process and once as two on one
    port, each measured, both processes reached; ``--online-off`` and ``--aiohttp-front``:
    specroute once more with online calibration off, and once more on aiohttp's server; and
    the command says how to run it again."""
    document = _run(
        tmp_path,
        *("--levels", "16", "--modes", "whole", "--workers", "1", "--bare-workers", "1,2"),
        *("--gateways", "none", "--repeats", "1", "--warmup", "0.3", "--seconds", "0.3"),
        "--online-off",
        "--aiohttp-front",
    )
    targets = [
        "direct",
        "bare",
        "bare-w2",
        "specroute-w1",
        "specroute-w1-online-off",
        "specroute-w1-aiohttp",
    ]
    assert document["targets"] == targets
    assert "bare-w2" in capsys.readouterr().out
    assert "--bare-workers 1,2 --online-off --aiohttp-front" in document["command"]
    rows = _rows(document)
    for target in ("bare", "bare-w2", "specroute-w1-online-off", "specroute-w1-aiohttp"):
        r = rows["whole", 16, target]
        assert r["errors"]["max"] == 0 and r["router_cpu_ms_per_request"]["min"] > 0
    assert "bare-w2 " in " ".join(document["notes"]) and "(3 processes)" in " ".join(
        document["notes"]
    )  # the parent and its two workers


def test_the_lean_pass_through_is_measured_beside_bare(tmp_path: Path) -> None:
    """``--lean``: the pass-through without aiohttp relays streams (chunked, paced by the
    backend) and whole answers (sized) as direct gets them, with no errors, and costs less
    CPU per request than the same pass-through on aiohttp's server and client."""
    document = _run(
        tmp_path,
        *("--levels", "16", "--workers", "1", "--gateways", "none", "--repeats", "1"),
        *("--warmup", "0.3", "--seconds", "0.5", "--lean"),
    )
    assert document["targets"] == ["direct", "bare", "lean", "specroute-w1"]
    assert " --lean" in document["command"]
    rows = _rows(document)
    for mode in ("stream", "whole"):
        lean, bare = rows[mode, 16, "lean"], rows[mode, 16, "bare"]
        assert lean["errors"]["max"] == 0 and lean["requests_per_s"]["median"] > 0
        cpu = lean["router_cpu_ms_per_request"]["median"]
        assert 0 < cpu < bare["router_cpu_ms_per_request"]["median"]
    assert rows["stream", 16, "lean"]["gap_p50"]["median"] == pytest.approx(20, abs=5)


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("smg", ["smg"]),
        ("sglang-router,smg,smg", ["sglang-router", "smg"]),
        ("none", []),
    ],
)
def test_gateways_are_named_on_the_command_line(flag: str, expected: list[str]) -> None:
    args = parser().parse_args(["bench", "overhead", "--gateways", flag])
    assert args.gateways == expected


def test_an_unknown_gateway_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "overhead", "--gateways", "nginx"])
    assert stopped.value.code == 2
    assert "gateways are smg, sglang-router or none" in capsys.readouterr().err


def test_windows_interleave_with_the_order_rotated() -> None:
    plan = OverheadPlan(levels=(1, 4), repeats=2, modes=("stream",))
    windows = schedule(plan, ["a", "b", "c"])
    assert len(windows) == 2 * 2 * 3
    firsts = [windows[i][3] for i in range(0, len(windows), 3)]
    assert firsts == ["a", "b", "c", "a"]  # each level, mode and repeat starts elsewhere
    assert all(sorted(w[3] for w in windows[i : i + 3]) == ["a", "b", "c"] for i in (0, 3, 6, 9))


@pytest.mark.parametrize(
    ("cores", "router_cores", "expected"),
    [
        ([0, 1], 2, None),
        ([0, 1, 2, 3], 1, {"router": {0}, "backends": {1}, "load": {2, 3}}),
        ([0, 1, 2, 3], 2, {"router": {0}, "backends": {1}, "load": {2, 3}}),
        ([2, 3, 4, 5, 6, 7], 2, {"router": {2, 3}, "backends": {4}, "load": {5, 6, 7}}),
        (list(range(16)), 4, {"router": {0, 1, 2, 3}, "backends": {4}, "load": set(range(5, 16))}),
    ],
)
def test_pinning_gives_the_router_its_own_cores_from_four_up(
    cores: list[int], router_cores: int, expected: dict[str, set[int]] | None
) -> None:
    assert pinning(cores, router_cores) == expected


def test_the_command_line_a_run_records_runs_the_same_plan_again() -> None:
    plan = OverheadPlan(
        levels=(1, 256),
        workers=(1, 4),
        repeats=2,
        gateways=("smg", "sglang-router"),
        router_cores=4,
        profile_dir="/tmp/somewhere/profiles",
        profile_seconds=3,
        one_backend=True,
    )
    line = command_line(plan, "/out/overhead.json")
    assert line.endswith("--profile-format speedscope --out overhead.json")
    args = parser().parse_args(line.split()[1:])
    assert (args.levels, args.workers, args.repeats) == ([1, 256], [1, 4], 2)
    assert (args.gateways, args.router_cores, args.profile_dir, args.one_backend) == (
        ["smg", "sglang-router"],
        4,
        "profiles",
        True,
    )
    assert (args.profile_levels, args.profile_seconds, args.modes) == (
        [256],
        3,
        ["stream", "whole"],
    )


async def test_specroute_spreads_its_requests_over_both_backends_as_the_others_do() -> None:
    """``specroute-wN`` routes over the same two stubs as direct and the gateways, so that
    no backend is busier behind it (the third stub, its plain pool, gets nothing);
    ``--one-backend``'s ``specroute-wN-one-backend`` sends every request to the first."""
    async with contextlib.AsyncExitStack() as stack:
        backends = await overhead_targets.start_backends(stack, 4, 5)
        targets = await overhead_targets.start_targets(
            stack, backends, [1], [], print, one_backend=True
        )
        by_name = {t.name: t.urls[0] for t in targets}
        assert list(by_name) == ["direct", "bare", "specroute-w1", "specroute-w1-one-backend"]
        stubs = [*backends.urls, backends.idle]
        for name, expected in (
            ("specroute-w1", (True, True, False)),
            ("specroute-w1-one-backend", (True, False, False)),
        ):
            before = [await metric(u, "sglang:generation_tokens_total") for u in stubs]
            # closed before the next is made: openai 3.x's client, left to the garbage
            # collector while another's requests are in flight, can leave those hanging
            async with AsyncOpenAI(base_url=by_name[name] + "/v1", api_key="unused") as client:
                await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model="stub", messages=[{"role": "user", "content": "Hi."}]
                        )
                        for _ in range(16)
                    )
                )
            after = [await metric(u, "sglang:generation_tokens_total") for u in stubs]
            grew = tuple(b > a for a, b in zip(before, after, strict=True))
            assert grew == expected, (name, before, after)
            assert sum(after) - sum(before) == 16 * 4  # every answer, four tokens each


async def test_every_stub_stream_is_an_online_sample() -> None:
    """The stub sends the token counts a stream asks for as SGLang does, and the router asks
    for them whether its client did or not: each stream through the router is a sample, so
    ``specroute-wN`` pays for learning and ``-online-off`` does not; a client that did not
    ask gets no usage."""
    async with (
        spawned("--chunks", "4", "--gap-ms", "1", module=overhead_targets.STUB) as stub,
        running_router(spec=[stub.url], base=[stub.url], crossover=8, idle_timeout=0.4) as (
            url,
            state,
        ),
    ):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
        for counted in (False, True):
            options: ChatCompletionStreamOptionsParam | None = (
                {"include_usage": True} if counted else None
            )
            stream = await client.chat.completions.create(
                model="stub",
                messages=[{"role": "user", "content": "Say hi."}],
                stream=True,
                stream_options=options,
            )
            assert isinstance(stream, AsyncStream)
            usages = [chunk.usage async for chunk in stream if chunk.usage is not None]
            assert [u.completion_tokens for u in usages] == ([4] if counted else [])
        assert state.online.kept() == 2  # both streams: the router asked for the counts
        watchdog = (
            state.relaying.watchdog
        )  # it watched the streams, and stops with the last of them
        assert watchdog is not None
        await asyncio.sleep(0.3)  # a tick of the watchdog's, and some
        assert watchdog.done()


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("bare", "bare"),
        ("bare-w4", "bare"),
        ("specroute-w2", "specroute"),
        ("specroute-w1-online-off", None),  # served with other flags: not a process count
        ("specroute-w1-aiohttp", None),
        ("specroute-w2-one-backend", None),
        ("direct", None),
        ("smg", None),
    ],
)
def test_a_target_s_family_of_process_counts(target: str, expected: str | None) -> None:
    assert overhead_targets.family(target) == expected


_OTHER_VERSION = """
import sys
from aiohttp import web

async def status(request: web.Request) -> web.Response:
    return web.json_response({"worker": {"index": 0}, "version": "other"})

app = web.Application()
app.router.add_get("/ready", status)
app.router.add_get("/router/status", status)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]))
"""


async def test_a_baseline_is_served_by_the_code_in_its_folder(tmp_path: Path) -> None:
    """``--baseline DIR``: ``specroute-w1-baseline`` runs the ``specroute`` found in DIR, not
    the installed one (here a stand-in that says which it is), beside ``specroute-w1``; a
    folder with no specroute in it is refused before anything starts."""
    with pytest.raises(ValueError, match="pip install --target"):
        OverheadPlan(baseline=str(tmp_path))
    (tmp_path / "specroute").mkdir()
    (tmp_path / "specroute" / "__init__.py").write_text("")
    (tmp_path / "specroute" / "__main__.py").write_text(_OTHER_VERSION)
    plan = OverheadPlan(baseline=str(tmp_path), workers=(1,))
    assert f"--baseline {tmp_path.name}" in command_line(plan)
    assert as_json(plan, {}, [], [], [])["plan"]["baseline"] == tmp_path.name  # no path
    async with contextlib.AsyncExitStack() as stack:
        backends = await overhead_targets.start_backends(stack, 4, 5)
        targets = await overhead_targets.start_targets(
            stack, backends, [1], [], print, baseline=plan.baseline
        )
        by_name = {t.name: t.urls[0] for t in targets}
        assert list(by_name) == ["direct", "bare", "specroute-w1", "specroute-w1-baseline"]
        async with aiohttp.ClientSession() as session:
            async with session.get(by_name["specroute-w1-baseline"] + "/ready") as r:
                assert (await r.json())["version"] == "other"
            async with session.get(by_name["specroute-w1"] + "/ready") as r:
                assert r.status == 200
                assert "version" not in await r.text()
