"""One source's best fit replayed with a pass-through's cut: which runs of the replay's grid
(tests/unit/packing/bestfit_replay.py) would change, and where each first differs (docs/design.md
"The one pipeline", step 4, "One source's best-fit pieces pass": why `RowCut` and `DocumentCut`
stay two parts).

One source's chunks (`mixchunks.PassingChunks`) are made with `DocumentCut` instead of `RowCut`,
a chunk's end the row after its last document past the nulls (what a pass-through's `OneStream.took`
gives, here without a mixer), each run's trace compared record by record with its own; the
first cap test that differs is shown for one run (`--cap RUN`):

    PYTHONPATH=. python tools/bench/bestfit_cuts.py [--cap w2-g0-long-badnone-fresh-slots2]
"""
import argparse
import json
import sys

sys.path.insert(0, ".")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", default="w2-g0-long-badnone-fresh-slots2", help="a run whose cap tests are shown")
    args = parser.parse_args()

    from shmloader.packing import bestfit, mixbestfit as mb, mixchunks
    from shmloader.packing.mixone import Passing
    from tests.unit.packing import bestfit_replay as replay

    class Ending(Passing):
        def took(self, piece, tokens, documents, row):
            return piece.epoch, piece.file, piece.rg, piece.doc_start + row

    def with_document_cut(B, T, n_slots, buffer_size, chunk_docs, n_prefix, start, stream):
        stream.__class__ = Ending
        chunks = mixchunks.PassingChunks(stream, chunk_docs, start, lambda *_: None, n_prefix,
                                         mixchunks.DocumentCut(chunk_docs, None))
        return mb.BestFitSequencer(B, T, n_slots, buffer_size, n_prefix, chunks=chunks, table=mb.PieceTable(),
                                   sink=bestfit.where_one_source_stands)

    caps, reading_ahead = [], mb.MixBestFitMode._reading_ahead

    def logged(mode):
        seq, may = mode.seq, reading_ahead(mode)
        caps.append((seq.chunks.docs, seq.backlog_docs, seq.chunks.unread(), mode.assigned_docs, mode.cap, may))
        return may

    runs = {name: args_ for name, *args_ in replay.runs()}
    own, own_caps = {}, {}
    mb.MixBestFitMode._reading_ahead = logged
    for name, a in runs.items():
        caps.clear()
        own[name], own_caps[name] = replay.trace_of(*a), list(caps)
    rows_cut = mb.source_sequencer
    mb.source_sequencer = with_document_cut
    first = {}
    for name, a in runs.items():
        caps.clear()
        trace = replay.trace_of(*a)
        if name == args.cap:
            i = next((i for i, (x, y) in enumerate(zip(own_caps[name], caps)) if x[-1] != y[-1]), None)
            if i is not None:
                print(f"{name}: cap test {i + 1} (documents queued, rows waiting, rows not cut, assigned, cap,"
                      " may read)")
                print("  RowCut:     ", own_caps[name][i], "\n  DocumentCut:", caps[i])
        if trace != own[name]:
            old = own[name]
            i = next((i for i, (x, y) in enumerate(zip(trace, old)) if x != y), min(len(trace), len(old)))
            first[name] = (i, old[i] if i < len(old) else None, trace[i] if i < len(trace) else None)
    mb.source_sequencer = rows_cut
    print(f"{len(first)} of {len(runs)} one-source runs differ with the pass-through's cut")
    by_kind = {}
    for name, (_, old, new) in first.items():
        by_kind.setdefault((old and old[0], new and new[0]), []).append(name)
    for (was, now), names in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        print(f"  first differing record {was} -> {now}: {len(names)} runs, e.g. {names[:2]}")
    for name in sorted(first, key=lambda n: first[n][0])[:3]:
        i, old, new = first[name]
        print(f"{name}, record {i}:\n  RowCut:      {json.dumps(old)[:300]}\n  DocumentCut: {json.dumps(new)[:300]}")


if __name__ == "__main__":
    main()
