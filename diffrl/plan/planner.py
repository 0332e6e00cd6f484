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
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig as PeftLoraConfig
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import _get_grad_fn_or_grad_acc, register_multi_grad_hook
from torch.distributed._tools import mod_tracker
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_leaves
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
DEVICE = torch.ops.prim.device.default


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
    """Rows of one training micro-batch through the transformer: samples x the guided velocity's
    rows (2 with CFG, one more for each further guidance pass of a family, e.g. LTX-2's STG and
    modality isolation; each pass with its gradient, all in the peak)."""
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
    copied: int = 0
    """Blocks not traced but counted as copies of a traced one (:class:`_Run`)."""


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


def _all_grads_seen(tensors: list[torch.Tensor], fn, mode: str = "all"):
    """``register_multi_grad_hook`` as the trackers' ``ModTracker`` calls it to see a module's
    backward end (mode "all": once the gradients of all its inputs are computed), but keeping none of
    those gradients: torch's keeps each until the last one arrives, which the real step does not.
    A block's inputs include the timestep embedding every block reads, whose gradient is whole only
    at the end of the backward: with it trainable (a full fine-tune), every block's input gradient
    was held to the end (measured on a tiny Wan 2.2: 2.2 of 26.6 MB, the plan 8% over the allocator;
    ``benchmarks/plan_accuracy.py``). ``fn`` gets Nones (the trackers read no gradient there)."""
    if mode != "all":
        return register_multi_grad_hook(tensors, fn, mode=mode)
    nodes = [_get_grad_fn_or_grad_acc(t) for t in tensors]
    n = len(tensors)  # not the tensors: the hooks on them would keep them alive
    seen: dict[int, list[int]] = {}

    def hook(grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task not in seen:  # this backward's count: the inputs whose gradient it computes
            seen[task] = [0, sum(map(torch._C._will_engine_execute_node, nodes))]
        seen[task][0] += 1
        if seen[task][0] == seen[task][1]:
            del seen[task]
            fn([None] * n)

    return _Handles([t.register_hook(hook) for t in tensors])


class _Handles:
    def __init__(self, handles: list) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class _GlobalPeakOnly:
    """A ``MemTracker`` that keeps the peak of the whole step (what :func:`measure` reads) and not
    each module's: torch's ``_update_peak_stats`` walks every module seen so far on every op (a
    weak-keyed dictionary, ~200 modules x ~16,000 ops on the tiny model: 10 of a plan's 14 CPU
    seconds). The whole-step peak is updated as torch updates it. While :attr:`counting`, it also
    adds up the ops' FLOPs by torch's own per-op formulas (``torch.utils.flop_counter``'s registry,
    what ``FlopCounterMode`` sums), in the same dispatch: not ``FlopCounterMode`` itself, whose
    per-module attribution hooks keep gradient-checkpointed blocks' tensors alive (measured on Wan
    2.2 A14B: 332 GiB of activations against 22), nor a second dispatch mode (a plan's ops each
    paid for it)."""

    timeline: _Timeline | None = None
    """Where each op's snapshot also goes when blocks are copied (:func:`_memory`)."""
    counting = False
    flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is DEVICE and DTensor not in types:  # a tensor's ``.device``: no memory moves (half the
            return func(*args, **(kwargs or {}))  # dispatches of a plan, the autograd engine's checks)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.counting and out is not NotImplemented:  # NotImplemented: a DTensor's, its local ops follow
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                self.flops += formula(*args, **(kwargs or {}), out_val=out)
        return out

    def __enter__(self):
        if self._depth == 0:
            mod_tracker.register_multi_grad_hook = _all_grads_seen
        return super().__enter__()

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        if self._depth == 0:
            mod_tracker.register_multi_grad_hook = register_multi_grad_hook

    def _root_again(self, module: nn.Module) -> None:
        """Let the model run again before the backward (a guided velocity's further passes, as
        LTX-2's): torch's trackers take a second forward of the root for a second step and refuse
        it; here its per-module statistics, which nothing reads, start over."""
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if self._mod_tracker.parents - {name} == {"Global"}:
                del self.memory_tracking[module]

    def _update_peak_stats(self, peak_state: object) -> None:
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)
        if self.timeline is not None:
            self.timeline.record()


