"""Kimi-K2.5 on 8 RTX PRO 6000 Blackwell over PCIe: a hardware model built from physics.

    python -m specroute.emulator.hardware_models.kimi \
        > emulator/hardware_models/kimi-k2.5-8x-pcie.json

A target forward over T tokens (B requests of w new tokens each) costs the sum of:
- the MoE experts: the measured curve of one Kimi-K2-shaped MoE layer on an H200 (bf16,
  grouped GEMM over the experts that got tokens), scaled to int4 routed experts, 8-way
  tensor parallelism and the RTX PRO 6000's memory bandwidth; with a compute roofline;
- the dense weights (MLA projections, the dense first layer, the shared expert's bf16
  remainder, the LM head), read once per step, with a compute roofline;
- ring all-reduces over PCIe Gen5 (two per layer) and the logits' all-gather;
- MLA attention: the compressed KV cache read once per request per step;
- a fixed term, solved.
The draft (an EAGLE-3 head, tensor-parallel on the same GPUs) costs its weights, its three
collectives and its attention, plus a fixed term per forward, solved. The two solved
constants make batch 1 reproduce the case study's 90.0 tok/s plain and 82.3 tok/s with a chain of
3 drafts at accept length 2.1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specroute.emulator.hardware import SCHEMA, Curve
from specroute.emulator.hardware_models.memory_facts import RTX_PRO_6000_GIB, kimi_k2_5

# One MoE FFN layer of Kimi-K2's shape on one NVIDIA H200 (384 routed experts of FFN 2,048
# at hidden 7,168, top-8, one shared expert, router logits; bf16; torch._grouped_mm in CUDA
# graphs, median of 20 replays, uniform random routing): ms against tokens in the pass.
# Copied from the project's measurement h200-kimi-k2-moe-layer.json.
H200_MOE_LAYER_MS = {
    1: 0.3699,
    2: 0.6422,
    3: 0.8487,
    4: 1.115,
    6: 1.543,
    8: 1.8983,
    12: 2.6444,
    16: 3.2819,
    24: 4.3454,
    32: 5.4706,
    48: 6.7029,
    64: 7.6185,
    96: 8.7955,
    128: 9.8238,
    192: 10.3028,
    256: 10.3547,
    384: 10.3175,
    512: 10.4133,
    768: 10.4626,
    1024: 10.5097,
    2048: 10.7728,
}

# Kimi-K2's shape (moonshotai/Kimi-K2-Instruct config.json; Kimi-K2.5 keeps it).
LAYERS = 61
DENSE_LAYERS = 1  # first_k_dense_replace: layer 0 has a dense MLP, the other 60 are MoE
MOE_LAYERS = LAYERS - DENSE_LAYERS
HIDDEN = 7168
DENSE_FFN = 18432
EXPERT_FFN = 2048
TOP_K = 8
SHARED_EXPERTS = 1
HEADS = 64
Q_LORA_RANK = 1536
KV_LORA_RANK = 512
QK_NOPE_DIM = 128
QK_ROPE_DIM = 64
V_HEAD_DIM = 128
VOCAB = 163840

# The deployment: 8 RTX PRO 6000 Blackwell, tensor parallel, PCIe Gen5 x16, no NVLink.
TP = 8
H200_BW_NOMINAL = 4.8e12  # bytes/s, NVIDIA H200 datasheet (HBM3e)
H200_BW_ACHIEVED = 3.3e12  # the layer measurement's own figure: 33.8 GB read in ~10.3 ms
RTX_BW_NOMINAL = 1.792e12  # NVIDIA RTX PRO 6000 Blackwell datasheet: GDDR7, 512-bit, 28 Gbps
# Assumed: the RTX card reaches the same share of its nominal bandwidth as the H200 did.
RTX_BW = RTX_BW_NOMINAL * H200_BW_ACHIEVED / H200_BW_NOMINAL
RTX_BF16_FLOPS = 503.8e12  # dense bf16 tensor, FP32 accumulate (RTX Blackwell whitepaper)
COMPUTE_EFFICIENCY = 0.6  # assumed share of peak a grouped or dense GEMM reaches
RTX_FLOPS = RTX_BF16_FLOPS * COMPUTE_EFFICIENCY
# Kimi-K2.5 ships its routed experts as int4 (compressed-tensors pack-quantized, one bf16
# scale per group of 32 weights): 4.5 bits for 16. Attention, the shared expert, the dense
# layer and the LM head stay bf16.
EXPERT_WEIGHT_FRACTION = (4 + 16 / 32) / 16
BF16 = 2  # bytes

# PCIe Gen5 x16 carries 32 GT/s x 16 lanes with 128b/130b coding: ~63 GB/s each way. Eight
# GB202 cards on PCIe Gen5 measured 28 GB/s of all-reduce bus bandwidth with nccl-tests
# (NVIDIA/nccl issue #1639, 8x RTX 5090, the RTX PRO 6000's chip and interface).
BUS_BW = 28e9
# Time of the smallest all-reduce on 8 PCIe GPUs in nccl-tests: 40-42 us (NVIDIA/nccl issue
# #1530, 8x RTX 4090 over PCIe). Only the constant part of a step depends on it, and the
# solved fixed terms absorb any error in it.
COLLECTIVE_LATENCY_MS = 0.040
ALL_REDUCES = 2 * LAYERS  # after attention and after the FFN, in every layer
RING = 2 * (TP - 1) / TP  # share of a message each GPU sends and receives in a ring all-reduce
GATHER = (TP - 1) / TP  # likewise for an all-gather

# MLA: each token keeps a compressed KV latent of 512 plus a 64-wide rotary key, bf16, in
# every layer; tensor parallelism splits the heads, not the one latent, so every GPU reads
# it all. Decode and verify kernels fold the w query tokens of a request onto one read.
MLA_KV_BYTES = (KV_LORA_RANK + QK_ROPE_DIM) * BF16 * LAYERS
CONTEXT_LEN = 1024  # KV tokens per request the tables are taken at

# The draft: an EAGLE-3 head of the usual shape at Kimi's width (assumed; the case study does not
# give it): one decoder layer whose attention reads [embedding, hidden] (2 x hidden), 64
# query and 8 KV heads of 128, a dense FFN of 18,432, an fc fusing three target hidden
# states (extend only), a 32,000-token draft vocabulary; tensor-parallel 8 ways.
DRAFT_HEADS, DRAFT_KV_HEADS, HEAD_DIM = 64, 8, 128
DRAFT_VOCAB = 32000
DRAFT_COLLECTIVES = 3  # two all-reduces in the layer, the logits' all-gather


def _attention_params() -> tuple[int, int]:
    """(replicated, split) weights of one MLA layer: the down-projections to the q and kv
    latents are replicated on every GPU, the rest split by heads."""
    replicated = HIDDEN * Q_LORA_RANK + HIDDEN * (KV_LORA_RANK + QK_ROPE_DIM)
    split = (
        Q_LORA_RANK * HEADS * (QK_NOPE_DIM + QK_ROPE_DIM)
        + KV_LORA_RANK * HEADS * (QK_NOPE_DIM + V_HEAD_DIM)
        + HEADS * V_HEAD_DIM * HIDDEN
    )
    return replicated, split


EXPERT_PARAMS = 3 * HIDDEN * EXPERT_FFN
_REPLICATED, _SPLIT = _attention_params()
# weights one GPU reads in every step, bf16, besides the routed experts
DENSE_PARAMS_PER_GPU = (
    LAYERS * _REPLICATED
    + (LAYERS * _SPLIT + DENSE_LAYERS * 3 * HIDDEN * DENSE_FFN + VOCAB * HIDDEN) / TP
)
# the measured curve counts the bf16 shared expert; scaled as int4 with the routed ones,
# the rest of its bytes are put back here
SHARED_REMAINDER_BYTES = MOE_LAYERS * EXPERT_PARAMS * BF16 * (1 - EXPERT_WEIGHT_FRACTION) / TP
DRAFT_LAYER_PARAMS = (
    2 * HIDDEN * (DRAFT_HEADS + 2 * DRAFT_KV_HEADS) * HEAD_DIM
    + DRAFT_HEADS * HEAD_DIM * HIDDEN
    + 3 * HIDDEN * DENSE_FFN
    + HIDDEN * DRAFT_VOCAB
)
DRAFT_FC_PARAMS = 3 * HIDDEN * HIDDEN
DRAFT_KV_BYTES = 2 * DRAFT_KV_HEADS * HEAD_DIM * BF16 / TP  # per token, one GPU

_LAYER = Curve.from_table(H200_MOE_LAYER_MS, "H200_MOE_LAYER_MS")
_EXPERT_SCALE = EXPERT_WEIGHT_FRACTION / TP * H200_BW_NOMINAL / RTX_BW_NOMINAL

CASE_BASE_TOK_S = 90.0  # the Kimi-K2.5 case study: SGLang, no speculation, one stream
CASE_SPEC_TOK_S = (
    82.3  # the Kimi-K2.5 case study: SGLang + EAGLE-3 (10K-sample drafter), one stream
)
CASE_ACCEPT_LENGTH = 2.1
STEPS = 3  # a chain of 3 drafts: verify width 4
# the default accept length and the code rule: kimi-k2.5-8x-pcie-fitted's, the model this
# one replaced as the Kimi-K2.5 case study's model
CODE_PATTERN = r"```|\bdef |\bclass |\bimport |#include|\bfunction\b|\breturn\b"

BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8)
PREFILL_TOKENS = (1, 128, 256, 512, 1024, 2048, 4096, 8192)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def collective_ms(message_bytes: float, share: float) -> float:
    return COLLECTIVE_LATENCY_MS + _ms(share * message_bytes / BUS_BW)


def experts_ms(tokens: float) -> float:
    """The routed and shared experts of every MoE layer: the measured H200 curve scaled by
    bytes (int4, one eighth per GPU, the RTX's bandwidth), or their FLOPs if more: int4
    weights are widened to bf16 for the multiply, so compute does not shrink with them."""
    memory = MOE_LAYERS * _LAYER(tokens) * _EXPERT_SCALE
    flops = tokens * 2 * (TOP_K + SHARED_EXPERTS) * EXPERT_PARAMS * MOE_LAYERS / TP
    return max(memory, _ms(flops / RTX_FLOPS))


def dense_ms(tokens: float) -> float:
    memory = _ms((DENSE_PARAMS_PER_GPU * BF16 + SHARED_REMAINDER_BYTES) / RTX_BW)
    return max(memory, _ms(tokens * 2 * DENSE_PARAMS_PER_GPU / RTX_FLOPS))


def communication_ms(tokens: float) -> float:
    reduces = ALL_REDUCES * collective_ms(tokens * HIDDEN * BF16, RING)
    return reduces + collective_ms(tokens * VOCAB * BF16, GATHER)


ATTENTION_MS_PER_KV_TOKEN = _ms(MLA_KV_BYTES / RTX_BW)


def target_physics_ms(tokens: float, requests: float) -> float:
    """A target forward without its fixed term, at CONTEXT_LEN of KV per request."""
    attention = ATTENTION_MS_PER_KV_TOKEN * requests * CONTEXT_LEN
    return experts_ms(tokens) + dense_ms(tokens) + communication_ms(tokens) + attention


def prefill_physics_ms(tokens: float) -> float:
    """One prompt of ``tokens``: the same weights and collectives, and causal attention in
    compute (an upper bound when the pass holds several shorter prompts)."""
    per_pair = 2 * (QK_NOPE_DIM + QK_ROPE_DIM + V_HEAD_DIM) * HEADS / TP * LAYERS
    attention = _ms(tokens * tokens / 2 * per_pair / RTX_FLOPS)
    return experts_ms(tokens) + dense_ms(tokens) + communication_ms(tokens) + attention


def draft_physics_ms(tokens: float, requests: float, extend: bool) -> float:
    """One forward of the draft head without its fixed term."""
    params = (DRAFT_LAYER_PARAMS + (DRAFT_FC_PARAMS if extend else 0)) / TP
    matmul = max(_ms(params * BF16 / RTX_BW), _ms(tokens * 2 * params / RTX_FLOPS))
    reduces = 2 * collective_ms(tokens * HIDDEN * BF16, RING)
    gather = collective_ms(tokens * DRAFT_VOCAB * BF16, GATHER)
    attention = _ms(requests * CONTEXT_LEN * DRAFT_KV_BYTES / RTX_BW)
    return matmul + reduces + gather + attention


@dataclass(frozen=True)
class Solved:
    target_fixed_ms: float  # every target forward: launches, norms, sampling, scheduling
    draft_fixed_ms: float  # every draft forward (3 draft steps and 1 extend per verify)


def solve() -> Solved:
    """Batch 1 at CONTEXT_LEN: a plain step is 1 / 90.0 s; a speculative step (3 drafts,
    a verify of 4, a draft extend of 4) yields 2.1 tokens at 82.3 tok/s."""
    fixed = 1000.0 / CASE_BASE_TOK_S - target_physics_ms(1, 1)
    spec_step = 1000.0 * CASE_ACCEPT_LENGTH / CASE_SPEC_TOK_S
    width = STEPS + 1
    known = (
        fixed
        + target_physics_ms(width, 1)
        + STEPS * draft_physics_ms(1, 1, extend=False)
        + draft_physics_ms(width, 1, extend=True)
    )
    return Solved(fixed, (spec_step - known) / (STEPS + 1))


def _round(ms: float) -> float:
    return round(ms, 4)


def model() -> dict[str, object]:
    solved = solve()
    target = {
        str(w): {
            str(w * b): _round(solved.target_fixed_ms + target_physics_ms(w * b, b))
            for b in BATCHES
        }
        for w in WIDTHS
    }
    draft = {
        str(b): _round(solved.draft_fixed_ms + draft_physics_ms(b, b, extend=False))
        for b in BATCHES
    }
    width = STEPS + 1
    extend = {
        str(width * b): _round(solved.draft_fixed_ms + draft_physics_ms(width * b, b, extend=True))
        for b in BATCHES
    }
    prefill = {
        str(t): _round(solved.target_fixed_ms + prefill_physics_ms(t)) for t in PREFILL_TOKENS
    }
    return {
        "schema": SCHEMA,
        "name": "kimi-k2.5-8x-pcie",
        "model_path": "moonshotai/Kimi-K2.5",
        "draft_model_path": "kimi-k2.5-eagle3",
        "tp_size": TP,
        "memory": kimi_k2_5(RTX_PRO_6000_GIB, TP),
        "description": (
            "Kimi-K2.5 (1T MoE, ~32B active, int4 routed experts) with tensor parallelism"
            " over 8 RTX PRO 6000 Blackwell on PCIe Gen5, EAGLE-3 chain of 3 drafts, in"
            " SGLang; step times built from the measured MoE layer curve and stated physics."
        ),
        "source": _source(solved),
        "target_ms": target,
        "draft_ms": draft,
        "draft_extend_ms": extend,
        "prefill_ms": prefill,
        "context_len": CONTEXT_LEN,
        "attention_ms_per_kv_token": float(f"{ATTENTION_MS_PER_KV_TOKEN:.4g}"),
        "cuda_graph_max_bs": 128,
        "eager_factor": 1.3,
        "max_running_requests": 512,
        "speculative_num_steps": STEPS,
        "acceptance": {
            "accept_length": 3.0,
            "rules": [
                {
                    "name": "code",
                    "pattern": CODE_PATTERN,
                    "accept_length": 3.4,
                }
            ],
        },
        "calibration": [
            {
                "mode": "base",
                "concurrency": 1,
                "value": CASE_BASE_TOK_S,
                "source": "the Kimi-K2.5 case study: SGLang without speculation, one stream",
            },
            {
                "mode": "spec",
                "concurrency": 1,
                "accept_length": CASE_ACCEPT_LENGTH,
                "value": CASE_SPEC_TOK_S,
                "source": (
                    "the Kimi-K2.5 case study: SGLang + EAGLE-3 (10K-sample drafter), one stream"
                ),
            },
        ],
    }


def _source(solved: Solved) -> str:
    return (
        "Generated by emulator/hardware_models/kimi.py. Measured: one MoE layer of Kimi-K2's"
        " shape on an H200 (bf16, grouped GEMM over the experts that got tokens, uniform random"
        " routing): 0.37 ms at 1 token, 1.12 at 4, 3.28 at 16, 7.62 at 64, 10.3-10.8 from 192"
        " to 2,048 tokens; and the case study's two single-stream figures on the deployment (90.0"
        " tok/s plain, 82.3 with EAGLE-3 at accept length 2.1). Assumed, with sources:"
        f" experts = {MOE_LAYERS} MoE layers x the H200 curve x {EXPERT_WEIGHT_FRACTION:.4g}"
        " (int4 routed experts with a bf16 scale per 32 weights, Kimi-K2.5's"
        " quantization_config) / 8 (tensor parallel: each GPU reads an eighth of every"
        " touched expert) x 4.8/1.792 (H200 HBM3e 4.8 TB/s vs RTX PRO 6000 Blackwell GDDR7"
        " 1.792 TB/s, NVIDIA datasheets; the same achieved share, 3.3/4.8, on both), or their"
        " FLOPs at 60% of 503.8 bf16 TFLOPS if more (int4 is widened to bf16 to multiply, so"
        " compute is not divided by 4; it binds only in passes of thousands of tokens);"
        " the dense weights (MLA projections with the q and kv down-projections replicated"
        " on every GPU, the dense first layer, the LM head, the shared expert's bf16"
        f" remainder) read once per step: {dense_ms(1):.2f} ms, or their FLOPs if more (past"
        f" ~280 tokens); {ALL_REDUCES} ring all-reduces of T x 7,168 x 2 bytes plus"
        " the logits' all-gather, each 40 us (nccl-tests' smallest all-reduce on 8 PCIe"
        " GPUs, NVIDIA/nccl #1530) + bytes moved (2(n-1)/n of the message) / 28 GB/s (bus"
        " bandwidth measured on 8 GB202 cards over PCIe Gen5 x16, whose link is 63 GB/s each"
        " way, NVIDIA/nccl #1639); MLA attention reads the 576-wide bf16 latent of every KV"
        f" token in all {LAYERS} layers once per request per step, on every GPU:"
        f" {ATTENTION_MS_PER_KV_TOKEN:.3g} ms per KV token; the draft is an EAGLE-3 head of the"
        " usual shape (one layer, FFN 18,432, 32k draft vocabulary) tensor-parallel over the"
        " same links with 3 collectives per forward; prefill pays the same terms over the"
        " prompt's tokens and causal attention in compute. Solved so that batch 1 at 1,024"
        " tokens of context reproduces the Kimi-K2.5 case study: a fixed"
        f" {solved.target_fixed_ms:.3f} ms per target forward and"
        f" {solved.draft_fixed_ms:.3f} ms per draft forward (3 draft steps and 1 extend per"
        " verify: what the case study's speculative step costs beyond the physics named"
        " here). Not modelled: skewed routing (real routers touch fewer experts than"
        " uniform), overlap of communication with compute. cuda_graph_max_bs, eager_factor,"
        " max_running_requests and the default accept length are assumed, as in"
        " kimi-k2.5-8x-pcie-fitted (the model this one replaced as the Kimi-K2.5 case study's"
        " model)."
    )


def main() -> None:
    print(json.dumps(model(), indent=1))


if __name__ == "__main__":
    main()
