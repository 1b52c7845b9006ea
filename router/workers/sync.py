"""What the workers of one router tell each other beyond the board's counts: the leader's
set of backends, the profile posted last to any worker, and the leader's online fit. Each
is a file in the workers' folder, written whole, and announced by a count on the board that
only grows; a worker that sees a count it has not seen reads the file. A router of one
worker has no folder and nothing to tell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specroute.crossing import first_top
from specroute.policies.profile import up_to
from specroute.policies.view import LiveBands
from specroute.router.workers.board import Board

POSTED_FILE = "posted-profile.json"
SERVERS_FILE = "servers.json"  # the leader's set of backends, for the other workers
ONLINE_FILE = "online-fit.json"  # the leader's last online fit (``router.online.published``)


class WorkerSync:
    def __init__(self, board: Board, folder: Path | None) -> None:
        """``folder``: the workers' folder, or ``None`` for a router of one worker."""
        self.board, self.folder = board, folder
        self._servers_seen = 0  # the board's count of published sets of backends, last seen
        self._profiles_seen = 0  # the board's count of posted profiles, likewise
        self._online_seen = 0  # the board's count of published online fits, likewise

    @property
    def alone(self) -> bool:
        return self.folder is None

    def publish_servers(self, listed: list[dict[str, Any]]) -> None:
        """The leader's set of backends, for the other workers; it has seen it itself."""
        if self.folder is None:
            return
        _write_whole(self.folder / SERVERS_FILE, json.dumps(listed), self.board.worker)
        self.board.publish_servers()
        self._servers_seen = self.board.servers_published()

    def new_servers(self) -> list[dict[str, Any]] | None:
        """The set of backends the leader published last, if this worker has not seen it."""
        published = self.board.servers_published()
        if published == self._servers_seen or self.folder is None:
            return None  # (a leader started again takes up the set it published before)
        self._servers_seen = published
        listed: list[dict[str, Any]] = json.loads((self.folder / SERVERS_FILE).read_text())
        return listed

    def post_profile(self, raw: dict[str, Any]) -> None:
        """A profile posted to this worker, for every worker to adopt (this one too, at its
        next ``new_profile``). Only with a folder: alone, a worker adopts it at once."""
        if self.folder is None:
            raise RuntimeError("a router of one worker has no folder to post a profile in")
        _write_whole(self.folder / POSTED_FILE, json.dumps(raw), self.board.worker)
        self.board.post_profile()

    def new_profile(self) -> dict[str, Any] | None:
        """The profile posted last to any worker, if this worker has not seen it."""
        posted = self.board.profiles_posted()
        if posted == self._profiles_seen or self.folder is None:
            return None
        self._profiles_seen = posted
        raw: dict[str, Any] = json.loads((self.folder / POSTED_FILE).read_text())
        return raw

    def publish_online(self, live_bands: LiveBands, fit: dict[str, Any] | None = None) -> None:
        """The leader's online fit (None: the last one stands) and the live bands it routes
        by, for the other workers; it has seen them itself. One crossover in one context
        goes on the board whole, so that it is routed by even when writing the fit fails
        (which then raises); bands, or a crossing per context, go in the fit, and the board
        says to read them there only once it is written (else: none, the profile's)."""
        if self.folder is None:
            return
        written = False
        try:
            if fit is not None:
                _write_whole(self.folder / ONLINE_FILE, json.dumps(fit), self.board.worker)
                written = True
        finally:
            self.board.publish_online(on_board(live_bands, written))
            self._online_seen = self.board.online_published()

    def new_online(self) -> bool:
        """Whether the leader published an online fit this worker has not seen (what it
        routes by is then on the board: ``Board.live_crossover``, and ``on_board``)."""
        published = self.board.online_published()
        if published == self._online_seen or self.folder is None:
            return False
        self._online_seen = published
        return True

    def online_fit(self) -> dict[str, Any] | None:
        """The leader's last online fit as it published it (None: none yet)."""
        if self.folder is None or not (self.folder / ONLINE_FILE).exists():
            return None
        fit: dict[str, Any] = json.loads((self.folder / ONLINE_FILE).read_text())
        return fit


IN_THE_FIT = -1.0  # on the board: the live bands routed by are in the fit's document


def on_board(live_bands: LiveBands, written: bool) -> float | None:
    """What the board holds of the live bands routed by: None, none; one crossover in one
    context, itself (0: speculation nowhere); else ``IN_THE_FIT`` once the fit holding them
    is ``written``, and None (the profile's) when it could not be."""
    if not live_bands:
        return None
    only = live_bands[0] if len(live_bands) == 1 else None
    if only is not None and up_to(first_top(only)) == only:
        return first_top(only)
    return IN_THE_FIT if written else None


def _write_whole(path: Path, text: str, worker: int) -> None:
    """Whole or not at all, for a worker reading it now."""
    written = path.with_suffix(f".{worker}")
    written.write_text(text)
    written.replace(path)
