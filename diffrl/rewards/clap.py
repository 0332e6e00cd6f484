"""CLAP score: how well a clip's sound matches its prompt, by LAION's CLAP (text-audio contrastive).

The model is transformers' ``ClapModel`` (the port of LAION-AI/CLAP, e.g. ``laion/clap-htsat-unfused``
or ``laion/larger_clap_general``) from a local folder with its ``ClapProcessor`` files (the
feature extractor's ``preprocessor_config.json`` and the RoBERTa tokenizer). The score is the
cosine of the projected, L2-normalised audio and text embeddings, the usual "CLAP score" of
text-to-audio evaluation (AudioLDM's and Make-An-Audio's, which take LAION-CLAP's
``get_audio_embedding`` . ``get_text_embedding`` of unit vectors):

    score = <e_a, e_t>        e_a = normalize(audio_projection(HTSAT(mel(x)))),
                              e_t = normalize(text_projection(RoBERTa(prompt)))       (B, D) each

so it lies in [-1, 1]; ``ClapModel.forward``'s ``logits_per_audio`` are the same cosines times
``exp(logit_scale_a)``.

The waveform: the rollout's ``(B, channels, samples)`` at the family's rate is averaged to mono
(CLAP is trained on mono), resampled to the feature extractor's ``sampling_rate`` (48 kHz for LAION's
folders) band-limited (:meth:`~diffrl.core.rollout.Audio.resample`, torchaudio's algorithm), and made into log-mel features by the folder's
``ClapFeatureExtractor`` (clips shorter than its ``max_length_s`` are repeated then padded, as it
does). A clip longer than ``max_length_s`` is cut to its first ``max_length_s`` seconds here: the
extractor would take random crops (``fusion`` / ``rand_trunc``), and a reward must not draw from an
unseeded generator. For the same reason every clip is passed as not longer than the window
(``is_longer`` all False, which it is once cut): with a fused model (``enable_fusion``, e.g.
``laion/clap-htsat-fused``) the extractor marks one random clip of each call as longer when none is
(``feature_extraction_clap.py``, "if no audio is longer than 10s, then randomly select one audio to
be longer"), which would send it through the fusion branch and change its score from call to call.
Prompts are cut at 77 tokens, as LAION-CLAP's ``tokenizer`` does (``max_length=77``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

from diffrl.config.schema import ImagesPerForward
from diffrl.core.rollout import Audio
from diffrl.rewards.base import Reward
from diffrl.rewards.clip_embed import loading
from diffrl.rewards.pretrained import chunks, device_and_dtype, device_dtype_problems, folder_problems

MAX_TOKENS = 77
"""LAION-CLAP's text length (its ``tokenizer``: ``padding="max_length", max_length=77``)."""


WHAT = "LAION CLAP (a ClapModel)"


class ClapScore(Reward):
    """``model``: a CLAP folder (``ClapModel`` weights and config, ``preprocessor_config.json``,
    tokenizer files), e.g. a local copy of ``laion/clap-htsat-unfused``."""

    name = "clap"
    audio = True  # gets the clips whole (one row per clip) and their sound; the frames are not looked at

    def __init__(
        self, model: str, device: str = "cpu", dtype: str = "float32", batch_size: ImagesPerForward = 16
    ):
        self.batch_size = batch_size
        self.device, torch_dtype = device_and_dtype(device, dtype)
        folder = Path(model).expanduser()
        self.model = loading(
            self.name, WHAT, model, lambda: ClapModel.from_pretrained(folder, torch_dtype=torch_dtype)
        )
        self.model.to(self.device).eval()
        self.features = loading(self.name, WHAT, model, lambda: ClapFeatureExtractor.from_pretrained(folder))
        self.tokenizer = loading(self.name, WHAT, model, lambda: AutoTokenizer.from_pretrained(folder))

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        problems = folder_problems(cls.name, "model", params.get("model"), {"clap"}, WHAT, check_files)
        if not problems and check_files:
            path = Path(params["model"]).expanduser()
            if not (path / "preprocessor_config.json").is_file():
                problems.append(
                    f"model: {params['model']!r} has no preprocessor_config.json (the ClapFeatureExtractor "
                    "settings the CLAP folders on the Hub ship); copy it from the model's repository"
                )
            if not any(
                (path / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json")
            ):
                problems.append(
                    f"model: {params['model']!r} has no tokenizer files (tokenizer.json or vocab.json)"
                )
        problems += device_dtype_problems(params.get("device", "cpu"), params.get("dtype", "float32"))
        size = params.get("batch_size", 16)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            problems.append(f"batch_size must be an integer >= 1, got {size!r}")
        return problems

    def mono(self, audio: Audio) -> list[np.ndarray]:
        """``audio.waveform (B, C, S)`` -> B mono float64 clips at the extractor's rate, each at most
        ``max_length_s`` long (see the module docstring)."""
        rate = int(self.features.sampling_rate)
        mono = Audio(audio.waveform.double().mean(dim=1, keepdim=True), audio.sample_rate)
        return list(mono.resample(rate).waveform[:, 0, : self.features.nb_max_samples].numpy())

    def __call__(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]],
        audio: Audio | None = None,
    ) -> torch.Tensor:
        """``audio``: ``waveform (B, C, S)``; ``prompts`` B texts -> cosines ``(B,)`` float32."""
        if audio is None:
            raise ValueError("the clap reward scores sound, and these samples have none")
        if len(audio) != len(prompts):
            raise ValueError(f"{len(audio)} clips for {len(prompts)} prompts")
        clips, out = self.mono(audio), []
        dtype = next(self.model.parameters()).dtype
        for part in chunks(len(prompts), self.batch_size):
            feats = self.features(clips[part], sampling_rate=self.features.sampling_rate, return_tensors="pt")
            text = self.tokenizer(
                list(prompts[part]), padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
            )
            a = self.model.get_audio_features(
                input_features=feats.input_features.to(self.device, dtype),
                is_longer=torch.zeros(len(clips[part]), 1, dtype=torch.bool, device=self.device),
            ).pooler_output
            t = self.model.get_text_features(
                input_ids=text.input_ids.to(self.device), attention_mask=text.attention_mask.to(self.device)
            ).pooler_output
            out.append((F.normalize(a.float(), dim=-1) * F.normalize(t.float(), dim=-1)).sum(-1))
        return torch.cat(out).cpu()
