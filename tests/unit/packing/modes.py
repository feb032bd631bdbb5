"""Driving a coordinator's mode without processes, as procs/coordinator.py does: what the unit
tests of the mixture modes share."""


def hand_out(mode, workers: int = 1) -> list:
    """Every piece the mode lets each of `workers` take now, taken (worker 0 first)."""
    given = []
    for w in range(workers):
        while mode.can_take(w):
            piece = next(mode.pieces)
            mode.take(w, piece)
            given.append(piece)
    return given


def written(order) -> list:
    """A write order's acknowledgements `(batch, tokens)`: a mixture concat's `Copies` count
    their own; a `Place` (a mixture of one passing its pieces whole) its segments'; best fit's
    `Rows` are its placements' tokens."""
    if hasattr(order, "counts"):
        return order.counts()
    if hasattr(order, "piece"):
        return [(k, n) for k, _, _, _, n in order.segments]
    return [(order.batch, sum(p[4] for p in order.placements))]


def turn(mode, slots) -> tuple[list, list]:
    """The rest of one turn of the coordinator's loop (procs/coordinator.py), the counts in:
    every write order the mode gives written at once, every complete batch taken and its slot
    freed. Returns `(orders, done)`: the orders written and the batches complete (the mode's
    messages are the caller's to read)."""
    orders = [order for _, order in mode.orders(slots.take_slot)]
    for order in orders:
        mode.written(written(order))
    done = list(mode.ready())
    for complete in done:
        slots.release(complete.batch)
        mode.freed(complete.batch)
    return orders, done
