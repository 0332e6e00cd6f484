"""The trust panel of a run's report (``docs/trust.md``): ``trust.png`` (paired gains of trained
and watched rewards with their standard errors, the diversity monitors, alarm spells, the best
checkpoint) and the group-health table, drawn from ``metrics.jsonl`` and ``eval_curve.json``.
:func:`trust_section` is the report's ``panels`` (:func:`diffrl.evaluation.report.build_report`)."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from diffrl.evaluation.report import figure_html, is_logged, is_number
from diffrl.logging import fmt

GAIN = re.compile(r"^eval/(watch/.+|reward)_gain$")
"""A paired gain over the first eval (``eval/reward_gain``, ``eval/watch/<label>_gain``)."""
DIVERSITY = (
    "monitor/within_group_std",
    "monitor/across_prompt_std",
    "monitor/clip_within_group_dist",
    "monitor/clip_across_prompt_dist",
    "monitor/near_duplicate_groups",
    "monitor/kl_to_base",
)
"""The diversity and drift monitors drawn in ``trust.png`` (those a run logged)."""
LEVELS = ("monitor/within_group_std", "monitor/across_prompt_std", "monitor/image_std")
"""Monitors in uint8 levels (the panel's left axis); the others (shares, distances, KL) go on
a right axis of their own, dashed."""
ALARMS = {"alarm/reward_hacking": "reward hacking (eval.watch_alarm)", "alarm/collapse": "collapse"}
GUARD = "GRPO-Guard (arXiv 2510.22319, Wang et al.)"
FLOW_GRPO = "Flow-GRPO (arXiv 2505.05470; github.com/yifan123/flow_grpo, scripts/train_sd3.py)"
HEALTH = (
    (
        "train/clip_frac_high",
        "small, about as large as clip_frac_low",
        GUARD + ": a left-shifted ratio clips few positive-advantage samples",
    ),
    ("train/clip_frac_low", "small, about as large as clip_frac_high", GUARD),
    ("train/ratio_mean", "about 1", GUARD + ": a mean below 1 precedes implicit over-optimisation"),
    ("train/ratio_std", "small and steady", GUARD + ": its spread differs across timesteps"),
    ("train/ratio_max", "near 1 + clip_range", FLOW_GRPO + ": PPO clipping of the per-step ratio"),
    ("train/adv_std", "about 1 (per-group std normalisation); near 0: no signal", FLOW_GRPO),
    (
        "rollout/zero_std_ratio",
        "low: a group scored alike gives no gradient",
        FLOW_GRPO + "; DanceGRPO (arXiv 2505.07818)",
    ),
    ("rollout/reward_failed_frac", "0", "diffrl: samples whose reward failed are not trained on"),
    ("monitor/within_group_std", "steady; falling to 0 is collapse", "diffrl monitors"),
    ("monitor/across_prompt_std", "steady", "diffrl monitors"),
    (
        "monitor/clip_within_group_dist",
        "steady; falling toward 0 is collapse",
        "diffrl monitors; GARDO's distance",
    ),
    ("monitor/clip_across_prompt_dist", "steady", "diffrl monitors; GARDO's distance"),
    ("monitor/near_duplicate_groups", "0", "diffrl monitors"),
    ("monitor/kl_to_base", "grows slowly", "diffrl monitors"),
)
"""The group-health rows of the summary table: (metric, healthy range, source), shown when logged."""


@dataclass(frozen=True)
class AlarmSpell:
    """An alarm firing at every logged iteration from ``first`` to ``last`` (``count`` of them)."""

    first: int
    last: int
    count: int
    what: str

    def text(self) -> str:
        if self.count == 1:
            return f"iteration {self.first}: {self.what} alarm"
        return f"iterations {self.first}-{self.last} ({self.count} in a row): {self.what} alarm"


def alarm_spells(rows: list[dict[str, float]], evals: list[dict[str, float]]) -> list[AlarmSpell]:
    """Every alarm the run logged (a metric of :data:`ALARMS` at 1.0), consecutive firings of one
    alarm (at the iterations that logged it) merged into one spell, in order of their start."""
    spells = []
    for key, what in ALARMS.items():
        logged = sorted({int(r["step"]): r[key] for r in [*rows, *evals] if is_number(r.get(key))}.items())
        run: list[int] = []
        for step, value in [*logged, (-1, 0.0)]:  # a sentinel closes the last spell
            if value == 1.0:
                run.append(step)
            elif run:
                spells.append(AlarmSpell(run[0], run[-1], len(run), what))
                run = []
    return sorted(spells, key=lambda a: (a.first, a.what))


def best_point(evals: list[dict[str, float]]) -> dict[str, float] | None:
    """The eval where ``train.keep_best`` last moved ``checkpoints/best`` (None: it never did)."""
    moved = [e for e in evals if e.get("keep_best/iteration") == e["step"] and "keep_best/gain" in e]
    return moved[-1] if moved else None


def plot_trust(rows: list[dict[str, float]], evals: list[dict[str, float]], path: Path) -> Path | None:
    """``trust.png``: the trained and watched rewards' paired gains over the first eval with their
    SE bands, and the diversity monitors; alarms as red lines, the best checkpoint as a star.
    None (and no file) for a run with neither gains nor monitors."""
    gains = sorted({k for e in evals for k in e if GAIN.match(k)}, key=lambda k: (k != "eval/reward_gain", k))
    monitors = [k for k in DIVERSITY if is_logged(rows, k)]
    panels = [p for p in (gains, monitors) if p]
    if not panels:
        return None
    fig = Figure(figsize=(5.2 * len(panels), 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    alarms, best = alarm_spells(rows, evals), best_point(evals)
    for ax, keys in zip(axes, panels, strict=True):
        source = evals if keys is gains else rows
        right = ax.twinx() if keys is monitors and any(k not in LEVELS for k in keys) else None
        for key in keys:
            pts = sorted(
                (r["step"], r[key], r.get(key + "_se", 0.0)) for r in source if is_number(r.get(key))
            )
            if not pts:
                continue
            x, y, se = (list(v) for v in zip(*pts, strict=True))
            label = (
                "trained (eval total)"
                if key == "eval/reward_gain"
                else key.split("/", 1)[1].removesuffix("_gain")
            )
            if right is not None and key not in LEVELS:
                right.plot(
                    x,
                    y,
                    marker="o",
                    ms=3,
                    ls="--",
                    label=label + " (right axis)",
                    color=f"C{len(ax.lines) + len(right.lines)}",
                )
            else:
                ax.plot(
                    x,
                    y,
                    marker="o",
                    ms=3,
                    label=label,
                    color=f"C{len(ax.lines) + (len(right.lines) if right else 0)}",
                )
            if keys is gains:
                se = [s if is_number(s) and math.isfinite(s) else 0.0 for s in se]
                ax.fill_between(
                    x,
                    [a - s for a, s in zip(y, se, strict=True)],
                    [a + s for a, s in zip(y, se, strict=True)],
                    alpha=0.2,
                )
        for spell in alarms:  # where each alarm starts, and how long it keeps firing
            ax.axvline(spell.first, color="red", alpha=0.6, lw=1)
            if spell.last > spell.first:
                ax.axvspan(spell.first, spell.last, color="red", alpha=0.06, lw=0)
        if best is not None and keys is gains and is_number(best.get("eval/reward_gain")):
            ax.plot(
                [best["step"]],
                [best["eval/reward_gain"]],
                marker="*",
                ms=14,
                color="gold",
                mec="k",
                label="best checkpoint",
            )
        ax.set_title("paired gain over the first eval (± SE)" if keys is gains else "diversity and drift")
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if right is not None:
            more = right.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        ax.legend(handles, labels, fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def trust_section(run_dir: Path, rows: list[dict[str, float]], evals: list[dict[str, float]]) -> list[str]:
    """The page's "Can this run be trusted?" parts: ``trust.png``, the alarms, the best checkpoint
    and the group-health table (each part only when the run logged what it shows)."""
    png = plot_trust(rows, evals, run_dir / "trust.png")
    alarms, best = alarm_spells(rows, evals), best_point(evals)
    health = []
    for key, healthy, source in HEALTH:
        values = [r[key] for r in rows if is_number(r.get(key)) and math.isfinite(r[key])]
        if values:
            health.append(
                f"<tr><td><code>{html.escape(key)}</code></td><td class=num>{fmt(float(values[-1]))}</td>"
                f"<td class=num>{fmt(sum(values) / len(values))}</td><td>{html.escape(healthy)}</td>"
                f"<td>{html.escape(source)}</td></tr>"
            )
    if png is None and not alarms and best is None and not health:
        return []
    parts = ["<h2>Can this run be trusted?</h2>"]
    if png is not None:
        parts.append(
            figure_html(
                png,
                "paired gains of the trained and watched rewards over the first eval (± SE); "
                "diversity monitors; red lines: where an alarm fires (shaded while it keeps firing); star: the best checkpoint (trust.png)",
            )
        )
    if alarms:
        items = "".join(f"<li>{html.escape(a.text())}</li>" for a in alarms)
        parts.append(f"<p>Alarms:</p><ul class=alarms>{items}</ul>")
    else:
        parts.append("<p>No alarm fired.</p>")
    if best is not None:
        parts.append(
            f"<p class=best>Best checkpoint (<code>checkpoints/best</code>, <code>train.keep_best</code>): "
            f"iteration {int(best['step'])}, {fmt(float(best['keep_best/gain']))} ± "
            f"{fmt(float(best['keep_best/gain_se']))} (SE) over the best before it.</p>"
        )
    if health:
        parts.append(
            "<h3>Group health</h3><table><tr><th>metric</th><th>last</th><th>mean</th><th>healthy</th>"
            f"<th>source</th></tr>{''.join(health)}</table>"
        )
    return parts
