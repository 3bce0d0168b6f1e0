"""gpufrag: shared plumbing for every component (CLI entry point, logging, input errors).

Kept deliberately tiny so that the placement core can depend on it without pulling in
any web or Kubernetes libraries.
"""
