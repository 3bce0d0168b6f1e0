"""Kubernetes objects -> core types (pure converters), and the watch that keeps state current."""
