"""`python -m tools.bench.child MODULE:FUNCTION`: one measurement in this fresh process.

Reads its configuration (JSON) from stdin, calls `tools.bench.MODULE.FUNCTION` on it (with
`MODULE:FUNCTION**`, with its keys as keyword arguments) and
prints the returned dict as one line tagged `children.RESULT_TAG`, with `shmloader`: the
directory of the shmloader package this process imported (None if it imported none), so that
a report can show which checkout a row ran. Started by `children.start`.
"""
import importlib
import json
import os
import sys

from tools.bench.children import RESULT_TAG


def main() -> int:
    module, name = sys.argv[1].split(":")
    fn = getattr(importlib.import_module(f"tools.bench.{module}"), name.removesuffix("**"))
    cfg = json.loads(sys.stdin.read())
    out = fn(**cfg) if name.endswith("**") else fn(cfg)
    shm = sys.modules.get("shmloader")
    out["shmloader"] = os.path.dirname(os.path.dirname(os.path.realpath(shm.__file__))) if shm else None
    print(RESULT_TAG + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
