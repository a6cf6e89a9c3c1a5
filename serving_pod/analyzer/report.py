"""``ferry-analyzer report``: one self-contained HTML file (inline SVG, no external assets) and a CSV export.

Everything shown is read from the checkpoint: the summary table (recommended vs default configuration and
the gain, as ``profile`` decided them), and per model the throughput-vs-p99 curves of every configuration,
the queue/compute breakdown and the memory-vs-latency plot of the best configurations, and their table.
Numeric summary cells carry ``class="num"``. A point measured several times (verification) is shown as the
median of its runs (``measure.combine``), the figure ``profile`` ranked; the CSV lists every run.
Neighbours: ``svg`` (charts), ``checkpoint`` (data).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from serving_pod.analyzer import svg
from serving_pod.analyzer.checkpoint import Checkpoint
from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.measure import Measurement, points
from serving_pod.analyzer.objectives import Constraints, Objective, best_of, config_rank

_CSS = """body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}
td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.rec td{background:#e8f5e9}tr.def td{background:#fff8e1}.bad{color:#b71c1c}pre{background:#f5f5f5;padding:8px}
.charts{display:flex;flex-wrap:wrap;gap:12px}"""


@dataclass(frozen=True)
class ModelView:
    """One model's checkpoint entry; ``measurements`` has one entry per point, verification trials combined."""

    name: str
    measurements: list[Measurement]
    configs: dict[str, Any]
    result: dict[str, Any] | None
    default_key: str
    objective: Objective
    constraints: Constraints
    runs: list[Measurement]  # every measurement as taken (the CSV export)

    def find(self, ref: dict[str, Any] | None) -> Measurement | None:
        if not ref:
            return None
        return next((m for m in self.measurements if m.config_key == ref["config_key"]
                     and m.concurrency == ref["concurrency"] and m.ok), None)

    def ranked_configs(self) -> list[tuple[str, Measurement | None]]:
        """Configurations, best first, each with its best measurement (feasible if any, else its top throughput)."""
        keys = list(dict.fromkeys(m.config_key for m in self.measurements))
        out = []
        for key in keys:
            items = [m for m in self.measurements if m.config_key == key]
            best = best_of(items, self.objective, self.constraints)
            if best is None:
                ok = [m for m in items if m.ok]
                best = max(ok, key=lambda m: m.throughput) if ok else None
            out.append((key, best, config_rank(items, self.objective, self.constraints)))
        out.sort(key=lambda item: item[2], reverse=True)
        return [(key, best) for key, best, _ in out]


def load_views(checkpoint: Checkpoint) -> list[ModelView]:
    views = []
    for name in checkpoint.model_names():
        entry = checkpoint.model(name)
        result = entry.get("result")
        objective, constraints = Objective(), Constraints()
        if result:
            objective = Objective(**{"kind": result["objective"]["kind"],
                                     "throughput_weight": result["objective"]["throughput_weight"],
                                     "latency_weight": result["objective"]["latency_weight"]})
            constraints = Constraints(**result["constraints"])
        runs = checkpoint.measurements(name)
        views.append(ModelView(name, points(runs), entry.get("configs", {}), result, entry.get("default_key", ""),
                               objective, constraints, runs))
    return views


def _f(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _num(value: float | None, digits: int) -> str:
    return f'<td class="num">{_f(value, digits)}</td>'


def summary_table(views: list[ModelView]) -> str:
    head = ("Model", "Status", "Recommended config", "Concurrency", "Throughput (infer/s)", "p99 (ms)",
            "Default config", "Concurrency", "Throughput (infer/s)", "p99 (ms)", "Gain (%)")
    rows = [f'<table id="summary"><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>']
    for view in views:
        result = view.result or {}
        best, default = view.find(result.get("recommended")), view.find(result.get("default"))
        status = ("recommended" if best else "no config meets the constraints" if result else "sweep not finished")
        gain = result.get("gain")
        cells = [f"<td>{escape(view.name)}</td>", f'<td class="{"" if best else "bad"}">{status}</td>']
        for m in (best, default):
            cells.append(f"<td><code>{escape(m.config_key) if m else '–'}</code></td>")
            cells += [f'<td class="num">{m.concurrency if m else "–"}</td>', _num(m.throughput if m else None, 1),
                      _num(m.p99_ms if m else None, 3)]
        cells.append(_num(None if gain is None else gain * 100, 1))
        rows.append(f"<tr>{''.join(cells)}</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _model_section(view: ModelView, top: int) -> str:
    result = view.result or {}
    best_ref = result.get("recommended") or {}
    ranked = view.ranked_configs()
    shown = [key for key, _ in ranked[:top]]
    for key in (best_ref.get("config_key"), view.default_key):
        if key and key not in shown and any(k == key for k, _ in ranked):
            shown.append(key)
    colors = {key: svg.PALETTE[i % len(svg.PALETTE)] for i, key in enumerate(shown)}
    parts = [f'<h2 id="model-{escape(view.name)}">{escape(view.name)}</h2>',
             f"<p>Objective: <b>{view.objective.kind}</b>; constraints: {escape(view.constraints.describe())}.</p>",
             f"<p>{escape(result.get('message', 'The sweep did not finish; figures so far are shown.'))}</p>"]
    series = []
    for key in dict.fromkeys([k for k, _ in ranked]):
        curve = [m for m in sorted(view.measurements, key=lambda m: m.concurrency) if m.config_key == key and m.ok]
        marks = tuple((m.p99_ms, m.throughput, f"{key} c={m.concurrency}: {m.throughput:.1f} infer/s, "
                       f"p99 {m.p99_ms:.3f} ms" + (f" (median of {m.trial} runs)" if m.trial > 1 else ""))
                      for m in curve)
        emphasis = key in (best_ref.get("config_key"), view.default_key)
        name = key + (" (recommended)" if key == best_ref.get("config_key") else "") + \
            (" (default)" if key == view.default_key else "")
        series.append(svg.Series(name if key in colors else "other configurations", marks,
                                 colors.get(key, "#c8c8c8"), emphasis=emphasis,
                                 labels=tuple(f"c={m.concurrency}" for m in curve)))
    charts = [svg.scatter(series, title="Throughput vs p99 latency", x_label="p99 latency (ms)",
                          y_label="throughput (infer/s)")]
    bests = [(key, m) for key, m in ranked if key in colors and m is not None]
    charts.append(svg.stacked_bars(
        [key for key, _ in bests],
        [("queue", [m.queue_us or 0.0 for _, m in bests], "#ff7f0e"),
         ("compute", [m.compute_us or 0.0 for _, m in bests], "#1f77b4")],
        title="Server latency breakdown (per request)", y_label="µs",
        tooltips=[f"c={m.concurrency}" for _, m in bests]))
    memory = [svg.Series(key, ((m.p99_ms, m.rss_mb, f"{key} c={m.concurrency}: {m.rss_mb:.1f} MiB, p99 "
                               f"{m.p99_ms:.3f} ms"),), colors[key], connect=False,
                         emphasis=key in (best_ref.get("config_key"), view.default_key))
              for key, m in bests if m.rss_mb is not None]
    if memory:
        charts.append(svg.scatter(memory, title="Server memory vs p99 latency", x_label="p99 latency (ms)",
                                  y_label="server RSS (MiB)"))
    parts.append(f'<div class="charts">{"".join(charts)}</div>')
    parts.append(_config_table(view, bests, best_ref.get("config_key")))
    rec_key = best_ref.get("config_key")
    if rec_key and rec_key in view.configs:
        from serving_pod.analyzer.space import config_from_dict, config_pbtxt

        text = config_pbtxt(config_from_dict(view.configs[rec_key]["config"]))
        parts.append(f"<h3>Recommended config.pbtxt</h3><pre>{escape(text)}</pre>")
    failed = {k: c["error"] for k, c in view.configs.items() if c.get("error")}
    if failed:
        parts.append("<h3>Configurations the server refused</h3><ul>" + "".join(
            f"<li><code>{escape(k)}</code>: {escape(e)}</li>" for k, e in failed.items()) + "</ul>")
    return "\n".join(parts)


def _config_table(view: ModelView, bests: list[tuple[str, Measurement]], rec_key: str | None) -> str:
    head = ("#", "Configuration", "Concurrency", "Runs", "Throughput (infer/s)", "p50 (ms)", "p95 (ms)", "p99 (ms)",
            "Queue (µs)", "Compute (µs)", "Avg batch", "CPU (%)", "RSS (MiB)", "Meets constraints")
    rows = [f'<table class="configs"><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>']
    for i, (key, m) in enumerate(bests, 1):
        cls = "rec" if key == rec_key else "def" if key == view.default_key else ""
        broken = view.constraints.violations(m)
        rows.append(f'<tr class="{cls}"><td class="num">{i}</td><td><code>{escape(key)}</code></td>'
                    f'<td class="num">{m.concurrency}</td><td class="num">{max(m.trial, 1)}</td>'
                    f"{_num(m.throughput, 1)}{_num(m.p50_ms, 3)}"
                    f"{_num(m.p95_ms, 3)}{_num(m.p99_ms, 3)}{_num(m.queue_us, 1)}{_num(m.compute_us, 1)}"
                    f"{_num(m.avg_batch, 2)}{_num(m.cpu_percent, 0)}{_num(m.rss_mb, 1)}"
                    f"<td>{'yes' if not broken else escape('; '.join(broken))}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def render(views: list[ModelView], settings: dict[str, Any], top: int = 10) -> str:
    sections = "\n".join(_model_section(view, top) for view in views)
    described = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>ferry-analyzer report</title>'
            f"<style>{_CSS}</style></head><body><h1>ferry-analyzer report</h1>"
            f"<p>Measurement settings: {escape(described)}.</p><h2>Summary</h2>{summary_table(views)}"
            f"{sections}</body></html>\n")


def write_csv(path: Path, views: list[ModelView]) -> None:
    fields = [f.name for f in dataclasses.fields(Measurement)] + ["meets_constraints"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for view in views:
            for m in view.runs:
                writer.writerow({**m.as_dict(), "meets_constraints": not view.constraints.violations(m)})


def write_report(checkpoint_dir: Path, html_path: Path, csv_path: Path, *, top: int = 10) -> None:
    checkpoint = Checkpoint.open(checkpoint_dir, create=False)
    views = load_views(checkpoint)
    if not views:
        raise InputError(f"checkpoint {checkpoint.path} holds no measurements yet")
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(render(views, checkpoint.data.get("settings", {}), top))
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(csv_path, views)
    except OSError as exc:
        raise InputError(f"cannot write the report: {exc}") from None
