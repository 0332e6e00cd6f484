"""The actor: the trainable policy, its optimizer, and one optimizer step over micro-batches."""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Mapping

import torch
from peft import LoraConfig as PeftLoraConfig
from torch import nn

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.algorithms.returns import checked_decay, checked_examples, checked_loss, checked_metrics
from diffrl.config import Config, LoraConfig
from diffrl.core import torch_state
from diffrl.core.parallel import DistContext, full_tensor, shard_module
from diffrl.core.rollout import Conditioning, TrainExamples
from diffrl.core.user_code import kind, plugin_named, returned_wrong
from diffrl.logging import console
from diffrl.models.base import FamilyRuntime
from diffrl.models.sequence_parallel import enable_sequence_parallel
from diffrl.sampling.sampler import sampling_sigmas
from diffrl.train.ema import EMA

OLD_ADAPTER = "old"
DRIFT = "a dict of str -> float, e.g. {'monitor/kl_to_base': kl.item()}, or {} for none"


class OldPolicy:
    """A second copy of the trainable weights that trails the live ones (DiffusionNFT's sampling
    policy): ``θ_old ← d·θ_old + (1 − d)·θ`` after each rollout.

    With LoRA it is a second peft adapter (``"old"``) on the same transformer, switched in with
    ``set_adapter``; for a full fine-tune it is a frozen copy of the transformer (a trainable text
    encoder is shared, not copied).
    """

    def __init__(self, family: FamilyRuntime, lora: LoraConfig | None):
        self.family = family
        self.lora = lora is not None
        transformer = family.transformer
        if self.lora:
            with warnings.catch_warnings():  # peft warns about a second adapter: here it is the point
                warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                transformer.add_adapter(_peft_config(family, lora), adapter_name=OLD_ADAPTER)
            transformer.set_adapter("default")  # add_adapter activated the new one
            self.module = None
            self.bind()
            for live, old in self.pairs:
                old.data = live.detach().clone()
        else:
            self.module = copy.deepcopy(transformer).requires_grad_(False).eval()
            self.bind()

    def bind(self) -> None:
        """Pair each live parameter with its old copy (again after FSDP replaced the parameters)."""
        transformer = self.family.transformer
        if self.lora:
            params = dict(transformer.named_parameters())
            self.pairs = [
                (p, params[n.replace(".default.", f".{OLD_ADAPTER}.")])
                for n, p in params.items()
                if "lora_" in n and ".default." in n
            ]
        else:
            self.pairs = list(zip(transformer.parameters(), self.module.parameters()))

    @contextlib.contextmanager
    def weights(self):
        """Context yielding the module to pass as ``module=`` for a forward with the old weights."""
        if not self.lora:
            yield self.module
            return
        transformer = self.family.transformer
        transformer.set_adapter(OLD_ADAPTER)
        try:
            yield transformer
        finally:
            transformer.set_adapter("default")

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """``θ_old ← decay·θ_old + (1 − decay)·θ``."""
        for live, old in self.pairs:
            old.lerp_(live.detach().to(old.dtype), 1.0 - decay)

    @torch.no_grad()
    def deviation(self) -> float:
        """Mean squared difference between the old and the live weights."""
        total = sum((o.float() - p.float()).square().sum().item() for p, o in self.pairs)
        return total / max(1, sum(p.numel() for p, _ in self.pairs))


