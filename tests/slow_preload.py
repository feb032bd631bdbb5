"""A forkserver preload that sleeps (tests/loader/test_boot.py): `SLOW_PRELOAD_S` seconds on
import, to stretch the server's boot; the loader's own preloads come after it."""
import os
import time

time.sleep(float(os.environ.get("SLOW_PRELOAD_S", "0")))
