"""Configs of the tiny random parts the real families' tests build (text encoders, VAE), each
sized for a CPU and used with the char-level tokenizer of :func:`diffrl.models.tiny.build_tokenizer`."""

from __future__ import annotations

from diffrl.models.tiny import build_tokenizer

CLIP_TOKENS = 77


def tokenizer():
    """The char-level fast tokenizer with CLIP's 77-token window (the pipelines read
    ``model_max_length`` for their CLIP encoders)."""
    tok = build_tokenizer()
    tok.model_max_length = CLIP_TOKENS
    return tok


def clip_config(vocab_size: int, hidden_size: int = 32):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_TOKENS,
        projection_dim=hidden_size,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )


def t5_config(vocab_size: int, d_model: int):
    from transformers import T5Config

    return T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=3,
        decoder_start_token_id=0,
    )


def autoencoder_kl(latent_channels: int, scaling_factor: float, shift_factor: float, size: int):
    """A 2-level ``AutoencoderKL`` (halves the image side) with a real VAE's scaling and shift."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=[8, 8],
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=latent_channels,
        sample_size=size,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