class Policy:
    """What an algorithm's ``compute_loss`` sees: the trainable velocity, the reference velocity
    (the base model: LoRA disabled, or a frozen copy for full fine-tunes), the old (sampling)
    policy when the algorithm keeps one, and sampling settings."""

    def __init__(
        self,
        family: FamilyRuntime,
        config: Config,
        reference: nn.Module | None = None,
        old: OldPolicy | None = None,
        sample_with_old: bool = True,
    ):
        self.family = family
        self.sigmas = sampling_sigmas(config, family)
        """The ``(num_steps + 1,)`` sampling schedule."""
        self.guidance_scale = config.sampling.guidance_scale
        self.negative_prompt = config.sampling.negative_prompt
        self.lora = config.model.lora is not None
        self._reference = reference
        self.old = old
        self.sampling_old = old if sample_with_old else None
        """The old policy when rollouts sample from it (None: they sample with the live weights)."""
        self.train_config = config.train
        self.micro_batch_count: int | None = None
        """Set on FSDP2 ranks: every rank splits its share into this many micro-batches, so all
        run the same forwards and backwards (the collectives pair up) whatever their share."""

    def micro_batches(self, examples: TrainExamples) -> list[TrainExamples]:
        """The micro-batches an update runs (``before_update`` passes use the very same)."""
        if self.micro_batch_count is not None:
            return examples.split(self.micro_batch_count)
        return examples.micro_batches(self.train_config.micro_batch_size)

    @torch.no_grad()
    def old_velocity(self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw) -> torch.Tensor:
        """The velocity of the old policy (the sampling one, or AWM's EMA anchor), no gradient."""
        if self.old is None:
            raise RuntimeError("this algorithm asked for the old policy but the actor keeps none")
        with self.old.weights() as module:
            return self.family.velocity(x_t, sigma, cond, module=module, **kw)

    def sampling_weights(self):
        """Context yielding the ``module`` rollouts sample with: the old policy when kept for
        sampling, else None (the live weights)."""
        return self.sampling_old.weights() if self.sampling_old is not None else contextlib.nullcontext(None)

    def velocity(self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw) -> torch.Tensor:
        """``x_t (B, *latent)``, ``sigma (B,)`` -> velocity ``(B, *latent)`` float32, with grad."""
        return self.family.velocity(x_t, sigma, cond, **kw)

    @torch.no_grad()
    def reference_velocity(
        self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw
    ) -> torch.Tensor:
        if self.lora:
            module = self.family.transformer
            module.disable_adapters()
            try:
                return self.family.velocity(x_t, sigma, cond, **kw)
            finally:
                module.enable_adapters()
        if self._reference is None:
            raise RuntimeError("this algorithm asked for a reference policy but the actor keeps none")
        return self.family.velocity(x_t, sigma, cond, module=self._reference, **kw)

    @property
    def has_reference(self) -> bool:
        """Whether :meth:`reference_velocity` has a base model to run: LoRA (its adapter off), or a
        full fine-tune's kept copy."""
        return self.lora or self._reference is not None

    def negative(self, cond: Conditioning) -> Conditioning | None:
        """The negative-prompt conditioning for CFG of the rows of ``cond``, one row each (None
        when CFG is off)."""
        return self.family.negative(self.negative_prompt, self.guidance_scale, cond)


def _peft_config(family: FamilyRuntime, cfg: LoraConfig):
    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        init_lora_weights=cfg.init if cfg.init == "gaussian" else True,
        target_modules=family.lora_targets(cfg.target_modules),
    )


def trainable_parameters(family: FamilyRuntime) -> list[nn.Parameter]:
    """The parameters of ``family``'s trainable module that take gradients (the optimizer's)."""
    return [p for p in family.trainable_module().parameters() if p.requires_grad]


def apply_lora(family: FamilyRuntime, cfg: LoraConfig) -> None:
    """Add a peft LoRA adapter to the transformer; only the adapter stays trainable."""
    transformer = family.transformer
    transformer.requires_grad_(False)
    transformer.add_adapter(_peft_config(family, cfg))
    for name, p in transformer.named_parameters():
        p.requires_grad_("lora_" in name)
    # LoRA weights train in float32 even when the base runs in reduced precision
    for p in trainable_parameters(family):
        p.data = p.data.float()


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return f


