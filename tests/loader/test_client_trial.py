"""A second new user's trial: training scripts shaped like users' (torch.distributed launched
without torchrun, a Hugging Face Hub download, gradient accumulation with evaluations, loops
left by break, exceptions and interpreter exit), each a test as the client calls the loader.

Bugs it found (each test failed before its fix):
- ranks started by `torch.multiprocessing.spawn` (as SLURM or MPI scripts do: `rank=` passed to
  `init_process_group`, no `RANK` in the environment) were each rank 0 of 1: every rank read the
  same batches, silently. The default group's rank and size are taken where `RANK` and
  `WORLD_SIZE` are not set (`config.place`).
- a Hub repository's `data/` directory (`train-0000N-of-0000M.parquet` beside `test-*` and
  `validation-*`) was one corpus: `split="train"` trained on the test split
  (tests/unit/data/test_source.py has the listing; here the loader refuses it).
- a schedule's later stage that leaves out a source weighed it 0 silently; `len(loader)`, a
  resume state given as the checkpoint, a path or a list, and documents in a struct's field or a
  list of strings said nothing of what to do.

What held up, kept as tests here: gradient accumulation with evaluations in between, saved
mid-accumulation and resumed with another B, T and worker count; loaders made and left every way
(break, exception, del, a dropped drop-in generator) in one process; a script without a main guard
after `multiprocessing.set_start_method` (spawn, forkserver, fork; slow).
"""
import itertools
import json
import operator
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.errors import DataError
from tests import helpers

B, T = 2, 16


def _windows(loader, n) -> list:
    return [helpers.window_of(x, y) for x, y in itertools.islice(loader, n)]


def _spawned_rank(rank: int, world: int, store: str, data: str, out: str):
    """One rank of `torch.multiprocessing.spawn`: a process group from `rank=`, no RANK variable."""
    import torch.distributed as dist
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        with shmloader.ShmLoader(data, helpers.IntTokenizer(), B=B, T=T, device="cpu", num_workers=1,
                                 split="all", head_start=False) as loader:
            got = {"place": [loader.rank, loader.world_size], "windows": [w.tolist() for w in _windows(loader, 3)]}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters import torch: ~15 s on a loaded 2-core machine
def test_ranks_of_a_process_group_without_torchrun_s_variables_read_their_own_shares(tmp_path, watchdog):
    import torch.multiprocessing as tmp
    data = helpers.position_shards(tmp_path / "data", [10] * 40, num_files=2, rg=4)
    tmp.spawn(_spawned_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "data"), str(tmp_path / "got")),
              nprocs=2, join=True)
    got = [json.loads((tmp_path / f"got.{r}").read_text()) for r in range(2)]
    assert [g["place"] for g in got] == [[0, 2], [1, 2]]
    for r, g in enumerate(got):  # each rank's batches are those of rank= r, world_size=2 given
        with shmloader.ShmLoader(str(tmp_path / "data"), helpers.IntTokenizer(), B=B, T=T, device="cpu",
                                 num_workers=1, split="all", rank=r, world_size=2) as loader:
            assert [w.tolist() for w in _windows(loader, 3)] == g["windows"]
    assert got[0]["windows"] != got[1]["windows"]


def test_a_hub_download_of_several_splits_is_refused_naming_the_glob_and_the_glob_reads_one(tmp_path, watchdog):
    """`huggingface_hub.snapshot_download(repo_type="dataset")`'s `data/`, given as the data
    directory: `split="train"` trained on `test-*` (the first file by name) and validated on
    `validation-*`."""
    d = tmp_path / "data"
    d.mkdir()
    texts = {split: [" ".join(str(base + 10 * k + i) for i in range(1, 9)) for k in range(n)]  # test: 10001...
             for split, n, base in (("train", 40, 0), ("test", 8, 10_000), ("validation", 8, 20_000))}
    for split, docs in texts.items():
        parts = 2 if split == "train" else 1
        for p in range(parts):
            pq.write_table(pa.table({"text": docs[p::parts]}), d / f"{split}-{p:05d}-of-{parts:05d}.parquet",
                           row_group_size=5)
    with pytest.raises(DataError, match=r"Hugging Face Hub shards of 3 splits \(test, train, validation\).*"
                                        r"data='.*data/train-\*\.parquet' with split='all'"):
        shmloader.ShmLoader(str(d), helpers.IntTokenizer(), B=B, T=T, device="cpu", num_workers=1)
    with shmloader.ShmLoader(str(d / "train-*.parquet"), helpers.IntTokenizer(), B=B, T=T, device="cpu",
                             num_workers=1, split="all") as loader:
        stream = np.concatenate(_windows(loader, 4))
    assert stream[:9].tolist() == list(range(9)) and stream.max() < 10_000  # train's first document, no test


