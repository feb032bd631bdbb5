"""What every packing shares: its spec, its mode's interface, and their bookkeeping.

A packing is one module (`concat.py`, `bestfit.py`) that builds a `Packing`: the spec that
tells the rest of the loader what it needs to know (the slot's window, where targets start,
its resume fields, how a worker keeps and writes its tokens and the locator of a count-only
run), so that nothing outside the module branches on which packing runs; its coordinator modes,
over one source and over a mixture, are registered beside it (`packing.MODES`). A *mode* turns
counted pieces into write orders and complete batches; the coordinator (procs/coordinator.py)
only moves its messages and never looks inside it. `mixcount.MixCountMode` (and
`SourceCountMode`) is the mode of a run that only finds a position.

`BatchBook` is the bookkeeping every sequencer needs: which batches may be written (at most
`n_slots` between their first order and their free), how many tokens each still waits for,
and which are complete, in order. `InOrder` takes what arrives by index in any order and
hands it out in index order (pieces are counted in any order, used in stream order).
`SlotMap` says which ring slot holds which batch. `Stops` holds the pieces that cannot be
read until the stream needs them. Pure logic: no processes, no tokens. See NOTE [ring
protocol] in ipc/protocol.py.

A piece that cannot be read (a `DataError` on it: `Mode.failed`) is never counted, and the
workers read ahead of the stream, so its error is not raised when it is found: the mode's
stream stops at the first such piece in stream order, every batch that does not need it is
announced, and then its error goes to the trainer, once (`Mode.messages`, each mode's rule of
when its stream needs the piece). So the error comes at the same batch for any number of
workers and any timing, after every batch before it.

What a worker may hold (`Mode.can_take`): work is given so that no worker idles behind
another's long piece, and memory stays bounded whatever the trainer's pace. A worker takes a
new piece while it has fewer than 2 pieces given and not yet counted (one in progress, one
queued), or up to `MAX_IN_FLIGHT` of them while they hold less than a piece's worth of text
(`max_piece_bytes`: many tiny row groups in a row); and while the tokens it holds counted but
not yet written into the ring (the stream needs an earlier piece first, or the ring is full)
are fewer than its budget, in fewer than `MAX_HELD_PIECES` pieces. The budget is a ring of
tokens, or the tokens of the largest piece another worker is tokenizing (its text bytes times
the tokens per byte of the pieces counted so far), whichever is more: so a worker whose
finished pieces wait behind another's long piece keeps working about as long as that piece
takes, and otherwise holds no more than a ring. With more workers than the cores
(`cfg.workers_at_once`, cores.py `at_once`), at most as many workers as the cores have pieces
given and not counted, each within the bounds above (a worker with none takes one only while
fewer do): the stream takes pieces in order, and the one it needs next then has a core's share
of the time, not a worker's; and a worker that read a row group may keep its next slices, so
that no other reads it again.

Which worker gets the next piece (`Mode.pick`, the rule in affinity.py): an idle one first,
else one that read its row group when the loads allow, else the least loaded;
`can_continue` says whether a worker may take the next slice of the row group it holds past
the pair of pieces above (best fit's slices of a row group; no for every other mode), within
every other bound.
"""
import heapq
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..position import Position, RowGroup
from . import affinity
from .runs import encode_buffer

MAX_IN_FLIGHT = 8      # pieces given to a worker and not yet counted, at most
UNCAPPED = 1 << 40     # max_piece_docs with a token cache (config.py): pieces are whole row groups
MAX_HELD_PIECES = 256  # pieces a worker holds (given or counted, not yet written), at most


