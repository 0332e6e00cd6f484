"""The HTTP client of reward servers (:mod:`diffrl.transport.client`) against what a user can give
it: a header value it cannot send, a host name the resolver's IDNA encoding refuses. Each is a
config error from :func:`url_problem` or a connection-class ``OSError`` from :func:`exchange` that
never shows the token, never a ``ValueError`` / ``UnicodeError`` that ends in exit 70 (review
findings 2 and 3). The ``remote`` reward's side: ``tests/unit/rewards/test_remote.py``."""

from __future__ import annotations

import pytest

from diffrl.transport.client import exchange, peer_problems, server_problems, url_problem
from diffrl.transport.protocols import PROTOCOLS
from tests.unit.serving.test_server import serving

SECRET = "sk-SECRET-7f3a9c"
"""A token no message may show."""
EMPTY_LABEL = "http://judge..host:8000"
LONG_LABEL = f"http://{'a' * 64}.example:8000"


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
