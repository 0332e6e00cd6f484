"""``diffrl plan``: a trainer rank's peak memory and an iteration's FLOPs for a recipe, predicted
before renting anything, for real model sizes and no weights.

Nothing here is a hand formula. The family builds its trainable transformer on the meta device from
the model's JSON files (:meth:`~diffrl.models.base.FamilyDescription.planned`); the planner adds the
recipe's peft LoRA (and the old policy's adapter when the algorithm keeps one), gradient
checkpointing, Ulysses sequence parallel and FSDP2 over the trainer ranks as the actor does, then runs
one micro-batch's forward, backward and AdamW step on fake tensors (``FakeTensorMode``: shapes and
dtypes, no storage) against a fake process group of the run's world size (this process plays rank
0). torch's own tools measure it: ``FSDPMemTracker`` / ``MemTracker``
(``torch.distributed._tools``) the memory by kind, ``torch.utils.flop_counter``'s per-op formulas
the FLOPs (in the same pass).

What it does not hold: the frozen text encoders and VAE a rank also loads (their JSON files are not
shipped: add them to the folder to plan a local copy), the rollout engines' memory, allocator
fragmentation and the CUDA context (~0.5-1 GB per GPU).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig as PeftLoraConfig
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, ParallelConfig
from diffrl.core.errors import DiffrlError
from diffrl.core.parallel import sequence_mesh
from diffrl.models.base import SHIPPED_CONFIGS, FamilyDescription, Planned
from diffrl.models.numerics import GPU_PEAK_TFLOPS
from diffrl.models.registry import FAMILIES
from diffrl.models.sequence_parallel import enable_sequence_parallel

GiB = 2**30


class PlanError(DiffrlError, ValueError):
    """The recipe cannot be planned (no JSON files for its model, a family that cannot plan yet)."""


@dataclass
class RankMemory:
    """A trainer rank's memory at its peak (bytes), by kind (``FSDPMemTracker``'s categories)."""

    parameters: int
    """This rank's shards of every parameter (frozen base, LoRA, the old policy's adapter)."""
    gathered: int
    """Parameters all-gathered by FSDP2 for the blocks running (and their buffers)."""
    gradients: int
    optimizer: int
    activations: int
    temporary: int
    """Gradients of activations and other short-lived tensors of the backward."""
    peak: int
    """The sum at the peak (what the device must hold for tensors)."""


@dataclass
class Plan:
    """What ``diffrl plan`` prints."""

    model: str
    source: str
    parameters: int
    trainable: int
    latent: tuple[int, ...]
    rows: int
    """Rows of one training micro-batch through the transformer (samples x 2 with CFG; the memory
    of a family's further guidance passes, e.g. LTX-2's isolation pass, is not in the peak)."""
    ranks: int
    sequence: int
    memory: RankMemory
    forward_flops_per_sample: float
    """One rollout step of one sample (both CFG rows)."""
    rollout_flops: float
    """One iteration's rollout: samples x steps x the above."""
    train_flops: float
    """One iteration's training: examples x (forward + backward, and the no-grad forwards)."""
    samples: int
    steps: int
    examples: int
    engines: int


def model_folder(config: Config) -> tuple[Path, str]:
    """The folder whose JSON files describe ``model.path``'s model, and where it came from: the
    path itself when it holds ``transformer/config.json``, else the shipped folder named as its
    last part (``diffrl/models/assets/configs``)."""
    path = config.model.path
    if path in ("base", "random"):  # built in code: the family's planned() reads no folder
        return SHIPPED_CONFIGS / "none", f"built-in ({path})"
    local = Path(path)
    if (local / "transformer" / "config.json").is_file():
        return local, f"{path} (its JSON files)"
    shipped = SHIPPED_CONFIGS / local.name
    if (shipped / "transformer" / "config.json").is_file():
        return shipped, f"shipped configs of {local.name} (no weights)"
    known = sorted(p.name for p in SHIPPED_CONFIGS.iterdir() if p.is_dir())
    raise PlanError(
        f"model.path: {path!r} has no transformer/config.json here, and no shipped configs are named "
        f"{local.name!r}; copy the model's JSON files (weights not needed) into a folder and set "
        f"model.path to it, or name one of: {', '.join(known)}"
    )


