"""A Hugging Face tokenizer.json in each packing: the first batch and each worker's tokens/s.

    python tools/bench/hf_engine.py                      # 3 rounds, 2 workers, 4 s of reading a row
    python tools/bench/hf_engine.py --compare DIR        # beside another checkout's shmloader

As a new user would try it (issue 35): a byte-level BPE `tokenizer.json` trained here with the
`tokenizers` package (vocabulary `--vocab-size`, on the first 800 of Python's standard-library
source files), parquet shards of all of those files (row groups of `--row-group` documents),
made once in `--data-dir` and kept. Each row in a fresh process: `ShmLoader(B=8, T=1024,
num_workers=--workers, device="cpu", engine="auto")`, the first batch's wall time from the
constructor, then batches for `--seconds`; each worker's tokens/s over its busy seconds from
one second after the first batch to the end, and the engine `stats()` names for it then. The
packings interleaved, `--rounds` rounds, the round with the median first batch.
"""
from __future__ import annotations

import glob
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, results  # noqa: E402

PACKINGS = ("concat", "bos_bestfit")


def parse_args(argv=None):
    p = results.parser("hf_engine", __doc__)
    p.add_argument("--rounds", type=int, default=3, help="rounds of every row, interleaved (default 3)")
    p.add_argument("--workers", type=int, default=2, help="workers per loader (default 2)")
    p.add_argument("--seconds", type=float, default=4.0, help="reading after the first batch (seconds; default 4)")
    p.add_argument("--vocab-size", type=int, default=2048, help="the tokenizer's vocabulary (tokens; default 2048)")
    p.add_argument("--row-group", type=int, default=50, help="documents per row group (default 50)")
    p.add_argument("--files", type=int, default=None,
                   help="the first this many standard-library source files (files; default all of them)")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "shmloader-hf-bench",
                   help="where the tokenizer and shards are made once and kept (directory)")
    children.add_compare_arg(p)
    results.add_json_arg(p, "hf_engine")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.workers < 1 or args.seconds < 1.5 or (args.files is not None and args.files < 20):
        p.error("--rounds and --workers must be >= 1, --seconds >= 1.5, --files >= 20")
    children.check_compare(p, args)
    return args


def make_data(root: Path, vocab_size: int, row_group: int, files: int | None) -> tuple[str, list[str]]:
    """(tokenizer.json, shard paths) under `root/v<vocab>-rg<row_group>-f<files>`, made if missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = root / f"v{vocab_size}-rg{row_group}-f{files or 'all'}"
    tj = home / "tokenizer.json"
    if not tj.is_file():
        home.mkdir(parents=True, exist_ok=True)
        texts = []
        paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
        for path in paths[:files]:
            try:
                texts.append(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                pass
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts[:800], trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        per = -(-len(texts) // 4)
        for i in range(4):
            pq.write_table(pa.table({"text": texts[i * per:(i + 1) * per]}), home / f"shard_{i:03d}.parquet",
                           row_group_size=row_group)
        tok.save(str(tj))
    return str(tj), sorted(str(p) for p in home.glob("shard_*.parquet"))


def row(cfg: dict) -> dict:
    """In a fresh process (`python -m tools.bench.child hf_engine:row`): one loader's first batch
    and its workers' tokens/s after it."""
    import shmloader

    began = time.perf_counter()
    with shmloader.ShmLoader(cfg["shards"], tokenizer=cfg["tokenizer"], B=8, T=1024, packing=cfg["packing"],
                             num_workers=cfg["workers"], device="cpu") as loader:
        next(loader)
        first = time.perf_counter() - began
        while time.perf_counter() - began < first + 1.0:
            next(loader)
        then = loader.stats()["workers"]
        while time.perf_counter() - began < first + cfg["seconds"]:
            next(loader)
        now = loader.stats()["workers"]
    rates = [(b["tokens"] - a["tokens"]) / (b["busy_s"] - a["busy_s"]) if b["busy_s"] > a["busy_s"] else None
             for a, b in zip(then, now)]
    return {"packing": cfg["packing"], "first_batch_s": first, "worker_tokens_per_s": rates,
            "engines": [w.get("engine", "(not in stats)") for w in now]}


def main(argv=None) -> int:
    args = parse_args(argv)
    began = results.begin()
    tokenizer, shards = make_data(args.data_dir, args.vocab_size, args.row_group, args.files)
    rows = []
    with children.checkouts(args.compare) as cks:
        for i in range(args.rounds):
            for packing in PACKINGS:
                for ck in cks:
                    cfg = {"shards": shards, "tokenizer": tokenizer, "packing": packing, "workers": args.workers,
                           "seconds": args.seconds}
                    got = children.run("hf_engine:row", cfg, ck)
                    print(f"round {i + 1}/{args.rounds}: {_line(got)}", file=sys.stderr)
                    rows.append(got)
    groups = {}
    for r in rows:
        groups.setdefault((r["label"], r["packing"]), []).append(r)
    table = [results.median_of(rs, "first_batch_s") for rs in groups.values()]
    results.publish(args.json, "hf_engine", began, {"vocab_size": args.vocab_size, "row_group": args.row_group,
                                                    "files": args.files, "workers": args.workers, "rows": table},
                    argv, report)
    return 0


def _line(r: dict) -> str:
    rates = ", ".join(results.fmt(x / 1e6 if x else None, ".2f") + " M" for x in r["worker_tokens_per_s"])
    return (f"{r['label'] or ''} {r['packing']}: first batch {r['first_batch_s']:.2f} s, "
            f"workers {rates} tokens/s, engines {r['engines']}").strip()


def report(run: dict) -> str:
    head = ("checkout", "packing", "first batch (s)", "first batch, rounds (s)", "each worker's tokens/s", "engines")
    body = [(r["label"] or "-", r["packing"], f"{r['first_batch_s']:.2f}",
             " ".join(f"{x:.2f}" for x in r["first_batch_s_rounds"]),
             " ".join(results.fmt(x / 1e6 if x else None, ".2f") + "M" for x in r["worker_tokens_per_s"]),
             " | ".join(str(e) for e in r["engines"])) for r in run["rows"]]
    return results.table(head, body)


if __name__ == "__main__":
    sys.exit(main())
