"""The libraries diffrl drives print no progress bars of their own into a run's log
(:mod:`diffrl.logging.quiet`)."""

import os

import diffusers.utils.logging
import huggingface_hub.utils
import pytest
import transformers.utils.logging

from diffrl.logging.quiet import QUIET_ENV, quiet_libraries


@pytest.fixture
def loud(monkeypatch):
    """The libraries as a program that never called :func:`quiet_libraries` has them: bars on,
    none of its variables set; as they were afterwards."""
    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    before = (
        transformers.utils.logging.is_progress_bar_enabled(),
        diffusers.utils.logging.is_progress_bar_enabled(),
        huggingface_hub.utils.are_progress_bars_disabled(),
    )
    transformers.utils.logging.enable_progress_bar()
    diffusers.utils.logging.enable_progress_bar()
    yield
    for on, module in zip(before[:2], (transformers.utils.logging, diffusers.utils.logging), strict=True):
        (module.enable_progress_bar if on else module.disable_progress_bar)()
    if before[2]:
        huggingface_hub.utils.disable_progress_bars()


def test_quiet_libraries_turns_off_the_bars_of_libraries_already_imported(loud):
    quiet_libraries()
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert not diffusers.utils.logging.is_progress_bar_enabled()  # diffusers reads no variable for it
    assert huggingface_hub.utils.are_progress_bars_disabled()
    assert all(os.environ[k] == v for k, v in QUIET_ENV.items())  # for child processes


def test_a_user_who_wants_the_bars_keeps_them(loud, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    quiet_libraries()
    assert transformers.utils.logging.is_progress_bar_enabled()
    assert diffusers.utils.logging.is_progress_bar_enabled()


def test_loading_a_model_prints_no_loading_bar(loud, capfd):
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config

    load_family(load_config({"model": {"path": "base"}}))  # the shipped tiny base: weights from files
    out, err = capfd.readouterr()
    assert "Loading" not in err + out and "%|" not in err + out, err
