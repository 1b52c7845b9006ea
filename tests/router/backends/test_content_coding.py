"""A body decoded by its ``Content-Encoding``, as the metrics poller reads SGLang's gzipped
``/metrics``."""

from __future__ import annotations

import gzip
import zlib

import pytest

from specroute.router.protocol.content_coding import decoded

TEXT = b'sglang:num_running_reqs{model_name="m"} 3.0\n'


@pytest.mark.parametrize(
    ("body", "coding"),
    [
        (TEXT, "identity"),
        (TEXT, ""),
        (gzip.compress(TEXT), "gzip"),
        (gzip.compress(TEXT), "GZip"),
        (gzip.compress(TEXT), "x-gzip"),
        (zlib.compress(TEXT), "deflate"),
        (gzip.compress(zlib.compress(TEXT)), "deflate, gzip"),  # the last applied first
        (gzip.compress(TEXT), "identity, gzip"),
    ],
    ids=["identity", "none", "gzip", "any case", "x-gzip", "deflate", "two", "with identity"],
)
def test_known_codings_are_undone(body: bytes, coding: str) -> None:
    assert decoded(body, coding) == TEXT


@pytest.mark.parametrize(
    ("body", "coding", "said"),
    [
        (TEXT, "br", "content coding 'br' is not read here"),
        (TEXT, "gzip", "said to be gzip does not decode"),
        (gzip.compress(TEXT)[:-6], "gzip", "does not decode"),
    ],
    ids=["unknown coding", "not gzip at all", "cut short"],
)
def test_what_cannot_be_decoded_says_why(body: bytes, coding: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        decoded(body, coding)
