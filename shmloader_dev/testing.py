"""Helpers for tests and tools (importable by worker processes, so no torch here).

`IntTokenizer` has nanochat's tokenizer interface and encodes a document that is a list of
decimal integers separated by spaces into exactly those integers. With it a test can write
documents whose tokens equal their stream positions, so every window is checkable by
arithmetic (llm.c's trick).
"""


class IntTokenizer:
    """`encode("5 6 7") == [5, 6, 7]`; BOS is `bos` (default 0)."""

    def __init__(self, bos: int = 0):
        self.bos = bos

    def get_bos_token_id(self) -> int:
        return self.bos

    def encode(self, text, prepend=None, num_threads=None):
        if isinstance(text, list):
            return [self.encode(t, prepend) for t in text]
        ids = [int(tok) for tok in text.split()]
        return ([prepend] if prepend is not None else []) + ids

    def decode(self, ids) -> str:
        return " ".join(str(i) for i in ids)


def position_documents(lengths, start: int = 1) -> list[str]:
    """Documents whose tokens, after each document's BOS, are consecutive stream positions.

    With BOS counted as one position, document i's tokens are the positions it occupies in
    the epoch's stream (position 0 is the first document's BOS). `lengths` counts tokens
    without BOS; a length of 0 gives an empty document (BOS only). `None` gives a null row.
    """
    docs, pos = [], start - 1
    for n in lengths:
        if n is None:
            docs.append(None)
            continue
        pos += 1  # the BOS
        docs.append(" ".join(str(p) for p in range(pos, pos + n)))
        pos += n
    return docs
