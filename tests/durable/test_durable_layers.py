"""The durable package reads bottom-up in three layers, storage, timers, service, each importing only
the ones below it, with no import circle (an import inside a function counts: run, it closes the
circle as surely as one at the top) and no module patching a class it imported at run time: checked
on the installed sources with ``ast``, every import statement, at module level or inside a function.
Imports under ``if TYPE_CHECKING:`` never run, and are left out. The checkers are tried on small
made-up packages too, so that a check that can no longer fail is seen."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import timerwheel_c.durable as durable

ROOT = Path(durable.__file__).resolve().parent
LAYERS = ["storage", "timers", "service"]


def test_each_layer_imports_only_the_layers_below_it():
    """storage imports nothing from timers or service; timers nothing from service (the backend
    folders of storage included)."""
    modules = _modules(ROOT, "timerwheel_c.durable")
    seen = 0
    for name, path in modules.items():
        layer = _layer(name)
        if layer not in LAYERS:
            continue
        seen += 1
        above = {_layer(t) for t in _imported(name, path, modules)} & set(LAYERS[LAYERS.index(layer) + 1:])
        assert not above, f"{path.relative_to(ROOT)} imports the layer(s) above it: {sorted(above)}"
    assert seen >= 20, "the layers' modules were found"


def test_the_storage_layer_knows_no_timer_key_layout():
    """No storage module (nor its SQL) names the timer layer's tags: the layout lives in timers/keys.py."""
    for path in sorted((ROOT / "storage").rglob("*")):
        if path.suffix in (".py", ".sql"):
            text = path.read_text(encoding="utf-8")
            for layout in ("substr(NEW.key, 11", "'\\x54'", "'\\x53'", "key[9]", "key[10]"):
                assert layout not in text, f"{path.relative_to(ROOT)} holds the key layout {layout!r}"


# -- the package as modules ----------------------------------------------------------------------

def _modules(root: Path, package: str) -> dict:
    """``{dotted module name: path}`` of every module of the package ``package`` at ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def _running_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never run."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _imported(name: str, path: Path, modules: dict) -> dict:
    """``{imported module: line}``: the package's modules that the module ``name`` at ``path``
    imports (a name imported from a package counts as its submodule when there is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict = {}
    for node in _running_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                out.setdefault(target, node.lineno)
    return out


def _layer(name: str, package: str = "timerwheel_c.durable") -> str:
    """The first part of the module ``name`` below ``package`` (its layer); "" for the package itself."""
    return name[len(package) + 1:].split(".")[0]


#: The database drivers: only a backend folder of storage imports one.
DRIVERS = ("psycopg", "psycopg_pool", "sqlite3")
#: The one neutral storage module that imports backend folders: it opens the backend a URL names,
#: importing it only then, so a SQLite program never imports psycopg.
FACTORY = "open"


def _drivers(path: Path) -> set:
    """The drivers (:data:`DRIVERS`) that the module at ``path`` imports, at any level."""
    found = set()
    for node in _running_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found & set(DRIVERS)


def backend_breaks(root: Path, package: str) -> list:
    """``module: what`` of every import that breaks the storage layer's shape: a backend is a folder
    of ``storage/`` (a package: ``storage/postgres/``, ``storage/sqlite/``) that imports no other
    backend; the neutral modules of ``storage/`` (the contract and its helpers) import no backend but
    the factory (:data:`FACTORY`) and no driver; and no module outside ``storage/`` imports a driver."""
    modules = _modules(root, package)
    backends = {path.parent.name for path in (root / "storage").glob("*/__init__.py")}

    def backend(name: str) -> str:
        parts = name[len(package) + 1:].split(".")
        return parts[1] if parts[0] == "storage" and len(parts) > 1 and parts[1] in backends else ""

    breaks = []
    for name, path in modules.items():
        short = name[len(package) + 1:]
        mine = backend(name)
        others = sorted({backend(t) for t in _imported(name, path, modules)} - {"", mine})
        drivers = sorted(_drivers(path))
        if mine:
            breaks += [f"{short}: imports the backend {other}" for other in others]
        elif _layer(name, package) == "storage":
            if short != f"storage.{FACTORY}":
                breaks += [f"{short}: imports the backend {other}" for other in others]
            breaks += [f"{short}: imports the driver {driver}" for driver in drivers]
        else:
            breaks += [f"{short}: imports the driver {driver}" for driver in drivers]
    return breaks


def import_time_calls(root: Path, package: str) -> list:
    """``module:line: text`` of every call, made when the module is imported, of a function that the
    module imported from another module of ``package`` whose result is dropped (a statement of its
    own, or a decorator): a registration into another module's registry, which a reader of that
    module never sees and a program that does not import this one never gets. A call that defines
    a name of this module (``X = f()``) is no registration."""
    found = []
    modules = _modules(root, package)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in _running_nodes(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(package)):
                imported |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name.partition(".")[0] for a in node.names if a.name.startswith(package)}
        todo = list(ast.iter_child_nodes(tree))
        while todo:  # the statements that run on import: not those inside a function
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                calls = node.decorator_list if not isinstance(node, ast.Lambda) else []
            elif isinstance(node, ast.ClassDef):
                calls = list(node.decorator_list)
                todo.extend(node.body)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                calls = [node.value]
            else:
                if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
                    todo.extend(child for child in ast.iter_child_nodes(node)
                                if isinstance(child, (ast.stmt, ast.excepthandler)))
                continue
            for call in calls:
                func = call.func if isinstance(call, ast.Call) else call
                if _root_name(func) in imported:
                    found.append(f"{name}:{call.lineno}: {ast.unparse(call).splitlines()[0]}")
    return sorted(found)


