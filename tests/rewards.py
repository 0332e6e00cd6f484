"""Rewards the tests name by dotted path (``tests.rewards:brightness``).

A module of their own, importing only torch: a Ray reward worker (and a reward server) imports
the module of the reward it runs, and a test module would bring diffrl's training world with it
(~3 CPU seconds a worker)."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading

import torch


def brightness(images, prompts, metadata):
    """The mean pixel value of each image."""
    return images.mean(dim=(1, 2, 3)).tolist()


def contrast(images, prompts, metadata):
    """Each image's pixel std over its own pixels and channels (images in [0, 1]): the detail a
    washed-out or flat image has lost (benchmarks/hacking.py watches it)."""
    return images.flatten(1).std(dim=1, unbiased=False).tolist()


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


# ---- rewards that end the process, or try to: each is that reward's failure, never the run's end


class Custom(BaseException):
    """A ``BaseException`` of a user's own (it is no ``Exception``)."""


def exits_zero(images, prompts, metadata):
    sys.exit(0)


def ends_the_process(images, prompts, metadata):
    os._exit(0)


def exits_three(images, prompts, metadata):
    sys.exit(3)


def exits_with_a_message(images, prompts, metadata):
    raise SystemExit("scorer: bad flag")


def raises_keyboard_interrupt(images, prompts, metadata):
    raise KeyboardInterrupt


def raises_generator_exit(images, prompts, metadata):
    raise GeneratorExit


def raises_its_own_base_exception(images, prompts, metadata):
    raise Custom("stop everything")


def wraps_an_argparse_tool(images, prompts, metadata):
    """A command-line scorer wrapped as a reward: argparse exits (2) on the flag it does not know."""
    parser = argparse.ArgumentParser(prog="scorer")
    parser.parse_args(["--images", "x"])
    return [1.0] * len(images)


def closes_stdout(images, prompts, metadata):
    sys.stdout.close()
    return [1.0] * len(images)
