"""What every real family's test checks on its tiny copy, beyond faithfulness to its pipeline:
one iteration of each algorithm, the exported LoRA read back by diffusers, another family's
checkpoint refused. Each ``tests/integration/test_<family>.py`` supplies its folder and settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffrl.config import Config
from diffrl.core.rollout import Source
from diffrl.launch import train
from diffrl.models.base import FamilyMismatchError, ModelFamily
from diffrl.preflight import load_config
from diffrl.train.state import TrainResult
from tests.conftest import ROOT, rehash_checkpoint

ITERATION = {
    "algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 3]}}",
    "model.lora": "{rank: 4}",
    "sampling.num_steps": 3,
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 2,
    "rollout.micro_group_size": 2,
    "train.batch_size": 4,
    "train.micro_batch_size": 2,
    "train.iterations": 1,
    "rewards": "[{name: tests.rewards:brightness}]",
    "eval.enabled": "false",
}
"""One small iteration (2 prompts x 2 samples, 3 steps) of Flow-GRPO from the tiny recipe."""

OTHER_ALGORITHMS = pytest.mark.parametrize(
    "algorithm",
    [
        {"algorithm.name": "diffusion_nft", "algorithm.params": "{}"},
        {"algorithm.name": "awm", "algorithm.params": "{}"},
        {  # offline: synthetic text images through the family's VAE
            "algorithm.name": "sft",
            "algorithm.params": "{}",
            "data.dataset": "synthetic_text",
            "data.dataset_size": 8,
            "rewards": "[]",
            "rollout": "{}",  # SFT draws no rollouts: ITERATION's rollout settings are refused
        },
    ],
    ids=["diffusion_nft", "awm", "sft"],
)

EDIT_ALGORITHMS = pytest.mark.parametrize(
    "algorithm",
    [
        {"algorithm.name": "diffusion_nft", "algorithm.params": "{}"},
        {"algorithm.name": "awm", "algorithm.params": "{}"},
        {  # offline: the synthetic edit pairs (sign, instruction, edited sign) through the VAE
            "algorithm.name": "sft",
            "algorithm.params": "{}",
            "data.dataset": "synthetic_edit",
            "data.dataset_size": 8,
            "rewards": "[]",
            "rollout": "{}",  # SFT draws no rollouts: ITERATION's rollout settings are refused
        },
    ],
    ids=["diffusion_nft", "awm", "sft"],
)
""":data:`OTHER_ALGORITHMS` for an editing family: SFT on edit pairs."""


def edit_prompt_set(folder: Path, size: int, n: int = 4) -> Path:
    """An editing prompt set of ``n`` synthetic signs (``size`` px) written into ``folder``:
    ``prompts.jsonl`` lines ``{"prompt": 'replace the number with "42"', "image": "images/..."}``."""
    from diffrl.data.synthetic_text import write_edit_set

    texts = [f'the number "{t}"' for t in ("12", "345", "67", "890", "21", "43")[:n]]
    return write_edit_set(folder, texts, seed=0, height=size, width=size)


def edit_config(tmp_path: Path, family: dict[str, object], size: int, **extra) -> Config:
    """:func:`family_config` on an editing prompt set (``data.prompts`` and ``eval.prompts``)."""
    prompts = edit_prompt_set(tmp_path / "edits", size)
    return family_config(
        tmp_path, {**family, "data.prompts": str(prompts), "eval.prompts": str(prompts)}, **extra
    )


def family_config(tmp_path: Path, family: dict[str, object], **extra) -> Config:
    """The tiny Flow-GRPO recipe with :data:`ITERATION`, the family's settings (``model.*``,
    ``sampling.*``) and ``extra`` on top."""
    overrides = {"run.output_dir": str(tmp_path / "run"), **ITERATION, **family, **extra}
    return load_config(
        str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"), [f"{k}={v}" for k, v in overrides.items()]
    )


def train_one(config: Config) -> TrainResult:
    """Run the iteration; its loss is finite and the update had a gradient."""
    result = train(config)
    m = result.history[0]
    assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0
    if config.algorithm.name == "flow_grpo":
        assert m["train/log_prob_mean_abs_diff"] == 0.0  # the replay is the rollout's forward
    return result


def export_lora(tmp_path: Path, checkpoint: Path) -> tuple[Path, ModelFamily]:
    """``diffrl export`` of ``checkpoint`` after giving its LoRA weights that matter (one small
    GRPO step barely moves B from its zero init); returns the folder and diffrl's policy."""
    from safetensors.torch import load_file, save_file

    from diffrl.cli import main
    from diffrl.cli.inference import load_for_inference, load_target

    weights = load_file(str(checkpoint / "trainable.safetensors"))
    gen = torch.Generator().manual_seed(1)
    weights = {
        k: torch.randn(v.shape, generator=gen) * 0.1 if "lora_B" in k else v for k, v in weights.items()
    }
    save_file(weights, str(checkpoint / "trainable.safetensors"))
    rehash_checkpoint(checkpoint)  # edited on purpose: it reads as if trained so
    out = tmp_path / "lora"
    assert main(["export", str(checkpoint), str(out)]) == 0
    config, ckpt = load_target(str(checkpoint), [])
    return out, load_for_inference(config, ckpt)


def assert_exported_lora_matches(
    tmp_path: Path,
    checkpoint: Path,
    base: ModelFamily,
    x: torch.Tensor,
    guidance: float = 1.0,
    sources: list[Source] | None = None,
) -> ModelFamily:
    """``pipeline.load_lora_weights`` of the exported folder on the base model gives the velocity of
    diffrl's policy with that LoRA (to 1e-5), and the adapter changes it (it was applied); an
    editing family's two prompts come with ``sources``. Returns the policy."""
    out, ours = export_lora(tmp_path, checkpoint)
    sigma = torch.tensor([0.9, 0.4])
    cond = ours.encode_prompts(["a", "b"], sources)
    with torch.no_grad():
        v_plain = base.velocity(x, sigma, cond, guidance)
        pipe = base.pipeline()
        pipe.load_lora_weights(str(out))  # into base.transformer, as a user would
        v_diffusers = base.velocity(x, sigma, cond, guidance, module=pipe.transformer)
        v_ours = ours.velocity(x, sigma, cond, guidance)
    torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=1e-5)
    assert (v_plain - v_ours).abs().max() > 1e-3
    return ours


def assert_refuses(family: ModelFamily, tiny_checkpoint: Path) -> None:
    """A ``tiny`` checkpoint given to ``family`` is refused with an error naming the family it is."""
    from diffrl.train.checkpoint import load_weights_into

    with pytest.raises(FamilyMismatchError, match="tiny"):
        load_weights_into(family, tiny_checkpoint)
