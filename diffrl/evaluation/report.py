"""A run's end in pictures and one page: ``eval/compare.png`` (the first and the last eval grids
side by side), ``metrics.png`` (the training curves) and ``report.html``, which holds them all
(images embedded, no outside files), for a reader who was not watching the terminal.

```
runs/NAME/
  metrics.png        reward, loss, KL, grad norm, log-prob diff against the iteration (those logged)
  eval_curve.png     the mean eval reward at each eval (evaluation/evaluate.py)
  trust.png          paired gains of trained and watched rewards (± SE), diversity, alarms, best
  eval/step_NNNNN.png  each eval's grid, every sample captioned with its prompt and reward
  eval/compare.png   the first and last grids side by side: the same prompts and seeds
  report.html        all of the above, the final numbers and the resolved config
```
:func:`write_report` draws them from the run folder's ``metrics.jsonl`` and ``eval_curve.json``,
each once: the driver calls it when a run ends, ``diffrl report RUN_DIR`` on any run folder,
finished or not.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image, ImageDraw, ImageFont

from diffrl.config.binding import YamlProblem, load_yaml
from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import UserFileError, check_file, file_problem, read_bytes, read_text
from diffrl.evaluation.evaluate import eval_grid_path, eval_table, plot_eval_curve, read_grid_note, wrap
from diffrl.logging import fmt

EVAL_KEY = "eval/reward_mean"


@dataclass(frozen=True)
class Panel:
    """One plot of ``metrics.png``: its title and the metrics drawn in it."""

    title: str
    keys: tuple[str, ...]


PANELS = (
    Panel("reward", ("rollout/reward/raw_mean", EVAL_KEY)),
    Panel("loss", ("train/loss",)),
    Panel("KL", ()),  # whichever KL terms the algorithm logs: see KL_KEY
    Panel("grad norm", ("train/grad_norm",)),
    Panel("log-prob diff", ("train/log_prob_mean_abs_diff",)),
)
"""The panels ``metrics.png`` can have, in order; a run gets those it logged a metric of."""

KL_KEY = re.compile(r"^train/(.+_)?kl(_.+)?$")
"""A KL metric of any algorithm (``train/kl_loss``, ``train/approx_kl``)."""


REPORT_FIX = "the report shows the rest; replace or remove the file to have it in the report"


@dataclass
class RunRecord:
    """What a run folder's files hold, as far as they could be read: ``unread`` says, one line
    each, what could not be (a file that is no regular file or not UTF-8, JSON cut short, rows
    of the wrong types), naming the file."""

    config_text: str = ""
    config: dict = field(default_factory=dict)
    rows: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


def _text(path: Path, unread: list[str]) -> str | None:
    """``path``'s text; None when it is absent (no note: a run that has not logged yet) or cannot
    be read (noted in ``unread``)."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_text(path, "run file", REPORT_FIX)
    except UserFileError as e:
        unread.append(str(e))
        return None


MAX_STEP = 10**12
"""A step beyond any run's (``train.iterations`` is at most 10^9): a row claiming one (a 401-digit
number) is not a metric row."""
MAX_VALUE = 1e100
"""The largest magnitude a plot takes (matplotlib cannot place ticks across 1e308, nor around an
inf); a metric beyond it is left out, and said."""


