"""Fill shmloader's token cache for a split ahead of time, on every core.

The tool lives in the package, shmloader/tools/pretokenize.py (installed: `shmloader-pretokenize` or
`python -m shmloader.tools.pretokenize`); this shim runs it from a checkout: `python tools/pretokenize.py --help`.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python tools/pretokenize.py`: this checkout's shmloader first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shmloader.tools.pretokenize import *  # noqa: E402,F401,F403 - the tool's names, for `from tools import pretokenize`
from shmloader.tools.pretokenize import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
