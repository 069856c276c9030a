"""Real text as a deterministic, random-access byte-level dataset (grain).

`text_examples` reads files (the interpreter's standard library, a local glob
or a `gs://` prefix), concatenates their bytes and cuts them into fixed-length
examples. `global_batches` shuffles, repeats and batches those examples with
grain's `MapDataset`, so global batch `i` is a pure function of
`(dataset, global_batch_size, seed, i)`: the data position the runtime
checkpoints is just the next batch index, whatever the slice count.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Iterator

import grain
import numpy as np

from elastic_jax.controller.trainer import TrainerConfigError

STDLIB_SOURCE = "stdlib"
GCS_SCHEME = "gs://"

# ASCII "file separator" control code: marks the seam between two files and
# does not occur in source or prose text, so the model can learn it as a
# document boundary.
FILE_SEPARATOR = 0x1C

# Git's binary-file heuristic (xdiff-interface.c, buffer_is_binary): a NUL byte
# within the first 8000 bytes. Text in any common encoding has none.
_BINARY_PROBE_BYTES = 8000

# Installed third-party packages may live inside the stdlib folder (pyenv,
# /usr/local builds); they are not the standard library and vary by machine.
_NOT_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def text_examples(source: str, seq_len: int, max_bytes: int, field: str) -> grain.MapDataset:
    """Byte-level language-modelling examples from real text.

    Files are read in sorted path (or object name) order until `max_bytes`
    bytes are read (the last file is cut short), joined with one
    `FILE_SEPARATOR` byte between files, and cut into windows of
    `seq_len + 1` bytes with stride `seq_len`: consecutive examples share one
    byte, so every byte-to-next-byte transition is a target exactly once.

    Args:
      source: `"stdlib"` (the `.py` files of the running interpreter's
        standard library, `sysconfig.get_paths()["stdlib"]`, without
        site-packages), a local glob (`**` recurses, e.g. `/data/**/*.txt`),
        or `gs://bucket/prefix` (every object whose name starts with prefix).
      seq_len: input length in bytes (tokens); >= 1.
      max_bytes: upper bound on bytes read, separators included; >= 1.
      field: manifest path of the `source` setting, used in error messages,
        e.g. `spec.controller.trainer.config.data`.

    Returns:
      A `grain.MapDataset` whose element `j` is
      `{"tokens": np.ndarray int32 [seq_len + 1]}` with values in [0, 256).

    Raises:
      TrainerConfigError: no file or object matches, the bucket cannot be
        read, a file read is binary (a NUL byte in its first 8000 bytes, the
        way git tells), or fewer than `seq_len + 1` bytes of text were found. The
        message is one line and starts with `field`.
    """
    if seq_len < 1 or max_bytes < 1:
        raise ValueError(f"seq_len and max_bytes must be >= 1, got {seq_len}, {max_bytes}")
    if source == STDLIB_SOURCE:
        chunks = _read_local(_stdlib_files(), max_bytes, field)
    elif source.startswith(GCS_SCHEME):
        chunks = _read_gcs(source, max_bytes, field)
    else:
        paths = sorted(p for p in glob.glob(source, recursive=True) if os.path.isfile(p))
        if not paths and os.path.isdir(source):
            raise TrainerConfigError(f"{field}: {source!r} is a directory; name its files with a glob, "
                                     f"e.g. '{source.rstrip('/')}/**/*.txt'")
        if not paths:
            raise TrainerConfigError(f"{field}: no files match {source!r}")
        chunks = _read_local(paths, max_bytes, field)

    text = _join(chunks, max_bytes)
    if text.size < seq_len + 1:
        raise TrainerConfigError(
            f"{field}: {text.size} bytes of text read from {source!r} (at most maxBytes = {max_bytes}), need at "
            f"least seqLen + 1 = {seq_len + 1}"
        )
    num_examples = (text.size - 1) // seq_len
    # A strided view, not a copy: rows are cast to int32 one example at a time.
    windows = np.lib.stride_tricks.sliding_window_view(text, seq_len + 1)[::seq_len][:num_examples]
    return grain.MapDataset.source(windows).map(_to_example)


def global_batches(dataset: grain.MapDataset, global_batch_size: int, seed: int) -> grain.MapDataset:
    """Shuffled, endlessly repeated global batches, addressable by index.

    Each epoch is a fresh seeded permutation of `dataset` (grain reseeds per
    epoch); batches run across epoch seams, so every batch is full.

    Args:
      dataset: a `grain.MapDataset` of dicts of fixed-shape numpy arrays.
      global_batch_size: examples per batch, >= 1.
      seed: shuffle seed; the same seed gives the same batch `i`.

    Returns:
      A `grain.MapDataset` (effectively infinite length) whose element `i` is
      the dict of the examples' arrays stacked on a new leading axis of size
      `global_batch_size`. Reading `result[i]` is deterministic and
      independent of which other batches were read, or in what order.

    Raises:
      ValueError: `global_batch_size` < 1 or `dataset` is empty.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if len(dataset) == 0:
        raise ValueError("dataset is empty")
    return dataset.shuffle(seed=seed).repeat().batch(global_batch_size, drop_remainder=True)


