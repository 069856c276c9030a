"""Run a program that does not import elastic_jax (MaxText) under the job's runtime.

``python -m elastic_jax.run_module MODULE [ARG ...]`` starts the control API
(`elastic_jax.connect()`: probes, the operator's slice reports, `/metrics`,
`POST /v1/stop`) and then runs ``MODULE`` as ``python -m MODULE ARG ...``
would, in this process. MaxText's trainer
(``maxtext.trainers.pre_train.train``) is the program this is for: it has
its own loop, elastic retry and checkpoints, and never calls ``connect()``
itself, so without this the controller pod's probes would never pass. On
the pathways backend its elastic manager is then fed by the operator's slice
reports (`maxtext_plug`).
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from typing import Sequence

from elastic_jax import maxtext_plug
from elastic_jax.exit_codes import ControllerExit

USAGE = "usage: python -m elastic_jax.run_module MODULE [ARG ...]   (spec.controller.args)"


def main(argv: Sequence[str] | None = None) -> int:
    """Connects the runtime, runs `argv[0]` as `__main__` with `argv[1:]`, closes the runtime.

    Args:
      argv: the module name and its arguments (default `sys.argv[1:]`).

    Returns:
      The module's exit code: 0 when it returns, the code of its `SystemExit`
      otherwise (absl's `app.run` exits through one); 2 (bad input) for a
      missing or unknown module or a runtime that cannot start, with the reason
      on stderr and nothing started.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(f"elastic_jax.run_module: no module given. {USAGE}", file=sys.stderr)
        return ControllerExit.BAD_INPUT
    module = argv[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        # Checked before the control API starts: a typo ends the job as bad input, not as a crash loop.
        print(f"elastic_jax.run_module: module {module!r} (spec.controller.args[0]) is not installed "
              "in this image", file=sys.stderr)
        return ControllerExit.BAD_INPUT

    import elastic_jax

    try:
        runtime = elastic_jax.connect()
    except elastic_jax.RuntimeConfigError as e:
        print(f"elastic_jax.run_module: {e}", file=sys.stderr)
        return ControllerExit.BAD_INPUT
    code: int = ControllerExit.FAILED
    try:
        try:
            if maxtext_plug.plug(module, runtime.job.spec.backend, runtime.slice_set) is not None:
                print(f"elastic_jax.run_module: MaxText's elastic manager ({maxtext_plug.ELASTIC_UTILS}."
                      f"{maxtext_plug.MANAGER_GLOBAL}) takes the operator's slice reports", file=sys.stderr)
        except ImportError as e:
            # MaxText's own import of the same module fails the same way, with its traceback.
            print(f"elastic_jax.run_module: MaxText's elastic manager not plugged: {e}", file=sys.stderr)
        sys.argv = [module, *argv[1:]]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = ControllerExit.SUCCEEDED
        except SystemExit as e:
            code = _exit_code(e.code)
        return code
    finally:
        runtime.close(exit_code=code)  # the module's code is its outcome (it never calls report_step)


def _exit_code(code: object) -> int:
    """`SystemExit.code` as a process exit status (None is 0, a message is 1, as the interpreter does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
