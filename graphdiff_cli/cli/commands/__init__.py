"""One module per command; each registers a function with ``common.command``."""
