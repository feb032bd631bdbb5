"""shmloader's benchmarks, one topic a file, one results file a topic.

Each topic runs as a file, from any directory, and prints its options with `--help`:

    python tools/bench/throughput.py --quick

| topic | entry point | results |
|---|---|---|
| tokens/s read, 1..N workers, against the nanochat-style baseline and bare engine processes, per corpus | throughput.py | docs/bench/throughput.json, throughput.png |
| the training process's side: CPU per `next()`, after sleeps and busy work, system calls, the drop-ins | trainer.py | docs/bench/trainer.json |
| the training step: a loop of 20 ms of Python holding the GIL and a best-fit batch with its state, shmloader, nanochat's loader and its thread-prefetch version against batches in memory | step_loop.py | docs/bench/step_loop.json |
| first batch as nanochat's evaluations pay it (a new val loader per evaluation, the train loader running) | evaluations.py | docs/bench/evaluations.json |
| the same in nanochat's real `scripts/base_train.py` (a checkout you give it) | base_train.py | docs/bench/base_train.json |
| the token cache: an empty cache, a restart on it, a warm one | cache.py | docs/bench/cache.json |
| what a heal costs the training loop | heal.py | docs/bench/heal.json |
| a resume at another rank or world size; the resume check | elastic.py | docs/bench/elastic.json |
| the tokenizer engine against tiktoken, one core | engines.py | docs/bench/engines.json |
| the best-fit planner alone against the plain scan | packing.py | docs/bench/packing.json |
| one huge document among ordinary ones | long_document.py | docs/bench/long_document.json |

Every topic writes its figures to its results file (`--json`, by default the file above) with
the command, the machine, the date and the commit they came from, and its report states
measurements (ratios side by side), never targets: those live in the issues. Topics that run
loaders in fresh processes take `--compare DIR` (another checkout, run side by side,
interleaved, for before/after figures).

Shared parts: `corpora` (the demo, nanochat and skewed corpora, built offline and reused),
`baseline` (the nanochat-style in-process loaders, and in a thread), `measure` (CPU time, busy
work, Python that holds the GIL, memory), `loop` (the training-step loop against the ideal),
`bare` (bare engine processes), `children` and `child` (a measurement in a fresh process, with
this checkout's shmloader or another's), `loaders` (a loader read as fast as it goes),
`results` (the results file, tables).
"""
