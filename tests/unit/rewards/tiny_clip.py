"""Tiny CLIP folders for the preference-reward tests, built in code (nothing from a hub).

The tokenizer is a real CLIP BPE (byte-level alphabet with and without ``</w>``, a few merges,
start and end tokens last so the end token has the largest id, as in CLIP's 49408 vocab); the
image processor config is the one the openai and laion CLIP folders ship, at a tiny size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]
MERGES = ["t h", "th e</w>", "c a", "ca t</w>", "o n</w>"]
PROMPTS = ["the cat", "a photo of the sea", "a red cube on a table", "cat", "an astronaut riding a horse"]


def _byte_alphabet() -> list[str]:
    """GPT-2 / CLIP's printable stand-ins for the 256 bytes."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return [chr(b) for b in kept] + [chr(256 + i) for i in range(len(shifted))]


def vocabulary() -> list[str]:
    chars = _byte_alphabet()
    merged = [m.replace(" ", "") for m in MERGES]
    return chars + [c + "</w>" for c in chars] + merged + ["<|startoftext|>", "<|endoftext|>"]


def write_tokenizer(folder: Path) -> CLIPTokenizer:
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in MERGES], model_max_length=77)
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_processor(folder: Path, size: int) -> None:
    """``preprocessor_config.json`` as openai/clip-vit-large-patch14 and the laion ViT-H-14 folder
    have it (old int sizes, bicubic), with 224 replaced by ``size``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "crop_size": size,
        "do_center_crop": True,
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "CLIPFeatureExtractor",
        "image_mean": OPENAI_MEAN,
        "image_std": OPENAI_STD,
        "resample": 3,
        "size": size,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(config))


def clip_config(
    projection_dim: int = 16, image_size: int = 32, logit_scale: float = 4.0, legacy_eos: bool = False
) -> CLIPConfig:
    """``legacy_eos``: text ``eos_token_id`` 2, as openai/clip-vit-large-patch14's config has it
    (transformers then pools at ``input_ids.argmax(-1)``, the end token, instead of the first
    ``eos_token_id``)."""
    n_vocab = len(vocabulary())
    return CLIPConfig(
        projection_dim=projection_dim,
        logit_scale_init_value=logit_scale,
        text_config={
            "vocab_size": n_vocab,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 77,
            "bos_token_id": n_vocab - 2,
            "eos_token_id": 2 if legacy_eos else n_vocab - 1,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": image_size,
            "patch_size": 8,
        },
    )


def write_clip(folder: Path, seed: int = 0, with_processor: bool = True, **config) -> CLIPModel:
    """A random ``CLIPModel`` saved to ``folder`` (plus tokenizer and image processor unless
    ``with_processor`` is False, as in the PickScore_v1 folder); returns it in eval mode."""
    torch.manual_seed(seed)
    model = CLIPModel(clip_config(**config)).eval()
    model.save_pretrained(folder)
    if with_processor:
        write_tokenizer(folder)
        write_processor(folder, model.config.vision_config.image_size)
    return model


def random_images(n: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """``(n, 3, height, width)``: uint8 pixels / 255, as rewards receive rollout images."""
    gen = torch.Generator().manual_seed(seed)
    # smooth-ish pictures (a coarse grid upsampled) rather than pure noise, so resizing matters
    coarse = torch.rand(n, 3, max(2, height // 4), max(2, width // 4), generator=gen)
    fine = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    noise = 0.1 * torch.rand(n, 3, height, width, generator=gen)
    return ((fine + noise).clamp(0, 1) * 255).round() / 255


def clip_pixels(images: torch.Tensor, size: int, mean=OPENAI_MEAN, std=OPENAI_STD) -> torch.Tensor:
    """CLIP's preprocessing written out with PIL, for comparing against the rewards' processor:
    ``images (B, 3, H, W)`` -> shortest side to ``size`` (bicubic, the long side ``int(size * long /
    short)``), center crop ``size`` at ``(side - size) // 2``, / 255, (x - mean) / std: ``(B, 3, size,
    size)`` float32."""
    import numpy as np
    from PIL import Image

    out = []
    for img in images:
        array = (img * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        picture = Image.fromarray(np.ascontiguousarray(array))
        w, h = picture.size
        new_w, new_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        picture = picture.resize((new_w, new_h), Image.Resampling.BICUBIC)
        top, left = (new_h - size) // 2, (new_w - size) // 2
        crop = np.asarray(picture, dtype=np.float64)[top : top + size, left : left + size] / 255
        out.append(torch.from_numpy((crop - np.array(mean)) / np.array(std)).permute(2, 0, 1))
    return torch.stack(out).float()


def preflight_problems(name: str, params: dict) -> list[str]:
    """What ``diffrl.preflight.validate`` reports for a config whose only reward is ``name``."""
    from diffrl.config import Config, RewardConfig
    from diffrl.preflight import validate

    return validate(Config(rewards=[RewardConfig(name, params=params)]), sections=("rewards",))