def import_circles(root: Path, package: str) -> list:
    """The import circles among the modules of ``package`` at ``root``: each a list of modules, the
    first repeated at the end. Importing a module imports its packages first, which is no edge
    here: a package's ``__init__`` importing its own modules is no circle."""
    modules = _modules(root, package)
    edges = {name: _imported(name, path, modules) for name, path in modules.items()}
    circles = []
    state: dict = {}  # module -> 1 on the current path, 2 done

    def visit(name: str, path: list) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    return circles


def _root_name(node: ast.AST) -> str:
    """``a`` of ``a``, ``a.B`` or ``a.B.c``; "" for anything else."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def class_patches(root: Path, package: str) -> list:
    """``module:line: text`` of every assignment (or ``setattr``) to an attribute of a name that the
    module imported: a class of another module changed at run time, which a reader of that class
    never sees."""
    found = []
    for name, path in _modules(root, package).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in _running_nodes(tree):
            if isinstance(node, ast.ImportFrom):
                imported |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name.partition(".")[0] for a in node.names}
        for node in _running_nodes(tree):
            targets: list = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                if isinstance(target, ast.Attribute) and _root_name(target.value) in imported:
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_no_import_circle_in_the_durable_package_lazy_ones_included():
    """No two durable modules import each other, directly or around a longer circle, at any level."""
    assert len(_modules(ROOT, "timerwheel_c.durable")) >= 40, "the package's modules were found"
    assert import_circles(ROOT, "timerwheel_c.durable") == []


def test_no_durable_module_patches_a_class_it_imported():
    """A backend's parts are named by its own class (``PostgresStore.ownership_type``), never set on it
    from another module when that one is imported."""
    assert class_patches(ROOT, "timerwheel_c.durable") == []


def test_no_durable_module_picks_a_backend_by_what_is_imported():
    """Which backend a store is, is asked of the store (its class, its methods), never read from
    ``sys.modules``: what another part of the program happened to import decides nothing."""
    for name, path in _modules(ROOT, "timerwheel_c.durable").items():
        assert "sys.modules" not in path.read_text(encoding="utf-8"), name


def test_each_backend_is_a_folder_that_imports_no_other_and_holds_the_drivers():
    """A backend folder of storage imports no other backend; storage's neutral modules import no
    backend (but the factory, which opens the one a URL names) and no driver; nothing above storage
    imports a driver: what a backend needs sits behind the store."""
    backends = sorted(path.parent.name for path in (ROOT / "storage").glob("*/__init__.py"))
    assert backends == ["postgres", "sqlite"], "the backend folders were found"
    assert backend_breaks(ROOT, "timerwheel_c.durable") == []


def test_no_durable_module_registers_into_another_when_imported():
    """Importing a module calls nothing of another module for its effect (a registration, a hook):
    what a backend or a layer needs is passed to it, or declared, never set up by an import."""
    assert import_time_calls(ROOT, "timerwheel_c.durable") == []


def hub_callbacks(source: str, hub: str) -> list:
    """``line: text`` of every call in ``source`` that hands another object a method of the class
    ``hub`` (``self.method``) or a lambda: a callback through which that object would call back into
    the hub. A property (its value, or its getter in ``property(lambda self: ...)``) is no callback."""
    tree = ast.parse(source)
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == hub):
        methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and not any(ast.unparse(d) == "property" for d in n.decorator_list)}
        for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Name) and call.func.id == "property":
                continue
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                handed_method = (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
                                 and arg.value.id == "self" and arg.attr in methods)
                if handed_method or isinstance(arg, ast.Lambda):
                    # The source as written: ast.unparse writes "lambda : x" before Python 3.11.
                    found.append(f"{call.lineno}: {ast.get_source_segment(source, call).splitlines()[0]}")
    return found


def test_no_stage_of_the_durable_service_calls_back_into_it():
    """The service wires its stages (claim, run, commit) and hands them objects (the next stage, the
    recorder, the wakeup), never one of its own methods nor a lambda to call back through: a timer's
    walk from claim to commit reads in the stages' modules, in order, without a turn through
    ``service.py``. A stage importing the service module would be an import circle, which
    :func:`test_no_import_circle_in_the_durable_package_lazy_ones_included` refuses."""
    source = (ROOT / "service" / "service.py").read_text(encoding="utf-8")
    assert "class DurableTimerService" in source, "the service's class was found"
    assert hub_callbacks(source, "DurableTimerService") == []


def _package(tmp_path: Path, files: dict) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_the_circle_check_sees_a_circle_closed_by_an_import_inside_a_function(tmp_path):
    """``a`` imports ``b`` at its top, ``b`` imports ``a`` only inside a function: a circle. The same
    import under ``if TYPE_CHECKING:`` is none."""
    lazy = _package(tmp_path, {"a.py": "from . import b\n",
                               "b.py": "def f():\n    from .a import x\n    return x\n"})
    assert import_circles(lazy, "pkg") == [["pkg.a", "pkg.b", "pkg.a"]]
    typing_only = _package(tmp_path / "t", {"a.py": "from .b import y\n",
                                            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"})
    assert import_circles(typing_only, "pkg") == []
    layered = _package(tmp_path / "l", {"low/__init__.py": "", "low/s.py": "X = 1\n",
                                        "up/__init__.py": "", "up/t.py": "def f():\n    from ..low import s\n"})
    assert import_circles(layered, "pkg") == []


def test_the_patch_check_sees_a_class_of_another_module_changed_at_run_time(tmp_path):
    """An assignment to, or ``setattr`` on, an imported class is found, at the top of a module or
    inside a function; a module setting its own class's attribute is not."""
    root = _package(tmp_path, {
        "store.py": "class Store:\n    kind = None\nStore.kind = 1\n",
        "up.py": "from .store import Store\nStore.kind = 2\n",
        "later.py": "def wire():\n    from . import store\n    setattr(store.Store, 'kind', 3)\n"})
    assert class_patches(root, "pkg") == ["pkg.later:3: setattr(store.Store, 'kind', 3)", "pkg.up:2: Store.kind = 2"]


