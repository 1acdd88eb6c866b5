"""``python -m generators``: see ``generators.cli``."""
import sys

from .cli import main

# Guarded: a spawned helper process (generators.workers) imports this module again.
if __name__ == "__main__":
    sys.exit(main())
