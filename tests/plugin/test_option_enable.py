"""--rocm-parity: opt-in; without it parity tests skip with a reason naming the flag."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_rocm_parity.options import ENABLE


def test_skipped_without_flag(project: pytest.Pytester) -> None:
    result = project.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*{ENABLE}*"])


def test_marker_alone_is_skipped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        @pytest.mark.parity
        def test_x():
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--rocm-parity*"])


def test_ini_key_enables(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nrocm_parity = true\nparity_mode = capture\n")
    project.runpytest().assert_outcomes(passed=1)
    assert (project.path / "goldens" / "tiny" / "manifest.json").exists()


@pytest.mark.parametrize("key, flag", [("rocm_parity", ENABLE), ("parity_ladder", None)])
def test_bad_ini_boolean_is_a_usage_error(project: pytest.Pytester, key: str, flag: str | None) -> None:
    enable = "" if key == "rocm_parity" else "rocm_parity = true\n"
    ini = project.makeini(f"[pytest]\n{enable}{key} = maybe\n")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: ini key {key} = 'maybe' in {ini} is not a boolean; accepted values: true or "
                                 f"false (also yes/no, on/off, 1/0*" + (f"or pass {flag} on the command line" if flag
                                                                        else "Fix or remove the line")])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_plain_run_does_not_import_torch(pytester: pytest.Pytester) -> None:
    """Loading the plugin in a project that never uses it stays cheap and silent."""
    pytester.makepyfile("def test_ok():\n    import sys\n    assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pytester.path)],
                          capture_output=True, text=True, cwd=pytester.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rocm-parity" not in proc.stdout


def test_plugin_module_imports_no_heavy_dependency() -> None:
    code = ("import sys, pytest_rocm_parity.plugin, pytest_rocm_parity.options;"
            "bad = [m for m in ('torch', 'pandas', 'hypothesis', 'numpy', 'safetensors') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_header_shows_mode(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.stdout.fnmatch_lines(["rocm-parity: mode=capture device=auto*"])


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    """`pytest --help` renders every option's help (argparse %-formats it: a bare % breaks --help)."""
    from pytest_rocm_parity import options

    result = pytester.runpytest("--help")
    assert result.ret == 0, result.stderr.str()[-2000:]
    flags = [v for k, v in vars(options).items() if k.isupper() and isinstance(v, str) and v.startswith("--")]
    assert ENABLE in flags and len(flags) > 5
    text = result.stdout.str()
    assert all(f in text for f in flags), [f for f in flags if f not in text]
