"""The SGLang plugin (entry point ``sglang.srt.plugins``) that lets the ``intel_amx``
attention backend run on a CPU without AMX.

SGLang replaces that backend by ``torch_native`` when the CPU has no AMX tiles, and its
speculative workers do not run on ``torch_native``. The backend's attention ops here are
PyTorch and need no AMX, so the launching process says the platform has it; the layers
still take PyTorch's own paths, since they ask the hardware (and for
``convert_weight_packed``, which this package does not have) rather than the platform.
"""

from __future__ import annotations


def register() -> None:
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
