"""The engine model: SGLang-style continuous batching as a pure state machine.

``Engine.step()`` decides the next batch, advances every sequence in it and returns how
long the step takes on the modelled hardware. It never sleeps and never reads a clock:
the server's loop sleeps the duration (scaled) before delivering the tokens, and the
predictor and offline replays advance a virtual clock instead.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from specroute.emulator.acceptance import Acceptance, accepted_drafts
from specroute.emulator.adaptive import AdaptiveDepth
from specroute.emulator.hardware import HardwareModel
from specroute.emulator.noise import Noise, NoiseSource
from specroute.emulator.radix_cache import RadixCache
from specroute.emulator.vocabulary import EOS_TOKEN_ID, TOKEN_ID_BASE, WORDS, word

FinishType = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Finish:
    type: FinishType
    matched: str | int | None = None
    length: int | None = None


@dataclass
class Sequence:
    """One request inside the engine."""

    rid: str
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    sampling_seed: str = ""
    prompt_ids: tuple[str, ...] = ()  # the prompt's tokens, for the radix cache
    cached_tokens: int = 0  # of the prompt, found in the radix cache at prefill
    retracted: bool = False  # its KV freed under memory pressure: prefilled again, output too
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    verify_ct: int = 0
    finish: Finish | None = None
    aborted: bool = False
    accept_rate: float = 0.0
    cold: bool = False  # its draft's state went stale at depth 0 (the extend skipped)
    listener: Callable[[Sequence, int], None] | None = None
    _tokens: random.Random = field(default_factory=random.Random, repr=False)
    _accepts: random.Random = field(default_factory=random.Random, repr=False)
    _eos_at: int | None = None

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + len(self.output_ids)

    def seed(self, engine_seed: int) -> None:
        """Outputs depend only on the seed and the request, never on batching, and are the
        same with and without speculation (lossless, as greedy EAGLE is)."""
        key = f"{engine_seed}|{self.sampling_seed}|{self.prompt}"
        self._tokens = random.Random(f"tokens|{key}")
        self._accepts = random.Random(f"accepts|{key}")
        natural = int(self._tokens.lognormvariate(math.log(160.0), 0.6)) + 1
        self._eos_at = None if self.ignore_eos else min(natural, 8192)

    def generate(self, n: int) -> int:
        """Append up to ``n`` tokens, stopping at EOS, a stop string or the length limit."""
        made = 0
        while made < n and self.finish is None:
            if len(self.output_ids) >= self.max_new_tokens:
                self.finish = Finish("length", length=len(self.output_ids))
                break
            made += 1
            if self._eos_at is not None and len(self.output_ids) + 1 >= self._eos_at:
                self.output_ids.append(EOS_TOKEN_ID)
                self.finish = Finish("stop", matched=EOS_TOKEN_ID)
                break
            token = TOKEN_ID_BASE + self._tokens.randrange(len(WORDS))
            self.output_ids.append(token)
            self.text += word(token)
            self._check_stop()
        if self.finish is None and len(self.output_ids) >= self.max_new_tokens:
            self.finish = Finish("length", length=len(self.output_ids))
        return made

    def _check_stop(self) -> None:
        for stop in self.stop:
            at = self.text.find(stop, max(0, len(self.text) - len(stop) - 16))
            if at >= 0:
                self.text = self.text[:at]
                self.finish = Finish("stop", matched=stop)
                return


@dataclass(frozen=True)
class Emission:
    """What one step gave one sequence, to be delivered when the step's time is up."""

    seq: Sequence
    ids: tuple[int, ...]
    text: str
    finish: Finish | None


@dataclass(frozen=True)
class Step:
    kind: Literal["prefill", "decode"]
    duration: float
    batch: int
    emitted: tuple[Emission, ...]
    new_tokens: int = 0  # a prefill's tokens computed
    cached_tokens: int = 0  # and those the radix cache held


