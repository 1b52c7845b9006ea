"""The KV cache as SGLang sizes it: the shipped hardware models' memory, SGLang's arithmetic
redone by hand on their shapes, requests waiting for room, running ones retracted when
decoding runs out (and their outputs the same), and what the server reports of it."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from specroute.emulator.acceptance import Acceptance, accept_rate
from specroute.emulator.engine import Engine, Sequence
from specroute.emulator.hardware import load_hardware
from specroute.emulator.hardware_models import memory_facts as facts
from specroute.emulator.memory import (
    KvCacheError,
    default_fraction,
    shared_fractions,
    static_gib,
    token_capacity,
)
from specroute.model_flags import config_from_flags
from tests.emulators import FAST, running_emulator
from tests.router.test_router_ops import samples

MODELS = Path(__file__).resolve().parents[2] / "emulator" / "hardware_models"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama3.1-8b-h100", facts.llama_3_1_8b(facts.H100_GIB)),
        ("llama3.1-8b-h200", facts.llama_3_1_8b(facts.H200_GIB)),
        ("llama3.1-8b-h200-sdpa", facts.llama_3_1_8b(facts.H200_GIB)),
        ("llama3.1-8b-h200-folded", facts.llama_3_1_8b(facts.H200_GIB)),
        ("qwen3-30b-a3b-h200", facts.qwen3_30b_a3b(facts.H200_GIB)),
        ("kimi-k2.5-8x-pcie", facts.kimi_k2_5(facts.RTX_PRO_6000_GIB)),
        ("kimi-k2.5-8x-pcie-fitted", facts.kimi_k2_5(facts.RTX_PRO_6000_GIB)),
    ],
)
def test_each_shipped_model_states_its_memory(name: str, expected: dict[str, object]) -> None:
    assert json.loads((MODELS / f"{name}.json").read_text())["memory"] == expected
    assert load_hardware(name).memory is not None


def test_sglangs_arithmetic_redone_by_hand_on_the_shipped_shapes() -> None:
    """Llama-3.1-8B on an H100 (GQA: 8 KV heads of 128 in 32 layers, the head's one layer
    beside them), Kimi-K2.5 over 8 GPUs (MLA: the 576-wide latent in 61 layers, whole on
    every GPU; the head's one KV head a GPU): max_total_num_tokens is what the fraction of
    free memory leaves after the weights, over a token's bytes."""
    llama = config_from_flags(
        ["--hardware", "llama3.1-8b-h100", "--mem-fraction-static", "0.8"], "spec"
    )
    gib = 1 << 30
    pre = 81559 / 1024 - 0.5
    weights = 8_030_261_248 * 2 / gib + llama.hardware.raw["memory"]["draft_weights_gib"]
    cell = 8 * (128 + 128) * 32 * 2 + 8 * (128 + 128) * 1 * 2  # 131,072 + 4,096 bytes
    assert llama.max_total_tokens == pytest.approx((pre * 0.8 - weights) * gib / cell, abs=300)
    plain = config_from_flags(
        ["--hardware", "llama3.1-8b-h100", "--mem-fraction-static", "0.8"], "base"
    )
    assert plain.max_total_tokens == pytest.approx(
        (pre * 0.8 - 8_030_261_248 * 2 / gib) * gib / (131072), abs=300
    )
    kimi = config_from_flags(
        ["--hardware", "kimi-k2.5-8x-pcie", "--mem-fraction-static", "0.9"], "spec"
    )
    pre = 97887 / 1024 - 1.0
    weights = 595e9 / 8 / gib + kimi.hardware.raw["memory"]["draft_weights_gib"]
    cell = 576 * 61 * 2 + 1 * (128 + 128) * 1 * 2  # the latent; one draft KV head a GPU
    assert kimi.max_total_tokens == pytest.approx((pre * 0.9 - weights) * gib / cell, abs=300)


def test_sglangs_default_fraction_and_its_refusal() -> None:
    """SGLang's default on an 80 GB GPU reserves 512 MiB + 1.5 a token of an 8,192-token
    chunk + TP/8 GiB + 2 MiB a graph batch (at least 10 GiB); a fraction the weights do not
    fit in stops the start, with the least that would do."""
    h100 = load_hardware("llama3.1-8b-h100").memory
    assert h100 is not None
    reserved = 512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2
    assert default_fraction(h100.gpu_gib, 1, 256) == round((81559 - reserved) / 81559, 3)
    kimi = load_hardware("kimi-k2.5-8x-pcie").memory
    assert kimi is not None
    with pytest.raises(KvCacheError, match=r"Raise --mem-fraction-static above 0\.7"):
        token_capacity(kimi, 8, 0.45, True)
    with pytest.raises(ValueError, match="leave no GPU memory"):
        config_from_flags(
            ["--hardware", "kimi-k2.5-8x-pcie", "--mem-fraction-static", "0.45"], "spec"
        )


def test_servers_sharing_gpus_each_find_what_the_others_left() -> None:
    """The second server on the same GPUs finds free what the first did not take: at the
    same fraction it gets much less (SGLang's fraction is of the memory free at its start)."""
    memory = load_hardware("llama3.1-8b-h100").memory
    assert memory is not None
    first = token_capacity(memory, 1, 0.45, True)
    taken = static_gib(memory, 0.45)
    second = token_capacity(memory, 1, 0.45, False, taken)
    assert second < first / 3
    flags = ["--hardware", "llama3.1-8b-h100", "--mem-fraction-static", "0.45"]
    later = config_from_flags([*flags, "--memory-taken-gib", str(taken)], "base")
    assert later.max_total_tokens == second


def test_shared_fractions_give_both_servers_the_same_memory_and_each_its_reserve() -> None:
    """The fractions for the shared topology: the second, of what the first left, holds
    what the first holds, and what both leave is two of one server's reserves."""
    memory = load_hardware("llama3.1-8b-h100").memory
    assert memory is not None
    one = default_fraction(memory.gpu_gib, 1, 256)
    first, second = shared_fractions(one)
    pre = memory.gpu_gib - memory.context_gib
    held = static_gib(memory, first) - memory.context_gib
    assert held == pytest.approx(pre * (one - 0.5), rel=2e-3)
    later = static_gib(memory, second, static_gib(memory, first)) - memory.context_gib
    assert later == pytest.approx(held, rel=0.03)  # the first's CUDA context aside
    assert pre - held - later == pytest.approx(2 * pre * (1 - one), rel=0.03)
    assert second > first  # of less memory, so a larger share of it
    with pytest.raises(KvCacheError, match="leave no memory"):
        shared_fractions(0.5)


def _engine(capacity: int | None, speculative: bool = False) -> Engine:
    return Engine(
        load_hardware("llama3.1-8b-h100"),
        speculative=speculative,
        steps=3,
        acceptance=Acceptance(3, accept_rate(2.5, 3)),
        max_running_requests=256,
        cuda_graph_max_bs=256,
        max_total_tokens=capacity,
    )


def _outputs(engine: Engine, ignore_eos: bool) -> dict[str, list[int]]:
    """Eighty requests of 100 prompt tokens and up to 300 of output, served to their end."""
    seqs = [Sequence(f"r{i}", f"prompt {i}", 100, 300, ignore_eos=ignore_eos) for i in range(80)]
    for seq in seqs:
        engine.submit(seq)
    most = 0
    while engine.step() is not None:
        most = max(most, len(engine.running))
        if engine.max_total_tokens is not None:
            assert engine.held_tokens <= engine.max_total_tokens
    engine.most_running = most  # type: ignore[attr-defined]
    return {s.rid: list(s.output_ids) for s in seqs}


@pytest.mark.parametrize("speculative", [False, True])
def test_requests_wait_for_room_and_are_retracted_when_decoding_runs_out(speculative: bool) -> None:
    """A cache of 2,000 tokens: requests that ignore EOS wait until the room their whole
    answer needs is free, and none is retracted; the others are let in on SGLang's estimate
    of how much they will write, which falls as decoding goes on, and some are retracted
    when decoding runs out. Every answer is the one an unbounded cache gives."""
    for ignore_eos in (True, False):
        unbounded = _outputs(_engine(None, speculative), ignore_eos)
        bounded = _engine(2000, speculative)
        assert _outputs(bounded, ignore_eos) == unbounded
        most = bounded.most_running  # type: ignore[attr-defined]
        if ignore_eos:
            assert bounded.retracted == 0 and most <= 2000 // 400
        else:
            assert bounded.retracted > 0 and most > 2000 // 400
            assert bounded.retracted_input_tokens == 100 * bounded.retracted


async def test_a_server_reports_its_cache_and_its_retractions() -> None:
    flags = ("--hardware", "llama3.1-8b-h100", "--mem-fraction-static", "auto")
    config = config_from_flags(list(flags), "base")
    async with (
        running_emulator("--mode", "base", *FAST, *flags) as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(f"{url}/server_info") as r:
            info = await r.json()
        assert info["max_total_num_tokens"] == config.max_total_tokens
        assert info["mem_fraction_static"] == config.resolved_mem_fraction
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    assert set(samples(text, "sglang:max_total_num_tokens").values()) == {
        float(config.max_total_tokens or 0)
    }
    assert set(samples(text, "sglang:num_retracted_requests_total").values()) <= {0.0}
