"""Data on S3 (a local moto_server) streams exactly as the same files on local disk.

The module starts one `moto_server -H 127.0.0.1 -p <free port>` (waiting for the port to
answer, with a deadline; terminated by the fixture whatever happens) and uploads the shards once
into a bucket with `pyarrow.fs.S3FileSystem` (a server's start is ~1.5 CPU-s of imports, once a
test made it 9 of the file's ~15 CPU-s); the tests only read that bucket's `PREFIX`, and one that
uploads more writes under a prefix of its own. Credentials are dummies set in the
environment (moto accepts any). Checked:

- `s3://bucket/prefix/?endpoint_override=...&scheme=http` gives the local stream byte for byte
  and the same resume positions, in both packings; a state from the S3 run resumes exactly;
- an explicit `filesystem=` with a list of `bucket/key` paths does the same;
- a missing bucket, a missing object and an unreachable endpoint are `DataError`s naming what
  is missing, quickly (an upper bound on the time is asserted);
- a `file://` URI to a local directory works too.
"""
import ast
import itertools
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers

B, T = 2, 16
N = 12  # batches compared per run
BUCKET, PREFIX = "corpus-bucket", "fineweb/v1"
START_DEADLINE_S = 20.0
UNREACHABLE_BOUND_S = 15.0


