"""nanochat's real `scripts/base_train.py` on the CPU, with its own loader and with shmloader's
drop-in (its one import line changed), each evaluation's first val batch timed.

    python tools/bench/base_train.py --nanochat ~/src/nanochat --data /tmp/bq/nanochat_corpus/base_data \
        --tokenizer /tmp/bq/tokenizer/tokenizer.pkl --rounds 2

Needs a nanochat checkout (not a dependency of shmloader: `git clone` it, or the bench's
fetched copy) and the packages its base_train imports (torch, tiktoken, rustbpe, pyarrow,
filelock, pyyaml, requests; `wandb` is stubbed: the run is `--run=dummy`). Per round and
loader, in turn: the checkout is copied into a scratch directory, `base_train.py` is patched
(the loader import for shmloader; for both, `build_val_loader` wrapped so that the time from
its call to the first val batch is printed: the previous val loader is dropped at the
assignment, as in the script), and run with a tiny model (`--depth=2`, B=16, T=2048,
`--eval-every=4`, 12 steps: 4 evaluations). `NANOCHAT_BASE_DIR` is a scratch directory
holding `--data` (as `base_data_climbmix`), `--tokenizer` and the `token_bytes.pt` that
nanochat's tok_train would write. Prints every evaluation's ms, the val bpb (equal for both
loaders: the same stream) and the run's wall time, and writes them to the results file (`--json`).
"""
from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import results  # noqa: E402

REPO = results.REPO
IMPORT = ("from nanochat.dataloader import tokenizing_distributed_data_loader_bos_bestfit, "
          "tokenizing_distributed_data_loader_with_state_bos_bestfit")
BUILD = ('build_val_loader = lambda: tokenizing_distributed_data_loader_bos_bestfit(tokenizer, '
         'args.device_batch_size, args.max_seq_len, split="val", device=device)')
TIMER = '''
_build_val_loader = build_val_loader
def build_val_loader():  # tools/bench/base_train.py: the call to the first val batch
    _t0 = time.perf_counter()
    _g = _build_val_loader()
    def _timed():
        _first = next(_g)
        print(f"FIRSTVAL {(time.perf_counter() - _t0) * 1e3:.1f} ms", flush=True)
        yield _first
        yield from _g
    return _timed()'''
ARGS = ["--device-type=cpu", "--depth=2", "--aspect-ratio=32", "--head-dim=32", "--max-seq-len=2048",
        "--device-batch-size=16", "--total-batch-size=32768", "--num-iterations=12", "--eval-every=4",
        "--eval-tokens=131072", "--core-metric-every=-1", "--sample-every=-1", "--window-pattern=L", "--run=dummy"]


def patched(nanochat: Path, into: Path, loader: str) -> Path:
    if not (nanochat / "scripts" / "base_train.py").is_file():
        raise SystemExit(f"{nanochat}: no scripts/base_train.py: give a nanochat work tree (a bare git directory: "
                         f"`git -C DIR archive HEAD | tar -x -C OUT` makes one)")
    shutil.copytree(nanochat, into, ignore=shutil.ignore_patterns(".git"))
    script = into / "scripts" / "base_train.py"
    text = script.read_text()
    if IMPORT not in text or BUILD not in text:
        raise SystemExit(f"{script}: the loader import or build_val_loader line is not nanochat's as this tool "
                         f"knows it; patch it by hand")
    if loader == "shmloader":
        text = text.replace(IMPORT, IMPORT.replace("nanochat.dataloader", "shmloader.nanochat"))
    script.write_text(text.replace(BUILD, BUILD + TIMER))
    return into


def base_dir(root: Path, data: str, tokenizer: str) -> Path:
    import torch

    base = root / "base"
    (base / "tokenizer").mkdir(parents=True)
    os.symlink(os.path.abspath(data), base / "base_data_climbmix")
    shutil.copy(tokenizer, base / "tokenizer" / "tokenizer.pkl")
    with open(tokenizer, "rb") as f:
        enc = pickle.load(f)
    enc = getattr(enc, "enc", enc)
    special = set(enc._special_tokens.values())  # noqa: SLF001 (as nanochat's tok_train counts them)
    sizes = [0 if i in special else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)]
    torch.save(torch.tensor(sizes, dtype=torch.int32), base / "tokenizer" / "token_bytes.pt")
    return base


def run(repo: Path, base: Path, stubs: Path, timeout: float) -> dict:
    env = dict(os.environ, NANOCHAT_BASE_DIR=str(base), OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))),
               PYTHONPATH=os.pathsep.join([str(stubs), str(repo), str(REPO)]))
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "scripts.base_train", *ARGS], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - began
    if out.returncode != 0:
        raise SystemExit(f"base_train failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return {"first_val_ms": [float(x) for x in re.findall(r"FIRSTVAL ([\d.]+) ms", out.stdout)],
            "val_bpb": [float(x) for x in re.findall(r"Validation bpb: ([\d.]+)", out.stdout)], "wall_s": wall}


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("base_train", __doc__)
    p.add_argument("--nanochat", required=True, type=Path, help="a nanochat work tree (directory)")
    p.add_argument("--data", required=True, help="a directory of parquet shards (the last one is val)")
    p.add_argument("--tokenizer", required=True, help="a pickled tiktoken.Encoding with <|bos|> (file)")
    p.add_argument("--rounds", type=int, default=1, help="runs of base_train with each loader, in turn (runs; default 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="limit of one base_train run (seconds; default 900)")
    results.add_json_arg(p, "base_train")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    loaders = {"nanochat": [], "shmloader": []}
    with tempfile.TemporaryDirectory(prefix="shmloader-base-train-") as tmp:
        root = Path(tmp)
        stubs = root / "stubs" / "wandb"
        stubs.mkdir(parents=True)
        (stubs / "__init__.py").write_text("")  # imported at the top; --run=dummy never uses it
        base = base_dir(root, args.data, args.tokenizer)
        repos = {"nanochat": patched(args.nanochat, root / "own", "nanochat"),
                 "shmloader": patched(args.nanochat, root / "shm", "shmloader")}
        for i in range(args.rounds):
            for name, repo in repos.items():
                print(f"round {i + 1}/{args.rounds}: base_train with {name}'s loader ...", file=sys.stderr)
                got = run(repo, base, root / "stubs", args.timeout)
                loaders[name].append(got)
                print(f"{name:>9}: first val batch ms {' '.join(f'{t:.0f}' for t in got['first_val_ms'])}; "
                      f"val bpb {' '.join(f'{b:.6f}' for b in got['val_bpb'])}; run {got['wall_s']:.0f} s")
    figures = {"config": {"nanochat": str(args.nanochat), "nanochat_commit": results.commit(args.nanochat),
                          "data": os.path.abspath(args.data), "args": ARGS, "rounds": args.rounds}, "loaders": loaders}
    results.write(args.json, "base_train", began, figures, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
