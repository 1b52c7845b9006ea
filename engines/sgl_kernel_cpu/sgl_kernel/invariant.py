"""Linear layers whose every row is computed as if it were alone: what makes a speculative
server's greedy tokens the plain server's, bit for bit.

A verify step runs the layers on a request's draft tokens together, where the plain
server's decode step runs them on one token; oneDNN's bf16 matrix product rounds a row
differently with the rows beside it (it is not batch invariant: about half of random
inputs, for a 2048-wide reduction). The random model's logits are near ties, so one
rounding apart is enough to change a greedy token. Row by row (for up to
``ROWS_AT_MOST`` rows: decode and verify batches; a prompt's prefill is the same on both
servers) every row goes through the same single-row product. This costs a verify step and
a batched decode step their sharing of the weights' reads, so it is a switch
(``SPECROUTE_BATCH_INVARIANT=1``), on for the stage that compares tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch  # type: ignore[import-not-found]
import torch.nn.functional as F  # type: ignore[import-not-found]
from torch import Tensor

ROWS_AT_MOST = 64
Linear = Callable[..., Tensor]


def row_by_row(linear: Linear) -> Linear:
    def invariant(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if x.dim() != 2 or not 1 < x.shape[0] <= ROWS_AT_MOST:
            return linear(x, weight, bias)
        return torch.cat([linear(x[i : i + 1], weight, bias) for i in range(x.shape[0])])

    return invariant


def install() -> None:
    """SGLang's linear layers call ``torch.nn.functional.linear`` by attribute at each call."""
    F.linear = row_by_row(F.linear)
