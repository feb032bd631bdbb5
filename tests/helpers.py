"""What the tests share (one copy of each), importable by worker processes (no torch, no
pytest at import time): the repository's paths, test tokenizers and documents, datasets,
process and shared-memory checks, batch windows, corrupted files, and the helpers that a
topic's unit tests (tests/unit/) and loader tests (tests/loader/) both use.

`IntTokenizer` has nanochat's tokenizer interface and encodes a document that is a list of
decimal integers separated by spaces into exactly those integers. With it a test can write
documents whose tokens equal their stream positions (`position_documents`), so every window
is checkable by arithmetic (llm.c's trick). Workers unpickle it as `tests.helpers.IntTokenizer`
(conftest.py puts the repository on PYTHONPATH for them).
"""
from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HELPER_MARKERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
# pids of processes that a module-scoped fixture keeps across its tests (test_s3.py's moto_server)
# and ends itself: not a loader's child, not a test's leak (`loader_children`)
FIXTURE_PIDS: set[int] = set()
ALIGN_W = 33  # B=2, T=16
REPO_ROOT = Path(__file__).resolve().parent.parent  # whatever folder of tests/ a test is in
SCRIPTS = REPO_ROOT / "tests" / "scripts"            # the trainer scripts tests run as subprocesses


# ---------------------------------------------------------------- tokenizers and documents

class IntTokenizer:
    """`encode("5 6 7") == [5, 6, 7]`; BOS is `bos` (default 0)."""

    def __init__(self, bos: int = 0):
        self.bos = bos

    def get_bos_token_id(self) -> int:
        return self.bos

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, list):
            return [self.encode(t, prepend) for t in text]
        ids = [int(tok) for tok in text.split()]
        return ([prepend] if prepend is not None else []) + ids

    def decode(self, ids) -> str:
        return " ".join(str(i) for i in ids)


class KillerTokenizer(IntTokenizer):
    """`IntTokenizer` whose process dies (SIGKILL, as the OOM killer or a crashing tokenizer
    library would kill it) when it is given a text holding the word "kill"."""

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, str) and "kill" in text.split():
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode(text, prepend, num_threads)


class SlowTokenizer(IntTokenizer):
    """`IntTokenizer` that takes `seconds` per text: a worker slower than the trainer."""

    def __init__(self, seconds: float = 0.002, bos: int = 0):
        super().__init__(bos)
        self.seconds = seconds

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, str):
            time.sleep(self.seconds)
        return super().encode(text, prepend, num_threads)


class SpinTokenizer(IntTokenizer):
    """`IntTokenizer` that spends `seconds` of CPU per text (a busy loop, not a sleep): a worker
    whose CPU time shows whether it is tokenizing."""

    def __init__(self, seconds: float = 0.003, bos: int = 0):
        super().__init__(bos)
        self.seconds = seconds

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, str):
            end = time.perf_counter() + self.seconds
            while time.perf_counter() < end:
                pass
        return super().encode(text, prepend, num_threads)


class LateTokenizer(IntTokenizer):
    """`IntTokenizer` whose unpickling takes `seconds` in every process but the first to
    unpickle it (the first one creates the file `marker`): one worker slow to start, as a
    worker starved of the cores or unpickling a large vocabulary is."""

    def __init__(self, marker: str, seconds: float, bos: int = 0):
        super().__init__(bos)
        self.marker, self.seconds = marker, seconds

    def __setstate__(self, state):
        self.__dict__.update(state)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            time.sleep(self.seconds)


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (/proc, clock ticks of 10 ms here)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def position_documents(lengths, start: int = 1) -> list[str]:
    """Documents whose tokens, after each document's BOS, are consecutive stream positions.

    With BOS counted as one position, document i's tokens are the positions it occupies in
    the epoch's stream (position 0 is the first document's BOS). `lengths` counts tokens
    without BOS; a length of 0 gives an empty document (BOS only). `None` gives a null row.
    """
    docs, pos = [], start - 1
    for n in lengths:
        if n is None:
            docs.append(None)
            continue
        pos += 1  # the BOS
        docs.append(" ".join(str(p) for p in range(pos, pos + n)))
        pos += n
    return docs


