"""Plugins that return or do the wrong thing (issue 36, class 1), named by dotted path
(``tests.hostile_plugins:LossVector``) in ``tests/integration/test_hostile_plugins.py``.

Each algorithm is the tiny SFT with one method that breaks the interface; each fails on its first
call, so a row trains no further than that call.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from diffrl.algorithms.sft import SFT
from diffrl.core.rollout import TrainSignals
from diffrl.models.tiny import TinyDescription, TinyFamily
from diffrl.rewards.base import Reward
from diffrl.sampling.kernels import FlowSDE

# ---- an algorithm's compute_loss: (a 0-dim float tensor with gradients, {str: float}) ---------


class LossVector(SFT):
    def compute_loss(self, policy, examples):
        loss, metrics = super().compute_loss(policy, examples)
        return loss.expand(3), metrics


class LossGenerator(SFT):
    def compute_loss(self, policy, examples):
        yield super().compute_loss(policy, examples)


class MetricsNaN(SFT):
    def compute_loss(self, policy, examples):
        loss, _ = super().compute_loss(policy, examples)
        return loss, {"train/ratio": float("nan")}


# ---- the other methods the driver calls ---------------------------------------------------------


class SignalsNone(SFT):
    def postprocess_rewards(self, batch, rewards):
        return None


class SignalsTooShort(SFT):
    def postprocess_rewards(self, batch, rewards):
        return TrainSignals({"advantages": torch.zeros(len(batch) + 3)})


class ExamplesNone(SFT):
    def build_train_data(self, batch, signals, iteration):
        return None


class ExamplesDict(SFT):
    def build_train_data(self, batch, signals, iteration):
        return vars(super().build_train_data(batch, signals, iteration))


class BeforeUpdateNone(SFT):
    def before_update(self, policy, examples):
        return None


# ---- what validation asks -----------------------------------------------------------------------


class ValidateNone(SFT):
    def validate(self, config):
        return None


class ValidateText(SFT):
    def validate(self, config):
        return "the learning rate is too high"


class ValidateNumbers(SFT):
    def validate(self, config):
        return [1, 2]


class SpecNone(SFT):
    def collection_spec(self):
        return None


class ParamsDict(SFT):
    Params = dict


# ---- global state a plugin must leave as it found it -------------------------------------------


class SetsDefaultDtype(SFT):
    def compute_loss(self, policy, examples):
        torch.set_default_dtype(torch.float64)
        return super().compute_loss(policy, examples)


class SetsThreads(SFT):
    def compute_loss(self, policy, examples):
        torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
        return super().compute_loss(policy, examples)


def sets_default_dtype(images, prompts, metadata):
    torch.set_default_dtype(torch.float64)
    return [1.0] * len(images)


# ---- model families and trackers ---------------------------------------------------------------


class LoadsNone(TinyFamily):
    @classmethod
    def load(cls, path, device, dtype, options):
        return None


class LoadsTransformer(TinyFamily):
    @classmethod
    def load(cls, path, device, dtype, options):
        return super().load(path, device, dtype, options).transformer


class ScoresAsText(Reward):
    def __call__(self, images, prompts, metadata):
        return "high"


class NotAReward:
    """A class, but no Reward subclass."""

    def __init__(self):
        pass


class TrackerWithoutMethods:
    def __init__(self, run):
        self.run = run


class HangingTracker:
    """A tracker whose calls never return (a hosted service that stopped answering): its first,
    ``log_metadata`` at start-up, hangs (every call goes through the same deadline)."""

    def __init__(self, run):
        self.release = threading.Event()

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        self.release.wait(timeout=60)  # never set: a minute, not the whole test run

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        self.release.wait(timeout=60)

    def log_metadata(self, config, text: str) -> None:
        self.release.wait(timeout=60)

    def close(self, ok: bool) -> None:
        self.release.set()


class RequiresText(SFT):
    requires = "traj_log_prob"


class GeneratorExitInLoss(SFT):
    def compute_loss(self, policy, examples):
        raise GeneratorExit


class DecaysTwice(SFT):
    keeps_old_policy = True

    def old_policy_decay(self, optimizer_step):
        return 2.0


class AbstractAlgorithm(SFT.__mro__[1]):
    """A DiffusionAlgorithm that defines none of its abstract methods."""

    Params = SFT.Params


class SizeProblemsTextDescription(TinyDescription):
    @classmethod
    def size_problems(cls, config, check_files=True):
        return "too big"


class SizeProblemsText(TinyFamily):
    description = SizeProblemsTextDescription


class ForwardTuple(TinyFamily):
    """Returns the transformer's output as diffusers gives it with return_dict=False: a tuple."""

    def forward(self, module, x_t, sigma, cond):
        return (super().forward(module, x_t, sigma, cond),)


class ExitsWhenCollected:
    def __del__(self):
        raise SystemExit(3)


def drops_an_exiting_object(args, inputs) -> int:
    """A command body (``diffrl recipes``'s) whose plugin object calls sys.exit() in __del__."""
    ExitsWhenCollected()  # collected at once
    return 0


# ---- plugins whose call signature is not the one diffrl calls (issue 53, class 1): refused where
# the dotted path is resolved, before anything loads, naming the expected call


class RunnerTakesNothing:
    def __init__(self):
        pass


def strategy_of_one_argument(num_steps):
    return [0]


class LossTakesNothing(SFT):
    def compute_loss(self):  # the driver calls compute_loss(policy, examples)
        raise AssertionError("never called")


class VelocityTakesNothing(TinyFamily):
    def velocity(self):
        raise AssertionError("never called")


class StepTakesNothing(FlowSDE):
    def step(self):
        raise AssertionError("never called")


class EngineTakesNothing:
    def __init__(self):
        pass


def reward_of_images_only(images):
    return [0.0] * len(images)


class RewardCallTakesImagesOnly(Reward):
    def __call__(self, images):
        return torch.zeros(len(images))
