"""``rollout.engine: sglang``: sglang-diffusion servers draw the rollouts; diffrl trains on what
they return (the predecessor's rollout engine; sglang 0.5.23's ``/rollout/generate``).

Per micro-group, one request per run of a prompt's consecutive samples (sent side by side, up to
``concurrency``): the prompt, ``num_outputs_per_prompt`` and a ``seed`` that sglang expands to
``seed + i`` for its i-th output, so sample ``j`` of prompt slot ``q`` always gets
``derive_seed(run seed, "sglang", q) + j`` whatever the micro-groups (the engine's initial noise
and its step noise both come from that generator). The answer maps to a :class:`RolloutBatch`:

- ``x0``: the final latent of ``dit_trajectory.latents`` (unpacked by the family);
- the trajectory (Flow-GRPO): ``traj_x / traj_next`` = the recorded latents at each stochastic
  step and the next, ``traj_log_prob`` = the engine's ``rollout_log_probs`` at those steps,
  ``traj_mean`` (GRPO-Guard) = its debug ``rollout_prev_sample_means``;
- ``images``: ``generated_output`` in [0, 1], quantized; ``cond``: the family's own encoding of
  the prompts (what the trainer replays with; the alignment metric checks it agrees).

Kernels: diffrl's ``sde`` is sglang's ``sde`` (full Gaussian log-prob); ``cps`` is sglang's
``cps`` with ``rollout_log_prob_no_const`` (sglang's full CPS log-prob is nan at the last step;
diffrl's CPS log-prob drops the constants as flow_grpo's does); deterministic samplers ask for
``ode`` and no trajectory. Others are refused (:meth:`SglangEngine.validate`).

Weights (:meth:`SglangEngine.sync`, ``sync``): ``lora`` (the default where ``model.lora`` has an
integer alpha) sends only the sampling adapter, as a diffusers LoRA folder written atomically and
loaded with ``/v1/set_lora`` unmerged; a server's first adapter is checked with
``/get_weights_checksum`` against the same sha256 computed here over the base weights and the
adapter under sglang's wrapped names (:func:`~diffrl.sampling.sglang_lora.served_state`), each later
one tensor by tensor (``/update_weights_from_tensor_checker``). ``merged`` sends the whole
transformer, LoRA merged into the base weights (``W + scale * B @ A``, peft's
``get_delta_weight``), as a diffusers ``transformer/`` folder loaded with
``/update_weights_from_disk``; then ``/get_weights_checksum`` must equal the same sha256 computed
here. See ``docs/engines.md``.

Faults: a server launched here that dies or stops answering mid-rollout is restarted (up to
``restarts`` times per micro-group), takes the last synced weights again, and the micro-group is
drawn again from the same seeds: nothing is lost (``rollout/engine_restarts``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from torch import nn

from diffrl.config import Config, Range
from diffrl.core.errors import Abandoned
from diffrl.core.parallel import state_checksum
from diffrl.core.rollout import CollectionSpec, RolloutBatch, quantize
from diffrl.core.seeding import derive_seed
from diffrl.data.prompts import PromptSet
from diffrl.models.base import DTYPES, FamilyRuntime
from diffrl.sampling.collector import RolloutPlan, RolloutPlanner, StageClock
from diffrl.sampling.engine import engine_options
from diffrl.sampling.kernels import resolve_kernel
from diffrl.sampling.sampler import image_size, sampling_sigmas
from diffrl.sampling.sglang_lora import (
    NICKNAME,
    TARGET,
    Adapter,
    sampling_adapter,
    served_state,
    tensor_sha256,
)
from diffrl.sampling.sglang_server import (
    EngineServerError,
    EngineUnreachable,
    ServeCommand,
    Server,
    as_tensor,
)

SDE_TYPES = {"sde": ("sde", False), "cps": ("cps", True)}
"""diffrl's stochastic kernel -> sglang's ``rollout_sde_type`` and ``rollout_log_prob_no_const``."""
SEED_SPAN = 2**40
"""Per-slot seeds are drawn below 2^63 - SEED_SPAN, so ``seed + j`` never overflows."""
SIGMA_TOLERANCE = 1e-5
PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""``model.dtype`` -> the server's precision flags."""
MODEL_IDS = {"FluxPipeline": "FLUX.1-dev"}
"""A diffusers folder's pipeline class -> the ``--model-id`` sglang resolves its native pipeline by
(sglang 0.5.23 ``configs/pipeline_configs/flux.py``: any id with ``flux.1`` in it, dev and
schnell alike). A folder sglang cannot resolve runs on its diffusers backend, which has no
``/rollout/generate`` (:data:`~diffrl.sampling.sglang_server.DIFFUSERS_FALLBACK`)."""


