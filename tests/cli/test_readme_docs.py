"""The README's first screen, its glossary and options table, and the CI recipe in docs/ci.md."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_rocm_parity import options

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text("utf-8")
CI_DOC = (ROOT / "docs" / "ci.md").read_text("utf-8")
FIRST_SCREEN = "\n".join(README.splitlines()[:45])


def _fences(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)


def test_first_screen_has_install_a_five_line_test_capture_replay_and_a_failure() -> None:
    blocks = _fences(FIRST_SCREEN)
    assert any("pip install" in b and "pytest-rocm-parity" in b for b in blocks)
    test = next(b for b in blocks if "def test_" in b)
    code = [l for l in test.splitlines() if l.strip()]
    assert len(code) == 5 and "parity.check(" in test
    assert '"use_cache": False' in test   # HF decoders replay fast only without a KV cache
    cmds = next(b for b in blocks if "--parity-mode=capture" in b)
    assert re.search(r"^pytest --rocm-parity test_parity\.py", cmds, re.M)
    failure = next(b for b in blocks if b.startswith("parity check failed"))
    assert "culprit:" in failure and "more ok" in failure and len(failure.splitlines()) <= 12
    # the measurements and this repository's own test command come later
    assert FIRST_SCREEN.count("conftest_examples") == 0


def test_glossary_defines_every_term_before_the_details() -> None:
    terms = re.search(r"^## Terms\n(.*?)^## ", README, re.S | re.M)
    assert terms and README.index("## Terms") < README.index("## What it does")
    defined = set(re.findall(r"^\| (\w+) \|", terms.group(1), re.M))
    assert {"rung", "propagated", "isolated", "budget", "z", "drill", "sketch", "culprit"} <= defined


def test_ci_runs_exactly_the_readme_test_command() -> None:
    block = re.search(r"Run the tests.*?```bash\n(.*?)\n```", README, re.S)
    assert block, "the README's 'Run the tests' command"
    run = (ROOT / ".ci" / "run").read_text()
    assert block.group(1).strip() in run.splitlines()


def test_options_table_lists_every_option() -> None:
    parser = pytest.Parser(_ispytest=True)
    options.addoption(parser)
    group = parser.getgroup("rocm-parity")
    flags = {name for o in group.options for name in o.names() if name.startswith("--")}
    inis = set(parser._inidict)
    table = README[README.index("## Options"):README.index("## Commands")]
    assert "--parity-profile" in flags
    for flag in flags:
        assert f"`{flag}" in table, f"{flag} is missing from the README's options table"
    for ini in inis:
        assert f"`{ini}`" in table, f"ini key {ini} is missing from the README's options table"
    for documented in re.findall(r"^\| `(--[a-z-]+)", table, re.M):
        assert documented in flags, f"the README documents {documented}, which options.py does not define"


def test_ci_recipe() -> None:
    assert "runs-on: ubuntu-latest" in CI_DOC and "--parity-device=cpu" in CI_DOC          # CPU candidate
    assert "image: rocm/pytorch" in CI_DOC                                                # ROCm container
    assert "--device=/dev/kfd" in CI_DOC and "--device=/dev/dri" in CI_DOC and "--group-add video" in CI_DOC
    assert "actions/upload-artifact" in CI_DOC and "--parity-report=" in CI_DOC           # the report
    assert "github/codeql-action/upload-sarif" in CI_DOC and "--format sarif" in CI_DOC   # SARIF
    assert CI_DOC.count("lfs: true") >= 2 and "git lfs track" in CI_DOC                   # goldens via git-lfs
    assert "filter=lfs diff=lfs merge=lfs -text" in CI_DOC
    assert "docs/ci.md" in README


def test_the_readme_failure_example_is_the_renderers_own() -> None:
    """The README's example table, rendered again: a 3-layer Llama at bf16 whose GELU in layer 1 is
    scaled by 1.05, replayed on the CPU. The rows, their columns and verdicts are the renderer's
    (`python -m pytest -s tests/cli/test_readme_docs.py -k renderers` prints the whole message)."""
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from parity_models import capture_then_replay, llama, tokens
    from pytest_rocm_parity.judging.assertion import message
    from pytest_rocm_parity.runner.engine import CheckSpec

    def candidate() -> torch.nn.Module:
        m = llama(num_hidden_layers=3)
        m.model.layers[1].mlp.act_fn.forward = lambda x: torch.nn.functional.gelu(x, approximate="tanh") * 1.05
        return m

    (res,) = capture_then_replay(lambda: llama(num_hidden_layers=3), candidate(), tokens(seq=32),
                                 CheckSpec(name="my-model", dtypes=["bfloat16"], drill=2))
    rendered = message(res)
    print(rendered)
    failure = next(b for b in _fences(FIRST_SCREEN) if b.startswith("parity check failed"))
    table = [l for l in failure.splitlines() if l.startswith("  ") and not l.startswith(("  reference", "  candidate"))]
    got = rendered.splitlines()
    for line in table:
        if line.startswith("  culprit:"):   # the README cuts the reason short
            assert any(g.startswith(line.split("(...)")[0]) for g in got), (line, rendered)
        else:
            assert line in got, (line, rendered)
