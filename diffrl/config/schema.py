"""The config schema: one dataclass per section of a recipe, nothing else.

Recipes are YAML files that fill :class:`Config`; :mod:`diffrl.config.binding` binds YAML and
``key=value`` overrides to it, and :mod:`diffrl.preflight` checks the whole system before anything
loads. Family-, algorithm-, reward- and runner-specific settings are free mappings here
(``model.options``, ``algorithm.params``, ``rewards[].params``), bound by their plugin's own
dataclass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass
class RunConfig:
    name: str = "diffrl"
    output_dir: str | None = None
    """Where checkpoints, metrics and images go; default ``runs/<name>``."""
    seed: int = 0
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    log_every: int = 1
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where the metrics go: ``jsonl`` (``RUN_DIR/metrics.jsonl``; always written, listed or not),
    ``tensorboard`` (event files in ``RUN_DIR/tensorboard``; ``pip install 'diffrl[tensorboard]'``),
    ``wandb`` (a W&B run, files in ``RUN_DIR/wandb``; ``pip install 'diffrl[wandb]'``,
    ``WANDB_MODE=offline`` without a network), or a dotted path to a class of your own (see
    ``diffrl.logging.trackers``). Each gets every metric of every step, the eval grids, the config
    and the batch arithmetic."""
    wandb_project: str = "diffrl"
    """The W&B project a ``wandb`` logger files the run in (the W&B run's name is ``run.name``)."""
    peak_tflops: float | None = None
    """The device's peak TFLOP/s for ``perf/*_mfu``; ``None``: the datasheet figure for known GPUs
    (bf16 dense under autocast, else fp32), otherwise a matmul measured after the first iteration."""

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


@dataclass
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None
    """``None`` takes the model family's default targets."""
    init: Literal["gaussian", "default"] = "gaussian"


@dataclass
class ModelConfig:
    family: str = "tiny"
    path: str = "base"
    """``base`` (the family's shipped weights), ``random`` (initialised from the family's
    built-in config), or a local directory in diffusers layout."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The weights' dtype (trainable ones and their optimizer state included)."""
    autocast: Literal["bfloat16", "float16"] | None = None
    """Run every transformer forward (rollouts, training, eval) under ``torch.autocast`` in this
    dtype while the weights, LoRA and optimizer state stay in ``model.dtype``; off on a device
    that cannot do it (reported at start-up). ``null``: no autocast."""
    compile: bool = False
    """``torch.compile`` the transformer (each batch shape a run uses compiles once, on its first
    forward; ``perf/compile_time`` reports it); off where the device cannot (reported)."""
    lora: LoraConfig | None = None
    """LoRA on the transformer; ``null`` trains all transformer weights."""
    options: dict[str, Any] = field(default_factory=dict)
    """Family-specific options, validated by the family's ``Options`` dataclass."""
    encode_once: bool = False
    """Encode every prompt of the run (``data.prompts``, ``eval.prompts``, the negative prompt)
    once, keep the embeddings (in the run folder too, for every process and a resumed run) and
    free the text encoders (:mod:`diffrl.sampling.prompt_cache`); online text-to-image/video runs."""


@dataclass
class SamplingConfig:
    num_steps: int = 10
    shift: float | None = None
    """A static schedule shift (SD3's ``shift``); ``None`` takes the schedule of the family's own
    pipeline (SD3, tiny: 3.0; Wan: the folder's ``flow_shift``; FLUX, Qwen-Image: shifted by the
    image's token count)."""
    guidance_scale: float | None = None
    """Classifier-free guidance with ``negative_prompt`` (1 disables it; 0 for Z-Image, which guides
    as ``pos + s * (pos - neg)``); ``None`` takes the family's
    default. FLUX.1 [dev]'s distilled guidance is a model option (``model.options.guidance``)."""
    negative_prompt: str = ""
    height: int | None = None
    """``None`` takes the family's default size."""
    width: int | None = None


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    params: dict[str, Any] = field(default_factory=dict)
    """Validated by the algorithm's ``Params`` dataclass."""


