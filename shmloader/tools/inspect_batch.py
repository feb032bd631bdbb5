"""Print one batch of the stream, decoded, and the resume state that comes with it.

    shmloader-inspect-batch --data demo_data/base_data --tokenizer demo_data/tokenizer -B 4 -T 256 --batch 3
    shmloader-inspect-batch ... --resume-state state.json --batch 0   # the batch after that state
    shmloader-inspect-batch --data code/ --column content --shuffle --seed 3   # as the loader's options

(also `python -m shmloader.tools.inspect_batch`, and in a checkout `python tools/inspect_batch.py`)

Batch N is counted from 0 at the start of the split, or from the batch after `--resume-state`
(a JSON file holding a state dict, as the loader yields it or as nanochat saves it). Each of
the B rows (its T input tokens) is decoded and shown on one line, cut to `--chars` characters,
with each BOS token shown as `--bos-mark` and newlines as \\n. The state dict that the loader
yields with that batch follows as JSON: hand it to `--resume-state` to continue after it.
"""
import argparse
import json
import sys
from pathlib import Path

from shmloader.config import SPLITS
from shmloader.data.shuffle import WINDOW


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None,
                   help="the loader's data=: a directory, glob or file of data files (parquet, JSON Lines, "
                        "Arrow IPC; a Hugging Face datasets directory) (default: nanochat's, "
                        "$NANOCHAT_BASE_DIR/base_data_climbmix, else base_data)")
    p.add_argument("--column", default="text",
                   help="the column the documents are in, as the loader's column= (default text)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.pkl, tokenizer.json, a SentencePiece .model, or their directory "
                        "(default: $NANOCHAT_BASE_DIR/tokenizer)")
    p.add_argument("-B", "--batch-size", type=int, default=4, help="rows per batch (rows; default 4)")
    p.add_argument("-T", "--seq-len", type=int, default=256, help="tokens per row (tokens; default 256)")
    p.add_argument("--split", choices=SPLITS, default="train",
                   help="split: train (every file but the last), val (the last), all (default train)")
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat",
                   help="how documents are packed into rows (default concat)")
    p.add_argument("--shuffle", action="store_true",
                   help="the loader's shuffle=True: units and documents in an order drawn from --seed")
    p.add_argument("--seed", type=int, default=0, help="the shuffle's seed, as the loader's seed= (default 0)")
    p.add_argument("--shuffle-window", type=int, default=None,
                   help=f"documents a shuffled window holds at least (consecutive units of the rank's share, "
                        f"their documents shuffled together), as the loader's shuffle_window= (default {WINDOW})")
    p.add_argument("--batch", type=int, default=0, help="which batch to show, from 0 (index; default 0)")
    p.add_argument("--resume-state", type=Path, default=None, metavar="FILE.json",
                   help="start after this saved state dict (JSON file)")
    p.add_argument("--chars", type=int, default=160, help="characters shown per row (characters; default 160)")
    p.add_argument("--bos-mark", default="⟨BOS⟩", help="how a BOS token is shown (default ⟨BOS⟩)")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes (processes; default 2)")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.seq_len < 1 or args.batch < 0 or args.chars < 1 or args.workers < 1:
        p.error("-B, -T, --chars and --workers must be >= 1 and --batch >= 0")
    return args


def make_decoder(tokenizer):
    """`(bos, ids -> text)` for what the loader is given: tiktoken, Hugging Face, SentencePiece,
    or an object with decode() (else the ids are shown as numbers)."""
    import pickle

    from shmloader.data import spm, tokenizer as tokmod

    spec = tokmod.resolve(tokenizer)
    if spec.kind == "sp":
        sp = spm.processor(spec)
        return spec.bos, lambda ids: sp.decode(ids)
    if spec.kind == "hf":  # the payload is the tokenizer.json text
        from tokenizers import Tokenizer

        hf = Tokenizer.from_str(spec.payload.decode())
        return spec.bos, lambda ids: hf.decode(ids, skip_special_tokens=False)
    obj = pickle.loads(spec.payload)
    if spec.kind == "tiktoken":
        return spec.bos, lambda ids: obj.decode(ids, errors="replace")
    if not callable(getattr(obj, "decode", None)):
        return spec.bos, lambda ids: " ".join(str(i) for i in ids)
    return spec.bos, lambda ids: obj.decode(ids)


def show_row(ids: list, bos: int, decode, mark: str) -> str:
    """Decode one row, a document at a time, so that BOS is visible wherever it falls."""
    parts, run = [], []
    for i in ids + [bos]:
        if i == bos:
            if run:
                parts.append(decode(run))
            parts.append(mark)
            run = []
        else:
            run.append(i)
    text = "".join(parts[:-1])  # drop the sentinel BOS
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def main(argv=None) -> int:
    args = parse_args(argv)
    resume = json.loads(args.resume_state.read_text()) if args.resume_state else None
    from shmloader.loader import ShmLoader

    tokenizer = args.tokenizer
    bos, decode = make_decoder(tokenizer)
    B, T = args.batch_size, args.seq_len
    with ShmLoader(args.data, tokenizer, B, T, args.split, packing=args.packing, num_workers=args.workers,
                   device="cpu", resume_state=resume, column=args.column, shuffle=args.shuffle,
                   shuffle_window=args.shuffle_window,
                   seed=args.seed) as loader:
        for _ in range(args.batch + 1):
            inputs, _targets = next(loader)
        state = loader.state_dict()
    print(f"batch {args.batch} of split {args.split!r} ({args.packing})" + (f" after {args.resume_state}" if resume else "")
          + f": B={B} rows of T={T} tokens (showing {args.chars} characters; BOS as {args.bos_mark})")
    for r in range(B):
        ids = inputs[r].tolist()
        text = show_row(ids, bos, decode, args.bos_mark)
        more = "..." if len(text) > args.chars else ""
        print(f"row {r} ({ids.count(bos)} BOS): {text[:args.chars]}{more}")
    print("state dict:")
    print(json.dumps(state, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
