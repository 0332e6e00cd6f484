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
from typing import Annotated, Any, Literal

from diffrl.core.errors import quoted
from diffrl.core.pins import DEFAULT_MODE


@dataclass(frozen=True)
class Range:
    """The values a numeric field takes, declared on its type: ``Annotated[int, Range(1, 1000)]``.
    The binder (:mod:`diffrl.config.binding`) checks every value against it and says the range in
    its message. Every bound is finite (no field takes inf or NaN), and every count has an upper
    bound, so a value that would allocate without limit (a LoRA rank of 10^9) is refused before
    anything loads, with the limit in the message (the limits are listed in
    ``docs/configuration.md``)."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    hint: str = ""
    """Said after the range: an example, or what the ends mean (``0: none``)."""
    shown: str = ""
    """Shown instead of the bounds (``[-2**63, 2**64 - 1] (torch's seed range)``)."""

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def text(self) -> str:
        """``in (0, 1] (e.g. 1e-4)``."""
        bounds = self.shown or (
            f"in {'(' if self.lo_open else '['}{_number(self.lo)}, {_number(self.hi)}{')' if self.hi_open else ']'}"
        )
        return f"{bounds} ({self.hint})" if self.hint else bounds


@dataclass(frozen=True)
class FolderName:
    """A string field that names one folder (``run.name``: ``runs/<name>``), declared on its type:
    ``Annotated[str, FolderName()]``. The binder refuses what is no single folder name on every
    file system: blank, ``.`` or ``..``, a path separator, a control character, spaces at either
    end (invisible in a listing), more than :attr:`max_bytes` bytes of UTF-8."""

    max_bytes: int = 255
    example: str = "my_run"

    def problem(self, where: str, value: str) -> str | None:
        """What makes ``value`` no folder name, naming ``where`` and the fix; None when it is one."""
        fix, got = f"e.g. {where}={self.example}", quoted(value)
        if not value.strip():
            return f"{where} must not be empty or blank (it names a folder), got {got}; {fix}"
        if value in (".", ".."):
            return f"{where} must not be {got} (it names a folder of its own); {fix}"
        if bad := [c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127][:1]:
            what = "a path separator" if bad[0] in "/\\" else "a control character"
            return (
                f"{where} names one folder: it must not hold {bad[0]!r} ({what}), got {got}; {fix} "
                "(run.output_dir puts the run anywhere)"
            )
        if value != value.strip():
            return (
                f"{where} starts or ends with a space (invisible in a folder listing), got {got}: remove it"
            )
        size = len(value.encode("utf-8", "replace"))
        if size > self.max_bytes:
            return f"{where} names the run's folder: at most {self.max_bytes} bytes, got {size:,}: {got}"
        return None


def _number(x: float) -> str:
    if isinstance(x, int):
        return f"{x:_}" if abs(x) >= 1_000_000 else str(x)
    return f"{x:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")  # 1e6, 1e-8


MAX_COUNT = 10**9
"""Iterations, steps between saves or evals: at most this many (a run of 10^9 iterations is already
beyond any budget; a bound keeps a typo of 10^20 from reaching the code)."""
MAX_BATCH = 65_536
"""Prompts, samples or examples held at once (a rollout, a micro-batch, an eval batch)."""
MAX_SIDE = 16_384
"""Pixels of an image's side (``sampling.height/width``); a family narrows it to what it can draw."""
Seed = Annotated[int, Range(-(2**63), 2**64 - 1, shown="in [-2**63, 2**64 - 1] (torch's seed range)")]
Count = Annotated[int, Range(1, MAX_COUNT)]
Batch = Annotated[int, Range(1, MAX_BATCH)]
Every = Annotated[int, Range(0, MAX_COUNT, hint="0: none")]
Fraction = Annotated[float, Range(0, 1, hi_open=True)]
Beta = Annotated[float, Range(0, 1, hi_open=True, hint="e.g. [0.9, 0.999]")]
ImagesPerForward = Annotated[int, Range(1, 4096, hint="images per forward pass")]
"""A reward's ``batch_size`` param."""


@dataclass
class RunConfig:
    name: Annotated[str, FolderName()] = "diffrl"
    """The run's folder name (``runs/<name>`` unless ``output_dir``): one folder name, not a path."""
    output_dir: str | None = None
    """Where checkpoints, metrics and images go; default ``runs/<name>``."""
    seed: Seed = 0
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    log_every: Annotated[int, Range(1, MAX_COUNT, hint="print every N iterations")] = 1
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where the metrics go: ``jsonl`` (``RUN_DIR/metrics.jsonl``; always written, listed or not),
    ``tensorboard`` (event files in ``RUN_DIR/tensorboard``; ``pip install 'diffrl[tensorboard]'``),
    ``wandb`` (a W&B run, files in ``RUN_DIR/wandb``; ``pip install 'diffrl[wandb]'``,
    ``WANDB_MODE=offline`` without a network), or a dotted path to a class of your own (see
    ``diffrl.logging.trackers``). Each gets every metric of every step, the eval grids, the config
    and the batch arithmetic."""
    wandb_project: str = "diffrl"
    """The W&B project a ``wandb`` logger files the run in (the W&B run's name is ``run.name``)."""
    peak_tflops: Annotated[float, Range(0, 100_000, lo_open=True, hint="or null")] | None = None
    """The device's peak TFLOP/s for ``perf/*_mfu``; ``None``: the datasheet figure for known GPUs
    (bf16 dense under autocast, else fp32), otherwise a matmul measured after the first iteration."""
    deterministic: bool | Literal["portable"] = DEFAULT_MODE
    """Same inputs, same bits, also on a busy machine: a fixed thread count per process, MKL's dynamic
    threading off, the CPU kernels of MKL, oneDNN and ATen pinned (``MKL_CBWR``, ``ONEDNN_MAX_CPU_ISA``,
    ``ATEN_CPU_CAPABILITY``), and cuBLAS/cuDNN's deterministic settings on a GPU, in the driver,
    reward workers and Ray actors (:mod:`diffrl.core.determinism`; what it cannot promise:
    ``docs/reproducibility.md``). ``true`` (the default): this CPU kind's own level (the same bits on
    CPUs of one vendor and ISA level; on a CPU with AMX it gives up AMX for bf16 autocast);
    ``portable``: a level every x86-64 CPU with AVX2 and FMA shares, so the same bits on any such CPU,
    Intel or AMD, AVX2 or AVX-512, at about twice the time of a CPU run (MKL's compatible branch);
    ``false``: the libraries choose. Measured cost: ``benchmarks/determinism.py``
    (``docs/reproducibility.md``)."""
    threads: Annotated[int, Range(1, 4096, hint="torch threads, or null for torch's own count")] | None = None
    """torch threads of the driver process (fixed for the run); ``None``: what torch starts with
    (``OMP_NUM_THREADS``, else the cores this process may use). Ray actors: ``ray.threads_per_actor``."""

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


@dataclass
class LoraConfig:
    rank: Annotated[int, Range(1, 4096)] = 8
    """At most 4096 (no transformer's hidden size is larger; a rank past it adds only memory)."""
    alpha: Annotated[float, Range(0, 1e6, lo_open=True, hint="e.g. twice the rank")] = 16.0
    dropout: Fraction = 0.0
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
    num_steps: Annotated[int, Range(1, 1000)] = 10
    """At most 1000 (the training schedule of every family has 1000 timesteps)."""
    shift: Annotated[float, Range(0, 100, lo_open=True, hint="e.g. 3.0, or null for the family's")] | None = (
        None
    )
    """A static schedule shift (SD3's ``shift``); ``None`` takes the schedule of the family's own
    pipeline (SD3, tiny: 3.0; Wan: the folder's ``flow_shift``; FLUX, Qwen-Image: shifted by the
    image's token count)."""
    guidance_scale: Annotated[float, Range(0, 100, hint="or null for the family's")] | None = None
    """Classifier-free guidance with ``negative_prompt`` (1 disables it; 0 for Z-Image, which guides
    as ``pos + s * (pos - neg)``); ``None`` takes the family's
    default. FLUX.1 [dev]'s distilled guidance is a model option (``model.options.guidance``)."""
    negative_prompt: str = ""
    height: Annotated[int, Range(1, MAX_SIDE, hint="pixels, or null for the family's default")] | None = None
    """``None`` takes the family's default size."""
    width: Annotated[int, Range(1, MAX_SIDE, hint="pixels, or null for the family's default")] | None = None


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
    dataset_size: Annotated[int, Range(1, 10**7, hint="or null for one example per prompt")] | None = None
    """Synthetic datasets: number of distinct examples (``None``: one per train prompt)."""


@dataclass
class RolloutConfig:
    """Online collection. ``batch_size x n_samples_per_prompt`` samples per rollout must equal
    ``train.batch_size x num_steps_per_rollout`` (samples per optimizer step x optimizer steps)."""

    batch_size: Batch = 8
    """Prompts per rollout (one group of samples each)."""
    n_samples_per_prompt: Batch = 4
    micro_group_size: Annotated[int, Range(1, MAX_BATCH, hint="or null")] | None = None
    """Samples per sampling forward; ``None`` takes ``train.micro_batch_size`` (then the first
    replay in training runs the very same forwards as the rollout, bit for bit)."""
    num_steps_per_rollout: Batch = 1
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
    iterations: Count = 10
    batch_size: Annotated[int, Range(1, 2**20)] = 16
    """Examples per optimizer step (global)."""
    micro_batch_size: Batch = 8
    """Examples per forward/backward; gradients accumulate over batch_size / micro_batch_size."""
    lr: Annotated[float, Range(0, 1, lo_open=True, hint="e.g. 1e-4")] = 1e-4
    weight_decay: Annotated[float, Range(0, 1, hint="AdamW's decoupled decay; e.g. 0.01")] = 0.0
    adam_betas: tuple[Beta, Beta] = (0.9, 0.999)
    adam_eps: Annotated[float, Range(0, 1, lo_open=True, hi_open=True, hint="e.g. 1e-8")] = 1e-8
    grad_clip: (
        Annotated[float, Range(0, 1e6, lo_open=True, hint="a max gradient norm, or null for none")] | None
    ) = 1.0
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: Every = 0
    ema_decay: (
        Annotated[float, Range(0, 1, lo_open=True, hi_open=True, hint="e.g. 0.99, or null for no EMA")] | None
    ) = None
    """EMA of the trainable weights (used for eval and saved with checkpoints)."""
    save_every: Every = 0
    """Checkpoint every N iterations (0: only the final one)."""
    eval_every: Every = 0
    """Evaluate every N iterations (0: only before and after training)."""
    time_budget_minutes: Annotated[float, Range(0, 1e7, lo_open=True, hint="or null for none")] | None = None
    """Stop after the iteration that passes this much training time (evals not counted), then
    evaluate and save as at the end of ``iterations``."""
    resume: str | None = None
    """A checkpoint of this run to continue from, at its iteration: trainable weights, optimizer
    and LR schedule, EMA and old policy. Rollout ids, prompts and noise continue as if the run
    had not stopped. The time budget counts this process's training time only. ``latest``: the
    newest verified checkpoint in the run's output folder, or a fresh start when there is none."""
    keep_best: KeepBestConfig | None = None
    """Keep the best checkpoint by a paired eval (``checkpoints/best``); see :class:`KeepBestConfig`."""
    keep_last: Annotated[int, Range(1, 10**6, hint="or null to keep all")] | None = None
    """Keep only the newest N ``step_*`` checkpoints (``final`` is always kept); ``None`` keeps all."""
    max_failed_iterations: Annotated[int, Range(1, 10**6)] = 3
    """Stop the run (with an error) after this many consecutive iterations in which every
    sample's reward failed."""
    max_nonfinite_steps: Annotated[int, Range(1, 10**6)] = 5
    """Stop the run (with an error naming the last good checkpoint) after this many consecutive
    optimizer steps skipped for a non-finite loss or gradient."""
    off_policy_steps: Annotated[
        int,
        Range(
            0,
            1,
            hint="0: synchronous, 1: rollout one iteration ahead; one rollout in flight already hides "
            "the shorter of rollout and training, more would only add staleness",
        ),
    ] = 0
    """0: the synchronous loop (draw, score, train, sync, draw again). 1: pipelined: the engines
    draw iteration i+1 with the weights of iteration i while the trainer ranks train on iteration
    i, so each sample is one update old when it trains (``rollout/staleness``); needs
    ``runner: ray`` and an algorithm that can learn off-policy (see ``docs/scaling.md``)."""


@dataclass
class RewardConfig:
    name: str = "ocr"
    weight: Annotated[float, Range(-1e6, 1e6, hint="e.g. 1.0")] = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: Annotated[float, Range(0, 604_800, lo_open=True, hint="seconds, at most a week")] = 300.0
    """Deadline for one scoring call (a micro-group); late samples are failed and counted."""


@dataclass
class MonitorConfig:
    """The collapse alarm of the per-iteration diversity monitors (:mod:`diffrl.trust.monitors`),
    and how often the policy's drift from the base is measured."""

    near_duplicate_std: Annotated[float, Range(0, 255, hint="uint8 levels, e.g. 2.0")] = 2.0
    """A prompt group whose within-group pixel std (uint8 levels, images pooled to 64 px) is below
    this counts as near duplicates."""
    collapse_share: Annotated[float, Range(0, 1, lo_open=True, hint="a share of the groups, e.g. 0.5")] = 0.5
    """``alarm/collapse`` fires (with a warning) when at least this share of the groups are near
    duplicates."""
    collapse_relative: Annotated[
        float, Range(0, 1, hi_open=True, hint="a share of the first rollout's spread, e.g. 0.5; 0: off")
    ] = 0.5
    """A group also counts as near duplicates when its within-group std is below this share of the
    run's first rollout's ``monitor/within_group_std`` (the base model's own spread, kept in the
    checkpoint): a threshold that scales with the model's own spread. 0: only ``near_duplicate_std``.
    Half (``docs/results/hacking.md``): the hacked runs' groups fall to a quarter-third of the base's
    spread, regularised and honest runs keep five sixths of it or more."""
    kl_every: Annotated[int, Range(0, MAX_COUNT, hint="iterations; 0: never")] = 5
    """Policy drift for runs whose loss has no KL to the base: every this many iterations, log
    ``monitor/kl_to_base`` (the KL the algorithm's ``kl_beta`` would penalise, in its units) on the
    iteration's first micro-batch, measured without gradients before its update (it changes nothing
    the run computes). Runs with the KL in their loss log it every iteration anyway. A full
    fine-tune (no LoRA) keeps no copy of the base for it, so does not measure it."""
    clip: str | None = None
    """A local ``CLIPModel`` folder whose image embeddings give ``monitor/clip_within_group_dist``
    and ``monitor/clip_across_prompt_dist`` (the monitor loads its own copy in the trainer
    process); ``None``: with ``clip_every`` set, the CLIP of the first ``pickscore``,
    ``clip_score`` or ``aesthetic`` reward in ``rewards``."""
    clip_processor: str | None = None
    """The folder of ``clip``'s image processor config; ``None``: ``clip`` itself (or the reward's
    ``processor`` folder, as PickScore_v1 ships none)."""
    clip_every: (
        Annotated[int, Range(0, MAX_COUNT, hint="iterations; 0 turns the CLIP monitor off")] | None
    ) = None
    """Embed the rollout's images every N iterations (0: never); ``None``: every iteration when
    ``clip`` names a folder, else never (the CLIP monitor is opt-in: it costs a CLIP's memory and
    forwards)."""
    clip_device: str | None = None
    """Where the monitor's CLIP runs (``cpu``, ``cuda``, ``cuda:N`` or ``auto``); ``None``:
    ``run.device``. It runs in float32, under no_grad, at most 32 images per forward."""

    def clip_interval(self) -> int:
        """``clip_every`` with its default filled: 1 when ``clip`` names a folder, else 0 (off)."""
        if self.clip_every is None:
            return 1 if self.clip is not None else 0
        return self.clip_every


@dataclass
class EvalConfig:
    prompts: str = "builtin:tiny_text/test.txt"
    num_prompts: Annotated[int, Range(1, 10**7, hint="or null for every prompt of the file")] | None = 64
    samples_per_prompt: Annotated[int, Range(1, 4096)] = 1
    seed: Seed = 1234
    batch_size: Batch = 32
    grid_images: Annotated[int, Range(1, 1024)] = 32
    rewards: list[RewardConfig] = field(default_factory=lambda: [RewardConfig()])
    enabled: bool = True
    watch: list[RewardConfig] = field(default_factory=list)
    """Held-out judges: rewards scored on every eval's samples and never trained on (nor in the eval
    total); each is logged as ``eval/watch/<label>_mean`` with its paired gain over the first eval
    (``_gain``, ``_gain_se``). ``weight`` is not used."""
    watch_alarm: WatchAlarmConfig | None = None
    """Warn (and optionally stop) when the eval total rises while a watched reward falls."""


@dataclass
class WatchAlarmConfig:
    """The reward-hacking alarm (``eval.watch_alarm``): at each eval, paired (same prompts and
    seeds) against the run's first eval and against the eval ``window`` evals earlier, it fires when
    the eval total rose by more than ``k_se`` of its paired standard error while a watched reward
    fell by more than ``k_se`` of its own and by more than ``min_drop``."""

    k_se: Annotated[float, Range(0, 1000, lo_open=True, hint="e.g. 2.0")] = 2.0
    min_drop: Annotated[float, Range(0, 1e6, hint="in the watched reward's units, e.g. 0.05")] = 0.05
    """The smallest fall of a watched reward that is an alarm, in its own units: a significance
    test alone fires on any trade-off a large eval can resolve (``docs/results/hacking.md``: with
    no floor it fired in every variant, the regularised ones included). The default suits rewards
    on a 0-1 scale (OCR, PickScore / 26, CLIP / 30, contrast); set it for others (aesthetic's
    1-10, JPEG kB)."""
    window: Annotated[int, Range(1, 10**6, hint="evals back to compare with")] = 1
    stop: bool = False
    """True: the run stops at the eval where it fires, as at the time budget (eval, save, report)."""


@dataclass
class KeepBestConfig:
    """``train.keep_best``: every ``every`` iterations an eval (paired with the best so far: same
    prompts and seeds); ``checkpoints/best`` moves to the new weights only when they beat the best
    by more than the paired standard error."""

    metric: str = "eval/reward_mean"
    """An eval metric: ``eval/reward_mean`` (the eval total), ``eval/<label>_mean`` (one of
    ``eval.rewards``) or ``eval/watch/<label>_mean`` (one of ``eval.watch``)."""
    every: Annotated[int, Range(1, MAX_COUNT)] = 1


@dataclass
class ParallelConfig:
    """How a run's work is laid out over processes, whichever runner places them (``runner: ray``
    does; ``runner: local`` is one process, so every count here is 1 there)."""

    trainer_ranks: Batch = 1
    """FSDP2 ranks (under Ray: one actor each, in one placement group)."""
    sequence: Annotated[int, Range(1, 1024)] = 1
    """Trainer ranks per sample (Ulysses sequence parallel, for long videos): each sample's tokens
    are split over this many ranks, whose attention exchanges heads for sequence (all-to-all);
    ``trainer_ranks`` = data-parallel groups x this, and FSDP2 shards over all of them.
    Families whose diffusers transformer has a context-parallel plan only."""
    engines: Annotated[int, Range(1, 4096)] = 1
    """Rollout engines; the micro-groups of a rollout are shared out among them."""


MOVED = {
    "ray.num_engines": "parallel.engines",
    "ray.num_trainer_ranks": "parallel.trainer_ranks",
    "ray.sequence_parallel": "parallel.sequence",
}
"""Keys that moved: the old spelling -> the new one (a config with the old one is refused, naming
the new)."""


@dataclass
class RayConfig:
    """``runner: ray``: where the actors run (the cluster's address, their resources and threads);
    how many there are is :class:`ParallelConfig`'s."""

    address: str | None = None
    """``null``: start a local Ray cluster for this run; ``auto``: join the cluster started with
    ``ray start`` on this node; or ``host:port`` of a cluster's head."""
    num_reward_workers: Annotated[int, Range(1, 4096)] = 1
    """Actors per reward type, fed per micro-group as rollouts finish."""
    colocate: bool = True
    """Engine i shares rank i's device (GPU runs); false: engines get devices of their own."""
    rewards_on_gpu: bool = False
    """True: the reward workers share the ranks' GPUs (placed in their bundles, as colocated
    engines are; worker j of all goes to rank j mod ranks), for rewards with ``device: cuda``;
    false: they run on CPUs. A reward model on GPUs of its own: ``diffrl serve-reward`` and the
    ``remote`` reward."""
    backend: str | None = None
    """torch.distributed backend; ``null``: nccl on GPU, gloo on CPU."""
    cpus_per_actor: Annotated[float, Range(0, 1024)] = 1.0
    threads_per_actor: Annotated[int, Range(1, 4096, hint="or null")] | None = None
    """torch threads of each engine and trainer rank; ``null``: the machine's cores shared by the
    actors that compute at the same time (the larger of the engine and rank groups; both groups
    with ``train.off_policy_steps: 1``, as they then run side by side)."""


@dataclass
class Config:
    runner: str = "local"
    """``local``: one process; ``ray``: actors on a Ray cluster (see :class:`RayConfig`); or a
    dotted path to a user's runner class (see :mod:`diffrl.train.runner`)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
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
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

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
