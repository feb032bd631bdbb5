"""A mixture of three sources against one source of the same documents: what mixing costs.

    python tools/bench/mixture.py                  # demo corpus, 2 workers, 3 rounds
    python tools/bench/mixture.py --corpus nanochat --quick

The corpus's documents are dealt into three sources (document i to source i % 3), each written
as 3 files (the last its val file) with its own row-group size (256, 64 and 512 documents), and
read as `Mixture({a, b, c}, {a: 1, b: 1, c: 1})`; the single source is the corpus itself. Each
row is a loader in a fresh process read as fast as it goes for `--seconds` (tools/bench/loaders.py
says what a row measures: tokens/s from the first batch, the training process's CPU per
batch), concat, `--workers` workers; the two rows alternate, `--repeat` rounds, and the report
gives each round's ratio mixture / single and their median.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results  # noqa: E402
from tools.bench.results import fmt  # noqa: E402

ROW_GROUPS = {"a": 256, "b": 64, "c": 512}


def parse_args(argv=None):
    p = results.parser("mixture", __doc__)
    p.add_argument("--workers", type=int, default=2, help="loader workers (processes; default 2)")
    loaders.add_shape_args(p)
    p.add_argument("--seconds", type=float, default=None, help="wall time of each row (seconds; default 10, 4 with --quick)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of both rows (default 3)")
    p.add_argument("--quick", action="store_true", help="4 s a row")
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "mixture")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    corpora.check_args(p, args)
    return args


def sources(corpus, cache_dir: Path) -> dict:
    """The corpus's documents dealt into three sources (built once, reused): name -> directory."""
    import pyarrow.parquet as pq

    from shmloader.demo import corpus as writer

    root = Path(cache_dir) / f"mixture_{corpus.name or 'data'}"
    dirs = {name: root / name for name in ROW_GROUPS}
    stamp = root / "made_from.json"
    files = sorted(str(p) for p in Path(corpus.data).glob("*.parquet"))
    if stamp.exists() and json.loads(stamp.read_text()) == files:
        return {name: str(d) for name, d in dirs.items()}
    texts = [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    for k, (name, rg) in enumerate(ROW_GROUPS.items()):
        writer.write_shards(texts[k::3], dirs[name], num_files=3, row_group_size=rg)
    stamp.write_text(json.dumps(files))
    return {name: str(d) for name, d in dirs.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    began = results.begin()
    corpus = corpora.resolve(args)[0]
    mixed = sources(corpus, args.cache_dir)
    base = {"kind": "shmloader", "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
            "seconds": args.seconds, "tokenizer": corpus.tokenizer, "data": corpus.data}
    rows = {"single": [], "mixture": []}
    with children.checkouts(None) as (ours,):
        for i in range(args.repeat):
            order = ("single", "mixture") if i % 2 == 0 else ("mixture", "single")
            for kind in order:
                cfg = dict(base, mixture={"sources": mixed, "weights": dict.fromkeys(mixed, 1)} if kind == "mixture"
                           else None)
                print(f"round {i + 1}/{args.repeat}: {kind}", file=sys.stderr)
                rows[kind].append(children.run("loaders:loader_child", cfg, ours))
    ratio = lambda key: [m[key] / s[key] for m, s in zip(rows["mixture"], rows["single"])]  # noqa: E731
    figures = {"config": {"corpus": corpus.name, "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
                          "seconds": args.seconds, "repeat": args.repeat, "sources": list(ROW_GROUPS)},
               "rows": rows, "tokens_per_s_ratio": ratio("tokens_per_s"),
               "trainer_cpu_ratio": ratio("trainer_cpu_us_per_batch")}
    results.publish(args.json, "mixture", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"a mixture of 3 sources against one source of the same documents, {c['corpus']} corpus, concat, "
           f"{c['workers']} workers, B={c['B']}, T={c['T']}, {c['repeat']} rounds of {c['seconds']:g} s a row; "
           f"load average at the start {run['machine']['load_average']}"]
    head = ("row", "tokens/s (each round)", "trainer CPU per batch, us (each round)")
    body = [(kind, ", ".join(fmt(r["tokens_per_s"]) for r in rs), ", ".join(fmt(r["trainer_cpu_us_per_batch"]) for r in rs))
            for kind, rs in run["rows"].items()]
    body.append(("mixture / single", ", ".join(f"{x:.3f}" for x in run["tokens_per_s_ratio"]),
                 ", ".join(f"{x:.3f}" for x in run["trainer_cpu_ratio"])))
    body.append(("median ratio", f"{statistics.median(run['tokens_per_s_ratio']):.3f}",
                 f"{statistics.median(run['trainer_cpu_ratio']):.3f}"))
    out.append(results.table(head, body))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
