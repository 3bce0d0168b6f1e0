"""End-to-end tests against a real Kubernetes control plane (see devkit.controlplane)."""
