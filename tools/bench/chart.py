"""The throughput chart: tokens/s read against worker count on a run's first corpus, shmloader's
packings as lines (concat's annotated with its ratio to the baseline), the baseline as a level,
bare engine processes as the ceiling (matplotlib)."""
from __future__ import annotations

from pathlib import Path

from tools.bench import results


def draw(run: dict, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench: --chart draws with matplotlib, which is not installed: "
                         "pip install matplotlib (or omit --chart)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entry, c = run["corpora"][0], run["config"]
    rows = [r for r in entry["rows"] if r.get("label") != "before"]
    base = rows[0]["tokens_per_s"] / 1e6
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for packing, style, what in (("concat", "o-", "concat"), ("bos_bestfit", "s--", "best fit (tokens read)")):
        got = sorted((r["workers"], r["tokens_per_s"] / 1e6, r) for r in rows[1:] if r["packing"] == packing)
        if got:
            ax.plot([w for w, _, _ in got], [t for _, t, _ in got], style, label=f"shmloader, {what}")
        for w, t, r in got if packing == "concat" else []:  # vs base: the median of the per-round ratios
            x = results.median(r.get("vs_base_rounds") or [t / base])
            ax.annotate(f"{x:.2f}x", (w, t), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.axhline(base, color="gray", linestyle="--", label="nanochat-style loader (in-process, 4 threads)")
    for kind, style, what in (("bare", "^:", "processes side by side (no loader)"),
                              ("bare_read", "v:", "processes that read too (no loader)")):
        got = [b for b in entry["bare"] if b.get("kind", "bare") == kind]
        if got:
            ax.plot([b["processes"] for b in got], [b["tokens_per_s"] / 1e6 for b in got], style,
                    color="green" if kind == "bare" else "olive", label=f"bare {got[0]['engine']} {what}")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("M tokens/s read")
    ax.set_xticks(sorted({r["workers"] for r in rows[1:]}))
    ax.set_ylim(bottom=0)
    ax.set_title(f"{entry['corpus'] or 'data'} corpus, B={c['B']}, T={c['T']}, {run['machine']['cores']} cores, "
                 f"{run['date'][:10]}, {run['commit']}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"chart written to {path}")
