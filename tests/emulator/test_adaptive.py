"""The emulator's adaptive speculation against SGLang 0.5.23's own: the same batches and
accepted drafts fed to SGLang's ``AdaptiveSpeculativeParams`` (in ``.venv-deploy``) and to
the emulator's ``AdaptiveDepth`` choose the same depths step for step, for SGLang's default
schedule and for written ones; the same schedules are refused; and an adaptive server's
steps, gauges and ``/server_info`` follow its depth."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specroute.cli import main, parser
from specroute.emulator.acceptance import Acceptance, accept_rate, accepted_drafts
from specroute.emulator.adaptive import (
    DEFAULT_SCHEDULE,
    AdaptiveDepth,
    ScheduleError,
    candidate_depths,
    read_schedule,
    slots,
    spec_graph_batch_sizes,
)
from specroute.emulator.engine import Engine, Sequence
from specroute.emulator.hardware import load_hardware
from specroute.model_flags import emulator_config
from specroute.policies.profile import ProfileError, load_profile
from specroute.profiler.adaptive_schedule import adaptive_schedule, settings_of
from tests.emulators import FAST, running_emulator
from tests.router.test_router_ops import samples
from tests.sglang_launch import REPO, in_deploy_env

DRIVER = REPO / "tests" / "deploy" / "adaptive_params.py"

WRITTEN = {
    "ema_alpha": 0.3,
    "warmup_batches": 4,
    "update_interval": 3,
    "1": {"candidate_steps": [2, 4, 6], "ceiling_coeff": 1.5},
    "6": {"candidate_steps": [0, 2, 4], "down_hysteresis": 0.2, "up_hysteresis": -0.1},
    "20": {"candidate_steps": [0, 1], "ema_alpha": 0.5},
    "40": {"candidate_steps": [0]},
}


def in_sglang(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return in_deploy_env(DRIVER, cases)


def walk(
    schedule: dict[str, Any], initial: int, graphs: list[int] | None, seed: int
) -> tuple[list[list[Any]], list[int]]:
    """Decode batches whose size wanders from 1 to 80 and back, each request accepting its
    drafts at the emulator's depth as the emulator's acceptance model has it (a rate that
    swings, so that the depth goes both ways); the events and the emulator's depths."""
    rng = random.Random(seed)
    adaptive = AdaptiveDepth(initial, schedule, graphs)
    events, depths, batch = [], [], 1
    for step in range(1200):
        batch = max(1, min(80, batch + rng.choice((-3, -1, 0, 0, 1, 3))))
        rate = 0.85 if (step // 150) % 2 == 0 else 0.25
        depth = adaptive.depth_for(batch)
        accepted = [accepted_drafts(rng, rate, depth) for _ in range(batch)]
        depths.append(depth)
        adaptive.verified(accepted, batch)
        events.append([batch, accepted])
    return events, depths


@pytest.mark.parametrize(
    ("schedule", "initial", "graphs"),
    [
        (None, 3, spec_graph_batch_sizes(48)),
        (None, 4, None),
        (WRITTEN, 4, spec_graph_batch_sizes(160)),
        (WRITTEN, 3, None),
    ],
    ids=["default", "default-no-graphs", "written", "written-no-graphs"],
)
def test_the_depths_agree_with_sglangs_step_for_step(
    schedule: dict[str, Any] | None, initial: int, graphs: list[int] | None
) -> None:
    events, ours = walk(schedule or DEFAULT_SCHEDULE, initial, graphs, seed=initial)
    case = {"name": "walk", "schedule": schedule, "initial": initial, "graph_bs": graphs}
    theirs = in_sglang([{**case, "events": events}])["walk"]["depths"]
    assert theirs == ours
    assert len(set(ours)) >= 3  # the walk moved the depth among several candidates


BAD: dict[str, dict[str, Any]] = {
    "no-batch-size": {"ema_alpha": 0.2},
    "empty": {"1": {"candidate_steps": []}},
    "negative": {"1": {"candidate_steps": [1, -1]}},
    "not-a-list": {"1": {"candidate_steps": 3}},
    "a-float": {"1": {"candidate_steps": [1.5]}},
}


def test_sglang_and_the_emulator_take_and_refuse_the_same_schedules() -> None:
    cases: dict[str, dict[str, Any] | None] = {"default": None, "written": WRITTEN, **BAD}
    theirs = in_sglang([{"name": n, "schedule": s} for n, s in cases.items()])
    for name, schedule in cases.items():
        if name in BAD:
            assert "error" in theirs[name], name
            with pytest.raises(ScheduleError):
                slots(schedule or {})
        else:
            assert theirs[name]["candidates"] == candidate_depths(schedule or DEFAULT_SCHEDULE)


def _engine(adaptive: AdaptiveDepth | None, skip: bool = False) -> Engine:
    """An EAGLE server at depth 3 whose drafts are nearly always right (accept length 3.9)."""
    hardware = load_hardware("llama3.1-8b-h100")
    return Engine(
        hardware,
        speculative=True,
        steps=3,
        acceptance=Acceptance(3, accept_rate(3.9, 3)),
        max_running_requests=128,
        cuda_graph_max_bs=128,
        adaptive=adaptive,
        skip_zero_extend=skip,
    )


def _run(engine: Engine, requests: int, steps: int) -> list[int]:
    """``requests`` long requests started together; the depth of each decode."""
    for i in range(requests):
        engine.submit(Sequence(f"r{i}", f"prompt {i}", 64, 4096, ignore_eos=True))
    depths = []
    for _ in range(steps):
        step = engine.step()
        assert step is not None
        if step.kind == "decode":
            depths.append(engine.depth)
    return depths


def test_an_adaptive_server_drafts_deep_alone_and_not_at_all_when_busy() -> None:
    graphs = spec_graph_batch_sizes(128)
    alone = _run(_engine(AdaptiveDepth(3, DEFAULT_SCHEDULE, graphs)), 1, 200)
    busy = _run(_engine(AdaptiveDepth(3, DEFAULT_SCHEDULE, graphs)), 70, 60)
    assert alone[0] == 3 and alone[-1] == 7  # nearly every draft right: it climbs
    assert set(busy) == {0}  # batch 64 and over: SGLang's default never drafts
    fixed = _run(_engine(None), 70, 60)
    assert set(fixed) == {3}


def test_depth_zero_still_pays_the_verify_and_the_draft_extend_unless_skipped() -> None:
    hardware = load_hardware("llama3.1-8b-h100")
    plain = hardware.decode_ms(64, 64 * 1000)
    zero = hardware.speculative_ms(64, 0, 64 * 1000)
    skipped = hardware.speculative_ms(64, 0, 64 * 1000, extend=False)
    assert zero > skipped == pytest.approx(plain)  # the tax is the draft's extend
    # a slot that always drops to depth 0 and probes depth 3 again after each interval
    schedule = {"1": {"candidate_steps": [0, 3], "warmup_batches": 0, "down_hysteresis": 9}}
    for skip in (True, False):
        engine = _engine(AdaptiveDepth(3, schedule, None), skip=skip)
        engine.submit(Sequence("c", "prompt", 64, 4096, ignore_eos=True))
        assert engine.step() is not None  # the prefill
        decodes = []
        for _ in range(60):
            step = engine.step()
            assert step is not None
            decodes.append((engine.depth, len(step.emitted[0].ids)))
        back = [n for (d, n), (was, _) in zip(decodes[1:], decodes, strict=False) if d and not was]
        later = [n for (d, n), (was, _) in zip(decodes[1:], decodes, strict=False) if d and was]
        assert len(back) >= 3 and sum(later) / len(later) > 3
        if skip:  # back from depth 0, drafted from a stale state: nothing accepted
            assert set(back) == {1}
        else:
            assert sum(back) / len(back) > 2


async def test_an_adaptive_server_says_so_and_shows_its_depth(tmp_path: Path) -> None:
    schedule = tmp_path / "adaptive.json"
    schedule.write_text(json.dumps({"1": {"candidate_steps": [0], "warmup_batches": 0}}))
    flags = ("--mode", "spec", *FAST, "--speculative-adaptive")
    async with (
        running_emulator(*flags, "--speculative-adaptive-config", str(schedule)) as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(f"{url}/server_info") as r:
            info = await r.json()
        assert info["speculative_adaptive"] is True
        assert info["speculative_adaptive_config"] == str(schedule)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    assert set(samples(text, "sglang:spec_num_steps").values()) == {0.0}
    assert set(samples(text, "sglang:spec_num_draft_tokens").values()) == {1.0}


async def test_a_plain_server_refuses_adaptive_with_sglangs_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        running_emulator("--mode", "base", *FAST, "--speculative-adaptive") as url,
        aiohttp.ClientSession() as s,
        s.get(f"{url}/server_info") as r,
    ):
        assert (await r.json())["speculative_adaptive"] is False
    assert "speculative_adaptive disabled: speculative_algorithm=None" in caplog.text


# A profile written as the server's own schedule

RESULTS = REPO / "docs" / "results" / "data"


@pytest.mark.parametrize("name", ["kimi-bands", "llama-crossover"])
def test_a_profile_written_as_a_schedule_drafts_where_it_pays_in_sglang_and_the_emulator(
    name: str, tmp_path: Path
) -> None:
    """The committed calibrations (a band; a crossover) as schedules, read by SGLang's own
    loader and driven through its policy: every batch from 1 to 300 drafts to the
    calibrated depth exactly where the profile says speculation pays at the batch size its
    CUDA graph runs at, and not at all elsewhere; the emulator reads the same file."""
    path = tmp_path / "adaptive.json"
    assert main(["adaptive-config", str(RESULTS / f"{name}.json"), "-o", str(path)]) == 0
    schedule = json.loads(path.read_text())
    profile = load_profile(RESULTS / f"{name}.json")
    steps, graph_max_bs = settings_of(profile)
    assert steps == 3 and graph_max_bs is not None
    graphs = spec_graph_batch_sizes(graph_max_bs)
    batches = list(range(1, 301))
    events = [[b, [steps] * b] for b in batches]
    case = {"name": name, "schedule": schedule, "initial": steps, "graph_bs": graphs}
    theirs = in_sglang([{**case, "events": events}])[name]["depths"]
    padded = [next((g for g in graphs if g >= b), b) for b in batches]
    bands = profile.crossover.bands
    pays = [
        any((lo is None or p >= lo) and (hi is None or p < hi) for lo, hi in bands) for p in padded
    ]
    assert theirs == [steps if p else 0 for p in pays]
    assert read_schedule(str(path)) == schedule
    ours = AdaptiveDepth(steps, schedule, graphs)
    assert [ours.depth_for(b) for b in batches] == theirs
    assert 0 < sum(pays) < len(pays)


def test_a_profile_that_does_not_say_its_depth_needs_one(tmp_path: Path) -> None:
    data = json.loads((RESULTS / "llama-crossover.json").read_text())
    del data["servers"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="speculative_num_steps"):
        adaptive_schedule(load_profile(bare))
    assert main(["adaptive-config", str(bare)]) == 2
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "adaptive-config",
                str(bare),
                "--steps",
                "4",
                "--cuda-graph-max-bs",
                "32",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert candidate_depths(json.loads(out.read_text())) == [0, 4]


def test_a_profile_where_speculation_never_pays_is_no_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Speculation paying at no load: no schedule is written (SGLang would start it only at
    depth 0, drafting nothing at the draft's cost), and the command says why."""
    data = json.loads((RESULTS / "llama-crossover.json").read_text())
    data["crossover"] |= {"value": None, "ci": None, "bound": "below", "bands": []}
    never = tmp_path / "never.json"
    never.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="speculation paid at no load"):
        adaptive_schedule(load_profile(never))
    assert main(["adaptive-config", str(never), "-o", str(tmp_path / "out.json")]) == 2
    assert "serve without speculation" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_a_written_schedule_says_how_to_start_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "adaptive.json"
    assert main(["adaptive-config", str(RESULTS / "llama-crossover.json"), "-o", str(path)]) == 0
    said = capsys.readouterr().err
    assert f"--speculative-adaptive-config {path} --speculative-num-steps 3" in said


@pytest.mark.parametrize(("steps", "starts"), [("3", True), ("2", False)])
def test_the_emulator_starts_only_at_a_depth_the_schedule_offers_as_sglang_does(
    steps: str, starts: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang refuses to start an adaptive server whose ``--speculative-num-steps`` is not
    one of its schedule's depths, in these words (seen on its CPU engine); so does the
    emulator."""
    schedule = tmp_path / "adaptive.json"
    schedule.write_text(json.dumps({"1": {"candidate_steps": [0, 3]}}))
    flags = ["--mode", "spec", "--speculative-adaptive", "--speculative-num-steps", steps]
    flags += ["--speculative-adaptive-config", str(schedule)]
    parsed = parser().parse_args(["emulate", *flags])
    if starts:
        assert emulator_config(parsed).speculative_adaptive
        return
    with pytest.raises(
        ValueError,
        match=re.escape(
            "--speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 3]. "
            "Pass one of those values."
        ),
    ):
        emulator_config(parsed)