def sequence_lengths(positions) -> list[int]:
    """The lengths of the sequences a (B, T) positions batch holds, row by row, counted by hand:
    a new sequence at each 0 and at each row's start."""
    lengths = []
    for row in positions.tolist():
        for t, pos in enumerate(row):
            if t == 0 or pos == 0:
                lengths.append(0)
            lengths[-1] += 1
    return lengths


def position_lengths(seed=3, n=640, sizes=(30, 1, 13, 64), files=4, align=ALIGN_W) -> list:
    """Lengths for `position_documents`, aligned so that a W=`align` window ends exactly at the
    end of row group 0 of file 0, of file 0 and of the train split (files 0..files-2)."""
    rng = random.Random(seed)
    lengths = [None if rng.random() < 0.06 else rng.choice([0, 0, 1, 2, 5] + list(range(3, 41)))
               for _ in range(n)]
    per_file = n // files
    ends = [sizes[0], per_file, per_file * (files - 1)]  # row ends (exclusive) to align

    def tokens(upto):
        return sum(length + 1 for length in lengths[:upto] if length is not None)

    for end in ends:
        last = max(i for i in range(end) if lengths[i] is not None)
        lengths[last] += (-tokens(end)) % align
        assert tokens(end) % align == 0
    return lengths


def _synth_docs() -> list:
    from shmloader.demo import corpus

    docs = list(corpus.synthetic_texts(800, seed=0, mean_words=8))
    for i in range(5, len(docs), 23):
        docs[i] = None
    docs[50] = None  # file 0 row group 1 is a single row: a row group holding only a null
    rng = random.Random(7)
    huge = " ".join(rng.choice(["alpha", "beta", "gamma", "token", "shard", "<|bos|>"]) for _ in range(1500))
    docs[10] = huge   # file 0, row group 0
    docs[700] = huge  # val file, row group 0
    return docs


def hard_texts(seed: int = 3) -> list:
    """Texts a tokenizer engine gets wrong first: special-token text, long whitespace and digit
    runs, non-ASCII, control characters, then 300 random strings (test_engine.py)."""
    rng = random.Random(seed)
    texts = [" " * 5000, "\n" * 300 + "x", "\t \n \r\n" * 200, "1" * 4000, "3.14159265358979" * 50,
             "  12  345  6789  " * 40, "naïve café ünïcödé 日本語のテキスト 😀😀😀 " * 20,
             "Ελληνικά русский עברית العربية हिन्दी", "<|bos|>" * 30, "<|bos|><|endoftext|>x<|user_start|>",
             "a" * 10000, "'s 've 're 'll 'd 'S 'VE", "\x00\x01\x7f\u200b\ufeff", ""]
    alphabet = " \t\n\r0123456789abcXYZ.,'!é日😀<|>_-"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200))) for _ in range(300)]
    return texts


def small_texts() -> list[str]:
    """~1 MB of stdlib text plus synthetic docs: enough for 1024 merges, trains in < 0.2 s
    (test_corpus.py; a subprocess there builds the same texts by hand)."""
    from shmloader.demo import corpus

    return corpus.stdlib_texts(140) + corpus.synthetic_texts(60, seed=1)


def train_enc():
    """test_tokenizers.py's tiktoken BPE; training is deterministic, so a retrained one equals it."""
    from shmloader.demo import corpus

    return corpus.train_tokenizer(corpus.synthetic_texts(80, seed=4, mean_words=20), vocab_size=330)


def train_sp(vocab_size: int = 400, **options) -> bytes:
    """A SentencePiece unigram model (its bytes) trained offline in ~0.05 s on the synthetic
    corpus; `options` go to the trainer (`bos_id=-1`: a model without BOS). Deterministic."""
    import io

    import sentencepiece
    from shmloader.demo import corpus

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus.synthetic_texts(300, seed=1, mean_words=20)), model_writer=out,
        vocab_size=vocab_size, hard_vocab_limit=False, minloglevel=2, num_threads=1, **options)
    return out.getvalue()



