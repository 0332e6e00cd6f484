"""Plugins that return or do the wrong thing (issue 36, class 1).

A user's algorithm, model family, reward or tracker (a dotted path) whose method returns the wrong
kind (a loss of shape ``(3,)``, a float, ``None``, a generator, a str where a list is due, signals
of another length), that changes torch's process-wide settings, that hangs or that leaves a thread
running: each is exit 2 (a reward's: the reward-failure policy, exit 3) with an ``error:`` line
that names the plugin's dotted path and what it must do, never "a bug in diffrl" (exit 70), never
a hang. The plugins are :mod:`tests.hostile_plugins`.

Rows run in-process through :func:`diffrl.cli.main`, like ``test_bad_inputs.py``'s table; a row
that trains (``trains=True``) runs one iteration of a tiny random model and fails at the first
call of the broken method (well under a second after the model is built).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import diffrl.launch
import diffrl.logging.trackers
from diffrl.algorithms.returns import checked_loss
from diffrl.config import RewardConfig
from diffrl.core import torch_state
from diffrl.core.registry import import_object
from diffrl.core.user_code import PluginError
from diffrl.rewards.base import FunctionReward, RewardError, RewardSet
from tests.hostile_plugins import LossVector
from tests.integration.test_bad_inputs import BAD, ROOT, SFT, Case, _check, _setup, run_row
from tests.integration.test_plugin_exits import TINY

H = "tests.hostile_plugins"
NFT = "recipes/tiny_nft_ocr.yaml"
# one iteration of a tiny random model: a plugin broken at its first call fails within a second
SFT1 = [
    "train",
    SFT,
    "run.output_dir={tmp}/run",
    "model.path=random",
    "model.options={}",
    "data.dataset_size=8",
    "train.iterations=1",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "eval.enabled=false",
]
NFT1 = ["train", NFT, "run.output_dir={tmp}/run", *TINY, "train.iterations=1"]
GRPO1 = ["train", "recipes/tiny_grpo_ocr_small.yaml", "run.output_dir={tmp}/run", *TINY, "train.iterations=1"]
"""The tiny NFT run of test_plugin_exits, one iteration (the last of a key given twice wins)."""
LOSS = "it must return (loss, metrics): loss a 0-dim floating-point tensor with gradients"
PROBLEMS = "it must return a list of str, one message per problem ([] when there is none)"
EXAMPLES = "it must return the algorithm's TrainExamples (a dataclass subclass with a sample_id (N,) tensor)"
SETTINGS = "changed torch's process-wide settings"


def algo(name: str) -> list[str]:
    return [*SFT1, f"algorithm.name={H}:{name}"]


# one row a line: the table reads down its columns
# fmt: off
CASES: list[Case] = [
    # ---- an algorithm's compute_loss returns the wrong kind (was exit 70: an error deep in the actor)
    Case("c1-loss-shape-3", algo("LossVector"), BAD, f"plugin '{H}:LossVector': compute_loss() returned a loss that is a float32 tensor of shape (3,); {LOSS}", trains=True),
    Case("c1-loss-generator", algo("LossGenerator"), BAD, f"plugin '{H}:LossGenerator': compute_loss() returned a generator (is there a yield in it?)", trains=True),
    Case("c1-metric-nan", algo("MetricsNaN"), BAD, f"plugin '{H}:MetricsNaN': compute_loss() returned metric 'train/ratio' = nan; it must return finite metrics", trains=True),
    Case("c1-loss-raises-generator-exit", algo("GeneratorExitInLoss"), BAD, f"plugin '{H}:GeneratorExitInLoss' raised GeneratorExit (at hostile_plugins.py:", trains=True),
    # ---- the other methods the driver calls (was: exit 70, or silently trained on)
    Case("c1-signals-none", algo("SignalsNone"), BAD, f"plugin '{H}:SignalsNone': postprocess_rewards() returned None; it must return a TrainSignals", trains=True),
    Case("c1-signals-wrong-length", algo("SignalsTooShort"), BAD, "postprocess_rewards() returned signal 'advantages' = a float32 tensor of shape (5,); it must return a TrainSignals whose values are tensors of one row per sample (2,)", trains=True),
    Case("c1-examples-none", algo("ExamplesNone"), BAD, f"plugin '{H}:ExamplesNone': build_train_data() returned None; {EXAMPLES}", trains=True),
    Case("c1-examples-dict", algo("ExamplesDict"), BAD, f"plugin '{H}:ExamplesDict': build_train_data() returned a dict (", trains=True),
    Case("c1-before-update-none", algo("BeforeUpdateNone"), BAD, f"plugin '{H}:BeforeUpdateNone': before_update() returned None; {EXAMPLES}", trains=True),
    Case("c1-old-policy-decay-2", algo("DecaysTwice"), BAD, f"plugin '{H}:DecaysTwice': old_policy_decay() returned a float (2.0); it must return a float in [0, 1]", trains=True),
    # ---- what validation asks of an algorithm: refused before anything loads
    Case("c1-validate-none", algo("ValidateNone"), BAD, f"plugin '{H}:ValidateNone': validate() returned None; {PROBLEMS}"),
    Case("c1-validate-str", algo("ValidateText"), BAD, f"plugin '{H}:ValidateText': validate() returned a str ('the learning rate is too high'); {PROBLEMS}", absent="  - t\n"),
    Case("c1-validate-numbers", algo("ValidateNumbers"), BAD, f"plugin '{H}:ValidateNumbers': validate() returned a list holding an int (1)"),
    Case("c1-collection-spec-none", algo("SpecNone"), BAD, f"plugin '{H}:SpecNone': collection_spec() returned None; it must return a CollectionSpec"),
    Case("c1-params-not-a-dataclass", algo("ParamsDict"), BAD, f"algorithm.name: '{H}:ParamsDict': its Params is a type (<class 'dict'>); it must be a dataclass"),
    Case("c1-requires-str", algo("RequiresText"), BAD, f"'{H}:RequiresText': its requires is a str ('traj_log_prob'); it must be a frozenset", absent="_, a, b"),
    Case("c1-algorithm-abstract", algo("AbstractAlgorithm"), BAD, f"'{H}:AbstractAlgorithm' does not define build_train_data, collection_spec, compute_loss, postprocess_rewards"),
    # ---- model families (was exit 70)
    Case("c1-family-load-none", [*SFT1, f"model.family={H}:LoadsNone"], BAD, f"plugin '{H}:LoadsNone': load() returned None; it must return an instance of LoadsNone", trains=True),
    Case("c1-family-load-transformer", [*SFT1, f"model.family={H}:LoadsTransformer"], BAD, f"plugin '{H}:LoadsTransformer': load() returned a SD3Transformer2DModel (", trains=True),
    Case("c1-family-forward-tuple", [*SFT1, f"model.family={H}:ForwardTuple"], BAD, f"plugin '{H}:ForwardTuple': forward() returned a tuple of 1 (a float32 tensor of shape (2, 3, 32, 64)); it must return the velocity, a tensor of x_t's shape (2, 3, 32, 64)", trains=True),
    Case("c1-family-size-problems-str", [*SFT1, f"model.family={H}:SizeProblemsText"], BAD, f"plugin '{H}:SizeProblemsText': size_problems() returned a str ('too big'); {PROBLEMS}"),
    # ---- rewards: the wrong kind of thing is refused at validation (was: found at the first score)
    Case("c1-reward-class-not-a-reward", [*NFT1, f"rewards=[{{name: {H}:NotAReward}}]"], BAD, f"rewards[0].name: '{H}:NotAReward' is a class but not a Reward subclass; subclass diffrl.rewards.base.Reward"),
    Case("c1-reward-not-callable", [*NFT1, "rewards=[{name: os:sep}]"], BAD, "rewards[0].name: 'os:sep' is a str ('/'), neither a Reward class nor a function"),
    # ---- trackers without the methods the driver calls (was exit 70 at the first log)
    Case("c1-tracker-without-methods", [*SFT1, f"run.loggers=[{H}:TrackerWithoutMethods]"], BAD, f"run.loggers[0]: '{H}:TrackerWithoutMethods' has no log_scalars, log_image, log_metadata, close method"),
    # ---- torch's process-wide settings changed by a plugin (was: trained on, silently changed)
    # ---- a plugin whose signature is not the call diffrl makes (was exit 70: "unexpected TypeError ... a bug in diffrl")
    Case("c1-runner-init-takes-nothing", [*SFT1, f"runner={H}:RunnerTakesNothing"], BAD, f"runner: '{H}:RunnerTakesNothing' cannot be called as diffrl calls it, Runner(config, algorithm, spec): its signature is RunnerTakesNothing() (too many positional arguments)"),
    Case("c1-step-strategy-one-argument", [*GRPO1, f"algorithm.params.step_strategy={{name: {H}:strategy_of_one_argument}}"], BAD, f"'{H}:strategy_of_one_argument' cannot be called as diffrl calls it, fn(num_steps, rollout_id, seed, **params): its signature is strategy_of_one_argument(num_steps)"),
    Case("c1-algorithm-loss-takes-nothing", algo("LossTakesNothing"), BAD, f"'{H}:LossTakesNothing' its compute_loss(self) cannot take diffrl's call compute_loss(policy, examples)"),
    Case("c1-family-velocity-takes-nothing", [*SFT1, f"model.family={H}:VelocityTakesNothing"], BAD, f"'{H}:VelocityTakesNothing' its velocity(self) cannot take diffrl's call velocity("),
    Case("c1-kernel-step-takes-nothing", [*NFT1, f"algorithm.params.sampler={H}:StepTakesNothing"], BAD, f"'{H}:StepTakesNothing' its step(self) cannot take diffrl's call step(x_t, velocity, sigma, sigma_next"),
    Case("c1-engine-init-takes-nothing", [*NFT1, f"rollout.engine={H}:EngineTakesNothing"], BAD, f"'{H}:EngineTakesNothing' cannot be called as diffrl calls it, Engine(config, family, spec, prompts)"),
    Case("c1-reward-function-images-only", [*NFT1, f"rewards=[{{name: {H}:reward_of_images_only}}]"], BAD, "cannot be called as diffrl calls it, fn(images, prompts, metadata, **params): its signature is reward_of_images_only(images)"),
    Case("c1-reward-call-images-only", [*NFT1, f"rewards=[{{name: {H}:RewardCallTakesImagesOnly}}]"], BAD, "its __call__(self, images) cannot take diffrl's call __call__(images, prompts, metadata)"),
    Case("c1-algorithm-sets-default-dtype", algo("SetsDefaultDtype"), BAD, f"plugin '{H}:SetsDefaultDtype' {SETTINGS}: default_dtype torch.float32 -> torch.float64 (torch.set_default_dtype)", trains=True),
    Case("c1-algorithm-sets-num-threads", algo("SetsThreads"), BAD, f"plugin '{H}:SetsThreads' {SETTINGS}: num_threads", trains=True),
    Case("c1-reward-sets-default-dtype", [*NFT1, f"rewards=[{{name: {H}:sets_default_dtype}}]"], BAD, f"plugin '{H}:sets_default_dtype' {SETTINGS}: default_dtype torch.float32 -> torch.float64", trains=True),
]
# fmt: on


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and all(i.startswith("c1-") for i in ids)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_a_hostile_plugin_is_named(case: Case, tmp_path, request, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    argv = _setup(case, tmp_path, request)
    before = torch_state.current()
    code, out, err = run_row(case, argv, monkeypatch, capsys)
    _check(case, code, out, err)
    assert "bug in diffrl" not in err
    assert torch_state.current() == before, "the plugin's change to torch's settings was not put back"


@pytest.mark.parametrize(
    ("returned", "what"),
    [
        (lambda n: (1.0 for _ in range(n)), "a generator (is there a yield in it?)"),
        (lambda n: {"score": 1.0}, "a dict ({'score': 1.0})"),
        (lambda n: None, "None"),
        (lambda n: ["high"] * n, "a list (['high', 'high'])"),
    ],
    ids=[
        "c1-reward-returns-generator",
        "c1-reward-returns-dict",
        "c1-reward-returns-none",
        "c1-reward-returns-text",
    ],
)
def test_a_reward_function_returning_no_numbers_says_so(returned, what):
    """A reward function's return that is no list of numbers: its failure says what it returned
    and what it must return (was: torch's "must be real number, not generator"); the run's
    reward-failure policy takes it from there (as for any reward error)."""
    reward = FunctionReward(lambda images, prompts, metadata: returned(len(images)), "mine:score")
    with pytest.raises(RewardError) as error:
        reward(torch.zeros(2, 3, 4, 4), ["a", "b"], [{}, {}])
    assert str(error.value).startswith(f"returned {what}, which is no list of numbers")
    assert "it must return one float per image: a list of floats or a (B,) tensor" in str(error.value)


def test_a_reward_class_returning_no_numbers_fails_its_samples_saying_so():
    """A Reward subclass's return goes through the same check (in its Pending), and its samples
    fail with that message (the reward-failure policy)."""
    rewards = RewardSet([RewardConfig(name=f"{H}:ScoresAsText")], in_process=True)
    try:
        result = rewards.submit(torch.zeros(2, 3, 4, 4), ["a", "b"], [{}, {}]).result()
    finally:
        rewards.close()
    assert result.errors[0].startswith(
        f"reward '{H}:ScoresAsText' raised RewardError: returned a str ('high'), which is no list of numbers"
    )
    assert torch.isnan(result.total).all()


def _with_grad() -> torch.Tensor:
    return torch.ones((), requires_grad=True) * 2


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        pytest.param(lambda: 1.5, "returned a float (1.5); " + LOSS, id="c1-loss-not-a-tuple-float"),
        pytest.param(lambda: (1.5, {}), "returned a loss that is a float (1.5)", id="c1-loss-python-float"),
        pytest.param(
            lambda: (torch.ones(()), {}), "returned a loss without gradients", id="c1-loss-without-grad"
        ),
        pytest.param(
            lambda: (torch.ones((), dtype=torch.long), {}),
            "a loss that is a int64 tensor of shape ()",
            id="c1-loss-integer-tensor",
        ),
        pytest.param(
            lambda: (_with_grad().expand(1), {}),
            "a loss that is a float32 tensor of shape (1,)",
            id="c1-loss-shape-1",
        ),
        pytest.param(
            lambda: _with_grad(), "returned a float32 tensor of shape (); " + LOSS, id="c1-loss-not-a-tuple"
        ),
        pytest.param(
            lambda: (_with_grad(), {}, {}),
            "returned a tuple of 3 (a float32 tensor of shape (); a dict ({}); a dict ({}))",
            id="c1-loss-triple",
        ),
        pytest.param(
            lambda: [_with_grad(), {}],
            "returned a list of 2 (a float32 tensor of shape (); a dict ({}))",
            id="c1-loss-list",
        ),
        pytest.param(lambda: (_with_grad(), None), "returned metrics that are None", id="c1-metrics-none"),
        pytest.param(
            lambda: (_with_grad(), [1.0]), "returned metrics that are a list ([1.0])", id="c1-metrics-list"
        ),
        pytest.param(
            lambda: (_with_grad(), {"train/mood": "good"}),
            "metric 'train/mood' = a str ('good')",
            id="c1-metric-text",
        ),
        pytest.param(
            lambda: (_with_grad(), {"train/ok": True}),
            "metric 'train/ok' = a bool (True)",
            id="c1-metric-bool",
        ),
        pytest.param(
            lambda: (_with_grad(), {"train/v": torch.ones(2)}),
            "metric 'train/v' = a float32 tensor of shape (2,)",
            id="c1-metric-vector",
        ),
        pytest.param(
            lambda: (_with_grad(), {"train/r": float("inf")}),
            "metric 'train/r' = inf; it must return finite metrics",
            id="c1-metric-inf",
        ),
        pytest.param(
            lambda: (_with_grad(), {"train/r": 10**400}), "metric 'train/r' = 1000", id="c1-metric-huge-int"
        ),
        pytest.param(
            lambda: (_with_grad(), {3: 1.0}), "returned a metric named an int (3)", id="c1-metric-key-int"
        ),
    ],
)
def test_what_compute_loss_returns_is_checked(returned, said):
    """Each wrong return of ``compute_loss`` (the wiring is the ``c1-loss-*`` rows above): the
    plugin named, what it returned and what it must return."""
    with pytest.raises(PluginError) as error:
        checked_loss(LossVector, returned())
    assert str(error.value).startswith(f"plugin '{H}:LossVector': compute_loss() ")
    assert said in str(error.value)
    assert str(error.value).endswith("; fix the plugin") and len(str(error.value)) < 700


def test_good_metrics_pass_as_floats():
    loss = _with_grad()
    metrics = {"train/a": 1, "train/b": torch.tensor(0.5), "train/c": 2.5}
    assert checked_loss(LossVector, (loss, metrics)) == (
        loss,
        {"train/a": 1.0, "train/b": 0.5, "train/c": 2.5},
    )


def test_a_hanging_tracker_stops_the_run_naming_it(tmp_path, monkeypatch, capsys):
    """A tracker whose calls never return (a hosted service that stopped answering) stops the run
    after the call deadline, named (was: the run hung for ever). Its first call hangs here
    (``log_metadata``, at start-up); ``log_scalars`` and the others go through the same
    :class:`~diffrl.logging.trackers.BoundedTracker` call."""
    from diffrl.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(diffrl.logging.trackers, "CALL_TIMEOUT_S", 0.5)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in SFT1] + [f"run.loggers=[{H}:HangingTracker]"]
    capsys.readouterr()
    assert main(argv) == BAD
    err = capsys.readouterr().err
    assert f"error: plugin logger '{H}:HangingTracker': log_metadata() did not return within 0.5 s" in err
    assert "drop" in err and "train.resume=latest" in err


def test_a_plugins_exit_in_del_is_one_warning_line(monkeypatch, capsys):
    """A plugin object whose ``__del__`` calls sys.exit(): Python ignores it, printing a traceback
    ("Exception ignored in"); under the command it is one warning line naming the plugin."""
    from diffrl.cli import main
    from diffrl.cli.commands import recipes

    monkeypatch.setattr(recipes, "run", import_object(f"{H}:drops_an_exiting_object"))
    capsys.readouterr()
    assert main(["recipes"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err.startswith(f"warning: plugin '{H}:") and err.count("\n") == 1
    assert "called sys.exit(3) (at hostile_plugins.py:" in err and "ExitsWhenCollected.__del__)" in err


LINGERS = """
import sys, threading
from diffrl.core import user_code
from diffrl.algorithms.returns import checked_loss
from diffrl.core.registry import import_object

user_code.LINGER_S = 0.2
import_object("lingering:f")  # a plugin module whose import started a thread that never ends
sys.argv = ["diffrl", "recipes"]
"""
ENTRY_POINTS = {
    "console script": "from diffrl.command import main; sys.exit(main())",
    "python -m diffrl.cli": "import runpy; runpy.run_module('diffrl.cli', run_name='__main__')",
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_plugins_thread_does_not_keep_the_process_alive(entry, tmp_path):
    """A plugin that starts a thread (not a daemon) and never ends it: the command finishes, the
    process ends with the command's exit code and a warning naming the thread's plugin (was: the
    process never exited)."""
    (tmp_path / "lingering.py").write_text(
        "import threading\n\n\ndef upload():\n    threading.Event().wait()\n\n\n"
        "threading.Thread(target=upload, name='uploader').start()\n\n\ndef f():\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", LINGERS + ENTRY_POINTS[entry]],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tiny_sft" in proc.stdout  # the command ran
    assert (
        "warning: 1 thread(s) still running 0.2 s after the command finished would keep this process "
        "alive: thread 'uploader' (plugin 'lingering:f', at lingering.py:5 in upload)"
    ) in proc.stderr
