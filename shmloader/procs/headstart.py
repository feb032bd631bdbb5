"""The head start: a concat run's first batches made in the training process while its
children start, so that a new loader's first batch does not wait for its processes to start.

Starting a run's processes costs the trainer nothing it waits on, but the first batch waits
for them: a worker is started through the forkserver, unpickles its tokenizer and only then
reads; on 2 cores that was 80-110 ms for a batch that nanochat's in-process loader makes in
45-55 ms. So while the children start, the trainer makes the batches the caller asks for
itself, the way a run makes them (packing/headstart.py: the same sequencer, write and
check), reading and tokenizing only what each batch needs (a piece of 1 document, then
pieces sized by what the batch still needs: packing/headstart.py `PieceSizes`; piece
boundaries never change the stream) with the tokenizer's definition (the engine every
worker's is checked against, data/engine.py).

The first batch is made before the children are spawned (`prepare`, while the process's other
loaders already give way: procs/precedence.py), so that their start does not take the cores
from it. The rule (`HeadStart.wanted`): a batch is made here only while the ring has announced none
(and the coordinator has said nothing: an error or a warning is the ring's to deliver), and
at most `MOST` more once the children are started (`started`). From the ring's first
announcement on, the ring delivers: its batches
below the ones handed out here are taken and freed at once (the run starts from the same
position, so it makes them again), each compared with the record made here (position,
documents, check: `compare`), and a difference is an error, never a changed byte. Any failure
while making one here (a file that cannot be read, a bad row group, a whole pass over the
files without a batch: an epoch of nulls) ends the head start quietly: the ring reads the same
data and says what is wrong, as it always did. For an idle release a batch made here is given
back when the caller lets go of it, as a ring batch is (the delivery says when: delivery.py
`made_back`), and `back` times the gaps between them (procs/idle.py).

The first loader of a process would wait in its children's start for the forkserver to boot
(its preloads, ~0.3-0.6 s on 2 cores). So while the server boots (procs/start.py `booting`:
the server's last preload leaves a marker file, procs/forkready.py), the children are made and
left unstarted (`start_children`) until a thread of the trainer starts them, once it has
booted (start.py `Start.later`); meanwhile the trainer makes the batches asked for, up to
`BOOTING_MOST` in all (the stream's rows), then `next()` waits for that start (procs/run.py
`_wait_started`). They start from the run's start as always, so they make again, and the
trainer compares, every batch made here (docs/design.md, "The head start").

Only a run the trainer could make the same way gets one (`begin`): concat, not a count-only
run, nothing poisoned, no token cache (a cached run's workers read tokens, not text), a
tiktoken tokenizer (its definition is fast; the trainer's own `Encoding` is used, not
unpickled again: data/tokenizer.py) (`refusal` says why not), and where its packing's mode
says where it reads (`Mode.head_start`, a `packing.base.Begin`): one source's concat without
an elastic plan, or a mixture's whose mix passes its one source's pieces whole
(packing/mixmode.py: a batch's state is then the mix's point, made as the coordinator's mode
makes it, and compared with the ring's too). Nothing here asks what the data is.
"""
import functools
import time

from ..data import engine as enginemod
from ..data import formats
from ..data import shuffle
from ..data.order import iter_pieces
from ..data.source import Reader
from ..errors import DataError, ShmLoaderError
from ..ipc.protocol import Opened
from ..packing.base import Begin
from ..packing.headstart import Made, PieceSizes, Stream
from .worker import encode_texts

MOST = 4                                      # batches made here once the children are started, at most
BOOTING_MOST = 16                             # batches made here in all, at most (while a forkserver boots)


def refusal(config, args) -> str | None:
    """Why a run (`RunArgs`) of a loader (`LoaderConfig`) gets no head start, whatever its packing's mode
    says (`begin` asks the mode then); None: none of these."""
    if not config.head_start:
        return "head_start=False"
    if config.packing != "concat":
        return f"packing {config.packing!r}"
    if args.start.locate is not None:
        return "a count-only run"
    if args.poisoned or args.suspects:
        return "rows poisoned or suspect"
    if config.cache_dir is not None:
        return "a token cache"
    if getattr(args.tokenizer, "kind", None) != "tiktoken":
        return "a tokenizer other than tiktoken's"
    return None


