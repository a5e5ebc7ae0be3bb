"""A full disk, however the library that writes says it: one test (`runfiles.write_failure`) for every writer of a
run, compare or eval output, each writer atomic, and one line for the user.

The libraries' own exceptions are raised where they write (`torch.save`, safetensors' `save_file` inside
`save_pretrained`, `open`), with the messages they give on a full tmpfs (measured on a 1.6 MB one):
torch `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534`, safetensors
`SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)`, Python
`OSError: [Errno 28] No space left on device`.
"""

from __future__ import annotations

import builtins
import errno
import os
from pathlib import Path

import pytest

from d3s import cli
from d3s.app import plots, runfiles
from d3s.app.runfiles import RunFileError, write_failure
from run_helpers import full_disk

TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
TORCH_WRITER = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file "
                "write failed")
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def safetensor_error(message: str = SAFETENSORS_FULL) -> Exception:
    from safetensors import SafetensorError

    return SafetensorError(message)


def error_lines(err: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "it/s]" not in line
            and "?it/s" not in line and not line.startswith(("Loading weights", "Writing model shards"))]


# ---------------------------------------------------------------------------------------------
# 1. One test of a full disk
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make,reason", [
    (lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "No space left on device"),
    (lambda: OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), os.strerror(errno.EDQUOT)),
    (lambda: OSError(errno.EROFS, os.strerror(errno.EROFS)), os.strerror(errno.EROFS)),
    (lambda: OSError(errno.EACCES, os.strerror(errno.EACCES)), os.strerror(errno.EACCES)),
    (lambda: RuntimeError(TORCH_FULL), "file write failed"),
    (lambda: RuntimeError(TORCH_WRITER), "file write failed"),
    (lambda: safetensor_error(), "No space left on device"),
    (lambda: safetensor_error("Error while serializing: I/O error: Disk quota exceeded (os error 122)"),
     os.strerror(122)),
], ids=["enospc", "edquot", "erofs", "eacces", "torch-unexpected-pos", "torch-stream-writer", "safetensors",
        "safetensors-quota"])
def test_a_full_disk_is_recognised_however_the_library_says_it(make, reason):
    err = make()
    assert write_failure(err) == reason
    try:  # also as the cause of another error (transformers re-raising, a wrapper)
        try:
            raise err
        except Exception as inner:
            raise ValueError("saving failed") from inner
    except ValueError as outer:
        assert write_failure(outer) == reason


@pytest.mark.parametrize("err", [OSError(errno.ENOENT, "No such file or directory"), ValueError("No space left"),
                                 RuntimeError("CUDA out of memory"), KeyError("pos")])
def test_other_errors_are_not_a_full_disk(err):
    assert write_failure(err) is None


# ---------------------------------------------------------------------------------------------
# 2. Every writer: atomic, and one line on a full disk
# ---------------------------------------------------------------------------------------------


def _plot(path: Path) -> None:
    metrics = path.parent / "metrics.jsonl"
    metrics.write_text('{"type": "train", "step": 1, "wall_s": 1.0, "trained_tokens": 1.0, "reward": 0.5}\n')
    plots.plot_run(metrics, path)


WRITERS = {
    "atomic_write_text": lambda path: runfiles.atomic_write_text(path, "new"),
    "atomic_write_bytes": lambda path: runfiles.atomic_write_bytes(path, b"new"),
    "append_line": lambda path: runfiles.append_line(path, "new\n"),
    "plot": _plot,
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_says_a_full_disk_in_one_line_and_keeps_the_old_file(tmp_path, monkeypatch, writer):
    path = tmp_path / "out.png"
    path.write_bytes(b"old")
    with monkeypatch.context() as mp:
        full_disk(mp, "out.png")
        with pytest.raises(RunFileError) as caught:
            WRITERS[writer](path)
    assert str(caught.value) == f"{path} cannot be written (No space left on device); what was saved before is intact"
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir() if p.name != "metrics.jsonl") \
        == ["out.png"]  # no temporary file left


def test_a_plot_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A kill while the PNG is written leaves the old plot (the bytes go to a temporary file renamed into place)."""
    path = tmp_path / "out.png"
    path.write_bytes(b"old")
    seen = []

    def killed(target, data, mode):
        seen.append(Path(target).name)
        with builtins.open(target, mode) as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt  # as a kill in the middle of the write

    monkeypatch.setattr(runfiles, "_write", killed)
    with pytest.raises(KeyboardInterrupt):
        _plot(path)
    assert seen and seen[0] != "out.png"
    assert path.read_bytes() == b"old"


# ---------------------------------------------------------------------------------------------
# 3. The model cache on a full disk
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "eval"])
def test_the_model_cache_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capfd, command):
    """`model: tiny` is built and saved in D3S_CACHE on first use; safetensors fails there as on a full tmpfs."""
    pytest.importorskip("transformers")
    from transformers import modeling_utils

    cache = tmp_path / "cache"
    monkeypatch.setenv("D3S_CACHE", str(cache))

    def full(*args, **kwargs):
        raise safetensor_error()

    monkeypatch.setattr(modeling_utils, "safe_save_file", full)
    argv = {"train": ["train", "--config", "smoke", "--output_dir", str(tmp_path / "run")],
            "eval": ["eval", "--model", "tiny", "--benchmarks", "arith", "--n", "1", "--ks", "1", "--limit", "1",
                     "--output_dir", str(tmp_path / "ev"), "--no_progress"]}[command]
    assert cli.main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    target = cache / "models" / "tiny-llama-seed0"
    assert error_lines(err)[-1] == (
        f"d3s {command}: error: {target} cannot be written (No space left on device); nothing was cached (D3S_CACHE "
        "holds the model cache): free space there or set D3S_CACHE to a folder with room"), error_lines(err)[-3:]
    assert list((cache / "models").iterdir()) == []  # no half model, no temporary folder


# ---------------------------------------------------------------------------------------------
# 4. The lock of a new folder on a full disk (its holder cannot be written)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_folder_on_a_full_disk_is_refused_in_one_line(tmp_path, monkeypatch, capfd, command):
    """Making the lock file takes no space; writing its holder's pid into it does (ENOSPC on a full tmpfs)."""
    monkeypatch.setenv("D3S_CACHE", str(tmp_path / "cache"))
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "out"
    argv = {"train": ["train", "--config", "smoke", "--output_dir", str(out)],
            "eval": ["eval", "--model", "tiny", "--benchmarks", "arith", "--n", "1", "--ks", "1", "--limit", "1",
                     "--output_dir", str(out), "--no_progress"]}[command]
    with monkeypatch.context() as mp:
        mp.setattr(os, "pwrite", full)
        assert cli.main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert error_lines(err)[-1] == (f"d3s {command}: error: output_dir {str(out)!r} cannot be written (No space left "
                                    "on device)"), error_lines(err)[-3:]
