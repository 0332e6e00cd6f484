"""Progress (:mod:`diffrl.logging.console`): plain periodic lines off a terminal, a tqdm bar on one;
console lines go above an open bar."""

import io
import sys
import time

from diffrl.logging import Progress, console
from diffrl.logging.console import clock, fmt, speed


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_prints_plain_lines(capsys):
    with Progress("train", 3, "iter", every=0.0) as progress:
        assert progress.bar is None
        progress.update(1)
        progress.update(2, postfix={"reward": 0.5})
        progress.update(3)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["train 1/3", "train 2/3", "train 3/3"]
    assert lines[1].endswith("reward=0.500") and "iter/s" in lines[0]
    assert "\r" not in "".join(lines)


def test_off_a_terminal_a_nested_progress_prints_only_when_it_takes_long(capsys):
    with Progress("train", 2, "iter") as outer:
        outer.update(1)  # the outermost's first line is printed at once
        with Progress("rollout", 4, "group", every=3600.0) as inner:
            for done in range(1, 5):
                inner.update(done)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("train 1/2 (50%)")


def test_on_a_terminal_progress_draws_a_bar_with_its_postfix():
    terminal = FakeTerminal()
    with Progress("train", 4, "iter", stream=terminal) as progress:
        assert progress.bar is not None and Progress.drawing()
        progress.update(1, postfix={"reward": 0.25, "s/iter": 2.0})
        with Progress("rollout", 2, "group", stream=terminal) as inner:
            assert abs(inner.bar.pos) == 1 and not inner.bar.leave  # under the training bar, then gone
            assert progress.bar.leave
    assert not Progress.drawing()
    drawn = terminal.getvalue()
    assert "\r" in drawn and "train" in drawn and "1/4" in drawn
    assert "reward=0.250" in drawn and "s/iter=2.00" in drawn and "s/iter=2.000" not in drawn


def test_a_console_line_goes_above_the_bar(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", terminal)  # the bar and the line share one terminal
    with Progress("train", 4, "iter", stream=terminal) as progress:
        progress.update(1)
        console("[step 1] train/loss=0.5000")
    # the bar is cleared (a carriage return) before the line, not run into it
    assert "\r[step 1] train/loss=0.5000\n" in terminal.getvalue()


def test_off_a_terminal_a_console_line_is_printed_as_is(capsys):
    console("[step 1] train/loss=0.5000")
    assert capsys.readouterr().out == "[step 1] train/loss=0.5000\n"


def test_the_eta_reads_as_a_clock_past_an_hour_and_a_day():
    assert [clock(s) for s in (0, 28, 725, 3723, 27 * 3600)] == [
        "0:00",
        "0:28",
        "12:05",
        "1:02:03",
        "27:00:00",
    ]


def test_metrics_show_three_significant_digits():
    values = [0.4792, 58.1871, 47.5596, 0.5, 1.0, 0.0012345, 99.96, 412.7, 3601.0, 1e-5, 3.2e7, -0.25]
    assert [fmt(v) for v in values] == [
        "0.479",
        "58.2",
        "47.6",
        "0.500",  # trailing zeros kept: a column of values lines up
        "1.00",
        "0.00123",
        "100",
        "413",  # whole seconds from 100 up
        "3601",
        "1.00e-05",
        "3.20e+07",
        "-0.250",
    ]
    assert [fmt(v) for v in (0.0, float("nan"), float("inf"), 7, True)] == ["0", "nan", "inf", "7", "True"]


def test_a_slow_loop_says_seconds_per_thing_a_fast_one_things_per_second():
    assert speed(2.6612, "img") == "2.66 img/s"
    assert speed(1 / 11.234, "group") == "11.2 s/group"  # not "0.09 group/s"
    assert speed(0.0, "iter") == "? iter/s"


def test_off_a_terminal_a_slow_progress_line_says_seconds_per_iteration(capsys):
    progress = Progress("train", 2, "iter")
    progress.start = progress.last = time.time() - 87.3328  # started 87 s ago: one slow iteration
    progress.update(1, postfix={"reward": 0.31771, "s/iter": 87.3328})
    progress.close()
    line = capsys.readouterr().err.strip()
    assert line == "train 1/2 (50%) 87.3 s/iter, ETA 1:27  reward=0.318  s/iter=87.3", line
