"""A benchmark's table: per-category means, paired differences and their standard errors, and the
overall rows (GenEval's mean of tag means; the others' plain mean), checked on numbers worked out
by hand."""

from __future__ import annotations

import math

import pytest
import torch

from diffrl.bench.table import OVERALL_MEAN, OVERALL_OF_CATEGORIES, finite, render, table


def test_rows_per_category_with_paired_differences():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5])
    base = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.5])
    rows = table(scores, ["a", "a", "b", "b", "b"], base)
    a, b, overall = rows
    assert (a.category, a.n, a.target, a.baseline) == ("a", 2, 0.5, 0.0)
    # differences (1, 0): mean 0.5, sample std 0.7071, SE 0.7071 / sqrt(2) = 0.5
    assert a.difference == pytest.approx(0.5) and a.se == pytest.approx(0.5)
    # differences (0, 1, 0): mean 1/3, std sqrt(1/3), SE sqrt(1/3) / sqrt(3) = 1/3
    assert b.difference == pytest.approx(1 / 3) and b.se == pytest.approx(1 / 3)
    assert overall.category == OVERALL_MEAN and overall.n == 5
    assert overall.target == pytest.approx(3.5 / 5) and overall.difference == pytest.approx(2 / 5)


def test_genevals_overall_is_the_mean_of_the_category_means():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    base = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0])
    rows = table(scores, ["a", "a", "a", "a", "b"], base, OVERALL_OF_CATEGORIES)
    overall = rows[-1]
    assert overall.target == pytest.approx((0.25 + 1.0) / 2)  # not the plain mean 0.4
    assert overall.difference == pytest.approx((0.25 + 1.0) / 2)
    # a: differences (1, 0, 0, 0): SE 0.5 / 2 = 0.25; b: one sample, SE NaN -> the overall's NaN
    assert rows[0].se == pytest.approx(0.25) and math.isnan(rows[1].se) and math.isnan(overall.se)
    two = table(scores[:4], ["a", "a", "b", "b"], base[:4], OVERALL_OF_CATEGORIES)
    # a: diffs (1, 0) SE 0.5; b: (0, 0) SE 0: sqrt(0.25 + 0) / 2
    assert two[-1].se == pytest.approx(0.25)


def test_one_category_has_no_overall_row_and_no_baseline_no_columns():
    rows = table(torch.tensor([0.5, 1.0]), ["ocr", "ocr"])
    assert len(rows) == 1 and rows[0].baseline is None and rows[0].target == 0.75
    text = render("accuracy", rows, paired=False)
    assert text.splitlines()[1].split() == ["ocr", "2", "0.7500"] and "baseline" not in text
    paired = render("accuracy", table(torch.tensor([1.0, 1.0]), ["x", "x"], torch.tensor([0.0, 1.0])), True)
    assert paired.splitlines()[1].split() == ["x", "2", "1.0000", "0.5000", "+0.5000", "+-", "0.5000"]


def test_json_has_no_nan():
    assert finite({"a": [float("nan"), 1.0, float("inf")], "b": "x"}) == {"a": [None, 1.0, None], "b": "x"}
