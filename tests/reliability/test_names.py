"""Any check name (test ids with '/', '..', unicode, very long parametrize ids) maps to a
safe file name inside the golden directory, distinct for distinct names, even on case-insensitive disks."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_rocm_parity.golden.store import MAX_NAME, GoldenStore, safe_name

SAFE = re.compile(r"[A-Za-z0-9._-]+")
WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}

NASTY = ["../../etc/passwd", "..", ".", "", "/", "a/b", "a_b", "a\\b", "test_x.py::test_y[a/b]", "tëst", "test",
         "TEST", "Test", "a" * 300, "a" * 299 + "b", "\x00", "name\n", "-rf", "con", "CON", "nul.txt", "x-0123456789ab",
         "..a", "a..b", "\ud800", "日本語/テスト", "ＡＢＣ", " ", "~", "$HOME", "a" * MAX_NAME, "a" * (MAX_NAME + 1)]


def assert_safe(out: str) -> None:
    assert SAFE.fullmatch(out), out
    assert out not in (".", "..") and not out.startswith(".") and ".." not in out
    assert len(out.encode()) <= 255 and len(out) <= MAX_NAME + 13
    assert out.lower().split(".")[0] not in WINDOWS_RESERVED, out


@pytest.mark.parametrize("name", NASTY, ids=range(len(NASTY)))
def test_nasty_names_are_safe(name: str, tmp_path: Path) -> None:
    out = safe_name(name)
    assert_safe(out)
    store = GoldenStore(tmp_path / "goldens")
    d = store.dir_for(name)
    assert d.parent == store.root
    d.mkdir(parents=True)   # a real file system accepts it
    assert d.resolve().parent == store.root.resolve()


def test_nasty_names_are_distinct_case_insensitively() -> None:
    outs = [safe_name(n).casefold() for n in NASTY]
    assert len(set(outs)) == len(NASTY)


def test_simple_names_are_kept() -> None:
    """Plain lower-case names stay readable (the golden directory is browsed and reviewed in git)."""
    for n in ("tiny", "resnet50", "bert.encoder", "llama_7b-fp16"):
        assert safe_name(n) == n


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=400), min_size=2, max_size=2, unique=True))
@example(["a/b", "a_b"])
@example(["A", "a"])
@example(["x", "x-" + safe_name("x/")[-12:]])
@example(["a" * 200, "a" * 201])
def test_distinct_names_give_distinct_safe_names(names: list[str]) -> None:
    a, b = names
    sa, sb = safe_name(a), safe_name(b)
    assert_safe(sa)
    assert_safe(sb)
    assert sa.casefold() != sb.casefold(), (a, b)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("./\\-_aA.é\x00 :[]"), max_size=50))
def test_path_characters_never_escape(name: str) -> None:
    store = GoldenStore("/goldens")
    d = store.dir_for(name)
    assert d.parent == Path("/goldens") and d.name == safe_name(name)
    assert_safe(d.name)


IDS_TEST = '''
import pytest, torch

IDS = ["a/b", "a_b", "..", "../../escape", "ünï/çødé", "x" * 400, "x" * 399 + "y", "A", "a", "con"]

@pytest.mark.parametrize("k", range(len(IDS)), ids=IDS)
def test_ids(parity, k):
    torch.manual_seed(k)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3))
    parity.check(m, torch.ones(1, 3), dtypes="float32")
'''


def test_parametrize_ids_through_the_fixture(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parametrized test gets its own golden inside goldens/; replay finds each one again."""
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_ids=IDS_TEST)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=10)
    root = (pytester.path / "goldens").resolve()
    manifests = sorted(root.glob("*/manifest.json"))
    assert len(manifests) == 10
    assert len({m.parent.name.casefold() for m in manifests}) == 10
    written = [p for p in pytester.path.rglob("*") if p.name == "manifest.json" or p.suffix == ".safetensors"]
    assert len(written) == 20 and all(p.resolve().parent.parent == root for p in written)
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=10)