class _FrozenAwareMemTracker(_GlobalPeakOnly, MemTracker):
    """``MemTracker`` for a module with frozen parameters: its gradient hooks go on trainable
    parameters only (torch 2.13 registers one on every parameter, which a frozen one refuses)."""

    def _pre_fw_hook(self, module: nn.Module, inputs) -> None:
        self._root_again(module)
        super()._pre_fw_hook(module, inputs)

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

    def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
        tracked = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)

        def pre_forward(*args, **kwargs):
            self._root_again(fsdp_mod)
            return tracked(*args, **kwargs)

        return pre_forward

    def _fsdp_param_group_post_backward(self, fsdp_mod, orig_fsdp_param_group_post_backward):
        tracked = super()._fsdp_param_group_post_backward(fsdp_mod, orig_fsdp_param_group_post_backward)

        def post_backward(*args, **kwargs):
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            if group is not None and any(not hasattr(p, "_unsharded_param") for p in group.fsdp_params):
                return orig_fsdp_param_group_post_backward(*args, **kwargs)
            return tracked(*args, **kwargs)

        return post_backward


CPU = torch.device("cpu")
COPIED_RUN = 7
"""A run of at least this many identical blocks is traced in part (:class:`_Run`)."""


class _NotUniform(Exception):
    """The blocks of a run did not repeat exactly in the traced step: :func:`plan` traces every block."""


@dataclass
class _Run:
    """Consecutive identical blocks of one ``nn.ModuleList`` (:func:`_signature`). The plan traces
    its first four and its last two; the others (:attr:`copies`) are taken out of the model before
    the step and counted as repeats of the fourth, the template: its tensors, its part of the forward
    (what it leaves alive for the backward) and of the backward (recomputation, gradients, what it
    frees), and its FLOPs (:func:`_full_peak`). Its neighbours must be of its kind, as a copy's are:
    FSDP2's backward of a block waits for the block before and prefetches the one before that, and a
    block's backward begins with what the two after it left (the last one's gradient reduction is
    still pending). So are the third block's, traced as a check: its part of the step must repeat
    the template's exactly, op by op, else the run is traced in full (:class:`_NotUniform`)."""

    owner: nn.ModuleList
    blocks: list[nn.Module]
    signature: tuple = field(repr=False)

    @property
    def copies(self) -> list[nn.Module]:
        return self.blocks[4:-2]


def _signature(block: nn.Module) -> tuple:
    """What makes two blocks the same to the plan: their class and structure (``repr``), each
    parameter's and buffer's name, shape, dtype and gradient flag, their attention processors."""
    return (
        type(block),
        repr(block),
        tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in block.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers()),
        tuple(type(m.processor).__qualname__ for m in block.modules() if hasattr(m, "processor")),
    )


def _runs(module: nn.Module, blocks: list[nn.Module]) -> list[_Run]:
    """The runs of at least :data:`COPIED_RUN` consecutive identical ``blocks`` (the family's FSDP2
    units) in the ``nn.ModuleList`` that holds them."""
    owners = {
        id(child): (m, i)
        for m in module.modules()
        if isinstance(m, nn.ModuleList)
        for i, child in enumerate(m._modules.values())
    }
    runs: list[_Run] = []
    last = None
    for block in blocks:
        owner, index = owners.get(id(block), (None, -1))
        signature = _signature(block)
        follows = owner is not None and last == (owner, index - 1)
        if follows and runs[-1].owner is owner and runs[-1].signature == signature:
            runs[-1].blocks.append(block)
        elif owner is not None:
            runs.append(_Run(owner, [block], signature))
        last = (owner, index) if owner is not None else None
    return [r for r in runs if len(r.blocks) >= COPIED_RUN]


def _take_out(runs: list[_Run]) -> None:
    """Remove each run's copies from its ``nn.ModuleList`` (the model runs the others in order)."""
    for run in runs:
        copies = {id(b) for b in run.copies}
        kept = [b for b in run.owner._modules.values() if id(b) not in copies]
        run.owner._modules = {str(i): b for i, b in enumerate(kept)}


Snapshot = tuple[int, ...]
Mark = tuple[int, Snapshot, float]
"""When: the number of ops before it, the tracker's snapshot then, the FLOPs counted then."""


