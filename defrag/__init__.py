"""defrag."""
