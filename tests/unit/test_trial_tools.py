"""The adversarial new-user trial (December 2026): a tool's help says the loader's defaults.
`shmloader-inspect-batch --help` said `--shuffle-window` was "units whose documents are
shuffled together ... (default 8)", while the tool (None: the loader's) and the loader read
windows of 256 documents: a user who passed 8 to match saw another stream than the loader's."""
import contextlib
import io

import pytest

from shmloader.data.shuffle import WINDOW
from shmloader.tools import inspect_batch


def test_inspect_batch_help_says_the_loaders_shuffle_window():
    assert inspect_batch.parse_args([]).shuffle_window is None  # the loader's own default
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        inspect_batch.parse_args(["--help"])
    text = " ".join(out.getvalue().split())
    assert f"shuffle_window= (default {WINDOW})" in text, text
    assert "documents a shuffled window holds" in text, text
