"""``python -m graphdiff_cli.cli``: the same as the ``graphdiff`` command."""

from .client import main

main()
