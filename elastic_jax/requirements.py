"""The requirements of a ``pyproject.toml`` optional-dependency group, one per line.

images/Dockerfile installs an image's dependencies in a layer of their own, before
the project's code is copied in, so a change to our code reinstalls only the
project. That layer has ``pyproject.toml`` and this file and nothing else, so
this file runs on the standard library alone::

    python3 requirements.py pyproject.toml controller[,tpu...]

prints the project's ``dependencies`` plus each group's, with a self-reference
such as ``elastic-jax[controller]`` (the ``tpu`` group) expanded in place.
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The base dependencies plus those of ``extras``, self-references expanded, order kept.

    Raises:
        KeyError: an extra that ``pyproject`` does not define (its name in the message).
    """
    project = pyproject["project"]
    groups = project.get("optional-dependencies", {})
    self_prefix = project["name"] + "["
    out = list(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in groups:
            raise KeyError(f"pyproject.toml has no optional-dependency group {extra!r}")
        seen.add(extra)
        for req in groups[extra]:
            if req.startswith(self_prefix):
                todo.extend(req[len(self_prefix):].rstrip("]").split(","))
            elif req not in out:
                out.append(req)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 requirements.py PYPROJECT EXTRA[,EXTRA...]", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        print("\n".join(requirements(tomllib.load(f), [e for e in argv[1].split(",") if e])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
