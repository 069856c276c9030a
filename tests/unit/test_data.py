"""Real-text data pipeline: sources, example shape, deterministic global batches."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_jax.controller.data import FILE_SEPARATOR, global_batches, text_examples
from elastic_jax.controller.trainer import TrainerConfigError

FIELD = "spec.controller.trainer.config.data"


@pytest.fixture(scope="module")
def stdlib_examples():
    return text_examples("stdlib", seq_len=32, max_bytes=200_000, field=FIELD)


def test_stdlib_source_gives_int32_byte_examples(stdlib_examples):
    assert len(stdlib_examples) == (200_000 - 1) // 32
    tokens = stdlib_examples[0]["tokens"]
    assert tokens.dtype == np.int32 and tokens.shape == (33,)
    assert 0 <= tokens.min() and tokens.max() < 256
    # Real Python source: mostly printable ASCII.
    assert np.isin(tokens, np.arange(32, 127)).mean() > 0.8
    # Windows overlap by one byte, so every transition is a target once.
    assert stdlib_examples[0]["tokens"][-1] == stdlib_examples[1]["tokens"][0]


def test_local_glob_recursive_sorted_with_separator(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_bytes(b"hello")
    (tmp_path / "b" / "c.txt").write_bytes(b"world!")
    (tmp_path / "b" / "skip.bin").write_bytes(b"xxxxxxxx")
    ds = text_examples(f"{tmp_path}/**/*.txt", seq_len=3, max_bytes=1000, field=FIELD)
    text = b"hello" + bytes([FILE_SEPARATOR]) + b"world!"  # 12 bytes -> (12 - 1) // 3 = 3 examples
    assert len(ds) == 3
    assert [bytes(ds[i]["tokens"].astype(np.uint8)) for i in range(3)] == [text[0:4], text[3:7], text[6:10]]


def test_max_bytes_caps_the_text(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 1000)
    (tmp_path / "b.txt").write_bytes(b"y" * 1000)
    ds = text_examples(f"{tmp_path}/*.txt", seq_len=9, max_bytes=100, field=FIELD)
    assert len(ds) == (100 - 1) // 9
    assert all(ds[i]["tokens"].max() == ord("x") for i in range(len(ds)))


def test_empty_glob_names_the_field(tmp_path):
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: no files match '.*/nothing/\*\.txt'$"):
        text_examples(f"{tmp_path}/nothing/*.txt", seq_len=8, max_bytes=1000, field=FIELD)


def test_a_directory_gets_a_glob_hint(tmp_path):
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: '.*' is a directory; name its files with a glob, e\.g\. '.*/\*\*/\*\.txt'$"):
        text_examples(str(tmp_path), seq_len=8, max_bytes=1000, field=FIELD)


def test_too_little_text_names_the_field(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"short")
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: 5 bytes of text read from .* \(at most maxBytes = "
                                                 rf"1000\), need at least seqLen \+ 1 = 65$"):
        text_examples(f"{tmp_path}/*.txt", seq_len=64, max_bytes=1000, field=FIELD)


def test_binary_file_in_the_glob_names_the_file(tmp_path):
    """A glob that also catches binaries (a data folder with .npy or .pyc files) is an error, not noise to train on."""
    (tmp_path / "a.txt").write_text("plain text " * 20)
    (tmp_path / "b.bin").write_bytes(b"\x93NUMPY\x01\x00v\x00" + bytes(range(256)))
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: '.*/b\.bin' is a binary file, not text; narrow the glob"):
        text_examples(f"{tmp_path}/*", seq_len=8, max_bytes=10_000, field=FIELD)
    assert len(text_examples(f"{tmp_path}/*.txt", seq_len=8, max_bytes=10_000, field=FIELD)) > 0
    # UTF-8 beyond ASCII is text.
    (tmp_path / "c.txt").write_text("naïve café 東京 " * 10, encoding="utf-8")
    assert len(text_examples(f"{tmp_path}/c.txt", seq_len=8, max_bytes=10_000, field=FIELD)) > 0


def test_same_seed_same_batch_different_seed_different(stdlib_examples):
    a = global_batches(stdlib_examples, 24, seed=0)
    b = global_batches(stdlib_examples, 24, seed=0)
    c = global_batches(stdlib_examples, 24, seed=1)
    for i in (0, 7, 1000):
        assert a[i]["tokens"].shape == (24, 33) and a[i]["tokens"].dtype == np.int32
        np.testing.assert_array_equal(a[i]["tokens"], b[i]["tokens"])
        assert not np.array_equal(a[i]["tokens"], c[i]["tokens"])
    assert not np.array_equal(a[0]["tokens"], a[1]["tokens"])


def test_batch_i_independent_of_access_history(stdlib_examples):
    fresh = global_batches(stdlib_examples, 16, seed=3)[42]["tokens"]
    batches = global_batches(stdlib_examples, 16, seed=3)
    for i in [5, 100, 42, 0, 42, 99999, 41, 43]:
        batches[i]
    np.testing.assert_array_equal(batches[42]["tokens"], fresh)
    # Iterating sequentially gives the same batches as indexing.
    it = iter(batches.to_iter_dataset())
    seq = [next(it)["tokens"] for _ in range(43)]
    np.testing.assert_array_equal(seq[42], fresh)


def test_epochs_cover_every_example_and_reshuffle(tmp_path):
    (tmp_path / "a.txt").write_bytes(bytes(range(ord("a"), ord("a") + 21)))  # 21 bytes, seq_len 2 -> 10 examples
    ds = text_examples(f"{tmp_path}/*.txt", seq_len=2, max_bytes=1000, field=FIELD)
    batches = global_batches(ds, 5, seed=0)
    firsts = [int(row[0]) for i in range(4) for row in batches[i]["tokens"]]
    epoch0, epoch1 = firsts[:10], firsts[10:]
    assert sorted(epoch0) == sorted(epoch1) == [ord("a") + 2 * k for k in range(10)]
    assert epoch0 != epoch1


def test_gs_prefix_reads_objects_in_name_order(gcs_emulator):
    from google.cloud import storage

    url = gcs_emulator.make_bucket("text-data")
    bucket = storage.Client().bucket("text-data")
    bucket.blob("corpus/2.txt").upload_from_string(b"second")
    bucket.blob("corpus/1.txt").upload_from_string(b"first")
    bucket.blob("other/3.txt").upload_from_string(b"not under the prefix")
    ds = text_examples(f"{url}/corpus/", seq_len=11, max_bytes=1000, field=FIELD)
    assert len(ds) == 1
    assert bytes(ds[0]["tokens"].astype(np.uint8)) == b"first" + bytes([FILE_SEPARATOR]) + b"second"


def test_gs_binary_object_names_the_object(gcs_emulator):
    from google.cloud import storage

    url = gcs_emulator.make_bucket("mixed-data")
    bucket = storage.Client().bucket("mixed-data")
    bucket.blob("corpus/1.txt").upload_from_string(b"some text " * 10)
    bucket.blob("corpus/2.tfrecord").upload_from_string(b"\x00\x01\x02binary")
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: '{url}/corpus/2\.tfrecord' is a binary file"):
        text_examples(f"{url}/corpus/", seq_len=8, max_bytes=1000, field=FIELD)


def test_gs_prefix_without_objects_names_the_field(gcs_emulator):
    url = gcs_emulator.make_bucket("empty-data")
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: no objects match '{url}/none/'$"):
        text_examples(f"{url}/none/", seq_len=8, max_bytes=1000, field=FIELD)


def test_gs_missing_bucket_names_the_field(gcs_emulator):
    with pytest.raises(TrainerConfigError, match=rf"^{FIELD}: cannot list 'gs://no-such-bucket/x'"):
        text_examples("gs://no-such-bucket/x", seq_len=8, max_bytes=1000, field=FIELD)
