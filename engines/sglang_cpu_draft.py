"""Make an EAGLE-3 draft for the local target model (``vllm_cpu_model.py``'s), with random
weights and nothing downloaded: one decoder layer over the target's vocabulary, in the
layout SGLang's ``LlamaForCausalLMEagle3`` loads.

Runs in the engine's environment (``.venv-sglang-cpu``), which has ``torch`` and
``safetensors``; ``python -m specroute.engines.sglang_cpu model`` calls it there as a
script, so it imports nothing of specroute. Its drafts are mostly rejected (its weights
are random): what it exercises is SGLang's whole EAGLE-3 path, not a speedup.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def aux_layers(layers: int) -> list[int]:
    """Three target layers whose outputs the draft reads: early, middle, late. A target
    of few layers needs them said (SGLang's default assumes a deep one)."""
    return sorted({min(1, layers - 1), layers // 2, max(0, layers - 2)})


def draft_config(target: dict[str, object]) -> dict[str, object]:
    layers = int(str(target["num_hidden_layers"]))
    picked = aux_layers(layers)
    return {
        **target,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": target["vocab_size"],
        "num_aux_hidden_states": len(picked),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": picked},
    }


def make_weights(config: dict[str, object], seed: int) -> dict[str, object]:
    import torch  # type: ignore[import-not-found]

    torch.manual_seed(seed)
    hidden = int(str(config["hidden_size"]))
    inter = int(str(config["intermediate_size"]))
    vocab = int(str(config["vocab_size"]))
    heads = int(str(config["num_attention_heads"]))
    kv_heads = int(str(config["num_key_value_heads"]))
    head_dim = int(str(config.get("head_dim") or hidden // heads))
    aux = int(str(config["num_aux_hidden_states"]))
    shapes = {
        "fc.weight": (hidden, hidden * aux),
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
    }
    weights = {name: torch.randn(shape) * 0.02 for name, shape in shapes.items()}
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        weights[f"midlayer.{norm}.weight"] = torch.ones(hidden)
    weights["norm.weight"] = torch.ones(hidden)
    return {name: w.to(torch.bfloat16).contiguous() for name, w in weights.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path, required=True, help="the target model's folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from safetensors.torch import save_file  # type: ignore[import-not-found]

    config = draft_config(json.loads((args.target / "config.json").read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(make_weights(config, args.seed), str(args.out / "model.safetensors"))
    for name in _TOKENIZER_FILES:
        if (args.target / name).exists():
            shutil.copy(args.target / name, args.out / name)
    print(f"{args.out}: EAGLE-3 draft, aux layers {config['eagle_config']}")


if __name__ == "__main__":
    main()