def _to_example(window: np.ndarray) -> dict[str, np.ndarray]:
    return {"tokens": window.astype(np.int32)}


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _NOT_STDLIB_DIRS]
        paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(paths)


def _read_local(paths: list[str], max_bytes: int, field: str) -> Iterator[bytes]:
    for path in paths:
        try:
            with open(path, "rb") as f:
                # Never read more than could still fit: keeps memory bounded on huge files.
                data = f.read(max_bytes)
        except OSError as e:
            raise TrainerConfigError(f"{field}: cannot read {path!r}: {e}") from None
        yield _text_only(data, path, field)


def _read_gcs(url: str, max_bytes: int, field: str) -> Iterator[bytes]:
    # Imported here: local and stdlib runs need neither the client nor its auth setup.
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc
    from google.cloud import storage

    bucket_name, _, prefix = url[len(GCS_SCHEME) :].partition("/")
    if not bucket_name:
        raise TrainerConfigError(f"{field}: {url!r} names no bucket")
    try:
        client = storage.Client()
        # The listing is in lexicographic name order already; sorted() makes that explicit.
        blobs = sorted(
            (b for b in client.list_blobs(bucket_name, prefix=prefix) if not b.name.endswith("/")),
            key=lambda b: b.name,
        )
    except (gexc.GoogleAPIError, auth_exc.GoogleAuthError) as e:
        raise TrainerConfigError(f"{field}: cannot list {url!r}: {_one_line(e)}") from None
    if not blobs:
        raise TrainerConfigError(f"{field}: no objects match {url!r}")
    remaining = max_bytes
    for blob in blobs:
        if remaining <= 0:
            return
        try:
            # Ranged read (inclusive end): a huge object costs only the bytes still needed.
            data = blob.download_as_bytes(start=0, end=remaining - 1) if blob.size else b""
        except (gexc.GoogleAPIError, auth_exc.GoogleAuthError) as e:
            raise TrainerConfigError(f"{field}: cannot read gs://{bucket_name}/{blob.name}: {_one_line(e)}") from None
        remaining -= len(data) + 1
        yield _text_only(data, f"gs://{bucket_name}/{blob.name}", field)


def _text_only(data: bytes, name: str, field: str) -> bytes:
    """`data` unchanged, or TrainerConfigError when it looks binary (a glob that caught the wrong files)."""
    if b"\0" in data[:_BINARY_PROBE_BYTES]:
        raise TrainerConfigError(f"{field}: {name!r} is a binary file, not text; narrow the glob to text files")
    return data


def _join(chunks: Iterator[bytes], max_bytes: int) -> np.ndarray:
    """Concatenates non-empty chunks with FILE_SEPARATOR between them, up to max_bytes."""
    out = bytearray()
    for chunk in chunks:
        if not chunk:
            continue
        if out:
            out.append(FILE_SEPARATOR)
        out += chunk
        if len(out) >= max_bytes:
            break
    return np.frombuffer(bytes(out[:max_bytes]), dtype=np.uint8)


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