def _moto_server() -> str | None:
    here = Path(sys.executable).parent / "moto_server"
    if here.exists():
        return str(here)
    return shutil.which("moto_server")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(data dir, shard paths, tokenizer): 3 files (2 train + val), row groups of 9 and 4 docs."""
    root = tmp_path_factory.mktemp("s3_local")
    docs = corpus.synthetic_texts(150, seed=5, mean_words=10)
    docs[7] = None
    paths = corpus.write_shards(docs, root / "shards", num_files=3, row_group_size=[9, 4])
    enc = corpus.train_tokenizer(corpus.synthetic_texts(80, seed=2, mean_words=20), vocab_size=320)
    return root / "shards", paths, enc


@pytest.fixture
def aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory):
    """A running moto_server, one for the module; yields its 'host:port'. Always terminated."""
    exe = _moto_server()
    if exe is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    tmp_path = tmp_path_factory.mktemp("moto")
    port = helpers.free_port()
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    helpers.FIXTURE_PIDS.add(proc.pid)  # kept across the module's tests: not their leak (conftest.py's no_leaks)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"moto_server did not answer on port {port} within {START_DEADLINE_S} s "
                                f"(exit code {proc.poll()}):\n{(tmp_path / 'moto.log').read_text()[-2000:]}")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        helpers.FIXTURE_PIDS.discard(proc.pid)
        log.close()


def _s3fs(endpoint: str, **kw):
    from pyarrow import fs

    return fs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="testing",
                           secret_key="testing", region="us-east-1", **kw)


@pytest.fixture
def moto(moto_server, aws_env):
    """The module's moto_server's 'host:port', with the dummy credentials in the environment."""
    return moto_server


@pytest.fixture(scope="module")
def uploaded(moto_server, local):
    """The local shards uploaded to s3://BUCKET/PREFIX/ (plus a non-parquet file), once for the
    module; yields the endpoint. Read only: a test that uploads more writes under its own prefix."""
    _, paths, _ = local
    s3 = _s3fs(moto_server, allow_bucket_creation=True)
    s3.create_dir(BUCKET)
    for path in paths:
        with s3.open_output_stream(f"{BUCKET}/{PREFIX}/{path.name}") as f:
            f.write(path.read_bytes())
    with s3.open_output_stream(f"{BUCKET}/{PREFIX}/README.txt") as f:
        f.write(b"not a shard")
    return moto_server


@pytest.fixture
def bucket(uploaded, aws_env):
    """The module's bucket's endpoint, with the dummy credentials in the environment."""
    return uploaded


def _run(data, enc, n=N, **kw):
    """(windows, positions) of the first n batches; windows are (inputs, targets) numpy pairs."""
    kw.setdefault("num_workers", 2)
    kw.setdefault("timeout", 60)
    kw.setdefault("split", "train")
    batches, positions = [], []
    with shmloader.ShmLoader(data, enc, B, T, device="cpu", **kw) as loader:
        for x, y in itertools.islice(loader, n):
            batches.append((x.numpy().copy(), y.numpy().copy()))
            s = loader.state_dict()
            positions.append(tuple(s["position"]))
            last_state = s
        files = list(loader.files)
    assert len(batches) == n
    return batches, positions, files, last_state


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def _uri(endpoint: str, key: str = PREFIX + "/") -> str:
    return f"s3://{BUCKET}/{key}?endpoint_override={endpoint}&scheme=http"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_s3_uri_streams_like_local(local, bucket, packing):
    root, paths, enc = local
    kw = dict(packing=packing, buffer_size=16, tokenizer_batch_size=8)
    want, want_pos, _, _ = _run(str(root), enc, **kw)
    got, got_pos, files, _ = _run(_uri(bucket), enc, **kw)
    assert files == [f"{BUCKET}/{PREFIX}/{p.name}" for p in paths[:-1]], "train = all parquet files but the last"
    assert len({x.tobytes() for x, _ in want}) == N, "batches should differ from each other"
    assert _same(got, want), "S3 stream differs from the local stream"
    assert got_pos == want_pos
    assert want_pos[-1][1:3] != (0, 0), "the run should go past the first row group"


def test_s3_state_resumes_exactly(local, bucket):
    _, _, enc = local
    full, _, _, _ = _run(_uri(bucket), enc, n=8)
    head, _, _, state = _run(_uri(bucket), enc, n=3)
    rest, _, _, _ = _run(_uri(bucket), enc, n=5, resume_state=state)
    assert _same(head, full[:3]) and _same(rest, full[3:])


def test_s3_explicit_filesystem_and_key_list(local, bucket):
    root, paths, enc = local
    want, want_pos, _, _ = _run(str(root), enc)
    keys = [f"{BUCKET}/{PREFIX}/{p.name}" for p in paths]
    got, got_pos, files, _ = _run(keys[::-1], enc, filesystem=_s3fs(bucket))  # sorted by the loader
    assert files == keys[:-1]
    assert _same(got, want) and got_pos == want_pos


def test_s3_hub_shards_of_several_splits_are_refused_with_the_list_that_reads_one(local, bucket):
    """A Hub repository's `data/` on S3 (`train-*` beside `test-*`) was refused suggesting a glob
    built on the URI, query and all (`...?endpoint_override=...&scheme=http/train-*.parquet`),
    which a remote path never is. The refusal gives the list of the train split's files, each
    with the query, and that list, given as `data=`, reads them."""
    root, paths, enc = local
    s3 = _s3fs(bucket)
    hub = [f"train-{i:05d}-of-00002.parquet" for i in range(2)] + ["test-00000-of-00001.parquet"]
    for path, name in zip(paths, hub):
        with s3.open_output_stream(f"{BUCKET}/hub/data/{name}") as f:
            f.write(path.read_bytes())
    with pytest.raises(shmloader.DataError, match=r"Hub shards of 2 splits \(test, train\).*read one split by the "
                                                  r"list of its files, e\.g\. data=(\[.*\]) with split='all'") as no:
        _run(_uri(bucket, "hub/data/"), enc)
    told = ast.literal_eval(re.search(r"data=(\[.*?\])", str(no.value)).group(1))
    assert told == [f"s3://{BUCKET}/hub/data/{name}?endpoint_override={bucket}&scheme=http" for name in hub[:2]]
    want, _, _, _ = _run([str(p) for p in paths[:2]], enc, n=4, split="all")
    got, _, files, _ = _run(told, enc, n=4, split="all")  # the advice, followed
    assert files == [f"{BUCKET}/hub/data/{name}" for name in hub[:2]] and _same(got, want)


def test_s3_missing_bucket_is_a_quick_data_error(local, moto):
    _, _, enc = local
    uri = f"s3://no-such-bucket/{PREFIX}/?endpoint_override={moto}&scheme=http"
    began = time.monotonic()
    with pytest.raises(shmloader.DataError) as info:
        with shmloader.ShmLoader(uri, enc, B, T, "train", num_workers=1, device="cpu", timeout=30) as loader:
            next(loader)
    assert time.monotonic() - began < 10
    assert "no-such-bucket" in str(info.value)


def test_s3_missing_object_names_it(local, bucket):
    _, paths, enc = local
    keys = [f"{BUCKET}/{PREFIX}/{p.name}" for p in paths]
    missing = f"{BUCKET}/{PREFIX}/shard_00000b.parquet"  # sorts second: a train file
    began = time.monotonic()
    with pytest.raises(shmloader.DataError) as info:
        with shmloader.ShmLoader(keys + [missing], enc, B, T, "train", num_workers=1, device="cpu",
                                 filesystem=_s3fs(bucket), timeout=30) as loader:
            for _ in itertools.islice(loader, 200):
                pass
    assert time.monotonic() - began < 20
    assert "shard_00000b.parquet" in str(info.value)


def test_s3_unreachable_endpoint_is_a_data_error_within_bound(local, aws_env):
    _, _, enc = local
    endpoint = f"127.0.0.1:{helpers.free_port()}"  # nothing listens there
    uri = _uri(endpoint)
    began = time.monotonic()
    with pytest.raises(shmloader.DataError) as info:
        with shmloader.ShmLoader(uri, enc, B, T, "train", num_workers=1, device="cpu", timeout=30) as loader:
            next(loader)
    elapsed = time.monotonic() - began
    assert elapsed < UNREACHABLE_BOUND_S, f"an unreachable endpoint took {elapsed:.1f} s to report"
    assert BUCKET in str(info.value) and endpoint in str(info.value)


def test_file_uri_to_a_local_directory(local):
    root, paths, enc = local
    want, want_pos, _, _ = _run(str(root), enc, n=6)
    got, got_pos, files, _ = _run(Path(root).resolve().as_uri(), enc, n=6)
    assert files == [str(Path(p).resolve()) for p in paths[:-1]]
    assert _same(got, want) and got_pos == want_pos
    got_list, _, _, _ = _run([Path(p).resolve().as_uri() for p in paths], enc, n=6)
    assert _same(got_list, want)


@pytest.mark.parametrize("fmt", ["jsonl.zst", "arrow-stream"])
def test_s3_other_formats_stream_like_local(local, bucket, fmt, tmp_path):
    """The same documents as `.jsonl.zst` or an Arrow stream (Hugging Face's cache files) on S3
    give the same files' stream on local disk, in both packings, and (concat, one rank: the
    units differ, the documents' order does not) the local parquet stream; a state of the S3 run
    resumes exactly with another worker count. (Best fit's stream depends on its units, whose
    rows it reads in chunks: parquet's row groups of 9 and 4 are not a JSON Lines file's.)"""
    import pyarrow.parquet as pq

    from tests import formats_data

    root, paths, enc = local
    s3, key = _s3fs(bucket), f"other-{fmt}/"  # a prefix of its own: the module's server keeps every upload
    for path in paths:
        out = tmp_path / "other" / (path.stem + formats_data.SUFFIX[fmt])
        formats_data.write(str(out), pq.read_table(path).column("text").to_pylist(), fmt)
        with s3.open_output_stream(f"{BUCKET}/{key}{out.name}", compression=None) as f:  # as it is: no second zstd
            f.write(out.read_bytes())
    concat, _, _, _ = _run(str(root), enc)
    for packing in ("concat", "bos_bestfit"):
        kw = dict(packing=packing, buffer_size=16, tokenizer_batch_size=8)
        want, _, _, _ = _run(str(tmp_path / "other"), enc, n=N + 4, **kw)
        got, _, files, state = _run(_uri(bucket, key), enc, **kw)
        assert files == [f"{BUCKET}/{key}{p.stem}{formats_data.SUFFIX[fmt]}" for p in paths[:-1]]
        assert _same(got, want[:N]), f"{fmt} on S3 differs from the same files on disk ({packing})"
        assert packing != "concat" or _same(got, concat), f"{fmt} differs from the parquet stream"
        rest, _, _, _ = _run(_uri(bucket, key), enc, n=4, resume_state=state, **dict(kw, num_workers=1))
        assert _same(rest, want[N:]), f"a state of the S3 run resumes exactly with another worker count ({packing})"
