"""``python -m generators``: see ``generators.cli``."""
import sys

from .cli import main

sys.exit(main())