def train_hf_json(path) -> Path:
    """A byte-level BPE `tokenizer.json` (400 tokens, `<|endoftext|>` its only special token)
    trained offline on the synthetic corpus and saved at `path`; `path`. Deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from shmloader.demo import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus.synthetic_texts(80, seed=4, mean_words=20), trainer)
    tok.save(str(path))
    return Path(path)

# ---------------------------------------------------------------- datasets

@dataclass
class Dataset:
    root: Path
    paths: list            # every file, sorted
    tokenizer: object      # what the loader is given
    encode: object         # text -> token ids (ordinary text)
    bos: int
    docs: list = field(default_factory=list)

    def files(self, split: str) -> list[str]:
        paths = [str(p) for p in self.paths]
        return paths[:-1] if split == "train" else paths[-1:]

    def oracle(self, B, T, split="train", rank=0, world=1, cursor=None, skip=0):
        """`oracle.concat_windows` over this dataset: yields (window, position)."""
        from tests import oracle

        return oracle.concat_windows(self.files(split), self.encode, self.bos, B, T, rank=rank,
                                        world=world, cursor=cursor, skip=skip)

    def expected(self, n, B, T, split="train", **kw):
        """The first `n` oracle windows and positions."""
        got = list(itertools.islice(self.oracle(B, T, split, **kw), n))
        assert len(got) == n
        return [w for w, _ in got], [p for _, p in got]

    def loader(self, B, T, split="train", **kw):
        import shmloader

        kw.setdefault("num_workers", 2)
        kw.setdefault("device", "cpu")
        return shmloader.ShmLoader(str(self.root), self.tokenizer, B, T, split, **kw)


@dataclass
class PosData(Dataset):
    lengths: list = field(default_factory=list)
    layout: list = field(default_factory=list)  # per row: (file, rg, row, bos position, length)

    def row_groups(self, split="train") -> dict:
        """(file index within split, rg) -> positions of its non-BOS tokens (in the epoch)."""
        first = 0 if split == "train" else len(self.paths) - 1
        out = {}
        for f, g, _, bos_pos, n in self.layout:
            if (split == "train" and f < len(self.paths) - 1) or (split == "val" and f == first):
                out.setdefault((f - first, g), []).extend(range(bos_pos + 1, bos_pos + 1 + n))
        return out


# ---------------------------------------------------------------- processes and shared memory

def processes():
    """(pid, fields of /proc/pid/stat after the command name) of every process, zombies too
    (tools/suite_cpu.py counts what they used)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        yield int(name), stat[stat.rfind(")") + 2:].split()  # after the command, which may hold spaces


def live_processes():
    """(pid, fields of /proc/pid/stat after the command name) of every live (non-zombie) process."""
    return ((pid, fields) for pid, fields in processes() if fields[0] not in ("Z", "X"))


def _proc_table() -> dict[int, list[int]]:
    """ppid -> live (non-zombie) child pids, from /proc."""
    children: dict[int, list[int]] = {}
    for pid, fields in live_processes():
        children.setdefault(int(fields[1]), []).append(pid)
    return children


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in ("Z", "X")


def loader_children(root: int | None = None) -> list[int]:
    """Live descendants of `root` (default: this process) except multiprocessing's helpers
    (the forkserver itself and the resource tracker) and the fixtures' `FIXTURE_PIDS`; the
    forkserver's children count."""
    table = _proc_table()
    root = os.getpid() if root is None else root
    out, stack = [], [root]
    while stack:
        parent = stack.pop()
        for pid in table.get(parent, []):
            if pid in FIXTURE_PIDS:
                continue
            stack.append(pid)
            # a forked child keeps the forkserver's command line: only a direct child is a helper
            if parent != root or not any(m in _exec_cmdline(pid) for m in HELPER_MARKERS):
                out.append(pid)
    return out


def _exec_cmdline(pid: int, wait_s: float = 1.0) -> str:
    """The command line of this process's child `pid` once it has exec'd: a helper being started
    (the forkserver, the resource tracker) shows this process's own command line between its
    fork and its exec, longer on a loaded machine."""
    own, deadline = cmdline(os.getpid()), time.monotonic() + wait_s
    line = cmdline(pid)
    while line == own and time.monotonic() < deadline:
        time.sleep(0.02)
        line = cmdline(pid)
    return line


