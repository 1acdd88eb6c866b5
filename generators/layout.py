"""Where a generated dataset keeps its parts under its ``--out`` directory, for ``generate`` and
``stream`` alike: the event files in ``events/``, the expected result in ``truth/``, the
manifest beside them. A module of names only, so that a job can recognise a dataset's root
without importing the generator."""
from __future__ import annotations

from pathlib import Path

EVENTS_DIR = "events"
TRUTH_FILE = Path("truth") / "attributions.parquet"
MANIFEST_FILE = "manifest.json"
