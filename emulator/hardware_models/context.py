"""Llama-3.1-8B on one H200 at long context, in two attention regimes: hardware models from
measured step times.

    python -m specroute.emulator.hardware_models.context sdpa \
        > emulator/hardware_models/llama3.1-8b-h200-sdpa.json
    python -m specroute.emulator.hardware_models.context folded \
        > emulator/hardware_models/llama3.1-8b-h200-folded.json

Both keep llama3.1-8b-h200 (its tables at 1,024 tokens of context, acceptance and limits)
and replace its one attention slope with a ``context`` section: step times measured at 1K
to 32K tokens of KV per request, and how the attention kernels read the cache in a verify
pass. Decode and draft times at every context are the SDPA run's in both models; the folded
run's own decode times at long context and small batch are inflated by its kernel (few
thread blocks, no split over the context), so only its verify-minus-decode gaps are used.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from specroute.emulator.hardware import Curve, load_hardware

BASE = "llama3.1-8b-h200"
CONTEXT_LEN = 1024
VERIFY_WIDTH = 4  # a chain of 3 drafts plus the bonus position

# Milliseconds per step on one NVIDIA H200 (PyTorch 2.11, CUDA 13, CUDA graphs, median of
# 20 replays), random bf16 weights of Llama-3.1-8B's shapes and of an EAGLE-3 head, at KV
# context L per request and batch B (as far as 640K KV tokens in the batch allow):
# L -> B -> (decode: 1 new token each, verify: 4 new tokens each, one draft step).
# Copied from the project's H200 measurement h200-llama3.1-8b-context-sdpa.json: attention
# is PyTorch's scaled_dot_product_attention, which reads the cache once per query token.
SDPA_MS = {
    1024: {
        1: (5.5219, 6.296, 0.2892),
        4: (6.1037, 6.7704, 0.2979),
        16: (6.7773, 8.1879, 0.3196),
        32: (7.3255, 11.4379, 0.343),
        64: (8.4523, 15.7548, 0.3933),
        128: (11.9984, 28.1271, 0.563),
    },
    4096: {
        1: (5.7038, 7.4058, 0.2899),
        4: (6.4679, 7.8645, 0.3087),
        16: (8.2027, 12.6036, 0.3911),
        32: (10.1797, 20.2473, 0.4696),
        64: (14.1277, 33.391, 0.6185),
        128: (23.2933, 63.202, 0.9673),
    },
    8192: {
        1: (5.7927, 8.8061, 0.2886),
        4: (6.8517, 9.3164, 0.3246),
        16: (10.0915, 18.4867, 0.4607),
        32: (13.9095, 32.0537, 0.6014),
        64: (21.6957, 56.9316, 0.8989),
    },
    16384: {
        1: (6.0882, 11.836, 0.3058),
        4: (7.8224, 12.3432, 0.3556),
        16: (13.935, 30.3545, 0.5946),
        32: (21.4458, 55.6319, 0.8852),
    },
    32768: {
        1: (6.5557, 17.8058, 0.3132),
        4: (9.7403, 18.2712, 0.4494),
        16: (21.3713, 53.8311, 0.8626),
    },
}
# The same, from the project's H200 measurement h200-llama3.1-8b-context-folded.json: the 4
# query tokens and the 4 query heads of each KV head folded into one query axis (as
# FlashInfer-style decode kernels do), so the cache is read once per step.
FOLDED_MS = {
    1024: {
        1: (5.8507, 6.4314, 0.2938),
        4: (6.2917, 6.9258, 0.3034),
        16: (6.8645, 7.2884, 0.3254),
        32: (7.4301, 9.506, 0.3471),
        64: (8.5636, 11.7062, 0.3953),
        128: (12.0965, 20.0695, 0.5726),
    },
    4096: {
        1: (6.9924, 7.5557, 0.3288),
        4: (7.3915, 8.0196, 0.3382),
        16: (8.3162, 8.7434, 0.3936),
        32: (10.2941, 12.3528, 0.4741),
        64: (14.2477, 17.311, 0.6218),
        128: (23.497, 31.0582, 0.9708),
    },
    8192: {
        1: (8.4604, 9.0612, 0.3721),
        4: (8.8303, 9.499, 0.3834),
        16: (10.21, 10.648, 0.4638),
        32: (14.1224, 16.1562, 0.608),
        64: (21.8018, 24.8999, 0.8909),
    },
    16384: {
        1: (11.4712, 12.0256, 0.465),
        4: (11.8032, 12.4719, 0.5001),
        16: (14.0497, 14.4771, 0.5986),
        32: (21.7401, 23.7768, 0.8801),
    },
    32768: {
        1: (17.3985, 17.9948, 0.6519),
        4: (17.7377, 18.4191, 0.6863),
        16: (21.664, 22.1096, 0.8681),
    },
}

Steps = dict[int, dict[int, tuple[float, float, float]]]


def column(steps: Steps, index: int) -> dict[str, dict[str, float]]:
    """One of decode (0), verify (1), draft (2), as the context section's L -> B table."""
    return {str(ctx): {str(b): ms[index] for b, ms in row.items()} for ctx, row in steps.items()}


def folded_gap_ms(batch: float) -> float:
    """What a folded verify of 4 tokens costs over decode at 1,024 tokens of context, by
    batch: linear between the measured batches, on the end slope beyond them."""
    gaps = {str(b): verify - decode for b, (decode, verify, _) in FOLDED_MS[CONTEXT_LEN].items()}
    return Curve.from_table(gaps, "folded gap")(batch)


