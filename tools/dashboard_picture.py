"""Draws the chart's Grafana dashboard (helm/elastic-jax/dashboards/elastic-jax.json) as a PNG from its own queries
against a real Prometheus: the README's dashboard picture, since Grafana cannot be used here (Debian does not
package it, and its AGPL licence keeps it out of the project).

Each panel's queries run as Prometheus range queries (`/api/v1/query_range`) over a time window, with the
dashboard's variables substituted as Grafana substitutes them, and each panel is drawn at its own `gridPos`
with matplotlib: a stat panel as its last value(s) in big type, a time series as lines named by the target's
`legendFormat`, units from the panel's `fieldConfig.defaults.unit`. Not drawn: Grafana's colours, thresholds,
tooltips and panel descriptions.

    .venv/bin/python -m tools.dashboard_picture --prometheus http://127.0.0.1:9090 --job cpu-job --minutes 15

(`--help` for the rest). How docs/images/dashboard-local-cpu.png is made: docs/observability.md, "The Grafana
dashboard".
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[1] / "helm" / "elastic-jax" / "dashboards" / "elastic-jax.json"
TITLE = ("the elastic-jax Grafana dashboard's panels, drawn from its own queries against a real Prometheus "
         "(not a Grafana screenshot)")
MAX_POINTS = 300  # samples per series at most: Grafana asks for about one per pixel of a panel's width
COLUMN_IN, ROW_IN = 16 / 24, 16 / 24 * 30 / 80  # a grid cell in inches: 24 columns; a row 30 px of an 80-px column


@dataclass
class Series:
    """One series a panel target returned: `name` from its legendFormat, `t` epoch seconds, `v` values (NaN kept)."""
    name: str
    t: list[float]
    v: list[float]


def grafana_builtins(window_s: int, step_s: int, scrape_interval_s: int) -> dict[str, str]:
    """Grafana's own variables for a window of `window_s` seconds queried every `step_s`: `$__interval` (the
    step), `$__rate_interval` (max(step + scrape interval, 4 x scrape interval), Grafana's rule) and `$__range`."""
    rate = max(step_s + scrape_interval_s, 4 * scrape_interval_s)
    return {"__interval": f"{step_s}s", "__rate_interval": f"{rate}s", "__range": f"{window_s}s"}


def substitute(text: str, values: dict[str, str]) -> str:
    """`text` with each `$name` and `${name}` replaced by `values[name]`.

    Raises:
      ValueError: a variable with no value (the message names it).
    """
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise ValueError(f"the dashboard's variable ${name} has no value")
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def legend(fmt: str, metric: dict[str, str]) -> str:
    """A series' name as Grafana writes it: `fmt` (a legendFormat) with `{{label}}` replaced by the series' label
    value; with no format, its selector (`name{label="value", ...}`)."""
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{metric.get('__name__', '')}{{{labels}}}"


def query_range(url: str, expr: str, start: float, end: float, step_s: int) -> list[dict]:
    """Prometheus's `/api/v1/query_range` result at `url`: `[{"metric": {...}, "values": [[t, "v"], ...]}, ...]`
    (`start`, `end` epoch seconds).

    Raises:
      RuntimeError: Prometheus refused the query (its error), or `url` answered something else.
      httpx.HTTPError: `url` is not reachable.
    """
    answer = httpx.get(f"{url.rstrip('/')}/api/v1/query_range", timeout=30,
                       params={"query": expr, "start": start, "end": end, "step": step_s})
    try:
        body = answer.json()
    except ValueError:
        raise RuntimeError(f"{url}: no Prometheus API there (HTTP {answer.status_code})") from None
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr}: {body.get('error')}")
    return body["data"]["result"]


