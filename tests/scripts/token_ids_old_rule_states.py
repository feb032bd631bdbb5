"""The states of tests/fixtures/token_ids_old_rule_states.json: states over a token-id column
whose documents begin with BOS, saved by the loader before the BOS rule (which read them as
[BOS, BOS, ...]), and the data they read.

`write_data(root)` writes `root/data/0.parquet`: 400 documents as `[BOS] + ids` (what
nanochat's pretokenize writes), column "ids", row groups of 128, with the tests' synthetic
tokenizer (tests/conftest.py `synth_tokenizer`). Run with the loader of main before the rule
(d0a87ac) as

    PYTHONPATH=<that checkout> python tests/scripts/token_ids_old_rule_states.py tests/fixtures/token_ids_old_rule_states.json

it writes, for concat and best fit, the state after batch 6 taken during the run (with its
first-batch check) and after close() (without one). A later loader refuses each, naming the
rule (tests/loader/test_token_ids_bos.py).
"""
import json
import sys
import tempfile
from pathlib import Path

B, T, AT = 4, 64, 6


def tokenizer():
    from shmloader.demo import corpus
    return corpus.train_tokenizer(corpus.synthetic_texts(200, seed=1, mean_words=20), vocab_size=512)


def write_data(root, tok) -> str:
    """The data directory (one parquet file of `[BOS] + ids` documents)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from shmloader.demo import corpus
    bos = tok.encode_single_token("<|bos|>")
    ids = [[bos] + tok.encode_ordinary(t) for t in corpus.synthetic_texts(400, seed=21, mean_words=10)]
    data = Path(root) / "data"
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}), data / "0.parquet", row_group_size=128)
    return str(data)


def main(out: str):
    import shmloader
    tok = tokenizer()
    states = {}
    with tempfile.TemporaryDirectory() as root:
        data = write_data(root, tok)
        for packing in ("concat", "bos_bestfit"):
            for during in (True, False):
                with shmloader.ShmLoader(data, tok, B, T, "all", column="ids", device="cpu", num_workers=2,
                                         packing=packing) as loader:
                    for _ in range(AT):
                        next(loader)
                    if during:
                        state = loader.state_dict()
                if not during:
                    state = loader.state_dict()  # after close(): no check
                states[f"{packing}-{'checked' if during else 'unchecked'}"] = json.loads(json.dumps(state))
    Path(out).write_text(json.dumps(states, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
