"""The node-side agent, in parts, and the one script they make (``assemble``).

Each part is a stdlib-only module of this package (Python 3.8+), importable on its own for
tests and for the client, which takes the wire's names from ``wire``. The node runs them as
one script: the parts in order, without their imports of each other (one namespace).
This module is the client's and never ships.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

# In the script's order: a part uses only names of parts before it when it runs (a class's
# base, a module-level value); a function may call a later part's function.
PARTS = ("wire", "fsat", "listing", "reading", "writing", "procs", "source", "answer", "environ", "run")
# A part's import of another part: `from .name import a, b` or `from .name import (...)`.
_IMPORT_OF_A_PART = re.compile(rb"^from \.\w+ import (?:\([^)]*\)|[^\n(]*)\n", re.M)


@cache
def assemble() -> bytes:
    """The agent as the node receives it: the parts' sources in order, their imports of one
    another removed (made once per process)."""
    folder = Path(__file__).parent
    sources = [_IMPORT_OF_A_PART.sub(b"", (folder / f"{part}.py").read_bytes()) for part in PARTS]
    return b"\n\n".join(source.rstrip(b"\n") for source in sources) + b"\n"