def test_a_schedule_stage_that_leaves_out_a_weighed_source_warns_that_it_pauses_it():
    """An annealing stage written as the change alone, `(90_000, {"math": 0.4})`, reads as "raise
    math": it weighed web and code 0 from batch 90,000 (every later batch math alone), silently."""
    import warnings
    sources = {"web": "/nowhere/web", "code": "/nowhere/code", "math": "/nowhere/math"}
    with pytest.warns(UserWarning, match=r"Mixture: stage 1 \(from batch 90000\) names no weight for 'code', 'web', "
                                         r"weighed in stage 0: weight 0, not read from batch 90000 .*name them in "
                                         r"stage 1, 0 to pause one") as said:
        mix = shmloader.Mixture(sources, [(0, {"web": 0.7, "code": 0.2, "math": 0.1}), (90_000, {"math": 0.4})])
    assert [w.filename for w in said] == [__file__]  # the caller's line (errors.warn)
    assert mix.stages[1].weights == {"code": 0.0, "math": 0.4, "web": 0.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shmloader.Mixture(sources, {"web": 1, "code": 1})  # a first stage leaving one out: weighed 0 from the start
        shmloader.Mixture(sources, [(0, {"web": 1}), (10, {"web": 0, "code": 1}), (20, {"code": 1, "math": 1})])


def test_len_of_a_loader_says_it_is_endless_and_how_to_count_steps(posdata):
    """A torch DataLoader's `len(loader)` (a cosine schedule's total, a progress bar) was
    "object of type 'ShmLoader' has no len()". A progress bar that asks len() and a loader in
    an `if` still work; a DataLoader given it as its dataset is told to iterate it directly."""
    import torch
    with shmloader.ShmLoader(posdata.paths, posdata.tokenizer, B=B, T=T, device="cpu", num_workers=1) as loader:
        with pytest.raises(TypeError, match=r"a ShmLoader has no len\(\): it is an endless stream.*count training "
                                            r"steps yourself \(a token budget is steps = tokens // \(B \* T \* "
                                            r"world_size\)\)"):
            len(loader)
        assert loader and next(loader)[0].shape == (B, T)
        with pytest.raises(TypeError, match=r"has no len\(\).*It replaces a torch DataLoader: iterate it directly, "
                                            r"not as a DataLoader's dataset"):
            next(iter(torch.utils.data.DataLoader(loader, batch_size=None)))  # a map-style dataset's sampler asks
        assert operator.length_hint(loader) == 0  # as list() and tqdm ask it: len()'s TypeError is no error there
        assert [x.shape for x, _ in itertools.islice(loader, 2)] == [(B, T)] * 2


def test_a_resume_state_given_as_a_checkpoint_a_path_or_every_rank_s_list_says_what_to_pass(posdata, tmp_path):
    """What a training script holds where the state should be: the checkpoint's metadata whole
    (nanochat's `meta_data` with its `dataloader_state_dict`), the JSON file's path, or the list of
    every rank's states. They were "has no 'version' (a nanochat state) but has field
    'dataloader_state_dict'" and "must be a dict, got str"."""
    def make(state):
        return shmloader.ShmLoader(posdata.paths, posdata.tokenizer, B=B, T=T, device="cpu", num_workers=1,
                                   resume_state=state)
    with make(None) as loader:
        next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    nanochat_state = {"pq_idx": 0, "rg_idx": 1, "epoch": 1}
    for key, saved in (("dataloader_state_dict", state), ("loader", nanochat_state)):
        with pytest.raises(ValueError, match=rf"resume state is a checkpoint holding a loader state under '{key}': "
                                             rf"pass that state, resume_state=checkpoint\['{key}'\]"):
            make({"step": 100, key: saved, "model_config": {"n_layer": 2}})
    path = tmp_path / "loader.json"
    path.write_text(json.dumps(state))
    for given in (str(path), path.read_text()):
        with pytest.raises(ValueError, match=r"must be a dict, got str: a path or JSON text is not read; pass the "
                                             r"dict, e.g. json.load\(open\(path\)\)"):
            make(given)
    with pytest.raises(ValueError, match=r"got list: give one state, this rank's \(or rank 0's"):
        make([state, state])
    with make(json.loads(path.read_text())) as loader:  # as told
        assert next(loader)[0].shape == (B, T)


# ---------------------------------------------------------------- what held up (the trial's loops)

def test_accumulation_with_evaluations_saved_mid_accumulation_resumes_with_another_shape_and_workers(posdata):
    """A torchtitan-style loop: 3 micro-batches a step, a new val loader every other step, the state
    saved after the first micro-batch of step 1; resumed with another B, T and worker count, the
    token stream goes on where it was (posdata: every token but BOS is its place in the stream)."""
    stream, state, at = [], None, 0
    with posdata.loader(2, 16) as train:
        for step in range(3):
            if step % 2 == 0:
                with posdata.loader(2, 16, split="val", num_workers=1) as val:
                    assert len(list(itertools.islice(val, 2))) == 2
            for micro in range(3):
                stream.append(helpers.window_of(*next(train)))
                if (step, micro) == (1, 0):
                    state, at = json.loads(json.dumps(train.state_dict())), len(stream)
    for shape, workers in (((3, 10), 1), ((1, 40), 2)):
        with pytest.warns(UserWarning, match="another batch shape"):
            again = posdata.loader(*shape, num_workers=workers, resume_state=state)
        with again:
            flat = np.concatenate(stream[:at] + [helpers.window_of(x, y) for x, y in itertools.islice(again, 4)])
        placed = flat != posdata.bos
        assert placed.sum() > 200 and (flat[placed] == np.flatnonzero(placed)).all(), shape


def test_loaders_made_and_left_every_way_in_one_process_leave_no_fds_threads_or_segments(posdata):
    """A `with` left by break and by an exception, a loader dropped without close(), a drop-in
    generator dropped: 8 loaders in one process, the same fds and threads after each."""
    import gc
    import threading

    def fds():
        return len(os.listdir("/proc/self/fd"))

    seen = []
    for i in range(8):
        how = i % 4
        if how == 0:
            with posdata.loader(2, 16, num_workers=1) as loader:
                for k, _ in enumerate(loader):
                    if k == 3:
                        break
        elif how == 1:
            with pytest.raises(KeyError):
                with posdata.loader(2, 16, num_workers=1) as loader:
                    next(loader)
                    raise KeyError("in the loop")
        elif how == 2:
            loader = posdata.loader(2, 16, num_workers=1)
            x, y = next(loader)
            del loader, x, y
        else:
            gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
                posdata.tokenizer, 2, 16, "train", device="cpu", data=str(posdata.root), num_workers=1)
            next(gen)
            del gen
        gc.collect()
        kids, segs = helpers.wait_clean(5.0)
        assert not kids and not segs, (i, kids, segs)
        deadline = time.monotonic() + 5.0  # a dropped loader's children are reaped on a thread that then ends
        while seen and (fds(), threading.active_count()) != seen[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append((fds(), threading.active_count()))
    assert len(set(seen)) == 1, seen


_UNGUARDED = """
import multiprocessing, sys
multiprocessing.set_start_method(sys.argv[1])
import shmloader
from tests.helpers import IntTokenizer
loader = shmloader.ShmLoader(sys.argv[2], IntTokenizer(), B=2, T=16, device="cpu", num_workers=2)
for k, (x, y) in enumerate(loader):
    if k == 20:
        break
import os
print("read", k + 1, os.getpid())
"""


@pytest.mark.slow  # three interpreters import torch
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_script_without_a_main_guard_after_set_start_method_reads_and_leaves_nothing(posdata, tmp_path, method):
    """A notebook-turned-script: no `if __name__ == "__main__":`, the start method set by the user
    first (nanochat's base_train has no guard either); its top level runs once, and it exits clean."""
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED)
    out = subprocess.run([sys.executable, str(script), method, str(posdata.root)], capture_output=True, text=True,
                         timeout=120, cwd=str(helpers.REPO_ROOT))
    words = out.stdout.split()
    assert out.returncode == 0 and words[:2] == ["read", "21"], out.stderr[-2000:]
    assert not helpers.wait_no_segment(int(words[2]))


