"""The `accum` command line: a thin client of the HTTP API plus the local-mode launchers."""
