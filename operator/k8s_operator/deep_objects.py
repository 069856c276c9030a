"""Lets the operator process read every object the API server accepts, however deeply it nests.

The API server stores JSON nested up to 10000 levels (`nesting.API_SERVER_MAX_DEPTH`; Go's encoding/json
scanner bound, kept by sigs.k8s.io/json). kopf's watch decodes each event with `json.loads` and copies and
compares the body (`copy.deepcopy`, `==`) with Python's default recursion limit of 1000 frames: a
2.4 KB job whose trainer config nested a list 1000 deep raised RecursionError in the watcher, and
the whole operator exited, at every restart. The model then refuses such a job (`nesting`), on that job
alone.

Measured here (Python 3.11.7, the simulation of kopf's path on a 10000-level body: decode, Body, diff-base
build, diff, `==`, repr, dumps, deepcopy): it needs a recursion limit between 20000 and 25000 (deepcopy takes
two frames a level), and 2 MiB of C stack (1 MiB crashed with SIGSEGV); `json.loads` alone survived 50000
levels on an 8 MiB stack. So: a limit of 50000 (2x what the deepest stored object needs) and 64 MiB stacks
(for the main thread, the soft RLIMIT_STACK, which the kernel checks as the stack grows; for every thread
started afterwards, `threading.stack_size`): address space reserved, touched only as deep as used.
"""

from __future__ import annotations

import resource
import sys
import threading

RECURSION_LIMIT = 50_000
STACK_BYTES = 64 << 20


def prepare() -> list[str]:
    """Raises this process's recursion limit to `RECURSION_LIMIT` and its stacks to `STACK_BYTES`.

    Call once, before kopf starts its threads. Never lowers a setting that is already higher.

    Returns:
      the settings it could not make, one line each (e.g. a hard RLIMIT_STACK below `STACK_BYTES`), for a log line.
    """
    problems: list[str] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))
    if threading.stack_size() < STACK_BYTES:
        threading.stack_size(STACK_BYTES)
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft != resource.RLIM_INFINITY and soft < STACK_BYTES:
        wanted = STACK_BYTES if hard == resource.RLIM_INFINITY else min(hard, STACK_BYTES)
        resource.setrlimit(resource.RLIMIT_STACK, (wanted, hard))
        if wanted < STACK_BYTES:
            problems.append(f"main thread stack limited to {wanted} bytes (hard RLIMIT_STACK); "
                            f"objects nested thousands of levels deep may crash the operator")
    return problems
