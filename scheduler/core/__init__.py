"""scheduler/core."""