def shm_segments(pid: int | None = None) -> list[str]:
    prefix = f"shml_{os.getpid() if pid is None else pid}_"
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []


def wait_gone(pids, seconds: float = 5.0) -> list[int]:
    """Poll until none of `pids` is alive (zombies count as gone); return the survivors."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def heal_or_release(ld, restart: str):
    """A restart of `ld`'s run: `restart` "heal" kills its worker 0 (the next `next()` heals it),
    else, nothing read and its ring full, waits (20 s at most) for the loader to let its processes
    go (`idle_release_s`: waited for, not timed)."""
    if restart == "heal":
        os.kill(ld.debug().workers[0].pid, signal.SIGKILL)
        return
    pids = [ld.debug().coordinator.pid, *(w.pid for w in ld.debug().workers)]
    assert wait_gone(pids, 20.0) == [], "the idle loader kept its processes"


def wait_no_segment(pid: int, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        segs = shm_segments(pid)
        if not segs or time.monotonic() > deadline:
            return segs
        time.sleep(0.02)


def sigkill_after(cmd, cwd: Path, log: Path, at: int, info: str, timeout: float = 60) -> int:
    """Start a trainer script (tests/scripts/restart_trainer*.py), SIGKILL it once its log holds `at`
    lines and its pids file exists; return its pid after checking that its children (the
    loader's processes) are gone within 5 s and its shared memory too."""
    with open(cwd / "stderr.txt", "a") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd)
    pids_file = cwd / f"pids-{proc.pid}.json"
    try:
        deadline = time.monotonic() + timeout
        while not (pids_file.exists() and log.exists() and log.read_text().count("\n") >= at):
            assert proc.poll() is None, f"trainer exited early {info}: {(cwd / 'stderr.txt').read_text()}"
            assert time.monotonic() < deadline, f"trainer made no progress {info}"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL, info
    kids = json.loads(pids_file.read_text())
    assert len(kids) >= 2, f"expected the loader's processes among {kids} {info}"
    assert not wait_gone(kids), f"children of killed trainer {proc.pid} still alive {info}"
    assert not wait_no_segment(proc.pid), f"segment of killed trainer {proc.pid} left {info}"
    return proc.pid


def second_pid(out: Path, first: int) -> int:
    """The pid of the run after `first` among the trainer scripts' pids-<pid>.json in `out`."""
    (pid,) = [int(p.stem.split("-")[1]) for p in out.glob("pids-*.json") if p.stem != f"pids-{first}"]
    return pid


def wait_workers_idle(loader, timeout: float = 15.0, quiet_s: float = 0.1):
    """Poll until every worker of `loader` has been idle (no piece: its ring row's PIECE is -1)
    for `quiet_s`, i.e. the ring is full and a replaced worker has done again all it was given.
    A test that kills a worker again waits for this first: a second death while the replacement
    still reads the first one's piece is a poison pill by the rule (procs/heal.py), however
    unrelated the kills."""
    from shmloader.ipc.ring import WorkerCol

    deadline, quiet_since = time.monotonic() + timeout, None
    while True:
        idle = all(int(row[WorkerCol.PIECE]) == -1 for row in loader.debug().ring.workers)
        now = time.monotonic()
        quiet_since = (quiet_since or now) if idle else None
        if quiet_since is not None and now - quiet_since >= quiet_s:
            return
        assert now < deadline, f"the workers were not idle for {quiet_s} s within {timeout} s"
        time.sleep(0.002)


