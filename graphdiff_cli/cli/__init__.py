"""The typer command line: thin commands over ``graphdiff_cli.stages``, one error boundary."""