@dataclass(frozen=True)
class Packing:
    """What the loader needs to know about one packing (its module's `PACKING`)."""

    name: str                  # the `packing=` value
    locator: Callable          # (cfg, run) -> (locator, piece cap): a count-only run's replay
    order: type                # its write order (a NamedTuple), carried out by `write`
    keep: Callable             # worker: (tokens, lengths, first) -> what it holds of a counted piece, or None
    #                            (first: tokens of its first document read before it, an elastic resume's)
    write: Callable            # worker: (slots, held, order, B, T, positions) -> [(batch, tokens written)];
    #                            positions: the ring's positions areas, or None (packing/positions.py)
    window: Callable           # (B, T) -> int64 tokens per ring slot
    targets_at: Callable       # (B, T) -> where targets start in the window (inputs start at 0)
    stats: Callable            # the ring's counters (dict) -> what it adds to `stats()`
    keep_rows: Callable = lambda held, rows: held  # worker: what it keeps of a piece done again, only `rows`
    order_pieces: Callable = lambda order: ()      # the pieces a write order reads
    orders: tuple = ()         # other write orders `write` carries out (concat: `Copies`, a mixture's)
    settings: tuple = ()       # LoaderConfig fields that change its stream (the state's fingerprint)
    buffer_docs: Callable | None = None  # cfg -> the documents its state's buffer may hold;
    #                                      None: it has no buffer, and its position has a skip

    @property
    def buffered(self) -> bool:
        """Its state holds a buffer of documents (as runs) and its position has skip 0."""
        return self.buffer_docs is not None


class Complete(NamedTuple):
    """A batch whose every token is written (`Mode.ready`): what the coordinator announces."""
    batch: int
    position: Position     # the position after it
    runs: object           # a buffered packing: the buffer after it, as runs (an (n, 5) array); a
    #                        mixture: the `mix.MixPoint` after it (a mixture of one passing its
    #                        pieces whole: None, its point made from this record by the mode's sink,
    #                        packing/mixmode.py `Points`); else None
    docs: int              # documents begun (concat) or placed (best fit) by its end
    read: RowGroup | None = None  # the row group its reading ended in (concat: its last token's);
    #                               None: the position's (best fit: the last chunk's end)


class Stops:
    """Pieces that cannot be read, by index, each with its report (`protocol.Error`): the
    stream stops at the first of them in stream order; `due(reached)` gives that report once,
    the first time the mode says its stream has `reached` it (needs it, with every batch
    before it announced)."""

    def __init__(self):
        self._errors = {}
        self.said = False

    def add(self, index: int, error):
        self._errors.setdefault(index, error)

    def first(self) -> int | None:
        """The index of the first piece that cannot be read, or None."""
        return min(self._errors, default=None)

    def due(self, reached: bool):
        """The first piece's report, the first time `reached` holds; else None."""
        if not reached or self.said:
            return None
        self.said = True
        return self._errors[self.first()]


class Found(NamedTuple):
    """A count-only run's answer (a locator's `result`): the position at the batch count asked
    for and, for a buffered packing, the buffer there as runs `[epoch, file, rg, row, count]`."""
    position: Position
    runs: list


class InOrder:
    """Items that arrive by index in any order, handed out in index order."""

    def __init__(self, first: int = 0):
        self.next = first         # the index handed out next
        self._waiting = {}

    def add(self, index: int, item) -> list:
        """Take item `index`; return `[(index, item), ...]` of those now in turn, in order."""
        self._waiting[index] = item
        out = []
        while self.next in self._waiting:
            out.append((self.next, self._waiting.pop(self.next)))
            self.next += 1
        return out

    def waiting(self) -> dict:
        """`{index: item}` of the items that wait for an earlier one."""
        return self._waiting


class BatchBook:
    """Batches freed, writable, written and announced, for one run."""

    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.n_freed = 0          # batches the trainer gave back, in any order
        self.announced = 0        # batches < announced were announced
        self._left = {}           # batch -> tokens still to be written

    def freed(self):
        self.n_freed += 1

    @property
    def limit(self) -> int:
        """Batches below this may be written: every freed batch is among them, so at most
        `n_slots` batches hold a slot at once."""
        return self.n_freed + self.n_slots

    def expect(self, batch: int, tokens: int):
        self._left[batch] = self._left.get(batch, 0) + tokens

    def written(self, counts):
        """A worker wrote `n` tokens of batch `k` for each `(k, n)`."""
        for k, n in counts:
            self._left[k] -= n

    def ready(self, position_of) -> list:
        """`(batch, position)` of the batches now complete, in order; `position_of(k)` is None
        while the position after batch k is not known yet, and k waits."""
        out = []
        while self._left.get(self.announced) == 0:
            pos = position_of(self.announced)
            if pos is None:
                break
            del self._left[self.announced]
            out.append((self.announced, pos))
            self.announced += 1
        return out


