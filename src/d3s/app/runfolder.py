"""The output folder of a `d3s train` run: ownership, atomic writes, complete checkpoints, resume checks.

What a run guarantees about its folder (docs/reliability.md says how each is tested):

- it owns it: a run writes only into a new or empty folder, or into a folder that holds a d3s run
  (a `.d3s-run.lock` or a d3s `run_config.json` in it). Any other non-empty folder is refused before a
  file in it is touched. While the run lives it holds an exclusive `flock` on `.d3s-run.lock`, so
  a second run into the same folder is refused; the OS drops the lock when the process dies, so a
  crashed or killed run never leaves it stuck.
- its records are replaced atomically (`d3s.app.runfiles`: a temporary file, fsync, rename); a run file that
  exists and cannot be used is damaged, the same for every reader (`read_summary`, `read_run_config`).
- a checkpoint is written into `.staging/checkpoint-N` and renamed into place once complete, so a
  kill during a save leaves no half `checkpoint-N` (see `d3s.app.run_trainer`), and `complete_checkpoints`
  checks every file a resume needs before it is used, newest first. A checkpoint that passes these checks
  and still fails to load (`UnloadableCheckpoint`) is incomplete too: the run continues from the one before.
- a resume refuses a recipe that changes training (`d3s.app.recipe_changes.training_changes`), also of a
  finished run; a run is finished when its `summary.json` is valid (`read_summary`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Literal, get_args

import d3s
from d3s.app.errors import RecipeError, RunFolderError
from d3s.app.runfiles import fsync_dir, read_run_config, read_summary, write_failure

LOCK_NAME = ".d3s-run.lock"
STAGING_NAME = ".staging"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_IGNORED_ENTRIES = {".DS_Store"}  # a file manager's, not the user's


# ---------------------------------------------------------------------------------------------
# Ownership
# ---------------------------------------------------------------------------------------------


def is_run_folder(path: Path) -> bool:
    """Whether `path` holds a d3s run: its lock file, or the `run_config.json` every run writes first (a JSON
    object with the run's and the trainer's settings, `read_run_config`; a file of another program by that
    name is not one)."""
    return (path / LOCK_NAME).is_file() or read_run_config(path)[0] is not None


class RunLock:
    """An exclusive `flock` on `<folder>/.d3s-run.lock`, held until `release()` or the process dies."""

    def __init__(self, fd: int | None, folder: Path):
        self.fd, self.folder = fd, Path(folder).resolve()

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def _lock(fd: int, out: Path, command: str = "d3s train") -> RunLock:
    """Take the flock of the open lock file `fd` of `out` and write this process into it; refuse (closing
    `fd`) when another live process of `command` holds it, naming that process."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no flock; the folder checks still apply
        return RunLock(fd, out)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        for _ in range(100):  # a run that took the lock this instant writes its pid right after
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            if holder:
                break
            time.sleep(0.01)
        os.close(fd)
        holder = holder or "unknown process"
        raise RunFolderError(
            f"output_dir {str(out)!r} is in use by another {command} ({holder}); wait for it to end or pick "
            "another --output_dir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError as err:  # a full disk: the lock is held, but who holds it cannot be written
        os.close(fd)
        raise RunFolderError(f"output_dir {str(out)!r} cannot be written ({write_failure(err) or err.strerror})") \
            from None
    return RunLock(fd, out)


def lock_existing_run(out: Path) -> RunLock | None:
    """The lock of `out` when the folder already has a lock file (a run's), taken; None when it has none or
    it cannot be opened for writing (`claim_folder` then says why). Creates nothing, and needs no heavy
    import: `d3s train` calls it first, so that a folder in use is refused at once (a run on a loaded machine
    took minutes to import torch's frameworks before it was told)."""
    out = Path(out)
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR)
    except OSError:
        return None
    return _lock(fd, out)


