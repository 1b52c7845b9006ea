"""The real-engine stages' time: the 25 minutes they may add to a test run, between them, and
a share each when a stage runs alone.

``make real-engine`` says when the stages began (``SPECROUTE_REAL_ENGINE_SINCE``, seconds since
the epoch); a stage run that way is held to what is left of the 25 minutes as well as to its
own share, so a slow machine may give one stage more when the other took less.
"""

from __future__ import annotations

import os
import time

SHARED_SECONDS = 1500.0
SINCE = "SPECROUTE_REAL_ENGINE_SINCE"


def hold(stage: str, started: float, share: float) -> None:
    """Fail the stage past its share (``started`` a monotonic reading at its start) or past the
    stages' 25 minutes together; print what it took either way."""
    elapsed = time.monotonic() - started
    print(f"\n{stage} real-engine stage: {elapsed:.0f} s")
    assert elapsed < share, f"the {stage} stage took {elapsed:.0f} s, over {share:g}"
    since = os.environ.get(SINCE)
    if since:
        together = time.time() - float(since)
        print(f"the real-engine stages so far: {together:.0f} s")
        assert together < SHARED_SECONDS, (
            f"the real-engine stages took {together:.0f} s, over {SHARED_SECONDS:g}"
        )