def sdpa(data: dict[str, Any]) -> str:
    """Per-token reads: decode and verify each move with the context as measured. Adds the
    context section to ``data``; returns what the source says of the regime."""
    data["context"] = {
        "attention": "per_token",
        "target_ms": {"1": column(SDPA_MS, 0), str(VERIFY_WIDTH): column(SDPA_MS, 1)},
        "draft_ms": column(SDPA_MS, 2),
    }
    return (
        " The attention is PyTorch's scaled_dot_product_attention, reading the cache once"
        " per query token (per_token): verify over decode at batch 1 is 1.14x at 1K, 1.52x"
        " at 8K, 2.72x at 32K. The target, draft, extend and prefill tables at 1,024 are"
        " llama3.1-8b-h200's (measured with the same SDPA attention)."
    )


def folded(data: dict[str, Any]) -> str:
    """Shared reads: a verify moves with the context as decode does, and costs decode plus
    the folded run's gap at 1,024. Sets the verify table and the context section of
    ``data``; returns what the source says of the regime."""
    decode = data["target_ms"]["1"]
    w = VERIFY_WIDTH
    verify = {str(w * int(b)): round(ms + folded_gap_ms(int(b)), 4) for b, ms in decode.items()}
    data["target_ms"] = {"1": decode, str(w): verify}
    data["context"] = {
        "attention": "shared",
        "target_ms": {"1": column(SDPA_MS, 0)},
        "draft_ms": column(SDPA_MS, 2),
    }
    return (
        " Decode and draft steps (one query token per request) read the cache once in either"
        " kernel, so they are the SDPA run's. From the project's H200 measurement"
        " h200-llama3.1-8b-context-folded.json, the same setup with the 4 query tokens and the"
        " query heads of each KV head folded onto one read of the cache (shared): its"
        " verify-minus-decode gap stays within 0.08 ms of its 1,024 value at every context up"
        " to batch 64 (0.42-0.45 ms at batch 16 from 1K to 32K; 0.41 ms less at batch 128 and"
        " 4K), so a verify moves with the context as decode does. Its own decode times at long"
        " context and small batch are not used: the folded kernel runs few thread blocks"
        " there, with no split over the context (17.4 ms at 32K and batch 1 against SDPA's"
        " 6.6). The decode, draft, extend and prefill tables"
        " at 1,024 are llama3.1-8b-h200's; target_ms[4] is its decode table plus the folded"
        " gap at 1,024 (0.58 ms at batch 1, 0.42 at 16, 3.14 at 64, 7.97 at 128; linear in"
        " batch between them, on the last slope beyond 128); llama3.1-8b-h200's width-8 table"
        " was measured with SDPA and is left out (wider verifies read the width-4 table by"
        " tokens)."
    )


REGIMES = {"sdpa": sdpa, "folded": folded}
KERNELS = {
    "sdpa": "plain SDPA, the cache read once per query token (a verify of 4 reads it 4 times)",
    "folded": (
        "folded decode kernels as FlashInfer's, the cache read once per step for all query"
        " tokens (a verify of 4 costs decode plus a gap that does not grow with context)"
    ),
}


def model(regime: str) -> dict[str, Any]:
    data = dict(load_hardware(BASE).raw)
    del data["attention_ms_per_kv_token"]
    regime_source = REGIMES[regime](data)
    return data | {
        "name": f"{BASE}-{regime}",
        "description": (
            "Llama-3.1-8B (bf16) with an EAGLE-3 chain draft head on one NVIDIA H200, step"
            " times measured at 1K-32K tokens of context per request; attention by"
            f" {KERNELS[regime]}."
        ),
        "source": MEASURED + regime_source + ASSUMED,
    }


MEASURED = (
    "Generated by emulator/hardware_models/context.py from llama3.1-8b-h200 and the project's H200"
    " measurement h200-llama3.1-8b-context-sdpa.json: decode, verify of 4 and one draft"
    " step at 1,024, 4,096, 8,192, 16,384 and 32,768 tokens of KV per request, batches 1"
    " to 128 as far as 640K KV tokens allow (one H200, PyTorch 2.11, CUDA 13, CUDA graphs,"
    " median of 20 replays, random bf16 weights of Llama-3.1-8B's shapes and of an EAGLE-3"
    " head). context.target_ms[w][L][B] and context.draft_ms[L][B] are those measured step"
    " times; a step adds their difference between the batch's mean context per request"
    " and 1,024 (linear in the context between measured ones and on the end slopes beyond,"
    " linear in batch on the last slope past the largest measured one) to the tables at"
    " 1,024."
)
ASSUMED = (
    " Not measured, assumed: the draft's extend reads the cache as the verify does (once per"
    " step when shared, once per query token when per_token, each read priced as a draft"
    " step's); cuda_graph_max_bs, eager_factor, max_running_requests and the accept length,"
    " as in llama3.1-8b-h200."
)


def main() -> None:
    regime = sys.argv[1] if len(sys.argv) == 2 else ""
    if regime not in REGIMES:
        raise SystemExit(
            f"usage: python -m specroute.emulator.hardware_models.context {'|'.join(REGIMES)}"
        )
    print(json.dumps(model(regime), indent=1))


if __name__ == "__main__":
    main()
