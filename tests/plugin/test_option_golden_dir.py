"""--parity-golden-dir / parity_golden_dir: where goldens live; names safe for any test id."""
from __future__ import annotations

import pytest


def test_flag_sets_directory(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-golden-dir=gold/en").assert_outcomes(passed=1)
    assert (project.path / "gold" / "en" / "tiny" / "manifest.json").exists()
    project.runpytest("--rocm-parity", "--parity-golden-dir=gold/en").assert_outcomes(passed=1)


def test_ini_key_sets_directory(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_golden_dir = ini_goldens\n")
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    assert (project.path / "ini_goldens" / "tiny" / "manifest.json").exists()


def test_default_names_from_node_ids_are_distinct(project: pytest.Pytester) -> None:
    project.makepyfile(test_ids='''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.parametrize("tag", ["a.b", "a_b", "x/../y"])
def test_named(parity, tag):
    parity.check(make_model(), make_inputs(), dtypes=["float32"])
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture", "test_ids.py").assert_outcomes(passed=3)
    dirs = sorted(p.name for p in (project.path / "goldens").iterdir())
    assert len(dirs) == 3 and len(set(dirs)) == 3
    assert all(".." not in d and "/" not in d for d in dirs)
    project.runpytest("--rocm-parity", "test_ids.py").assert_outcomes(passed=3)


@pytest.mark.parametrize("mode", ["capture", "replay"])
def test_a_golden_dir_that_is_a_file_stops_the_run_once(project: pytest.Pytester, mode: str) -> None:
    """Said once, before any check, not as a write (or read) error of every check."""
    (project.path / "goldens.txt").write_text("not a directory")
    result = project.runpytest("--rocm-parity", f"--parity-mode={mode}", "--parity-golden-dir=goldens.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: rocm-parity: --parity-golden-dir: */goldens.txt is a file, not a directory*"])


def test_missing_directory_is_named_in_the_error_and_the_summary(project: pytest.Pytester) -> None:
    rep = project.runpytest("--rocm-parity", "--parity-golden-dir=no/such/dir")
    rep.assert_outcomes(failed=1)
    out = rep.stdout.str()
    where = project.path / "no" / "such" / "dir"
    assert f"GoldenMissing: no golden for 'tiny': the golden directory {where} does not exist" in out
    assert "point --parity-golden-dir (or the parity_golden_dir ini key)" in out and "--parity-mode=capture" in out
    summary = out.split("rocm-parity summary")[1]
    assert "goldens missing: tiny" in summary and f"The golden directory {where} does not exist" in summary
    assert not where.exists()


def printed_command(out: str, after: str) -> list[str]:
    """The arguments of the pytest command a message prints after ``after``, as a shell splits them."""
    import shlex

    line = next(l for l in out.splitlines() if after in l)
    return shlex.split(line.split(after, 1)[1])[1:]   # without "pytest"


def test_the_missing_directory_message_captures_into_that_directory(project: pytest.Pytester) -> None:
    """The capture command of the missing-directory message keeps --parity-golden-dir and quotes a
    parametrized test id: run as printed (split as a shell would), it creates the goldens the replay reads."""
    project.makepyfile(test_tiny='''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.parametrize("dtype", ["float32"])
def test_tiny(parity, dtype):
    parity.check(make_model(), make_inputs(), dtypes=[dtype])
''')
    rep = project.runpytest("--rocm-parity", "--parity-golden-dir=gold_empty")
    rep.assert_outcomes(failed=1)
    out = rep.stdout.str()
    assert ("the reference machine: pytest --rocm-parity --parity-golden-dir=gold_empty --parity-mode=capture "
            "'test_tiny.py::test_tiny[float32]'") in out
    summary = out.split("rocm-parity summary")[1]
    assert "reference machine: pytest --rocm-parity --parity-golden-dir=gold_empty --parity-mode=capture" in summary
    args = printed_command(out, "by capturing on the reference machine: ")
    project.runpytest(*args).assert_outcomes(passed=1)
    assert (project.path / "gold_empty").is_dir()
    project.runpytest("--rocm-parity", "--parity-golden-dir=gold_empty").assert_outcomes(passed=1)


def test_a_missing_golden_in_an_existing_directory_says_how_to_capture(project: pytest.Pytester) -> None:
    (project.path / "goldens").mkdir()
    rep = project.runpytest("--rocm-parity")
    rep.assert_outcomes(failed=1)
    out = rep.stdout.str()
    assert "no golden for 'tiny' in" in out and "--parity-mode=capture 'test_tiny.py::test_tiny'" in out
    assert "does not exist" not in out


def test_the_capture_and_regen_commands_repeat_a_golden_dir_flag(project: pytest.Pytester) -> None:
    """A printed command run as it is must reach the directory this run used."""
    (project.path / "my goldens").mkdir()
    rep = project.runpytest("--rocm-parity", "--parity-golden-dir=my goldens")
    rep.assert_outcomes(failed=1)
    assert "pytest --rocm-parity --parity-golden-dir='my goldens' --parity-mode=capture 'test_tiny.py::test_tiny'" \
        in rep.stdout.str()
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-golden-dir=my goldens").assert_outcomes(
        passed=1)
    bad = project.path / "test_tiny.py"
    bad.write_text(bad.read_text().replace("make_inputs()", "make_inputs() * 2"))
    rep = project.runpytest("--rocm-parity", "--parity-golden-dir=my goldens")
    assert "pytest --rocm-parity --parity-golden-dir='my goldens' --parity-regen=" in rep.stdout.str()


def test_without_a_config_file_the_header_says_to_pin_the_golden_dir(project: pytest.Pytester) -> None:
    """Without an ini file pytest's rootdir, and so <rootdir>/goldens, follows the arguments."""
    pin = "*no pytest configuration file, so the goldens' place follows pytest's rootdir*"
    bare = project.runpytest("--rocm-parity", "--parity-mode=capture")
    bare.stdout.fnmatch_lines([pin])
    project.makeini("[pytest]\n")
    assert "no pytest configuration file" not in project.runpytest("--rocm-parity").stdout.str()
    (project.path / "tox.ini").unlink()   # what makeini wrote
    assert "no pytest configuration file" not in project.runpytest(
        "--rocm-parity", "--parity-golden-dir=goldens").stdout.str()


def test_a_stale_rung_asked_by_dtypes_gets_a_regen_command_that_captures_it(project: pytest.Pytester) -> None:
    """--parity-dtypes asks for a rung the golden lacks: the printed command, run as it is, captures
    that rung and the replay passes."""
    import shlex

    project.makepyfile(test_tiny=(project.path / "test_tiny.py").read_text().replace(', dtypes=["float32"]', ""))
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-dtypes=float32").assert_outcomes(passed=1)
    rep = project.runpytest("--rocm-parity", "--parity-dtypes=bfloat16")
    line = next(l for l in rep.stdout.str().splitlines() if "--parity-regen=" in l)
    cmd = shlex.split(line[line.index("pytest --rocm-parity"):].split(";")[0])
    assert cmd[0] == "pytest" and "--parity-dtypes=bfloat16" in cmd
    project.runpytest(*cmd[1:]).assert_outcomes(passed=1)
    project.runpytest("--rocm-parity", "--parity-dtypes=bfloat16").assert_outcomes(passed=1)


def test_a_misspelled_setting_is_a_usage_error_with_the_right_name(project: pytest.Pytester) -> None:
    """pytest only warns of an unknown ini key: a misspelled parity_golden_dir would put the goldens
    in the default folder, quietly. A key of the plugin's namespace it does not know stops the run."""
    project.makeini("[pytest]\nparity_golden_dirs = elsewhere\n")
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini key parity_golden_dirs in *tox.ini is not a pytest-rocm-parity setting; "
                                 "did you mean parity_golden_dir?*"])
    assert not (project.path / "goldens").exists() and not (project.path / "elsewhere").exists()


@pytest.mark.parametrize(("ini", "says"), [
    ("parity-golden-dir = elsewhere", "*ini key parity-golden-dir in *tox.ini is written like a flag: ini keys use "
                                      "underscores, parity_golden_dir = ...; pytest ignores parity-golden-dir*"),
    ("rocm-parity = true", "*ini key rocm-parity in *tox.ini is written like a flag: ini keys use underscores, "
                           "rocm_parity = ...*"),
    ("parity_regen = tiny", "*ini key parity_regen in *tox.ini: --parity-regen has no ini key*command line*")])
def test_a_setting_spelt_as_its_flag_is_a_usage_error_with_the_key(project: pytest.Pytester, ini: str,
                                                                   says: str) -> None:
    """A key copied from the flag's spelling is one pytest ignores (with a generic warning): the
    goldens would go to the default folder, or every parity test would be skipped."""
    project.makeini(f"[pytest]\n{ini}\n")
    result = project.runpytest("--parity-mode=capture")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([says])
    assert not (project.path / "goldens").exists() and not (project.path / "elsewhere").exists()


@pytest.mark.parametrize("flag", ["--parity-golden-dir=", "--parity-report= "])
def test_an_empty_option_value_is_a_usage_error(project: pytest.Pytester, flag: str) -> None:
    """--parity-golden-dir=$GOLDENS with GOLDENS unset must not fall back to the default folder."""
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{flag.split('=')[0]}=* is empty (a shell variable that is not set, say)*"])
    assert not (project.path / "goldens").exists()


def test_a_misspelled_setting_given_with_o_names_the_option_not_the_ini_file(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_dtypes = float32\n")
    result = project.runpytest("--rocm-parity", "-o", "parity_golden_dri=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini key parity_golden_dri given with -o parity_golden_dri=x is not a "
                                 "pytest-rocm-parity setting; did you mean parity_golden_dir?*"])
    assert "tox.ini" not in result.stderr.str()


def test_a_golden_whose_manifest_was_deleted_says_restore_it(project: pytest.Pytester) -> None:
    """Its tensor files are there without the manifest that names and hashes them: the error says so
    and how to restore it, and the summary's leftover line does not only offer to delete them."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    manifest = project.path / "goldens" / "tiny" / "manifest.json"
    manifest.unlink()
    rep = project.runpytest("--rocm-parity")
    rep.assert_outcomes(failed=1)
    rep.stdout.fnmatch_lines([f"*GoldenMissing: no golden for 'tiny': *tiny holds its tensor files (*.safetensors) but "
                              f"no manifest.json*Restore it from version control (git checkout {manifest}), or "
                              f"capture it again: *--parity-mode=capture*",
                              "leftover files (no manifest names them: a stopped capture's, a file a regeneration replaced while another "
                              "run was reading it, or a golden's whose "
                              "manifest.json is gone, which git checkout restores*"])


def test_a_missing_golden_names_goldens_of_close_names(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_tiny=(project.path / "test_tiny.py").read_text().replace('name="tiny"', 'name="tinyy"'))
    rep = project.runpytest("--rocm-parity")
    rep.assert_outcomes(failed=1)
    assert "no golden for 'tinyy' in" in rep.stdout.str()
    text = " ".join(rep.stdout.str().split())
    assert "Goldens of close names here: 'tiny' (a changed name= ?)." in text
    # a rename on purpose: the command that copies the golden under the new name
    assert (f"its golden is copied under the new name with no GPU: rocm-parity golden derive "
            f"'{project.path / 'goldens'}' 'tiny' --to 'tinyy' --test 'test_tiny.py::test_tiny'." in text), text


def test_a_new_check_is_not_offered_the_golden_of_another_live_test(project: pytest.Pytester) -> None:
    """'tiny-new', a new test's check, is close to 'tiny', which test_tiny still replays: that golden
    is not a renamed one, so no derive command offers to copy it; the capture command is given."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_new=(project.path / "test_tiny.py").read_text().replace('name="tiny"', 'name="tinyy"')
                       .replace("def test_tiny", "def test_new"))
    rep = project.runpytest("--rocm-parity", "test_new.py")
    rep.assert_outcomes(failed=1)
    text = " ".join(rep.stdout.str().split())
    assert "no golden for 'tinyy' in" in text and "Capture it on the reference machine" in text, text
    assert "Goldens of close names" not in text and "golden derive" not in text, text


def test_a_failures_regenerate_command_keeps_the_golden_directory(project: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing verdict on the same kind of device offers to regenerate: with the golden directory
    given on the command line, the command names it, or it would rewrite <rootdir>/goldens instead."""
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-golden-dir=shared").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "2")
    rep = project.runpytest("--rocm-parity", "--parity-golden-dir=shared")
    rep.assert_outcomes(failed=1)
    text = " ".join(rep.stdout.str().split())
    assert "regenerate with pytest --rocm-parity --parity-golden-dir=shared --parity-regen='tiny'" in text, text


def test_a_self_test_may_replay_another_tests_default_named_golden(project: pytest.Pytester) -> None:
    """A planted-bug self-test names the model test's default golden explicitly: a replay of both,
    in either order, judges both against it (only two tests whose own defaults coincide clash)."""
    project.makepyfile(test_x='''
import pytest
from conftest import make_model, make_inputs

def test_a(parity):
    parity.check(make_model(), make_inputs(), dtypes=["float32"])

def test_planted(parity):
    m = make_model()
    m.blocks[1].act.register_forward_hook(lambda mod, args, out: out * 1.05)
    with pytest.raises(AssertionError, match="culprit: blocks.1.act"):
        parity.check(m, make_inputs(), name="test_x.py::test_a", dtypes=["float32"])
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture", "test_x.py", "-k", "test_a").assert_outcomes(passed=1)
    project.runpytest("--rocm-parity", "test_x.py").assert_outcomes(passed=2)
    project.runpytest("--rocm-parity", "test_x.py::test_planted", "test_x.py::test_a").assert_outcomes(passed=2)
