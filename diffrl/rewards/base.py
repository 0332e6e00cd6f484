"""The reward interface: a batch of images + prompts + metadata -> one score per image.

A user's reward is a dotted path to either a :class:`Reward` subclass or a plain function with
the signature ``def my_reward(images, prompts, metadata, **params) -> list[float]``, where
``images`` is a float tensor ``(B, 3, H, W)`` in [0, 1], ``prompts`` a ``list[str]`` and
``metadata`` a ``list[dict]``. Params come from the recipe's ``params:`` mapping.

Videos (``(B, 3, F, H, W)``, from video families such as ``wan``): a reward is an image reward
unless it says otherwise (``Reward.video = True``, or a function with ``my_reward.video = True``);
an image reward scores every frame (``(B * F, 3, H, W)``, each video's prompt and metadata
repeated per frame) and each video gets the mean of its frames' scores (:func:`submit_scores`).

Sound (audio-video families such as ``ltx2``): a reward hears only if it says so (``Reward.audio =
True``, or ``my_reward.audio = True`` on a function). It is then called with ``audio=`` an
:class:`~diffrl.core.rollout.Audio` (float32 ``waveform (B, channels, samples)`` in [-1, 1] and its
``sample_rate``) and gets videos whole, one clip per row; every other reward sees the frames as
before and never the sound. The preflight refuses a reward that hears on a silent family.

Prompt groups: a reward that judges a prompt's samples together (ranks or compares them:
``openai_judge`` with ``judging: group``; ``Reward.judges_groups(params)``, and on the built reward
:attr:`Reward.by_group`) is also given ``groups=``, one int per sample (equal ints: the same
prompt group), by the callers that know them (the collector's ``group_id``, eval's prompt index).
Samples are never grouped by their prompt text: two prompts of the same text are two groups.

Deadlines: every call has ``timeout_s`` seconds (its :class:`RewardConfig`) from submit; a call
still unfinished then fails its samples (NaN, "timed out") and the run goes on. An in-process
reward is called on a daemon thread of its own (:class:`~diffrl.transport.workers.CallThread`), so
a call that never returns costs its deadline, not the run.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffrl.config import RewardConfig
from diffrl.config.binding import bind_signature
from diffrl.core import torch_state
from diffrl.core.errors import Abandoned, RewardError
from diffrl.core.interrupts import is_real_interrupt
from diffrl.core.registry import RegistryError, did_you_mean
from diffrl.core.rollout import Audio
from diffrl.core.user_code import GlobalStateChanged, describe, kind, plugin_named
from diffrl.logging.quiet import quiet_libraries
from diffrl.rewards.registry import REWARDS
from diffrl.transport.workers import CallThread, DeadlineExceeded, deadline_after, result_by


class Pending:
    """A score being computed: ``result()`` returns ``(B,)`` scores, raises what scoring raised,
    or raises :class:`DeadlineExceeded` once the deadline given at submit has passed (``finish``
    must give up by then)."""

    def __init__(self, finish: Callable[[], Any]):
        self._finish = finish

    def result(self) -> torch.Tensor:
        return as_scores(self._finish())


def as_scores(scores: Any) -> torch.Tensor:
    """What a reward returned, as float32 scores; a :class:`RewardError` saying what it returned
    when that is no list of numbers (a generator, a dict, None, text, ragged lists)."""
    try:
        return torch.as_tensor(scores, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise RewardError(
            f"returned {kind(scores)}, which is no list of numbers ({e}); it must return one float "
            "per image: a list of floats or a (B,) tensor"
        ) from None


class Reward(ABC):
    name: str = "reward"
    video: bool = False
    """True: ``__call__`` takes videos ``(B, 3, F, H, W)`` whole; False: an image reward (videos
    are scored frame by frame and averaged, see :func:`submit_scores`)."""
    audio: bool = False
    """True: the reward hears. ``submit``, ``call_by`` and ``__call__`` take ``audio=`` (an
    :class:`~diffrl.core.rollout.Audio`, float32, one clip per row) and videos come whole, as for a video
    reward. False: it never sees the sound."""
    clip_folders: tuple[str, str | None] | None = None
    """A CLIP-family reward's ``(CLIPModel folder param, image processor folder param or None: the
    model's folder)``: the CLIP ``monitor.clip_every`` embeds with when ``monitor.clip`` is unset
    (:mod:`diffrl.preflight.monitor`). None: the reward holds no ``CLIPModel`` folder."""
    by_group: bool = False
    """True: this reward judges a prompt's samples together (:meth:`judges_groups` of its params;
    :func:`build_reward` sets it). ``submit``, ``call_by`` and ``__call__`` take ``groups=``: one
    int per sample, equal for the samples of one prompt group (None: the caller knows none).
    False: it is never given ``groups``."""

    @abstractmethod
    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> scores ``(B,)`` float32."""

    def submit(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]],
        timeout: float | None = None,
        audio: Audio | None = None,
        groups: Sequence[int] | None = None,
    ) -> Pending:
        """Start scoring and return at once; the call has ``timeout`` seconds from now (``None``:
        no limit). By default ``__call__`` runs on this reward's call thread, one call at a time in
        submit order. A reward that runs elsewhere (worker processes, a remote server) overrides
        this; its :class:`Pending` must give up at the deadline. ``audio`` is given only to a
        reward that hears (:attr:`audio`), ``groups`` only to one that judges groups
        (:attr:`by_group`)."""
        calls = self.__dict__.get("_calls")  # made here: subclasses need not call super().__init__()
        if calls is None:
            calls = self._calls = CallThread(f"reward-{self.name}")
        deadline = deadline_after(timeout)
        future = calls.submit(
            _without_grad, self, images, prompts, metadata, deadline, audio, groups, timeout=timeout
        )
        return Pending(lambda: result_by(future, deadline))

    def call_by(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]],
        deadline: float | None,
        audio: Audio | None = None,
        groups: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """What :meth:`submit` runs on the call thread: ``__call__``, told the call's deadline
        (``time.monotonic()``; None: no limit). A reward that can use it (the ``remote`` reward's
        retries stop by it) overrides this. ``audio`` is passed on to a reward that hears,
        ``groups`` to one that judges groups."""
        return self(images, prompts, metadata, **_extras(self, audio, groups))

    @classmethod
    def hears(cls, params: dict[str, Any]) -> bool:
        """Whether the reward built from ``params`` hears (:attr:`audio`), known before it is built
        (a reward whose params decide it, as ``remote``'s ``audio``, overrides this)."""
        return cls.audio

    @classmethod
    def judges_groups(cls, params: dict[str, Any]) -> bool:
        """Whether the reward built from ``params`` scores a prompt's samples together (ranks or
        compares them: ``openai_judge`` with ``judging: group``), so that one call must hold each
        prompt's samples whole; preflight then checks the batch arithmetic gives it that. The
        built reward's :attr:`by_group` is then set, and it is given ``groups=``."""
        return False

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        """What is wrong with ``params`` (the recipe's ``params:`` mapping), found without loading
        anything: preflight reports it, under the reward's place in the config, before any model
        loads. ``check_files``: also check what the params point at on this machine (a weights
        folder that is missing or holds another model). Unknown param names are checked already
        (against ``__init__``'s signature)."""
        return []

    def use_in_process(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Score in the calling process (a Ray reward worker is already a process of its own)."""

    def start(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Start what the first call would otherwise wait for (worker processes, a model load) in
        the background, and return at once. Called once the reward is built into a reward set
        (after :meth:`use_in_process`), so it overlaps the trainer's own start and first
        sampling."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release worker processes or remote sessions (:meth:`RewardSet.close` also ends the
        reward's call thread)."""


def _extras(reward: Reward, audio: Audio | None, groups: Sequence[int] | None) -> dict[str, Any]:
    """The keyword arguments ``reward`` takes beyond images, prompts and metadata: ``audio`` if it
    hears, ``groups`` if it judges groups (a reward that does neither keeps its plain signature)."""
    extras: dict[str, Any] = {}
    if reward.audio:
        extras["audio"] = audio
    if reward.by_group:
        extras["groups"] = groups
    return extras


def _without_grad(
    reward: Reward,
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata,
    deadline: float | None,
    audio: Audio | None,
    groups: Sequence[int] | None,
) -> torch.Tensor:
    # grad mode is per thread: the call thread's would be on, where the collector samples without;
    # the process-wide settings are the run's (a reward's change is its error: torch_state)
    with torch.no_grad(), torch_state.guarding(lambda: _named(reward), grad=False):
        return reward.call_by(images, prompts, metadata, deadline, **_extras(reward, audio, groups))


def _named(reward: Reward) -> str:
    return plugin_named(reward.fn if isinstance(reward, FunctionReward) else reward)


class FunctionReward(Reward):
    """Adapts ``fn(images, prompts, metadata, **params) -> list[float]`` (with ``fn.audio = True``:
    ``fn(images, prompts, metadata, audio=..., **params)``)."""

    def __init__(self, fn: Callable[..., Any], name: str, **params: Any):
        self.fn, self.name, self.params = fn, name, params
        self.video = bool(getattr(fn, "video", False))
        self.audio = bool(getattr(fn, "audio", False))

    def __call__(self, images, prompts, metadata, audio: Audio | None = None):
        sound = {"audio": audio} if self.audio else {}
        return as_scores(self.fn(images, list(prompts), list(metadata), **sound, **self.params))


@dataclass
class RewardOutput:
    """``total (B,)``: weighted sum; ``per_reward``: each reward's raw ``(B,)`` scores.

    A sample whose score could not be had (the reward raised, returned NaN or missed its
    deadline) has a NaN total; ``errors`` says why. ``timed_out (B,)`` bool: the samples a
    reward's deadline failed (all False if none given).
    """

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    errors: list[str] = field(default_factory=list)
    timed_out: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.timed_out is None:
            self.timed_out = torch.zeros(self.total.shape, dtype=torch.bool)

    @classmethod
    def cat(cls, parts: Sequence[RewardOutput]) -> RewardOutput:
        """Concatenate the outputs of consecutive chunks of samples."""
        return cls(
            torch.cat([p.total for p in parts]),
            {k: torch.cat([p.per_reward[k] for p in parts]) for k in parts[0].per_reward},
            [e for p in parts for e in p.errors],
            torch.cat([p.timed_out for p in parts]),
        )

    @classmethod
    def combine(cls, outs: Sequence[RewardOutput]) -> RewardOutput:
        """Sum the outputs of several reward sets on the same samples (their totals are weighted)."""
        timed_out = outs[0].timed_out.clone()
        for o in outs[1:]:
            timed_out |= o.timed_out
        return cls(
            sum((o.total for o in outs[1:]), outs[0].total.clone()),
            {k: v for o in outs for k, v in o.per_reward.items()},
            [e for o in outs for e in o.errors],
            timed_out,
        )

    @classmethod
    def late(cls, cfg: RewardConfig, n: int, label: str | None = None) -> RewardOutput:
        """``n`` samples that ``cfg``'s reward (``label``: its key in ``per_reward``, see
        :func:`reward_labels`) did not score by its deadline."""
        nan = torch.full((n,), float("nan"))
        return cls(
            nan.clone(), {label or cfg.name: nan}, [timeout_message(cfg)], torch.ones(n, dtype=torch.bool)
        )

    def metrics(self, prefix: str) -> dict[str, float]:
        """Each reward's raw scores: ``{prefix}/{label}/mean|std|min|max`` over the samples it
        scored, and ``{prefix}/{label}/failed``, the samples it failed (raised, NaN, late)."""
        out = {}
        for label, scores in self.per_reward.items():
            ok = torch.isfinite(scores)
            out[f"{prefix}/{label}/failed"] = float((~ok).sum())
            if ok.any():
                good = scores[ok].double()
                out[f"{prefix}/{label}/mean"] = good.mean().item()
                out[f"{prefix}/{label}/std"] = good.std(unbiased=False).item()
                out[f"{prefix}/{label}/min"] = good.min().item()
                out[f"{prefix}/{label}/max"] = good.max().item()
        return out


def reward_labels(configs: Sequence[RewardConfig]) -> list[str]:
    """Each reward's key in :attr:`RewardOutput.per_reward` and the metrics: its name, or
    ``name#i`` (its index in the list) when several rewards of a run share a name (e.g. two
    ``remote`` rewards on different servers)."""
    names = [c.name for c in configs]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def prompts_note(prompts: Sequence[str], shown: int = 3, width: int = 60) -> str:
    """The batch's prompts for an error message: the first ``shown``, each cut at ``width``."""
    cut = [p if len(p) <= width else p[: width - 3] + "..." for p in prompts[:shown]]
    more = f" and {len(prompts) - shown} more" if len(prompts) > shown else ""
    return f"on prompts {', '.join(repr(p) for p in cut)}{more}"


def timeout_message(cfg: RewardConfig) -> str:
    return (
        f"reward {cfg.name!r} timed out after {cfg.timeout_s:g} s (counted from submit); if it is "
        "slow rather than stuck, raise its timeout_s or give it more workers"
    )


def submit_scores(
    reward: Reward,
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[dict[str, Any]],
    timeout: float | None = None,
    audio: Audio | None = None,
    groups: Sequence[int] | None = None,
) -> Pending:
    """``reward.submit`` for images ``(B, 3, H, W)`` or videos ``(B, 3, F, H, W)``: an image reward
    given videos scores their ``B * F`` frames and the ``(B,)`` result is each video's mean. A
    reward that hears gets the videos whole and ``audio``; no other reward sees ``audio``. A reward
    that judges groups (:attr:`Reward.by_group`) gets ``groups`` (one int per sample, a frame
    that of its video); no other reward sees it."""
    if reward.audio or images.ndim != 5 or reward.video:
        return reward.submit(images, prompts, metadata, timeout, **_extras(reward, audio, groups))
    b, f = images.shape[0], images.shape[2]
    frames = images.transpose(1, 2).flatten(0, 1)  # (B * F, 3, H, W), video-major
    per_frame = (
        {}
        if not reward.by_group
        else {"groups": None if groups is None else [g for g in groups for _ in range(f)]}
    )
    pending = reward.submit(
        frames,
        [p for p in prompts for _ in range(f)],
        [m for m in metadata for _ in range(f)],
        timeout,
        **per_frame,
    )

    def mean_per_video() -> torch.Tensor:
        scores = pending.result()
        if scores.shape != (b * f,):
            raise ValueError(
                f"returned shape {tuple(scores.shape)} for {b} videos of {f} frames, expected one "
                f"score per frame ({b * f},)"
            )
        return scores.view(b, f).mean(dim=1)

    return Pending(mean_per_video)


def takes_audio(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called with ``audio=`` (it names it, or takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: cannot tell, let it be
        return True
    return "audio" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def hearing_problems(obj: Any, params: dict[str, Any]) -> list[str]:
    """A reward that hears but cannot be called with ``audio=``: a function with ``fn.audio = True``
    and no ``audio`` parameter, or a :class:`Reward` whose ``__call__``, ``submit`` or ``call_by``
    takes no ``audio`` (each is called with it)."""
    if isinstance(obj, type) and issubclass(obj, Reward):
        if not obj.hears(params):
            return []
        missing = [m for m in ("__call__", "submit", "call_by") if not takes_audio(getattr(obj, m))]
        return [
            f"{obj.__name__} hears (audio = True), so its {m} is called with audio=; add an "
            f"audio: Audio | None = None parameter to it"
            for m in missing
        ]
    if callable(obj) and getattr(obj, "audio", False) and not takes_audio(obj):
        name = getattr(obj, "__name__", "the function")
        return [
            f"{name} hears ({name}.audio = True), so it is called with audio=; give it an audio "
            f"parameter: def {name}(images, prompts, metadata, audio, ...)"
        ]
    return []


def param_name_problems(obj: Any, params: dict[str, Any]) -> list[str]:
    """Names in ``params`` that the reward ``obj`` (a Reward class or a function) does not take,
    each with a did-you-mean (none when it takes ``**kwargs``), and :func:`hearing_problems`."""
    problems = hearing_problems(obj, params)
    return problems + _unknown_params(obj, params)


def _unknown_params(obj: Any, params: dict[str, Any]) -> list[str]:
    fn = obj.__init__ if isinstance(obj, type) else obj
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return []
    taken = [
        n
        for n, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"
    ]
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return []
    if not isinstance(obj, type):
        taken = taken[3:]  # images, prompts, metadata
        if getattr(obj, "audio", False):
            taken = [n for n in taken if n != "audio"]
    return [
        f"unknown param {k!r}.{did_you_mean(k, taken)} It takes: {', '.join(taken) or 'no params'}"
        for k in params
        if k not in taken
    ]


def reward_kind_problem(obj: Any) -> str | None:
    """What makes ``obj`` (what a reward's dotted path names) no reward: a class that is not a
    :class:`Reward` subclass (it would be called as a function, its instance taken for scores), an
    abstract one, or something that cannot be called."""
    shape = (
        "subclass diffrl.rewards.base.Reward (its __call__(images, prompts, metadata) returns (B,) "
        "scores), or name a function def score(images, prompts, metadata) -> list[float]"
    )
    if isinstance(obj, type):
        if not issubclass(obj, Reward):
            return f"is a class but not a Reward subclass; {shape}"
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(obj.__abstractmethods__))
            return f"is an abstract Reward (it does not define {missing}); define it"
        return None
    if not callable(obj):
        return f"is {kind(obj)}, neither a Reward class nor a function; {shape}"
    return None


REWARDS.check = reward_kind_problem  # defined with the Reward class: the registry module is below it


def build_reward(cfg: RewardConfig) -> Reward:
    obj = REWARDS.resolve(cfg.name)
    quiet_libraries()  # the reward's libraries are imported now: no loading bars of theirs in the log
    if problems := hearing_problems(obj, cfg.params if isinstance(cfg.params, dict) else {}):
        raise RegistryError(f"reward {cfg.name!r}: " + "; ".join(problems))
    if isinstance(obj, type) and issubclass(obj, Reward):
        if "timeout" not in inspect.signature(obj.submit).parameters:
            raise RegistryError(
                f"reward {cfg.name!r}: {obj.__name__}.submit takes no timeout; rewards have deadlines, "
                "so it must be submit(self, images, prompts, metadata, timeout=None) and its Pending "
                "must give up `timeout` seconds after submit (raise DeadlineExceeded)"
            )
        try:
            reward = obj(**_bound(obj.__init__, cfg))
        except TypeError as e:
            params = ", ".join(p for p in inspect.signature(obj.__init__).parameters if p != "self")
            raise RegistryError(
                f"reward {cfg.name!r}: bad params {cfg.params} ({e}); it takes: {params}"
            ) from e
        if obj.judges_groups(cfg.params):
            reward.by_group = True
        return reward
    if callable(obj):
        return FunctionReward(obj, cfg.name, **_bound(obj, cfg))
    raise RegistryError(
        f"reward {cfg.name!r} resolves to {obj!r}, which is neither a Reward class nor a function"
    )


def _bound(fn: Callable[..., Any], cfg: RewardConfig) -> dict[str, Any]:
    """``cfg.params`` bound to ``fn``'s annotations as preflight checked them (``num_workers: 2.0``
    is the int 2, as for any config field)."""
    return bind_signature(fn, cfg.params, f"{cfg.name}.params")[0]


def reward_key(cfg: RewardConfig) -> str:
    """What makes two reward entries the same reward: its name and params (as written; weight and
    ``timeout_s`` belong to the reward set, not to the reward)."""
    return json.dumps([cfg.name, cfg.params], sort_keys=True, default=repr)


class SharedRewards:
    """The rewards of one process, each built (and started) once per :func:`reward_key`: the
    reward sets built from it (a run's training and eval rewards) share them, so OCR's worker pool
    or a reward model is started and held once. Whoever makes it closes it, once, at the end.

    Sharing is safe because a reward's calls queue (its call thread, its pool), and the scores of
    a call depend only on its images and prompts. ``in_process``: every reward scores in this
    process (:meth:`Reward.use_in_process`).
    """

    def __init__(self, in_process: bool = False):
        self.in_process = in_process
        self._built: dict[str, Reward] = {}

    def get(self, cfg: RewardConfig) -> Reward:
        """``cfg``'s reward: the one built already for the same name and params, or a new one."""
        key = reward_key(cfg)
        if key not in self._built:
            reward = build_reward(cfg)
            if self.in_process:
                reward.use_in_process()
            reward.start()
            self._built[key] = reward
        return self._built[key]

    def close(self) -> None:
        """Close every reward (its workers, sessions) and end its call thread."""
        built, self._built = list(self._built.values()), {}
        for r in built:
            r.close()
            if (calls := r.__dict__.get("_calls")) is not None:
                calls.close()


class RewardSet:
    """Rewards combined as a weighted sum (a run's training rewards, or its eval rewards).

    ``shared``: take the rewards from it (built once per name and params, see
    :class:`SharedRewards`), which its maker closes; without it the set builds its own and
    :meth:`close` closes them.
    """

    def __init__(
        self,
        configs: Sequence[RewardConfig],
        in_process: bool = False,
        labels: Sequence[str] | None = None,
        shared: SharedRewards | None = None,
    ):
        self.configs = list(configs)
        self.labels = list(labels) if labels is not None else reward_labels(self.configs)
        self._own = SharedRewards(in_process) if shared is None else None
        source = shared if shared is not None else self._own
        if in_process and not source.in_process:
            raise ValueError("in_process=True with a SharedRewards that is not in_process: make it so")
        self.rewards = [source.get(c) for c in self.configs]

    def submit(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        audio: Audio | None = None,
        groups: Sequence[int] | torch.Tensor | None = None,
    ) -> PendingRewards:
        """Start every reward on ``images``: float in [0, 1], or uint8 (:func:`quantize`, what
        rollouts keep); every reward gets float32 in [0, 1] on the CPU, a copy of its own (it may
        read it on another thread while the caller goes on). ``audio`` (the rollout's sound, any
        float dtype) goes, as float32 copies, to the rewards that hear. ``groups``: one int per
        sample, equal for one prompt's samples (a rollout's ``group_id``), given to the rewards that
        judge groups (:attr:`Reward.by_group`; one given none refuses to judge). Each reward's
        deadline starts now."""
        ids = None if groups is None else group_ids(groups, len(prompts))
        images = images.detach().cpu()
        images = (
            images.float() / 255.0 if images.dtype == torch.uint8 else images.to(torch.float32, copy=True)
        )
        pending = [
            _submitted(
                r, images, prompts, metadata, c.timeout_s, audio.float() if r.audio and audio else None, ids
            )
            for r, c in zip(self.rewards, self.configs)
        ]
        return PendingRewards(self, list(prompts), pending)

    def __call__(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        audio: Audio | None = None,
        groups: Sequence[int] | torch.Tensor | None = None,
    ) -> RewardOutput:
        """Score now; raise :class:`RewardError` if any reward fails, returns NaN or times out."""
        out = self.submit(images, prompts, metadata, audio, groups).result()
        if out.errors:
            raise RewardError("; ".join(out.errors))
        return out

    def close(self) -> None:
        """Close the rewards this set built (shared ones are closed by whoever shares them)."""
        if self._own is not None:
            self._own.close()


def group_ids(groups: Sequence[int] | torch.Tensor, n: int) -> list[int]:
    """``groups`` (a caller's: a rollout's ``group_id`` tensor, a list of prompt indices) as ``n``
    ints; a ``ValueError`` when they are not (a caller's bug, not a user's input)."""
    ids = groups.tolist() if isinstance(groups, torch.Tensor) else list(groups)
    if len(ids) != n or not all(isinstance(g, int) and not isinstance(g, bool) for g in ids):
        raise ValueError(f"groups must be {n} ints, one per sample, got {str(ids)[:200]}")
    return ids


def _submitted(reward: Reward, images, prompts, metadata, timeout, audio, groups) -> Pending:
    """:func:`submit_scores`; what a reward's own ``submit`` raises (it runs on the caller's
    thread), ``sys.exit()`` included, is handed to its :class:`Pending`: that reward's failure."""
    try:
        return submit_scores(reward, images, prompts, metadata, timeout, audio, groups)
    except BaseException as e:
        if isinstance(e, Abandoned) or is_real_interrupt(e):
            raise
        return Pending(_raiser(e))


def _raiser(error: BaseException) -> Callable[[], Any]:
    def fail() -> Any:
        raise error

    return fail


class PendingRewards:
    """The scores of one :meth:`RewardSet.submit`.

    Deadlines count from submit, not from :meth:`result`: the collector submits each micro-group
    as it is sampled and waits for all of them after the last. Counted from the wait, early
    micro-groups would get the whole sampling time on top, and the run could wait ``timeout_s``
    per micro-group for a reward that hangs; counted from submit, it waits at most
    ``max(timeout_s)`` past the last submit, and each deadline is enforced when it passes, so a
    hung call does not hold the reward's next calls until the wait. The price: a reward's calls
    run one at a time (its call thread, its pool's workers), so a call queued behind the same
    reward's earlier calls spends part of its deadline waiting. ``timeout_s`` bounds how late a
    score may come; a reward slower than sampling needs one that covers its queue (or more
    workers).
    """

    def __init__(self, owner: RewardSet, prompts: list[str], pending: list[Pending]):
        self.owner, self.prompts, self.pending = owner, prompts, pending
        self.n = len(prompts)

    def result(self) -> RewardOutput:
        """Gather every reward; failures and missed deadlines become NaN totals with a message
        naming the reward and the batch's prompts, never an exception or a hang. A failure is
        whatever the reward raised, ``BaseException`` included: its ``sys.exit()`` or
        ``KeyboardInterrupt`` (a call thread or worker is never sent a Ctrl-C) fails its samples
        as an ``Exception`` does, under the run's reward-failure policy."""
        per: dict[str, torch.Tensor] = {}
        total = torch.zeros(self.n)
        timed_out = torch.zeros(self.n, dtype=torch.bool)
        errors = []
        where = prompts_note(self.prompts)
        for cfg, label, pending in zip(self.owner.configs, self.owner.labels, self.pending):
            failed = True
            try:
                scores = pending.result().float().cpu()
                if scores.shape != (self.n,):
                    raise ValueError(
                        f"returned shape {tuple(scores.shape)}, expected one score per image ({self.n},)"
                    )
                failed = False
            except DeadlineExceeded:
                errors.append(f"{timeout_message(cfg)} ({where})")
                timed_out[:] = True
            except (Abandoned, GlobalStateChanged):  # the run's numbers are no longer its config's
                raise
            except BaseException as e:  # sys.exit(), KeyboardInterrupt, ...: the reward's failure too
                errors.append(f"reward {cfg.name!r} {describe(e)} ({where})")
            if failed:
                scores = torch.full((self.n,), float("nan"))
            bad = ~torch.isfinite(scores)
            if bad.any() and not failed:
                errors.append(f"reward {cfg.name!r} returned {int(bad.sum())} non-finite score(s) ({where})")
            per[label] = scores
            total = total + cfg.weight * scores
        return RewardOutput(total, per, errors, timed_out)
