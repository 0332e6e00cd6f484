"""A tiny LAION CLAP folder built in code (nothing from a hub): a random ``ClapModel`` (RoBERTa text
tower, HTSAT audio tower) with the ``ClapProcessor`` files the Hub folders ship: a byte-level BPE
RoBERTa tokenizer and a ``ClapFeatureExtractor`` config (48 kHz, as LAION's; fewer mel bins and a
1 s window to stay small)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer

from tests.unit.rewards.tiny_clip import _byte_alphabet

MERGES = ["Ġ t", "Ġt h", "Ġth e", "d o", "Ġ do", "Ġdo g"]
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MEL_BINS = 16
MAX_SECONDS = 1


def write_tokenizer(folder: Path) -> RobertaTokenizer:
    tokens = SPECIAL + _byte_alphabet() + [m.replace(" ", "") for m in MERGES]
    tokenizer = RobertaTokenizer(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[tuple(m.split(" ")) for m in MERGES],
        model_max_length=64,
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_clap(folder: Path, seed: int = 0, fused: bool = False) -> ClapModel:
    """Save a random ``ClapModel`` + tokenizer + feature extractor to ``folder``; return the model.
    ``fused``: as ``laion/clap-htsat-fused`` (``enable_fusion``, the extractor's ``fusion``
    truncation), else as ``laion/clap-htsat-unfused``."""
    torch.manual_seed(seed)
    tokenizer = write_tokenizer(folder)
    config = ClapConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=70,
            type_vocab_size=1,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        audio_config=dict(
            spec_size=64,
            num_mel_bins=MEL_BINS,
            window_size=4,
            depths=[1, 1],
            num_attention_heads=[2, 2],
            patch_embeds_hidden_size=16,
            hidden_size=32,
            enable_fusion=fused,
        ),
        projection_dim=16,
    )
    model = ClapModel(config).eval()
    model.save_pretrained(folder)
    ClapFeatureExtractor(
        feature_size=MEL_BINS,
        max_length_s=MAX_SECONDS,
        truncation="fusion" if fused else "rand_trunc",
        padding="repeatpad",
    ).save_pretrained(folder)
    return model
