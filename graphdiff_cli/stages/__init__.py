"""One function per command: read artifacts -> core -> write artifacts.

Stages report progress through a callback ``progress(done, total)`` and never import typer or rich.
"""
