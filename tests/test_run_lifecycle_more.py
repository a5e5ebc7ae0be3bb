"""More of a run's life that must end well: run files that parse but lack their fields, a step recorded twice,
a finished run reused by `d3s compare`, a folder in use (refused before the frameworks load, also between two
resumes), a full disk and a read-only folder, `compare.json` cut by a kill, Ctrl-C during `d3s compare` and
`d3s compare` killed with SIGKILL.

Every case is run the way a user meets it (`cli.main`, or the `d3s` command in a process of its own) on the smoke
recipe (tiny random model, 4 steps, checkpoints at steps 2 and 4), and checks the one line the user reads and the
files that are left; a resumed run is checked against one uninterrupted run (`run_helpers.assert_same_run`).
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from d3s import cli  # noqa: E402
from d3s.app import runfiles  # noqa: E402
from d3s.app.child_process import PARENT_ENV  # noqa: E402
from d3s.app.recipe import RECIPES_DIR  # noqa: E402
from d3s.app.runfiles import read_run_config, read_run_records, read_summary  # noqa: E402
from d3s.app.runfolder import LOCK_NAME, claim_folder  # noqa: E402
from run_helpers import _sigint_raises, _use_cache, cache, full_run  # noqa: E402,F401  (fixtures)
from run_helpers import assert_same_run, comparable_summary, copy_run, snapshot, train  # noqa: E402

_BARS = ("Writing model shards", "Loading weights", "d3s train:  ", "d3s train: 100%", "d3s train: 0%")


def lines(err: str) -> list[str]:
    """What a user reads on stderr, without progress bars."""
    return [line for line in err.replace("\r", "\n").splitlines()
            if line.strip() and not line.startswith(_BARS) and "it/s]" not in line and "?it/s" not in line]


def one_line(capsys) -> str:
    err = lines(capsys.readouterr().err)
    assert len(err) == 1, err
    return err[0]


def unchanged_but_lock(out: Path, before: dict[str, bytes]) -> None:
    after = snapshot(out)
    after.pop(LOCK_NAME, None)
    before = {k: v for k, v in before.items() if k != LOCK_NAME}
    assert after == before


def unfinished(full_run: Path, dest: Path, keep_last: bool = True) -> Path:
    """The full run as if killed during its final evaluation (all steps saved, no summary.json); without
    `keep_last`, as if killed during step 3 (checkpoint-2 is the newest)."""
    out = copy_run(full_run, dest)
    (out / "summary.json").unlink()
    if not keep_last:
        shutil.rmtree(out / "checkpoint-4")
        kept = [r for r in read_run_records(out / "metrics.jsonl") if r["step"] <= 2]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return out


def compare(root: Path, *extra: str) -> int:
    """`d3s compare` of the smoke recipe's run (d3s, seed 0: the run `full_run` is) into `root`."""
    return cli.main(["compare", "--config", "smoke", "--variants", "d3s", "--seeds", "0", "--output_dir", str(root),
                     *extra])


def compared_run(full_run: Path, root: Path) -> Path:
    """A comparison folder holding `full_run` as its finished run, with every checkpoint whole."""
    return copy_run(full_run, root / "d3s-seed0")


def run_in_place(full_run: Path, dest: Path) -> Path:
    """`full_run` as the folder it was trained in: with its lock file (not held), which marks it a d3s run
    whatever its `run_config.json` holds."""
    out = copy_run(full_run, dest)
    (out / LOCK_NAME).touch()
    return out


VALID = {"steps": 4, "before": {}, "after": {"accuracy": 0.5, "correct": 8, "n": 16}, "train_wall_s": 1.0,
         "trained_tokens": 10.0}


