"""The package root is the public API: every name the README and docs import from it resolves, and
dir() shows them although they load lazily."""
from __future__ import annotations

import re
from pathlib import Path

import pytest_rocm_parity

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"from pytest_rocm_parity import ([\w, ()]+)")


def _documented() -> set[str]:
    names: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in IMPORT.finditer(doc.read_text(encoding="utf-8")):
            names |= {n.split(" as ")[0].strip(" ()") for n in m.group(1).split(",") if n.strip(" ()")}
    return names


def test_every_name_the_docs_import_from_the_root_resolves() -> None:
    documented = _documented()
    assert {"layer_frame", "assert_compiles_for", "record_golden", "check_op"} <= documented
    missing = sorted(n for n in documented if not hasattr(pytest_rocm_parity, n))
    assert not missing, f"docs import these from pytest_rocm_parity, which lacks them: {missing}"


def test_the_api_is_listed_by_dir_and_every_listed_name_resolves() -> None:
    listed = dir(pytest_rocm_parity)
    assert set(pytest_rocm_parity.__all__) <= set(listed)
    for name in ("GoldenCorrupt", "GoldenStale", "GoldenMissing", "ErrorModel", "compare_op"):
        assert name in pytest_rocm_parity.__all__
    for name in pytest_rocm_parity.__all__:
        assert getattr(pytest_rocm_parity, name) is not None, name


def test_every_error_the_plugin_raises_is_importable_from_the_root() -> None:
    import inspect

    from pytest_rocm_parity import errors

    raised = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.ParityError)}
    assert raised - set(pytest_rocm_parity.__all__) == set()


def test_no_doc_tells_users_to_import_from_an_internal_module() -> None:
    internal = re.compile(r"from pytest_rocm_parity\.[\w.]+ import")
    docs = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "architecture.md")]
    found = [f"{d.name}: {m.group(0)}" for d in docs for m in internal.finditer(d.read_text(encoding="utf-8"))
             if "python -c" not in d.read_text(encoding="utf-8")[max(0, m.start() - 200):m.start()]]
    assert not found, found
