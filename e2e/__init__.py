"""End-to-end tests against a local Kubernetes control plane (see e2e/README.md)."""
