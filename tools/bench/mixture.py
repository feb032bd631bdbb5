"""A mixture of three sources against one source of the same documents: what mixing costs.

    python tools/bench/mixture.py                  # demo corpus, 2 workers, 3 rounds
    python tools/bench/mixture.py --corpus nanochat --quick
    python tools/bench/mixture.py --packing bos_bestfit
    python tools/bench/mixture.py --compare ../other-checkout   # before and after, interleaved
    python tools/bench/mixture.py --sources 1      # a mixture of one source against that source

The corpus's documents are dealt into three sources (document i to source i % 3), each written
as 3 files (the last its val file) with its own row-group size (256, 64 and 512 documents), and
read as `Mixture({a, b, c}, {a: 1, b: 1, c: 1})`; the single source is the corpus itself, or with
`--single files` the sources' own train files read as one source (the same documents in the same
row groups: what mixing costs, without the smaller row groups of one source). With `--sources 1`
the mixture is the single source itself, `Mixture({x: single}, {x: 1})`: the same batches
(tests/loader/test_one_source_mixture.py), so what the mix's machinery costs where it has
nothing to mix. Each
row is a loader in a fresh process read as fast as it goes for `--seconds` (tools/bench/loaders.py
says what a row measures: tokens/s from the first batch, the training process's CPU per
batch), `--packing` (concat by default), `--workers` workers; the two rows alternate, `--repeat` rounds, and the report
gives each round's ratio mixture / single and their median. Then, at a trainer's pace, each
row again (`--step-ms` of busy work between batches, so that a batch is always ready): the
training thread's CPU in each `next()` (its median over `--paced-batches` batches after 20),
which is what a mixture costs the training step. Each row also says its coordinator's and
workers' CPU per batch (less moved by a shared machine than tokens/s). `--compare DIR` runs
every row also with DIR's shmloader (another checkout, "before"), each round both checkouts in
turn, for before/after ratios from one run.
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
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat", help="the packing of both rows")
    loaders.add_shape_args(p)
    p.add_argument("--seconds", type=float, default=None, help="wall time of each row (seconds; default 10, 4 with --quick)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of both rows (default 3)")
    p.add_argument("--quick", action="store_true", help="4 s a row")
    p.add_argument("--step-ms", type=float, default=30.0, help="busy work between batches at a trainer's pace (ms; default 30)")
    p.add_argument("--paced-batches", type=int, default=200,
                   help="batches timed at a trainer's pace (default 200; 0: no rows at a trainer's pace)")
    p.add_argument("--single", choices=("corpus", "files"), default="corpus",
                   help="the single source: the corpus itself (default), or the three sources' train files as one")
    p.add_argument("--sources", type=int, choices=(1, 3), default=3,
                   help="the mixture's sources: 3 (the corpus dealt in three), or 1 (the single source as a "
                        "mixture of one)")
    children.add_compare_arg(p)
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "mixture")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    corpora.check_args(p, args)
    children.check_compare(p, args)
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


def same_files(mixed: dict) -> str:
    """A directory of links to the sources' train files, then one val file last by name: read as
    one source, its train split is the mixture's documents, in the same row groups."""
    root = Path(next(iter(mixed.values()))).parent / "single_files"
    root.mkdir(exist_ok=True)
    links = {}
    for name, d in sorted(mixed.items()):
        files = sorted(Path(d).glob("*.parquet"))
        links.update({f"{name}{i}.parquet": f for i, f in enumerate(files[:-1])})
        links["zz_val.parquet"] = files[-1]
    for old in root.glob("*.parquet"):
        if old.name not in links:
            old.unlink()
    for link, target in links.items():
        path = root / link
        if not path.is_symlink() or path.resolve() != target.resolve():
            path.unlink(missing_ok=True)
            path.symlink_to(target.resolve())
    return str(root)


def paced(cfg: dict) -> dict:
    """A loader read at a trainer's pace in this fresh process (`children.run`): `step_ms` of busy
    work before each `next()`; the calling thread's CPU in `next()`, per batch."""
    import time

    import numpy as np
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    from shmloader import Mixture, ShmLoader
    from tools.bench import measure

    mix = cfg.get("mixture")
    data = Mixture(mix["sources"], mix["weights"]) if mix else cfg["data"]
    buf = np.zeros(1 << 17)
    with ShmLoader(data, cfg["tokenizer"], cfg["B"], cfg["T"], "train", num_workers=cfg["workers"], device="cpu",
                   packing=cfg["packing"]) as it:
        for _ in range(20):
            next(it)
        waited0, cpu = it.stats()["wait_s"], []
        for _ in range(cfg["batches"]):
            measure.busy_work(cfg["step_ms"] / 1e3, buf)
            t = time.thread_time()
            next(it)
            cpu.append(time.thread_time() - t)
        waited = it.stats()["wait_s"] - waited0
    return {"next_cpu_us_median": statistics.median(cpu) * 1e6, "next_cpu_us_mean": statistics.fmean(cpu) * 1e6,
            "waited_s": waited, "batches": len(cpu)}


