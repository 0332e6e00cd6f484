from dataclasses import dataclass

import pytest
import torch

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.algorithms.registry import ALGORITHMS, build_algorithm
from diffrl.algorithms.sft import SFT
from diffrl.config import ConfigError, RewardConfig
from diffrl.core.registry import RegistryError, call_problem, import_object, override_problems
from diffrl.core.rollout import CollectionSpec
from diffrl.preflight import load_config
from diffrl.rewards.base import FunctionReward, build_reward


class EchoAlgorithm(SFT):
    """A user's algorithm living outside the package."""

    name = "echo"

    @dataclass
    class Params(SFT.Params):
        scale: float = 2.0


def constant_reward(images, prompts, metadata, value=0.25):
    return [value] * len(prompts)


def test_builtin_by_name():
    assert ALGORITHMS.resolve("sft") is SFT


def test_dotted_path_with_colon_and_dot():
    assert import_object("tests.unit.core.test_registry:EchoAlgorithm") is EchoAlgorithm
    assert import_object("tests.unit.core.test_registry.EchoAlgorithm") is EchoAlgorithm


def test_user_algorithm_by_dotted_path_gets_its_own_params():
    cfg = load_config(
        {"algorithm": {"name": "tests.unit.core.test_registry:EchoAlgorithm", "params": {"scale": 3.0}}}
    )
    algo = build_algorithm(cfg)
    assert isinstance(algo, EchoAlgorithm) and algo.params.scale == 3.0
    with pytest.raises(ConfigError, match="algorithm.params.scael"):
        load_config(
            {"algorithm": {"name": "tests.unit.core.test_registry:EchoAlgorithm", "params": {"scael": 3.0}}}
        )


def test_unknown_name_lists_known_ones():
    with pytest.raises(RegistryError) as e:
        ALGORITHMS.resolve("sfft")
    assert "Did you mean 'sft'" in str(e.value) and "Known: awm, diffusion_nft, dpo, flow_grpo, sft" in str(
        e.value
    )


def test_bad_dotted_paths():
    with pytest.raises(RegistryError, match="cannot import module"):
        import_object("not_a_module_xyz:thing")
    with pytest.raises(RegistryError, match="has no attribute"):
        import_object("tests.unit.core.test_registry:Nope")


def test_not_an_algorithm_is_refused():
    with pytest.raises(ConfigError, match="not a DiffusionAlgorithm"):
        load_config({"algorithm": {"name": "tests.unit.core.test_registry:constant_reward"}})


def test_function_reward_by_dotted_path_with_params():
    reward = build_reward(
        RewardConfig(name="tests.unit.core.test_registry:constant_reward", params={"value": 0.5})
    )
    assert isinstance(reward, FunctionReward)
    assert reward(torch.zeros(3, 3, 8, 8), ["a", "b", "c"], [{}] * 3).tolist() == [0.5] * 3


def test_collection_spec_is_a_plain_dataclass():
    spec = SFT(SFT.Params(), load_config({})).collection_spec()
    assert spec == CollectionSpec(online=False, needs_reward=False)
    assert not spec.keep_trajectory and not spec.keep_log_prob
    assert issubclass(SFT, DiffusionAlgorithm)


def broken_reward(images, prompts, metadata):
    raise RuntimeError("scorer offline")


def test_reward_set_reports_failures():
    from diffrl.rewards.base import RewardError, RewardSet

    rs = RewardSet([RewardConfig(name="tests.unit.core.test_registry:broken_reward")])
    out = rs.submit(torch.zeros(2, 3, 4, 4), ["a", "b"], [{}, {}]).result()
    assert torch.isnan(out.total).all() and "scorer offline" in out.errors[0]
    with pytest.raises(RewardError, match="broken_reward.*scorer offline"):
        rs(torch.zeros(2, 3, 4, 4), ["a", "b"], [{}, {}])


def test_every_shipped_plugin_passes_the_signature_checks_it_sets_for_others():
    """The checks a dotted path's class or function gets (issue 53, class 1) pass every registered
    one: they refuse only what diffrl's own call could not bind."""
    from diffrl.algorithms.registry import ALGORITHMS
    from diffrl.launch import RUNNERS
    from diffrl.models.registry import FAMILIES
    from diffrl.rewards.base import Reward
    from diffrl.rewards.registry import REWARDS
    from diffrl.sampling.engine import ENGINES
    from diffrl.sampling.kernels import KERNELS

    problems = {}
    for registry in (ALGORITHMS, RUNNERS, FAMILIES, ENGINES, KERNELS):
        for name in registry.names():
            found = registry.check(registry.resolve(name))
            if found:
                problems[f"{registry.kind} {name}"] = found
    for name in REWARDS.names():
        found = override_problems(REWARDS.resolve(name), Reward)
        if found:
            problems[f"reward {name}"] = found
    assert problems == {}


def test_a_signature_that_cannot_take_the_call_is_named_with_the_call():
    class Base:
        def step(self, x, sigma, *, generator):
            pass

    class Fewer(Base):
        def step(self, x):
            pass

    class Renamed(Base):  # diffrl passes them by position: other names still bind
        def step(self, a, b, *, generator, extra=1):
            pass

    class MissingKeyword(Base):
        def step(self, x, sigma):
            pass

    assert override_problems(Renamed, Base) == []
    [few] = override_problems(Fewer, Base)
    assert "cannot take diffrl's call step(x, sigma, generator=...)" in few and "give it Base.step's parameters" in few
    assert override_problems(MissingKeyword, Base) and "generator" in override_problems(MissingKeyword, Base)[0]
    assert call_problem(lambda a: a, "fn(a, b)", ("a", "b")).startswith("cannot be called as diffrl calls it, fn(a, b)")
    assert call_problem(lambda a, b, **kw: a, "fn(a, b, **params)", ("a", "b"), ("c",)) is None
