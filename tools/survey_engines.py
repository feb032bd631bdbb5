"""Candidate fast engines against tiktoken's encode_ordinary, one core (issue 12).

    python tools/survey_engines.py [--vocab-size 4096] [--out-dir demo_data] [--rounds 5]
                                   [--batch 256] [--fuzz 600] [--no-pin]

Survey only: no test imports this, nothing in shmloader uses it, and none of the engines is a
dependency of shmloader. Each of fastokens, splintr (PyPI name `splintr-rs`, imported as
`splintr`; the PyPI package `splintr` is an unrelated multi-GPU trainer) and gigatoken is used
when importable, and reported as skipped when not.

The definition: the demo tokenizer (`shmloader.demo.prepare_data`: the stdlib corpus, a
byte-level BPE of `--vocab-size` trained offline by rustbpe with nanochat's split pattern, in a
`tiktoken.Encoding`), encoded with `Encoding.encode_ordinary` (special-token text is ordinary).
Nothing is downloaded: every engine gets the Encoding's mergeable ranks (as .tiktoken rank
file bytes), its split pattern and its special tokens, in the way each API allows:
- fastokens: `Tokenizer.from_tiktoken(path, pattern=, special_tokens=)`, encoded with
  `split_special_tokens=True`, as shmloader/engine.py builds it;
- splintr: `Tokenizer.from_bytes(ranks, pattern, special_tokens)` with the pattern as it is;
  its regex engine (regexr) rejects possessive quantifiers, so it is retried with them made
  greedy (`?+` `*+` `++` `{m,n}+` -> `?` `*` `+` `{m,n}`; equivalent for nanochat's pattern, not for
  every pattern: the identity counts below are the evidence);
- gigatoken: takes no regex. `Tokenizer.from_tiktoken(path, pretokenizer=)` wants one of its
  hand-coded scheme names, and a tokenizer.json whose Split regex it does not know is refused;
  both are tried with the Encoding's pattern and the refusal is printed. It is then built with
  the nearest scheme, "gpt4" (cl100k's pattern: `\\p{N}{1,3}` where nanochat has `{1,2}`), so
  the counts show what that substitution costs, and with no special tokens (gigatoken always
  matches special-token text inside a document). A control compares it with a tiktoken
  Encoding of the same ranks and cl100k's pattern: is it right about the scheme it has?

Measured, per engine and API (per-document encode, and the batch API on `--batch` documents):
1. identity with encode_ordinary: the number of texts whose ids differ (a) over every document
   of the demo corpus (all 4 files) and (b) over a fuzz set of adversarial strings (special-token
   text, whitespace, digit and repeated-letter runs, non-ASCII, emoji, combining marks, control
   characters, the empty string, mixed scripts, random strings; valid Unicode only: parquet text
   has no lone surrogates);
2. speed on the train split (the first 3 files), the methods interleaved, best of `--rounds`
   passes, as reference tokens/s (tokens of encode_ordinary per second, the same work for every
   method), against tiktoken encode_ordinary and against fastokens' per-document encode (as
   engine.py encodes); each pass uses a fresh instance of the engine (splintr and gigatoken keep
   caches of encoded chunks: this measures one pass of a worker that starts cold), and reports
   the process's CPU time per wall second (1.00: one core);
3. threads: `RAYON_NUM_THREADS=1` and `FASTOKENS_BPE_THREADS=1` are set before any engine is
   imported (`--no-pin` leaves them unset, to see what pinning changes) and the threads of this
   process (/proc/self/task) are counted before each engine is built and after it has encoded,
   by every API, a batch and texts long enough to start a thread pool.
On a 2-core VM the absolute numbers are noisy; the ratios of one run are what to compare.
"""
from __future__ import annotations

import argparse
import base64
import importlib.metadata
import importlib.util
import json
import os
import pickle
import random
import re
import sys
import tempfile
import time

PIN = {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}
if "--no-pin" not in sys.argv:
    os.environ.update(PIN)  # before any engine is imported: rayon reads it once
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