class Begin(NamedTuple):
    """Where a run's head start reads (its packing's mode says: `Mode.head_start`): the run's
    files `[lo, hi)` in `order` (a `data.shuffle.Shuffle` of them, or None: the files' order),
    from `start` (numbered within them; its `skip`: the tokens of its first document the run
    drops), or from `first(row_counts)` where that is not None (a shuffled source the run's
    point does not place: its share's first window, `shuffle.first_position`, `row_counts(f)`
    of file f within them), with `later` (`data.order.Later`: files added among them at the
    resume, numbered within them), or None; `reads`: the order a piece in the run's numbering
    is read in (data/shuffle.py `read`), the run's `Sourced` (`shuffle.of_run`, one source's a
    `Sourced` of one; None exactly where `order` is: the files' order);
    `point(position, end, docs)`: what the slot of a batch that ends at `position`, stream
    position `end` (from the run's first token), `docs` documents begun, carries for its state,
    as the trainer keeps it (a pass-through's point: packing/mixone.py), or None: nothing (one
    source's concat)."""
    lo: int
    hi: int
    start: Position
    later: object = None
    order: object = None
    point: Callable | None = None
    reads: object = None
    first: Callable | None = None

    @classmethod
    def reading(cls, lo: int, hi: int, start: Position, later, reads, point: Callable | None = None) -> "Begin":
        """A `Begin` of the run's files `[lo, hi)` read as `reads` says (the run's `Sourced`, or
        None: the files' order), its `order` the `Shuffle` of the source they are (one rule for
        the two fields, which must agree)."""
        order = None if reads is None else reads.of(lo).order
        return cls(lo, hi, start, later, order, point, reads)


