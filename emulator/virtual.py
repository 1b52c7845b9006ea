"""The engine model in virtual time: the one driver behind the ground truth (``--predict``),
the virtual sweep, the offline comparison and the coverage study.

Each server is an engine (the code an emulated server runs) whose steps advance one shared
clock instead of being slept. A step's answers are handed over when its time is up, after
the engine has chosen its next batch, so a request sent in answer to them joins the batch
after the next, as with SGLang's scheduler. Servers that share GPUs (``share_gpus``) take
turns, as they do live.

``ClosedLoop`` drives one server as a live closed loop does: clients start one after
another, each once the one before has its first token (so their phases spread, as real
traffic's do), and each sends its next request when its answer ends.
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

from specroute.emulator.accept_schedule import apply
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.engine import Emission, Sequence, Step


class VirtualServer:
    """An engine on the clock: its steps take their modelled seconds times ``scale`` (a
    live server's time scale, or 1 for the model's own seconds)."""

    def __init__(self, name: str, config: EmulatorConfig, scale: float = 1.0) -> None:
        self.name, self.config, self.scale = name, config, scale
        self.engine = config.engine()
        self.busy = False  # a step is running, or one is about to be chosen


S = TypeVar("S", bound=VirtualServer)


class VirtualTime(Generic[S]):
    """The clock and its events: ``deliver(server, step)`` is called when a step ends."""

    def __init__(self, deliver: Callable[[S, Step], None]) -> None:
        self.now = 0.0
        self._deliver = deliver
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # events at one time run in the order they were set
        self._gpus_free: dict[str, float] = {}  # when GPUs servers share are next free

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._order), action))

    def follow_schedule(self, server: S) -> None:
        """The server's accept schedule on this clock (its changes in the model's seconds,
        times its scale)."""
        for change in server.config.accept_schedule:
            self.at(change.at * server.scale, partial(apply, server.engine, change))

    def submit(self, server: S, seq: Sequence) -> None:
        server.engine.submit(seq)
        if not server.busy:
            server.busy = True
            self.at(self.now, lambda: self._step(server))  # after the others arriving now

    def run(self, until: float = math.inf, done: Callable[[], bool] = lambda: False) -> None:
        """Events in time order, up to ``until`` or until ``done()``, asked between events."""
        while self._events and self._events[0][0] < until and not done():
            self.now, _, action = heapq.heappop(self._events)
            action()

    def _step(self, server: S) -> None:
        step = server.engine.step()
        if step is None:
            server.busy = False
            return
        seconds, start = step.duration * server.scale, self.now
        if (gpus := server.config.share_gpus) is not None:
            start = max(start, self._gpus_free.get(gpus, 0.0))
            self._gpus_free[gpus] = start + seconds
        self.at(start + seconds, lambda: self._finish(server, step))

    def _finish(self, server: S, step: Step) -> None:
        self._step(server)  # the next batch is chosen before this one's answers arrive
        self._deliver(server, step)


class ClosedLoop(ABC):
    """``concurrency`` clients on one engine, in the model's own seconds. A subclass says
    what each request's prompt is, what it records, and when the loop is over; requests a
    step's answers call for are sent once the whole step has been read."""

    def __init__(
        self, config: EmulatorConfig, concurrency: int, input_len: int, output_len: int
    ) -> None:
        self.concurrency, self.input_len, self.output_len = concurrency, input_len, output_len
        self.server = VirtualServer(config.mode, config)
        self.time: VirtualTime[VirtualServer] = VirtualTime(self._deliver)
        self.sent = self.clients = 0
        self.verifies = self.spec_tokens = 0  # verify passes and the tokens they gave
        self.client_of: dict[str, int] = {}

    @property
    def now(self) -> float:
        return self.time.now

    @property
    def accept_length(self) -> float | None:
        return self.spec_tokens / self.verifies if self.verifies else None

    @abstractmethod
    def prompt(self, rid: str) -> str:
        """The text request ``rid`` sends (it seeds the request's accepted drafts)."""

    @abstractmethod
    def sending(self, rid: str) -> None:
        """A request is about to be sent."""

    @abstractmethod
    def first_token(self, rid: str) -> bool:
        """Tokens came; whether they are its first (then the next client may start)."""

    @abstractmethod
    def finished(self, rid: str, tokens: int) -> None:
        """Its answer ended with ``tokens`` output tokens."""

    def may_send(self, waiting: int) -> bool:
        """Whether another request may be sent, ``waiting`` more already being due."""
        return True

    def over(self) -> bool:
        """The loop is over at once: what the step still holds is not read."""
        return False

    def done(self) -> bool:
        """The loop is over once the step being read has been read."""
        return self.over()

    def run(self) -> None:
        self._send(0)
        self.clients = 1
        self.time.run(done=self.done)

    def _send(self, client: int) -> None:
        rid = str(self.sent)
        self.sent += 1
        self.client_of[rid] = client
        self.sending(rid)
        seq = Sequence(rid, self.prompt(rid), self.input_len, self.output_len, ignore_eos=True)
        self.time.submit(self.server, seq)

    def _deliver(self, server: VirtualServer, step: Step) -> None:
        due: list[int] = []  # the clients that send next, in the order their answers came
        for emission in step.emitted:
            self._read(step, emission, due)
            if self.over():
                return
        for client in due:
            self._send(client)

    def _read(self, step: Step, emission: Emission, due: list[int]) -> None:
        rid = emission.seq.rid
        starts_next = emission.ids and self.first_token(rid) and self.clients < self.concurrency
        if starts_next and self.may_send(len(due)):
            due.append(self.clients)
            self.clients += 1
        if step.kind == "decode" and self.server.engine.speculative:
            self.verifies += 1
            self.spec_tokens += len(emission.ids)
        if emission.finish is not None:
            self.finished(rid, len(emission.seq.output_ids))
            if not self.over() and self.may_send(len(due)):
                due.append(self.client_of[rid])
