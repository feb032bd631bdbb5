"""The training loop on a GPU: a small GPT's forward, backward and optimizer step on every
batch, fed by shmloader's drop-in, by nanochat's own loader in the training process, and by that
loader in a background thread (the approach of nanochat PR #832), each against the same loop
over batches already on the device.

    python tools/bench/gpu_train.py --corpus nanochat --models tiny small --workers 8
    python tools/bench/gpu_train.py --device cpu --quick      # the harness alone, without a GPU

Every row runs in a fresh process of its own, one after the other: per model, the ideal (the
loop over `IDEAL_BATCHES` batches already on the device), then each loader. The batch is
nanochat's best fit, `x, y, state = next(loader)`, B=32, T=2048 by default. A row takes
`--warmup` steps (cuDNN/cuBLAS choose their kernels, the loader's read-ahead fills), then times
`--steps` steps:

- step time: the steps' wall time / steps, the device synchronised before and after;
- the GPU's wait for data: per step, the time from the end of the last step's work on the GPU
  to the start of this step's forward (CUDA events recorded after the optimizer step and
  after `next()`): what the device spent idle because the host was still in `next()`; its
  sum / the steps' wall time is the wait share. It misses idle time inside a step (a host
  slowed by a loader thread's hold on the GIL launches late), which "GPU idle vs ideal",
  1 - the ideal's step time / the row's, counts;
- `next()`'s host wall time (median, 99th percentile) and the training process's CPU per step.

The model is a plain pre-norm GPT (`MODELS`: "tiny", 2 layers of width 256, so fast a step
that the loader must keep up with tens of millions of tokens a second; "small", 12 layers of
width 768, a GPT-2-small-like step) in bf16 autocast with fused AdamW, not compiled. Without
CUDA (`--device cpu`) the events are absent and the wait is not measured.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import baseline, children, corpora, results  # noqa: E402
from tools.bench.results import fmt  # noqa: E402

KINDS = ("ideal", "shmloader", "nanochat", "thread")
NAMES = {"ideal": "batches already on the device", "shmloader": "shmloader (drop-in)",
         "nanochat": "nanochat's loader", "thread": "nanochat's loader, thread"}
MODELS = {"tiny": {"n_layer": 2, "d_model": 256, "n_head": 4},
          "small": {"n_layer": 12, "d_model": 768, "n_head": 12}}
IDEAL_BATCHES = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("gpu_train", __doc__)
    p.add_argument("--device", default="cuda", help="the training device (default cuda; cpu: the harness alone)")
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["tiny", "small"],
                   help="models to train (default tiny small)")
    p.add_argument("--loaders", nargs="+", choices=KINDS[1:], default=list(KINDS[1:]),
                   help="loaders to measure against the ideal (default all)")
    p.add_argument("--workers", type=int, default=8, help="shmloader's worker processes (processes; default 8)")
    p.add_argument("--depth", type=int, default=2, help="the thread's queue (batches; default 2)")
    p.add_argument("--batch-size", type=int, default=32, help="B (rows; default 32)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (tokens; default 2048)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (steps; default 20, 3 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (steps; default 100, 10 with --quick)")
    p.add_argument("--quick", action="store_true", help="3 + 10 steps a row, B=2, T=64: the harness")
    corpora.add_args(p, many=False, default="nanochat")
    results.add_json_arg(p, "gpu_train")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.seq_len = 2, 64
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 20)
    args.steps = args.steps or (10 if args.quick else 100)
    if min(args.workers, args.depth, args.batch_size, args.seq_len, args.steps) < 1 or args.warmup < 0:
        p.error("--workers, --depth, --batch-size, --seq-len, --steps must be >= 1, --warmup >= 0")
    corpora.check_args(p, args)
    return args


# ---------------------------------------------------------------- the child: one row

def train_row(cfg: dict) -> dict:
    """One row in this fresh process: `cfg["kind"]`'s batches into the model `cfg["model"]`."""
    import torch

    device = torch.device(cfg["device"])
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = gpt(cfg["vocab"], **MODELS[cfg["model"]]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    it = batches(cfg, device)
    try:
        step = train_step(model, opt, device)
        for _ in range(cfg["warmup"]):
            x, y = next(it)[:2]
            step(x, y)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        n = cfg["steps"]
        done = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else None
        start = [torch.cuda.Event(enable_timing=True) for _ in range(n)] if cuda else None
        next_s, t0, c0 = [], time.perf_counter(), time.process_time()
        if cuda:
            done[0].record()
        for k in range(n):
            a = time.perf_counter()
            x, y = next(it)[:2]
            next_s.append(time.perf_counter() - a)
            if cuda:
                start[k].record()
            step(x, y)
            if cuda:
                done[k + 1].record()
        sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        wait_ms = [done[k].elapsed_time(start[k]) for k in range(n)] if cuda else None
    finally:
        close = getattr(it, "close", None)
        if close:
            close()
    out = {"kind": cfg["kind"], "model": cfg["model"], "steps": n, "step_ms": wall / n * 1e3,
           "tokens_per_s": n * cfg["B"] * cfg["T"] / wall, "cpu_ms_per_step": cpu / n * 1e3,
           "next_ms_median": statistics.median(next_s) * 1e3, "next_ms_p99": _pct(next_s, 0.99) * 1e3,
           "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    if wait_ms is not None:
        out.update(gpu_wait_share=sum(wait_ms) / (wall * 1e3), gpu_wait_ms_median=statistics.median(wait_ms),
                   gpu_wait_ms_max=max(wait_ms))
    return out


def train_step(model, opt, device):
    """A training step: forward and loss in bf16 autocast, backward, optimizer step."""
    import torch

    def step(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def batches(cfg: dict, device):
    """The row's batches on `device`: an iterator of `(x, y, ...)`."""
    B, T = cfg["B"], cfg["T"]
    if cfg["kind"] == "ideal":
        return _on_device_already(cfg["vocab"], B, T, device)
    enc = baseline.load_tiktoken(cfg["tokenizer"])
    if cfg["kind"] == "shmloader":
        from shmloader import nanochat

        return nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(
            enc, B, T, "train", device=str(device), data=cfg["data"], num_workers=cfg["workers"])
    own = baseline.on_device(baseline.loader(corpora.split_files(cfg["data"], "train"), enc, B, T, "bos_bestfit"),
                             str(device))
    return own if cfg["kind"] == "nanochat" else baseline.prefetched(own, cfg["depth"])


def _on_device_already(vocab: int, B: int, T: int, device):
    import torch

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, vocab, (B, T + 1), generator=g).to(device) for _ in range(IDEAL_BATCHES)]
    while True:
        for r in rows:
            yield r[:, :-1], r[:, 1:]


def gpt(vocab: int, n_layer: int, d_model: int, n_head: int):
    """A plain pre-norm GPT whose forward returns the mean cross-entropy of `(x, y)`."""
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.up, self.down = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model, bias=False)

        def forward(self, h):
            B, T, C = h.shape
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2)
                       for t in self.qkv(self.ln1(h)).split(C, dim=2))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            h = h + self.proj(a)
            return h + self.down(F.gelu(self.up(self.ln2(h))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

        def forward(self, x, y):
            h = self.emb(x)
            for block in self.blocks:
                h = block(h)
            logits = self.head(self.ln(h))
            return F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))

    return GPT()


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---------------------------------------------------------------- the parent

