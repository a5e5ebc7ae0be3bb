"""The built distribution installs and trains: `python -m build` gives a wheel and an sdist that carry the recipes,
and the wheel, installed into a fresh virtual environment (not editable, run from outside the source tree) with
torch first and then its `train` extra (a supported TRL and transformers), imports the TRL glue, runs
`d3s train --config smoke` and trains `examples/trl_grpo.py` on a tiny local model.

Slow (minutes: two environments are created and the dependencies downloaded): `pytest -m slow tests/test_wheel.py`,
run by CI's compatibility stage. `D3S_TORCH_VERSION` picks torch (default 2.13.0, as scripts/setup.sh);
`D3S_WHEEL_TRL` pins the TRL installed beside the wheel (default: pip's pick within the `trl` extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"smoke.yaml", "default.yaml", "accelerate/zero3-8gpu.yaml"}


def run(args: list, cwd: Path, **env) -> str:
    """Run `args` in `cwd` with an environment that cannot see the source tree; its output, or a failure showing it."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       TRL_EXPERIMENTAL_SILENCE="1", **env)
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def venv(path: Path, cwd: Path) -> Path:
    run([sys.executable, "-m", "venv", path], cwd)
    run([path / "bin" / "python", "-m", "pip", "install", "-q", "--upgrade", "pip"], cwd)
    return path / "bin"


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_trains(tmp_path):
    work = tmp_path / "outside"  # every command runs here: nothing imports from the source tree
    work.mkdir()
    build = venv(tmp_path / "build-env", work)
    run([build / "pip", "install", "-q", "build"], work)
    run([build / "python", "-m", "build", "--outdir", tmp_path / "dist", ROOT], work)
    wheel = next((tmp_path / "dist").glob("d3s-*.whl"))
    sdist = next((tmp_path / "dist").glob("d3s-*.tar.gz"))
    in_wheel = {n.split("d3s/app/recipes/", 1)[1] for n in zipfile.ZipFile(wheel).namelist() if "d3s/app/recipes/" in n}
    in_sdist = {n.split("d3s/app/recipes/", 1)[1] for n in tarfile.open(sdist).getnames() if "d3s/app/recipes/" in n}
    assert RECIPES <= in_wheel and RECIPES <= in_sdist, (in_wheel, in_sdist)

    env = venv(tmp_path / "env", work)
    run([env / "pip", "install", "-q", f"torch=={os.environ.get('D3S_TORCH_VERSION', '2.13.0')}"], work)  # first
    trl = os.environ.get("D3S_WHEEL_TRL")
    run([env / "pip", "install", "-q", f"{wheel}[train]", *([f"trl=={trl}"] if trl else [])], work)
    where = run([env / "python", "-c", "import d3s, d3s.integrations.trl, trl, transformers; "
                 "print(d3s.__file__, trl.__version__, transformers.__version__)"], work).split()
    assert Path(where[0]).is_relative_to(tmp_path / "env"), where  # the installed copy, not the source tree

    run([env / "d3s", "train", "--config", "smoke", "--output_dir", work / "smoke", "--plots", "false"], work)
    assert (work / "smoke" / "summary.json").is_file()

    model = run([env / "python", "-c", "from pathlib import Path; from d3s.app.models import tiny_model_path; "
                 f"print(tiny_model_path(cache=Path({str(work / 'cache')!r})))"], work).strip().splitlines()[-1]
    run([env / "python", ROOT / "examples" / "trl_grpo.py", "--model", model, "--max_steps", "2", "--num_generations",
         "4", "--per_device_train_batch_size", "8", "--max_completion_length", "12", "--output_dir", work / "example"],
        work)
    assert (work / "example" / "model.safetensors").is_file()
