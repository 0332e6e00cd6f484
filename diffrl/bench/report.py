"""The benchmarks' section of a run's report page: the tables of the ``bench.json`` that
``diffrl bench --out RUN_DIR`` wrote into the run folder, and each suite's grid."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from diffrl.core.user_files import UserFileError, read_bytes, read_json

BENCH_JSON = "bench.json"
"""The file ``diffrl bench`` writes into ``--out`` (a run folder's: this page shows it)."""
MAX_BENCH_JSON = 64 * 2**20
"""The most of a ``bench.json`` read (by this page, and by ``diffrl bench`` adding a suite to it)."""
MAX_SUITES = 50
MAX_ROWS = 1000
FIX = "run `diffrl bench ... --out RUN_DIR` again to rewrite it"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None: not a number, NaN or infinite, or an integer past
    float's range (JSON's ``1e400`` is inf, but ``1`` and 400 zeros is an int that
    ``math.isfinite`` and ``:.4f`` would raise OverflowError on)."""
    if not _number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _fmt(value: Any, signed: bool = False) -> str:
    number = _finite(value)
    if number is None:
        return "" if value is None else "nan"
    return f"{number:+.4f}" if signed else f"{number:.4f}"


def _count(value: Any) -> str:
    """A row's ``n``: a count, shown when it is one (an int of at most 18 digits)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**18
    return str(value) if ok else ""


def _table(metric: str, rows: list[Any], paired: bool) -> str:
    head = f"<tr><th>{html.escape(metric)}</th><th>n</th><th>target</th>"
    head += "<th>baseline</th><th>difference ± SE (paired)</th></tr>" if paired else "</tr>"
    body = []
    for r in rows[:MAX_ROWS]:
        if not isinstance(r, dict):
            continue
        cells = (
            f"<td>{html.escape(str(r.get('category', ''))[:200])}</td>"
            f"<td class=num>{_count(r.get('n'))}</td>"
            f"<td class=num>{_fmt(r.get('target'))}</td>"
        )
        if paired:
            cells += (
                f"<td class=num>{_fmt(r.get('baseline'))}</td><td class=num>"
                f"{_fmt(r.get('difference'), True)} ± {_fmt(r.get('se'))}</td>"
            )
        body.append(f"<tr>{cells}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _grid(path: Path, caption: str, unread: list[str]) -> str:
    if not (path.exists() or path.is_symlink()):
        return ""
    try:
        data = read_bytes(path, "bench grid", FIX)
    except UserFileError as e:
        unread.append(str(e))
        return ""
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    text = html.escape(caption)
    return f'<figure><img src="{uri}" alt="{text}"><figcaption>{text}</figcaption></figure>'


def bench_section(run_dir: Path, unread: list[str]) -> list[str]:
    """The page's parts for ``run_dir/bench.json`` (none when there is no such file); what of it
    cannot be read is said in ``unread`` and left out."""
    path = run_dir / BENCH_JSON
    if not (path.exists() or path.is_symlink()):
        return []
    try:
        data = read_json(path, "bench results", FIX, MAX_BENCH_JSON)
    except UserFileError as e:
        unread.append(str(e))
        return []
    suites = data.get("suites") if isinstance(data, dict) else None
    if not isinstance(suites, dict):
        unread.append(f'{str(path)!r} holds no "suites" mapping; {FIX}')
        return []
    parts = [
        "<h2>Benchmarks</h2>",
        "<p>Scored by <code>diffrl bench</code> as each benchmark scores (docs/bench.md): the target and "
        "the baseline drew the same prompts with the same seeds; the difference is paired.</p>",
    ]
    for suite, result in list(suites.items())[:MAX_SUITES]:
        tables = result.get("tables") if isinstance(result, dict) else None
        if not isinstance(tables, dict):
            unread.append(f"{str(path)!r}: suite {str(suite)[:60]!r} holds no tables; {FIX}")
            continue
        meta = {k: html.escape(str(result.get(k))[:300]) for k in ("target", "baseline", "prompts")}
        n, k, seed = (str(result.get(key))[:40] for key in ("num_prompts", "samples_per_prompt", "seed"))
        counts = f"{n} prompts × {k} samples, seed {seed}"
        parts.append(f"<h3>{html.escape(str(suite)[:60])}</h3>")
        parts.append(
            f'<p class="meta">target <code>{meta["target"]}</code>'
            + (f" · baseline <code>{meta['baseline']}</code>" if result.get("baseline") else "")
            + f" · {html.escape(counts)} · prompts <code>{meta['prompts']}</code></p>"
        )
        paired = bool(result.get("baseline"))
        for metric, rows in list(tables.items())[:MAX_SUITES]:
            if isinstance(rows, list):
                parts.append(_table(str(metric)[:60], rows, paired))
        name = f"bench_{suite}.png" if str(suite).isidentifier() else ""
        if name:
            parts.append(_grid(run_dir / name, f"the target's first samples ({name})", unread))
    return parts
