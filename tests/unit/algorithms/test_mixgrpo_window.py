"""MixGRPO's sliding window (``step_strategy: {name: mix_grpo}``) against the reference's rule,
iteration by iteration (Tencent-Hunyuan/MixGRPO ``fastvideo/utils/grpo_states.py``:
``GRPOTrainingStates``, ``sample_strategy="progressive"``; ``train_grpo_flux.py`` asks
``get_current_timesteps()`` and then calls ``update_iteration()`` once per iteration)."""

import pytest

from diffrl.sampling.step_strategies import build_step_strategy


def reference_windows(iterations, size, interval, stride, roll_back, lo, hi):
    """The reference's state machine, stepped as its training loop steps it: the window of each
    iteration is ``range(cur, min(cur + size, hi))``; then the iteration counter moves, the window
    moves ``stride`` steps every ``interval`` iterations, and a start past ``hi`` rolls back to
    ``lo`` (``roll_back``) or is clipped to ``hi``."""
    cur, it, out = lo, 0, []
    for _ in range(iterations):
        out.append(list(range(cur, min(cur + size, hi))))
        it += 1
        if it >= interval:
            it, cur = 0, cur + stride
        if cur > hi:
            cur, it = (lo, 0) if roll_back else (hi, it)
    return out


def windows(n, num_steps, **params):
    strategy, errors = build_step_strategy({"name": "mix_grpo", **params}, num_steps)
    assert not errors
    return [strategy(num_steps, r, seed=0) for r in range(n)]


# 12 sampling steps, the reference's bound sampling_steps - 2 = 10, window 4, a move every 2
# iterations: iteration -> (window start, window size), from the reference's rule by hand
# fmt: off
TABLES = {
    "overlap, roll back": (
        {"stride": 1, "wrap": True},
        {0: (0, 4), 1: (0, 4), 2: (1, 4), 12: (6, 4), 13: (6, 4),
         14: (7, 3), 16: (8, 2), 18: (9, 1), 19: (9, 1),  # it shrinks over the last steps
         20: (9, 1), 21: (9, 1),  # the reference's window is empty here (start 10): the last stays
         22: (0, 4), 24: (1, 4), 36: (7, 3), 40: (9, 1), 42: (9, 1), 44: (0, 4)},  # period 11 moves
    ),
    "non-overlap, roll back": (  # steps 8 and 9 are trained: the last window is cut, not dropped
        {"stride": 4, "wrap": True},
        {0: (0, 4), 1: (0, 4), 2: (4, 4), 4: (8, 2), 5: (8, 2), 6: (0, 4), 8: (4, 4), 10: (8, 2), 12: (0, 4)},
    ),
    "overlap, clip": (
        {"stride": 1, "wrap": False},
        {0: (0, 4), 2: (1, 4), 12: (6, 4), 14: (7, 3), 16: (8, 2), 18: (9, 1), 20: (9, 1), 59: (9, 1)},
    ),
    "non-overlap, clip": (
        {"stride": 4, "wrap": False},
        {0: (0, 4), 2: (4, 4), 4: (8, 2), 6: (8, 2), 59: (8, 2)},
    ),
}
# fmt: on


@pytest.mark.parametrize("mode", TABLES)
def test_window_table_follows_the_reference(mode):
    params, table = TABLES[mode]
    ours = windows(60, 12, size=4, shift_interval=2, range=[0, 10], **params)
    assert {r: (ours[r][0], len(ours[r])) for r in table} == table
    assert all(w == list(range(w[0], w[0] + len(w))) and w[-1] < 10 for w in ours)  # contiguous, inside


@pytest.mark.parametrize(
    "size, interval, stride, wrap, lo, hi",
    [
        (4, 25, 1, True, 0, 23),  # the shipped script: 25 steps, bound 23
        (4, 25, 4, True, 0, 23),  # its non-overlapping mode: the last window [20, 23) is trained
        (4, 3, 4, True, 0, 8),  # the bound a multiple of the stride: the reference's empty window
        (3, 2, 2, False, 1, 9),
        (5, 1, 3, True, 2, 12),
        (1, 4, 1, False, 0, 5),
        (6, 2, 6, True, 0, 6),  # one window covers the range
    ],
)
def test_windows_equal_the_reference_wherever_it_trains_something(size, interval, stride, wrap, lo, hi):
    n = 40 * interval * max(1, (hi - lo) // stride + 1)  # several cycles
    ref = reference_windows(n, size, interval, stride, wrap, lo, hi)
    ours = windows(n, hi + 2, size=size, shift_interval=interval, stride=stride, wrap=wrap, range=[lo, hi])
    assert len(ref) == len(ours) == n
    last = None
    for r, (a, b) in enumerate(zip(ref, ours)):
        if a:
            assert b == a, f"iteration {r}"
            last = a
        else:  # empty in the reference: the last non-empty window stays
            assert b == last, f"iteration {r}"
    assert any(not a for a in ref) == ((hi - lo) % stride == 0 or not wrap)


def test_the_old_full_size_rule_is_gone():
    """The previous rule kept ``size`` steps and wrapped at ``hi - size``: in the non-overlapping
    mode the last steps ([20, 23) of the shipped script's 25) were never trained."""
    trained = set().union(*windows(25 * 12, 25, size=4, stride=4, range=[0, 23]))
    assert trained == set(range(23))