def main(argv=None) -> int:
    args = parse_args(argv)
    began = results.begin()
    corpus = corpora.resolve(args)[0]
    mixed = sources(corpus, args.cache_dir) if args.sources == 3 or args.single == "files" else None
    single = corpus.data if args.single == "corpus" else same_files(mixed)
    base = {"kind": "shmloader", "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
            "seconds": args.seconds, "tokenizer": corpus.tokenizer, "data": single, "packing": args.packing}
    mixture = ({"sources": mixed, "weights": dict.fromkeys(mixed, 1)} if args.sources == 3
               else {"sources": {"x": single}, "weights": {"x": 1}})
    rows = {}  # "single", "mixture", their "_paced" rows; with --compare also "before <row>"
    with children.checkouts(args.compare) as cks:
        for paced in ([False, True] if args.paced_batches else [False]):
            for i in range(args.repeat):
                for ck in (cks if i % 2 == 0 else cks[::-1]):
                    for kind in ("single", "mixture") if i % 2 == 0 else ("mixture", "single"):
                        cfg = dict(base, mixture=mixture if kind == "mixture" else None)
                        if paced:
                            cfg.update(step_ms=args.step_ms, batches=args.paced_batches)
                        row = ("before " if ck.label == "before" else "") + kind + ("_paced" if paced else "")
                        print(f"round {i + 1}/{args.repeat}: {row}" + (" at a trainer's pace" if paced else ""),
                              file=sys.stderr)
                        fn = "mixture:paced" if paced else "loaders:loader_child"
                        rows.setdefault(row, []).append(children.run(fn, cfg, ck))
    figures = {"config": {"corpus": corpus.name, "packing": args.packing, "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
                          "seconds": args.seconds, "repeat": args.repeat, "sources": list(mixture["sources"]),
                          "step_ms": args.step_ms, "paced_batches": args.paced_batches,
                          "compare": str(args.compare) if args.compare else None, "single": args.single},
               "rows": rows, **ratios(rows, "")}
    if args.compare:
        figures["before"] = ratios(rows, "before ")
    results.publish(args.json, "mixture", began, figures, argv, report)
    return 0


def per_batch(row: dict, key: str):
    """A row's CPU of `key` (seconds) per batch read, in µs."""
    return row[key] / max(row["batches"], 1) * 1e6 if row.get(key) is not None else None


def ratios(rows: dict, prefix: str) -> dict:
    """Each round's ratio mixture / single of the rows of one checkout (`prefix`)."""
    def ratio(key, a="mixture", b="single", of=lambda r, k: r[k]):
        return [of(m, key) / of(s, key) if of(s, key) else None
                for m, s in zip(rows.get(prefix + a, []), rows.get(prefix + b, []))]
    return {"tokens_per_s_ratio": ratio("tokens_per_s"), "trainer_cpu_ratio": ratio("trainer_cpu_us_per_batch"),
            "coordinator_cpu_ratio": ratio("coordinator_cpu_s", of=per_batch),
            "worker_cpu_ratio": ratio("worker_cpu_s", of=per_batch),
            "paced_next_cpu_ratio": ratio("next_cpu_us_median", "mixture_paced", "single_paced")}


def median_text(values: list) -> str:
    """The median of a row's ratios, or "-" where no round has one (a process whose CPU read 0
    ticks in a short round: its ratio is None)."""
    return f"{statistics.median(values):.3f}" if values else "-"


def report(run: dict) -> str:
    c = run["config"]
    what = "its 3 sources' files as one source" if c.get("single") == "files" else "the corpus as one source"
    mixed = "of 3 sources" if len(c.get("sources", "abc")) == 3 else "of that one source"
    out = [f"a mixture {mixed} against {what}, {c['corpus']} corpus, "
           f"{c.get('packing', 'concat')}, "
           f"{c['workers']} workers, B={c['B']}, T={c['T']}, {c['repeat']} rounds of {c['seconds']:g} s a row; "
           f"load average at the start {run['machine']['load_average']}"]
    for prefix, figures in [("", run)] + ([("before ", run["before"])] if run.get("before") else []):
        out.append(f"{prefix or ('this checkout ' if run.get('before') else '')}"
                   "(tokens/s; the trainer's, coordinator's and workers' CPU per batch, us)")
        head = ("row", "tokens/s (each round)", "trainer CPU", "coordinator CPU", "workers' CPU")
        kinds = [k for k in ("single", "mixture") if prefix + k in run["rows"]]
        body = [(kind, ", ".join(fmt(r["tokens_per_s"]) for r in run["rows"][prefix + kind]),
                 ", ".join(fmt(r["trainer_cpu_us_per_batch"]) for r in run["rows"][prefix + kind]),
                 ", ".join(fmt(per_batch(r, "coordinator_cpu_s")) for r in run["rows"][prefix + kind]),
                 ", ".join(fmt(per_batch(r, "worker_cpu_s")) for r in run["rows"][prefix + kind])) for kind in kinds]
        each = lambda key: ", ".join("-" if x is None else f"{x:.3f}" for x in figures[key])  # noqa: E731
        med = lambda key: median_text([x for x in figures[key] if x is not None])  # noqa: E731
        keys = ("tokens_per_s_ratio", "trainer_cpu_ratio", "coordinator_cpu_ratio", "worker_cpu_ratio")
        body.append(("mixture / single", *(each(k) for k in keys)))
        body.append(("median ratio", *(med(k) for k in keys)))
        out.append(results.table(head, body))
        paced = run["rows"].get(prefix + "single_paced")
        if paced:
            out.append(f"at a trainer's pace ({c.get('step_ms', 30):g} ms of busy work a batch): the training thread's "
                       "CPU in next(), us, median over the batches (each round)")
            out.append(results.table(("row", "next() CPU, us", "waited, s"), [
                (kind, ", ".join(f"{r['next_cpu_us_median']:.1f}" for r in run["rows"][prefix + kind]),
                 ", ".join(f"{r['waited_s']:.2f}" for r in run["rows"][prefix + kind]))
                for kind in ("single_paced", "mixture_paced")]
                + [("mixture / single", each("paced_next_cpu_ratio"), f"median {med('paced_next_cpu_ratio')}")]))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
