"""`python -m shmloader.demo`: see shmloader/demo/__init__.py."""
import sys

from . import main

sys.exit(main())