# ---------------------------------------------------------------------------------------------
# 1. A run file that parses but lacks its fields is damaged, for every reader
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,problem", [
    ("{}", "not a run summary: it lacks steps, before, after, train_wall_s, trained_tokens"),
    (json.dumps({k: v for k, v in VALID.items() if k != "steps"}), "not a run summary: it lacks steps"),
    (json.dumps({**VALID, "steps": None}), "not a run summary: its steps is None, not a step count >= 1"),
    (json.dumps({**VALID, "steps": 0}), "its steps is 0"),
    (json.dumps({**VALID, "after": {"accuracy": 0.5}}), "its after is not a held-out result (numbers accuracy, "
                                                        "correct, n)"),
    (json.dumps({**VALID, "before": []}), "its before is not an object"),
    (json.dumps({**VALID, "train_wall_s": None}), "its train_wall_s and trained_tokens are not both numbers"),
    ("[1]", "not a run summary: a JSON list"),
    ("{broken", "not valid JSON"),
    (b"\xff{}", "not UTF-8"),
])
def test_a_summary_without_its_fields_is_damaged(tmp_path, content, problem):
    (tmp_path / "summary.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    summary, damaged = read_summary(tmp_path)
    assert summary is None and problem in damaged, damaged
    (tmp_path / "summary.json").write_text(json.dumps(VALID))
    assert read_summary(tmp_path) == (VALID, None)
    (tmp_path / "summary.json").unlink()
    assert read_summary(tmp_path) == (None, None)  # absent: not finished, not damaged


@pytest.mark.parametrize("content,problem", [
    ("{}", "not a run config: it lacks the run and trainer settings"),
    (json.dumps({"run": {}, "trainer": "x"}), "not a run config: it lacks the trainer settings"),
    ("garbage", "not valid JSON"),
    ("[]", "not a run config: a JSON list"),
])
def test_a_run_config_without_its_settings_is_damaged(tmp_path, content, problem):
    (tmp_path / "run_config.json").write_text(content)
    saved, damaged = read_run_config(tmp_path)
    assert saved is None and problem in damaged, damaged
    assert read_run_config(tmp_path / "absent") == (None, None)


@pytest.mark.parametrize("content", ["{}", json.dumps({k: v for k, v in VALID.items() if k != "steps"})])
def test_a_summary_without_its_fields_is_written_again_on_resume(full_run, tmp_path, capsys, content):
    """Like a summary that does not parse: the final evaluation runs again (never `finished run (None steps)`)."""
    out = copy_run(full_run, tmp_path / "run")
    (out / "summary.json").write_text(content)
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert f"{out / 'summary.json'} is damaged (not a run summary: it lacks steps" in err, err
    assert "every step is trained: running the final evaluation" in err and "None steps" not in err
    assert_same_run(out, full_run)


@pytest.mark.parametrize("content", ["garbage", "{}", "[]"])
@pytest.mark.parametrize("extra", [[], ["--max_steps", "6"]], ids=["same", "longer"])
def test_a_finished_run_whose_run_config_is_damaged_is_refused(full_run, tmp_path, capsys, content, extra):
    """Its recipe cannot be compared with this one: never 'nothing to do' (nor, with --max_steps 6, a longer run)."""
    out = run_in_place(full_run, tmp_path / "run")
    (out / "run_config.json").write_text(content)
    before = snapshot(out)
    assert train(out, "--resume", "true", *extra) == 2
    line = one_line(capsys)
    assert line.startswith(f"d3s train: error: {out / 'run_config.json'} is damaged ("), line
    assert line.endswith("so the resumed recipe cannot be checked against the run's; restore it or start a new run in "
                         "another --output_dir"), line
    unchanged_but_lock(out, before)


def test_an_unfinished_run_whose_run_config_lacks_its_settings_is_refused(full_run, tmp_path, capsys):
    out = unfinished(full_run, tmp_path / "run")
    (out / LOCK_NAME).touch()  # the folder it was trained in (else no file marks it a d3s run)
    (out / "run_config.json").write_text("{}")
    before = snapshot(out)
    assert train(out, "--resume", "true") == 2
    assert one_line(capsys) == (f"d3s train: error: {out / 'run_config.json'} is damaged (not a run config: it lacks "
                                "the run and trainer settings), so the resumed recipe cannot be checked against the "
                                "run's; restore it or start a new run in another --output_dir")
    unchanged_but_lock(out, before)


def test_an_unfinished_run_of_another_flops_convention_is_refused(full_run, tmp_path, capsys):
    """A run begun before FLOPs recorded their convention (`estimate-v1`, docs/compare.md) is not continued from a
    checkpoint: its records would hold two conventions."""
    out = unfinished(full_run, tmp_path / "run")
    (out / LOCK_NAME).touch()
    config = json.loads((out / "run_config.json").read_text())
    del config["flops_convention"]
    (out / "run_config.json").write_text(json.dumps(config))
    before = snapshot(out)
    assert train(out, "--resume", "true") == 2
    assert one_line(capsys) == (f"d3s train: error: {out} counted its FLOPs as estimate-v1 and this d3s counts them as "
                                "computed-v2 (docs/compare.md); a run's records hold one convention: finish it with "
                                "the d3s that started it, or start a new run in another --output_dir")
    unchanged_but_lock(out, before)


def test_compare_resumes_a_run_whose_summary_lacks_its_fields(full_run, tmp_path, capfd):
    """`d3s compare` does not reuse it (it used to fail with `KeyError: 'after'`): the run writes it again."""
    root = tmp_path / "cmp"
    run = compared_run(full_run, root)
    (run / "summary.json").write_text("{}")
    assert compare(root) == 0
    err = capfd.readouterr().err
    assert "resuming d3s seed 0" in err and "Traceback" not in err, err[-3000:]
    assert comparable_summary(run) == comparable_summary(full_run)
    assert json.loads((root / "compare.json").read_text())["variants"]["d3s"]["per_seed"][0]["steps"] == 4


def test_compare_refuses_a_finished_run_whose_run_config_lacks_its_settings(full_run, tmp_path, capsys):
    root = tmp_path / "cmp"
    run = run_in_place(full_run, root / "d3s-seed0")
    (run / "run_config.json").write_text("{}")
    assert compare(root) == 2
    assert one_line(capsys) == (f"d3s compare: error: {run / 'run_config.json'} is damaged (not a run config: it "
                                f"lacks the run and trainer settings); repair it or move {run} away")
    assert not (root / "compare.json").exists()


# ---------------------------------------------------------------------------------------------
# 2. One record per step and kind
# ---------------------------------------------------------------------------------------------


def test_a_step_recorded_twice_keeps_its_last_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    recs = [{"type": "train", "step": 1, "loss": 1.0}, {"type": "eval", "step": 1, "accuracy": 0.1},
            {"type": "train", "step": 2, "loss": 2.0}, {"type": "train", "step": 1, "loss": 9.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    notes = []
    assert read_run_records(path, warn=notes.append) == [recs[3], recs[1], recs[2]]  # the last, where the first was
    assert notes == [f"{path} records train step 1 more than once; the last record of each is kept"]


def test_a_step_recorded_twice_is_recorded_once_after_a_resume(full_run, tmp_path, capsys):
    out = unfinished(full_run, tmp_path / "run", keep_last=False)
    text = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    step1 = next(line for line in text if '"type": "train", "step": 1,' in line)
    eval2 = next(line for line in text if '"type": "eval", "step": 2,' in line)
    (out / "metrics.jsonl").write_text("".join(text) + step1 + eval2)  # each written again, as it was
    assert train(out, "--resume", "true") == 0
    assert "records train step 1, eval step 2 more than once; the last record of each is kept" in \
        capsys.readouterr().err
    assert_same_run(out, full_run)  # one record per step and kind


# ---------------------------------------------------------------------------------------------
# 3. A finished run reused by d3s compare is pruned as --keep_checkpoints says
# ---------------------------------------------------------------------------------------------


def test_compare_prunes_a_finished_run_it_reuses(full_run, tmp_path, capsys):
    """Also a run whose compare stopped between its end and its pruning."""
    root = tmp_path / "cmp"
    run = compared_run(full_run, root)
    assert compare(root) == 0
    err = capsys.readouterr().err
    assert f"reusing {run}" in err and f"kept 'model' of {run}'s checkpoints" in err
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4"]
    assert sorted(p.name for p in (run / "checkpoint-4").iterdir() if p.name.startswith(("model", "optim", "rng",
                                                                                           "sched"))) == \
        ["model.safetensors"]
    assert comparable_summary(run) == comparable_summary(full_run)


# ---------------------------------------------------------------------------------------------
# 4. A folder in use: refused at once, before the frameworks load; two resumes of one run
# ---------------------------------------------------------------------------------------------

TRAIN_AND_LIST_FRAMEWORKS = """
import sys
from d3s import cli
code = cli.main(["train", *sys.argv[1:]])
print(sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "trl", "datasets", "accelerate"}))
sys.exit(code)
"""

HELD_TRAIN = """
import sys, time
from pathlib import Path
from d3s import cli
from d3s.app import train
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
run_in_folder = train._run_in_folder
def held(*args, **kwargs):  # the folder is claimed: wait here
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    return run_in_folder(*args, **kwargs)
train._run_in_folder = held
sys.exit(cli.main(["train", "--config", "smoke", *sys.argv[3:]]))
"""


def train_listing_frameworks(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRAIN_AND_LIST_FRAMEWORKS, *argv], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("named", ["flag", "recipe"])
def test_a_folder_in_use_is_refused_before_the_frameworks_load(full_run, tmp_path, named):
    """It used to import torch, transformers and TRL first (199 s on a loaded machine) before it was told."""
    out = copy_run(full_run, tmp_path / "run")
    argv = ["--config", "smoke", "--output_dir", str(out), "--resume", "true"]
    if named == "recipe":  # the folder named by the recipe, not the command line
        recipe = tmp_path / "mine.yaml"
        smoke = (RECIPES_DIR / "smoke.yaml").read_text()
        assert "output_dir: runs/smoke\n" in smoke
        recipe.write_text(smoke.replace("output_dir: runs/smoke\n", f"output_dir: {json.dumps(str(out))}\n"))
        argv = ["--config", str(recipe), "--resume", "true"]
    lock = claim_folder(out)  # a live run holds it
    try:
        done = train_listing_frameworks(*argv)
    finally:
        lock.release()
    assert done.returncode == 2, done.stderr[-3000:]
    err = lines(done.stderr)
    assert len(err) == 1 and f"is in use by another d3s train (pid {os.getpid()} on" in err[0], err
    assert done.stdout.strip().splitlines()[-1] == "[]"  # refused before transformers, TRL, datasets loaded


def test_two_resumes_of_one_run_at_once_one_is_refused(full_run, tmp_path):
    out = unfinished(full_run, tmp_path / "run")
    ready, go = tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", HELD_TRAIN, str(ready), str(go), "--output_dir", str(out),
                              "--resume", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.02)
        before = snapshot(out)
        second = train_listing_frameworks("--config", "smoke", "--output_dir", str(out), "--resume", "true")
        assert second.returncode == 2, second.stderr[-3000:]
        err = lines(second.stderr)
        assert len(err) == 1 and f"is in use by another d3s train (pid {first.pid} on" in err[0], err
        assert second.stdout.strip().splitlines()[-1] == "[]"
        assert snapshot(out) == before  # the second touched nothing
    finally:
        go.touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert_same_run(out, full_run)


# ---------------------------------------------------------------------------------------------
# 5. A full disk, a read-only folder: one line, nothing saved lost
# ---------------------------------------------------------------------------------------------


def failing_write(mp, name: str, code: int, when=lambda text: True) -> None:
    """Every write of the run file `name` (through `runfiles._write`, where run files are written) fails with
    `OSError(code)` when `when(text)`, as on a full disk or a read-only folder."""
    write = runfiles._write

    def fail(path, text, mode):
        target = Path(path).name
        if (target == name or target.startswith(f".{name}.tmp-")) and when(text):
            raise OSError(code, os.strerror(code), str(path))
        return write(path, text, mode)

    mp.setattr(runfiles, "_write", fail)


def read_only(mp, folder: Path) -> None:
    """`folder` as on a read-only file system, for a process that ignores permissions (root): every call that
    would create, change or remove something in it fails with EACCES."""
    root = os.path.abspath(folder)

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        path = os.path.abspath(os.fsdecode(path))
        return path == root or path.startswith(root + os.sep)

    def refuse(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))

    real_os_open, real_open, real_mkdir = os.open, builtins.open, os.mkdir
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def os_open(path, flags, *args, **kwargs):
        if inside(path) and flags & writing and kwargs.get("dir_fd") is None:
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def py_open(file, mode="r", *args, **kwargs):
        if inside(file) and set(mode) & set("wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if inside(path) and not os.path.exists(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def removing(real):
        def remove(path, *args, **kwargs):
            if inside(path):
                refuse(path)
            return real(path, *args, **kwargs)
        return remove

    mp.setattr(os, "open", os_open)
    mp.setattr(builtins, "open", py_open)
    mp.setattr(io, "open", py_open)
    mp.setattr(os, "mkdir", mkdir)
    for name in ("unlink", "remove", "rmdir", "replace", "rename"):
        mp.setattr(os, name, removing(getattr(os, name)))


def step_3(text: str) -> bool:
    return text.startswith('{"type": "train", "step": 3,')


@pytest.mark.parametrize("name,code,when,status,last", [
    ("metrics.jsonl", errno.ENOSPC, step_3, 1,
     "d3s train: stopped: {path} cannot be written (No space left on device) after step 3; checkpoint-2 holds step 2; "
     "to continue, run the same command plus --resume true"),
    ("metrics.jsonl", errno.EACCES, step_3, 1,  # the folder turned read-only during the run
     "d3s train: stopped: {path} cannot be written (Permission denied) after step 3; checkpoint-2 holds step 2; to "
     "continue, run the same command plus --resume true"),
    ("summary.json", errno.ENOSPC, lambda text: True, 2,
     "d3s train: error: {path} cannot be written (No space left on device); what was saved before is intact"),
    ("run_config.json", errno.ENOSPC, lambda text: True, 2,
     "d3s train: error: {path} cannot be written (No space left on device); what was saved before is intact"),
])
def test_a_run_file_that_cannot_be_written_stops_the_run_in_one_line(full_run, tmp_path, monkeypatch, capfd, name,
                                                                     code, when, status, last):
    """Then the same command (with --resume true) ends in the uninterrupted run: nothing saved was lost."""
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        failing_write(mp, name, code, when)
        assert train(out) == status
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert lines(err)[-1] == last.format(path=out / name), lines(err)[-3:]
    assert not list(out.glob(".*.tmp-*"))  # no temporary file left beside the run's files
    again = train(out, "--resume", "true") if name != "run_config.json" else train(out)
    assert again == 0
    assert_same_run(out, full_run)


def _safetensors_full():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("writer,error,reason", [
    ("torch.save", RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                                "data/0: file write failed"), "file write failed"),
    ("torch.save", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
     "file write failed"),  # what torch.save says on a full tmpfs
    ("torch.save", OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    ("safetensors", _safetensors_full(), "No space left on device"),  # the weights, on a full tmpfs
], ids=["torch-stream-writer", "torch-unexpected-pos", "enospc", "safetensors"])
def test_a_checkpoint_that_cannot_be_written_stops_the_run_in_one_line(full_run, tmp_path, monkeypatch, capfd, writer,
                                                                       error, reason):
    """A full disk while checkpoint-2 is written: one line, no traceback, no second try; then the same command
    (with --resume true) ends in the uninterrupted run."""
    import torch
    from transformers import modeling_utils

    out = tmp_path / "run"
    module, name = (torch, "save") if writer == "torch.save" else (modeling_utils, "safe_save_file")
    save, tries = getattr(module, name), []

    def failing_save(obj, f, *args, **kwargs):
        if "checkpoint-2" in str(f):
            tries.append(str(f))
            raise error
        return save(obj, f, *args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(module, name, failing_save)
        assert train(out) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert len(tries) == 1, tries  # no second try at saving on a full disk
    assert lines(err)[-1] == (f"d3s train: stopped: a checkpoint cannot be written ({reason}) after step 2; no step "
                              "was saved; run the same command again to start over"), lines(err)[-3:]
    assert train(out, "--resume", "true") == 0
    assert_same_run(out, full_run)


def test_a_read_only_run_folder_is_refused_in_one_line(full_run, tmp_path, monkeypatch, capsys):
    out = unfinished(full_run, tmp_path / "run")
    before = snapshot(out)
    with monkeypatch.context() as mp:
        read_only(mp, out)
        assert train(out, "--resume", "true") == 2
    line = one_line(capsys)
    assert line == f"d3s train: error: output_dir {str(out)!r} cannot be written (Permission denied)", line
    assert snapshot(out) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores file permissions")
def test_a_read_only_run_folder_is_refused_in_one_line_by_the_file_system(full_run, tmp_path, capsys):
    out = unfinished(full_run, tmp_path / "run")
    paths = [out, *out.rglob("*")]
    for p in paths:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        before = snapshot(out)
        assert train(out, "--resume", "true") == 2
        line = one_line(capsys)
        assert line == f"d3s train: error: output_dir {str(out)!r} cannot be written (Permission denied)", line
        assert snapshot(out) == before
    finally:
        for p in paths:
            p.chmod(p.stat().st_mode | 0o200)


def test_compare_tables_a_read_only_run_without_pruning_it(full_run, tmp_path, monkeypatch, capsys):
    root = tmp_path / "cmp"
    run = compared_run(full_run, root)
    before = snapshot(run)
    with monkeypatch.context() as mp:
        read_only(mp, run)
        assert compare(root) == 0
    assert f"note: {run}'s checkpoints cannot be pruned (Permission denied); kept" in capsys.readouterr().err
    unchanged_but_lock(run, before)
    assert (root / "compare.json").is_file()


# ---------------------------------------------------------------------------------------------
# 6. compare.json: the old one or the new one, never a part
# ---------------------------------------------------------------------------------------------

KILLED_WRITING = """
import os, signal, sys
from d3s import cli
from d3s.app import runfiles
write = runfiles._write
name = sys.argv[1]
def half_then_die(path, text, mode):
    if os.path.basename(path).startswith(f".{name}.tmp-"):
        with open(path, mode) as f:
            f.write(text[: len(text) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return write(path, text, mode)
runfiles._write = half_then_die
sys.exit(cli.main(["compare", *sys.argv[2:]]))
"""

OUTPUTS = ("compare.png", "compare.md", "compare.json")  # in the order compare writes them


@pytest.mark.parametrize("name", OUTPUTS)
@pytest.mark.parametrize("earlier", [True, False], ids=["over_an_old_one", "first"])
def test_a_kill_while_compare_writes_an_output_leaves_the_old_one_or_none(full_run, tmp_path, earlier, name):
    """A SIGKILL in the middle of any output's write: no output is truncated, and compare.json (written last) is
    new only when every other output is."""
    root = tmp_path / "cmp"
    compared_run(full_run, root)
    argv = ["--config", "smoke", "--variants", "d3s", "--seeds", "0", "--output_dir", str(root)]
    old = {}
    if earlier:
        assert compare(root) == 0
        old = {n: (root / n).read_bytes() for n in OUTPUTS}
    done = subprocess.run([sys.executable, "-c", KILLED_WRITING, name, *argv], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    for n in OUTPUTS[OUTPUTS.index(name):]:  # this one and every later one: as they were, or absent
        if earlier:
            assert (root / n).read_bytes() == old[n], n
        else:
            assert not (root / n).exists(), n
    if name != "compare.png" or earlier:  # a whole PNG, never a truncated one
        assert (root / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert compare(root) == 0  # the same command again writes them whole, and removes the killed one's leftover
    json.loads((root / "compare.json").read_text())
    assert not list(root.glob(".*.tmp-*"))


def test_compare_json_that_cannot_be_written_is_one_line_and_keeps_the_old_one(full_run, tmp_path, monkeypatch,
                                                                               capsys):
    root = tmp_path / "cmp"
    compared_run(full_run, root)
    assert compare(root) == 0
    old = (root / "compare.json").read_bytes()
    capsys.readouterr()
    with monkeypatch.context() as mp:
        failing_write(mp, "compare.json", errno.ENOSPC)
        assert compare(root) == 2
    err = [line for line in lines(capsys.readouterr().err) if not line.startswith("d3s compare: reusing")]
    assert err == [f"d3s compare: error: {root / 'compare.json'} cannot be written (No space left on device); what "
                   "was saved before is intact"], err
    assert (root / "compare.json").read_bytes() == old and not list(root.glob(".*.tmp-*"))


# ---------------------------------------------------------------------------------------------
# 7. d3s compare stopped: Ctrl-C, SIGKILL
# ---------------------------------------------------------------------------------------------


def compare_process(root: Path, *extra: str) -> subprocess.Popen:
    """`d3s compare` of the smoke recipe, d3s then grpo, in a session of its own (its process group is the
    terminal's foreground group: a Ctrl-C goes to every process in it)."""
    command = [sys.executable, "-m", "d3s.cli", "compare", "--config", "smoke", "--variants", "d3s,grpo", "--seeds",
               "1", "--output_dir", str(root), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for(done, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.005)


def trained(run: Path, step: int):
    def done() -> bool:
        path = run / "metrics.jsonl"
        return path.is_file() and f'"type": "train", "step": {step},' in path.read_text()
    return done


def has_child(proc: subprocess.Popen):
    def done() -> bool:
        try:
            return bool(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
        except OSError:
            return False
    return done


@pytest.mark.parametrize("when", [pytest.param("training", marks=pytest.mark.slow), "run_exiting", "run_loading"])
def test_ctrl_c_during_compare_stops_it_quietly(tmp_path, when):
    """The run stops in its own way (during training: it saves and says so), compare waits for it and says one line;
    no traceback from the run, also when the Ctrl-C comes as the run's process exits (torch's exit handlers)."""
    root = tmp_path / "cmp"
    proc = compare_process(root, "--max_steps", "2")
    run = root / "d3s-seed1"
    if when == "run_loading":  # the run's process has started and is importing torch
        if not Path(f"/proc/{proc.pid}/task/{proc.pid}/children").exists():
            pytest.skip("this kernel does not list a process's children")
        wait_for(has_child(proc), proc)
        time.sleep(0.2)
    else:
        wait_for(trained(run, 1) if when == "training" else (run / "summary.json").is_file, proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    said = lines(err)
    assert said[-1] == "d3s compare: interrupted; rerun the same command to resume", said
    if when == "training":
        assert "d3s train: interrupted after step " in said[-2] and "rerun the same d3s compare command" in said[-2]
    assert not (root / "compare.json").exists()


def test_a_run_ignores_a_ctrl_c_once_it_has_ended(tmp_path):
    """A Ctrl-C that reaches a finished run while its interpreter shuts down is no traceback, and the run is finished
    (exit 0), not killed."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "d3s.cli", "train", "--config", "smoke", "--max_steps", "1",
                             "--output_dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for((out / "summary.json").is_file, proc)
    time.sleep(0.3)  # its last line is said: the process is exiting
    if proc.poll() is not None:
        pytest.skip("the run had exited before the signal")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie that no one reaps has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_killed_compare_takes_its_run_with_it(tmp_path):
    """`kill -9` of `d3s compare` (of it alone): its `d3s train` stops too (SIGTERM: it saves and says so), not left
    training as an orphan."""
    root = tmp_path / "cmp"
    proc = compare_process(root, "--max_steps", "400", "--eval_every", "0", "--save_steps", "100")
    run = root / "d3s-seed1"
    wait_for(trained(run, 2), proc)
    child = int((run / LOCK_NAME).read_text().split()[1])
    os.kill(proc.pid, signal.SIGKILL)
    try:
        assert wait_gone(child, 60), "the run outlived its compare"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)  # the run's stderr too: the pipe ends when it does
    assert "d3s train: terminated (SIGTERM) after step " in err, err[-3000:]
    assert not (run / "summary.json").exists()


def test_sigterms_in_a_row_stop_the_run_once_and_it_says_so(tmp_path):
    """A parent's death reaches a run once per thread that inherited the request, so SIGTERMs can come in a row:
    the first stops the run, which saves its last step and says so (exit 143); the later ones change nothing
    (once, they landed after the run's handler was gone and killed it mid-save, without a word)."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "d3s.cli", "train", "--config", "smoke", "--max_steps", "400",
                             "--eval_every", "0", "--save_steps", "100", "--output_dir", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(trained(out, 2), proc)
    for _ in range(4):
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.03)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    said = lines(err)
    assert said[-1].startswith("d3s train: terminated (SIGTERM) after step "), said[-3:]
    step = int(said[-1].split("after step ")[1].split(";")[0])
    assert f"checkpoint-{step} holds step {step}" in said[-1]
    assert (out / f"checkpoint-{step}" / "trainer_state.json").is_file()


def test_a_sigterm_before_training_stops_the_run_and_it_says_so(tmp_path):
    """A SIGTERM while the run loads (or evaluates, or writes its plots) stops it as Ctrl-C does: one line, exit
    143, the folder free for the same command; before, Python's default ended it at once, without a word."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "d3s.cli", "train", "--config", "smoke", "--max_steps", "2", "--eval_every", "0",
           "--output_dir", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: (out / LOCK_NAME).is_file(), proc)  # the folder is claimed; the model is not loaded yet
    for _ in range(3):
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.03)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert lines(err)[-1] == "d3s train: terminated (SIGTERM); rerun the same command to resume", err[-3000:]
    assert not (out / "metrics.jsonl").is_file() or '"type": "train"' not in (out / "metrics.jsonl").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_summary(out)[0]["steps"] == 2


ORPHAN = """
import os, subprocess, sys
env = {**os.environ, sys.argv[1]: str(os.getpid())}
code = "import sys, time; from d3s.app import child_process as c; "
if sys.argv[2] == "watch":  # where the kernel cannot be asked: the thread that watches the parent
    code += "c._kernel_signals_parent_death = lambda: False; "
code += "c.stop_with_parent(); print('ready', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
os._exit(0)  # dies without a word to its child
"""


@pytest.mark.parametrize("how", ["prctl", "watch"])
def test_a_run_whose_parent_died_stops(how):
    done = subprocess.run([sys.executable, "-c", ORPHAN, PARENT_ENV, how], capture_output=True, text=True,
                          timeout=120)
    child = int(done.stdout.split()[-1])
    try:
        assert wait_gone(child, 10), f"the child of a dead parent still runs ({how})"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_run_started_after_its_parent_died_stops_at_once():
    """The parent may die before the child asks to be told: the child sees it has another parent."""
    env = {**os.environ, PARENT_ENV: "1" if os.getpid() != 1 else "2"}  # not its parent: this process is
    code = "from d3s.app.child_process import stop_with_parent; import time; stop_with_parent(); time.sleep(60)"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM and time.monotonic() - started < 60, done.stderr[-2000:]
