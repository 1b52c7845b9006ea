"""The other router replicas in front of the same servers (``router.online.peers``), whose samples
the leader takes before each fit, so that every replica fits from every replica's samples
and they reach the same crossover, instead of each fitting from its own share.

Off the request path, in the fitting task: one ``ClientSession`` of its own, that sends
the router's admin key to the peers and to nothing else (the backends' session sends the
backend key), a short timeout, every peer at once. A pull that fails says why in a fixed
vocabulary (``PeerError``), counted in ``specroute_online_peer_errors_total{peer,reason}``
each time and logged when a peer's state changes (failing, failing otherwise, answering
again), not at every fit; the fit goes on from what the others gave. A peer is named by its
URL without any ``user:password@``, which is not sent either: the admin key is the peer's
credential. Nothing of the key is logged, counted or shown.

A peer may be given by name, ``dns+http://NAME:PORT`` (as backends are: every IPv4 address
NAME has is a peer on PORT, a headless Kubernetes Service lists the ready router pods so),
resolved again before a pull once ``every`` seconds have gone by: peers come and go as pods
do. This router is among them then, as expected: a peer found by name that answers with this
router's epoch is skipped quietly (shown as ``itself``, not counted, not asked again), while a
URL given as such that is this router is a mistake, an ``itself`` error. A name that does not
resolve keeps the peers it last gave, counted as ``resolve`` under the name and logged once
per change.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp
import orjson

from specroute.online.samples import Sample
from specroute.router.admission.auth import without_credentials
from specroute.router.backends.discovery import Resolve, is_dns, lookup, resolve_ipv4
from specroute.router.metrics import RouterMetrics
from specroute.router.online.peer_answer import SAMPLES_PATH, BadAnswer, parse

_log = logging.getLogger("specroute.router")

MAX_ANSWER_BYTES = 64 << 20  # a peer's answer past this is not read


class PeerError(StrEnum):
    """Why a pull from a peer took nothing (``bad_row``: rows of an answer that did not
    read, counted each, the rest taken)."""

    UNREACHABLE = "unreachable"  # no connection, or it broke
    TIMEOUT = "timeout"
    REFUSED = "refused"  # 401 or 403: the admin keys differ, or the peer has none
    STATUS = "status"  # another status than 200
    NOT_JSON = "not_json"
    BAD_ANSWER = "bad_answer"  # JSON, but not of the shape, or too large
    ITSELF = "itself"  # the peer is this router (its epoch is this router's)
    BAD_ROW = "bad_row"
    RESOLVE = "resolve"  # a name's: it did not resolve, its last peers kept


@dataclass
class Peer:
    url: str  # as asked, logged, counted and shown: without any user:password@
    by: str | None = None  # the dns+ name it was found by; None: given as such
    epoch: str | None = None
    cursor: str | None = None
    taken: int = 0
    dropped: int = 0
    state: str = "new"  # "answering", or the last PeerError: what is logged when it changes
    last_error: PeerError | None = None
    last_error_at: float | None = None


class Peers:
    def __init__(
        self,
        urls: list[str],
        metrics: RouterMetrics,
        epoch: str,
        max_age: float,
        keep: int,
        resolve: Resolve = resolve_ipv4,
        every: float = 5.0,
    ) -> None:
        """``epoch``: this router's rings' (a peer that answers with it is this router);
        ``max_age``: the online window, the oldest a row may be; ``keep``: the most rows
        taken from one answer (as many as the samples kept); ``every``: the seconds between
        resolutions of the names among ``urls``."""
        shown = [without_credentials(u) for u in urls]
        self.given = [Peer(u) for u in shown if not is_dns(u)]
        self.names = [u for u in shown if is_dns(u)]
        self.found: dict[str, list[Peer]] = {name: [] for name in self.names}  # the last answers
        self.unresolved: set[str] = set()  # the names failing now: logged when it changes
        self.peers = list(self.given)
        self.metrics, self.epoch, self.max_age, self.keep = metrics, epoch, max_age, keep
        self._resolve, self._every, self._resolved_at = resolve, every, -math.inf
        for peer in self.peers:  # 0 from the start
            metrics.online_peer_samples.labels(peer=peer.url)
        for name in self.names:
            metrics.online_peer_errors.labels(peer=name, reason=PeerError.RESOLVE)

    async def pull(self, session: aiohttp.ClientSession, seconds: float) -> list[Sample]:
        """Every peer's samples since the last pull, at this router's monotonic times; each
        peer's answer within ``seconds``, and each name's resolution."""
        await self._rediscover(seconds)
        limit = aiohttp.ClientTimeout(total=seconds)
        found = await asyncio.gather(*(self._pull(session, p, limit) for p in self.peers))
        return [s for taken in found for s in taken]

    async def _rediscover(self, seconds: float) -> None:
        """The names resolved again when ``every`` has gone by: peers that came are asked
        from now on, those gone are no longer asked nor shown (a peer that stays keeps its
        cursor); one given as such and found too is asked once, as given."""
        at = time.monotonic()
        if not self.names or at - self._resolved_at < self._every:
            return
        self._resolved_at = at
        answers = await asyncio.gather(*(self._lookup(name, seconds) for name in self.names))
        was = {p.url: p for p in self.peers}
        known = dict(was)  # with those that came: a peer found under two names comes once
        for name, urls in zip(self.names, answers, strict=True):
            if urls is not None:
                self.found[name] = [
                    known.get(u) or known.setdefault(u, self._came(u, name)) for u in urls
                ]
        named: dict[str, Peer] = {}
        for peer in (*self.given, *(p for found in self.found.values() for p in found)):
            named.setdefault(peer.url, peer)
        for gone in was.keys() - named.keys():
            _log.info("Online peer %s is no longer found by name; it is not asked.", gone)
        self.peers = list(named.values())

    async def _lookup(self, name: str, seconds: float) -> list[str] | None:
        """The peers' URLs a name stands for now, or None when it did not resolve."""
        try:
            async with asyncio.timeout(seconds):
                urls = await lookup(name, self._resolve)
        except OSError as exc:  # socket.gaierror, or TimeoutError: no such name, or no answer
            self.metrics.online_peer_errors.labels(peer=name, reason=PeerError.RESOLVE).inc()
            if name not in self.unresolved:
                self.unresolved.add(name)
                _log.warning(
                    "Resolving the online peers %s failed (%s); the peers it gave stay.",
                    name,
                    str(exc) or type(exc).__name__,
                )
            return None
        if name in self.unresolved:
            self.unresolved.discard(name)
            _log.info("The online peers %s resolve again.", name)
        return urls

    def _came(self, url: str, name: str) -> Peer:
        self.metrics.online_peer_samples.labels(peer=url)  # 0 from the start
        _log.info("Online peer %s found by %s; it is asked.", url, name)
        return Peer(url, by=name)

    async def _pull(
        self, session: aiohttp.ClientSession, peer: Peer, limit: aiohttp.ClientTimeout
    ) -> list[Sample]:
        if peer.by is not None and peer.state == PeerError.ITSELF:
            return []  # this router, found by name: its address is its own while it lives
        params = {} if peer.cursor is None else {"after": peer.cursor}
        try:
            async with session.get(peer.url + SAMPLES_PATH, params=params, timeout=limit) as r:
                if r.status in (401, 403):
                    return self._failed(peer, PeerError.REFUSED, f"HTTP {r.status}")
                if r.status != 200:
                    return self._failed(peer, PeerError.STATUS, f"HTTP {r.status}")
                body = await _read(r)
        except TimeoutError:
            return self._failed(peer, PeerError.TIMEOUT, "no answer in time")
        except aiohttp.ClientError as exc:
            return self._failed(peer, PeerError.UNREACHABLE, type(exc).__name__)
        if body is None:
            return self._failed(peer, PeerError.BAD_ANSWER, "larger than it may be")
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._failed(peer, PeerError.NOT_JSON, "not JSON")
        try:
            answer = parse(document, time.monotonic(), self.max_age)
        except BadAnswer as exc:
            return self._failed(peer, PeerError.BAD_ANSWER, str(exc))
        if answer.epoch == self.epoch:
            if peer.by is not None:  # expected under a name that lists every replica
                peer.state = str(PeerError.ITSELF)
                _log.debug("Online peer %s found by %s is this router.", peer.url, peer.by)
                return []
            return self._failed(peer, PeerError.ITSELF, "it is this router")
        if peer.epoch is not None and answer.epoch != peer.epoch:
            _log.info("Online peer %s started again; its samples from its oldest.", peer.url)
        peer.epoch, peer.cursor = answer.epoch, answer.next
        taken = answer.samples[-self.keep :]
        peer.taken += len(taken)
        self.metrics.online_peer_samples.labels(peer=peer.url).inc(len(taken))
        if answer.dropped:
            peer.dropped += answer.dropped
            self._error(peer, PeerError.BAD_ROW, answer.dropped)
            self._became(peer, str(PeerError.BAD_ROW), f"{answer.dropped} rows did not read")
        else:
            self._became(peer, "answering", "")
        return taken

    def _failed(self, peer: Peer, reason: PeerError, why: str) -> list[Sample]:
        self._error(peer, reason, 1)
        self._became(peer, str(reason), why)
        return []

    def _error(self, peer: Peer, reason: PeerError, n: int) -> None:
        self.metrics.online_peer_errors.labels(peer=peer.url, reason=reason).inc(n)
        peer.last_error, peer.last_error_at = reason, time.monotonic()

    def _became(self, peer: Peer, state: str, why: str) -> None:
        """Logged once per change of state, not at every fit."""
        if state == peer.state:
            return
        was, peer.state = peer.state, state
        if state == "answering":
            again = "" if was == "new" else " again"
            _log.info("Online peer %s answers%s; its samples are taken.", peer.url, again)
        elif state == PeerError.BAD_ROW:
            _log.warning("Online peer %s: %s (%s); those are dropped.", peer.url, why, state)
        else:
            _log.warning(
                "Online peer %s: %s (%s); none of its samples are taken until it answers.",
                peer.url,
                why,
                state,
            )

    def describe(self) -> list[dict[str, Any]]:
        """For ``/router/status`` (``Online.peers``): each peer's samples taken and rows
        dropped, its state, the name it was found by (None: given as such), and its last
        error with its monotonic time."""
        return [
            {
                "peer": p.url,
                "by": p.by,
                "samples": p.taken,
                "rows_dropped": p.dropped,
                "state": p.state,
                "last_error": None if p.last_error is None else str(p.last_error),
                "last_error_at": p.last_error_at,
            }
            for p in self.peers
        ]


async def _read(response: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None past ``MAX_ANSWER_BYTES``."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