class _GlobalPeakOnly:
    """A ``MemTracker`` that keeps the peak of the whole step (what :func:`measure` reads) and not
    each module's: torch's ``_update_peak_stats`` walks every module seen so far on every op (a
    weak-keyed dictionary, ~200 modules x ~16,000 ops on the tiny model: 10 of a plan's 14 CPU
    seconds). The whole-step peak is updated as torch updates it."""

    def _update_peak_stats(self, peak_state: object) -> None:
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)


class _FrozenAwareMemTracker(_GlobalPeakOnly, MemTracker):
    """``MemTracker`` for a module with frozen parameters: its gradient hooks go on trainable
    parameters only (torch 2.13 registers one on every parameter, which a frozen one refuses)."""

    def _track_module_params_and_buffers(
        self, module: nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        params = buffers = 0
        for p in module.parameters():
            params += sum(w.mem_consumed for w in self._update_and_maybe_create_winfos(p, _MemRefType.PARAM))
            if p.requires_grad and install_grad_hooks and self._param_to_grad_hook_handles.get(p) is None:

                def seen(q: torch.Tensor) -> None:
                    self._update_and_maybe_create_winfos(q.grad, _MemRefType.GRAD)

                handle = p.register_post_accumulate_grad_hook(seen)
                self._param_to_grad_hook_handles[p] = (handle, handle)
        for b in module.buffers():
            buffers += sum(
                w.mem_consumed for w in self._update_and_maybe_create_winfos(b, _MemRefType.BUFFER)
            )
        return params, buffers


class _IdleUnitsFSDPMemTracker(_GlobalPeakOnly, FSDPMemTracker):
    """``FSDPMemTracker`` for a module with FSDP units that run no forward (the Wan 2.2 expert a
    micro-batch does not route to): torch 2.13's post-backward wrapper reads every parameter's
    unsharded copy, which a unit never gathered lacks; such a unit's post-backward runs untracked
    (it has no gradient to count)."""

    def _fsdp_param_group_post_backward(self, fsdp_mod, orig_fsdp_param_group_post_backward):
        tracked = super()._fsdp_param_group_post_backward(fsdp_mod, orig_fsdp_param_group_post_backward)

        def post_backward(*args, **kwargs):
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            if group is not None and any(not hasattr(p, "_unsharded_param") for p in group.fsdp_params):
                return orig_fsdp_param_group_post_backward(*args, **kwargs)
            return tracked(*args, **kwargs)

        return post_backward


class _OpFlops(TorchDispatchMode):
    """FLOPs of the ops run inside, by torch's own per-op formulas (``torch.utils.flop_counter``'s
    registry, what ``FlopCounterMode`` sums). Not ``FlopCounterMode`` itself: its per-module
    attribution hooks keep gradient-checkpointed blocks' tensors alive (measured on Wan 2.2 A14B:
    332 GiB of activations against 22), so it cannot run inside the memory pass."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def _lora(module: nn.Module, description: type[FamilyDescription], config: Config, keep_old: bool) -> None:
    """peft LoRA as :func:`~diffrl.train.actor.apply_lora` adds it (float32 adapters), and the old
    policy's second adapter when the algorithm keeps one."""
    cfg = config.model.lora
    targets = description.lora_targets_of(module, cfg.target_modules)
    peft = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets)
    module.requires_grad_(False)
    module.add_adapter(peft)
    if keep_old:
        module.add_adapter(copy.deepcopy(peft), adapter_name="old")
        module.set_adapter("default")
    for name, p in module.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
            p.requires_grad_(name.count(".default.") > 0)


def _category(snapshot: dict, *names: str) -> int:
    return sum(v for k, v in snapshot.items() if k != "Total" and str(getattr(k, "value", k)) in names)