def panels(dashboard: dict) -> list[dict]:
    """The panels drawn as axes: every panel but the rows (drawn as headings)."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def fetch(dashboard: dict, variables: dict[str, str], start: float, end: float, query, scrape_interval_s: int = 15,
          ) -> dict[int, list[Series]]:
    """Every panel's series by panel id over [`start`, `end`] (epoch seconds), from `query(expr, start, end,
    step_s)` (`query_range` bound to a URL), each expr with `variables` and Grafana's built-ins substituted.

    The step is the window over MAX_POINTS, at least `scrape_interval_s` (seconds; Grafana's default 15). A target
    marked `"instant": true` keeps only the series with a sample at the last step (a series gone stale before it
    is dropped), and only that sample: an instant query at the window's end, as Grafana runs it.

    Raises:
      ValueError: a variable of an expr has no value. What `query` raises.
    """
    window = max(1, round(end - start))
    step = max(scrape_interval_s, math.ceil(window / MAX_POINTS))
    values = {**grafana_builtins(window, step, scrape_interval_s), **variables}
    found = {}
    for panel in panels(dashboard):
        found[panel["id"]] = []
        for target in panel.get("targets", []):
            result = query(substitute(target["expr"], values), start, end, step)
            series = [Series(legend(target.get("legendFormat", ""), r["metric"]),
                             [float(t) for t, _ in r["values"]], [float(v) for _, v in r["values"]]) for r in result]
            if target.get("instant"):
                last = start + (end - start) // step * step  # the range query's last evaluation
                series = [Series(s.name, s.t[-1:], s.v[-1:]) for s in series if abs(s.t[-1] - last) < step / 2]
            found[panel["id"]] += series
    return found


def _value(v: float, unit: str | None) -> str:
    if unit == "percentunit":
        return f"{100 * v:.1f}%"
    text = f"{v:.0f}" if math.isfinite(v) and (v == int(v) or abs(v) >= 100) else f"{v:.3g}"
    return text + {"s": " s", "ops": " ops/s"}.get(unit, "")


def _stat(ax, panel: dict, series: list[Series], unit: str | None) -> None:
    mode = panel.get("options", {}).get("textMode", "auto")
    last = [(s.name, next(v for v in reversed(s.v) if math.isfinite(v)))
            for s in series if any(math.isfinite(v) for v in s.v)]  # reduceOptions lastNotNull
    for i, (name, v) in enumerate(last):
        x = (i + 0.5) / len(last)  # side by side, as Grafana lays out a wide stat panel's values
        if mode == "name":
            ax.text(x, 0.45, name, ha="center", va="center", fontsize=24, transform=ax.transAxes)
            continue
        if mode == "value_and_name" or (mode == "auto" and len(last) > 1):
            ax.text(x, 0.78, name, ha="center", va="center", fontsize=10, transform=ax.transAxes)
        ax.text(x, 0.38, _value(v, unit), ha="center", va="center", fontsize=26 if len(last) == 1 else 20,
                color="tab:green", transform=ax.transAxes)


def _right_axis(panel: dict) -> set[str]:
    """The series names an override puts on a right-hand axis (`custom.axisPlacement: right`, matched by name)."""
    return {o["matcher"]["options"] for o in panel.get("fieldConfig", {}).get("overrides", [])
            if o["matcher"]["id"] == "byName"
            and {"id": "custom.axisPlacement", "value": "right"} in o.get("properties", [])}


def _timeseries(ax, panel: dict, series: list[Series], unit: str | None, start: float, end: float) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    when = lambda ts: [datetime.fromtimestamp(t, timezone.utc) for t in ts]  # noqa: E731
    right, twin = _right_axis(panel), None
    if custom.get("stacking", {}).get("mode") == "normal" and series:
        grid = sorted({t for s in series for t in s.t})  # a series missing at a step stacks as 0, as in Grafana
        ys = [[dict(zip(s.t, s.v)).get(t, 0.0) for t in grid] for s in series]
        ax.stackplot(when(grid), ys, labels=[s.name for s in series], alpha=custom.get("fillOpacity", 40) / 100)
    for i, s in enumerate(() if custom.get("stacking", {}).get("mode") == "normal" else series):
        if s.name in right:
            twin = twin or ax.twinx()
            twin.tick_params(labelsize=7)
        (twin if s.name in right else ax).plot(when(s.t), s.v, color=f"C{i}", lw=1.4, label=s.name)
    ax.set_xlim(*when([start, end]))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit in ("s", "ops"):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _value(v, unit)))
    handles = [h for a in (ax, twin) if a for h in a.get_legend_handles_labels()[0]]
    if handles:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.4 * (high - low))  # headroom: the legend above the lines, not on them
        ax.legend(handles=handles, loc="upper left", fontsize=7, ncols=min(len(handles), 4))


def figure(dashboard: dict, data: dict[int, list[Series]], variables: dict[str, str], start: float, end: float,
           subtitle: str = ""):
    """The matplotlib figure of the dashboard: each panel an axes (label `panel <id>`) at its gridPos (24 columns
    of COLUMN_IN inches, rows of ROW_IN), titled with its title; each row its title in bold across the page. A
    panel with no finite sample reads "No data", as in Grafana. `data` as `fetch` returns it."""
    import matplotlib

    matplotlib.use("Agg")  # (files only)
    import matplotlib.pyplot as plt

    head = 0.85  # inches above the grid for the figure's title (three lines)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    width, height = 24 * COLUMN_IN, rows * ROW_IN + head
    fig = plt.figure(figsize=(width, height))
    fig.suptitle(f"{TITLE}\n{subtitle}", fontsize=11, y=1 - 0.08 / height, va="top")
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        top = head + g["y"] * ROW_IN  # inches from the figure's top
        if panel["type"] == "row":
            fig.text(0.01, 1 - (top + 0.7 * ROW_IN) / height, substitute(panel["title"], variables),
                     fontsize=11, weight="bold")
            continue
        # Inside the cell: room for the title above, the ticks below and at the left.
        left, right, below, above = 0.55, 0.15, 0.3, 0.3
        ax = fig.add_axes(((g["x"] * COLUMN_IN + left) / width, 1 - (top + g["h"] * ROW_IN - below) / height,
                           (g["w"] * COLUMN_IN - left - right) / width, (g["h"] * ROW_IN - below - above) / height),
                          label=f"panel {panel['id']}")
        ax.set_title(panel["title"], loc="left", fontsize=10)
        ax.tick_params(labelsize=7)
        series = data.get(panel["id"], [])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not any(math.isfinite(v) for s in series for v in s.v):
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="grey", transform=ax.transAxes)
        if panel["type"] == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            _stat(ax, panel, series, unit)
        else:
            _timeseries(ax, panel, series, unit, start, end)
    return fig


def picture(url: str, out: Path, variables: dict[str, str], start: float, end: float, scrape_interval_s: int = 15,
            dashboard_path: Path = DASHBOARD, note: str = "") -> dict[str, tuple[int, int]]:
    """Draws the dashboard at `dashboard_path` from the Prometheus at `url` over [`start`, `end`] (epoch seconds)
    into the PNG `out`, `note` (what was scraped) a line under the title; returns `{panel title: (series, finite
    samples)}` for each axes of the figure that draws a panel.

    Raises:
      ValueError, RuntimeError, httpx.HTTPError: as `fetch` and `query_range`; ValueError also for a dashboard
        that is no JSON. OSError: `out` cannot be written.
    """
    dashboard = json.loads(Path(dashboard_path).read_text())
    data = fetch(dashboard, variables, start, end, functools.partial(query_range, url), scrape_interval_s)
    stamp = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    shown = ", ".join(f"{k} {'All' if v == '.*' else v}" for k, v in variables.items())  # (no $: mathtext)
    subtitle = f"{shown}; {stamp(start)} to {stamp(end)} UTC" + (f"\n{note}" if note else "")
    fig = figure(dashboard, data, variables, start, end, subtitle)
    by_id = {f"panel {p['id']}": p for p in panels(dashboard)}
    try:
        fig.savefig(out, format="png", dpi=80)
        drawn = [by_id[a.get_label()] for a in fig.axes if a.get_label() in by_id]  # (read back from the figure)
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)
    return {p["title"]: (len(data[p["id"]]), sum(math.isfinite(v) for s in data[p["id"]] for v in s.v))
            for p in drawn}


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.dashboard_picture`: draws the dashboard for one job over the last minutes; 0 when drawn,
    1 with one line on stderr when not (Prometheus unreachable or refusing, the file not writable), 2 for bad
    arguments (argparse's message)."""
    parser = argparse.ArgumentParser(prog="python -m tools.dashboard_picture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="the Prometheus's URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--job", required=True,
                        help="the dashboard's $job: the job label of the controller's scrape (the job's name)")
    parser.add_argument("--namespace", help="the dashboard's $namespace (default: All, which also matches none)")
    parser.add_argument("--minutes", type=float, default=15, help="the window: the last MINUTES up to now (15)")
    parser.add_argument("--scrape-interval", type=int, default=15,
                        help="the Prometheus's scrape interval in seconds, for $__rate_interval (15)")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the dashboard JSON (the chart's)")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"), help="the PNG to write (dashboard.png)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.scrape_interval <= 0:
        parser.error("--minutes and --scrape-interval: must be > 0")
    end = time.time()
    try:
        if args.namespace is None:  # All: the variable's allValue
            dashboard = json.loads(args.dashboard.read_text())
            args.namespace = next(v for v in dashboard["templating"]["list"] if v["name"] == "namespace")["allValue"]
        drawn = picture(args.prometheus, args.out, {"namespace": args.namespace, "job": args.job},
                        end - 60 * args.minutes, end, args.scrape_interval, args.dashboard)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        print(f"dashboard_picture: {args.prometheus}: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError, OSError) as e:
        print(f"dashboard_picture: {e}", file=sys.stderr)
        return 1
    empty = [title for title, (_, finite) in drawn.items() if not finite]
    print(f"{args.out}: {len(drawn)} panels" + (f"; no data: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