class Mode:
    """The coordinator's view of a sequencer. Pieces come from `pieces`; `take` gives one to a
    worker, which answers with `counted`; `orders(take_slot)` yields `(worker, write order)`; `written` takes the workers' acknowledgements, `freed` the trainer's;
    `ready` yields a `Complete` for each complete batch, in order; `messages` are extra messages for the trainer and `stats`
    the header counters `(ring.Stat, value)` the mode keeps. `keep` tells workers whether to
    keep a counted piece's tokens (as the packing's `keep` says) or only to count them."""

    keep = True

    @staticmethod
    def head_start(cfg, run) -> "Begin | None":
        """Where the trainer's head start of a run (`RunArgs`) of this mode reads (procs/headstart.py),
        or None: it makes none (every mode but concat's)."""
        return None

    def __init__(self, n_workers: int, cfg, window: int = 0, n_slots: int = 0):
        self.flight_bytes = cfg.max_piece_bytes   # None: no bound by text (a token cache's whole row groups)
        self.most_active = cfg.workers_at_once  # workers with pieces in flight, at most (None: no bound)
        self.ring_tokens = window * n_slots
        self._in_flight = {}                  # piece index -> (worker, text bytes): given, not counted
        self._flights = None                  # `_flight` of every worker, made once after `_in_flight` changes
        self._held = [{} for _ in range(n_workers)]  # per worker: piece index -> tokens, counted, not written
        self._held_tokens = [0] * n_workers   # their sums
        self._seen = [0, 0]                   # tokens and text bytes of the pieces counted
        self.owner, self.specs = {}, {}
        self.stops = Stops()                  # pieces that cannot be read (`failed`)
        self._holds = [None] * n_workers      # per worker: the row group (file, rg) it was given last

    def _flight(self, worker: int) -> tuple:
        """`(pieces, their text bytes)` in flight on `worker`, and the text bytes of the largest
        piece in flight on another worker. Made for every worker in one pass over the pieces in
        flight whenever they changed (`_flights`): each turn of the coordinator asks each worker
        2-3 times (`candidates`), which was a pass a question, workers x pieces in flight a turn."""
        if self._flights is None:
            self._flights = self._all_flights()
        return self._flights[worker]

    def _all_flights(self) -> list:
        """`_flight` of each worker: its pieces and text, and the largest text of another's (the
        largest piece of the worker whose largest is largest, else of the runner-up worker)."""
        workers = range(len(self._held))
        n, text, most = [0] * len(workers), [0] * len(workers), [0] * len(workers)
        for w, b in self._in_flight.values():
            n[w] += 1
            text[w] += b
            if b > most[w]:
                most[w] = b
        first = max(workers, key=most.__getitem__)
        runner_up = max((most[w] for w in workers if w != first), default=0)
        return [(n[w], text[w], runner_up if w == first else most[first]) for w in workers]

    def load(self, worker: int) -> tuple:
        return self._flight(worker)[0], self._held_tokens[worker]

    def hold_tokens(self, worker: int) -> int:
        """The most tokens `worker` may hold counted and not yet written (see above)."""
        return self._budget(self._flight(worker)[2])

    def _budget(self, behind: int) -> int:
        per_byte = self._seen[0] / self._seen[1] if self._seen[1] else 1.0
        return max(self.ring_tokens, int(behind * per_byte))

    def can_take(self, worker: int) -> bool:
        return self._room(worker, pair=True)

    def can_continue(self, worker: int) -> bool:
        """Whether `worker` may take the next slice of the row group it holds past the pair of
        pieces in flight (`affinity.pick`, rule 2). Here: no (a mode whose pieces slice row
        groups says yes within its own bounds: best fit)."""
        return False

    def _room(self, worker: int, pair: bool) -> bool:
        """Whether `worker` may take a piece (see the module's docstring); without the `pair`
        rule, up to `MAX_IN_FLIGHT` pieces in flight whatever their text."""
        n, text, behind = self._flight(worker)
        held = self._held_tokens[worker]
        if pair:
            flight_ok = n < 2 or (n < MAX_IN_FLIGHT and self.flight_bytes is not None and text < self.flight_bytes)
        else:
            flight_ok = n < MAX_IN_FLIGHT
        if not n and self._cores_busy():  # a worker with none waits while as many as the cores have some
            return False
        return (flight_ok and n + len(self._held[worker]) < MAX_HELD_PIECES
                and (not held or held < self._budget(behind)))

    def candidates(self, workers) -> list:
        """`workers` (those that may be given a piece: live and ready) as the assignment rule sees
        them now (`affinity.Worker`), asked before the next piece is taken from the order."""
        out = []
        for w in workers:
            takes, continues = self.can_take(w), self.can_continue(w)
            load = self.load(w) if takes or continues else None  # asked only of those that may be picked
            out.append(affinity.Worker(w, load, takes, continues, self._holds[w]))
        return out

    def pick(self, piece, candidates: list) -> int | None:
        """Which of `candidates` gets `piece`, or None: none may take it now (packing/affinity.py:
        a row group's slices stay with the workers that read it, when the loads allow; with more
        workers than the cores, an idle one waits while the cores are all taken)."""
        return affinity.pick((piece.file, piece.rg), candidates, self._cores_busy())

    def _cores_busy(self) -> bool:
        """More workers than the cores (`most_active`), and as many workers as the cores have a
        piece in flight."""
        return self.most_active is not None and self._active() >= self.most_active

    def _active(self) -> int:
        """The workers with a piece given and not counted (a pass over the pieces in flight, not
        over the workers: asked of each idle candidate every turn)."""
        return len({w for w, _ in self._in_flight.values()})

    def hand_out(self, workers, ahead) -> tuple:
        """One turn of handing out pieces in order (the coordinator's `_assign`, until it says
        no one): `(worker, piece)`, the next piece (`ahead`, the one taken from the order and not
        given yet, else the order's next) taken by the worker `pick` chose among `workers`; or
        `(None, ahead)` when no one may take it now (`None` for the piece: none was taken from
        the order, as no worker may take one). `next(self.pieces)` may raise a `DataError`."""
        candidates = self.candidates(workers)
        if ahead is None:
            if not any(w.takes or w.continues for w in candidates):
                return None, None
            ahead = next(self.pieces)
        worker = self.pick(ahead, candidates)
        if worker is not None:
            self.take(worker, ahead)
        return worker, ahead

    def take(self, worker: int, piece):
        self.owner[piece.index], self.specs[piece.index] = worker, piece
        self._in_flight[piece.index] = (worker, piece.text_bytes)
        self._flights = None
        self._holds[worker] = (piece.file, piece.rg)

    def _counted_by(self, worker: int, piece, tokens: int):
        """`piece` of `worker` was counted; it holds `tokens` until `_written_out` (0: the
        mode bounds what workers hold itself, or they keep nothing)."""
        del self._in_flight[piece.index]
        self._flights = None
        if tokens and piece.text_bytes:
            self._seen[0] += tokens
            self._seen[1] += piece.text_bytes
        if tokens:
            self._held[worker][piece.index] = tokens
            self._held_tokens[worker] += tokens

    def _written_out(self, worker: int, index: int):
        """Every token of piece `index` of `worker` was written into the ring."""
        self._held_tokens[worker] -= self._held[worker].pop(index, 0)

    def uncounted(self, index: int) -> bool:
        """Piece `index` was given to a worker and its count has not come."""
        return index in self._in_flight

    def holding(self, worker: int, orders) -> dict:
        """What `worker` holds or works on, for a worker that replaces it (procs/coordinator.py):
        `{piece index: rows it must keep, or None for all}`, given the write orders it was sent
        and has not acknowledged (`orders`). Here: the pieces given and not counted."""
        return {i: None for i, (w, _) in self._in_flight.items() if w == worker}

    def counted(self, msg):
        raise NotImplementedError

    def failed(self, index: int, error) -> bool:
        """Piece `index` cannot be read (`error`, the report to raise; a piece never handed out:
        the order could not be read on from there): it is never counted. Whether the mode holds
        the error until its stream needs the piece (`messages` then gives it); False: the
        coordinator raises it now. Here: False."""
        return False

    def _forget(self, index: int):
        """Piece `index` will never be counted: it leaves its worker's load (and a replacement's
        share). Returns its `Piece`, or None for one never handed out."""
        self._in_flight.pop(index, None)
        self._flights = None
        self.owner.pop(index, None)
        return self.specs.pop(index, None)

    def freed(self, batch: int):
        pass

    def orders(self, take_slot):
        return ()

    def written(self, counts):
        pass

    def ready(self):
        return ()

    def messages(self):
        """Messages for the trainer (a count-only run's answer, a mixture's notes, the `Ended`
        of a stream that stopped at a piece that cannot be read)."""
        return ()

    def buffer_of(self, done: Complete):
        """What travels in the batch's slot for the state: `(text, crc)`, or None."""
        return encode_buffer(done.runs) if done.runs is not None else None

    def stats(self):
        return ()


class SlotMap:
    """Which ring slot holds which batch (the coordinator's). A batch takes the lowest free
    slot when its first write order is issued and gives it back when the trainer frees it,
    in any order: the trainer lends CPU batches until the caller drops them. The sequencers
    keep at most `n_slots` batches between their first order and their free, so a slot is
    always free when one is asked for."""

    def __init__(self, n_slots: int):
        self._free = list(range(n_slots))
        self._of = {}

    @property
    def full(self) -> bool:
        """Every slot is held: nothing more can be written until the trainer frees one."""
        return not self._free

    def slot_of(self, batch: int) -> int:
        """The slot batch `batch` holds (it must hold one)."""
        return self._of[batch]

    def take_slot(self, batch: int) -> int:
        """The slot of `batch`, the lowest free one if it holds none yet."""
        s = self._of.get(batch)
        if s is None:
            if not self._free:
                raise RuntimeError(f"batch {batch} needs a ring slot but all {len(self._of)} are held "
                                   f"(batches {sorted(self._of)})")
            s = self._of[batch] = heapq.heappop(self._free)
        return s

    def release(self, batch: int) -> int:
        s = self._of.pop(batch)
        heapq.heappush(self._free, s)
        return s
