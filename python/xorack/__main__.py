"""``python -m xorack`` runs the ``xorack`` command (see ``xorack.cli``)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