def test_the_backend_check_sees_a_crossing_between_backends_and_a_driver_above_storage(tmp_path):
    """One backend importing another (even inside a function), a neutral storage module importing a
    backend, and a module above storage importing a driver are each found; a backend importing its
    driver and the neutral modules, and the factory importing a backend, are not."""
    root = _package(tmp_path, {
        "storage/__init__.py": "",
        "storage/store.py": "X = 1\n",
        "storage/open.py": "def open_store():\n    from .one.store import S\n",
        "storage/helper.py": "from .two import T\nimport sqlite3\n",
        "storage/one/__init__.py": "",
        "storage/one/store.py": "import psycopg\nfrom ..store import X\ndef f():\n    from ..two.store import T\n",
        "storage/two/__init__.py": "",
        "storage/two/store.py": "import sqlite3\n",
        "timers/__init__.py": "",
        "timers/t.py": "def f():\n    import psycopg.rows\n"})
    assert sorted(backend_breaks(root, "pkg")) == [
        "storage.helper: imports the backend two", "storage.helper: imports the driver sqlite3",
        "storage.one.store: imports the backend two", "timers.t: imports the driver psycopg"]


def test_the_registration_check_sees_a_call_into_another_module_at_import(tmp_path):
    """A statement that calls an imported function of the package when the module is imported (at
    its top, under an ``if``, in a class body, or as a decorator) is found; the same call inside a
    function, a call whose result the module keeps, and a call of the standard library are not."""
    root = _package(tmp_path, {
        "low.py": "HOOKS = {}\ndef register(v, f):\n    HOOKS[v] = f\ndef hook(f):\n    return f\n",
        "up.py": ("from .low import register, hook\nimport logging\n"
                  "def rewrite(rows):\n    return rows\n"
                  "register(9, rewrite)\n"
                  "if True:\n    register(10, rewrite)\n"
                  "@hook\ndef g():\n    register(11, rewrite)\n"
                  "KEPT = register(12, rewrite)\nlogging.getLogger('x')\n"),
        "pkgwide.py": "import pkg.low\nclass C:\n    pkg.low.register(13, None)\n"})
    assert import_time_calls(root, "pkg") == [
        "pkg.pkgwide:3: pkg.low.register(13, None)", "pkg.up:5: register(9, rewrite)",
        "pkg.up:7: register(10, rewrite)", "pkg.up:8: hook"]


def test_the_callback_check_sees_a_method_or_a_lambda_handed_to_a_part():
    """A bound method of the hub, or a lambda, handed to another object is found, as an argument or
    a keyword; an object handed over, a call of the hub's own method and a property are not."""
    source = (
        "class Hub:\n"
        "    size = property(lambda self: 1)\n"
        "    def __init__(self, part):\n"
        "        self.a = part(self.done, self.recorder, self.helper(), self.running)\n"
        "        self.b = part(on_free=lambda: self.helper())\n"
        "    def done(self):\n"
        "        pass\n"
        "    def helper(self):\n"
        "        pass\n"
        "    @property\n"
        "    def running(self):\n"
        "        return True\n")
    assert hub_callbacks(source, "Hub") == ["4: part(self.done, self.recorder, self.helper(), self.running)",
                                            "5: part(on_free=lambda: self.helper())"]