def sync_mode(config: Config, sync: str) -> Literal["lora", "merged"]:
    """What ``rollout.engine_options.sync`` (``auto``, ``lora`` or ``merged``) sends: ``auto`` is
    ``lora`` where ``model.lora`` is set with an integer alpha (sglang loads no other), else
    ``merged``."""
    if sync in ("lora", "merged"):
        return sync  # type: ignore[return-value]
    lora = config.model.lora
    return "lora" if lora is not None and float(lora.alpha).is_integer() else "merged"


def default_model_id(path: Path) -> str | None:
    """The ``--model-id`` for the diffusers folder ``path`` from its ``model_index.json``, if known."""
    try:
        name = json.loads((path / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return MODEL_IDS.get(name) if isinstance(name, str) else None


@torch.no_grad()
def merged_state(module: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The transformer's parameters under diffusers' names, each LoRA layer's adapter merged into
    its base weight (``W + get_delta_weight(adapter)``, the active adapter), cast to ``dtype``."""
    state: dict[str, torch.Tensor] = {}
    lora_layers = {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}
    for name, p in module.named_parameters():
        if "lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        clean = name.replace(".base_layer.", ".")
        layer = lora_layers.get(owner.removesuffix(".base_layer")) if owner.endswith(".base_layer") else None
        value = p.detach()
        if layer is not None and leaf == "weight":
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    value = value + layer.get_delta_weight(adapter).to(value.dtype)
        state[clean] = value.to("cpu", dtype).contiguous()
    return state


class SglangEngine:
    """The ``sglang`` rollout engine: sglang-diffusion servers draw the samples (see the module)."""

    @dataclass
    class Options:
        command: str | None = None
        """The ``sglang`` command of sglang's own environment; None: ``$DIFFRL_SGLANG``, else
        ``sglang`` on PATH."""
        urls: list[str] = field(default_factory=list)
        """Running servers to use instead of starting one (``http://host:port``); diffrl then
        neither starts, restarts nor stops them."""
        model_id: str | None = None
        """``--model-id`` for ``sglang serve`` (e.g. ``FLUX.1-dev``): what sglang resolves its
        native pipeline by. None: from the folder's ``model_index.json`` (:data:`MODEL_IDS`)."""
        precision: Literal["fp32", "bf16", "fp16"] | None = None
        """The server's transformer, text encoders and VAE; None: ``model.dtype``'s (the trainer
        replays in that dtype: ``bf16`` log-probs differ from a float32 replay, see docs/engines.md)."""
        start_timeout_s: Annotated[float, Range(0, 86_400, lo_open=True, hint="seconds, at most a day")] = (
            300.0
        )
        request_timeout_s: Annotated[float, Range(0, 86_400, lo_open=True, hint="seconds, at most a day")] = (
            600.0
        )
        max_response_mb: Annotated[float, Range(0, 65_536, lo_open=True, hint="MiB")] = 1024.0
        concurrency: Annotated[int, Range(1, 4096, hint="requests in flight")] = 8
        """Requests in flight per micro-group (the server batches them)."""
        restarts: Annotated[int, Range(0, 100, hint="of a launched server, per micro-group")] = 2
        """Times a launched server that died mid-rollout is restarted for one micro-group."""
        debug_alignment: bool = False
        """Ask for the engine's debug tensors and write the first step and row where diffrl's
        kernel, given the engine's own velocity, disagrees with its log-prob (``sglang/alignment-*.json``)."""
        extra_args: list[str] = field(default_factory=list)
        """More ``sglang serve`` arguments."""
        sequence_parallel: Annotated[int, Range(1, 1024, hint="GPUs per server")] = 1
        """Ranks (GPUs) each launched server spans: ``--num-gpus N --sp-degree N --ulysses-degree
        N``, each sample's tokens split over them (Ulysses, sglang's own); under Ray each engine
        then holds N GPUs (``ray.colocate: false``)."""
        sync: Literal["auto", "lora", "merged"] = "auto"
        """What each weight sync sends: ``lora``: the LoRA adapter alone (``/v1/set_lora``, applied
        unmerged); ``merged``: the whole transformer with the adapter merged in
        (``/update_weights_from_disk``); ``auto``: ``lora`` where ``model.lora`` is set with an
        integer ``alpha`` (sglang refuses others), else ``merged``."""

    @classmethod
    def validate(cls, config: Config, spec: CollectionSpec) -> list[str]:
        errors = []
        options = engine_options(config, cls)
        if spec.step_strategy is not None and spec.keep_trajectory:
            kernel = resolve_kernel(spec.sampler)
            if kernel.stochastic and spec.sampler not in SDE_TYPES:
                errors.append(
                    f"rollout.engine=sglang draws stochastic steps with sde or cps only; the algorithm's "
                    f"sampler is {spec.sampler!r} (use sde or cps, or rollout.engine=diffrl)"
                )
        if config.rollout.same_latent:
            errors.append(
                "rollout.same_latent: with rollout.engine=sglang each sample's initial and step noise "
                "come from one seed, so samples sharing the initial noise would share all of it; "
                "set rollout.same_latent=false or use rollout.engine=diffrl"
            )
        if config.sampling.shift is not None:
            errors.append(
                "sampling.shift: the sglang server samples with the pipeline's own schedule; leave "
                "sampling.shift null with rollout.engine=sglang"
            )
        for url in options.urls:
            if not isinstance(url, str) or not url.startswith("http://"):
                errors.append(f"rollout.engine_options.urls: {url!r} is not an http://host:port URL")
        if options.sequence_parallel > 1 and options.urls:
            errors.append(
                "rollout.engine_options.sequence_parallel: diffrl starts no server when urls are "
                "given; start those servers with --num-gpus/--sp-degree/--ulysses-degree yourself"
            )
        lora = config.model.lora
        if options.sync == "lora" and lora is None:
            errors.append(
                "rollout.engine_options.sync=lora sends the LoRA adapter, and model.lora is null (every "
                "transformer weight trains): use sync: merged (or auto)"
            )
        elif options.sync == "lora" and not float(lora.alpha).is_integer():
            errors.append(
                f"rollout.engine_options.sync=lora: sglang loads LoRA adapters with an integer alpha "
                f"only, and model.lora.alpha is {lora.alpha}: set an integer alpha (e.g. "
                f"{max(1, round(lora.alpha))}) or sync: merged (or auto)"
            )
        return errors

    @classmethod
    def devices(cls, config: Config) -> int:
        """GPUs one engine's server spans (``sequence_parallel``)."""
        return engine_options(config, cls).sequence_parallel

    def __init__(self, config: Config, family: FamilyRuntime, spec: CollectionSpec, prompts: PromptSet):
        self.config, self.family, self.spec, self.prompts = config, family, spec, prompts
        self.options: SglangEngine.Options = engine_options(config, type(self))
        self.planner = RolloutPlanner(config, spec, len(prompts))
        self.clock = StageClock(family.device)
        self.height, self.width = image_size(config, family)
        self.sigmas = sampling_sigmas(config, family).cpu()
        self.num_steps = config.sampling.num_steps
        self.kernel = self.planner.kernel
        self.precision = self.options.precision or PRECISIONS[config.model.dtype]
        self.dtype = {v: DTYPES[k] for k, v in PRECISIONS.items()}[self.precision]
        self.run_dir = config.run.resolved_output_dir().absolute() / "sglang"  # a plugin may os.chdir later
        self.sync_mode = sync_mode(config, self.options.sync)
        if self.options.sync == "auto" and self.sync_mode == "merged" and config.model.lora is not None:
            warnings.warn(
                f"rollout.engine_options.sync: auto sends the whole merged transformer on each sync: "
                f"sglang loads no adapter with model.lora.alpha={config.model.lora.alpha} (not an "
                "integer); an integer alpha sends the adapter alone",
                stacklevel=2,
            )
        self.weights_root = Path(tempfile.mkdtemp(prefix="diffrl-sglang-weights-"))
        self.weights_dir: Path | None = None
        """The folder the servers load from: the last weights sent (kept for a restarted server)."""
        self.sent: str | None = None
        """The checksum of what ``weights_dir`` holds: the merged state, or the adapter."""
        self.synced: str | None = None
        """``sent`` once every server holds it (None after a failed sync: the next one sends again)."""
        self.adapter: Adapter | None = None
        """``sync: lora``: the adapter in ``weights_dir``."""
        self.module: nn.Module | None = None
        """The transformer the last sync read (``sync: lora``: whose base weights a server's first
        check hashes; they do not train)."""
        self.checked: set[int] = set()
        """``sync: lora``: the servers (by index) whose whole transformer was checked with an
        adapter on: later syncs check the adapter's tensors only (see :meth:`_load_lora`)."""
        self._base_checksum: str | None = None
        self.restarts = 0
        self.metrics: dict[str, float] = {}
        self._lock = threading.Lock()
        self.index = 0
        self.servers: list[Server] = []
        """Started (or connected) on first use: the first sync."""

    # ---- servers ---------------------------------------------------------------------------------
    def _command(self) -> ServeCommand:
        o = self.options
        path = Path(self.config.model.path).resolve()
        return ServeCommand(
            o.command or os.environ.get("DIFFRL_SGLANG", "sglang"),
            str(path),
            o.model_id or default_model_id(path),
            self.precision,
            list(o.extra_args),
            o.sequence_parallel,
        )

    def _launch(self, number: int) -> Server:
        encoders = sum(1 for c in getattr(self.family, "components", ()) if c.startswith("text_encoder"))
        return Server.launch(
            self._command(),
            self.run_dir / f"server-{id(self):x}-{number}.log",
            max(encoders, 1),
            self.options.start_timeout_s,
        )

    def _start_servers(self) -> None:
        if self.servers:
            return
        if self.options.urls:
            self.servers = [Server(u) for u in self.options.urls]
            for s in self.servers:
                s.wait_healthy(self.options.start_timeout_s)
        else:
            self.servers = [self._launch(0)]
        self._write_servers()

    def server_pids(self) -> list[int | None]:
        return [s.pid for s in self.servers]

    def _restart(self, i: int) -> None:
        """Server ``i`` stopped answering: relaunch one launched here (a server given by URL is
        waited for), and load the last synced weights into it."""
        server = self.servers[i]
        if server.process is None:
            server.wait_healthy(self.options.start_timeout_s)
        else:
            server.stop(grace_s=2.0)
            self.restarts += 1
            self.servers[i] = self._launch(self.restarts)
            self._write_servers()
        self.checked.discard(i)  # a new server, or one that may have restarted: base + adapter again
        if self.weights_dir is not None:
            self._load_into(i)

    def _write_servers(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / f"servers-{id(self):x}.json").write_text(
            json.dumps([{"url": s.url, "pid": s.pid, "log": str(s.log_path)} for s in self.servers])
        )

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.weights_root, ignore_errors=True)

    # ---- weights ---------------------------------------------------------------------------------
    def sync(self, module: nn.Module | None = None) -> dict[str, float]:
        """Send the sampling weights (``module`` or the family's transformer) to every server, unless
        they hold them already: the adapter (``sync: lora``) or the merged transformer, written
        atomically (a server never reads a half-written folder) and checked on every server."""
        t0 = time.perf_counter()
        module = module if module is not None else self.family.transformer
        folder = self.weights_root / f"w{time.monotonic_ns()}"
        tmp = folder.with_suffix(".tmp")
        adapter = None
        if self.sync_mode == "lora":
            adapter = sampling_adapter(module)
            checksum, nbytes = state_checksum(adapter.layers), adapter.nbytes
            if checksum == self.synced:
                return {}
            adapter.write(tmp)
        else:
            state = merged_state(module, self.dtype)
            checksum = state_checksum(state)
            if checksum == self.synced:
                return {}
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            (tmp / "transformer").mkdir(parents=True)
            save_file(state, str(tmp / "transformer" / "diffusion_pytorch_model.safetensors"))
            config_file = Path(self.config.model.path) / "transformer" / "config.json"
            shutil.copy(config_file, tmp / "transformer" / "config.json")
        tmp.rename(folder)
        self._start_servers()
        old, self.weights_dir, self.sent, self.synced = self.weights_dir, folder, checksum, checksum
        self.adapter, self.module = adapter, module
        try:
            for i in range(len(self.servers)):
                self._send(i)
        except BaseException:
            self.synced = None  # unknown what the servers hold: the next sync sends again
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        metrics = {
            "perf/engine_sync_time": time.perf_counter() - t0,
            "sync/engine_bytes": float(nbytes),
        }
        self.metrics.update(metrics)
        return metrics

    def _send(self, i: int) -> None:
        """Load the weights folder into server ``i``; one that does not answer is restarted (the
        new one loads them)."""
        for attempt in range(self.options.restarts + 1):
            try:
                return self._load_into(i)
            except EngineUnreachable:
                if attempt == self.options.restarts:
                    raise
                self._restart(i)
                return

    def _load_into(self, i: int) -> None:
        if self.sync_mode == "lora":
            self._load_lora(i)
        else:
            self._load_merged(self.servers[i])

    def _load_merged(self, server: Server) -> None:
        timeout = self.options.request_timeout_s
        server.update_weights_from_disk(self.weights_dir, timeout)
        held = server.weights_checksum(TARGET, timeout)
        if held != self.sent:
            raise EngineServerError(
                f"weight sync: the sglang server at {server.url} holds transformer weights with checksum "
                f"{held[:16]}..., not the trainer's {self.sent[:16]}... (precision "
                f"{self.precision!r}: the server must hold the weights in that dtype; a server that "
                "once took a LoRA adapter keeps its layers wrapped and takes no merged weights: restart it)"
            )

    def _load_lora(self, i: int) -> None:
        """``/v1/set_lora`` of the adapter folder on server ``i``, then its checks: the server
        applies that folder unmerged at strength 1 (``/v1/list_loras``); on a server's first adapter,
        ``/get_weights_checksum`` of its whole transformer (the base weights, which a dynamic
        adapter never writes, and the adapter) equals :func:`served_state`'s here; on later ones,
        each adapter tensor's sha256 (``/update_weights_from_tensor_checker``), the base being the
        one checked before. A server given by URL that does not hold ``model.path``'s weights
        (another run's) first reloads them from ``model.path`` (``/update_weights_from_disk``)."""
        server, timeout = self.servers[i], self.options.request_timeout_s
        first = i not in self.checked
        if (
            first
            and server.process is None
            and server.weights_checksum(TARGET, timeout) != self.base_checksum()
        ):
            server.update_weights_from_disk(Path(self.config.model.path).resolve(), timeout)
        server.set_lora(self.weights_dir, NICKNAME, TARGET, timeout)
        applied = ((server.lora_status(timeout).get("active") or {}).get(TARGET) or [{}])[0]
        if (applied.get("path"), applied.get("mode"), applied.get("strength")) != (
            str(self.weights_dir),
            "unmerged",
            1.0,
        ):
            raise EngineServerError(
                f"weight sync: after /v1/set_lora the sglang server at {server.url} applies {applied} to "
                f"its transformer, not the adapter {self.weights_dir} unmerged at strength 1"
            )
        if first:
            state = served_state(self.module, self.adapter, self.dtype)
            expected, held = state_checksum(state), server.weights_checksum(TARGET, timeout)
            if held != expected:
                _, message = server.check_tensors(
                    TARGET, {k: tensor_sha256(v) for k, v in state.items()}, timeout
                )
                raise EngineServerError(
                    f"weight sync (rollout.engine_options.sync: lora): with the adapter set, the sglang "
                    f"server at {server.url} holds transformer weights with checksum {held[:16]}..., not "
                    f"{expected[:16]}... (model.path's weights in {self.precision} under sglang's LoRA "
                    f"layers, and the adapter); its check of each tensor: {message}. The server must "
                    "serve model.path in that precision; where this sglang wraps other layers than "
                    "diffrl expects, set rollout.engine_options.sync: merged"
                )
            self.checked.add(i)
            return
        ok, message = server.check_tensors(
            TARGET, {k: tensor_sha256(v) for k, v in self.adapter.served().items()}, timeout
        )
        if not ok:
            raise EngineServerError(
                f"weight sync: the sglang server at {server.url} does not hold the adapter sent: {message}"
            )

    def base_checksum(self) -> str:
        """``/get_weights_checksum`` of a server holding ``model.path``'s transformer in the
        server's precision, no adapter set (the base weights do not train with LoRA: once)."""
        if self._base_checksum is None:
            state = {
                n.replace(".base_layer.", "."): p.detach().to("cpu", self.dtype).contiguous()
                for n, p in self.module.named_parameters()
                if "lora_" not in n
            }
            self._base_checksum = state_checksum(state)
        return self._base_checksum

    # ---- rollouts --------------------------------------------------------------------------------
    def plan(self, rollout_id: int) -> RolloutPlan:
        return self.planner.plan(rollout_id)

    def micro_groups(
        self, rollout_id: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[RolloutBatch]:
        self.sync(module)
        plan = self.plan(rollout_id)
        for g in range(len(plan.micro_groups)):
            if should_stop is not None and should_stop():
                raise Abandoned
            yield self.sample(plan, g)

    def collect(self, rollout_id: int, module: nn.Module | None = None) -> RolloutBatch:
        return RolloutBatch.cat(list(self.micro_groups(rollout_id, module)))

    def sample(self, plan: RolloutPlan, micro_group: int, module: nn.Module | None = None) -> RolloutBatch:
        """Draw micro-group ``micro_group`` of ``plan`` on the servers (retried on a restarted
        server when one dies; ``module`` is not used: the servers hold the synced weights)."""
        if self.synced is None:
            self.sync(module)
        chunk = plan.micro_groups[micro_group]
        requests = self.requests(chunk, plan.steps)
        with self._lock:
            i = self.index % len(self.servers)
            self.index += 1
        answers = self.clock("denoise", lambda: self._generate(i, requests))
        return self.clock("decode", lambda: self._batch(chunk, micro_group, plan.steps, answers))

    def _generate(self, i: int, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        o = self.options
        attempts = 0
        while True:
            server = self.servers[i]
            try:
                limit = int(o.max_response_mb * 2**20)
                with ThreadPoolExecutor(min(o.concurrency, len(requests))) as pool:
                    parts = list(
                        pool.map(
                            server.generate,
                            requests,
                            [o.request_timeout_s] * len(requests),
                            [limit] * len(requests),
                        )
                    )
                return [item for part in parts for item in part]
            except EngineUnreachable as e:
                if attempts >= o.restarts:
                    raise EngineServerError(
                        f"the sglang server at {server.url} stopped answering ({e}) and did not come "
                        f"back after {attempts} restart(s) (rollout.engine_options.restarts)"
                    ) from e
                attempts += 1
                self._restart(i)

    def requests(self, chunk: list[tuple[int, int, int]], steps: list[int]) -> list[dict[str, Any]]:
        """One ``/rollout/generate`` request per run of a prompt's consecutive samples in ``chunk``
        (the ``(slot, prompt, sample)`` jobs of a micro-group)."""
        runs: list[list[tuple[int, int, int]]] = []
        for job in chunk:
            last = runs[-1][-1] if runs else None
            if last is not None and last[0] == job[0] and last[2] + 1 == job[2]:
                runs[-1].append(job)
            else:
                runs.append([job])
        s, o = self.config.sampling, self.options
        stochastic = self.kernel.stochastic and bool(steps)
        sde_type, no_const = SDE_TYPES.get(self.spec.sampler, ("ode", True)) if stochastic else ("ode", True)
        keep = self.spec.keep_trajectory and stochastic
        returned = sorted({*steps, *(i + 1 for i in steps), self.num_steps}) if keep else [self.num_steps]
        guidance = self.family.description.pipeline_guidance(self.family.options, s.guidance_scale)
        out = []
        for run in runs:
            slot, prompt, first = run[0]
            request: dict[str, Any] = {
                "prompt": self.prompts.prompts[prompt],
                "seed": self.sample_seed(slot, first),
                "generator_device": "cpu",
                "width": self.width,
                "height": self.height,
                "num_inference_steps": self.num_steps,
                "num_outputs_per_prompt": len(run),
                "rollout_sde_type": sde_type,
                "rollout_noise_level": float(self.spec.noise_level) if stochastic else 0.0,
                "rollout_log_prob_no_const": no_const,
                "rollout_sde_step_indices": list(steps) if stochastic else [],
                "rollout_return_dit_trajectory": True,
                "rollout_return_step_indices": returned,
                "rollout_debug_mode": bool(self.spec.keep_mean or o.debug_alignment),
                "suppress_logs": True,
                **{k: float(v) for k, v in guidance.items() if k == "guidance_scale" or v > 1.0},
            }
            if s.guidance_scale > 1.0 and s.negative_prompt is not None:
                request["negative_prompt"] = s.negative_prompt
            out.append(request)
        return out

    def sample_seed(self, slot: int, sample: int) -> int:
        """The engine seed of sample ``sample`` of prompt slot ``slot``: sglang's i-th output of
        a request seeded ``s`` draws from ``s + i``."""
        return derive_seed(self.config.run.seed, "sglang", slot) % (2**63 - SEED_SPAN) + sample

    def _batch(
        self,
        chunk: list[tuple[int, int, int]],
        micro_group: int,
        steps: list[int],
        answers: list[dict[str, Any]],
    ) -> RolloutBatch:
        b = len(chunk)
        if len(answers) != b:
            raise EngineServerError(f"/rollout/generate returned {len(answers)} images for {b} samples")
        index = [p for _, p, _ in chunk]
        prompts = [self.prompts.prompts[p] for p in index]
        keep = self.spec.keep_trajectory and self.kernel.stochastic and bool(steps)
        returned = sorted({*steps, *(i + 1 for i in steps), self.num_steps}) if keep else [self.num_steps]
        latents = torch.stack([as_tensor(a, "dit_trajectory", "latents") for a in answers])  # (B, R, ...)
        if latents.shape[1] != len(returned):
            raise EngineServerError(
                f"/rollout/generate returned {latents.shape[1]} trajectory latents, asked for {len(returned)}"
            )
        self._check_sigmas(as_tensor(answers[0], "dit_trajectory", "sigmas"))
        at = {step: k for k, step in enumerate(returned)}

        def unpack(x: torch.Tensor) -> torch.Tensor:  # (B, ...) in the transformer's layout
            return self.family.unpack_latents(x.float(), self.height, self.width)

        images = torch.stack([as_tensor(a, "generated_output") for a in answers])
        cond = self.family.encode_prompts(prompts, self.prompts.sources(index, self.height, self.width))
        batch = RolloutBatch(
            prompts=prompts,
            metadata=self.prompts.reward_metadata(index, self.height, self.width),
            prompt_index=torch.tensor(index),
            sample_index=torch.tensor([j for _, _, j in chunk]),
            group_id=torch.tensor([q for q, _, _ in chunk]),
            micro_group=torch.full((b,), micro_group),
            x0=unpack(latents[:, at[self.num_steps]]),
            cond=cond.to("cpu"),
            images=quantize(images.float()),
            sigmas=self.sigmas.expand(b, -1).clone(),
        )
        if keep:
            step_idx = torch.tensor(steps, dtype=torch.long)
            batch.traj_x = torch.stack([unpack(latents[:, at[i]]) for i in steps], 1)
            batch.traj_next = torch.stack([unpack(latents[:, at[i + 1]]) for i in steps], 1)
            batch.traj_step = step_idx.expand(b, -1).clone()
            batch.traj_sigma = self.sigmas[step_idx].expand(b, -1).clone()
            batch.traj_sigma_next = self.sigmas[step_idx + 1].expand(b, -1).clone()
            if self.spec.keep_log_prob:
                log_probs = torch.stack([as_tensor(a, "rollout_log_probs") for a in answers]).float()
                batch.traj_log_prob = log_probs[:, step_idx]
            if self.spec.keep_mean:
                means = torch.stack(
                    [as_tensor(a, "rollout_debug_tensors", "rollout_prev_sample_means") for a in answers]
                )
                batch.traj_mean = torch.stack([unpack(means[:, i]) for i in steps], 1)
            if self.options.debug_alignment:
                self._check_alignment(batch, answers, steps)
        return batch

    def _check_sigmas(self, sigmas: torch.Tensor) -> None:
        ours = self.sigmas.float()
        if sigmas.shape != ours.shape or (sigmas.float() - ours).abs().max() > SIGMA_TOLERANCE:
            raise EngineServerError(
                f"the sglang server sampled with the sigmas {[round(x, 5) for x in sigmas.tolist()]}, "
                f"diffrl's schedule is {[round(x, 5) for x in ours.tolist()]}: the replay would score "
                "other transitions (check sampling.num_steps and the model's scheduler config)"
            )

    def _check_alignment(self, batch: RolloutBatch, answers: list[dict[str, Any]], steps: list[int]) -> None:
        """diffrl's kernel on the engine's own velocity (debug ``rollout_model_outputs``) against
        the engine's log-probs: the first step and row beyond 1e-4 go to ``alignment-*.json``."""
        outputs = torch.stack(
            [as_tensor(a, "rollout_debug_tensors", "rollout_model_outputs") for a in answers]
        )
        sigma_max = self.sigmas[1].item()
        worst: dict[str, Any] | None = None
        for k, i in enumerate(steps):
            v = self.family.unpack_latents(outputs[:, i].float(), self.height, self.width)
            out = self.kernel.step(
                batch.traj_x[:, k],
                v,
                batch.traj_sigma[:, k],
                batch.traj_sigma_next[:, k],
                noise_level=self.spec.noise_level,
                sigma_max=sigma_max,
                prev_sample=batch.traj_next[:, k],
            )
            diff = (out.log_prob - batch.traj_log_prob[:, k]).abs()
            self.metrics["rollout/engine_kernel_log_prob_diff"] = max(
                self.metrics.get("rollout/engine_kernel_log_prob_diff", 0.0), diff.max().item()
            )
            if worst is None and diff.max() > 1e-4:
                row = int(diff.argmax())
                worst = {
                    "step": i,
                    "row": row,
                    "prompt": batch.prompts[row],
                    "sample": int(batch.sample_index[row]),
                    "engine_log_prob": batch.traj_log_prob[row, k].item(),
                    "diffrl_log_prob": out.log_prob[row].item(),
                    "sigma": batch.traj_sigma[row, k].item(),
                }
        if worst is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path = self.run_dir / f"alignment-{time.time_ns()}.json"
            path.write_text(json.dumps(worst, indent=1))

    def take_metrics(self) -> dict[str, float]:
        """Seconds per stage (``denoise``: the servers' round trips; ``decode``: the answers to a
        batch, the prompts encoded here), the last sync's figures and the restarts so far; starts
        afresh."""
        out = {**self.clock.take(), **self.metrics, "rollout/engine_restarts": float(self.restarts)}
        self.metrics = {}
        return out
