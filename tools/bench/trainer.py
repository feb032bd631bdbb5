"""The training process's side: what `next()` costs it, on ready batches and in a training
loop's rhythm, its system calls, and nanochat's loop through the drop-ins.

    python tools/bench/trainer.py                          # demo corpus, 2 workers, both packings
    python tools/bench/trainer.py --corpus demo nanochat skewed --repeat 2
    python tools/bench/trainer.py --quick --compare ../before

Per corpus, packing (and checkout, with `--compare`), in a fresh process, every round in turn
(tools/bench/steps.py says what each measures):
- `next()` on ready batches: back to back; after `--sleep-ms` sleeps and after `--busy-ms` of
  busy work, each next to a bare `torch.from_numpy(window[:-1]).view(B, T)` after the same
  pause (the floor: what the pause alone costs the next bit of work);
- the drop-ins in nanochat's loop (`x, y, state = next(loader)`): CPU per batch as fast as it
  goes, after busy work, at a trainer's pace (`--step-ms` steps), the state as JSON.
Then, on the first corpus, per packing: system calls per `next()` with strace on the
trainer's main thread, `--syscall-steps` steps of `--syscall-step-ms` busy work then `next()`
(tools/syscalls.py), and how many of those calls found no batch ready.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results  # noqa: E402
from tools.bench.results import plural  # noqa: E402

PACKINGS = ("concat", "bos_bestfit")


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("trainer", __doc__)
    p.add_argument("--workers", type=int, default=2, help="loader workers (processes; default 2)")
    p.add_argument("--packings", nargs="+", choices=PACKINGS, default=list(PACKINGS), help="packings (default both)")
    loaders.add_shape_args(p)
    p.add_argument("--batches", type=int, default=None,
                   help="next() calls timed in each measurement (calls; default 100, 40 with --quick)")
    p.add_argument("--sleep-ms", type=float, default=20.0, help="sleep before each timed call (ms; default 20)")
    p.add_argument("--busy-ms", type=float, default=10.0,
                   help="busy work (a numpy and Python spin, no sleep) before each timed call (ms; default 10)")
    p.add_argument("--step-ms", type=float, default=30.0,
                   help="busy work per training step for the drop-ins at a trainer's pace, longer than the loader "
                        "takes per batch (ms; default 30)")
    p.add_argument("--seconds", type=float, default=None,
                   help="the drop-ins read as fast as they go for this long (seconds; default 10, 3 with --quick)")
    p.add_argument("--syscall-steps", type=int, default=200,
                   help="steps traced for the system-call count (steps; 0: skip it; needs strace; default 200)")
    p.add_argument("--syscall-step-ms", type=float, default=10.0,
                   help="busy work per traced step before next() (ms; default 10)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, every row once per round (rounds; default 1)")
    p.add_argument("--quick", action="store_true", help="3 s of reading as fast as it goes, 40 timed calls")
    corpora.add_args(p)
    children.add_compare_arg(p, "every row but the system-call count")
    results.add_json_arg(p, "trainer")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.batches = args.batches or (40 if args.quick else 100)
    if min(args.workers, args.batch_size, args.seq_len, args.batches, args.repeat) < 1 or args.seconds <= 0:
        p.error("--workers, --batch-size, --seq-len, --batches and --repeat must be >= 1, --seconds > 0")
    if min(args.sleep_ms, args.busy_ms, args.step_ms, args.syscall_step_ms, args.syscall_steps) < 0:
        p.error("the -ms options and --syscall-steps must be >= 0")
    corpora.check_args(p, args)
    children.check_compare(p, args)
    return args


def one_round(args, corpus, checkouts, step: str) -> list[dict]:
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
           "workers": args.workers, "batches": args.batches, "sleep_ms": args.sleep_ms, "busy_ms": args.busy_ms,
           "step_ms": args.step_ms, "seconds": args.seconds}
    rows = []
    for packing in args.packings:
        for ck in checkouts:
            print(f"{step}next() on ready batches and the drop-in, {packing}, {plural(args.workers, 'worker')}"
                  f"{f' ({ck.label})' if ck.label else ''} ({corpus.name or corpus.data}) ...", file=sys.stderr)
            got = children.run("steps:trainer_child", dict(cfg, packing=packing), ck)
            rows += [dict(got[kind], label=got["label"], shmloader=got["shmloader"]) for kind in ("cost", "dropin")]
    return rows


def syscall_counts(args, corpus) -> list[dict]:
    from tools import syscalls

    if args.syscall_steps == 0:
        return []
    if not syscalls.available():
        return [{"error": "not measured: strace is not installed"}]
    out = []
    for packing in args.packings:
        print(f"system calls per next(), {packing} (strace) ...", file=sys.stderr)
        got = syscalls.trace_next(corpus.data, corpus.tokenizer, B=args.batch_size, T=args.seq_len,
                                  n=args.syscall_steps, spin_ms=args.syscall_step_ms, num_workers=args.workers,
                                  packing=packing)
        got.pop("calls")
        out.append(dict(got, packing=packing, workers=args.workers, step_ms=args.syscall_step_ms))
    return out


def busy_ratio(row: dict) -> float:
    return row["after_busy_us"]["median"] / row["after_busy_floor_us"]["median"]


def summarise(rounds: list[list[dict]]) -> dict:
    """Per row its median round (cost rows by next() after busy work / the floor, drop-ins by
    CPU per batch), with that figure of every round."""
    rows = []
    for i in range(len(rounds[0])):
        runs = [rnd[i] for rnd in rounds]
        if runs[0]["kind"] == "cost":
            runs = [dict(r, after_busy_ratio=busy_ratio(r)) for r in runs]
            rows.append(results.median_of(runs, "after_busy_ratio"))
        else:
            rows.append(results.median_of(runs, "trainer_cpu_us_per_batch"))
    return {"costs": [r for r in rows if r["kind"] == "cost"], "dropins": [r for r in rows if r["kind"] == "dropin"]}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    per_corpus = children.in_rounds(args.repeat, found, args.compare, functools.partial(one_round, args))
    figures = {"config": {"B": args.batch_size, "T": args.seq_len, "workers": args.workers, "rounds": args.repeat,
                          "batches": args.batches, "sleep_ms": args.sleep_ms, "busy_ms": args.busy_ms,
                          "step_ms": args.step_ms, "seconds": args.seconds,
                          "compare": str(args.compare) if args.compare else None},
               "corpora": [dict(summarise(rounds), corpus=c.name, data=c.data) for c, rounds in zip(found, per_corpus)],
               "syscalls": syscall_counts(args, found[0])}
    results.publish(args.json, "trainer", began, figures, argv, report)
    return 0


def _name(r: dict) -> str:
    return ("best fit" if r["packing"] == "bos_bestfit" else "concat") + (f" ({r['label']})" if r.get("label") else "")


def report(run: dict) -> str:
    c = run["config"]
    out = [f"the training process's side, B={c['B']}, T={c['T']}, {plural(c['workers'], 'worker')}, device cpu, "
           f"{plural(c['rounds'], 'round')} (a row: the median round); load average at the start "
           f"{run['machine']['load_average']}",
           f"next() on ready batches, CPU us (median / mean of {c['batches']} calls): back to back | after "
           f"{c['sleep_ms']:g} ms sleeps, against a bare view after the same | after {c['busy_ms']:g} ms of busy work, "
           f"against a bare view after the same (calls that found no batch ready)"]
    head = ("corpus", "packing", "back to back", "after sleep / floor", "after busy / floor", "ratio after busy")
    rows = [(e["corpus"] or "data", _name(r), f"{r['back_to_back_us']['median']:,.1f} / {r['back_to_back_us']['mean']:,.1f}",
             f"{r['after_sleep_us']['median']:,.1f} / {r['after_sleep_floor_us']['median']:,.1f}",
             f"{r['after_busy_us']['median']:,.1f} / {r['after_busy_floor_us']['median']:,.1f} ({r['after_busy_not_ready']})",
             f"{busy_ratio(r):.2f}x") for e in run["corpora"] for r in e["costs"]]
    out.append(results.table(head, rows))
    out += ["", f"nanochat's loop through the drop-ins (x, y, state = next(loader)): trainer CPU us per batch as fast "
                f"as it goes | next() after {c['busy_ms']:g} ms of busy work | at a trainer's pace, next() after "
                f"{c['step_ms']:g} ms steps (calls that waited) | the last state as JSON"]
    head = ("corpus", "drop-in", "as fast as it goes", "after busy", "trainer's pace", "state JSON us", "state JSON bytes")
    rows = [(e["corpus"] or "data", _name(r), f"{r['trainer_cpu_us_per_batch']:,.0f}", f"{r['after_busy_us']['median']:,.1f}",
             f"{r['paced_us']['median']:,.1f} ({results.fmt(r['paced_not_ready'])})", f"{r['state_json_us']:,.0f}",
             f"{r['state_json_bytes']:,}") for e in run["corpora"] for r in e["dropins"]]
    out.append(results.table(head, rows))
    for e in run["corpora"]:
        got = {r["packing"]: r for r in e["dropins"] if r.get("label") != "before"}
        if {"concat", "bos_bestfit"} <= set(got):
            f, k = got["bos_bestfit"], got["concat"]
            out.append(f"  {e['corpus'] or 'data'}: best fit / concat, trainer's pace "
                       f"{f['paced_us']['median'] / k['paced_us']['median']:.2f}x, as fast as it goes "
                       f"{f['trainer_cpu_us_per_batch'] / k['trainer_cpu_us_per_batch']:.2f}x")
    for r in run["syscalls"]:
        if "error" in r:
            out.append(f"system calls per next(): {r['error']}")
            continue
        names = ", ".join(f"{n} {k}" for k, n in sorted(r["by_name"].items())) or "none"
        out.append(f"system calls per next(), {r['packing']}, {plural(r['workers'], 'worker')}, {r['n']} steps of "
                   f"{r['step_ms']:g} ms busy work then next() (strace, the trainer's main thread): {r['per_next']:.3f} "
                   f"({names}); {r['not_ready']} of {r['n']} calls found no batch ready")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