def claim_folder(out: Path, held: RunLock | None = None) -> RunLock:
    """Take `out` for a run: refuse a file, an unwritable folder, a non-empty folder that is not a d3s run,
    and a folder another live run holds. Creates `out` when missing. Nothing in a refused folder is touched.
    `held`: the lock of `out` when the caller took it already (`lock_existing_run`)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"output_dir {str(out)!r} is a file; give a folder (new, empty, or a d3s run's)")
    if out.is_dir():
        try:
            entries = sorted(p.name for p in out.iterdir() if p.name not in _IGNORED_ENTRIES)
        except OSError as err:
            raise RunFolderError(f"output_dir {str(out)!r} cannot be read ({err.strerror})") from None
        if entries and not is_run_folder(out):
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            problem = read_run_config(out)[1]  # a run_config.json that is there but not a d3s run's: say why
            why = f" (its run_config.json: {problem})" if problem else ""
            raise RunFolderError(
                f"output_dir {str(out)!r} is not empty ({len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: "
                f"{shown}) and holds no d3s run{why}; "
                "d3s train writes only into a new or empty folder or its own run's: pick another --output_dir"
            )
    if held is not None and held.fd is not None and held.folder == out.resolve():
        return held
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunFolderError(f"output_dir {str(out)!r} cannot be written ({err.strerror})") from None
    return _lock(fd, out)


def lock_folder(out: Path, lock_name: str, command: str) -> RunLock:
    """The flock of `out/lock_name` for a live `command` (`d3s eval`), taken: another one holding it is refused in
    one line naming it. `out` must exist; a lock file that cannot be made is a `RunFolderError`."""
    try:
        fd = os.open(Path(out) / lock_name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunFolderError(f"output_dir {str(out)!r} cannot be written ({err.strerror})") from None
    return _lock(fd, Path(out), command)


def holds_comparison(root: Path) -> bool:
    """Whether the folder `root` is a `d3s compare` output: its `compare.json` or `compare.md`, or a run folder of
    one (`<setting>-seed<seed>` holding a d3s run)."""
    root = Path(root)
    if any((root / name).is_file() for name in ("compare.json", "compare.md")):
        return True
    return any(p.is_dir() and "-seed" in p.name and is_run_folder(p) for p in root.iterdir())


# ---------------------------------------------------------------------------------------------
# Atomic folders (files: `d3s.app.runfiles.atomic_write_text`)
# ---------------------------------------------------------------------------------------------


def publish_folder(staged: Path, final: Path) -> None:
    """Move a completely written folder `staged` to `final` (same file system) in one rename.

    An existing `final` is moved aside first and deleted after, so `final` is at every moment either
    the old complete folder, absent, or the new complete one.
    """
    for f in staged.rglob("*"):
        if f.is_file():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
    old = None
    if final.exists():
        old = staged.parent / f"{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staged, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def checkpoint_step(path: Path) -> int | None:
    m = _CHECKPOINT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is unusable (missing, truncated, bad header), or None."""
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{path.name} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as err:
        return f"{path.name} has an unreadable header ({type(err).__name__})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{path.name} is truncated ({size} bytes, its header describes {8 + n + end})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """Why a `torch.save` file (a zip archive) is unusable, or None; reads only its directory."""
    if not path.is_file():
        return f"{path.name} is missing"
    try:
        with zipfile.ZipFile(path) as z:
            z.infolist()
    except (OSError, zipfile.BadZipFile):
        return f"{path.name} is truncated or not a torch file"
    return None


def checkpoint_problem(path: Path, resume_state: bool = True) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from (one short phrase), or None when complete:
    trainer state naming its step, model weights whose sizes match their headers, optimizer, scheduler
    and RNG state files whose archives are intact (not asked for with `resume_state=False`: a checkpoint
    of a run's last step only has its weights evaluated). These are quick checks of sizes and headers; a
    file can pass them and still fail to load (`UnloadableCheckpoint`)."""
    path = Path(path)
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return "trainer_state.json is missing"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return "trainer_state.json is not valid JSON"
    if not isinstance(state, dict) or state.get("global_step") != checkpoint_step(path):
        return f"trainer_state.json says step {state.get('global_step') if isinstance(state, dict) else None}"
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            return "model.safetensors.index.json is not valid"
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        problem = _safetensors_problem(path / shard)
        if problem:
            return problem
    if not resume_state:
        return None
    for name in ("optimizer.pt", "scheduler.pt"):
        problem = _torch_file_problem(path / name)
        if problem:
            return problem
    rng = sorted(path.glob("rng_state*.pth"))
    if not rng:
        return "rng_state.pth is missing"
    for f in rng:
        problem = _torch_file_problem(f)
        if problem:
            return problem
    return None


