"""nanochat's loader functions, as drop-ins: change one import line, keep the call.

    from shmloader.nanochat import tokenizing_distributed_data_loader_with_state_bos_bestfit

Each returns nanochat's generator over one `ShmLoader` (a `Batches`: iterate it, `next()` it,
`close()` it as nanochat does), which also answers `stats()` and holds its `.loader`; the loader
is closed when the generator is closed or collected, without waiting for its processes to exit
(`ShmLoader.close(wait=False)`: a new val loader assigned over the last does not wait for it).
The loader is built when the function is called, so bad arguments, a missing data directory,
a one-file train split and a missing or broken tokenizer raise there, in the caller's
process; what is inside the files (columns, row groups, corruption) is read, and any error
in it raised, from the first `next()` on. Every `ShmLoader` option passes through
(`positions=True`: each batch with its positions, before the state; `column="content"`: the
documents' column; `data=shmloader.Source(...)` or a `Mixture` of them).
"""
import numbers
from collections.abc import Generator

from .cores import share
from .loader import ShmLoader


class Batches(Generator):
    """A drop-in's generator: the batches of `gen` (a Python generator over `loader`), and the
    loader's `stats()`. Iteration, `next()`, `send()`, `throw()` and `close()` are `gen`'s."""

    def __init__(self, gen, loader: ShmLoader):
        self._gen, self.loader = gen, loader

    def __next__(self):
        return next(self._gen)

    def send(self, value):
        return self._gen.send(value)

    def throw(self, *exc):
        return self._gen.throw(*exc)

    def close(self):
        self._gen.close()

    def stats(self) -> dict:
        """The loader's `stats()` (`ShmLoader.stats`)."""
        return self.loader.stats()


def _workers(tokenizer_threads: int, num_workers) -> int:
    """nanochat's `tokenizer_threads` as worker processes, at most this rank's share of the cores
    (`cores.share`: a worker is a process per core: more of them only contend, and each one more is a
    process to start at every evaluation); `num_workers` given: that (a bad one the loader names).
    A `tokenizer_threads` that is no count is a ValueError naming it (the loader would name
    `num_workers`, which the caller did not pass)."""
    if num_workers is not None:
        return num_workers
    valid = isinstance(tokenizer_threads, numbers.Integral) and not isinstance(tokenizer_threads, bool) \
        and tokenizer_threads >= 1
    if not valid:
        raise ValueError(f"tokenizer_threads must be a positive integer (the worker processes, at most this "
                         f"rank's share of the cores), got {tokenizer_threads!r}")
    return min(tokenizer_threads, share())


def tokenizing_distributed_data_loader_with_state(B, T, split, tokenizer_threads=4, tokenizer_batch_size=128,
                                                  device="cuda", resume_state_dict=None, *, data=None,
                                                  tokenizer=None, num_workers=None, **options):
    """nanochat's `tokenizing_distributed_data_loader_with_state`: yields (inputs, targets, state)
    (with `positions=True`: (inputs, targets, positions, state))."""
    loader = ShmLoader(data, tokenizer, B, T, split, num_workers=_workers(tokenizer_threads, num_workers),
                       device=device, resume_state=resume_state_dict,
                       tokenizer_batch_size=tokenizer_batch_size, **options)
    return Batches(_with_state(loader), loader)


def _with_state(loader: ShmLoader):
    """Yields each batch with the state that resumes AT it (docs/contract.md §3): nanochat's loop saves the
    state of the batch it prefetched and has not trained on yet, and resumes with a prefetch. Its
    nanochat keys are the batch's own, as nanochat's loaders yield them: the row group its reading
    ended in (`ShmLoader.nanochat_keys`). A batch is `(inputs, targets)`, or
    `(inputs, targets, positions)` with `positions=True`."""
    try:
        state = loader.state_dict()
        for batch in loader:
            state.update(loader.nanochat_keys())  # a copy; the digest covers the position, not these
            yield (*batch, state)
            state = loader.state_dict()
    finally:  # the generator closed or dropped (a new val loader over the last): no wait for the exits
        loader.close(wait=False)


def tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tokenizer, B, T, split, tokenizer_threads=4, tokenizer_batch_size=128, device="cuda",
        resume_state_dict=None, buffer_size=1000, *, data=None, num_workers=None, **options):
    """nanochat's BOS-aligned best-fit loader: yields (inputs, targets, state) (with
    `positions=True`: (inputs, targets, positions, state))."""
    loader = ShmLoader(data, tokenizer, B, T, split, packing="bos_bestfit",
                       num_workers=_workers(tokenizer_threads, num_workers), device=device,
                       resume_state=resume_state_dict, tokenizer_batch_size=tokenizer_batch_size,
                       buffer_size=buffer_size, **options)
    return Batches(_with_state(loader), loader)


def tokenizing_distributed_data_loader_bos_bestfit(*args, **kwargs):
    """nanochat's BOS-aligned best-fit loader without the state: yields (inputs, targets)
    (with `positions=True`: (inputs, targets, positions))."""
    return _without_state(tokenizing_distributed_data_loader_with_state_bos_bestfit(*args, **kwargs))


def tokenizing_distributed_data_loader(*args, **kwargs):
    """nanochat's `tokenizing_distributed_data_loader`: yields (inputs, targets) (with
    `positions=True`: (inputs, targets, positions))."""
    return _without_state(tokenizing_distributed_data_loader_with_state(*args, **kwargs))


def _without_state(gen: Batches) -> Batches:
    return Batches(_batches_only(gen), gen.loader)


def _batches_only(gen):
    try:
        for *batch, _ in gen:
            yield tuple(batch)
    finally:
        gen.close()
