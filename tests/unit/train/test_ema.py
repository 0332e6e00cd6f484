"""The exponential moving average of the trainable weights (:mod:`diffrl.train.ema`): each update
moves the shadow ``decay``-weighted towards the live weights, and ``swapped_in()`` lends the EMA
weights to the live parameters and puts the live ones back exactly, also after an exception."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffrl.train.ema import EMA


def params() -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(3, 4, generator=g)), nn.Parameter(torch.randn(5, generator=g))]


def values(ps) -> list[torch.Tensor]:
    return [p.detach().clone() for p in ps]


def test_the_shadow_starts_as_a_copy_of_the_weights():
    ps = params()
    start = values(ps)
    ema = EMA(ps, decay=0.9)
    for s, w in zip(ema.shadow, start):
        assert torch.equal(s, w) and not s.requires_grad
    with torch.no_grad():
        ps[0].add_(1.0)
    assert torch.equal(ema.shadow[0], start[0])  # a copy, not a view of the live weights


def test_update_is_decay_times_the_shadow_plus_one_minus_decay_times_the_weights():
    decay = 0.75
    ps = params()
    ema = EMA(ps, decay)
    expected = values(ps)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        with torch.no_grad():  # a training step moves the live weights
            for p in ps:
                p.add_(torch.randn(p.shape, generator=g))
        ema.update()
        expected = [decay * e + (1 - decay) * p.detach() for e, p in zip(expected, ps)]
        for s, e in zip(ema.shadow, expected):
            torch.testing.assert_close(s, e)


def test_update_leaves_the_live_weights_and_their_gradients_alone():
    ps = params()
    ema = EMA(ps, 0.5)
    for p in ps:
        p.grad = torch.ones_like(p)
    before = values(ps)
    with torch.no_grad():
        ps[1].mul_(2.0)
    before[1] = before[1] * 2.0
    ema.update()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before))
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in ps)
    assert not any(s.requires_grad for s in ema.shadow)


def test_weights_that_stay_put_are_a_fixed_point():
    ps = params()
    ema = EMA(ps, 0.9)
    for _ in range(5):
        ema.update()
    for s, p in zip(ema.shadow, ps):
        torch.testing.assert_close(s, p.detach())


def _diverged() -> tuple[list[nn.Parameter], EMA]:
    """Live weights and an EMA that differ."""
    ps = params()
    ema = EMA(ps, 0.5)
    with torch.no_grad():
        for p in ps:
            p.add_(3.0)
    ema.update()
    return ps, ema


def test_swapped_in_lends_the_ema_weights_and_restores_the_live_ones_exactly():
    ps, ema = _diverged()
    live, shadow = values(ps), values(ema.shadow)
    ids = [id(p) for p in ps]
    with ema.swapped_in():
        assert all(torch.equal(p.detach(), s) for p, s in zip(ps, shadow))
    assert all(torch.equal(p.detach(), w) for p, w in zip(ps, live))  # bit for bit
    assert all(torch.equal(s, w) for s, w in zip(ema.shadow, shadow))  # the shadow is unchanged
    assert [id(p) for p in ps] == ids and all(p.requires_grad for p in ps)  # the same parameters


def test_swapped_in_restores_the_live_weights_after_an_exception():
    ps, ema = _diverged()
    live, shadow = values(ps), values(ema.shadow)
    with pytest.raises(RuntimeError, match="eval failed"), ema.swapped_in():
        assert torch.equal(ps[0].detach(), shadow[0])
        raise RuntimeError("eval failed")
    assert all(torch.equal(p.detach(), w) for p, w in zip(ps, live))
    assert all(torch.equal(s, w) for s, w in zip(ema.shadow, shadow))


def test_changes_made_while_swapped_in_are_undone():
    ps, ema = _diverged()
    live, shadow = values(ps), values(ema.shadow)
    with ema.swapped_in(), torch.no_grad():
        for p in ps:
            p.zero_()
    assert all(torch.equal(p.detach(), w) for p, w in zip(ps, live))
    assert all(torch.equal(s, w) for s, w in zip(ema.shadow, shadow))  # the shadow is not written back