def measure(
    config: Config,
    planned: Planned,
    description: type[FamilyDescription],
    algorithm: DiffusionAlgorithm,
    layout: ParallelConfig,
) -> Plan:
    """One micro-batch's step on fake tensors (see the module's docstring), for the ranks and
    engines of ``layout``."""
    ranks, sequence = layout.trainer_ranks, layout.sequence
    cost = algorithm.train_cost()
    guidance = config.sampling.guidance_scale
    cfg_on = guidance is not None and guidance > getattr(description, "no_guidance_scale", 1.0)
    rows = config.train.micro_batch_size * (2 if cfg_on and cost.guided else 1)
    module = planned.module
    lora = config.model.lora is not None
    if lora:
        _lora(module, description, config, algorithm.keeps_old_policy)
    else:
        module.requires_grad_(True)
    parameters = sum(p.numel() for n, p in module.named_parameters() if ".old." not in n)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    copies = 0  # a full fine-tune's frozen copies: the reference and the old policy
    if not lora:
        copies = int(bool(algorithm.needs_reference)) + int(bool(algorithm.keeps_old_policy))
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        memory, counted = _memory(planned, description, ranks, sequence, rows, copies)
    finally:
        dist.destroy_process_group()
    # per transformer row; this rank's FLOPs are its 1/sequence of each sample (the unsplit parts,
    # the text's keys and the patch embedding, run on every rank: counted x sequence, an upper bound)
    row_forward, row_train = (counted[k] * sequence / rows for k in ("forward", "train"))
    sample_rows = planned.guided_rows if cfg_on else 1  # a guided velocity's rows, sampling
    train_rows = sample_rows if cost.guided else 1
    r, s = config.rollout, config.sampling
    online = _online(algorithm)
    # offline algorithms (SFT, offline DPO) read train.batch_size items per iteration, sample none
    samples = r.batch_size * r.n_samples_per_prompt if online else config.train.batch_size
    examples = samples * cost.examples_per_sample
    per_example = train_rows * (row_train + cost.no_grad_forwards * row_forward)
    return Plan(
        model=planned.description,
        source="",
        parameters=parameters,
        trainable=trainable,
        latent=planned.latent_shape,
        rows=rows,
        ranks=ranks,
        sequence=sequence,
        memory=memory,
        forward_flops_per_sample=row_forward * sample_rows,
        rollout_flops=samples * s.num_steps * row_forward * sample_rows if online else 0.0,
        train_flops=examples * per_example,
        samples=samples,
        steps=s.num_steps,
        examples=examples,
        engines=layout.engines,
    )


def _online(algorithm: DiffusionAlgorithm) -> bool:
    return algorithm.collection_spec().online


