"""The durable package reads bottom-up in three layers, storage, timers, service, each importing only
the ones below it: checked on the installed sources with ``ast``, every import statement, at module
level or inside a function."""
from __future__ import annotations

import ast
from pathlib import Path

import timerwheel_c.durable as durable

ROOT = Path(durable.__file__).resolve().parent
LAYERS = ["storage", "timers", "service"]



def _imported_layers(path: Path) -> set:
    """The durable layers that ``path`` (a module inside a layer) imports, by relative import."""
    layers = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level >= 2:  # from ..timers import x, from ..service.service import y
                target = (node.module or "").split(".")[0]
                layers |= {target} if target else {alias.name for alias in node.names}
            elif node.level == 0 and (node.module or "").startswith("timerwheel_c.durable."):
                layers.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            layers |= {a.name.split(".")[2] for a in node.names if a.name.startswith("timerwheel_c.durable.")}
    return layers & set(LAYERS)


def test_each_layer_imports_only_the_layers_below_it():
    """storage imports nothing from timers or service; timers nothing from service."""
    seen = 0
    for rank, layer in enumerate(LAYERS):
        for path in sorted((ROOT / layer).glob("*.py")):
            seen += 1
            above = {t for t in _imported_layers(path) if LAYERS.index(t) > rank}
            assert not above, f"{path.relative_to(ROOT)} imports the layer(s) above it: {sorted(above)}"
    assert seen >= 20, "the layers' modules were found"


def test_the_storage_layer_knows_no_timer_key_layout():
    """No storage module (nor its SQL) names the timer layer's tags: the layout lives in timers/keys.py."""
    for path in sorted((ROOT / "storage").rglob("*")):
        if path.suffix in (".py", ".sql"):
            text = path.read_text(encoding="utf-8")
            for layout in ("substr(NEW.key, 11", "'\\x54'", "'\\x53'", "key[9]", "key[10]"):
                assert layout not in text, f"{path.relative_to(ROOT)} holds the key layout {layout!r}"
