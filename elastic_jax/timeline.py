"""The timeline picture of a local run: loss, steps per second and active slices over the run, recoveries marked.

Drawn from the controllers' own records, `<run folder>/history.jsonl` (`controller/run_history.py`: one line
per completed step and per elastic event, appended by every controller of the run), into
`<run folder>/timeline.png`. `elastic-jax run` draws it at the end of a run; `elastic-jax report DIR` draws it
again for an earlier one.

`timeline_data` (the series) is separate from `draw` (the picture), so tests check what is plotted, not pixels.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from elastic_jax.contract import RUN_FOLDER_MARKER as MARKER
from elastic_jax.contract import RUN_HISTORY_FILE as HISTORY_FILE

TIMELINE_FILE = "timeline.png"
RATE_WINDOW_STEPS = 5
"""Steps per second is measured over this many completed steps (one step's time is too noisy to read)."""


class TimelineError(ValueError):
    """The run folder holds nothing to draw; `str()` is the one-line message for the user."""


@dataclasses.dataclass
class Recovery:
    """One elastic event of the run: `t` seconds after the run's first record, at `at_step`, of `cause`
    (slice_down, hang, drain, scale_up, ...) on `slices`; `seconds` until the next completed step (None: the
    run ended before one)."""

    t: float
    at_step: int
    cause: str
    slices: list[int]
    seconds: float | None


@dataclasses.dataclass
class Pause:
    """The run paused waiting for slices (fewer healthy than its minimum): from `t` to `t_end` seconds after the
    run's first record (None: the run ended paused), at `at_step`, with `up` of `desired` slices healthy (the
    fewest while it lasted)."""

    t: float
    t_end: float | None
    at_step: int
    up: int
    desired: int


@dataclasses.dataclass
class TimelineData:
    """The plotted series, one entry per completed step, in the order the steps completed.

    Attributes:
      t: seconds since the run's first record (float): its first completed step (the start-up before it is
        not drawn).
      step: the completed step (int; lower than the one before after a controller loss's rewind).
      loss: the step's loss (float, None when the loop reported none).
      steps_per_second: completed steps per wall second over the last `RATE_WINDOW_STEPS` steps of the same
        controller (None for a controller's first step).
      active / desired: slices the step trained on / slices the job wants.
      recoveries: the elastic events (`Recovery`), oldest first; a slice found down while a recovery waited
        for slices (a history event that `joins`) is in that recovery's `slices`.
      controller_starts: `(t, step)` of each controller after the first one's first step (a lost controller's
        successor: its first completed step).
      controller_gaps: `(t_last, t_next, step)` of each such change: the lost controller's last completed step
        (`step`, at `t_last`) and its successor's first one (`t_next`): seconds without a training controller.
    """

    t: list[float]
    step: list[int]
    loss: list[float | None]
    steps_per_second: list[float | None]
    active: list[int]
    desired: list[int]
    recoveries: list[Recovery]
    controller_starts: list[tuple[float, int]]
    controller_gaps: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    pauses: list[Pause] = dataclasses.field(default_factory=list)
    """The pauses waiting for slices (`Pause`), oldest first: the active slices drawn are their `up` until the
    next step."""


def read_history(run_dir: str | Path) -> list[dict]:
    """The history lines of `run_dir` (dicts, file order); a torn last line (a controller killed mid-write) is
    skipped.

    Raises:
      TimelineError: `run_dir` is not a directory, or holds no history file or no step in it.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TimelineError(f"{run_dir}: not a directory (give the run's --workdir, e.g. runs/<job name>)")
    path = run_dir / HISTORY_FILE
    try:
        text = _read_own_file(path)
    except FileNotFoundError:
        if (run_dir / MARKER).is_file():
            raise TimelineError(_no_step_yet(run_dir)) from None
        raise TimelineError(f"{run_dir}: no {HISTORY_FILE} (not an `elastic-jax run` folder, or a run from before "
                            f"runs recorded their history)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TimelineError(f"{path}: a symbolic link, not the run's own file: not read") from None
        raise TimelineError(f"{path}: cannot be read ({e.strerror})") from None
    lines = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if _well_formed(record):
            lines.append(record)
    if not any(r["kind"] == "step" for r in lines):
        if (run_dir / MARKER).is_file():
            raise TimelineError(_no_step_yet(run_dir))
        raise TimelineError(f"{path}: no completed step recorded: nothing to draw")
    return lines


def _read_own_file(path: Path) -> str:
    """The text of a file the run wrote, never through a symbolic link planted at its name (the run writes its
    files so too: `local/processes.py`) and never anything but a regular file; bytes that are not UTF-8 (a
    damaged file) become U+FFFD, so their line fails to parse and is skipped as a torn one is.

    Raises:
      FileNotFoundError: no file at `path`.
      OSError: it cannot be opened (`ELOOP`: a symbolic link; `EINVAL`: not a regular file).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return f.read().decode("utf-8", errors="replace")


def _no_step_yet(run_dir: Path) -> str:
    """What a run folder (its marker is there) without a completed step is, in one line: its run completed no
    step (stopped or still starting: building the trainer, compiling the first step), with the
    run's failure reason from `summary.json` when it ended with one, and where its logs are."""
    why = ""
    try:
        reason = json.loads(_read_own_file(run_dir / "summary.json")).get("failure_reason")
        why = f" (it ended: {reason})" if isinstance(reason, str) and reason else ""
    except (OSError, ValueError, AttributeError):
        pass
    # ("a step", not "step 1": a run that resumed at step 1036 never trains step 1; a trial read it so)
    return (f"{run_dir}: an `elastic-jax run` folder whose run completed no step{why}: nothing to draw; "
            f"its logs: {run_dir / 'controller.log'}, {run_dir}/worker-*.log")


_NUMBER = (int, float)
# What `timeline_data` reads of each kind of line, and the types it needs (a bool is no number here).
_FIELDS = {"step": {"t": _NUMBER, "pid": int, "step": int, "active": int, "desired": int},
           "event": {"t": _NUMBER, "at_step": int, "cause": str},
           "wait": {"t": _NUMBER, "blocked": bool, "up": int, "at_step": int, "desired": int}}


def _well_formed(record: object) -> bool:
    """Whether a history line has the fields `timeline_data` reads, of the right types (others are skipped, as
    a torn line is: the file is the runs' own, but a hand-edited or foreign one must not stop `report`)."""
    if not isinstance(record, dict):
        return False
    fields = _FIELDS.get(record.get("kind"))  # type: ignore[arg-type]
    return fields is not None and all(
        isinstance(record.get(name), types) and (types is bool or not isinstance(record.get(name), bool))
        for name, types in fields.items())


def timeline_data(records: list[dict]) -> TimelineData:
    """The series `draw` plots from `read_history`'s records.

    Raises:
      TimelineError: no step record.
    """
    steps = [r for r in records if r["kind"] == "step"]
    if not steps:
        raise TimelineError("no completed step recorded: nothing to draw")
    t0 = min(r["t"] for r in records)
    data = TimelineData([], [], [], [], [], [], [], [])
    seen_pids: list[int] = []
    window: list[tuple[float, int]] = []  # (t, step) of this controller's last steps
    for r in steps:
        if r["pid"] not in seen_pids:
            if seen_pids:
                data.controller_starts.append((r["t"] - t0, r["step"]))
                data.controller_gaps.append((data.t[-1], r["t"] - t0, data.step[-1]))
            seen_pids.append(r["pid"])
            window = []
        window = (window + [(r["t"], r["step"])])[-(RATE_WINDOW_STEPS + 1):]
        (t_a, s_a), (t_b, s_b) = window[0], window[-1]
        data.t.append(r["t"] - t0)
        data.step.append(r["step"])
        data.loss.append(r.get("loss"))
        data.steps_per_second.append((s_b - s_a) / (t_b - t_a) if len(window) > 1 and t_b > t_a else None)
        data.active.append(r["active"])
        data.desired.append(r["desired"])
    for e in (r for r in records if r["kind"] == "event"):
        slices = list(e.get("slices") or [])
        if e.get("joins") is True and data.recoveries:  # (more slices of the recovery before it)
            joined = data.recoveries[-1]
            joined.slices = sorted(set(joined.slices) | set(slices))
            continue
        after = next((s["t"] for s in steps if s["t"] >= e["t"]), None)
        data.recoveries.append(Recovery(t=e["t"] - t0, at_step=e["at_step"], cause=e["cause"],
                                        slices=slices,
                                        seconds=None if after is None else round(after - e["t"], 3)))
    for w in (r for r in records if r["kind"] == "wait"):
        if w["blocked"]:
            data.pauses.append(Pause(t=w["t"] - t0, t_end=None, at_step=w["at_step"], up=w["up"],
                                     desired=w["desired"]))
        elif data.pauses and data.pauses[-1].t_end is None:
            data.pauses[-1].t_end = w["t"] - t0
            data.pauses[-1].up = min(data.pauses[-1].up, w["up"])
    return data


def _with_pauses(series: tuple[list[float], ...], pauses: list[Pause]) -> tuple[list[float], ...]:
    """`_broken_at_controller_gaps`'s series with a point at each pause's start: no loss or rate (NaN) and its
    `up` slices active, drawn so until the next step (nothing trained while paused; the active slices dip to
    what was up, not the last step's count)."""
    nan = float("nan")
    t, loss, rate, active, desired = (list(x) for x in series)
    for p in pauses:
        i = next((k for k, when in enumerate(t) if when > p.t), len(t))
        t.insert(i, p.t), loss.insert(i, nan), rate.insert(i, nan), active.insert(i, p.up)
        desired.insert(i, p.desired)
    return t, loss, rate, active, desired


def _broken_at_controller_gaps(data: TimelineData) -> tuple[list[float], ...]:
    """`data`'s t, loss, steps per second, active and desired slices with one point added at each controller
    gap's end: no loss or rate there (NaN: the lines break instead of joining across the gap) and 0 active
    slices from the lost controller's last step (nothing trained until its successor's first step)."""
    nan = float("nan")
    starts = {i for i, (a, b) in enumerate(zip(data.t, data.t[1:]), 1)
              if any(a == g[0] and b == g[1] for g in data.controller_gaps)}
    t, loss, rate, active, desired = [], [], [], [], []
    for i, when in enumerate(data.t):
        if i in starts:  # (the gap: from the last step before it, drawn 0 active, until this first step)
            active[-1] = 0
            t.append(when), loss.append(nan), rate.append(nan), active.append(0), desired.append(data.desired[i - 1])
        t.append(when)
        loss.append(nan if data.loss[i] is None else data.loss[i])
        rate.append(nan if data.steps_per_second[i] is None else data.steps_per_second[i])
        active.append(data.active[i])
        desired.append(data.desired[i])
    return t, loss, rate, active, desired


def drawn_series(data: TimelineData) -> tuple[list[float], ...]:
    """What `draw` plots of `data`: (t, loss, steps per second, active, desired), one point per step plus a
    point at each controller gap's end and each pause's start (see `_broken_at_controller_gaps`, `_with_pauses`)."""
    return _with_pauses(_broken_at_controller_gaps(data), data.pauses)


def draw(run_dir: str | Path, title: str | None = None) -> Path:
    """Draws `<run_dir>/timeline.png` from `<run_dir>/history.jsonl`; returns its path.

    Three panels over wall seconds since the run's first record: loss; steps per second; active and
    desired slices. Each recovery is a red line across all three (its cause, slices and step written at the
    top; a scale-up in purple), its seconds until the next step shaded; a lost controller is a red dotted line
    at its last step, the seconds until its successor's first step shaded grey, with no line drawn across them
    and 0 active slices (nothing trained); the successor's first step is a grey dotted line. A pause waiting for
    slices (below the job's minimum) is shaded orange, the active slices dipping to those up while it lasted.

    Raises:
      TimelineError: nothing to draw (see `read_history`), or the picture cannot be written.
      ImportError: matplotlib is not installed (the `plot` extra).
    """
    run_dir = Path(run_dir)
    data = timeline_data(read_history(run_dir))
    import matplotlib

    matplotlib.use("Agg")  # (files only: no display on a training host)
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_rate, ax_slices) = plt.subplots(3, 1, sharex=True, figsize=(9, 6.5),
                                                      gridspec_kw={"height_ratios": [3, 2, 1.5]})
    t, loss, rate, active, desired = drawn_series(data)
    ax_loss.plot(t, loss, color="tab:blue", lw=1.2)
    ax_loss.set_ylabel("loss")
    ax_rate.plot(t, rate, color="tab:green", lw=1.2)
    ax_rate.set_ylabel("steps / s")
    ax_rate.set_ylim(bottom=0)
    ax_slices.step(t, desired, where="post", color="grey", ls="--", lw=1, label="desired")
    ax_slices.step(t, active, where="post", color="tab:orange", lw=1.8, label="active")
    ax_slices.set_ylabel("slices")
    ax_slices.set_ylim(0, max(data.desired + data.active) + 1.8)  # (headroom for the legend above the lines)
    ax_slices.yaxis.get_major_locator().set_params(integer=True)
    ax_slices.legend(loc="upper right", fontsize=8, ncols=2)
    ax_slices.set_xlabel("seconds since the run's first completed step")
    for i, r in enumerate(data.recoveries):
        color = "tab:purple" if r.cause == "scale_up" else "tab:red"  # (a rejoin is no failure)
        for ax in (ax_loss, ax_rate, ax_slices):
            ax.axvline(r.t, color=color, lw=1)
            if r.seconds:
                ax.axvspan(r.t, r.t + r.seconds, color=color, alpha=0.12)
        took = "unfinished" if r.seconds is None else f"{r.seconds:.2f} s"
        ax_loss.annotate(f"{r.cause} {r.slices} @ step {r.at_step} ({took})", xy=(r.t, 1), xycoords=("data", "axes fraction"),
                         xytext=(3, -12 - 11 * (i % 4)), textcoords="offset points", fontsize=8, color=color)
    for (t_last, t_next, lost_at), (_, step) in zip(data.controller_gaps, data.controller_starts):
        for ax in (ax_loss, ax_rate, ax_slices):
            ax.axvline(t_last, color="tab:red", ls=":", lw=1)
            ax.axvspan(t_last, t_next, color="grey", alpha=0.15)
            ax.axvline(t_next, color="grey", ls=":", lw=1)
        ax_rate.annotate(f"controller lost after step {lost_at}: {t_next - t_last:.0f} s until its successor's step "
                         f"{step}", xy=(t_last, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                         textcoords="offset points", fontsize=8, color="tab:red")
    for p in data.pauses:
        end = p.t_end if p.t_end is not None else t[-1]
        for ax in (ax_loss, ax_rate, ax_slices):
            ax.axvspan(p.t, end, color="tab:orange", alpha=0.15)
        ax_slices.annotate(f"paused: {p.up}/{p.desired} slices, {end - p.t:.1f} s", xy=(p.t, 0),
                           xycoords=("data", "axes fraction"), xytext=(3, 3), textcoords="offset points",
                           fontsize=8, color="tab:orange")
    losses = f", {len(data.controller_gaps)} controller loss(es)" if data.controller_gaps else ""
    losses += f", {len(data.pauses)} pause(s) waiting for slices" if data.pauses else ""
    fig.suptitle(f"{title or run_dir.name}: {data.step[-1]} steps, {len(data.recoveries)} elastic event(s){losses}")
    fig.tight_layout()
    out = run_dir / TIMELINE_FILE
    # Written to a new private file, then renamed over the old picture: a link planted at timeline.png is
    # replaced, never written through (as `summary.json` and `metrics.prom` are written).
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{TIMELINE_FILE}.", dir=run_dir)
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=80)
        if out.is_dir() and not out.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        os.replace(tmp, out)
        tmp = None
    except OSError as e:
        raise TimelineError(f"{out}: cannot be written ({e.strerror})") from None
    finally:
        plt.close(fig)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return out