def _step(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plottable(value: object) -> bool:
    """A number within :data:`MAX_VALUE` (a NaN too: a diverged loss is a gap in its curve)."""
    return is_number(value) and ((isinstance(value, float) and math.isnan(value)) or abs(value) <= MAX_VALUE)


def _clean(row: dict, dropped: set[str]) -> dict[str, float]:
    """A metrics or eval row with its numbers only; the names of values of another type, or
    beyond :data:`MAX_VALUE`, are added to ``dropped``."""
    dropped.update(str(k) for k, v in row.items() if not _plottable(v))
    return {k: v for k, v in row.items() if _plottable(v)}


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _some(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _dropped_note(path: Path, dropped: set[str]) -> str:
    return (
        f"{str(path)!r}: values that are not numbers were left out ({_some(sorted(dropped))}) "
        f"(infinite ones and ones beyond {MAX_VALUE:g} count as such)"
    )


def read_metrics(path: Path, unread: list[str] | None = None) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl``: each line a JSON object with a whole ``step`` >= 0
    (its values that are not numbers left out). Lines that are not (garbage, a line cut short by
    a crash) are skipped; each kind of problem is said in ``unread``, as is a file that cannot be
    read."""
    unread = [] if unread is None else unread
    lines = (_text(path, unread) or "").splitlines()
    rows, bad, dropped = [], [], set()
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        # ValueError: not JSON, or a number of more than 4,300 digits; RecursionError: nested deep
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict) and _step(row.get("step")):
            rows.append(_clean(row, dropped))
        elif line.strip():
            bad.append(n)
    if bad:
        cut = " (the last one cut short: the run stopped while writing it)" if bad[-1] == len(lines) else ""
        unread.append(
            f"{str(path)!r}: line(s) {_some([str(n) for n in bad])} are not metric rows "
            f'({{"step": N, ...}}) and were skipped{cut}'
        )
    if dropped:
        unread.append(_dropped_note(path, dropped))
    return rows


def read_evals(path: Path, unread: list[str]) -> list[dict[str, float]]:
    """The evals of a run's ``eval_curve.json``: a JSON array of objects with a whole ``step``
    (numbers only). What is not (JSON cut short, another type, entries without a step) is left
    out and said in ``unread``."""
    text = _text(path, unread)
    if text is None:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        unread.append(f"{str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}); {REPORT_FIX}")
        return []
    except ValueError as e:  # Python reads no number of more than 4,300 digits
        unread.append(f"{str(path)!r} holds a value JSON cannot read ({str(e)[:120]}); {REPORT_FIX}")
        return []
    except RecursionError:  # arrays or objects nested thousands deep: never an eval curve
        unread.append(f"{str(path)!r} is nested too deeply to be the array of evals; {REPORT_FIX}")
        return []
    if not isinstance(data, list):
        unread.append(
            f"{str(path)!r} holds {_json_type(data)}, not the array of evals "
            f'([{{"step": N, "eval/reward_mean": ...}}, ...]); {REPORT_FIX}'
        )
        return []
    dropped: set[str] = set()
    evals = [_clean(e, dropped) for e in data if isinstance(e, dict) and _step(e.get("step"))]
    if len(evals) < len(data):
        bad = [str(i) for i, e in enumerate(data) if not (isinstance(e, dict) and _step(e.get("step")))]
        unread.append(
            f"{str(path)!r}: entries {_some(bad)} (counted from 0) are not evals with a whole step "
            "and were left out"
        )
    if dropped:
        unread.append(_dropped_note(path, dropped))
    return evals


def read_run(run_dir: Path) -> RunRecord:
    """A run folder's ``config.yaml``, ``metrics.jsonl`` and ``eval_curve.json``, as far as they
    can be read (:class:`RunRecord`): no file of it, whatever it holds, makes this fail or wait."""
    record = RunRecord()
    config_file = run_dir / "config.yaml"
    record.config_text = _text(config_file, record.unread) or ""
    try:  # bounded: an alias bomb or deep nesting is refused, not expanded (the page prints settings)
        config = load_yaml(record.config_text)[0] or {}
    except YamlProblem as e:
        record.unread.append(f"{str(config_file)!r} is not a config diffrl wrote ({str(e)[:200]})")
        config = {}
    except yaml.YAMLError as e:
        record.unread.append(f"{str(config_file)!r} is not valid YAML ({' '.join(str(e).split())[:200]})")
        config = {}
    if isinstance(config, dict):
        record.config = config
    else:
        record.unread.append(f"{str(config_file)!r} holds {_json_type(config)}, not a config mapping")
    record.rows = read_metrics(run_dir / "metrics.jsonl", record.unread)
    record.evals = read_evals(run_dir / "eval_curve.json", record.unread)
    return record


def is_logged(rows: list[dict[str, float]], key: str) -> bool:
    return any(isinstance(r.get(key), int | float) and math.isfinite(r[key]) for r in rows)


def _all_zero(rows: list[dict[str, float]], key: str) -> bool:
    """A KL term the run had switched off (its coefficient 0: the term is logged as 0)."""
    return all(r[key] == 0 for r in rows if key in r)


def metric_panels(rows: list[dict[str, float]]) -> list[Panel]:
    """The panels of :data:`PANELS` with a metric ``rows`` logged (a finite value of it), each
    with just those metrics; a KL metric that is 0 throughout (the term was off) is left out."""
    names = sorted({k for r in rows for k in r})
    out = []
    for panel in PANELS:
        keys = panel.keys or tuple(k for k in names if KL_KEY.match(k) and not _all_zero(rows, k))
        present = tuple(k for k in keys if is_logged(rows, k))
        if present:
            out.append(Panel(panel.title, present))
    return out


def plot_metrics(rows: list[dict[str, float]], path: Path) -> Path | None:
    """The panels of :func:`metric_panels` against the iteration, saved as a PNG; None (and no
    file) when ``rows`` logged none of them."""
    panels = metric_panels(rows)
    if not panels:
        return None
    columns = 2 if len(panels) == 4 else min(len(panels), 3)
    n_rows = -(-len(panels) // columns)
    fig = Figure(figsize=(4.2 * columns, 2.9 * n_rows))  # no pyplot: no global state to clean up
    axes = fig.subplots(n_rows, columns, squeeze=False).flatten()
    for ax, panel in zip(axes, panels, strict=False):
        for key in panel.keys:
            points = sorted((r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float))
            sparse = len(points) < 30 or key.startswith("eval/")  # evals: a point each
            ax.plot(*zip(*points, strict=True), marker="o" if sparse else None, ms=3, label=key)
        ax.set_title(panel.title)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def eval_label(point: dict[str, float], key: str = EVAL_KEY) -> str:
    """``step 24 · mean eval reward 0.431`` (the step alone for an eval without rewards)."""
    value = point.get(key)
    return f"step {point['step']}" + (f" · mean eval reward {value:.3f}" if value is not None else "")


MAX_GRID_PIXELS = 64 * 2**20
"""A grid a run writes has ~1 M pixels; a file in the run folder claiming more than this (a hand
edit, another program's file) is not decoded (64 M pixels are ~200 MB of RGB)."""
COMPARE_WIDTH = 1200
"""The widest ``eval/compare.png`` that sets its two grids side by side: about a laptop page
(1280 px less margins), where the grids' captions read at their own size. Wider pairs (the
tiny world's 32-image grids are ~1060 px each) go one above the other."""


def compose_side_by_side(
    left: Path, right: Path, labels: tuple[str, str], path: Path, max_width: int = COMPARE_WIDTH
) -> Path:
    """Two images (eval grids) side by side, each under a header line of its label; one above
    the other when side by side they would be wider than ``max_width`` px (a page scales a wider
    image down, and the grids' captions would no longer read)."""
    images = [_grid(p) for p in (left, right)]
    gap = max(8, images[0].width // 100)
    stacked = sum(im.width for im in images) + gap > max_width
    font = ImageFont.load_default(size=max(14, min(images[0].width // 50, 40)))
    ascent, descent = font.getmetrics()
    line_h = ascent + descent + 2
    lines = [wrap(label, font, im.width - 8) for label, im in zip(labels, images, strict=True)]
    header = 8 + line_h * max(len(x) for x in lines)
    if stacked:
        size = (max(im.width for im in images), sum(header + im.height for im in images) + gap)
    else:
        size = (sum(im.width for im in images) + gap, header + max(im.height for im in images))
    out = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(out)
    x = y = 0
    for im, text in zip(images, lines, strict=True):
        for i, line in enumerate(text):
            draw.text((x + 4, y + 4 + i * line_h), line, fill=(0, 0, 0), font=font)
        out.paste(im, (x, y + header))
        if stacked:
            y += header + im.height + gap
        else:
            x += im.width + gap
    if stacked:
        middle = header + images[0].height + gap // 2
        draw.line([(0, middle), (out.width, middle)], fill=(160, 160, 160))
    else:
        middle = images[0].width + gap // 2
        draw.line([(middle, 0), (middle, out.height)], fill=(160, 160, 160))
    path.parent.mkdir(parents=True, exist_ok=True)
    out.save(path)
    return path


def _grid(path: Path) -> Image.Image:
    """An eval grid's pixels (RGB); ValueError for a file larger than any grid a run writes,
    read from its header before anything is decoded."""
    too_large = f"{str(path)!r} has more pixels than any eval grid a run writes (at most {MAX_GRID_PIXELS:,})"
    fix = "replace it with the run's own grid"
    try:
        with warnings.catch_warnings():  # PIL warns past its own limit: the check below refuses first
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
    except Image.DecompressionBombError as e:  # past twice PIL's limit: it refuses to open it
        raise ValueError(f"{too_large}: {e}; {fix}") from e
    with img:
        w, h = img.size
        if w * h > MAX_GRID_PIXELS:
            raise ValueError(f"{too_large}: {w}x{h}; {fix}")
        return img.convert("RGB")


def save_compare(
    run_dir: Path, evals: list[dict[str, float]], unread: list[str] | None = None
) -> Path | None:
    """``eval/compare.png``: the first eval's grid (step 0) beside the last's, the same prompts and
    seeds, labelled with their step and mean eval reward; None (no file) with fewer than two evals
    or a grid missing, or one that cannot be read (said in ``unread``)."""
    if len(evals) < 2:
        return None
    first, last = evals[0], evals[-1]
    grids = eval_grid_path(run_dir, first["step"]), eval_grid_path(run_dir, last["step"])
    if not all(g.exists() or g.is_symlink() for g in grids):
        return None
    before = " (before training)" if first["step"] == 0 else ""  # step 0: the model the run started from
    try:
        for grid in grids:
            check_file(grid, "eval grid", REPORT_FIX)
        return compose_side_by_side(
            *grids, (eval_label(first) + before, eval_label(last)), run_dir / "eval" / "compare.png"
        )
    except (UserFileError, OSError, SyntaxError, ValueError) as e:  # PIL: a file that is no image
        if unread is not None:
            unread.append(f"eval/compare.png not drawn: {e}")
        return None


def check_run_folder(run_dir: Path) -> None:
    """Refuse a folder that is no run's (it holds neither ``metrics.jsonl`` nor ``config.yaml``)."""
    if not run_dir.is_dir():
        what = "it is a file" if run_dir.exists() else "no such folder"
        raise DiffrlError(
            f"RUN_DIR {str(run_dir)!r}: {what}; give the output folder of a training run, "
            "e.g. runs/tiny_demo (the run's run.output_dir)"
        )
    if not any(p.exists() or p.is_symlink() for p in (run_dir / "metrics.jsonl", run_dir / "config.yaml")):
        raise DiffrlError(
            f"RUN_DIR {str(run_dir)!r} is not a diffrl run folder (no metrics.jsonl or config.yaml "
            "inside); give the folder `diffrl train` wrote, e.g. runs/tiny_demo, not one inside it"
        )


MAX_GRIDS = 12
"""The eval grids a report embeds at most (a long run of a large model has many, megabytes each)."""


def spread(items: list, n: int) -> list:
    """At most ``n`` of ``items``: the first, the last and evenly spaced ones between, in order."""
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[-1]]
    picks = sorted({round(i * (len(items) - 1) / (n - 1)) for i in range(n)})
    return [items[i] for i in picks]


def _code(text: str) -> str:
    """``text`` escaped, its backquoted spans as ``<code>``."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def figure_html(path: Path | None, caption: str, grid: bool = False, unread: list[str] | None = None) -> str:
    """An image embedded with its caption, at most the page's width (:data:`STYLE`); a ``grid``'s
    caption also says how many of the eval's samples it shows (its :class:`GridNote`). Nothing
    for a file absent, or one that cannot be read (said in ``unread``)."""
    if path is None or not (path.exists() or path.is_symlink()):
        return ""
    try:
        data = read_bytes(path, "image", REPORT_FIX)
    except UserFileError as e:
        if unread is not None:
            unread.append(str(e))
        return ""
    note = read_grid_note(path) if grid else None
    text = f"{caption} · {note.shown}" if note is not None else caption
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure><img src="{uri}" alt="{html.escape(text)}">'
        f"<figcaption>{html.escape(text)}</figcaption></figure>"
    )


def _grid_note(path: Path):
    """The grid's note, for a regular file only (PIL would wait on a FIFO)."""
    return read_grid_note(path) if file_problem(path) is None else None


def final_numbers(rows: list[dict[str, float]]) -> list[tuple[str, float, int]]:
    """The last value of each metric of :func:`metric_panels` and of the iteration time:
    ``(metric, value, step)``."""
    keys = [k for p in metric_panels(rows) for k in p.keys] + ["perf/iteration_time"]
    out = []
    for key in keys:
        last = next((r for r in reversed(rows) if isinstance(r.get(key), int | float)), None)
        if last is not None:
            out.append((key, last[key], int(last["step"])))
    return out


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; } code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; }
table { border-collapse: collapse; } td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #eee;
       text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; height: auto; }
"""
"""Every image at most the page's width: nothing scrolls sideways on a laptop (1280 px). The
tiny world's grids (~1060 px) and compare.png (stacked, :data:`COMPARE_WIDTH`) show at their own
size; a large model's grid is scaled down (the PNG in the run folder has it at full size)."""


@dataclass(frozen=True)
class Report:
    """A written ``report.html`` (``path``) and what of the run folder it could not read."""

    path: Path
    unread: list[str]


def write_report(run_dir: Path, out: Path | None = None, panels: Panels | None = None) -> Path:
    """``report.html`` of a run folder (or ``out``); see :func:`build_report`."""
    return build_report(run_dir, out, panels=panels).path


Panels = Callable[[Path, list[dict[str, float]], list[dict[str, float]]], list[str]]
"""``panels(run_dir, rows, evals) -> HTML parts`` drawn after the curves (the trust panel,
:func:`diffrl.trust.report.trust_section`)."""


def build_report(
    run_dir: Path,
    out: Path | None = None,
    extra: Callable[[Path, list[str]], list[str]] | None = None,
    panels: Panels | None = None,
) -> Report:
    """``report.html`` of a run folder (or ``out``): one page, images embedded as data URIs. The
    pictures are drawn first (into ``run_dir``), from the metrics and evals as they are now.
    A file of the folder that cannot be read (see :func:`read_run`) is left out: the page says
    so in its first section, and the rest is written as ever. ``extra(run_dir, unread)``: more
    of the page's parts (HTML), placed before the config (a layer above adds its own sections:
    ``diffrl report`` the benchmarks', :mod:`diffrl.bench.report`); ``panels``: more parts drawn
    from the metrics and evals, placed after the curves (the trust panel)."""
    run_dir = Path(run_dir)
    check_run_folder(run_dir)
    record = read_run(run_dir)
    config, config_text, rows, evals = record.config, record.config_text, record.rows, record.evals
    unread = record.unread

    def setting(section: str, key: str) -> str:
        value = config.get(section, {})
        return str(value.get(key, "?"))[:200] if isinstance(value, dict) else "?"

    metrics_png, curve_png, compare_png = (
        run_dir / "metrics.png",
        run_dir / "eval_curve.png",
        run_dir / "eval" / "compare.png",
    )
    # drawn anew from the metrics and evals as they are now (a run still going has more of them)
    if rows:
        plot_metrics(rows, metrics_png)
    if evals:
        plot_eval_curve(evals, curve_png)
    save_compare(run_dir, evals, unread)

    run = config.get("run")
    name = str(run.get("name") or run_dir.name) if isinstance(run, dict) else run_dir.name
    key = next((k for e in evals[-1:] for k in e if k.endswith("reward_mean")), EVAL_KEY)
    numbers = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td><td class=num>{fmt(float(v))}</td><td class=num>{s}</td></tr>"
        for k, v, s in final_numbers(rows)
    )
    # the evals the run kept (a resumed run's eval_curve.json drops those of a process that died
    # after its last checkpoint; their grids may still lie in eval/), at most MAX_GRIDS of them
    points = evals or [
        {"step": int(step)}
        for p in sorted((run_dir / "eval").glob("step_*.png"))
        if (step := p.stem.removeprefix("step_")).isdigit()
    ]
    shown = spread(points, MAX_GRIDS)
    grids = [figure_html(eval_grid_path(run_dir, e["step"]), eval_label(e, key), True, unread) for e in shown]
    if len(shown) < len(points):
        grids.append(
            f"<p>{len(shown)} of the {len(points)} eval grids are shown (the first, the last and "
            f"evenly spaced ones between); every one is in <code>{html.escape(str(run_dir / 'eval'))}</code>.</p>"
        )
    parts = [
        f"<h1>{html.escape(name)}</h1>",
        f'<p class="meta">algorithm <b>{html.escape(setting("algorithm", "name"))}</b> · family '
        f"<b>{html.escape(setting('model', 'family'))}</b> · model <code>{html.escape(setting('model', 'path'))}</code>"
        f" · folder <code>{html.escape(str(run_dir.resolve()))}</code></p>",
        "<h2>Final numbers</h2>",
        f"<table><tr><th>metric</th><th>last value</th><th>at step</th></tr>{numbers}</table>"
        if numbers
        else "<p>no metrics logged yet</p>",
        f"<pre>{html.escape(eval_table(evals, key))}</pre>" if evals else "<p>no eval yet</p>",
        "<h2>Curves</h2>",
        figure_html(metrics_png, "training metrics against the iteration (metrics.png)"),
        figure_html(curve_png, f"{key} at each eval (eval_curve.png)"),
        *(panels(run_dir, rows, evals) if panels is not None else []),
    ]
    if compare_png.is_file():
        parts += [
            "<h2>First and last eval</h2>",
            figure_html(
                compare_png, "the same prompts and seeds at the first and the last eval (eval/compare.png)"
            ),
        ]
    hint = next((n.hint for e in shown if (n := _grid_note(eval_grid_path(run_dir, e["step"])))), "")
    parts += [
        "<h2>Eval grids</h2>",
        "<p>Each eval samples the same prompts with the same seeds; every tile is captioned with its "
        "prompt, its total reward, and the seed and index it was drawn with"
        + (f": {_code(hint)}" if hint else "")
        + ".</p>",
        *(grids or ["<p>no eval grids</p>"]),
        *(extra(run_dir, unread) if extra is not None else []),
        "<h2>Config</h2>",
        f"<pre>{html.escape(config_text)}</pre>" if config_text else "<p>no config.yaml</p>",
    ]
    if unread:  # first, so that nobody takes a page with parts left out for the whole run
        items = "".join(f"<li>{html.escape(u)}</li>" for u in unread)
        parts[2:2] = [f"<h2>Not read</h2><p>Left out of this page:</p><ul>{items}</ul>"]
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>diffrl report: {html.escape(name)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(p for p in parts if p)
        + "\n</body></html>\n"
    )
    path = Path(out) if out is not None else run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return Report(path, unread)
