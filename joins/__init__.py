"""joins package."""
