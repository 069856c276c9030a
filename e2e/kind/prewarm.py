"""Start the kind tier's Docker engine and image builds while the rest of the suite runs.

On a fresh machine the kind tier's first test pays for installing Docker from
Debian, the mmdebstrap Python base (~95 s), the three project images (~5 min,
mostly pip downloads) and the node image's two Debian root file systems
(~5 min): network and disk work, which overlaps well with the CPU-bound Go
build (:mod:`e2e.harness.background_build`) and with ``tests/``. None of it
needs a Go binary (the node image itself does, and is built later by the
``kind_cluster`` fixture).

:class:`Prewarm` runs these steps in a thread from the end of collection. The
``docker_engine`` fixture takes its engine (the steps are cached by tag and
layer cache, so the fixtures' own calls then return in seconds); if no kind
test ever ran, the session's end stops the engine. A failed step is raised
again by the fixture that needs it, with its own message.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from e2e.kind import engine as engine_mod
from e2e.kind import images
from e2e.kind.nodeimage import build as nodeimage


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
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="kind-prewarm", daemon=True)
        self._thread.start()

    def _log(self, message: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {message}\n")

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self.engine = engine_mod.start(log=self._log)
            base = images.python_base(self.engine, log=self._log)
            images.build_project_images(self.engine, base.name, log=self._log)
            nodeimage.rootfs_image(self.engine, "node", "minbase", nodeimage.NODE_PACKAGES, self._log)
            nodeimage.rootfs_image(self.engine, "component", "essential", nodeimage.COMPONENT_PACKAGES, self._log)
        except BaseException as e:  # re-raised in the test session by take()
            self.error = e
            self._log(f"prewarm failed: {e!r}")
        self.seconds = time.monotonic() - t0
        self._log(f"prewarm done in {self.seconds:.0f}s")

    def take(self) -> engine_mod.Engine:
        """Wait for the thread; hand over its engine (the caller stops it from then on).

        Raises:
          EngineUnavailable, RuntimeError, subprocess.CalledProcessError: what the engine
            start raised (no engine then). A failed image step is not raised here: the
            fixture that builds that image runs it again and raises with its own output.
        """
        self._thread.join()
        self.taken = True
        if self.engine is None:
            raise self.error if self.error else RuntimeError("kind prewarm: no engine and no error")
        return self.engine

    def close(self) -> None:
        """At the session's end: stop the engine if no fixture took it."""
        self._thread.join()
        if self.engine is not None and not self.taken:
            engine_mod.stop(self.engine, log=self._log)