class Actor:
    """The trainable policy and its optimizer; one process, or one FSDP2 rank of several.

    With ``dist`` (a trainer rank), the transformer (and the frozen copies an algorithm keeps) is
    sharded with FSDP2 after the adapters are in place and before the optimizer sees the
    parameters; :meth:`train_step` then takes this rank's share of a step's examples. With
    ``dist.sequence > 1`` its attention first goes Ulysses over the sequence ranks
    (:func:`~diffrl.models.sequence_parallel.enable_sequence_parallel`): the ranks of a sequence
    group take the same examples, each computing its part of every sample's tokens.
    """

    def __init__(
        self,
        family: FamilyRuntime,
        config: Config,
        keep_reference: bool = False,
        keep_old: bool = False,
        dist: DistContext | None = None,
        sample_with_old: bool = True,
    ):
        self.family = family
        self.config = config
        self.dist = dist
        t = config.train
        reference = None
        if config.model.lora is not None:
            apply_lora(family, config.model.lora)
        else:
            if keep_reference:  # a frozen copy of the starting weights (LoRA just disables its adapter)
                reference = copy.deepcopy(family.transformer).requires_grad_(False).eval()
            family.trainable_module().requires_grad_(True)
        old = OldPolicy(family, config.model.lora) if keep_old else None
        if dist is not None and dist.world_size > 1:  # one rank holds everything: nothing to shard
            for module in (family.transformer, reference, old.module if old is not None else None):
                if module is None:
                    continue
                if dist.mesh is not None:  # Ulysses over the sequence ranks, then FSDP2 over all
                    for part in family.description.sequence_parallel_modules(module):
                        enable_sequence_parallel(part, dist.mesh)
                shard_module(module, family.description.fsdp_blocks(module))
            if old is not None:
                old.bind()
        self.params = trainable_parameters(family)
        if not self.params:
            raise ValueError("no trainable parameters: check model.lora.target_modules")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=t.lr, betas=t.adam_betas, eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.lr_schedule, t.warmup_steps, t.iterations)
        )
        self.ema = EMA(self.params, t.ema_decay) if t.ema_decay else None
        self.policy = Policy(family, config, reference, old, sample_with_old)
        self.step = 0
        self._steps_per_iteration: int | None = None
        if config.monitor.kl_every and not self.policy.has_reference and (dist is None or dist.rank == 0):
            console(
                "note: monitor/kl_to_base is measured only by runs with LoRA (model.lora) or a KL in "
                "their loss: a full fine-tune keeps no copy of the base model for the monitor alone "
                "(it would cost the transformer's memory again)"
            )

    @property
    def module(self) -> nn.Module:
        return self.family.trainable_module()

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.params)

    def eval_weights(self):
        """Context in which the live weights are the ones to evaluate (EMA if enabled)."""
        return self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()

    def update_old_policy(self, algorithm: DiffusionAlgorithm) -> dict[str, float]:
        """After an iteration: move the old (sampling) policy towards the live one, if kept."""
        if self.policy.old is None:
            return {}
        with torch_state.guarding(lambda: plugin_named(algorithm)):
            decay = checked_decay(algorithm, algorithm.old_policy_decay(self.step))
        self.policy.old.update(decay)
        return {"train/old_policy_decay": decay}

    @torch.no_grad()
    def before_update(self, examples: TrainExamples, algorithm: DiffusionAlgorithm) -> TrainExamples:
        """The algorithm's pre-update pass, with the weights and mode the update starts from."""
        self.module.train()
        with torch_state.guarding(lambda: plugin_named(algorithm)):
            out = algorithm.before_update(self.policy, examples.to(self.family.device))
        return checked_examples(algorithm, "before_update()", out)

    def optimize(
        self,
        chunks: list[TrainExamples],
        algorithm: DiffusionAlgorithm,
        totals: list[int] | None = None,
        counts: list[int] | None = None,
    ) -> list[dict[str, float]]:
        """One optimizer step per chunk, after the algorithm's ``before_update`` pass over all of
        them (with the weights the update starts from); their metrics. On a trainer rank,
        ``totals[i]`` is step i's example count over all ranks and ``counts[i]`` the number of
        micro-batches every rank splits its share into."""
        totals = totals or [None] * len(chunks)
        counts = counts or [None] * len(chunks)
        try:
            t0 = time.perf_counter()
            prepared = []
            for chunk, count in zip(chunks, counts):
                self.policy.micro_batch_count = count
                prepared.append(self.before_update(chunk, algorithm))
            before = (time.perf_counter() - t0) / max(1, len(chunks))
            drift = {}
            if prepared and self.drift_due(len(prepared), algorithm):
                self.policy.micro_batch_count = counts[0]
                drift = self.drift(prepared[0], algorithm)
                if drift:  # its time shared out over the steps as before_update's, its value on
                    # each step (an iteration's steps all log the same keys)
                    drift["perf/kl_to_base_time"] /= len(prepared)
            out = []
            for chunk, total, count in zip(prepared, totals, counts):
                self.policy.micro_batch_count = count
                # before_update's time shared out over the steps, so that their sum is its total
                step = self.train_step(chunk, algorithm, total)
                out.append({**step, "perf/before_update_time": before, **drift})
            return out
        finally:
            self.policy.micro_batch_count = None

    def drift_due(self, steps: int, algorithm: DiffusionAlgorithm) -> bool:
        """Whether the update of ``steps`` optimizer steps about to run measures the policy's drift
        (``monitor.kl_every``): the iterations whose end is a multiple of ``kl_every``, counted in
        optimizer steps (``rollout.num_steps_per_rollout`` per online iteration), so that a resumed
        run measures where an uninterrupted one does. Never when the algorithm's loss has the KL
        (it logs it) or there is no base model to compare with (a full fine-tune without a kept copy)."""
        every = self.config.monitor.kl_every
        if not every or algorithm.needs_reference or not self.policy.has_reference:
            return False
        if self._steps_per_iteration is None:
            with torch_state.guarding(lambda: plugin_named(algorithm)):
                online = algorithm.collection_spec().online
            self._steps_per_iteration = self.config.rollout.num_steps_per_rollout if online else 1
        span = every * self._steps_per_iteration
        return (self.step + steps) // span > self.step // span

    @torch.no_grad()
    def drift(self, examples: TrainExamples, algorithm: DiffusionAlgorithm) -> dict[str, float]:
        """The algorithm's :meth:`~DiffusionAlgorithm.drift` on the first micro-batch of
        ``examples``, with the weights and mode the update starts from, the random state restored
        after (a model with dropout draws in its forwards) so the run goes on exactly as without
        it; plus ``perf/kl_to_base_time``. On trainer ranks every rank measures its own first
        micro-batch (the forwards pair up) and the result is their mean weighted by rows."""
        t0 = time.perf_counter()
        self.module.train()
        mb = self.policy.micro_batches(examples)[0].to(self.family.device)
        device = torch.device(self.family.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with torch_state.guarding(lambda: plugin_named(algorithm)):
                out = algorithm.drift(self.policy, mb)
        if not isinstance(out, Mapping):
            raise returned_wrong(algorithm, "drift()", kind(out), DRIFT)
        metrics = checked_metrics(algorithm, "drift()", out, finite=False)
        if not metrics:  # the algorithm measures none (the default hook)
            return {}
        if self.dist is not None:
            keys = sorted(metrics)
            reduced = self.dist.sum([float(len(mb)), *(metrics[k] * len(mb) for k in keys)])
            metrics = {k: v / reduced[0] for k, v in zip(keys, reduced[1:])}
        self._device_done()
        return {**metrics, "perf/kl_to_base_time": time.perf_counter() - t0}

    def train_step(
        self,
        examples: TrainExamples,
        algorithm: DiffusionAlgorithm,
        total: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over ``examples``, accumulated in micro-batches.

        Each micro-batch loss is weighted by its share of the step's ``total`` examples (default:
        ``len(examples)``; on a trainer rank, the count over all ranks), so the gradient equals
        that of the mean loss over all of them whatever the micro-batch size or the number of
        ranks. A non-finite loss or gradient skips the step (``train/skipped_nonfinite``).
        """
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = total or len(examples)
        world = self.dist.world_size if self.dist is not None else 1
        sums: dict[str, float] = {}
        loss_sum = 0.0
        finite = True
        t0, flops0 = time.perf_counter(), self.family.meter.flops
        for mb in self.policy.micro_batches(examples):
            mb = mb.to(self.family.device)
            with torch_state.guarding(lambda: plugin_named(algorithm)):
                out = algorithm.compute_loss(self.policy, mb)
            loss, metrics = checked_loss(algorithm, out)
            share = len(mb) / total
            if not torch.isfinite(loss):
                finite = False
                if self.dist is None:
                    break
                # every rank must run the same backward passes (FSDP collectives); the NaN
                # gradient then skips the step on all of them
            # FSDP averages gradients over all ranks: scale back up to the sum of the shares (a
            # sequence group's ranks each hold the gradient of their tokens: these add up too)
            (loss * share * world).backward()
            loss_sum += loss.item() * share
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * share
        if self.dist is not None:
            keys = sorted(sums)
            reduced = self.dist.sum([loss_sum, *(sums[k] for k in keys)])
            loss_sum, sums = reduced[0], dict(zip(keys, reduced[1:]))
            finite = self.dist.all(finite)
        self._device_done()
        t1 = time.perf_counter()
        grad_norm = float("nan")
        if finite:
            clip = self.config.train.grad_clip
            norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip else float("inf"))
            grad_norm = float(full_tensor(norm))
            finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            if self.ema is not None:
                self.ema.update()
        else:
            warnings.warn(
                f"step {self.step}: non-finite loss or gradient, optimizer step skipped", stacklevel=2
            )
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._device_done()
        return {
            "train/loss": loss_sum if finite else float("nan"),
            **sums,
            "train/grad_norm": grad_norm,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/skipped_nonfinite": 0.0 if finite else 1.0,
            "perf/train_forward_backward_time": t1 - t0,  # the micro-batches' losses and backward
            "perf/optimizer_time": time.perf_counter() - t1,  # clipping, the step, the EMA
            "perf/train_flops": self.family.meter.flops - flops0,  # model FLOPs of those forwards
        }

    def _device_done(self) -> None:
        """Wait for the device (CUDA runs ahead of the host), so that a stage's time is its own."""
        if torch.device(self.family.device).type == "cuda":
            torch.cuda.synchronize(self.family.device)
