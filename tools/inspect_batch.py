"""Print one batch of the stream, decoded, and the resume state that comes with it.

The tool lives in the package, shmloader/tools/inspect_batch.py (installed: `shmloader-inspect-batch` or
`python -m shmloader.tools.inspect_batch`); this shim runs it from a checkout: `python tools/inspect_batch.py --help`.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python tools/inspect_batch.py`: this checkout's shmloader first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shmloader.tools.inspect_batch import *  # noqa: E402,F401,F403 - the tool's names, for `from tools import inspect_batch`
from shmloader.tools.inspect_batch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
