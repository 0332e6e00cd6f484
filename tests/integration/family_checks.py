"""What every real family's test checks on its tiny copy, beyond faithfulness to its pipeline:
one iteration of each algorithm, the exported LoRA read back by diffusers, another family's
checkpoint refused, ``diffrl plan`` running the family's own forward. The checks are written once
here, in :class:`FamilyChecks`, :class:`ExportedLoraCheck` and :class:`PlanCheck`; each
``tests/integration/test_<family>.py`` runs them on its own tiny folder (a module fixture, built
once) through a subclass that names its :class:`Family` case, next to its family-specific tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from diffrl.config import Config
from diffrl.core.rollout import Source
from diffrl.launch import train
from diffrl.models.base import FamilyMismatchError, ModelFamily
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.train.actor import trainable_parameters
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

ALGORITHM_IDS = ["diffusion_nft", "awm", "sft"]


def other_algorithm(name: str, sft_dataset: str = "synthetic_text") -> dict[str, object]:
    """The settings of one iteration of ``name`` (DiffusionNFT, AWM, or SFT: offline, on
    ``sft_dataset`` through the family's VAE: synthetic text images, or for an editing family the
    synthetic edit pairs (sign, instruction, edited sign))."""
    if name != "sft":
        return {"algorithm.name": name, "algorithm.params": "{}"}
    return {
        "algorithm.name": "sft",
        "algorithm.params": "{}",
        "data.dataset": sft_dataset,
        "data.dataset_size": 8,
        "rewards": "[]",
        "rollout": "{}",  # SFT draws no rollouts: ITERATION's rollout settings are refused
    }


SEQUENCE_3 = {"runner": "ray", "parallel.trainer_ranks": 3, "parallel.sequence": 3}
"""One sequence group of 3 trainer ranks: the tiny models' 16-token images and 2 heads do not split."""
SEQUENCE_2 = {**SEQUENCE_3, "parallel.trainer_ranks": 2, "parallel.sequence": 2}


def settings(family: str, folder, options: str, guidance: float, height: int, width: int | None = None):
    """A family's ``model.*`` and ``sampling.*`` settings for :func:`family_config`: its tiny
    ``folder``, ``model.options``, the guidance scale and the size (square unless ``width``)."""
    return {
        "model.family": family,
        "model.path": str(folder),
        "model.options": options,
        "sampling.guidance_scale": guidance,
        "sampling.height": height,
        "sampling.width": width or height,
    }


def tiny_folder(name: str, write: Callable[..., None], *args, **kwargs):
    """The module fixture ``name``: a folder that ``write(path, *args, **kwargs)`` fills (a tiny
    model saved by its pipeline), written once per module."""

    @pytest.fixture(scope="module", name=name)
    def folder(tmp_path_factory):
        path = tmp_path_factory.mktemp(name)
        write(path, *args, **kwargs)
        return path

    return folder


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


def assert_merged_matches(
    tmp_path: Path, checkpoint: Path, base: ModelFamily, ours: ModelFamily, x: torch.Tensor, pipeline: str
):
    """``diffrl export --merge`` of ``checkpoint`` writes a whole folder with the adapter fused that
    diffusers' ``pipeline`` class reads back: its transformer gives the velocity of diffrl's policy
    ``ours`` (to 1e-5). Returns that pipeline."""
    import diffusers

    from diffrl.cli import main

    merged = tmp_path / "merged"
    assert main(["export", str(checkpoint), str(merged), "--merge"]) == 0
    pipe = getattr(diffusers, pipeline).from_pretrained(merged)
    sigma, cond = torch.tensor([0.9, 0.4]), ours.encode_prompts(["a", "b"])
    with torch.no_grad():
        v_merged = base.velocity(x, sigma, cond, module=pipe.transformer)
        torch.testing.assert_close(v_merged, ours.velocity(x, sigma, cond), rtol=0, atol=1e-5)
    return pipe


