"""The figures about the project rather than a campaign: the GPU measurement, generation's share, the supported
versions, the TRL matrix, the private TRL names and D3SConfig's fields (`scripts/readme_figures.py`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from figures_common import RESULTS, _compare, _link

GPU_FOLDER = "gpu-h200"


def gpu_training_phase(root: Path, prefix: str = "") -> str:
    """The one GPU measurement: D3S's training phase against TRL's GRPO early and late in the schedule, and the
    trainer tests on the same GPU."""
    folder = root / RESULTS / GPU_FOLDER
    data = json.loads((folder / "bench_trl_training_phase_qwen-0.5b_cuda.json").read_text())
    ratio = {r["name"].split(":")[0]: r["ratio_vs_grpo"] for r in data["results"]}
    batch = data["batch"]
    lo, hi = batch["completion_tokens"]
    tests = re.search(r"(\d+) failed, (\d+) passed", (folder / "tests3.log").read_text())
    failed, passed = int(tests.group(1)), int(tests.group(2))
    return (f"The one GPU measurement (one {data['device']}, a {data['model_parameters'] / 1e6:.0f}M-parameter "
            f"Qwen2.5-0.5B-shaped model with random weights, bf16, {batch['prompts']} prompts x "
            f"{batch['num_generations']} rollouts of {lo}-{hi} tokens): D3S's training phase, generation not "
            f"included, took {ratio['d3s early']:.2f}x GRPO's early in its schedule (N = 4 of 16 rollouts, K = 5% of "
            f"tokens) and {ratio['d3s late']:.2f}x late (N = 16 of 16, K = 20%); the trainer tests passed there, "
            f"{passed} of {passed + failed} (one missed its tolerance). Source: {_link(GPU_FOLDER, prefix)}.")


def generation_share(root: Path, prefix: str = "") -> str:
    """Generation's share of a GRPO step in the 5-seed campaigns: what no variant's step can go below."""
    shares = []
    for folder in ("campaign5-default", "campaign5-arith2digit"):
        parts = _compare(root, folder)["variants"]["grpo"]["step_seconds_mean"]
        shares.append(parts["generation"] / parts["step"])
    return (f"On the CPU campaigns generation took {shares[0]:.2f} (default task) and {shares[1]:.2f} (arith-2digit) "
            f"of a GRPO step ({_link('campaign5-default', prefix)}, {_link('campaign5-arith2digit', prefix)}), so "
            f"no variant's step cost less than that share there.")


def supported_versions(root: Path, prefix: str = "") -> str:
    """The versions `pyproject.toml` declares: Python, torch, and the TRL extra's pins."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in project["dependencies"]
            + project["optional-dependencies"]["trl"]}
    shown = ", ".join(f"`{pins[name]}`" for name in ("torch", "trl", "transformers", "accelerate", "datasets"))
    return (f"Supported: Python `{project['requires-python']}`, {shown} (`pyproject.toml`; the TRL glue overrides "
            f"private TRL methods, so TRL and transformers are held to the versions measured: "
            f"[docs/compatibility.md]({prefix}docs/compatibility.md)).")


def trl_matrix(root: Path, prefix: str = "") -> str:
    """docs/compatibility.md's table: the rows `scripts/trl_matrix.sh` printed (`benchmarks/results/trl-matrix/
    table.md`), each TRL version marked against the ranges compat.py declares now, and the machine they ran on."""
    from d3s.integrations.trl.compat import TRANSFORMERS_VERSION_RANGE, TRL_VERSION_RANGE
    from packaging.version import Version

    folder = root / RESULTS / "trl-matrix"
    rows = [line for line in (folder / "table.md").read_text().splitlines() if line.startswith("| ")][1:]
    lines = ["| TRL | transformers | private-name mismatches | tests passed | tests failed | supported now | took |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0] == "TRL" or set(cells[0]) <= {"-"}:
            continue
        trl_v, tf_v = Version(cells[0]), Version(cells[1])
        inside = (TRL_VERSION_RANGE[0] <= trl_v < TRL_VERSION_RANGE[1]
                  and TRANSFORMERS_VERSION_RANGE[0] <= tf_v < TRANSFORMERS_VERSION_RANGE[1])
        lines.append("| " + " | ".join([*cells[:5], "yes" if inside else "no", cells[6]]) + " |")
    machine = (folder / "machine.txt").read_text().strip()
    return "\n".join(lines) + (f"\n\nMeasured on {machine}, beside other work: the durations (installing "
                               f"included) say nothing about speed. Source: {_link('trl-matrix', prefix)} (one "
                               f"log per row).")


def private_trl_names(root: Path, prefix: str = "") -> str:
    """docs/trl.md's table of `PRIVATE_TRL_API`: each private (or undocumented) TRL name the glue relies on, the TRL
    versions that have it, how the glue uses it and why no public API does instead, read from compat.py itself."""
    from d3s.integrations.trl.compat import PRIVATE_TRL_API, PRIVATE_TRL_API_REASONS

    lines = ["| TRL name | TRL versions | Use, and why not a public API |", "|---|---|---|"]
    for name, expected in PRIVATE_TRL_API.items():
        versions = ", ".join(f"`{spec}`" for spec in expected) if isinstance(expected, dict) else "all supported"
        lines.append(f"| `{name}` | {versions} | {PRIVATE_TRL_API_REASONS[name]} |")
    public = sum(PRIVATE_TRL_API_REASONS[name].startswith("Public") for name in PRIVATE_TRL_API)
    lines.append("")
    lines.append(f"{len(PRIVATE_TRL_API)} entries (`d3s.integrations.trl.compat.PRIVATE_TRL_API`): {public} public "
                 f"methods the trainer overrides, {len(PRIVATE_TRL_API) - public} private or undocumented names. "
                 "A test checks every entry against the installed TRL, and that the glue relies on no TRL name "
                 "the table does not list.")
    return "\n".join(lines)


def d3s_config_fields(root: Path, prefix: str = "") -> str:
    """docs/trl.md's table of the fields `D3SConfig` adds to TRL's `GRPOConfig`: name, default and help, read from
    the dataclass itself, so a field added there and not here fails `--check`."""
    import dataclasses

    from d3s.integrations.trl import D3SConfig
    from d3s.integrations.trl.compat import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(D3SConfig):
        if f.name in trl_fields or not f.init:
            continue
        default = "-" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
        text = f.metadata.get("help", "").replace("|", "\\|")
        lines.append(f"| `{f.name}` | {default} | {text} |")
    return "\n".join(lines)
