"""What ``model.encode_once`` frees on real-size models, and what the cached embeddings cost instead.

    python benchmarks/encode_once.py [--prompts 1000]

Each family's text encoders are built on the meta device (no weights, nothing downloaded) from
their published hyperparameters, through the transformers classes the families load, and their
bytes counted in bfloat16 (what a GPU engine holds them in). Against them: one prompt's cached
conditioning, as the family's ``_encode_prompts`` returns it (every prompt padded to the family's
default ``max_sequence_length``), in bfloat16, and the cache for ``--prompts`` prompts; the
break-even is the number of prompts whose cache weighs as much as the encoders. Writes
``docs/results/encode_once.json``.

Hyperparameters: CLIP ViT-L/14 and OpenCLIP ViT-bigG/14 text towers (SD3/FLUX ``text_encoder``,
``text_encoder_2``), T5 v1.1 XXL's encoder (``text_encoder_3`` of SD3.5, ``text_encoder_2`` of
FLUX.1), umT5-XXL's encoder (Wan 2.x: vocab 256384, d_model 4096, d_ff 10240, 64 heads, 24 layers, as
Wan's own config), Gemma 3 12B's text tower (LTX-2: 48 layers, width 3840, 16 query / 8 key-value
heads of 256, MLP 15360, vocab 262208).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import (
    CLIPTextConfig,
    CLIPTextModelWithProjection,
    Gemma3TextConfig,
    Gemma3TextModel,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

BF16 = 2


def clip_l():
    return CLIPTextModelWithProjection(
        CLIPTextConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            projection_dim=768,
        )
    )


def clip_g():
    return CLIPTextModelWithProjection(
        CLIPTextConfig(
            hidden_size=1280,
            intermediate_size=5120,
            num_hidden_layers=32,
            num_attention_heads=20,
            projection_dim=1280,
        )
    )


def t5_xxl():
    return T5EncoderModel(
        T5Config(
            vocab_size=32128,
            d_model=4096,
            d_kv=64,
            d_ff=10240,
            num_layers=24,
            num_heads=64,
            feed_forward_proj="gated-gelu",
        )
    )


def umt5_xxl():
    return UMT5EncoderModel(
        UMT5Config(
            vocab_size=256384,
            d_model=4096,
            d_kv=64,
            d_ff=10240,
            num_layers=24,
            num_heads=64,
            feed_forward_proj="gated-gelu",
        )
    )


def gemma3_12b():
    return Gemma3TextModel(
        Gemma3TextConfig(
            vocab_size=262208,
            hidden_size=3840,
            intermediate_size=15360,
            num_hidden_layers=48,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
        )
    )


MODELS = {
    # name: (encoders, one prompt's conditioning tensors' shapes; None: not counted here)
    "SD3.5 (M and L)": ([clip_l, clip_g, t5_xxl], [(77 + 256, 4096), (768 + 1280,)]),
    "FLUX.1-dev": ([clip_l, t5_xxl], [(512, 4096), (768,)]),
    "Wan 2.2 A14B": ([umt5_xxl], [(512, 4096)]),
    "LTX-2": ([gemma3_12b], None),
}


def encoder_bytes(makers) -> int:
    total = 0
    for make in makers:
        with torch.device("meta"):
            module = make()
        total += sum(p.numel() for p in module.parameters()) * BF16
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=1000)
    args = ap.parse_args()
    rows = []
    print(
        f"| model | text encoders (bf16) | one prompt cached | {args.prompts} prompts cached | break-even prompts |"
    )
    print("|---|---|---|---|---|")
    for name, (makers, shapes) in MODELS.items():
        enc = encoder_bytes(makers)
        per = sum(int(torch.tensor(s).prod()) for s in shapes) * BF16 if shapes else None
        rows.append({"model": name, "encoder_bytes": enc, "prompt_bytes": per})
        if per is None:
            print(f"| {name} | {enc / 2**30:.2f} GiB | - | - | - |")
        else:
            print(
                f"| {name} | {enc / 2**30:.2f} GiB | {per / 2**20:.2f} MiB | {args.prompts * per / 2**30:.2f} GiB "
                f"| {enc // per:,} |"
            )
    path = Path("docs/results/encode_once.json")
    path.write_text(json.dumps({"prompts": args.prompts, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