class _Timeline:
    """The tracker's memory after every op of the step (what its peak is the largest of), by kind,
    and at the marks: when each of a run's first four blocks ends its forward and begins its backward."""

    def __init__(self, tracker: _GlobalPeakOnly):
        self.tracker = tracker
        self.keys = [*tracker._ref_class, "Total"]
        self.ops: list[Snapshot] = []
        self.marks: dict[tuple[int, str, int], Mark] = {}
        """(run, "fw" or "bw", the block's place in the run) -> its mark."""

    def snapshot(self) -> Snapshot:
        now = self.tracker._curr_mem_snap.get(CPU)
        if now is None or len(now) != len(self.keys):  # none yet, or emptied (the tracker drops it at 0)
            now = dict.fromkeys(self.keys, 0) | (now or {})
        return tuple(now.values())  # the tracker's order, the kinds then "Total", as self.keys

    def record(self) -> None:
        self.ops.append(self.snapshot())

    def mark(self, key: tuple[int, str, int]) -> None:
        if key not in self.marks:  # a recomputed forward (gradient checkpointing) marks nothing
            self.marks[key] = (len(self.ops), self.snapshot(), self.tracker.flops)

    def hook(self, runs: list[_Run]) -> list:
        """The marks' hooks: the end of the forward of each run's first four blocks, and the start of
        their backward (the first gradient of their outputs)."""
        handles = []
        for r, run in enumerate(runs):
            for k, block in enumerate(run.blocks[:4]):

                def ended(module, args, output, key=(r, k)) -> None:
                    if (key[0], "fw", key[1]) in self.marks:
                        return
                    self.mark((key[0], "fw", key[1]))
                    outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
                    if outs:
                        begun = lambda _grad, key=key: self.mark((key[0], "bw", key[1]))  # noqa: E731
                        handles.append(register_multi_grad_hook(outs, begun, mode="any"))

                handles.append(block.register_forward_hook(ended))
        return handles


def _plus(a: Snapshot, b: Snapshot, times: int = 1) -> Snapshot:
    return tuple(x + times * y for x, y in zip(a, b, strict=True))


def _minus(a: Snapshot, b: Snapshot) -> Snapshot:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def _block_bytes(
    tracker: MemTracker, block: nn.Module, optimizer: torch.optim.Optimizer, keys: list
) -> Snapshot:
    """What ``block`` holds for the whole step as the tracker counts it, by kind: its parameters (this
    rank's shards), buffers and AdamW state."""
    tensors = [*block.parameters(), *block.buffers()]
    tensors += [v for p in block.parameters() for v in optimizer.state.get(p, {}).values()]
    held = dict.fromkeys(keys, 0)
    seen = set()
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        for st in get_untyped_storages(t):
            winfo, _ = tracker._WINFO.get(st, (None, None))
            if winfo is None or id(st) in seen:
                continue
            seen.add(id(st))
            held[winfo.reftype] += winfo.mem_consumed
            held["Total"] += winfo.mem_consumed
    return tuple(held[k] for k in keys)


def _segment(timeline: _Timeline, r: int, phase: str) -> tuple[Mark, list[Snapshot], Snapshot, float]:
    """A run's template segment in ``phase``: from the third block's end of forward to the
    template's ("fw"), or from the template's start of backward to the third block's ("bw"); its
    start, its ops relative to that, its change and its FLOPs. :class:`_NotUniform` unless the third
    block's segment (from the second block's end of forward to its own; from its own start of
    backward to the second's) is the very same."""
    marks, ops = timeline.marks, timeline.ops
    m = [marks[(r, phase, k)] for k in range(4)]
    pairs = ((m[2], m[3]), (m[1], m[2])) if phase == "fw" else ((m[3], m[2]), (m[2], m[1]))
    parts = []
    for a, b in pairs:  # the template's, the third block's
        parts.append(([_minus(op, a[1]) for op in ops[a[0] : b[0]]], _minus(b[1], a[1]), b[2] - a[2]))
    if parts[0] != parts[1]:
        raise _NotUniform(f"run {r}: the {phase} segments of its third and fourth blocks differ")
    return (pairs[0][0], *parts[0])


