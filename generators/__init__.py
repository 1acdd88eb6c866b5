"""generators package."""