# cl100k_base's pattern as tiktoken_ext.openai_public defines it (gigatoken's "gpt4" scheme)
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++"""
                  r"""[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def rank_bytes(enc) -> bytes:
    ranks = enc._mergeable_ranks
    return b"".join(base64.b64encode(p) + b" %d\n" % r for p, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def greedy(pattern: str) -> str:
    """Possessive quantifiers made greedy: `?+` `*+` `++` `{m,n}+` -> `?` `*` `+` `{m,n}` (an escaped
    `\\?`, `\\*` or `\\+` is a literal, not a quantifier; character classes are not parsed)."""
    return re.sub(r"(\{\d+(?:,\d*)?\}|(?<!\\)[?*+])\+", r"\1", pattern)


# ------------------------------------------------------------------ the fuzz set

def fuzz_texts(enc, n_random: int, seed: int = 12) -> list[str]:
    rng = random.Random(seed)
    specials = sorted(enc._special_tokens) + ["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>"]
    texts = ["", " ", "\n", "a", "0", "'s", "<|bos|>" * 30, "".join(specials), " ".join(specials),
             f"text {specials[0]}more{specials[1]} end", "<|bos", "bos|>", "<||>", "<|<|bos|>|>"]
    for n in (1, 2, 3, 4, 5, 17, 256, 5000):
        texts += [" " * n, "\n" * n, "\t" * n, "\r\n" * n, " \n" * n, "\u00a0" * n, "\u3000" * n,
                  " " * n + "x", "x" + " " * n, "x" + " " * n + "y", "\n" * n + " x", "1" * n,
                  "9" * n + " " + "0" * n, "12 " * n, "a" * n, "\u0663" * n, "\uff11" * n, "\u2460" * n]
    texts += ["3.14159265358979" * 50, "  12  345  6789  " * 40, "a" * 10000, "ab" * 5000,
              "naïve café ünïcödé 日本語のテキスト 😀😀😀 " * 20, "Ελληνικά русский עברית العربية हिन्दी",
              "'s 've 're 'll 'd 'S 'VE 'Ll 'dd ’s", "\x00\x01\x7f\u200b\ufeff\u200d\u2028\u2029",
              "👨‍👩‍👧‍👦 🇫🇷🇯🇵 👍🏽 ❤️ 1️⃣", "e\u0301\u0301\u0301 a\u0308 \u0915\u094d\u0937",
              "中文English混合123テキスト한국어😀mixed", "x²³ ½ ⅓ Ⅻ ० १ २", "\U0001F600" * 300,
              "def f(x):\n\treturn x  # comment\n\n\n    ", "http://example.com/a?b=1&c=2#d",
              "x  \n  ", "a\n\n  \n", "end \t\r\n \u00a0"]
    alphabet = " \t\n\r0123456789abcXYZ.,'!é日😀<|>_-\u00a0\u0301"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200))) for _ in range(n_random // 2)]
    blocks = [(0x20, 0x7f), (0xa0, 0x250), (0x370, 0x530), (0x590, 0x700), (0x900, 0x980), (0x3040, 0x3100),
              (0x4e00, 0x4f00), (0xac00, 0xad00), (0x1f300, 0x1f650), (0x2000, 0x2070), (0xff00, 0xff60)]

    def char():
        lo, hi = rng.choice(blocks)
        return chr(rng.randrange(lo, hi))
    texts += ["".join(char() if rng.random() < 0.6 else rng.choice(" \n0123456789") for _ in range(rng.randint(1, 120)))
              for _ in range(n_random - n_random // 2)]
    return texts


# ------------------------------------------------------------------ the engines

class Candidate:
    """An engine: `make()` builds a fresh instance and returns its encoders, `({label: text -> ids},
    {label: list of texts -> list of ids})`; `notes` say how it was built."""

    def __init__(self, name, dist, make, notes):
        self.name, self.dist, self.version = name, dist, version(dist)
        self.make, self.notes = make, notes
        self.doc, self.batch = make()
        self.threads_before = self.threads_after = None

    def refresh(self):
        """A fresh instance (before each timed pass: splintr and gigatoken keep chunk caches)."""
        self.doc, self.batch = self.make()


def _flat(pair):
    ids, offsets = pair
    ids, offsets = np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64)
    return [ids[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def build_fastokens(enc, rank_path):
    import fastokens

    def make():
        tok = fastokens.Tokenizer.from_tiktoken(rank_path, pattern=enc._pat_str,
                                                special_tokens=dict(enc._special_tokens))
        flat = tok.encode_batch_flat
        return ({"encode_batch_flat([doc])": lambda t: np.frombuffer(flat([t], split_special_tokens=True)[0], np.uint32)},
                {"encode_batch_flat(batch)": lambda ts: _flat(flat(ts, split_special_tokens=True))})
    return Candidate("fastokens", "fastokens", make,
                     ["from_tiktoken(ranks, pattern=<as is>, special_tokens=...), encoded with "
                      "split_special_tokens=True (as shmloader/engine.py)"])


def build_splintr(enc, rank_path):
    import splintr

    ranks, specials, pattern, notes = rank_bytes(enc), dict(enc._special_tokens), enc._pat_str, []
    try:
        splintr.Tokenizer.from_bytes(ranks, pattern, specials)
        notes.append("from_bytes(ranks, <pattern as is>, special_tokens)")
    except Exception as exc:  # noqa: BLE001 - what it says is the finding
        pattern = greedy(pattern)
        notes.append(f"<pattern as is> refused: {str(exc).splitlines()[0]}")
        notes.append(f"built with possessive quantifiers made greedy: from_bytes(ranks, {pattern!r}, special_tokens)")

    def make():
        tok = splintr.Tokenizer.from_bytes(ranks, pattern, specials)
        return ({"encode_ordinary(doc)": tok.encode_ordinary,
                 "encode_flat(doc)": lambda t: np.frombuffer(tok.encode_flat(t), np.uint32)},
                {"encode_batch_flat(batch)": lambda ts: _flat(tok.encode_batch_flat(ts))})
    return Candidate("splintr", "splintr-rs", make, notes)


def build_gigatoken(enc, rank_path):
    import gigatoken

    notes = []
    for how, attempt in (("from_tiktoken(ranks, pretokenizer=<the pattern>)",
                          lambda: gigatoken.Tokenizer.from_tiktoken(rank_path, pretokenizer=enc._pat_str)),
                         ("from_json(<tokenizer.json: BPE + Split(<the pattern>) + ByteLevel>)",
                          lambda: gigatoken.Tokenizer.from_json(hf_json(enc)))):
        try:
            attempt()
            notes.append(f"{how}: accepted (unexpected: check it)")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{how}: refused ({type(exc).__name__}: {str(exc).splitlines()[0][:70]}...)")
    with_specials = gigatoken.Tokenizer.from_tiktoken(rank_path, pretokenizer="gpt4",
                                                      special_tokens=dict(enc._special_tokens))
    probe = "a <|bos|> b"
    notes.append(f"with special_tokens=: encode({probe!r}) = {with_specials.encode(probe).tolist()}, "
                 f"encode_ordinary {enc.encode_ordinary(probe)} (special-token text is always special)")
    notes.append('measured: from_tiktoken(ranks, pretokenizer="gpt4"), no special tokens: cl100k\'s split, '
                 'NOT the Encoding\'s pattern')

    def make():
        tok = gigatoken.Tokenizer.from_tiktoken(rank_path, pretokenizer="gpt4")

        def batch(texts):  # an awkward ListOffsetArray: its flat ids and offsets, without copies
            layout = tok.encode_batch(texts, parallel=False).layout
            ids, offsets = np.asarray(layout.content.data), np.asarray(layout.offsets.data)
            return [ids[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        return {"encode(doc)": tok.encode}, {"encode_batch(batch, parallel=False)": batch}
    c = Candidate("gigatoken", "gigatoken", make, notes)
    c.control = CL100K_PATTERN  # is it right about the scheme it implements?
    return c


def hf_json(enc) -> str:
    """A byte-level BPE tokenizer.json of `enc` (vocab, merges, Split(pattern) + ByteLevel)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs + [256 + k for k in range(256 - len(bs))]
    bs += [b for b in range(256) if b not in bs]
    b2u = dict(zip(bs, map(chr, cs)))
    u = lambda b: "".join(b2u[x] for x in b)
    ranks = enc._mergeable_ranks
    merges = []
    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = [bytes([x]) for x in tok]
        while len(parts) > 2:  # the merge that made `tok`: BPE of its bytes with lower ranks
            i = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 62))
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append([u(parts[0]), u(parts[1])])
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s, i in enc._special_tokens.items()],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": enc._pat_str}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {u(t): r for t, r in ranks.items()}, "merges": merges}})


# ------------------------------------------------------------------ measuring

def mismatches(reference, texts, encode=None, batch=None, size=256) -> tuple[int, str]:
    """Texts whose ids differ from `reference` (a list of id lists); the first one, shortened."""
    if encode is not None:
        got = [np.asarray(encode(t)) for t in texts]
    else:
        got = [np.asarray(ids) for k in range(0, len(texts), size) for ids in batch(texts[k:k + size])]
    bad = [i for i, (r, g) in enumerate(zip(reference, got)) if len(r) != len(g) or not np.array_equal(r, g)]
    return len(bad), (repr(texts[bad[0]][:40]) if bad else "")


def run_doc(encode, texts):
    return sum(len(encode(t)) for t in texts)


def run_batch(batch, texts, size):
    return sum(len(ids) for k in range(0, len(texts), size) for ids in batch(texts[k:k + size]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="demo_data", help="demo data directory (prepare_data; default demo_data)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5, help="timed passes per method, interleaved (best is kept)")
    ap.add_argument("--batch", type=int, default=256, help="documents per batch-API call (a row group)")
    ap.add_argument("--fuzz", type=int, default=600, help="random strings in the fuzz set (plus ~170 fixed ones)")
    ap.add_argument("--no-pin", action="store_true", help="leave RAYON_NUM_THREADS/FASTOKENS_BPE_THREADS unset")
    args = ap.parse_args()

    from shmloader.demo import prepare_data
    from shmloader.demo.baseline import documents

    demo = prepare_data(args.out_dir, args.vocab_size)
    files = sorted(str(p) for p in demo.data_dir.glob("*.parquet"))
    corpus = [t for _, t in documents(files, epochs=1) if t is not None]
    train = [t for _, t in documents(files[:-1], epochs=1) if t is not None]
    with open(demo.tokenizer_path, "rb") as f:
        enc = pickle.load(f)
    fuzz = fuzz_texts(enc, args.fuzz)
    ref_corpus = [enc.encode_ordinary(t) for t in corpus]
    ref_fuzz = [enc.encode_ordinary(t) for t in fuzz]
    train_tokens = sum(len(enc.encode_ordinary(t)) for t in train)
    print(f"tiktoken {version('tiktoken')}, {enc.n_vocab}-token BPE ({len(enc._mergeable_ranks)} ranks, "
          f"{len(enc._special_tokens)} special tokens), pattern {enc._pat_str!r}")
    print(f"corpus: {len(corpus)} documents ({sum(map(len, corpus)) / 1e6:.1f} M characters); train split "
          f"{len(train)} documents, {train_tokens / 1e6:.2f} M tokens; fuzz: {len(fuzz)} strings; "
          f"threads pinned: {'no' if args.no_pin else ', '.join(f'{k}={v}' for k, v in PIN.items())}; "
          f"{len(os.sched_getaffinity(0))} cores\n")

    tmp = tempfile.NamedTemporaryFile("wb", suffix=".tiktoken")
    tmp.write(rank_bytes(enc))
    tmp.flush()
    candidates = []
    for name, builder in (("fastokens", build_fastokens), ("splintr", build_splintr), ("gigatoken", build_gigatoken)):
        if importlib.util.find_spec(name) is None:
            print(f"{name}: not installed, skipped (pip install {'splintr-rs' if name == 'splintr' else name})")
            continue
        before = threads()
        try:
            c = builder(enc, tmp.name)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: could not be built: {type(exc).__name__}: {exc}")
            continue
        # a batch, and texts long enough to start a pool (fastokens starts its thread at ~100-300 k characters)
        warm = train[:args.batch] + ["warm up 0123, the engine's threads " * n for n in (1000, 30000)]
        for encode in c.doc.values():
            for t in warm:
                encode(t)
        for batch in c.batch.values():
            batch(warm)
        c.threads_before, c.threads_after = before, threads()
        candidates.append(c)

    # 1. identity
    for c in candidates:
        print(f"{c.name} {c.version}")
        for note in c.notes:
            print(f"  build: {note}")
        for label, encode in c.doc.items():
            (nc, ec), (nf, ef) = mismatches(ref_corpus, corpus, encode), mismatches(ref_fuzz, fuzz, encode)
            print(f"  {label:38s} differs from encode_ordinary on {nc}/{len(corpus)} corpus documents"
                  f"{' (first ' + ec + ')' if nc else ''}, {nf}/{len(fuzz)} fuzz strings{' (first ' + ef + ')' if nf else ''}")
        for label, batch in c.batch.items():
            (nc, ec), (nf, ef) = (mismatches(ref_corpus, corpus, batch=batch, size=args.batch),
                                  mismatches(ref_fuzz, fuzz, batch=batch, size=args.batch))
            print(f"  {label:38s} differs from encode_ordinary on {nc}/{len(corpus)} corpus documents"
                  f"{' (first ' + ec + ')' if nc else ''}, {nf}/{len(fuzz)} fuzz strings{' (first ' + ef + ')' if nf else ''}")
        if hasattr(c, "control"):
            import tiktoken

            ctl = tiktoken.Encoding("control", pat_str=c.control, mergeable_ranks=enc._mergeable_ranks, special_tokens={})
            encode = next(iter(c.doc.values()))
            (nc, _), (nf, ef) = (mismatches([ctl.encode_ordinary(t) for t in corpus], corpus, encode),
                                 mismatches([ctl.encode_ordinary(t) for t in fuzz], fuzz, encode))
            print(f"  control: vs tiktoken with the same ranks and cl100k's pattern: {nc}/{len(corpus)} corpus "
                  f"documents, {nf}/{len(fuzz)} fuzz strings differ{' (first ' + ef + ')' if nf else ''}")
    print()

    # 2. speed, interleaved
    methods = {"tiktoken encode_ordinary(doc)": (lambda: None, lambda: run_doc(enc.encode_ordinary, train)),
               "tiktoken encode_to_numpy(doc)": (lambda: None, lambda: run_doc(
                   lambda t: enc.encode_to_numpy(t, disallowed_special=()), train))}
    for c in candidates:
        for label in c.doc:
            methods[f"{c.name} {label}"] = (c.refresh, lambda c=c, l=label: run_doc(c.doc[l], train))
        for label in c.batch:
            methods[f"{c.name} {label}"] = (c.refresh, lambda c=c, l=label: run_batch(c.batch[l], train, args.batch))
    rates = {name: [] for name in methods}
    cpu = {name: [] for name in methods}        # process CPU seconds per wall second: 1.0 = one core
    started = {name: 0 for name in methods}     # threads the first pass of a method started
    for r in range(args.rounds):
        for name, (fresh, run) in methods.items():
            fresh()
            n0, c0, t0 = threads(), time.process_time(), time.perf_counter()
            run()
            wall = time.perf_counter() - t0
            rates[name].append(train_tokens / wall)
            cpu[name].append((time.process_time() - c0) / wall)
            if r == 0:
                started[name] = threads() - n0
    base = max(rates["tiktoken encode_ordinary(doc)"])
    fast = max(rates.get("fastokens encode_batch_flat([doc])", [0])) or None
    print(f"speed, train split, best of {args.rounds} interleaved passes (reference tokens/s):")
    for name, got in rates.items():
        vs_fast = f"{max(got) / fast:5.2f}x fastokens/doc" if fast else ""
        print(f"  {name:44s} {max(got) / 1e6:6.2f} M/s {max(got) / base:5.2f}x tiktoken {vs_fast}  "
              f"max cpu/wall {max(cpu[name]):.2f}, +{started[name]} threads  (passes: {', '.join(f'{r / 1e6:.2f}' for r in got)})")
    print("\nthreads of this process (/proc/self/task), each engine built then warmed up on a batch and a "
          "long text by every API: " + "; ".join(
              f"{c.name} {c.threads_before} -> {c.threads_after} (+{c.threads_after - c.threads_before})"
              for c in candidates) + f"; after all timed passes: {threads()}")


if __name__ == "__main__":
    main()
