"""The SGLang plugin (entry point ``sglang.srt.plugins``, loaded by every SGLang process)
that lets the ``intel_amx`` attention backend run on a CPU without AMX, and, when asked,
makes the linear layers batch invariant (``invariant.py``).

SGLang replaces that backend by ``torch_native`` when the CPU has no AMX tiles, and its
speculative workers do not run on ``torch_native``. The backend's attention ops here are
PyTorch and need no AMX, so the platform is said to have it; the layers still take
PyTorch's own paths, since they ask the hardware (and for ``convert_weight_packed``,
which this package does not have) rather than the platform.
"""

from __future__ import annotations

import os

BATCH_INVARIANT = "SPECROUTE_BATCH_INVARIANT"


def register() -> None:
    from sglang.srt.runtime_context import override_platform  # type: ignore[import-not-found]

    override_platform(has_amx=True).install()
    if os.environ.get(BATCH_INVARIANT) == "1":
        from .invariant import install

        install()
