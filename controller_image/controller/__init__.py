"""The controller runtime: the one long-lived process that runs the training loop."""
