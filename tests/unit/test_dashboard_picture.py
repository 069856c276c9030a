"""tools/dashboard_picture.py's own logic on fixed query results (no Prometheus): variables substituted as Grafana
does, legend names, an instant target's last sample only, and each panel drawn at its gridPos. Against a real
Prometheus it runs at the end of tests/integration/test_dashboard_prometheus.py."""

from __future__ import annotations

import math

import pytest

from tests.support import dashboard as dash
from tools import dashboard_picture as pic

START, END = 1_000_000.0, 1_000_600.0  # a 10-minute window (epoch seconds)


def test_variables_and_grafana_builtins_are_substituted():
    values = {**pic.grafana_builtins(600, 2, 15), "job": "cpu-job", "namespace": ".*"}
    assert pic.substitute('rate(x{job="$job", namespace=~"${namespace}"}[$__rate_interval]) / $__range',
                          values) == 'rate(x{job="cpu-job", namespace=~".*"}[60s]) / 600s'
    assert pic.grafana_builtins(600, 20, 1)["__rate_interval"] == "21s"  # step + scrape when above 4 scrapes
    with pytest.raises(ValueError, match=r"\$cluster"):
        pic.substitute('x{cluster="$cluster"}', values)


def test_legend_names_a_series_as_grafana_does():
    assert pic.legend("{{cause}} ({{ job }})", {"cause": "slice_down", "job": "j"}) == "slice_down (j)"
    assert pic.legend("", {"__name__": "up", "job": "j", "a": "1"}) == 'up{a="1", job="j"}'


def _fake_prometheus(asked: list):
    """A query function answering every expr with one series per `by (label)` value seen in a run: the phase
    gauge Starting early and Running later; everything else a ramp, NaN for the failure-notify quantiles."""
    def query(expr, start, end, step):
        asked.append((expr, step))
        ts = [start + i * step for i in range(int((end - start) // step) + 1)]
        if "elastic_jax_phase" in expr:
            return [{"metric": {"phase": "Starting"}, "values": [[t, "1"] for t in ts[:10]]},
                    {"metric": {"phase": "Running"}, "values": [[t, "1"] for t in ts[10:]]}]
        if "failure_notify" in expr:
            return [{"metric": {}, "values": [[t, "NaN"] for t in ts]}]
        return [{"metric": {"cause": "slice_down", "category": "productive", "result": "ok"},
                 "values": [[t, str(i)] for i, t in enumerate(ts)]}]
    return query


def test_every_target_is_queried_substituted_and_an_instant_one_keeps_its_last_sample_only():
    dashboard, asked = dash.load(), []
    data = pic.fetch(dashboard, {"namespace": ".*", "job": "cpu-job"}, START, END, _fake_prometheus(asked),
                     scrape_interval_s=1)
    assert len(asked) == sum(len(p.get("targets", [])) for p in dashboard["panels"])
    assert not [expr for expr, _ in asked if "$" in expr]
    assert {step for _, step in asked} == {2}  # 600 s over at most 300 samples
    phase = next(p["id"] for p in dashboard["panels"] if p["title"] == "Phase")
    # Over a range the panel would show every phase the job passed through (Grafana's stat does: "Running
    # Starting" in the first picture); as an instant query, the phase now.
    assert [(s.name, s.t, s.v) for s in data[phase]] == [("Running", [END], [1.0])]


def test_each_panel_is_one_axes_at_its_grid_place():
    dashboard = dash.load()
    data = pic.fetch(dashboard, {"namespace": ".*", "job": "cpu-job"}, START, END, _fake_prometheus([]), 1)
    fig = pic.figure(dashboard, data, {"namespace": ".*", "job": "cpu-job"}, START, END)
    try:
        axes = {a.get_label(): a for a in fig.axes if a.get_label().startswith("panel ")}
        by_title = {p["title"]: axes[f"panel {p['id']}"] for p in pic.panels(dashboard)}
        assert len(axes) == len(pic.panels(dashboard)) == len(by_title)
        box = {title: ax.get_position() for title, ax in by_title.items()}
        # Phase (x 0, y 1) left of Step (x 6) on one row; above Step and tokens/s (y 6); Goodput categories
        # (w 24) spans the page; the operator's row (y 35) below everything of the job's.
        assert box["Phase"].x1 < box["Step"].x0 and math.isclose(box["Phase"].y0, box["Step"].y0)
        assert box["Phase"].y0 > box["Step and tokens/s"].y1
        assert box["Goodput categories"].width > 0.9 and box["Goodput categories"].width > 2.5 * box["Steps lost"].width
        assert max(b.y0 for t, b in box.items() if t in ("Replacements", "Reconciles by result")) < min(
            b.y0 for t, b in box.items() if t == "Goodput categories")
        assert [ax.get_title(loc="left") for ax in by_title.values()] == list(by_title)
        texts = lambda ax: [t.get_text() for t in ax.texts]  # noqa: E731
        assert texts(by_title["Phase"]) == ["Running"]  # textMode name
        assert texts(by_title["Goodput"]) == ["goodput", "30000.0%"]  # value_and_name; percentunit
        assert "No data" in texts(by_title["Failure -> controller notified"])  # NaN only
        twins = [a for a in fig.axes if a.bbox.bounds == by_title["Step and tokens/s"].bbox.bounds
                 and a is not by_title["Step and tokens/s"]]
        assert [line.get_label() for line in twins[0].lines] == ["tokens/s"]  # the override's right axis
        assert {t.get_text() for t in fig.texts} >= {"Job cpu-job (the controller's /metrics)",
                                                     "Operator (all jobs of the release)"}
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_the_command_refuses_in_one_line(tmp_path, capsys):
    from elastic_jax.local.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert pic.main(["--prometheus", url, "--job", "j", "--out", str(tmp_path / "d.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dashboard_picture: {url}: ") and err.count("\n") == 1
    assert not (tmp_path / "d.png").exists()
    # an address no host can have (a trial: httpx.InvalidURL is no HTTPError, and came out as a traceback)
    assert pic.main(["--prometheus", "http://256.1.1.1:9090", "--job", "j", "--out", str(tmp_path / "d.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dashboard_picture: http://256.1.1.1:9090: ") and err.count("\n") == 1
    with pytest.raises(SystemExit) as bad:
        pic.main(["--prometheus", url, "--job", "j", "--minutes", "0"])
    assert bad.value.code == 2 and "--minutes" in capsys.readouterr().err
