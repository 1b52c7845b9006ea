"""Which server holds each stored response that a worker has found (``stored_responses``):
the most recent ``size``, so that the next turn of a conversation goes straight there."""

from __future__ import annotations

from collections import OrderedDict

SIZE = 4096


class Owners:
    """Which server holds each response this worker found, the most recent first."""

    def __init__(self, size: int = SIZE) -> None:
        self._held: OrderedDict[str, str] = OrderedDict()  # response id: backend name
        self._size = size

    def get(self, response_id: str) -> str | None:
        name = self._held.get(response_id)
        if name is not None:
            self._held.move_to_end(response_id)
        return name

    def put(self, response_id: str, backend: str) -> None:
        self._held[response_id] = backend
        self._held.move_to_end(response_id)
        while len(self._held) > self._size:
            self._held.popitem(last=False)
