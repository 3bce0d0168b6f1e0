"""scheduler/kube."""
