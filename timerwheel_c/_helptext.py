"""Command-line help from docstrings: the reStructuredText inline markup removed.

The CLI modules' docstrings are their help, and they are also read as reST (in an editor,
by Sphinx); a terminal shows the markup literally, so it is stripped here rather than
kept out of the docstrings.
"""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["terminal_text"]

# :role:`text <target>`, :role:`~a.b.Name`, :role:`name` (Sphinx cross-references).
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(?:([^`<]*?)\s*<[^`>]*>|~?(?:[\w.]+\.)?([^`]+))`")
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"`([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(\S)::$", re.MULTILINE)


def terminal_text(doc: Optional[str]) -> Optional[str]:
    """``doc`` (a str of reST) as plain terminal text: roles, ``literals`` and `interpreted`
    text lose their markup, and a paragraph ending ``::`` (a literal block follows) ends ``:``.
    None (docstrings stripped by ``python -OO``) stays None: argparse then shows no description.
    """
    if doc is None:
        return None
    text = _ROLE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), doc)
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    return _LITERAL_BLOCK.sub(r"\1:", text).strip()
