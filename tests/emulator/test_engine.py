from __future__ import annotations

from specroute.emulator.engine import Engine, Sequence
from specroute.emulator.hardware import load_hardware
from tests.emulators import emulator_config


def engine(*flags: str) -> Engine:
    return emulator_config(*flags).engine()


def run(e: Engine) -> list[str]:
    kinds: list[str] = []
    while (step := e.step()) is not None:
        kinds.append(step.kind)
    return kinds


def test_continuous_batching_respects_max_running() -> None:
    e = engine("--mode", "base", "--max-running-requests", "2")
    seqs = [Sequence(str(i), f"p{i}", 10, 5, ignore_eos=True) for i in range(3)]
    for s in seqs:
        e.submit(s)
    first = e.step()
    assert first is not None and first.kind == "prefill" and first.batch == 2
    assert len(e.running) == 2 and len(e.waiting) == 1
    kinds = run(e)
    assert all(len(s.output_ids) == 5 and s.finish and s.finish.type == "length" for s in seqs)
    assert kinds.count("prefill") == 1  # the third request is prefilled once a slot frees


def test_outputs_are_deterministic_and_lossless() -> None:
    texts = []
    for mode in ("spec", "base", "spec"):
        e = engine("--mode", mode, "--seed", "7")
        s = Sequence("r", "same prompt", 8, 40, ignore_eos=True)
        e.submit(s)
        run(e)
        texts.append((s.text, s.verify_ct))
    assert texts[0] == texts[2]
    assert texts[0][0] == texts[1][0]
    assert texts[1][1] == 0 < texts[0][1] < 40
    other = engine("--mode", "spec", "--seed", "8")
    s = Sequence("r", "same prompt", 8, 40, ignore_eos=True)
    other.submit(s)
    run(other)
    assert s.text != texts[0][0]


def test_speculative_steps_emit_up_to_s_plus_one_tokens() -> None:
    e = engine("--mode", "spec", "--accept-rate", "1.0")
    s = Sequence("r", "p", 8, 41, ignore_eos=True)
    e.submit(s)
    sizes = []
    while (step := e.step()) is not None:
        sizes.append(len(step.emitted[0].ids))
    assert sizes == [1] + [4] * 10  # the prefill's token, then 4 per verify step
    assert s.verify_ct == 10


def test_abort_leaves_at_the_next_step() -> None:
    e = engine("--mode", "base")
    a, b = Sequence("a", "p", 8, 100, ignore_eos=True), Sequence("b", "q", 8, 100, ignore_eos=True)
    e.submit(a)
    e.submit(b)
    e.step()
    e.abort(a)
    step = e.step()
    assert step is not None and step.batch == 1
    assert a.finish is not None and a.finish.type == "abort"


def test_step_time_follows_the_hardware_model() -> None:
    e = engine("--mode", "base", "--hardware", "llama3.1-8b-h200")
    e.submit(Sequence("a", "p", 1024, 3, ignore_eos=True))
    e.step()
    step = e.step()
    assert step is not None
    hw = load_hardware("llama3.1-8b-h200")
    assert step.duration * 1000 == hw.decode_ms(1, 1025, graph_max_bs=256)