class Engine:
    def __init__(
        self,
        hardware: HardwareModel,
        *,
        speculative: bool,
        steps: int,
        acceptance: Acceptance,
        max_running_requests: int,
        cuda_graph_max_bs: int,
        seed: int = 0,
        chunked_prefill_size: int = 8192,
        noise: Noise | None = None,
        cache: RadixCache | None = None,
        adaptive: AdaptiveDepth | None = None,
        skip_zero_extend: bool = False,
        max_total_tokens: int | None = None,
    ) -> None:
        self.hardware = hardware
        self.speculative = speculative
        self.steps = steps
        self.acceptance = acceptance
        self.max_running_requests = max_running_requests
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.seed = seed
        self.chunked_prefill_size = chunked_prefill_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache = cache  # None: every prompt is prefilled whole
        self.adaptive = adaptive  # None: every decode drafts to ``steps``
        self.skip_zero_extend = skip_zero_extend
        self.depth = steps if speculative else 0  # the last decode's drafting depth
        self.max_total_tokens = max_total_tokens  # the KV cache's size; None: no limit
        self.ratio = NewTokenRatio()
        self.retracted = 0  # requests retracted since the start
        self.retracted_input_tokens = 0  # and the prompt tokens they held
        self.last_retracted = 0  # at the last retraction
        mode = "spec" if speculative else "base"
        self.noise = None if noise is None or noise.off else NoiseSource(noise, f"{seed}|{mode}")

    def submit(self, seq: Sequence) -> None:
        seq.seed(self.seed)
        seq.accept_rate = self.acceptance.rate_for(seq.prompt)
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """The sequence leaves at the next step boundary."""
        seq.aborted = True

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def held_tokens(self) -> int:
        """The KV cache's tokens the running requests hold."""
        return sum(seq.context_tokens for seq in self.running)

    def step(self) -> Step | None:
        self._drop_finished()
        if not self.running:
            self.ratio.reset()
        step = None
        if self.waiting and len(self.running) < self.max_running_requests:
            step = self._prefill()
        if step is None and self.running:
            step = self._decode()
        if step is None:
            if self.noise is not None:
                self.noise.idle()
            return None
        if self.noise is not None:
            step = replace(step, duration=step.duration * self.noise.factor())
        return step

    def _drop_finished(self) -> None:
        for seq in self.waiting:
            if seq.aborted and seq.finish is None:
                seq.finish = Finish("abort")
        self.waiting = deque(s for s in self.waiting if not s.aborted)
        for seq in self.running:
            if seq.aborted and seq.finish is None:
                seq.finish = Finish("abort")
        self.running = [s for s in self.running if s.finish is None]

    def _prefill(self) -> Step | None:
        """Admit from the queue's head while the chunk has room and, with a KV cache of a
        size, while it has room too; a prompt's prefix in the radix cache is not computed
        (at least its last token is, for the logits), and the prompts admitted go into the
        cache after the step, as SGLang caches them. None: none could be admitted."""
        admitted: list[Sequence] = []
        tokens = cached = 0
        room = self.max_running_requests - len(self.running)
        free = self._free_tokens()
        while self.waiting and len(admitted) < room:
            nxt = self.waiting[0]
            hit = 0 if nxt.retracted else self._cached(nxt)
            fill = nxt.context_tokens - hit  # a retracted request's output is filled again
            if admitted and tokens + fill > self.chunked_prefill_size:
                break
            need = nxt.context_tokens + self._reserve(nxt)
            if free is not None and need > free and (admitted or self.running):
                break  # it waits for room, as SGLang's scheduler has it wait
            admitted.append(self.waiting.popleft())
            nxt.cached_tokens, nxt.retracted = hit, False
            tokens += fill
            cached += hit
            if free is not None:
                free -= need
        if not admitted:
            return None
        duration = self.hardware.prefill_ms(max(tokens, 1), self.speculative) / 1000.0
        if self.cache is not None:
            for seq in admitted:
                self.cache.insert(seq.prompt_ids)
        emitted = tuple(_advance(seq, 1) for seq in admitted)
        self.running.extend(admitted)
        return Step("prefill", duration, len(admitted), emitted, tokens, cached)

    def _cached(self, seq: Sequence) -> int:
        if self.cache is None or not seq.prompt_ids:
            return 0
        return min(self.cache.match(seq.prompt_ids), seq.prompt_tokens - 1)

    def _free_tokens(self) -> float | None:
        """The KV cache's tokens neither held nor set aside for the running requests' next
        tokens (SGLang's ``rem_total_tokens``); None where its size is no limit."""
        if self.max_total_tokens is None:
            return None
        reserved = sum(self._reserve(seq) for seq in self.running)
        return self.max_total_tokens - self.held_tokens - reserved

    def _reserve(self, seq: Sequence) -> float:
        """What SGLang sets aside for a request's tokens to come: its remaining budget (at
        most 4,096) times the new-token ratio (1 for a request that ignores EOS)."""
        left = min(seq.max_new_tokens - len(seq.output_ids), CLIP_MAX_NEW_TOKENS)
        return left * (1.0 if seq.ignore_eos else self.ratio.current)

    def _fit(self, per_request: int) -> bool:
        """With a KV cache of a size: running requests retracted, those with the least output
        (the longest prompt among equals) first, until the next decode's ``per_request``
        tokens each fit, as SGLang's ``retract_decode`` does; each goes back to the queue's
        head, its KV freed. Whether any was."""
        if self.max_total_tokens is None:
            return False
        keep = sorted(self.running, key=lambda s: (len(s.output_ids), -s.prompt_tokens))
        keep.reverse()
        held, retracted = self.held_tokens, []
        while len(keep) > 1 and held + per_request * len(keep) > self.max_total_tokens:
            seq = keep.pop()
            held -= seq.context_tokens
            seq.retracted = True
            retracted.append(seq)
        if not retracted:
            return False
        self.running = [s for s in self.running if not s.retracted]
        self.waiting.extendleft(reversed(retracted))
        self.retracted += len(retracted)
        self.retracted_input_tokens += sum(s.prompt_tokens for s in retracted)
        self.last_retracted = len(retracted)
        self.ratio.after_retraction(self.running)
        return True

    def _depth(self, batch: int) -> int:
        """The drafts a decode of ``batch`` requests makes for each (0 without speculation)."""
        if not self.speculative:
            return 0
        return self.steps if self.adaptive is None else self.adaptive.depth_for(batch)

    def _decode(self) -> Step:
        depth = self._depth(len(self.running))
        if self._fit(depth + 1):  # requests retracted: the batch, and so its depth, changed
            depth = self._depth(len(self.running))
        batch, kv = len(self.running), self.held_tokens
        self.ratio.decay()
        if not self.speculative:
            ms = self.hardware.decode_ms(batch, kv, self.cuda_graph_max_bs)
            emitted = tuple(_advance(seq, 1) for seq in self.running)
            return Step("decode", ms / 1000.0, batch, emitted)
        skipped = depth == 0 and self.skip_zero_extend
        self.depth = depth
        ms = self.hardware.speculative_ms(
            batch, depth, kv, self.cuda_graph_max_bs, extend=not skipped
        )
        accepted = []
        for seq in self.running:
            seq.verify_ct += 1
            drafts = accepted_drafts(seq._accepts, seq.accept_rate, depth)
            if seq.cold and depth > 0:  # drafted from a stale state: nothing matches
                drafts, seq.cold = 0, False
            seq.cold = seq.cold or skipped
            accepted.append(drafts)
        emitted = tuple(_advance(seq, 1 + n) for seq, n in zip(self.running, accepted, strict=True))
        if self.adaptive is not None:
            self.adaptive.verified(accepted, batch)
        return Step("decode", ms / 1000.0, batch, emitted)


CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@dataclass
class NewTokenRatio:
    """SGLang's estimate of the share of a request's budget still to be decoded: 0.7 at
    first, less by (0.7 - 0.098) / 600 at every decode down to 0.098, back to 0.7 when
    nothing runs, and after a retraction the share the running requests decoded so far
    (each counted 20 tokens ahead), at most 1."""

    initial: float = 0.7
    floor: float = 0.7 * 0.14
    steps: int = 600
    current: float = 0.7

    def decay(self) -> None:
        self.current = max(self.current - (self.initial - self.floor) / self.steps, self.floor)

    def reset(self) -> None:
        self.current = self.initial

    def after_retraction(self, running: list[Sequence]) -> None:
        decoded = sum(len(s.output_ids) for s in running) + 20 * len(running)
        budget = sum(s.max_new_tokens for s in running) + 1
        self.current = min(1.0, decoded / budget)


def _advance(seq: Sequence, n: int) -> Emission:
    before, text = len(seq.output_ids), seq.text
    seq.generate(n)
    delta = seq.text[len(text) :] if seq.text.startswith(text) else ""
    return Emission(seq, tuple(seq.output_ids[before:]), delta, seq.finish)
