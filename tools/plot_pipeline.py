"""A picture of the data pipeline over time: tokens/s delivered, the wait share, the ring's fill.

The tool lives in the package, shmloader/tools/plot_pipeline.py (installed: `shmloader-plot-pipeline` or
`python -m shmloader.tools.plot_pipeline`); this shim runs it from a checkout: `python tools/plot_pipeline.py --help`.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python tools/plot_pipeline.py`: this checkout's shmloader first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shmloader.tools.plot_pipeline import *  # noqa: E402,F401,F403 - the tool's names, for `from tools import plot_pipeline`
from shmloader.tools.plot_pipeline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