def _full_peak(
    timeline: _Timeline, runs: list[_Run], held: list[Snapshot], forward: float, total: float
) -> tuple[dict, float, float]:
    """The peak snapshot, forward FLOPs and forward-and-backward FLOPs of the whole model from the
    step traced without the runs' copies. Every op of the traced step holds the copies' ``held``
    tensors; from the template's end of forward, the copies' forward leftovers (what their backward
    reads); from the template's start of backward, their backward's changes too (gradients made,
    activations freed). The copies' own ops are the template's, each shifted by its place."""
    keys, total_at = timeline.keys, timeline.keys.index("Total")
    zero = (0,) * len(keys)
    base = zero
    for run, h in zip(runs, held, strict=True):
        base = _plus(base, h, len(run.copies))
    events: list[tuple[int, int, Snapshot]] = []  # (the op from which it holds, run, change)
    copies = []  # (run, the op they sit before, the template's start, its ops, shift, change, k's)
    for r, run in enumerate(runs):
        n = len(run.copies)
        found = {k for k in timeline.marks if k[0] == r}
        if not found:  # units that ran no forward (the Wan 2.2 expert not routed to)
            continue
        if len(found) != 8:
            raise _NotUniform(f"run {r}: marks {sorted(found)}")
        fw_start, fw_ops, fw_change, fw_flops = _segment(timeline, r, "fw")
        bw_start, bw_ops, bw_change, bw_flops = _segment(timeline, r, "bw")
        fw_at, bw_at = timeline.marks[(r, "fw", 3)][0], bw_start[0]
        events += [(fw_at, r, _plus(zero, fw_change, n)), (bw_at, r, _plus(zero, bw_change, n))]
        # the k-th copy's forward (k = 1..n) is the template's with k forward changes more; the k-th copy's
        # backward, before the template's (k = 1..n), with all n copies' forward changes and k - 1
        # backward changes more
        copies.append((r, fw_at, fw_start[1], fw_ops, zero, fw_change, (1, n)))
        copies.append((r, bw_at, bw_start[1], bw_ops, _plus(zero, fw_change, n), bw_change, (0, n - 1)))
        forward += n * fw_flops
        total += n * (fw_flops + bw_flops)

    def offset(at: int, but: int) -> Snapshot:
        out = base
        for i, r, change in events:
            if i <= at and r != but:
                out = _plus(out, change)
        return out

    best, best_total = zero, None
    events.sort(key=lambda e: e[0])
    now, e = base, 0
    for t, op in enumerate(timeline.ops):
        while e < len(events) and events[e][0] <= t:
            now = _plus(now, events[e][2])
            e += 1
        if best_total is None or op[total_at] + now[total_at] > best_total:
            best, best_total = _plus(op, now), op[total_at] + now[total_at]
    for r, at, start, ops, shift, change, ks in copies:
        start = _plus(_plus(start, offset(at, but=r)), shift)
        for k in set(ks):  # the changes add up linearly: the largest copy is the first or the last
            for op in ops:
                value = _plus(_plus(start, op), change, k)
                if value[total_at] > best_total:
                    best, best_total = value, value[total_at]
    return dict(zip(keys, best, strict=True)), forward, total


def _lora(module: nn.Module, description: type[FamilyDescription], config: Config, keep_old: bool) -> None:
    """peft LoRA as :func:`~diffrl.train.actor.apply_lora` adds it (float32 adapters), and the old
    policy's second adapter when the algorithm keeps one."""
    cfg = config.model.lora
    targets = description.lora_targets_of(module, cfg.target_modules)
    peft = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets)
    module.requires_grad_(False)
    with torch.device("meta"):  # the adapters on the meta device, as the model: no CPU initialisation
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
    copied: bool = True,
) -> Plan:
    """One micro-batch's step on fake tensors (see the module's docstring), for the ranks and
    engines of ``layout``; ``copied``: long runs of identical blocks traced in part (:class:`_Run`)."""
    ranks, sequence = layout.trainer_ranks, layout.sequence
    cost = algorithm.train_cost()
    guidance = config.sampling.guidance_scale
    cfg_on = guidance is not None and guidance > getattr(description, "no_guidance_scale", 1.0)
    guided = cfg_on and cost.guided  # training's velocity is the guided one, every pass with gradient
    micro = config.train.micro_batch_size
    rows = micro * (planned.guided_rows if guided else 1)
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
        # a family's own guidance passes (LTX-2's) run the blocks several times before one backward: the
        # runs' marks cannot repeat block by block (:class:`_NotUniform`), so every block is traced at once
        copied = copied and not (guided and planned.guided is not None)
        memory, counted = _memory(planned, description, ranks, sequence, rows, copies, copied, guided, micro)
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
        copied=int(counted["copied"]),
    )


def _online(algorithm: DiffusionAlgorithm) -> bool:
    return algorithm.collection_spec().online


