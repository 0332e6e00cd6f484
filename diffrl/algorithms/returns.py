"""What an algorithm's methods must return, checked where diffrl calls them.

A user's algorithm (a dotted path) whose method returns the wrong kind (a loss of shape ``(3,)``,
a float, a loss without gradients, metrics that are no mapping of names to numbers, signals of
another length, ``None``) is a :class:`~diffrl.core.user_code.PluginError` naming it and what the
method must return, raised at the call: not a failure deep in diffrl's code ("a bug in diffrl").
The same check on one of diffrl's own algorithms is a ``RuntimeError`` (a bug).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch

from diffrl.core.rollout import CollectionSpec, TrainExamples, TrainSignals
from diffrl.core.user_code import is_diffrl_module, kind, path_of, returned_wrong

LOSS = (
    "(loss, metrics): loss a 0-dim floating-point tensor with gradients (e.g. per_sample.mean()), "
    "metrics a dict of str -> float (e.g. {'train/my_loss': loss.item()})"
)


def checked_loss(algorithm: Any, out: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``compute_loss``'s ``(loss, metrics)``, the metrics as floats."""
    if not isinstance(out, tuple) or len(out) != 2:
        raise returned_wrong(algorithm, "compute_loss()", kind(out), LOSS)
    loss, metrics = out
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.is_floating_point():
        raise returned_wrong(algorithm, "compute_loss()", f"a loss that is {kind(loss)}", LOSS)
    if not loss.requires_grad:
        raise returned_wrong(
            algorithm,
            "compute_loss()",
            "a loss without gradients (made under torch.no_grad(), detached, or from .item())",
            LOSS,
        )
    # a non-finite metric beside a non-finite loss is no error (the step is skipped:
    # train.max_nonfinite_steps), nor one of diffrl's own algorithms' (a diverging run's data)
    finite = bool(torch.isfinite(loss.detach())) and not is_diffrl_module(
        path_of(algorithm).partition(":")[0]
    )
    return loss, checked_metrics(algorithm, "compute_loss()", metrics, finite)


def checked_metrics(algorithm: Any, call: str, metrics: Any, finite: bool = True) -> dict[str, float]:
    """A mapping of str -> real number, as floats; ``finite``: each a finite one."""
    if not isinstance(metrics, Mapping):
        raise returned_wrong(algorithm, call, f"metrics that are {kind(metrics)}", LOSS)
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise returned_wrong(algorithm, call, f"a metric named {kind(k)}", LOSS)
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()  # a 0-dim tensor is a number (its .item())
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise returned_wrong(algorithm, call, f"metric {k!r} = {kind(v)}", LOSS)
        try:
            value = float(v)
        except OverflowError:  # an int beyond float's range
            value = math.inf
        if finite and not math.isfinite(value):
            raise returned_wrong(
                algorithm,
                call,
                f"metric {k!r} = {str(v) if len(str(v)) <= 40 else str(v)[:37] + '...'}",
                "finite metrics (one NaN makes the step's mean NaN; leave out a metric that has no "
                "value for this micro-batch)",
            )
        out[k] = value
    return out


def checked_signals(algorithm: Any, signals: Any, n: int) -> TrainSignals:
    """``postprocess_rewards``'s :class:`TrainSignals` for ``n`` samples: each a tensor ``(n, ...)``."""
    want = f"a TrainSignals whose values are tensors of one row per sample ({n},)"
    if not isinstance(signals, TrainSignals) or not isinstance(signals.values, Mapping):
        raise returned_wrong(algorithm, "postprocess_rewards()", kind(signals), want)
    for k, v in signals.values.items():
        if not isinstance(v, torch.Tensor) or v.ndim == 0 or v.shape[0] != n:
            raise returned_wrong(algorithm, "postprocess_rewards()", f"signal {k!r} = {kind(v)}", want)
    return signals


def checked_examples(algorithm: Any, call: str, examples: Any) -> TrainExamples:
    """``build_train_data``'s or ``before_update``'s :class:`TrainExamples`, with its
    ``sample_id (N,)``."""
    want = "the algorithm's TrainExamples (a dataclass subclass with a sample_id (N,) tensor)"
    if not isinstance(examples, TrainExamples):
        raise returned_wrong(algorithm, call, kind(examples), want)
    sample_id = getattr(examples, "sample_id", None)
    if not isinstance(sample_id, torch.Tensor) or sample_id.ndim != 1:
        raise returned_wrong(algorithm, call, f"examples whose sample_id is {kind(sample_id)}", want)
    return examples


def checked_spec(algorithm: Any, spec: Any) -> CollectionSpec:
    if not isinstance(spec, CollectionSpec):
        raise returned_wrong(
            algorithm,
            "collection_spec()",
            kind(spec),
            "a CollectionSpec (diffrl.core.rollout.CollectionSpec)",
        )
    return spec


def checked_decay(algorithm: Any, decay: Any) -> float:
    """``old_policy_decay``'s ``d`` in [0, 1]."""
    ok = isinstance(decay, numbers.Real) and not isinstance(decay, bool) and 0 <= decay <= 1
    if not ok:
        raise returned_wrong(algorithm, "old_policy_decay()", kind(decay), "a float in [0, 1]")
    return float(decay)
