"""Tiny random OWL-ViT and CLIP folders for the GenEval scoring tests, built in code (nothing from
a hub): the same CLIP byte-level BPE tokenizer as the CLIP rewards' tests (OWL-ViT's text tower
is CLIP's, with 16 positions), OWL-ViT's image processor at a tiny size."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import CLIPTokenizer, OwlViTConfig, OwlViTForObjectDetection, OwlViTImageProcessorPil

from tests.unit.rewards.tiny_clip import MERGES, vocabulary, write_clip

OWL_TEXT_POSITIONS = 16
"""OWL-ViT's text length (its folders' tokenizer model_max_length)."""


def write_owlvit(folder: Path, seed: int = 0, image_size: int = 32) -> OwlViTForObjectDetection:
    """A random ``OwlViTForObjectDetection`` with its processor saved to ``folder``."""
    n = len(vocabulary())
    config = OwlViTConfig(
        text_config={
            "vocab_size": n,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": OWL_TEXT_POSITIONS,
            "bos_token_id": n - 2,
            "eos_token_id": n - 1,
            "pad_token_id": 0,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": image_size,
            "patch_size": 8,
        },
        projection_dim=32,  # the class head compares image features with the text hidden size
    )
    torch.manual_seed(seed)
    model = OwlViTForObjectDetection(config).eval()
    model.save_pretrained(folder)
    vocab = {token: i for i, token in enumerate(vocabulary())}
    merges = [tuple(m.split(" ")) for m in MERGES]
    CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=OWL_TEXT_POSITIONS).save_pretrained(folder)
    size = {"height": image_size, "width": image_size}
    OwlViTImageProcessorPil(size=size, crop_size=size).save_pretrained(folder)
    return model


def write_models(root: Path) -> tuple[Path, Path]:
    """``root/owlvit`` and ``root/clip``: the ``--detector`` and ``--clip`` folders."""
    detector, clip = root / "owlvit", root / "clip"
    write_owlvit(detector)
    write_clip(clip)
    return detector, clip
