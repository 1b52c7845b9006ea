"""Runs the engine model in real time: sleep each step's modelled time, then deliver.

Sleeps aim at deadlines rather than durations, so a sleep that overshoots is made up by
the next one; when the process falls behind anyway, the shortfall shows as lag in
``/metrics`` instead of silently slowing the modelled hardware.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from specroute.emulator.engine import Emission, Engine, Finish, Sequence, Step
from specroute.emulator.gpus import SharedGpus
from specroute.emulator.metrics import EngineMetrics
from specroute.emulator.step_trace import StepTrace

Listener = Callable[[Emission], None]
_CATCH_UP_LIMIT = 0.05  # seconds behind schedule after which the loop stops catching up
_LAG_WINDOW = 256  # steps in the lag gauge's window
_log = logging.getLogger("specroute.emulator")


class QueueFull(Exception):
    """The waiting queue is at --max-queued-requests."""


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        metrics: EngineMetrics,
        *,
        time_scale: float,
        max_queued_requests: int | None = None,
        decode_log_interval: int = 40,
        stream_interval: int = 1,
        gpus: SharedGpus | None = None,
    ) -> None:
        self.engine = engine
        self.gpus = gpus  # shared with other servers' steps, or None: GPUs of its own
        self.metrics = metrics
        self.time_scale = time_scale
        self.max_queued_requests = max_queued_requests
        self.decode_log_interval = decode_log_interval
        self.stream_interval = stream_interval
        self._listeners: dict[str, Listener] = {}
        self._by_rid: dict[str, Sequence] = {}
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._lag: deque[tuple[float, float]] = deque(maxlen=_LAG_WINDOW)
        self._lag_sums = [0.0, 0.0]  # the window's intended and actual seconds
        self._retracted = (0, 0)  # the engine's retractions counted so far, and their tokens
        self._decodes_since_log = 0
        self._log_tokens = 0
        self._log_verifies = 0
        self._log_spec_tokens = 0
        self._log_started = time.monotonic()
        self.total_spec_tokens = 0
        self.total_verifies = 0
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0  # over the last full decode-log interval
        self.trace = StepTrace()  # /start_profile and /stop_profile
        size = metrics.max_total_num_tokens  # a constant: SGLang emits it once, at start
        size.labels(*metrics.scheduler_values).set(self.max_total_tokens)

    # -- requests ---------------------------------------------------------------------
    def submit(self, seq: Sequence, listener: Listener) -> None:
        if seq.rid in self._by_rid:
            raise ValueError(f"request id {seq.rid!r} is already running")
        if (
            self.max_queued_requests is not None
            and len(self.engine.waiting) >= self.max_queued_requests
        ):
            raise QueueFull("The request queue is full.")
        self._by_rid[seq.rid] = seq
        interval = self.stream_interval
        self._listeners[seq.rid] = listener if interval == 1 else _every(interval, listener)
        self.engine.submit(seq)
        self._wake.set()

    def abort(self, rid: str) -> bool:
        """End a request now (its client sees ``abort``); it leaves the batch next step."""
        seq = self._by_rid.pop(rid, None)
        listener = self._listeners.pop(rid, None)
        if seq is None:
            return False
        self.engine.abort(seq)
        seq.finish = Finish("abort")
        m = self.metrics
        m.bound(m.num_aborted_requests, *m.tokenizer_values()).inc()
        if listener is not None:
            listener(Emission(seq, (), "", seq.finish))
        return True

    def release(self, rid: str) -> None:
        """The handler is done with a request: forget it, aborting it if unfinished."""
        if rid in self._by_rid:
            self.abort(rid)

    def abort_all(self) -> int:
        rids = list(self._by_rid)
        for rid in rids:
            self.abort(rid)
        return len(rids)

    async def wait_progress(self, timeout: float) -> bool:  # noqa: ASYNC109
        """True once any step completes within ``timeout`` seconds, or the engine runs out
        of work (its last step completed: a health check that found it busy with the end of
        another's one-token request is answered, not left waiting for a step to come)."""
        self._progress.clear()
        try:
            await asyncio.wait_for(self._progress.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- the loop ---------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = last = loop.time()
        while True:
            step = self.engine.step()
            if step is None:
                self._progress.set()
                self._refresh_gauges()
                self._wake.clear()
                await self._wake.wait()
                deadline = last = loop.time()
                continue
            seconds = step.duration * self.time_scale
            start = deadline if self.gpus is None else self.gpus.reserve(deadline, seconds)
            intended = start + seconds - deadline  # the step, after any wait for shared GPUs
            deadline = start + seconds
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._deliver(step)
            self.trace.record(step, start, seconds)
            now = loop.time()
            self._account(step, intended, now - last)
            last = now
            if now - deadline > _CATCH_UP_LIMIT:
                deadline = now
            # let the handlers write what was delivered before the next sleep: after waking
            # hundreds of streams a timer alone leaves them waiting past the next deadline
            await asyncio.sleep(0)

    def _deliver(self, step: Step) -> None:
        tokens = 0
        for emission in step.emitted:
            seq = emission.seq
            listener = self._listeners.get(seq.rid)
            if seq.aborted or listener is None:
                continue
            tokens += len(emission.ids)
            if emission.finish is not None:
                self._by_rid.pop(seq.rid, None)
                self._listeners.pop(seq.rid, None)
            listener(emission)
        self._log_tokens += tokens
        if step.kind == "decode" and self.engine.speculative:
            verifies = sum(1 for e in step.emitted if e.ids)
            self._log_verifies += verifies
            self._log_spec_tokens += tokens
            self.total_verifies += verifies
            self.total_spec_tokens += tokens
        self._progress.set()

    def _account(self, step: Step, intended: float, actual: float) -> None:
        m = self.metrics
        m.bound(m.steps, step.kind).inc()
        m.step_intended.inc(intended)
        m.step_actual.inc(actual)
        if len(self._lag) == self._lag.maxlen:  # the oldest leaves the window's sums
            gone_intended, gone_actual = self._lag[0]
            self._lag_sums[0] -= gone_intended
            self._lag_sums[1] -= gone_actual
        self._lag.append((intended, actual))
        self._lag_sums[0] += intended
        self._lag_sums[1] += actual
        want, took = self._lag_sums
        if want > 0:
            m.lag_ratio.set(took / want - 1.0)
        if step.kind == "prefill":
            self._prefilled(step)
            self._refresh_gauges()
            return
        self._decodes_since_log += 1
        self._count_retractions()
        if self._decodes_since_log >= self.decode_log_interval:
            self._refresh_gauges()

    def _count_retractions(self) -> None:
        """The engine's retractions since the last step, in SGLang's counters."""
        engine, m, labels = self.engine, self.metrics, self.metrics.scheduler_values
        requests = engine.retracted - self._retracted[0]
        if requests:
            m.bound(m.num_retracted_requests, *labels).inc(requests)
            m.bound(m.num_retracted_input_tokens, *labels).inc(
                engine.retracted_input_tokens - self._retracted[1]
            )
            self._retracted = (engine.retracted, engine.retracted_input_tokens)

    def _prefilled(self, step: Step) -> None:
        """SGLang's prefill report: the batch's hit rate, the effective tokens, the log line."""
        m, labels = self.metrics, self.metrics.scheduler_values
        total = step.new_tokens + step.cached_tokens
        m.bound(m.cache_hit_rate, *labels).set(step.cached_tokens / total if total else 0.0)
        for mode, n in (("input", step.new_tokens), ("device_hit", step.cached_tokens)):
            if n:
                m.bound(m.prefill_effective_tokens, *labels, mode).inc(n)
        _log.info(
            "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, "
            "#running-req: %d, #queue-req: %d",
            step.batch,
            step.new_tokens,
            step.cached_tokens,
            len(self.engine.running) - step.batch,
            len(self.engine.waiting),
        )

    def _refresh_gauges(self) -> None:
        """Like SGLang's scheduler, which sets every gauge from one stats object: at prefill,
        on idling and at decode-log intervals; throughput and accept length are computed
        only at a full interval (``log_decode_stats`` resets its accumulators there alone,
        so one interval may span idle time) and repeated in between."""
        m, labels = self.metrics, self.metrics.scheduler_values
        if self._decodes_since_log >= self.decode_log_interval:
            now = time.monotonic()
            elapsed = now - self._log_started
            if elapsed > 0:
                self.last_gen_throughput = self._log_tokens / elapsed
            if self._log_verifies:
                self.last_accept_length = self._log_spec_tokens / self._log_verifies
            self._log_tokens = self._log_verifies = self._log_spec_tokens = 0
            self._decodes_since_log = 0
            self._log_started = now
        m.bound(m.gen_throughput, *labels).set(self.last_gen_throughput)
        if self.engine.speculative:
            accepted = self.last_accept_length
            m.bound(m.spec_accept_length, *labels).set(accepted)
            m.bound(m.spec_accept_rate, *labels).set(max(0.0, accepted - 1) / self.engine.steps)
        depth = self.engine.depth  # the last decode's; 0 on a plain server, as SGLang's
        m.bound(m.spec_num_steps, *labels).set(depth)
        m.bound(m.spec_num_draft_tokens, *labels).set(depth + 1 if self.engine.speculative else 0)
        m.bound(m.num_retracted_reqs, *labels).set(self.engine.last_retracted)
        m.bound(m.num_running_reqs, *labels).set(len(self.engine.running))
        m.bound(m.num_queue_reqs, *labels).set(len(self.engine.waiting))
        used = sum(s.context_tokens for s in self.engine.running)
        m.bound(m.token_usage, *labels).set(used / max(1, self.max_total_tokens))
        m.bound(m.num_used_tokens, *labels).set(used)

    @property
    def max_total_tokens(self) -> int:
        """The KV cache's size: as modelled from memory, else one no load reaches."""
        if self.engine.max_total_tokens is not None:
            return self.engine.max_total_tokens
        return self.engine.max_running_requests * 8192

    @property
    def avg_spec_accept_length(self) -> float | None:
        """Cumulative since start, as SGLang reports it in ``/server_info``."""
        if not self.total_verifies:
            return None
        return self.total_spec_tokens / self.total_verifies


def _every(interval: int, listener: Listener) -> Listener:
    """SGLang's ``--stream-interval``: a request's first tokens go out at once, then
    whenever at least ``interval`` tokens are unsent, and always at the end."""
    pending: Emission | None = None
    started = False

    def deliver(emission: Emission) -> None:
        nonlocal pending, started
        if pending is not None:
            emission = Emission(
                emission.seq,
                pending.ids + emission.ids,
                pending.text + emission.text,
                emission.finish,
            )
        if (emission.ids and not started) or emission.finish or len(emission.ids) >= interval:
            started, pending = True, None
            listener(emission)
        else:
            pending = emission

    return deliver
