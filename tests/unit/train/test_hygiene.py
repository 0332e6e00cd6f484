"""Plugin hygiene around the driver's calls (diffrl/train/hygiene.py): an algorithm that changes
torch's process-wide settings, or returns the wrong kind, is named at the call, and the settings
are put back; code outside any guarded call is caught at the end of its iteration."""

import pytest
import torch

from diffrl.core.rollout import TrainSignals
from diffrl.core.user_code import GlobalStateChanged, PluginError
from diffrl.train.hygiene import CheckedAlgorithm, settings_kept


class Sloppy:
    """A user's algorithm (this test module is not diffrl's): one call leaves float64 behind, the
    other returns a signal of the wrong length."""

    def postprocess_rewards(self, batch, rewards):
        torch.set_default_dtype(torch.float64)
        return TrainSignals({"advantages": torch.zeros(len(batch))})

    def build_train_data(self, batch, signals, iteration):
        return "examples"


class Batch(list):
    pass


def test_a_call_that_changes_torch_settings_is_named_and_undone():
    with pytest.raises(GlobalStateChanged, match=r"plugin 'tests\.unit\.train\.test_hygiene:Sloppy'"):
        CheckedAlgorithm(Sloppy()).postprocess_rewards(Batch([1, 2]), None)
    assert torch.get_default_dtype() == torch.float32


def test_what_a_call_returns_is_checked():
    with pytest.raises(PluginError, match="build_train_data"):
        CheckedAlgorithm(Sloppy()).build_train_data(Batch([1]), None, 0)


def test_an_iteration_that_changes_torch_settings_stops_the_run_and_undoes_them():
    threads = torch.get_num_threads()
    with pytest.raises(GlobalStateChanged, match="code run in iteration 3"):
        with settings_kept(3):
            torch.set_num_threads(threads + 1)
    assert torch.get_num_threads() == threads
    with settings_kept(4):  # an iteration that leaves them be
        torch.zeros(1)