def wait_clean(timeout: float = 2.0, pid: int | None = None) -> tuple[list[int], list[str]]:
    """Poll until no loader child and no segment of `pid` remain; return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        kids, segs = loader_children(), shm_segments(pid)
        if (not kids and not segs) or time.monotonic() > deadline:
            return kids, segs
        time.sleep(0.02)


# ---------------------------------------------------------------- windows

def window_of(inputs, targets) -> np.ndarray:
    """The B*T+1 token window of a batch, checking that targets are inputs shifted by one."""
    x = inputs.reshape(-1).numpy()
    y = targets.reshape(-1).numpy()
    assert np.array_equal(x[1:], y[:-1]), "targets are not inputs shifted by one token"
    return np.concatenate([x[:1], y])


def position_of(state: dict) -> tuple:
    return tuple(state["position"])


# ---------------------------------------------------------------- datasets


# ---------------------------------------------------------------- files and ports

def corrupt_row_group(path, rg: int):
    """Overwrite the column chunk of row group `rg` of the parquet file `path` with 0xff bytes
    (the footer stays valid, so the file opens and only that row group cannot be read)."""
    col = pq.ParquetFile(path).metadata.row_group(rg).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(Path(path).read_bytes())
    raw[start:start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    Path(path).write_bytes(bytes(raw))


def write_snappy(path, docs: list, rows: int):
    """`docs` as the `text` column of `path` in row groups of `rows`, snappy (so that its pages
    can be corrupted the same way whatever the corpus writer's format)."""
    pq.write_table(pa.table({"text": docs}), path, row_group_size=rows, compression="snappy")


def row_group_sizes(path: Path) -> list[int]:
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def read_texts(paths: list[Path]) -> list[str | None]:
    """The `text` column of `paths`, file after file."""
    return [t for p in paths for t in pq.read_table(p).column("text").to_pylist()]


def part_files(cache_dir) -> list[Path]:
    """A token cache's partial entries (slices of a row group)."""
    return sorted(Path(cache_dir).rglob("*.part"))


def tmp_files(cache_dir) -> list[Path]:
    """A token cache's temporary files (of a writer not done, or killed)."""
    return sorted(p for p in Path(cache_dir).rglob("*") if ".tmp-" in p.name)


def position_shards(root, lengths, num_files=3, rg=8) -> list[str]:
    """`position_documents(lengths)` written as `num_files` shards of row groups of `rg` under
    `root` (made if missing); their paths."""
    from shmloader.demo import corpus

    os.makedirs(root, exist_ok=True)
    return [str(p) for p in corpus.write_shards(position_documents(lengths), root, num_files=num_files,
                                                row_group_size=rg)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the fixtures' datasets

def synth_dataset(root: Path, tokenizer) -> Dataset:
    """The `synth` fixture's files (conftest.py says what they hold)."""
    from shmloader.demo import corpus

    docs = _synth_docs()
    paths = corpus.write_shards(docs, root, num_files=4, row_group_size=[50, 1, 7, 120])
    return Dataset(root, paths, tokenizer, tokenizer.encode_ordinary, tokenizer.encode_single_token("<|bos|>"), docs)


def position_dataset(root: Path) -> PosData:
    """The `posdata` fixture's files, with every token's position (conftest.py)."""
    from shmloader.demo import corpus

    lengths = position_lengths()
    docs = position_documents(lengths)
    paths = corpus.write_shards(docs, root, num_files=4, row_group_size=[30, 1, 13, 64])
    layout, pos, i = [], 0, 0
    for f, path in enumerate(paths):
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            for row in range(md.row_group(g).num_rows):
                n = lengths[i]
                if n is not None:
                    layout.append((f, g, row, pos, n))
                    pos += n + 1
                i += 1
    assert i == len(lengths)
    tok = IntTokenizer()
    return PosData(root, paths, tok, lambda t: tok.encode(t), tok.get_bos_token_id(), docs,
                   lengths=lengths, layout=layout)


class SlowWordTokenizer(IntTokenizer):
    """`IntTokenizer` that takes `seconds` on a text holding the word "slow": one slow document
    in a data set of quick ones."""

    def __init__(self, seconds: float = 2.5, bos: int = 0):
        super().__init__(bos)
        self.seconds = seconds

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, str) and "slow" in text.split():
            time.sleep(self.seconds)
            text = " ".join(w for w in text.split() if w != "slow")
        return super().encode(text, prepend, num_threads)


class GatedSlowTokenizer(IntTokenizer):
    """`IntTokenizer` that takes `seconds` per text while the file `gate` exists: the same
    tokenizer (and fingerprint) whether slow or not, for a state saved quickly and a replay of
    it that is slow."""

    def __init__(self, gate: str, seconds: float = 0.01, bos: int = 0):
        super().__init__(bos)
        self.gate, self.seconds = gate, seconds

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, str) and os.path.exists(self.gate):
            time.sleep(self.seconds)
        return super().encode(text, prepend, num_threads)
