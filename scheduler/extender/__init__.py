"""scheduler/extender."""