@dataclass
class DataConfig:
    prompts: str = "builtin:tiny_text/train.txt"
    """Prompt set for online algorithms: ``.txt`` (one a line), ``.jsonl``
    (``{"prompt": ..., "metadata": {...}}``; the line's other keys are metadata too, so GenEval's
    ``train_metadata.jsonl`` loads as it is; an editing family's lines also name their source image,
    ``"image": "path/relative/to/the/file.png"``) or a Hugging Face ``datasets`` folder
    (``save_to_disk`` or parquet; its ``train`` split, ``FOLDER#SPLIT`` for another; the prompt
    column is ``prompt``, else ``text``, else ``caption``). ``builtin:`` names a file shipped in diffrl."""
    dataset: str | None = "synthetic_text"
    """Offline dataset: ``synthetic_text``, ``synthetic_edit`` (its edit pairs: a sign, an
    instruction, the edited sign; for editing families) or a folder: of captioned images (SFT:
    ``NAME.txt`` captions or a ``metadata.jsonl`` / ``metadata.csv``, maybe in ``train/`` ``test/``
    subfolders; or a ``datasets`` folder with an image column and a caption column), or of preference
    pairs, a ``metadata.jsonl`` of ``{"prompt": ..., "chosen": FILE, "rejected": FILE}`` rows
    (DPO with ``algorithm.params.pairs: offline``)."""
    dataset_size: int | None = None
    """Synthetic datasets: number of distinct examples (``None``: one per train prompt)."""


@dataclass
class RolloutConfig:
    """Online collection. ``batch_size x n_samples_per_prompt`` samples per rollout must equal
    ``train.batch_size x num_steps_per_rollout`` (samples per optimizer step x optimizer steps)."""

    batch_size: int = 8
    """Prompts per rollout (one group of samples each)."""
    n_samples_per_prompt: int = 4
    micro_group_size: int | None = None
    """Samples per sampling forward; ``None`` takes ``train.micro_batch_size`` (then the first
    replay in training runs the very same forwards as the rollout, bit for bit)."""
    num_steps_per_rollout: int = 1
    """Optimizer steps per rollout."""
    same_latent: bool = False
    """Samples of one prompt group start from the same initial noise (flow_grpo's
    ``sample.same_latent``): their rewards then differ only through the stochastic steps."""
    engine: str = "diffrl"
    """Who draws the rollouts (:mod:`diffrl.sampling.engine`): ``diffrl`` (the built-in sampling
    loop, in the process that holds the model), ``sglang`` (sglang-diffusion servers, see
    ``docs/engines.md``), or a dotted path to an engine class of your own."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    """The engine's own settings, bound by its ``Options`` (``sglang``: the ``command`` of its
    environment or the ``urls`` of running servers, ``precision``, timeouts; see
    :class:`diffrl.sampling.sglang.SglangEngine.Options`)."""


@dataclass
class TrainConfig:
    iterations: int = 10
    batch_size: int = 16
    """Examples per optimizer step (global)."""
    micro_batch_size: int = 8
    """Examples per forward/backward; gradients accumulate over batch_size / micro_batch_size."""
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float | None = 1.0
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    ema_decay: float | None = None
    """EMA of the trainable weights (used for eval and saved with checkpoints)."""
    save_every: int = 0
    """Checkpoint every N iterations (0: only the final one)."""
    eval_every: int = 0
    """Evaluate every N iterations (0: only before and after training)."""
    time_budget_minutes: float | None = None
    """Stop after the iteration that passes this much training time (evals not counted), then
    evaluate and save as at the end of ``iterations``."""
    resume: str | None = None
    """A checkpoint of this run to continue from, at its iteration: trainable weights, optimizer
    and LR schedule, EMA and old policy. Rollout ids, prompts and noise continue as if the run
    had not stopped. The time budget counts this process's training time only. ``latest``: the
    newest verified checkpoint in the run's output folder, or a fresh start when there is none."""
    keep_last: int | None = None
    """Keep only the newest N ``step_*`` checkpoints (``final`` is always kept); ``None`` keeps all."""
    max_failed_iterations: int = 3
    """Stop the run (with an error) after this many consecutive iterations in which every
    sample's reward failed."""
    max_nonfinite_steps: int = 5
    """Stop the run (with an error naming the last good checkpoint) after this many consecutive
    optimizer steps skipped for a non-finite loss or gradient."""
    off_policy_steps: int = 0
    """0: the synchronous loop (draw, score, train, sync, draw again). 1: pipelined: the engines
    draw iteration i+1 with the weights of iteration i while the trainer ranks train on iteration
    i, so each sample is one update old when it trains (``rollout/staleness``); needs
    ``runner: ray`` and an algorithm that can learn off-policy (see ``docs/scaling.md``)."""


