"""shmloader_dev: what the demo, the tests and the tools use, and the loader never does.

`corpus` (offline corpora, a small BPE tokenizer, parquet shard writing), `reference` (the
single-process oracle of SPEC §2 and the nanochat-style baseline), `testing` (`IntTokenizer`
and position documents) and `demo` (`python -m shmloader.demo`). Shipped in the same
distribution as `shmloader`; nothing in `shmloader` imports it (tests/test_layout.py checks),
so the runtime does not depend on it. Like `shmloader`, no torch at import time: worker
processes import `testing` and `corpus` when a test's tokenizer lives there.
"""
