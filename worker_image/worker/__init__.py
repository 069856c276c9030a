"""The CPU slice worker: an independent JAX CPU process standing in for one TPU slice."""
