"""Observability in this process: importing shmloader configures no logging (a library leaves
handlers to the application). (`stats()` and `log_every` through the whole loader:
tests/loader/test_observability.py.)
"""
import logging

import shmloader  # noqa: F401 - the import is what is checked


def test_importing_configures_no_logging():
    assert logging.getLogger("shmloader").handlers == []
