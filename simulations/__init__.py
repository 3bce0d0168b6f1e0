"""Offline what-if: replay cluster traces through the placement core, policy by policy."""
