"""The benchmarks' verdict rule (:mod:`diffrl.bench.verdict`): PASS or MISS only when every round is on
one side of the target; noisy rounds get no verdict and a non-zero exit code."""

import ast
import re
from pathlib import Path

import pytest

from diffrl.bench.verdict import (
    EXIT_INCONCLUSIVE,
    Claim,
    conclude,
    judge,
    paired_ratios,
    unpaired_ratios,
)

ROOT = Path(__file__).resolve().parents[3]


def test_noisy_rounds_get_no_verdict_and_a_non_zero_exit(capsys):
    # the busy machine of the issue: a median well above the target, rounds on both sides of it
    verdict = judge([0.085, 4.2, 5.7], Claim(1.15))
    assert verdict.status == "inconclusive" and not verdict.conclusive
    assert str(verdict) == (
        "inconclusive: spread 4.115 exceeds the effect 3.050 (3 rounds 0.085-5.700 on both sides of the "
        "target >= 1.150, median 4.200; measure more rounds, or on a quieter machine)"
    )
    assert "PASS" not in str(verdict) and "MISS" not in str(verdict)
    assert conclude([judge([1.2, 1.3], Claim(1.15)), verdict]) == EXIT_INCONCLUSIVE != 0
    assert "1 verdict(s) inconclusive" in capsys.readouterr().err


def test_noisy_rounds_below_the_target_get_no_miss_either():
    verdict = judge([0.5, 0.6, 2.0], Claim(1.15))  # the median misses, one round passes
    assert verdict.status == "inconclusive"
    assert str(verdict).startswith("inconclusive: spread 1.400 exceeds the effect 0.550 ")


def test_clean_rounds_above_the_target_pass_and_below_it_miss():
    above, below = judge([1.2, 1.3, 1.25], Claim(1.15)), judge([1.0, 1.1, 1.05], Claim(1.15))
    assert above.status == "PASS" and str(above) == "PASS (3 rounds 1.200-1.300, all >= 1.150)"
    assert below.status == "MISS" and str(below) == "MISS (3 rounds 1.000-1.100, all < 1.150)"
    assert conclude([above, below]) == 0  # a MISS is an answer: only an open verdict fails the run


def test_the_spread_is_what_reaches_towards_the_target_not_its_whole_width():
    # far above on the passing side does not weaken a PASS: every round clears the target
    assert judge([1.16, 1.2, 9.0], Claim(1.15)).status == "PASS"
    assert judge([1.14, 1.2, 1.21], Claim(1.15)).status == "inconclusive"  # one round misses


@pytest.mark.parametrize(
    ("rounds", "status"),
    [([0.4, 0.5, 1.0], "PASS"), ([1.01, 1.3], "MISS"), ([0.9, 1.2, 0.95], "inconclusive")],
)
def test_an_at_most_claim_passes_under_the_limit(rounds, status):
    # the limit itself passes, as the target of an at-least claim does
    verdict = judge(rounds, Claim(1.0, at_least=False, fmt="{:.2f} s"))
    assert verdict.status == status
    if status == "inconclusive":
        assert str(verdict).startswith("inconclusive: spread 0.25 s exceeds the effect 0.05 s ")
        assert "target <= 1.00 s" in str(verdict)


def test_one_round_shows_no_spread_unless_the_figure_is_exact():
    assert judge([1.3], Claim(1.15)).status == "inconclusive"
    assert str(judge([1.3], Claim(1.15))) == (
        "inconclusive: 1 round, no spread to judge against the target >= 1.150 (need at least 2)"
    )
    assert judge([], Claim(1.15)).status == "inconclusive"
    exact = judge([1.0], Claim(1.05, at_least=False, min_rounds=1))  # bytes held: not timed
    assert exact.status == "PASS" and str(exact) == "PASS (1 round 1.000, <= 1.050)"


def test_ratios_pair_the_rounds_or_else_every_measurement():
    assert paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="as many of each side: 2 vs 1"):
        paired_ratios([2.0, 3.0], [1.0])
    # not interleaved: the extremes are the lowest over the highest and the highest over the lowest
    ratios = unpaired_ratios([1.1, 1.3], [1.0, 1.2])
    assert sorted(ratios) == pytest.approx(sorted([1.1, 1.1 / 1.2, 1.3, 1.3 / 1.2]))
    verdict = judge(ratios, Claim(1.15, at_least=False), label="pairings")
    assert verdict.status == "inconclusive" and "4 pairings" in str(verdict)


def _verdict_words(path: Path) -> list[str]:
    """The string constants of a script's code (not its docstrings) that spell PASS or MISS."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and re.search(r"\b(PASS|MISS)\b", n.value)
    ]


def test_no_benchmark_script_decides_a_verdict_of_its_own():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    own = {p.name: words for p in scripts if (words := _verdict_words(p))}
    assert not own, f"verdicts spelled outside diffrl.bench.verdict: {own}"
    # every script that states a target judges it through the shared rule
    claims = [p for p in scripts if "(target >=" in p.read_text() or "(target <=" in p.read_text()]
    assert claims
    assert all("from diffrl.bench.verdict import" in p.read_text() for p in claims), claims
