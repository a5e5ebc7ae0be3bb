"""What `d3s compare` is handed: run settings that would name a folder outside `--output_dir`, budget options that
cannot be honoured, and settings a run would refuse only once the reference has trained. Each is refused in one
line before any run starts, or (the folder names) made safe; none trains a run, except the reused one copied in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d3s import cli
from d3s.app.compare import command
from d3s.app.compare.summary import NAME_BYTES, SAFE_NAME_CHARACTERS, run_dir, run_folder_name

# ---------------------------------------------------------------------------------------------
# 1. Every run folder lies inside --output_dir, whatever a run setting holds
# ---------------------------------------------------------------------------------------------

NASTY = ["/", "..", ".", "\x00", "%", "%2F", "%-", "-seed1", "~", " ", "\\", "\n", "d3s", "+", "=", "é", "😀", "\udcff"]
settings_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)), max_size=40).map("".join),
    st.text(min_size=100, max_size=400),  # past the longest name a file system allows
    st.text(alphabet=sorted(SAFE_NAME_CHARACTERS), max_size=60),
)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(setting=settings_text, seed=seeds)
def test_every_run_folder_lies_inside_the_output_dir(tmp_path_factory, setting, seed):
    root = tmp_path_factory.getbasetemp() / "cmp"
    root.mkdir(exist_ok=True)
    name = run_folder_name(setting, seed)
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    assert len(name.encode("utf-8")) <= NAME_BYTES <= 255
    folder = run_dir(root, setting, seed)
    assert folder.parent == root
    folder.mkdir()  # the file system takes it, and it is where it says
    try:
        assert folder.resolve().parent == root.resolve()
    finally:
        folder.rmdir()


@settings(max_examples=300, deadline=None)
@given(a=settings_text, b=settings_text, seed_a=seeds, seed_b=seeds)
def test_two_runs_never_share_a_folder(a, b, seed_a, seed_b):
    if (a, seed_a) != (b, seed_b):
        assert run_folder_name(a, seed_a) != run_folder_name(b, seed_b)


@settings(max_examples=100, deadline=None)
@given(setting=st.text(alphabet=sorted(SAFE_NAME_CHARACTERS), min_size=1, max_size=60).filter(
    lambda s: not s.startswith(".")), seed=seeds)
def test_a_plain_setting_keeps_its_folder(setting, seed):
    """The folders of committed comparisons (`d3s+token_cut=sign-seed1`) keep their names: they are reused."""
    assert run_folder_name(setting, seed) == f"{setting}-seed{seed}"


def test_a_setting_with_a_path_runs_inside_the_output_dir(tmp_path, monkeypatch, capsys):
    """The setting a user wrote (`/../../escaped`): the run is started in a folder inside --output_dir, named in
    compare.json; nothing is made outside it."""
    started = []

    def child(cmd, env):
        started.append(Path(cmd[cmd.index("--output_dir") + 1]))
        return 1  # stop there: no run is trained

    monkeypatch.setattr(command, "run_child", child)
    root = tmp_path / "s" / "cmp6" / "inner"
    assert cli.main(["compare", "--config", "smoke", "--variants", "d3s+instruction=/../../escaped", "--seeds", "1",
                     "--max_steps", "1", "--output_dir", str(root)]) == 2
    assert started == [root / "d3s+instruction=%2F..%2F..%2Fescaped-seed1"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "s", os.path.join("s", "cmp6"), os.path.join("s", "cmp6", "inner")]