@pytest.mark.parametrize("layout", ["struct", "list of strings", "list of structs"])
def test_documents_one_level_down_are_refused_saying_how_to_bring_them_up(tmp_path, layout, watchdog):
    """A dump whose text is a struct's field (`{"doc": {"text": ..., "id": ...}}`) or a list of
    paragraphs: "expected text (a string column...)" said nothing of how to get there."""
    docs = ["1 2 3", "4 5"]
    column = {"struct": [{"text": d, "id": i} for i, d in enumerate(docs)], "list of strings": [[d] for d in docs],
              "list of structs": [[{"text": d}] for d in docs]}[layout]
    pq.write_table(pa.table({"doc": column}), tmp_path / "a.parquet")
    hint = {"struct": r"; a struct's fields are not read as documents: .*table\.flatten\(\) names it 'doc\.<field>', "
                      r"then pass column='doc\.<field>'",
            "list of strings": r"; a list of strings is not one document: join each row's strings",
            "list of structs": r"or token ids \(a list of integers\)$"}[layout]
    with pytest.raises(DataError, match=r"column 'doc' is .*" + hint):
        with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), B=B, T=T, device="cpu", num_workers=1,
                                 split="all", column="doc", head_start=False) as loader:
            next(loader)
    if layout == "struct":  # as told
        pq.write_table(pa.table({"doc": column}).flatten(), tmp_path / "a.parquet")
        with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), B=1, T=4, device="cpu", num_workers=1,
                                 split="all", column="doc.text") as loader:
            assert next(loader)[0].tolist() == [[0, 1, 2, 3]]
