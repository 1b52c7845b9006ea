"""Make a small Llama-style model for vLLM on a CPU, with nothing downloaded: a byte-level
BPE tokenizer trained on local text (this project's licence and Python's own standard
library sources) and random weights saved in safetensors.

Runs in the engine's environment (``.venv-vllm``), which has ``torch``, ``tokenizers`` and
``transformers``; ``python -m specroute.engines.vllm_cpu model`` calls it there as a script,
so it imports nothing of specroute. The weights are random, but seeded: a greedy model
always says the same, and what it says repeats itself, which n-gram speculation drafts from.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

_VOCAB = 8192
_HEAD_DIM = 64  # vLLM's CPU attention crashed with 16
_SPECIALS = ["<s>", "</s>", "<unk>"]
_STDLIB_FILES = 400


def corpus(text: Path) -> list[str]:
    """``text`` and the first standard library sources in name order: the same text on
    every machine with the same Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [text, *sorted(stdlib.glob("*.py"))[:_STDLIB_FILES]]
    return [f.read_text(errors="replace") for f in files if f.is_file()]


def make_tokenizer(texts: list[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found]
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    # A chat template, so /v1/chat/completions works too.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(out)


def make_model(out: Path, hidden: int, layers: int, intermediate: int, seed: int) -> int:
    import torch  # type: ignore[import-not-found]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=_VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // _HEAD_DIM,
        num_key_value_heads=hidden // _HEAD_DIM,
        head_dim=_HEAD_DIM,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--intermediate", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.hidden % _HEAD_DIM:
        sys.exit(f"--hidden {args.hidden}: must be a multiple of the head size {_HEAD_DIM}")
    args.out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(corpus(args.text), args.out)
    params = make_model(args.out, args.hidden, args.layers, args.intermediate, args.seed)
    shape = {k: getattr(args, k) for k in ("hidden", "layers", "intermediate", "seed")}
    (args.out / "specroute-model.json").write_text(json.dumps({**shape, "parameters": params}))
    print(f"{args.out}: {params / 1e6:.0f}M parameters, {shape}")


if __name__ == "__main__":
    main()