def pretend_sequence_ranks(module, n: int) -> None:
    """Leave on ``module`` the record of a split over ``n`` ranks that diffusers'
    ``enable_parallelism`` leaves (``_parallel_config``), without its hooks: what a family reads
    (:func:`diffrl.models.flux.sequence_ranks`) to pad its text or refuse its tokens, checked in
    one process (the forward itself stays whole)."""
    from types import SimpleNamespace

    cp = SimpleNamespace(ulysses_degree=n, ring_degree=1)
    module._parallel_config = SimpleNamespace(context_parallel_config=cp)


def assert_does_not_split(config: Callable[..., Config], family: str, *lengths: str) -> str:
    """``config(**SEQUENCE_3)`` is a config error naming each of ``lengths`` of the ``family``
    model as not splitting over ``parallel.sequence: 3``. Returns the error's message."""
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        config(**SEQUENCE_3)
    msg = str(e.value)
    for what in lengths:
        assert f"parallel.sequence=3: the {family} model's {what} do not split over 3 ranks" in msg
    return msg


def _assert_same(ours, theirs, where: str = "input") -> None:
    """``ours`` and ``theirs`` (a forward's arguments: tensors, lists, tuples, dicts, plain values)
    are the same, tensors to the bit and in the same dtype."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype, where
        assert ours.shape == theirs.shape and torch.equal(ours, theirs), where
    elif isinstance(theirs, list | tuple):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for k in theirs:
            _assert_same(ours[k], theirs[k], f"{where}.{k}")
    else:
        assert ours == theirs, where


def assert_plan_runs(config: Config) -> None:
    """``diffrl plan`` of ``config`` (the family's ``planned`` from the model folder's JSON files,
    one micro-batch's step on fake tensors) measures memory and FLOPs."""
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.plan.planner import plan
    from diffrl.train.actor import apply_lora

    result = plan(config, build_algorithm(config))
    assert result.memory.peak > 0 and result.memory.activations > 0 and result.train_flops > 0
    if config.model.lora is not None:  # the LoRA the actor trains (the family's own targets)
        family = load_family(config)
        apply_lora(family, config.model.lora)
        assert result.trainable == sum(p.numel() for p in trainable_parameters(family))


def assert_planned_is_the_familys(config: Config, folder, sources=None, masks: tuple[str, ...] = ()) -> None:
    """What ``diffrl plan`` runs is the family's own model and forward: the transformer its
    ``planned`` builds on the meta device from ``folder`` has the loaded transformer's tensors
    (names, shapes, dtypes), and the planned forward, run on the loaded transformer, hands it
    exactly the inputs of the family's forward with real prompts' conditioning (with ``sources``
    for an editing family) zeroed (the ``masks`` set to ones: every token a prompt's, as the plan's
    full-length prompts), and gives the same velocity."""
    from diffrl.core.rollout import Conditioning

    family = load_family(config)
    planned = type(family).description.planned(config, Path(folder))

    def tensors(module):
        return {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()}

    assert tensors(planned.module) == tensors(family.transformer)
    encoded = family.encode_prompts(["a", "b"], sources).tensors
    cond = Conditioning(
        {k: torch.ones_like(v) if k in masks else torch.zeros_like(v) for k, v in encoded.items()}
    )
    x = torch.randn(2, *planned.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    calls = []
    hook = family.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append((args, kwargs)), with_kwargs=True
    )
    try:
        with torch.no_grad():
            theirs = family.forward(family.transformer, x, sigma, cond)
            ours = planned.forward(family.transformer, x, sigma)
    finally:
        hook.remove()
    _assert_same(calls[1], calls[0])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@dataclass(frozen=True)
class Family:
    """A family's case of the shared checks: how its test module makes a config on its tiny folder,
    and what of the checks differs from family to family."""

    config: Callable[..., Config]
    """``config(tmp_path, folder, **extra)``: :func:`family_config` with the family's settings."""
    folder: str
    """The name of the module fixture of the tiny folder the checks run on."""
    latent: tuple[int, ...] = ()
    """One sample's latent shape: the velocity input of :class:`ExportedLoraCheck`."""
    edits: bool = False
    """An editing family: its SFT iteration trains on synthetic edit pairs."""
    sft: dict[str, object] = field(default_factory=dict)
    """Settings of the SFT iteration on top (a video family's: stills, ``num_frames: 1``)."""
    grpo: dict[str, object] = field(default_factory=dict)
    """Keyword arguments of ``config`` for the Flow-GRPO iteration of :class:`ExportedLoraCheck`."""
    merge: str | None = None
    """The diffusers pipeline class that reads ``diffrl export --merge``'s folder, if checked."""
    masks: tuple[str, ...] = ()
    """:class:`PlanCheck`: the conditioning's masks, all ones in the plan's full-length prompts."""


class FamilyChecks:
    """Checks of every family: an iteration of each other algorithm trains, and a ``tiny``
    checkpoint is refused. A family's module subclasses this (or :class:`ExportedLoraCheck`,
    :class:`PlanCheck`) with its ``case``."""

    case: ClassVar[Family]

    @pytest.fixture
    def folder(self, request) -> Path:
        return request.getfixturevalue(self.case.folder)

    @pytest.mark.parametrize("algorithm", ALGORITHM_IDS)
    def test_other_algorithms_run_an_iteration(self, tmp_path, folder, algorithm):
        run = other_algorithm(algorithm, "synthetic_edit" if self.case.edits else "synthetic_text")
        if algorithm == "sft":
            run.update(self.case.sft)
        train_one(self.case.config(tmp_path, folder, **run))

    def test_a_tiny_checkpoint_is_refused(self, tmp_path, folder, tiny_checkpoint):
        assert_refuses(load_family(self.case.config(tmp_path, folder)), tiny_checkpoint)


class ExportedLoraCheck(FamilyChecks):
    """And: a Flow-GRPO iteration replays its log-probs exactly, its exported LoRA loaded by the
    pipeline's ``load_lora_weights`` gives diffrl's velocity (and, with ``merge``, so does the
    transformer of ``diffrl export --merge``'s whole folder)."""

    def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(self, tmp_path, folder):
        grpo = train_one(self.case.config(tmp_path / "grpo", folder, **self.case.grpo))
        base = load_family(self.case.config(tmp_path, folder, **{"model.lora": "null"}))
        x = torch.randn(2, *self.case.latent, generator=torch.Generator().manual_seed(0))
        ours = assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x)
        if self.case.merge:
            assert_merged_matches(tmp_path, grpo.checkpoint, base, ours, x, self.case.merge)


class PlanCheck(FamilyChecks):
    """And: ``diffrl plan`` runs, and its planned forward is the family's."""

    def test_plan_runs_the_familys_own_transformer_and_forward(self, tmp_path, folder):
        config = self.case.config(tmp_path, folder)
        assert_plan_runs(config)
        assert_planned_is_the_familys(config, folder, masks=self.case.masks)


def other_pipelines_folder(path: Path, pipeline: str) -> Path:
    """A diffusers folder of another ``pipeline`` class at ``path``: only its ``model_index.json``,
    all that the config check reads before refusing it."""
    import json

    path.mkdir()
    (path / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    return path


def pipeline_latents(pipe, latents: torch.Tensor, steps: int, height: int, width: int | None = None, **call):
    """The output of ``pipe`` (``output_type="latent"``) from ``latents`` in ``steps`` steps at
    ``height`` x ``width`` (square unless given), ``call`` its other arguments (prompts, guidance):
    the pipeline's side of a family's ODE parity check."""
    return pipe(
        latents=latents,
        num_inference_steps=steps,
        height=height,
        width=width or height,
        output_type="latent",
        **call,
    )
