"""What every bench script ends with: print the result as JSON and, with --out, write it there too."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out: str | None = None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
