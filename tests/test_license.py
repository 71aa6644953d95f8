"""The licence pyproject.toml declares ships as its text: LICENSE is the Apache License 2.0, word for word."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the text every Apache-2.0 project ships
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_file_is_the_apache_2_text_pyproject_declares():
    # (no tomllib: Python 3.10 is supported)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2\.0"$', pyproject, re.M)  # an SPDX expression
    assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, re.M)  # shipped in the wheel and the sdist
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    assert b"Apache License\n                           Version 2.0, January 2004" in text