class UnloadableCheckpoint(Exception):
    """A checkpoint that passed `checkpoint_problem` failed to load (`reason`: the file and why, one short
    phrase). A run treats it as incomplete: it continues from the previous complete checkpoint."""

    def __init__(self, checkpoint: Path | None, reason: str):
        super().__init__(reason)
        self.checkpoint, self.reason = checkpoint, reason


def complete_checkpoints(out: Path, final_step: int | None = None,
                         unloadable: dict[str, str] | None = None) -> tuple[list[Path], list[tuple[str, str]]]:
    """The complete `checkpoint-N` folders of `out`, newest first, and `(name, problem)` of the others.

    A checkpoint at `final_step` or later needs only its weights (the run evaluates them, it trains no
    more); `unloadable` maps the names of checkpoints that failed to load to why: they are incomplete."""
    found = sorted((p for p in Path(out).glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None),
                   key=checkpoint_step, reverse=True)
    good, bad = [], []
    for p in found:
        problem = (unloadable or {}).get(p.name) or checkpoint_problem(
            p, resume_state=final_step is None or checkpoint_step(p) < final_step)
        if problem is None:
            good.append(p)
        else:
            bad.append((p.name, problem))
    return good, bad


KeepCheckpoints = Literal["all", "model", "none"]
KEEP_CHECKPOINTS = get_args(KeepCheckpoints)
RESUME_STATE_GLOBS = ("optimizer.pt", "scheduler.pt", "rng_state*.pth")


def prune_checkpoints(out: Path, keep: str) -> int:
    """Drop what a FINISHED run no longer needs from its checkpoints; returns the bytes freed.

    `keep="all"` keeps everything; `"model"` keeps the newest checkpoint without its optimizer, scheduler
    and RNG states (a loadable model, about a third of a full checkpoint for Adam) and deletes the others;
    `"none"` deletes every checkpoint. Only for a run whose `summary.json` exists: a checkpoint of an
    unfinished run is its resume point, and this refuses to touch it."""
    out = Path(out)
    if keep not in KEEP_CHECKPOINTS:
        raise RecipeError(f"keep_checkpoints {keep!r} is not one of {', '.join(KEEP_CHECKPOINTS)}")
    if keep == "all":
        return 0
    if read_summary(out)[0] is None:
        raise RunFolderError(f"{out} has no valid summary.json: its checkpoints are what it resumes from; not pruned")

    def size(path: Path) -> int:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    freed = 0
    found = sorted((p for p in out.glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None),
                   key=checkpoint_step, reverse=True)
    for i, ckpt in enumerate(found):
        if keep == "model" and i == 0:
            for pattern in RESUME_STATE_GLOBS:
                for f in ckpt.glob(pattern):
                    freed += size(f)
                    f.unlink()
            continue
        freed += size(ckpt)
        shutil.rmtree(ckpt)
    return freed


def code_version() -> str:
    """The d3s version that runs: the package version, plus `+g<commit>` when the package is a git checkout
    (and `.dirty` when its `src/` has uncommitted changes). Recorded with every run, so that results
    made by different code are never mixed without saying so."""
    version = d3s.__version__
    src = Path(d3s.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0 or not commit.stdout.strip():
            return version
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", str(src)], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+g{commit.stdout.strip()}" + (".dirty" if dirty.stdout.strip() else "")
