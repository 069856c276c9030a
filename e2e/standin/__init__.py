"""The local control plane's own tests (the stand-in kubelet, the real control plane as host processes):
what the product's local-tier tests in e2e/ rely on, tested apart from the product."""
