"""Where a test finds the checkout and the helpers the tiers share, from whichever tier folder it
sits in: ``TESTS`` is this folder (conftest.py and the shared helpers, on ``sys.path`` through
pyproject's ``pythonpath``, which a helper run as a process gets as its ``PYTHONPATH``), ``CHECKOUT``
the repository around it."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
CHECKOUT = TESTS.parent
