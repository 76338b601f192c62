"""The layout's rules hold: no import cycles between the package's modules (imports inside functions
included; type-only imports aside) and no private name imported across subpackages."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pytest_rocm_parity"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> list[tuple[str, str]]:
    """(module imported, name) for every import of ours in ``path``, outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    typing_only = {id(x) for n in ast.walk(tree) if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
                   for x in ast.walk(n)}
    out = []
    for n in ast.walk(tree):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pytest_rocm_parity"):
            for a in n.names:
                full = f"{n.module}.{a.name}"
                out.append((full if full in mods else n.module, a.name))
        elif isinstance(n, ast.Import):
            out += [(a.name, "") for a in n.names if a.name.startswith("pytest_rocm_parity")]
    return out


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def test_no_import_cycles() -> None:
    mods = _modules()
    graph = {m: {t for t, _ in _imports(p, mods) if t in mods and t != m} for m, p in mods.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            assert state.get(t) != 1, "import cycle: " + " -> ".join(path[path.index(t):] + [t])
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_names_across_subpackages() -> None:
    mods = _modules()
    crossing = [(m, t, name) for m, p in mods.items() for t, name in _imports(p, mods)
                if name.startswith("_") and not name.startswith("__") and _subpackage(m) != _subpackage(t)]
    assert not crossing, crossing


def test_the_surface_names_its_subpackages() -> None:
    """Every subpackage says in its docstring which concern it holds."""
    for init in PKG.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init} needs a docstring naming its concern"


def test_test_modules_have_unique_names() -> None:
    """The test folders have no __init__.py, so pytest imports each test module by its basename:
    two of one name in different folders stop the whole run at collection ("import file mismatch")."""
    seen: dict[str, Path] = {}
    clashes = []
    for p in sorted((PKG.parent / "tests").rglob("test_*.py")):
        if p.name in seen:
            clashes.append(f"{seen[p.name]} and {p}")
        seen.setdefault(p.name, p)
    assert not clashes, clashes
