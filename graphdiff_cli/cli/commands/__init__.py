"""One module per command; each decorates a function with ``@app.command``."""