def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    corpus = corpora.resolve(args)[0]
    vocab = baseline.load_tiktoken(corpus.tokenizer).n_vocab
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "vocab": vocab, "device": args.device,
           "B": args.batch_size, "T": args.seq_len, "warmup": args.warmup, "steps": args.steps,
           "workers": args.workers, "depth": args.depth}
    rows = []
    with children.checkouts(None) as cks:
        for model in args.models:
            for kind in ("ideal", *args.loaders):
                print(f"{model} model, {NAMES[kind]} ...", file=sys.stderr)
                rows.append(children.run("gpu_train:train_row", dict(cfg, kind=kind, model=model), cks[-1]))
    figures = {"config": {k: cfg[k] for k in ("device", "B", "T", "warmup", "steps", "workers", "depth", "vocab")},
               "corpus": corpus.name or corpus.data, "rows": rows}
    results.publish(args.json, "gpu_train", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"training loop on {c['device']}, B={c['B']}, T={c['T']}, {c['warmup']} warm-up + {c['steps']} timed steps "
           f"a row, shmloader {c['workers']} workers, the thread's queue {c['depth']}; corpus {run['corpus']}"]
    head = ("model", "batches from", "step ms", "vs ideal", "GPU idle vs ideal", "GPU wait share",
            "GPU wait ms median/max", "next() ms median/p99", "trainer CPU ms/step", "tokens/s")
    rows = []
    for r in run["rows"]:
        ideal = next(i for i in run["rows"] if i["model"] == r["model"] and i["kind"] == "ideal")
        wait = r.get("gpu_wait_share")
        rows.append((f"{r['model']} ({r['params_m']:.0f}M)", NAMES[r["kind"]], fmt(r["step_ms"], ",.2f"),
                     f"{r['step_ms'] / ideal['step_ms']:.2f}x", f"{1 - ideal['step_ms'] / r['step_ms']:.1%}",
                     "-" if wait is None else f"{wait:.1%}",
                     "-" if wait is None else f"{r['gpu_wait_ms_median']:.2f} / {r['gpu_wait_ms_max']:.1f}",
                     f"{r['next_ms_median']:.2f} / {r['next_ms_p99']:.1f}", fmt(r["cpu_ms_per_step"], ",.1f"),
                     f"{r['tokens_per_s'] / 1e6:.2f} M"))
    out.append(results.table(head, rows))
    out.append("(GPU wait: the time from the end of a step's work on the device to the start of the next step's "
               "forward, when the host was still in next(); GPU idle vs ideal: 1 - the ideal's step time / this "
               "one's, which also counts the device idle inside a step (launches the host made late); vs ideal: "
               "step time / the same loop's on batches already on the device)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
