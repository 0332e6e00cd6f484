"""Rewards the tests name by dotted path (``tests.rewards:brightness``).

A module of their own, importing only torch: a Ray reward worker (and a reward server) imports
the module of the reward it runs, and a test module would bring diffrl's training world with it
(~3 CPU seconds a worker)."""

from __future__ import annotations

import itertools
import threading

import torch


def brightness(images, prompts, metadata):
    """The mean pixel value of each image."""
    return images.mean(dim=(1, 2, 3)).tolist()


def flaky(images, prompts, metadata):
    """NaN for the first image of every call (one per micro-group), brightness for the others."""
    return [float("nan")] + brightness(images[1:], prompts[1:], metadata[1:])


def pixel_sum(images, prompts, metadata):
    """A score that every pixel moves, each by a different weight: a pixel lost, moved or
    rounded differently on the way changes it."""
    weights = torch.linspace(0.5, 1.5, images[0].numel())
    return images.flatten(1) @ weights


CALLS = itertools.count()  # per process: each reward worker counts its own calls
WARM_UP = "warm up"


def hangs_on_second_call(images, prompts, metadata):
    """Scores 1.0, except that the second micro-group a worker gets (warm-up calls aside) hangs it."""
    if prompts[0] != WARM_UP and next(CALLS) == 1:
        threading.Event().wait()  # the worker is killed; nothing to release
    return [1.0] * len(images)