def _inputs(planned: Planned, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 latents and sigmas, as the samplers keep them (the family's forward casts)."""
    return torch.randn(rows, *planned.latent_shape), torch.full((rows,), 0.9)


def _memory(
    planned: Planned, description: type[FamilyDescription], ranks: int, sequence: int, rows: int, copies: int
) -> tuple[RankMemory, dict[str, float]]:
    """Peak of one micro-batch's forward, backward and AdamW step on rank 0 of ``ranks`` fake ranks,
    and this rank's FLOPs of its forward (``forward``) and of forward and backward (``train``: with
    gradient checkpointing, the recomputed forwards too)."""
    module = planned.module
    fsdp = init_device_mesh("cpu", (ranks,)) if ranks > 1 else None
    mesh = sequence_mesh("cpu", ranks // sequence, sequence) if sequence > 1 else None
    if mesh is not None:  # on the meta module: diffusers' set-up reads the mesh (no fake tensors)
        for part in description.sequence_parallel_modules(module):
            enable_sequence_parallel(part, mesh)
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = module.to_empty(device="cpu")
        if fsdp is not None:
            for block in description.fsdp_blocks(module):
                fully_shard(block, mesh=fsdp)
            fully_shard(module, mesh=fsdp)
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        for p in params:  # AdamW's state as after the first step: it stays for the whole run
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        x, sigma = _inputs(planned, rows)
        if fsdp is not None:
            tracker = _IdleUnitsFSDPMemTracker(module, optimizer)
            tracker.track_inputs((x, sigma))
        else:
            tracker = _FrozenAwareMemTracker()
            tracker.track_external(optimizer, x, sigma)
        with tracker:
            with _OpFlops() as counter:
                loss = planned.forward(module, x, sigma).float().square().mean()
                forward = counter.total
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    frozen_copies = copies * sum(p.numel() * p.element_size() for p in module.parameters()) // ranks
    memory = RankMemory(
        parameters=_category(peak, "Parameter", "Sharded Param") + frozen_copies,
        gathered=_category(peak, "Unsharded Param", "All Gather", "Buffer"),
        gradients=_category(peak, "Gradient", "Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
        optimizer=_category(peak, "Optstate", "OptState"),
        activations=_category(peak, "Activation", "Inputs"),
        temporary=_category(peak, "Temp", "Other"),
        peak=peak["Total"] + frozen_copies,
    )
    return memory, {"forward": float(forward), "train": float(counter.total)}


def plan(config: Config, algorithm: DiffusionAlgorithm, layout: ParallelConfig | None = None) -> Plan:
    """The plan of ``config`` (a validated config; the model's weights need not exist) for the
    ranks and engines of ``layout``, those its runner places (:func:`diffrl.launch.layout`;
    ``None``: ``config.parallel`` as the recipe says)."""
    description = FAMILIES.resolve(config.model.family).description
    folder, source = model_folder(config)
    planned = description.planned(config, folder)
    if planned is None:
        able = [n for n in FAMILIES.names() if "planned" in vars(FAMILIES.resolve(n).description)]
        raise PlanError(
            f"diffrl plan: the {description.name} family cannot be planned yet (it builds no meta-device "
            f"copy of its transformer); families that can: {', '.join(able)}"
        )
    result = measure(config, planned, description, algorithm, layout or config.parallel)
    result.source = source
    return result


def _si(flops: float) -> str:
    """FLOPs with the largest unit that keeps a digit before the point, e.g. ``870.7 PFLOP``."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.1f} {unit}"
    return f"{flops / 1e6:.1f} MFLOP"


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def render(result: Plan, config: Config, gpu: str, mfu: float, memory_gb: float | None) -> str:
    """The table ``diffrl plan`` prints."""
    m, lines = result.memory, []
    lora = config.model.lora
    trained = f"LoRA r={lora.rank} ({result.trainable / 1e6:.1f}M trainable)" if lora else "full fine-tune"
    lines.append(
        f"model: {result.model}, {result.parameters / 1e9:.2f}B parameters, {config.model.dtype}; "
        f"{trained}; from {result.source}"
    )
    lines.append(
        f"trainer ranks: {result.ranks} (FSDP2 over {result.ranks}, sequence parallel {result.sequence}); "
        f"micro-batch: {result.rows} row(s) of latent {tuple(result.latent)}"
    )
    lines.append("")
    lines.append("memory per trainer rank (GiB, tensors)")
    rows = [
        ("parameters (this rank's shards)", m.parameters),
        ("gathered blocks (FSDP2 all-gather)", m.gathered),
        ("gradients", m.gradients),
        ("optimizer state (AdamW)", m.optimizer),
        ("activations", m.activations),
        ("temporary (backward)", m.temporary),
        ("peak", m.peak),
    ]
    width = max(len(n) for n, _ in rows)
    lines += [f"  {n:<{width}}  {_gib(v):>8}" for n, v in rows]
    if memory_gb:
        fits = "fits" if m.peak <= memory_gb * 1e9 * 0.9 else "does NOT fit"
        lines.append(
            f"  {fits} in a {gpu}'s {memory_gb:g} GB with 10% left for the allocator and the CUDA context"
        )
    lines.append("")
    peak = GPU_PEAK_TFLOPS[gpu][0] * 1e12
    lines.append(
        f"FLOPs per iteration (at MFU {mfu:g} on {gpu}, {GPU_PEAK_TFLOPS[gpu][0]:g} TFLOP/s bf16 dense)"
    )
    if result.rollout_flops:
        seconds = result.rollout_flops / (result.engines * peak * mfu)
        lines.append(
            f"  rollout  {_si(result.rollout_flops):>13}  {result.samples} samples x {result.steps} steps "
            f"x {_si(result.forward_flops_per_sample)} -> {seconds:.3g} s on {result.engines} engine(s)"
        )
    seconds = result.train_flops / (result.ranks * peak * mfu)
    lines.append(
        f"  train    {_si(result.train_flops):>13}  {result.examples} examples -> {seconds:.3g} s "
        f"on {result.ranks} rank(s)"
    )
    return "\n".join(lines)
