"""The built-in ``tiny`` family: a CPU-sized text-to-image flow-matching model.

The transformer is diffusers' ``SD3Transformer2DModel`` (the class of SD3/SD3.5) sized for a CPU;
the text encoder is transformers' ``CLIPTextModelWithProjection`` over a character-level tokenizer
(built in code, saved with ``save_pretrained``). It works in pixel space: the "latent" of an RGB
image in [0, 1] is the image scaled to [-1, 1], shape ``(3, H, W)``; 32 x 64 by default, patch 4,
so a sample is 8 x 16 = 128 tokens.

On disk it is a diffusers-layout folder (``transformer/``, ``text_encoder/``, ``tokenizer/``) plus
``diffrl_model.json``; ``path: base`` loads the one shipped in ``models/assets/tiny_base``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import tokenizers
import torch
from diffusers import SD3Transformer2DModel
from tokenizers.processors import TemplateProcessing
from torch import nn
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, PreTrainedTokenizerFast

from diffrl.core.rollout import Conditioning
from diffrl.models.base import (
    DTYPES,
    FamilyDescription,
    ModelFamily,
    Planned,
    SizeRule,
    check_family_dir,
    meta_model,
    write_family_file,
)
from diffrl.models.diffusers_folder import load_part, read_json
from diffrl.models.sd3 import SD3_LORA_TARGETS, sd3_forward, sd3_planned_forward

BASE_DIR = Path(__file__).resolve().parent / "assets" / "tiny_base"
MAX_PROMPT_TOKENS = 40

TRANSFORMER_CONFIG = dict(
    sample_size=32,
    patch_size=4,
    in_channels=3,
    out_channels=3,
    num_layers=4,
    attention_head_dim=32,
    num_attention_heads=4,
    joint_attention_dim=64,
    caption_projection_dim=128,
    pooled_projection_dim=64,
    pos_embed_max_size=16,
)

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII (a real HF fast tokenizer)."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for c in (chr(i) for i in range(32, 127)):
        vocab[c] = len(vocab)
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.post_processor = TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=MAX_PROMPT_TOKENS,
    )


def text_encoder_config(vocab_size: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_PROMPT_TOKENS,
        projection_dim=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )


class TinyDescription(FamilyDescription):
    """What :class:`TinyFamily` declares (static): the tiny world's options, checks, module names, size
    rule and plan, from its built-in config or the folder's."""

    name = "tiny"
    default_guidance = 4.5
    """The shipped base is trained with 10% prompt dropout for CFG; 4.5 (flow_grpo's SD3 value)
    reads best of those measured (see docs/results/tiny_base.md)."""
    default_lora_targets = SD3_LORA_TARGETS  # the transformer is SD3's

    @dataclass
    class Options:
        gradient_checkpointing: bool = False
        train_text_encoder: bool = False
        """Train the text encoder with the transformer (full fine-tunes from scratch, e.g. building
        the base): a random frozen encoder leaves the transformer too weak a handle on the characters."""

    @classmethod
    def one_process_problems(cls, config) -> list[str]:
        """The text encoder trains in the trainer's process; the weight sync sends the transformer's."""
        if config.model.options.get("train_text_encoder"):
            return ["model.options.train_text_encoder runs in one process only (runner: local)"]
        return []

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        if config.model.options.get("train_text_encoder") and config.model.lora is not None:
            errors.append("model.options.train_text_encoder needs a full fine-tune (model.lora: null)")
        path = config.model.path
        if check_files and path not in ("base", "random") and Path(path).is_dir():
            if not (Path(path) / "transformer").is_dir():
                errors.append(
                    f"model.path: {path!r} is not a tiny model folder (no transformer/ inside); give a "
                    "folder written by 'diffrl export' or save_pretrained, or use 'base' or 'random'"
                )
        return errors

    @classmethod
    def transformer_settings(cls, config, check_files: bool = True) -> dict | None:
        """The transformer's config: the built-in one, or the model folder's (None: unreadable)."""
        settings = dict(TRANSFORMER_CONFIG)
        path = config.model.path
        if path not in ("base", "random"):
            file = Path(path) / "transformer" / "config.json"
            found = read_json(file)  # without check_files (a plan) too: the JSON is all it reads
            if found is None:
                return None  # an unreadable folder is reported when it loads
            settings.update(found)
        return settings

    @classmethod
    def module_names(cls, config, check_files: bool = True) -> list[str] | None:
        settings = cls.transformer_settings(config, check_files)
        if settings is None:
            return None
        with torch.device("meta"):
            model = SD3Transformer2DModel.from_config(settings)
        return [name for name, _ in model.named_modules()]

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        settings = cls.transformer_settings(config, check_files)
        if settings is None:
            return None
        patch, extent = int(settings["patch_size"]), settings.get("pos_embed_max_size")
        return SizeRule(
            patch,
            f"its patch size {patch}",
            extent * patch if extent else None,
            f"its position embedding spans {extent} patches of {patch} pixels",
        )

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The tiny transformer (``folder/transformer/config.json``, else the built-in config) on
        pixels; conditioning: :data:`MAX_PROMPT_TOKENS` CLIP tokens and the pooled embedding."""
        settings = read_json(folder / "transformer" / "config.json") or TRANSFORMER_CONFIG
        module = meta_model(SD3Transformer2DModel, settings, DTYPES[config.model.dtype])
        latent = (module.config.in_channels, config.sampling.height or 32, config.sampling.width or 32)
        forward = sd3_planned_forward(MAX_PROMPT_TOKENS)
        return Planned(module, latent, forward, "SD3Transformer2DModel (tiny)")


class TinyFamily(ModelFamily):
    """The tiny world loaded: an SD3 transformer on pixels with a character-level CLIP text encoder
    (trainable with it, ``model.options.train_text_encoder``)."""

    description = TinyDescription

    def __init__(self, transformer, text_encoder, tokenizer, device, options):
        super().__init__(transformer, device, options)
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        both = {"transformer": transformer, "text_encoder": text_encoder}
        self._both = nn.ModuleDict(both) if options.train_text_encoder else None

    @property
    def text_encoder_trainable(self) -> bool:
        return self.options.train_text_encoder

    def trainable_module(self) -> nn.Module:
        return self._both if self._both is not None else self.transformer

    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, options) -> Self:
        if path == "random":
            torch.manual_seed(0)  # a reproducible random init (the seed is part of the recipe's contract)
            transformer = SD3Transformer2DModel(**TRANSFORMER_CONFIG)
            tokenizer = build_tokenizer()
            text_encoder = CLIPTextModelWithProjection(text_encoder_config(len(tokenizer)))
            # The text encoder stays frozen: give its random init embeddings that keep each character
            # and its position distinct after the layer norms (CLIP's std 0.02 init buries them in
            # components shared by every prompt, and the transformer then never learns to read them).
            emb = text_encoder.text_model.embeddings
            with torch.no_grad():
                emb.token_embedding.weight.normal_(std=1.0)
                emb.position_embedding.weight.normal_(std=0.5)
        else:
            folder = BASE_DIR if path == "base" else Path(path)
            if not (folder / "transformer").is_dir():
                raise FileNotFoundError(
                    f"{str(folder)!r} is not a tiny model folder (no transformer/ inside); "
                    'rebuild the base as docs/quickstart.md says ("Rebuild the shipped base") or use model.path=random'
                )
            check_family_dir(folder, cls.description.name)
            transformer = load_part(folder, "transformer", SD3Transformer2DModel, torch.float32)
            text_encoder = load_part(folder, "text_encoder", CLIPTextModelWithProjection, torch.float32)
            tokenizer = load_part(folder, "tokenizer", PreTrainedTokenizerFast)
        transformer.to(device=device)
        if dtype != torch.float32:
            transformer.to(dtype=dtype)
        text_encoder.to(device=device).eval().requires_grad_(options.train_text_encoder)
        if options.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        return cls(transformer, text_encoder, tokenizer, device, options)

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        path = Path(path)
        transformer = self.transformer
        if dtype is not None:
            transformer = copy.deepcopy(transformer).to(dtype)
        transformer.save_pretrained(path / "transformer")
        self.text_encoder.save_pretrained(path / "text_encoder")
        self.tokenizer.save_pretrained(path / "tokenizer")
        write_family_file(path, self.description.name)

    def load_snippet(self, path: str | Path) -> str:
        """The tiny world has no diffusers pipeline: its transformer is diffusers' SD3 class."""
        return f"transformer = SD3Transformer2DModel.from_pretrained({str(path)!r}, subfolder='transformer')"

    @property
    def default_size(self) -> tuple[int, int]:
        return (32, 64)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        patch = TRANSFORMER_CONFIG["patch_size"]
        if height % patch or width % patch:
            raise ValueError(f"tiny: height and width must be multiples of {patch}, got {height}x{width}")
        return (3, height, width)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        ids = self.tokenizer(
            prompts, padding="max_length", max_length=MAX_PROMPT_TOKENS, truncation=True, return_tensors="pt"
        ).input_ids.to(self.device)
        out = self.text_encoder(input_ids=ids)
        return {"encoder_hidden_states": out.last_hidden_state, "pooled_projections": out.text_embeds}

    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        return sd3_forward(module, x_t, sigma, cond)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return images * 2.0 - 1.0

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float() + 1.0) / 2.0).clamp(0.0, 1.0)