def _inputs(planned: Planned, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 latents and sigmas, as the samplers keep them (the family's forward casts)."""
    return torch.randn(rows, *planned.latent_shape), torch.full((rows,), 0.9)


def _step_call(planned: Planned, rows: int, guided: bool, samples: int):
    """The traced micro-batch's velocity call and its inputs: the family's guided velocity of
    ``samples`` samples where it has its own passes (:attr:`Planned.guided`), else its forward of
    ``rows`` rows ([negative, positive] batched, as CFG runs)."""
    if guided and planned.guided is not None:
        return planned.guided, _inputs(planned, samples)
    return planned.forward, _inputs(planned, rows)


def _memory(
    planned: Planned,
    description: type[FamilyDescription],
    ranks: int,
    sequence: int,
    rows: int,
    copies: int,
    copied: bool = True,
    guided: bool = False,
    samples: int = 0,
) -> tuple[RankMemory, dict[str, float]]:
    """Peak of one micro-batch's forward, backward and AdamW step on rank 0 of ``ranks`` fake ranks,
    and this rank's FLOPs of its forward (``forward``) and of forward and backward (``train``: with
    gradient checkpointing, the recomputed forwards too). ``copied``: each long run of identical
    blocks runs six of its blocks, the others counted as copies of one (:class:`_Run`)."""
    module = planned.module
    frozen_copies = copies * sum(p.numel() * p.element_size() for p in module.parameters()) // ranks
    runs = _runs(module, description.fsdp_blocks(module)) if copied else []
    _take_out(runs)
    fsdp = init_device_mesh("cpu", (ranks,)) if ranks > 1 else None
    mesh = sequence_mesh("cpu", ranks // sequence, sequence) if sequence > 1 else None
    if mesh is not None:  # on the meta module: diffusers' set-up reads the mesh (no fake tensors)
        for part in description.sequence_parallel_modules(module):
            enable_sequence_parallel(part, mesh)
    if (
        fsdp is not None
    ):  # on the meta module too: the shards cost no ops (FSDP2 re-points them after to_empty)
        for block in description.fsdp_blocks(module):
            fully_shard(block, mesh=fsdp)
        fully_shard(module, mesh=fsdp)
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = module.to_empty(device="cpu")
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        for p in params:  # AdamW's state as its first step leaves it (adamw.py's _init_group): it stays
            optimizer.state[p] = {
                "step": torch.tensor(1.0),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        call, (x, sigma) = _step_call(planned, rows, guided, samples)
        if fsdp is not None:
            tracker = _IdleUnitsFSDPMemTracker(module, optimizer)
            tracker.track_inputs((x, sigma))
        else:
            tracker = _FrozenAwareMemTracker()
            tracker.track_external(optimizer, x, sigma)
        timeline = _Timeline(tracker) if runs else None
        with tracker:
            if timeline is not None:
                tracker.timeline = timeline
                timeline.record()  # where the tracker's peak starts
                handles = timeline.hook(runs)
            tracker.counting = True
            loss = call(module, x, sigma).float().square().mean()
            forward = tracker.flops
            loss.backward()
            tracker.counting = False
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        total = tracker.flops
        if timeline is None:
            peak = tracker.get_tracker_snapshot("peak")[CPU]
        else:
            tracker.timeline = None
            for handle in handles:
                handle.remove()
            held = [_block_bytes(tracker, run.blocks[3], optimizer, timeline.keys) for run in runs]
            peak, forward, total = _full_peak(timeline, runs, held, forward, total)
    memory = RankMemory(
        parameters=_category(peak, "Parameter", "Sharded Param") + frozen_copies,
        gathered=_category(peak, "Unsharded Param", "All Gather", "Buffer"),
        gradients=_category(peak, "Gradient", "Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
        optimizer=_category(peak, "Optstate", "OptState"),
        activations=_category(peak, "Activation", "Inputs"),
        temporary=_category(peak, "Temp", "Other"),
        peak=peak["Total"] + frozen_copies,
    )
    copied_blocks = sum(len(run.copies) for run in runs)
    return memory, {"forward": float(forward), "train": float(total), "copied": copied_blocks}


def plan(
    config: Config, algorithm: DiffusionAlgorithm, layout: ParallelConfig | None = None, copied: bool = True
) -> Plan:
    """The plan of ``config`` (a validated config; the model's weights need not exist) for the
    ranks and engines of ``layout``, those its runner places (:func:`diffrl.launch.layout`;
    ``None``: ``config.parallel`` as the recipe says). ``copied``: trace six blocks of each long run
    of identical ones and count the others as their copies (:class:`_Run`; the same figures as
    ``copied=False``, which traces every block, several times faster)."""
    description = FAMILIES.resolve(config.model.family).description
    folder, source = model_folder(config)

    def measured(copied: bool) -> Plan:
        planned = description.planned(config, folder)  # a fresh model each time: the step consumes it
        if planned is None:
            able = [n for n in FAMILIES.names() if "planned" in vars(FAMILIES.resolve(n).description)]
            raise PlanError(
                f"diffrl plan: the {description.name} family cannot be planned yet (it builds no meta-device "
                f"copy of its transformer); families that can: {', '.join(able)}"
            )
        return measure(config, planned, description, algorithm, layout or config.parallel, copied)

    try:
        result = measured(copied)
    except _NotUniform:  # a run's blocks did not repeat exactly: every block traced
        result = measured(False)
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