@dataclass
class RewardConfig:
    name: str = "ocr"
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    """Deadline for one scoring call (a micro-group); late samples are failed and counted."""


@dataclass
class EvalConfig:
    prompts: str = "builtin:tiny_text/test.txt"
    num_prompts: int | None = 64
    samples_per_prompt: int = 1
    seed: int = 1234
    batch_size: int = 32
    grid_images: int = 32
    rewards: list[RewardConfig] = field(default_factory=lambda: [RewardConfig()])
    enabled: bool = True


@dataclass
class RayConfig:
    """``runner: ray``: rollout engines, reward workers and FSDP2 trainer ranks as Ray actors."""

    address: str | None = None
    """``null``: start a local Ray cluster for this run; ``auto``: join the cluster started with
    ``ray start`` on this node; or ``host:port`` of a cluster's head."""
    num_engines: int = 1
    """Rollout engines; the micro-groups of a rollout are shared out among them."""
    num_reward_workers: int = 1
    """Actors per reward type, fed per micro-group as rollouts finish."""
    num_trainer_ranks: int = 1
    """FSDP2 ranks (one Ray actor each, in one placement group)."""
    sequence_parallel: int = 1
    """Trainer ranks per sample (Ulysses sequence parallel, for long videos): each sample's tokens
    are split over this many ranks, whose attention exchanges heads for sequence (all-to-all);
    ``num_trainer_ranks`` = data-parallel groups x this, and FSDP2 shards over all of them.
    Families whose diffusers transformer has a context-parallel plan only."""
    colocate: bool = True
    """Engine i shares rank i's device (GPU runs); false: engines get devices of their own."""
    rewards_on_gpu: bool = False
    """True: the reward workers share the ranks' GPUs (placed in their bundles, as colocated
    engines are; worker j of all goes to rank j mod ranks), for rewards with ``device: cuda``;
    false: they run on CPUs. A reward model on GPUs of its own: ``diffrl serve-reward`` and the
    ``remote`` reward."""
    backend: str | None = None
    """torch.distributed backend; ``null``: nccl on GPU, gloo on CPU."""
    cpus_per_actor: float = 1.0
    threads_per_actor: int | None = None
    """torch threads of each engine and trainer rank; ``null``: the machine's cores shared by the
    actors that compute at the same time (the larger of the engine and rank groups; both groups
    with ``train.off_policy_steps: 1``, as they then run side by side)."""


@dataclass
class Config:
    runner: str = "local"
    """``local``: one process; ``ray``: actors on a Ray cluster (see :class:`RayConfig`); or a
    dotted path to a user's runner class (see :mod:`diffrl.train.runner`)."""
    ray: RayConfig = field(default_factory=RayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rewards: list[RewardConfig] = field(default_factory=list)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def to_plain(obj: Any) -> Any:
    """Dataclasses, tuples, lists and dicts -> plain lists and dicts (what YAML and JSON write)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
