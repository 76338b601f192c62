"""How a remote golden names the project that captured it: the checkout's origin with its scheme,
credentials, port and .git dropped, so every clone of one repository agrees and no token reaches a
manifest; a checkout without an origin by its folder's name."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_rocm_parity.golden.remote import remote_project


@pytest.mark.parametrize("origin, named", [
    ("git@github.com:org/repo.git", "git github.com/org/repo"),
    ("https://user:p@ss@github.com/org/repo.git", "git github.com/org/repo"),
    ("ssh://git@gitlab.example.com:2222/group/sub/repo.git", "git gitlab.example.com/group/sub/repo"),
    ("git://host.xz/path/to/repo.git/", "git host.xz/path/to/repo"),
    ("/srv/git/repo.git", "git /srv/git/repo"),
    ("file:///srv/git/repo.git", "git /srv/git/repo"),
])
def test_a_checkout_is_named_by_its_origin(tmp_path: Path, origin: str, named: str) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", origin], check=True)
    assert remote_project(tmp_path) == named


def test_a_checkout_without_an_origin_is_named_by_its_folder(tmp_path: Path) -> None:
    (tmp_path / "my-model-repo").mkdir()
    assert remote_project(tmp_path / "my-model-repo") == "folder my-model-repo"
