"""The ``remote`` reward's client (:mod:`diffrl.rewards.remote`) against what a user can give it: a
token with a line break in it (what ``echo`` into a file or a copied key often leaves), a host
name the resolver's IDNA encoding refuses. Each is a config error (exit 2, one ``error:`` line)
that never shows the token, or a connection-class ``OSError`` from :func:`exchange`, never a
``ValueError`` / ``UnicodeError`` that ends in exit 70 (review findings 2 and 3)."""

from __future__ import annotations

import pytest
import torch

from diffrl.rewards.remote import RemoteReward
from diffrl.transport.client import exchange, peer_problems, server_problems, url_problem
from diffrl.transport.protocols import PROTOCOLS
from tests.conftest import ROOT
from tests.integration.test_bad_inputs import BAD, GRPO, Case, _check, run_row
from tests.unit.serving.test_server import TOKEN, serving

SECRET = "sk-SECRET-7f3a9c"
"""A token no message may show: every row sets :data:`ENV` to a value holding it."""
ENV = "DIFFRL_TEST_REMOTE_CLIENT_TOKEN"
EMPTY_LABEL = "http://judge..host:8000"
LONG_LABEL = f"http://{'a' * 64}.example:8000"


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


def test_exchange_turns_a_header_it_cannot_send_into_an_os_error_without_the_value():
    with serving() as server:
        with pytest.raises(OSError) as e:
            exchange(server.url, "GET", "/health", 10.0, headers={"Authorization": f"Bearer {SECRET}\n"})
    assert "a header value holds a character an HTTP header cannot carry" in str(e.value)
    assert SECRET not in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__


@pytest.mark.parametrize("url", [EMPTY_LABEL, LONG_LABEL])
def test_a_host_idna_refuses_is_a_config_error_and_an_os_error_of_exchange(url):
    assert "is no valid host name (each dot-separated part must be 1 to 63 characters)" in url_problem(url)
    with pytest.raises(OSError, match="UnicodeError while connecting to the server .*no valid IDNA name"):
        exchange(url, "GET", "/health", 5.0)
    # the probes that run after url_problem in preflight, called alone: a problem, not a crash
    (problem,) = server_problems(url, None, timeout_s=5.0)
    assert problem.startswith(f"url: no reward server answers at {url} (OSError: UnicodeError")
    (problem,) = peer_problems(url, PROTOCOLS["flow_factory"], None, timeout_s=5.0)
    assert problem.startswith(f"url: no reward server answers at {url} (OSError: UnicodeError")


def test_a_host_at_the_label_limit_passes_url_problem():
    assert url_problem(f"http://{'a' * 63}.example:8000") is None
    assert url_problem("http://[::1]:8000") is None and url_problem("http://127.0.0.1:8000") is None


def test_a_long_url_is_quoted_in_part():
    problem = url_problem(f"http://{'a' * 5000}.example:8000")
    assert len(problem) < 500 and problem.endswith("fix the host")


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
