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


def byte_tokenizer(specials: list[str], added: list[str] = (), template: str | None = None, **tokens):
    """A byte-level BPE ``Qwen2Tokenizer`` (no merges: one token per byte, as Qwen's, Mistral's and
    their kin treat text) with ``specials`` first in its vocabulary, ``specials[1:]`` and ``added``
    its additional special tokens (``added`` appended after the bytes), and the chat ``template``."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {s: i for i, s in enumerate(specials)}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=[*specials[1:], *added], **tokens)
    if template is not None:
        tok.chat_template = template
    return tok


def qwen25_vl(vocab_size: int, max_positions: int, vision: dict | None = None, **ids):
    """A 2-layer ``Qwen2_5_VLForConditionalGeneration`` of width 32 (Qwen-Image's text encoder) with
    a 1-block vision tower (``vision``: its settings on top) and the token ``ids`` it reads."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=vocab_size,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=max_positions,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e6},
                bos_token_id=None,
                eos_token_id=0,
                pad_token_id=0,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                out_hidden_size=32,
                fullatt_block_indexes=[0],
                **(vision or {}),
            ),
            **ids,
        )
    )


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


def t5_config(vocab_size: int, d_model: int, d_ff: int = 64, umt5: bool = False):
    """A 1-layer T5 encoder's config (``umt5``: UMT5's, Wan's text encoder)."""
    from transformers import T5Config, UMT5Config

    return (UMT5Config if umt5 else T5Config)(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=d_ff,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=3,
        decoder_start_token_id=0,
    )


def wan_transformer(**settings):
    """A 2-block ``WanTransformer3DModel`` of 2 heads of 12 (Wan's 16 latent channels, text of 32);
    ``settings`` over those."""
    from diffusers import WanTransformer3DModel

    tiny = {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 32,
        "freq_dim": 32,
        "ffn_dim": 32,
        "num_layers": 2,
        "rope_max_seq_len": 32,
    }
    return WanTransformer3DModel(**{**tiny, **settings})


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
