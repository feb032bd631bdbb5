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
