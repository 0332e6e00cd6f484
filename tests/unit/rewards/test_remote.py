"""The ``remote`` reward (:mod:`diffrl.rewards.remote`) against what a user can give it: a
token with a line break in it (what ``echo`` into a file or a copied key often leaves), a host
name the resolver's IDNA encoding refuses. Each is a config error (exit 2, one ``error:`` line)
that never shows the token, never a ``ValueError`` / ``UnicodeError`` that ends in exit 70 (review
findings 2 and 3). The client underneath: ``tests/unit/transport/test_client.py``."""

from __future__ import annotations

import pytest
import torch

from diffrl.rewards.remote import RemoteReward
from tests.conftest import ROOT
from tests.integration.test_bad_inputs import BAD, GRPO, Case, _check, run_row
from tests.unit.serving.test_server import TOKEN, serving
from tests.unit.transport.test_client import EMPTY_LABEL, LONG_LABEL, SECRET

ENV = "DIFFRL_TEST_REMOTE_CLIENT_TOKEN"


def test_a_token_with_surrounding_whitespace_is_stripped_and_accepted(monkeypatch):
    monkeypatch.setenv(ENV, f"  {TOKEN}\r\n")
    with serving() as server:
        assert RemoteReward.param_problems({"url": server.url, "token_env": ENV}, True) == []
        reward = RemoteReward(server.url, token_env=ENV, retries=0)
        scores = reward(torch.zeros(2, 3, 4, 4), ["a", "b"], [{}, {}])
    assert scores.shape == (2,) and scores.isfinite().all()


@pytest.mark.parametrize(
    "token", [f"{SECRET}\r\nX-Injected: 1", f"{SECRET} two", f"{SECRET}\x07", f"{SECRET}é"]
)
def test_a_token_no_http_header_can_carry_is_refused_without_showing_it(token, monkeypatch):
    monkeypatch.setenv(ENV, token)
    (problem,) = RemoteReward.param_problems({"url": "http://127.0.0.1:9", "token_env": ENV}, True)
    assert f"the token in {ENV} holds a character other than printable ASCII" in problem
    assert SECRET not in problem


# -- at the command line: exit 2, one error line, the token never printed ----------------------------

REMOTE = "rewards=[{{name: remote, params: {{{}}}}}]"
# fmt: off
CASES = [
    Case("token-line-break-inside", ["train", GRPO, REMOTE.format(f"url: 'http://127.0.0.1:9', token_env: {ENV}")], BAD, f"token_env: the token in {ENV} holds a character other than printable ASCII", absent=SECRET),
    Case("url-empty-label", ["train", GRPO, REMOTE.format(f"url: '{EMPTY_LABEL}', token_env: {ENV}")], BAD, "the host 'judge..host' is no valid host name", absent=SECRET),
    Case("url-label-over-63", ["train", GRPO, REMOTE.format(f"url: '{LONG_LABEL}'")], BAD, "is no valid host name (each dot-separated part must be 1 to 63 characters); fix the host", absent=SECRET),
    Case("peer-url-empty-label", ["train", GRPO, REMOTE.format(f"url: '{EMPTY_LABEL}', protocol: flow_factory")], BAD, "the host 'judge..host' is no valid host name", absent=SECRET),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused(case, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    monkeypatch.setenv(ENV, f"{SECRET}\r\nX-Injected: 1")
    _check(case, *run_row(case, case.argv, monkeypatch, capsys))
