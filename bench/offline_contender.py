"""One contender of ``specroute bench deployments`` offline: its servers' engines on one
virtual clock (servers that share GPUs take turns), the router's policy choosing from its
view of them, polled every half second as the router polls, and the trace's requests sent
by their arrival times."""

from __future__ import annotations

import math
from functools import partial

from specroute.bench.contenders import Contender
from specroute.bench.replay import RoutedServer
from specroute.emulator.engine import Emission, Sequence, Step
from specroute.emulator.virtual import VirtualTime
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.request_trace import RequestTrace
from specroute.policies.view import ConcurrencySource, RequestInfo, View

_PATH = "/v1/chat/completions"


class _OpenLoop:
    """One contender serving a request trace: each request sent when the trace says, routed
    by the contender's policy from the router's view of its servers."""

    def __init__(self, contender: Contender, trace: RequestTrace, poll_interval: float) -> None:
        self.trace, self.poll_interval = trace, poll_interval
        self.name, self.policy = contender.name, contender.router()
        self.servers = [
            RoutedServer(f"{s.pool}:{i}", s.pool, s.config) for i, s in enumerate(contender.servers)
        ]
        self.time: VirtualTime[RoutedServer] = VirtualTime(self.deliver)
        self.records: list[RequestRecord] = []
        self.owners: dict[str, RequestRecord] = {}

    def run(self, until: float) -> list[RequestRecord]:
        for i, request in enumerate(self.trace.requests):
            self.time.at(request.at, partial(self.send, i))
        for k in range(math.ceil(until / self.poll_interval)):
            self.time.at(k * self.poll_interval, self.poll)
        self.time.run(until=until)
        return self.records

    def poll(self) -> None:
        for server in self.servers:
            server.poll()

    def send(self, i: int) -> None:
        request, now = self.trace.requests[i], self.time.now
        view = View(tuple(s.view() for s in self.servers), ConcurrencySource.ROUTER, now)
        output = max(1, request.output_tokens)
        info = RequestInfo(_PATH, max_tokens=output, prompt_tokens=request.prompt_tokens)
        decision = self.policy.choose(info, view)
        server = next(s for s in self.servers if s.name == decision.backend)
        seq = Sequence(f"t{i}", f"trace {i}", request.prompt_tokens, output, ignore_eos=True)
        record = RequestRecord(self.name, 0, 0, now, served_by=server.name)
        record.prompt_tokens = request.prompt_tokens
        self.records.append(record)
        self.owners[seq.rid] = record
        self.time.submit(server, seq)
        server.add(now, 1)

    def deliver(self, server: RoutedServer, step: Step) -> None:
        for emission in step.emitted:
            self.answer(server, emission)

    def answer(self, server: RoutedServer, emission: Emission) -> None:
        record, now = self.owners[emission.seq.rid], self.time.now
        if emission.ids:
            if record.first_token is None:
                record.first_token = now
            record.chunks.append((now, len(emission.ids)))
        if emission.finish is None:
            return
        seq = emission.seq
        del self.owners[seq.rid]
        record.end, record.output_tokens = now, len(seq.output_ids)
        server.add(now, -1)
        server.tokens += len(seq.output_ids)
        server.verifies += seq.verify_ct


def serve(
    contender: Contender, trace: RequestTrace, until: float, poll_interval: float = 0.5
) -> list[RequestRecord]:
    """Every request of ``trace`` through ``contender``, in virtual seconds from 0, cut at
    ``until`` (a request not finished by then has no end)."""
    return _OpenLoop(contender, trace, poll_interval).run(until)
