"""A warning diffrl issues while a command runs prints as one ``warning: <message>`` line (as
errors print ``error: ...``), not as Python's ``path/to/diffrl/file.py:123: UserWarning: ...``;
other libraries' warnings keep Python's format, and tests recording warnings still see them."""

from __future__ import annotations

import sys
import warnings

import pytest

from diffrl.cli import DIFFRL_DIR, _warning_lines, main
from tests.integration.test_plugin_exits import NFT, TINY


def _format() -> str:
    return warnings.formatwarning("3 sample(s) dropped", UserWarning, DIFFRL_DIR + "train/gather.py", 12)


def test_diffrls_warning_is_one_line_and_a_librarys_keeps_pythons_format():
    library = "/site-packages/torch/nn/modules/module.py"
    with _warning_lines():
        assert _format() == "warning: 3 sample(s) dropped\n"
        assert warnings.formatwarning("x", UserWarning, library, 12).startswith(
            f"{library}:12: UserWarning: x"
        )
    assert "gather.py:12: UserWarning: 3 sample(s) dropped" in _format()  # outside a command: Python's


def test_a_recorded_warning_is_still_recorded():
    with _warning_lines(), pytest.warns(UserWarning, match="dropped"):
        warnings.warn_explicit("3 sample(s) dropped", UserWarning, DIFFRL_DIR + "train/gather.py", 12)


FORMATS: list[str] = []


def noting_the_format(images, prompts, metadata):
    """A reward (brightness) that notes how a diffrl warning would read while it runs."""
    FORMATS.append(_format())
    return images.float().mean(dim=(1, 2, 3)).tolist()


def test_a_commands_warnings_read_as_lines_and_debug_keeps_pythons(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "FORMATS", [])
    for debug in ([], ["--debug"]):
        out = tmp_path / f"run{len(debug)}"
        argv = [
            "train",
            NFT,
            *TINY,
            f"run.output_dir={out}",
            f"rewards=[{{name: '{__name__}:noting_the_format'}}]",
        ]
        assert main([*debug, *argv]) == 0
    assert FORMATS[0] == "warning: 3 sample(s) dropped\n"
    assert "gather.py:12: UserWarning" in FORMATS[-1]
