"""Start the kind tier's Docker engine and image builds while the rest of the suite runs.

On a fresh machine the kind tier's first test pays for installing Docker from
Debian, the mmdebstrap Python base (~95 s), the three project images (~5 min,
mostly pip downloads), the MaxText controller image (~7 min, 3 GiB) and the node image's two Debian root file systems
(~5 min): network and disk work, which overlaps well with the CPU-bound Go
build (:mod:`e2e.harness.background_build`) and with ``tests/``. None of it
needs a Go binary (the node image itself does, and is built later by the
``kind_cluster`` fixture).

:class:`Prewarm` runs these steps in a thread from the end of collection. The
``docker_engine`` fixture takes its engine once the steps the cluster needs are
done (engine, base, project images, node root file systems; the steps are
cached by tag and layer cache, so the fixtures' own calls then return in
seconds). The MaxText image, the longest step (~4 min on a warm cache, the
whole venv re-copied each commit), is the last one and goes on in the
thread after the hand-over: the cluster's tests start meanwhile, and only the
``maxtext_image`` fixture waits for it (:meth:`Prewarm.wait_done`). If no kind
test ever ran, the session's end stops the engine. A failed step is raised
again by the fixture that needs it, with its own message.

An interrupted session (Ctrl-C, SIGTERM) does not wait for the builds: the
engine is stopped by its PID at once (known from the moment dockerd is
spawned, before it answers), which ends the step in flight, and no further
step starts. An interpreter that exits without the session's end (a second
Ctrl-C during it) stops it from an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import threading
import time
from pathlib import Path

from e2e.kind import engine as engine_mod
from e2e.kind import images
from e2e.kind.nodeimage import build as nodeimage


JOIN_AFTER_STOP_S = 60.0
"""After an interrupt stopped the engine, how long close() waits for the step in flight to fail (seconds)."""


class Cancelled(RuntimeError):
    """The session was interrupted: the prewarm stopped before its next step."""


class Prewarm:
    """Engine start, Python base, project images and node root file systems, in a thread.

    Args:
      log_path: where progress lines go (not the terminal: tests write there meanwhile).
    """

    def __init__(self, log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.engine: engine_mod.Engine | None = None
        self.error: BaseException | None = None
        self.taken = False
        self.seconds: float | None = None  # the whole prewarm's, once it ended
        self.handover_seconds: float | None = None  # until the engine was ready for the cluster
        self._lock = threading.Lock()
        self._spawned: engine_mod.Engine | None = None  # dockerd, from its spawn on (it may not answer yet)
        self._cancel = threading.Event()
        self._handover = threading.Event()  # set once the cluster's steps are done (or the thread ended)
        atexit.register(self._abandon)
        self._thread = threading.Thread(target=self._run, name="kind-prewarm", daemon=True)
        self._thread.start()

    @property
    def spawned_pid(self) -> int | None:
        """dockerd's PID once spawned (None before, or when the engine start failed first)."""
        return self._spawned.pid if self._spawned is not None else None

    def _on_spawn(self, engine: engine_mod.Engine) -> None:
        with self._lock:
            self._spawned = engine
            cancelled = self._cancel.is_set()
        if cancelled:  # interrupted while the engine was being installed or spawned
            engine_mod.stop(engine, log=self._log)
            raise Cancelled("kind prewarm: interrupted while starting the engine; stopped")

    def _step(self) -> None:
        if self._cancel.is_set():
            raise Cancelled("kind prewarm: interrupted; no further step")

    def _log(self, message: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {message}\n")

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self.engine = engine_mod.start(log=self._log, on_spawn=self._on_spawn)
            self._step()
            base = images.python_base(self.engine, log=self._log)
            self._step()
            images.build_project_images(self.engine, base.name, log=self._log)
            self._step()
            nodeimage.rootfs_image(self.engine, "node", "minbase", nodeimage.NODE_PACKAGES, self._log)
            self._step()
            nodeimage.rootfs_image(self.engine, "component", "essential", nodeimage.COMPONENT_PACKAGES, self._log)
            self.handover_seconds = time.monotonic() - t0
            self._log(f"engine ready for the cluster in {self.handover_seconds:.0f}s; the MaxText image goes on")
            self._handover.set()
            self._step()
            python312 = images.find_python312()
            if python312 is not None:  # else the maxtext_image fixture skips its tests, saying why
                images.build_maxtext_image(self.engine, python312, log=self._log)
        except BaseException as e:  # re-raised in the test session by take()
            self.error = e
            self._log(f"prewarm failed: {e!r}")
        self.seconds = time.monotonic() - t0
        if self.handover_seconds is None:  # failed or cancelled before the hand-over: the taker gets it now
            self.handover_seconds = self.seconds
        self._log(f"prewarm done in {self.seconds:.0f}s")
        self._handover.set()

    def take(self) -> engine_mod.Engine:
        """Wait for the steps the cluster needs (not the MaxText image); hand over the engine (the caller stops
        it from then on; the MaxText step may still run in it until :meth:`close`).

        Raises:
          EngineUnavailable, RuntimeError, subprocess.CalledProcessError: what the engine
            start raised (no engine then). A failed image step is not raised here: the
            fixture that builds that image runs it again and raises with its own output.
        """
        self._handover.wait()
        with self._lock:
            self.taken = True
        if self.engine is None:
            self._thread.join()  # the engine start failed: the thread is ending with its error
            raise self.error if self.error else RuntimeError("kind prewarm: no engine and no error")
        return self.engine

    def wait_done(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to end: every step, the MaxText image included (the ``maxtext_image`` fixture,
        before its own cached build call), or, after the taker stopped the engine, the step in flight failing
        (``timeout_s`` bounds that wait)."""
        self._thread.join(timeout_s)

    def cancel(self) -> None:
        """Start no further step (the taker, before it stops the engine: that ends the step in flight)."""
        self._cancel.set()

    def close(self, interrupted: bool = False) -> None:
        """At the session's end: stop the engine if no fixture took it.

        Args:
          interrupted: the session was interrupted: stop the engine by its PID now (whether it
            answers yet or not) instead of waiting for the builds, and start no further step
            (a taken engine is its taker's to stop: that ends the step in flight).
            Otherwise the builds finish first (they fill the layer cache for the next run).
        """
        atexit.unregister(self._abandon)
        if interrupted:
            self._abandon()
            return
        try:
            self._thread.join()
        except BaseException:  # a Ctrl-C or SIGTERM (tests/support/sigterm.py) while the builds finish
            self._abandon()  # (it once left the engine running: a session ended by `timeout` in this wait)
            raise
        if self.engine is not None and not self.taken:
            engine_mod.stop(self.engine, log=self._log)

    def _abandon(self) -> None:
        """Cancel the steps and stop a spawned engine no fixture took; idempotent (also the atexit hook)."""
        with self._lock:
            self._cancel.set()
            engine = None if self.taken else self._spawned
        if engine is not None:
            self._log(f"interrupted: stopping dockerd {engine.pid}")
            engine_mod.stop(engine, log=self._log)
        if engine is not None or not self.taken:
            # A taken engine still runs (its taker stops it later): a MaxText build in flight would not
            # end within the bound, so there is nothing to wait for here.
            self._thread.join(JOIN_AFTER_STOP_S)
