"""Tools for the project's documentation (not part of the product package): run from the repository root as
`python -m tools.<name>`."""
