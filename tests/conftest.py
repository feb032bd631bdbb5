"""The suite's fixtures: offline datasets, a small tokenizer, leak checks (helpers.py holds the
functions and classes the tests share).

Datasets (session-scoped, written once into tmp dirs with `shmloader.demo.corpus`):

- `synth`: 800 synthetic documents (mean 8 words; 1 empty and 1 long document per 20, special
  token strings such as "<|bos|>" inside documents), every 23rd row null, the single-row row
  group of file 0 null, one 1500-word document in file 0 and in the val file; 4 files of 200
  rows with row groups [50, 1, 7, 120] cycled (50, 1, 7, 120, 22 per file). Tokenizer: a
  512-token BPE trained by `corpus.train_tokenizer`. About 22k train tokens, 9k val tokens.
- `posdata`: `helpers.position_documents` read with `IntTokenizer`, so every non-BOS token
  equals its position in the epoch's stream (BOS = 0). 4 files of 160 rows, row groups
  [30, 1, 13, 64] cycled, lengths 0..40 with some nulls. Lengths are adjusted so that with
  W = 33 (B=2, T=16, world 1) a window ends exactly at the end of row group 0 of file 0, at
  the end of file 0 and at the end of the train epoch (exact-boundary resume points).
- `sp_model`: a SentencePiece `.model` file, a ~370-piece unigram model (`helpers.train_sp`).
- `hf_json`: a Hugging Face `tokenizer.json`, a 400-token byte-level BPE (`helpers.train_hf_json`).

`SHMLOADER_ENGINE_AT=0` for the whole session (below). Autouse `no_leaks`: after every test,
no child process of the loader (a descendant of this process other than multiprocessing's
forkserver / resource tracker) is alive and no /dev/shm/shml_<this pid>_* segment remains (2 s
grace). `watchdog`: a per-test SIGALRM deadline, used by the loader test modules so that a
hang fails instead of blocking the run.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from shmloader.demo import corpus
from tests import helpers

# Every worker of the suite tokenizes with the fast engine from its first document (when
# fastokens is installed), so that every stream test also checks it against the tiktoken
# oracle: by default a worker starts with tiktoken and lets the engine take over only after
# tokenizing for about as long as building it costs, which the suite's small data sets never
# reach (data/engine.py; tests/unit/data/test_engine.py and tests/loader/test_engine.py test that
# default path). Set before any forkserver starts: its workers inherit the server's environment.
os.environ.setdefault("SHMLOADER_ENGINE_AT", "0")
# Workers unpickle the tests' tokenizers (`tests.helpers.IntTokenizer`): the forkserver's
# interpreter, and scripts the tests run, find the `tests` package through PYTHONPATH.
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))


@pytest.fixture(autouse=True)
def forkserver_booted():
    """The forkserver booted before each test (a waitpid when it is): a process's first loader
    leaves its children unstarted while the server boots (procs/headstart.py), and which test of
    a worker process came first (or came after one that killed the server) would decide where a
    test's children start. tests/loader/test_boot.py runs its first loaders in fresh processes."""
    from shmloader.procs import start
    assert start.wait_booted(), "the forkserver did not boot within 30 s"


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    kids, segs = helpers.wait_clean(2.0)
    described = [(pid, helpers.cmdline(pid)[:120]) for pid in kids]
    for pid in kids:  # do not let one leak cascade into every later test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in segs:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
    assert not kids, f"loader processes still alive after the test: {described}"
    assert not segs, f"shared memory left behind by this process: {segs}"


class Deadline(Exception):
    """Raised by the watchdog when a test runs past its deadline (a hang)."""


@pytest.fixture
def watchdog(request):
    """Fail a test that runs longer than 60 s (or its `@pytest.mark.deadline(seconds)`) instead
    of hanging the run."""
    marker = request.node.get_closest_marker("deadline")
    limit = float(marker.args[0]) if marker else 60.0

    def on_alarm(signum, frame):
        raise Deadline(f"test exceeded its {limit:g} s deadline (hang?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def small_texts() -> list[str]:
    """~1 MB of stdlib text plus synthetic docs: enough for 1024 merges, trains in < 0.2 s
    (a subprocess in tests/loader/test_corpus.py builds the same)."""
    return helpers.small_texts()


@pytest.fixture(scope="session")
def enc(small_texts):
    """A 1024-token BPE trained on `small_texts`."""
    return corpus.train_tokenizer(small_texts, 1024)


@pytest.fixture(scope="session")
def synth_tokenizer():
    return corpus.train_tokenizer(corpus.synthetic_texts(200, seed=1, mean_words=20), vocab_size=512)


@pytest.fixture(scope="session")
def synth(tmp_path_factory, synth_tokenizer) -> helpers.Dataset:
    return helpers.synth_dataset(tmp_path_factory.mktemp("synth"), synth_tokenizer)


@pytest.fixture(scope="session")
def synth_tokenizer_pkl(tmp_path_factory, synth_tokenizer) -> Path:
    return corpus.save_tokenizer(synth_tokenizer, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory) -> Path:
    """A SentencePiece `.model` file (`helpers.train_sp`; skipped without sentencepiece)."""
    pytest.importorskip("sentencepiece")
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    path.write_bytes(helpers.train_sp())
    return path


@pytest.fixture(scope="session")
def hf_json(tmp_path_factory) -> Path:
    """A Hugging Face `tokenizer.json` (`helpers.train_hf_json`; skipped without tokenizers)."""
    pytest.importorskip("tokenizers")
    return helpers.train_hf_json(tmp_path_factory.mktemp("hf_tok") / "tokenizer.json")


@pytest.fixture(scope="session")
def posdata(tmp_path_factory) -> helpers.PosData:
    return helpers.position_dataset(tmp_path_factory.mktemp("posdata"))