def begin(config, args) -> "Begin | None":
    """Where the head start of a run (`RunArgs`) of a loader (`LoaderConfig`) reads, or None: it
    gets none (`refusal` says why, or its packing's mode makes it otherwise: `Mode.head_start`)."""
    return None if refusal(config, args) is not None else args.modes[0].head_start(config, args)


class HeadStart:
    """One run's head start (`begin(config, args)` is not None): `make()` the run's next batch here
    while `wanted(...)`, `handed(batch)` once the caller has it; `compare(ann, buffer)` each ring
    batch below `given`; `back(n)` when the caller has let go of n of them."""

    def __init__(self, config, args, begin: Begin, booting: bool = False):
        """`begin`: where it reads (`begin`'s); `booting`: the forkserver boots, so the children
        may start late: room for `BOOTING_MOST` batches (else `MOST`)."""
        self.config, self.args, self.begin = config, args, begin
        self.stream = Stream(config.B, config.T, begin.start.skip, BOOTING_MOST if booting else MOST,
                             config.positions, begin.point)
        self.given = 0        # batches handed out from here (that reached the caller)
        self.until = None     # made here while `given` is below it, once the children are started (`started`)
        self.over = False     # no more are made here
        self.opened = []      # `Opened` of the files read here, for the loader's catalogue (as the coordinator's)
        self._given = {}      # batch -> its `Made`, handed out, until the ring's copy is compared
        self._source = self._pieces = self._encoder = None
        self._start = None    # where it reads from (`Begin.start`, or what `Begin.first` found), once it reads
        self._units = None    # a shuffled window's members read whole (data/shuffle.py `Units`), False: K = 1
        self._next = None     # batch `given`, made and not handed out: `prepare`'s, or one a Ctrl-C kept from the caller
        self.given_back = 0   # of those handed out, the ones the caller has let go of (`back`)
        self.longest_gap = 0.0  # the longest gap between two `back`s that said more, in seconds
        self._back_at = None  # when `back` last said more

    def wanted(self, announced: int, pending: int) -> bool:
        """Whether the next batch is made here: the ring has announced `announced` batches and
        its coordinator has `pending` messages queued."""
        if not self.over and (announced or pending > 0 or (self.until is not None and self.given >= self.until)):
            self._finish()
        return not self.over

    def started(self):
        """The run's children are started now: at most `MOST` more batches are made here."""
        self.until = self.given + MOST

    def prepare(self) -> bool:
        """Make the run's first batch now, before its children start (so that they do not
        compete with it for the cores); `make` hands it out. Returns whether it was made."""
        if self._next is None and not self.over:
            self._next = self._made()
        return self._next is not None

    def make(self) -> "Made | None":
        """Batch `given` of the run, made here (once: until `handed`, the same one); None (and the
        head start is over) when it cannot be."""
        if self._next is None:
            self._next = self._made()
        return self._next

    def handed(self, batch: int):
        """Batch `batch` (`make`'s) is the caller's: the ring's copy of it is compared and dropped.
        A batch that never got here (a Ctrl-C on its way) is made again by `make`, or by the ring."""
        made, self._next = self._next, None
        self.given += 1
        self._given[batch] = made

    def back(self, given_back: int):
        """The caller has let go of `given_back` of the batches handed out from here, it is seen
        now (at a `next()`, as the ring's lent slots are): the gaps between them are timed here,
        where the coordinator, which times the ring's, may not have been there to see them (it
        starts after the first batch; while a forkserver boots, later still)."""
        if given_back != self.given_back:
            now = time.monotonic()
            if self._back_at is not None:
                self.longest_gap = max(self.longest_gap, now - self._back_at)
            self.given_back, self._back_at = given_back, now

    def _made(self) -> "Made | None":
        """The stream's next batch, reading and tokenizing what it needs; None (and the head
        start is over) when it cannot be made."""
        if self.over:
            return None
        try:
            while (made := self.stream.ready()) is None:
                if self.stream.exhausted:  # it makes no more: reading on would never end
                    raise DataError("the head start made every batch it may")
                self._add_next()
            return made
        except BaseException as exc:  # half a piece added (a Ctrl-C too): the stream is not to be used again
            self._finish()
            if isinstance(exc, Exception):  # the ring reads the same data and reports what is wrong
                return None
            raise

    def row(self, batch: int):
        """Batch `batch`'s row (tokens, then positions), made and on its way: the caller keeps it."""
        return self._next.row

    def compare(self, ann, buffer=None):
        """The ring's announcement of a batch handed out here, with what its slot carries for a
        state (`buffer`: its text, None where it carries none): it must say what this one said."""
        made = self._given.pop(ann.batch)
        position, docs, check = made.position, made.docs, made.check
        text, ours = (None if b is None else b.text for b in (buffer, made.buffer))
        if (ann.position, ann.docs, ann.check, ann.read, text) != (position, docs, check, made.read, ours):
            raise ShmLoaderError(
                f"batch {ann.batch} as the workers made it differs from the one the training process made "
                f"while they started: they say it ends at {ann.position} after {ann.docs} documents with check "
                f"{ann.check:08x}, the training process said {position}, {docs}, {check:08x}"
                f"{'' if text == ours else f'; its state is {text!r}, the training process said {ours!r}'}. "
                f"This is a bug in shmloader; please report it with the data and tokenizer")

    def take_opened(self) -> list:
        """The `Opened` of files read here since the last call."""
        out = list(self.opened)
        self.opened.clear()
        return out

    def _finish(self):
        """No more batches are made here: the files, the tokenizer and the rows not handed out go
        (what was handed out stays until the ring's copy is compared, or the caller has it)."""
        self.over = True
        self.stream = self._source = self._pieces = self._encoder = None

    def _add_next(self):
        b = self.begin
        if self._pieces is None:
            a = self.args
            source = self._source = Reader(a.files, a.filesystem.open() if a.filesystem is not None else None,
                                           a.columns, a.tokenizer.n_vocab or None)
            self._encoder = enginemod.definition(a.tokenizer)
            counts = functools.partial(_row_counts, source, {}, self.opened, b.lo)
            self._start = b.start if b.first is None else b.first(counts)
            pieces = iter_pieces(counts, b.hi - b.lo, a.rank, a.world, self._start,
                                 max_docs=self.config.max_piece_docs, ramp=PieceSizes(self.stream), later=b.later,
                                 shuffle=b.order)
            self._pieces = pieces if b.lo == 0 else (p.from_file(b.lo) for p in pieces)
        piece = next(self._pieces)
        if piece.epoch > self._start.epoch + 1:  # an epoch of nulls: the coordinator says so
            raise DataError("no batch in a whole pass over the files")
        spec, path = self.args.tokenizer, self.args.files[piece.file]
        order = b.reads  # the run's `Sourced`, as the workers read a piece (None: the files' order)
        if order is not None and self._units is None:
            self._units = shuffle.Units() if b.order.window > 1 else False
        texts = (self._source.read_texts(piece.file, piece.rg, piece.doc_start, piece.doc_end) if order is None
                 else shuffle.read(self._source.read_texts, order, piece, self._units or None))
        encode = self._encoder.encode_batch
        tokens, lengths = encode_texts(texts, lambda docs, where: encode(docs), spec.bos, spec.dtype,
                                       lambda i: f"{path}, {formats.place_of(path, piece.rg, piece.doc_start + i)}")
        self.stream.add(piece, tokens, lengths)


def _row_counts(source: Reader, told: dict, opened: list, lo: int, f: int) -> list:
    """File `lo + f`'s row counts (`lo`: `Begin.lo`), its identity put in `opened` (as an `Opened`)
    the first time it is read and whenever it changed, as the coordinator tells the trainer."""
    f += lo
    counts = source.row_counts(f)
    if (msg := Opened.if_new(told, f, source.identity(f))) is not None:
        opened.append(msg)
    return counts
