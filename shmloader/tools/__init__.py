"""The tools a user runs, installed with the package: each a module with a `main(argv=None)`,
run as a console script, as `python -m shmloader.tools.<name>`, or in a checkout as
`python tools/<name>.py` (a shim that calls the same `main`).

- `pretokenize` (`shmloader-pretokenize`): fill the token cache for a split on every core.
- `inspect_batch` (`shmloader-inspect-batch`): one batch decoded, with its resume state.
- `plot_pipeline` (`shmloader-plot-pipeline`): tokens/s, wait share and ring fill over time;
  drawing needs the `plot` extra (matplotlib), `--measure` the `demo` extra (rustbpe).

Importing this package imports none of them.
"""
