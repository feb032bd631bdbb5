"""`python -m shmloader.demo`: the demo, whose implementation is `shmloader_dev.demo`.

    python -m shmloader.demo [--out-dir ./demo_data] [--workers 2] [--batches 600]

See shmloader_dev/demo.py for what it builds, runs and prints. Importing this module does not
import `shmloader_dev`; running it does.
"""
import sys


def main(argv=None) -> int:
    from shmloader_dev.demo import main as demo_main

    return demo_main(argv)


if __name__ == "__main__":
    sys.exit(main())
