"""torch's process-wide settings, which a plugin must leave as it found them.

``torch.set_default_dtype(torch.float64)`` in a reward (or ``set_default_device``,
``set_num_threads``, ``use_deterministic_algorithms``, ``set_float32_matmul_precision``, a bare
``torch.set_grad_enabled(False)``) would change every tensor diffrl makes afterwards, and so the
training numbers, without a word. Where diffrl calls a plugin it compares these settings before
and after (:func:`guarding`): a change is put back and is that plugin's error
(:class:`~diffrl.core.user_code.GlobalStateChanged`), naming the setting. The driver also compares
them once per iteration (code that runs in no guarded call, e.g. a model family's forward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

from diffrl.core.user_code import GlobalStateChanged


@dataclass(frozen=True)
class TorchSettings:
    """The settings compared: each field's name is how the message names it."""

    default_dtype: torch.dtype
    default_device: str
    num_threads: int
    deterministic_algorithms: bool
    float32_matmul_precision: str
    anomaly_detection: bool
    grad_enabled: bool
    """Per thread: compared only where the plugin ran on the thread that compares."""


SETTERS = {
    "default_dtype": "torch.set_default_dtype",
    "default_device": "torch.set_default_device",
    "num_threads": "torch.set_num_threads",
    "deterministic_algorithms": "torch.use_deterministic_algorithms",
    "float32_matmul_precision": "torch.set_float32_matmul_precision",
    "anomaly_detection": "torch.autograd.set_detect_anomaly",
    "grad_enabled": "torch.set_grad_enabled",
}


def current() -> TorchSettings:
    return TorchSettings(
        default_dtype=torch.get_default_dtype(),
        default_device=str(torch.get_default_device()),
        num_threads=torch.get_num_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        anomaly_detection=torch.is_anomaly_enabled(),
        grad_enabled=torch.is_grad_enabled(),
    )


def changes(before: TorchSettings, after: TorchSettings, grad: bool = True) -> list[str]:
    """``default_dtype torch.float32 -> torch.float64 (torch.set_default_dtype)`` for each setting
    that differs (``grad``: compare grad mode too)."""
    return [
        f"{f.name} {getattr(before, f.name)} -> {getattr(after, f.name)} ({SETTERS[f.name]})"
        for f in fields(TorchSettings)
        if (grad or f.name != "grad_enabled") and getattr(before, f.name) != getattr(after, f.name)
    ]


def restore(settings: TorchSettings, grad: bool = True) -> None:
    """Put ``settings`` back (``grad``: grad mode too, on this thread)."""
    now = current()
    if now.default_dtype != settings.default_dtype:
        torch.set_default_dtype(settings.default_dtype)
    if now.default_device != settings.default_device:
        torch.set_default_device(settings.default_device)
    if now.num_threads != settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    if now.deterministic_algorithms != settings.deterministic_algorithms:
        torch.use_deterministic_algorithms(settings.deterministic_algorithms)
    if now.float32_matmul_precision != settings.float32_matmul_precision:
        torch.set_float32_matmul_precision(settings.float32_matmul_precision)
    if now.anomaly_detection != settings.anomaly_detection:
        torch.autograd.set_detect_anomaly(settings.anomaly_detection)
    if grad and now.grad_enabled != settings.grad_enabled:
        torch.set_grad_enabled(settings.grad_enabled)


def changed_error(who: str, what: list[str], when: str = "") -> GlobalStateChanged:
    return GlobalStateChanged(
        f"{who} changed torch's process-wide settings{when}: {'; '.join(what)}. That changes how "
        "everything after it computes (the training numbers); a plugin must leave them as it found "
        "them: pass dtype=/device= to the calls that need them, or use a context manager (with "
        "torch.no_grad(), torch.autocast(...)); the settings were put back"
    )


@contextmanager
def guarding(who: Callable[[], str] | str, grad: bool = True) -> Iterator[None]:
    """Around a plugin's call: a setting it changed is put back and raises
    :class:`GlobalStateChanged` naming ``who`` (``plugin 'pkg.mod:Name'``; a callable is asked
    only then). ``grad=False`` where the call runs on a thread whose grad mode is its own."""
    before = current()
    yield
    what = changes(before, current(), grad)
    if what:
        restore(before, grad)
        raise changed_error(who() if callable(who) else who, what)
