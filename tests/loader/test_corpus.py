"""shmloader.demo.corpus and tools/make_shards.py across processes: the tokenizer trained in
another process is the same, and tools/make_shards.py, run as a user runs it (a subprocess),
writes the corpus, its row groups and its tokenizer. (The corpus in this process:
tests/unit/demo/test_corpus.py.)
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys


from shmloader.demo import corpus
from tests.helpers import REPO_ROOT, read_texts, row_group_sizes


def test_tokenizer_deterministic_across_processes(small_texts, enc, tmp_path):
    code = ("import pickle, sys; from shmloader.demo import corpus; "
            "t = corpus.stdlib_texts(140) + corpus.synthetic_texts(60, seed=1); "
            "corpus.save_tokenizer(corpus.train_tokenizer(t, 1024), sys.argv[1])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env,
                   timeout=60)
    with open(tmp_path / "tokenizer.pkl", "rb") as f:
        assert pickle.load(f)._mergeable_ranks == enc._mergeable_ranks


# ---------------------------------------------------------------- CLI

def test_make_shards_cli(tmp_path):
    out = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "make_shards.py"), "--source", "synthetic",
         "--num-docs", "50", "--seed", "2", "--out-dir", str(out), "--num-files", "2",
         "--row-group-size", "7", "1", "--vocab-size", "300"],
        capture_output=True, text=True, env=env, timeout=60, check=True)
    paths = sorted(out.glob("*.parquet"))
    assert [p.name for p in paths] == ["shard_00000.parquet", "shard_00001.parquet"]
    assert read_texts(paths) == corpus.synthetic_texts(50, seed=2)
    assert row_group_sizes(paths[0]) == [7, 1, 7, 1, 7, 1, 1]
    assert "50 docs to 2 files, 14 row groups" in proc.stdout
    with open(out / "tokenizer" / "tokenizer.pkl", "rb") as f:
        assert pickle.load(f).n_vocab == 300
