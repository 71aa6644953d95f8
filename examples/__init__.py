"""Runnable examples of graphdiff in trainer loops (a package only so that lint-imports checks that they use
only graphdiff_cli's public names)."""
