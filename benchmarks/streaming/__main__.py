"""``python -m benchmarks.streaming`` (or ``spark-submit benchmarks/streaming/__main__.py``):
the streaming benchmark's command line, ``cli.main``."""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.streaming.cli import main  # noqa: E402

sys.exit(main())
