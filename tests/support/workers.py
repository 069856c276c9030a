"""Slice worker process fixtures."""
