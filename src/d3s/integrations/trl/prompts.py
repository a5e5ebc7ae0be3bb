"""Which prompts a generation batch holds: GRESO's skip before generating, DAPO's refill after scoring.

Glue around `d3s.prompt_filter` (docs/method.md section 9.1). `PromptChooser` belongs to the trainer
(`D3SGRPOTrainer._d3s_prompts`, set when `prompt_skip` or `dynamic_sampling` is on) and `generate` runs one
generation batch through it:

1. the keys of the batch's prompts (a hash of each dataset row) are gathered from every process;
2. `prompt_skip`: `choose_prompts` on the gathered keys; every process replaces its own rows of the
   skipped prompts by the replacements' dataset rows (the same choice everywhere: same history, same
   seeded generator, same keys);
3. TRL generates and scores (`D3SGRPOTrainer._d3s_generate_once`);
4. `dynamic_sampling`: while fewer groups than prompts have signal, another round of as many fresh
   prompts (`draw_prompts`) is generated, up to `dynamic_sampling_max_rounds`; the batch then holds
   the groups with signal (in generation order), completed by flat ones when there are too few
   (`rows.merge_generations`), so every process holds as many rows as TRL expects;
5. `prompt_skip`: the outcome of every generated group goes to the history, applied before the next
   generation batch (so a checkpoint written in the middle of a step saves the history of the steps
   that finished).

The generator of generation batch j is seeded from (`seed`, j), so a resumed run draws what the
uninterrupted run drew; the history is saved with each checkpoint (`CHECKPOINT_FILE`).
"""

from __future__ import annotations

import hashlib
import json
import os

import torch

from d3s.advantages import weighted_rewards
from d3s.integrations.trl.rows import merge_generations
from d3s.prompt_filter import PromptHistory, choose_prompts, draw_prompts, flat_groups
from d3s.schedule import generation_index

CHECKPOINT_FILE = "d3s_prompt_history.pt"
"""The prompt history in a checkpoint folder (written by the main process)."""


def row_key(row: dict, columns: list[str]) -> int:
    """A stable int64 key of a dataset row: a hash of its `columns` (the same on every process and run)."""
    text = json.dumps({c: row.get(c) for c in columns}, sort_keys=True, default=repr)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def hashes(accelerator, inputs: list[dict]) -> list[str]:
    """Short hashes (8 hex digits) of the distinct prompts of a generation batch, all processes, in order of first
    appearance: which prompts a step trained on, checkable from the run's records."""
    local = torch.tensor([row_key(row, ["prompt"]) for row in inputs], dtype=torch.int64, device=accelerator.device)
    out: list[str] = []
    for key in accelerator.gather(local).tolist():  # (S * processes,) in generation order
        text = f"{key & 0xFFFFFFFF:08x}"
        if text not in out:
            out.append(text)
    return out


def _seed(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"d3s-prompts:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class PromptChooser:
    """The prompt history and the dataset the replacements come from (see the module docstring)."""

    def __init__(self, dataset, *, seed: int, explore: float, history: int, skip: bool):
        if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ValueError(
                "prompt_skip and dynamic_sampling draw other prompts from the training dataset, which must be a "
                f"map-style dataset (with len() and indexing), got {type(dataset).__name__}; turn both off"
            )
        self.dataset, self.seed, self.explore, self.skip = dataset, seed, explore, skip
        self.history = PromptHistory(history)
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (generation index, keys, flat)
        self.columns: list[str] | None = None
        self.pool_keys: torch.Tensor | None = None  # (N,) the key of every dataset row

    # -- keys and rows -------------------------------------------------------------------------------

    def ensure_pool(self, inputs: list[dict]) -> torch.Tensor:
        if self.pool_keys is None:  # once: the columns the dataloader hands out, and every row's key
            self.columns = sorted(inputs[0])
            self.pool_keys = torch.tensor([row_key(self.dataset[i], self.columns) for i in range(len(self.dataset))],
                                          dtype=torch.int64)
        return self.pool_keys

    def dataset_row(self, index: int) -> dict:
        row = self.dataset[index]
        return {c: row[c] for c in self.columns}

    def rows_for(self, groups: torch.Tensor, rank: int, rows_per_process: int, num_generations: int) -> list[dict]:
        """This process's rows of the groups whose dataset indices are `groups` `(B,)` (each repeated G times)."""
        start = rank * rows_per_process
        return [self.dataset_row(int(groups[(start + i) // num_generations])) for i in range(rows_per_process)]

    def gather_keys(self, accelerator, inputs: list[dict], num_generations: int) -> torch.Tensor:
        """`(B,)` the keys of the generation batch's prompts, all processes, in group order."""
        self.ensure_pool(inputs)
        local = torch.tensor([row_key(row, self.columns) for row in inputs], dtype=torch.int64,
                             device=accelerator.device)  # (S,)
        return accelerator.gather(local).cpu()[::num_generations]  # (B,)

    # -- the history ---------------------------------------------------------------------------------

    def generator(self, index: int) -> torch.Generator:
        """The generator of generation batch `index`."""
        return torch.Generator().manual_seed(_seed(self.seed, index))

    def apply_pending(self, before: int, history: PromptHistory) -> None:
        for index, keys, flat in self.pending:
            if index < before:
                history.update(keys, flat)

    def start(self, index: int) -> None:
        """Before generation batch `index`: the outcomes of the earlier ones join the history."""
        self.apply_pending(index, self.history)
        self.pending = [p for p in self.pending if p[0] >= index]

    def record(self, index: int, keys: torch.Tensor, flat: torch.Tensor) -> None:
        if self.skip:
            self.pending.append((index, keys, flat))

    def state_dict(self, next_index: int) -> dict:
        """The history as a run resumed before generation batch `next_index` needs it."""
        history = PromptHistory(self.history.max_streak)
        history.load_state_dict(self.history.state_dict())
        self.apply_pending(next_index, history)
        return {"history": history.state_dict(), "next_generation": next_index}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.pending = []

    # -- choices ---------------------------------------------------------------------------------------

    def skip_prompts(self, accelerator, inputs: list[dict], keys: torch.Tensor, num_generations: int,
                     generator: torch.Generator):
        """GRESO's filter: `(inputs with the skipped prompts replaced, their keys (B,), skipped, unfilled)`."""
        pool = self.pool_keys
        choice = choose_prompts(keys, self.history.streaks(keys), pool, self.history.streaks(pool), self.explore,
                                generator)
        if not choice.skipped.any():
            return inputs, keys, 0, int(choice.unfilled.sum())
        S = len(inputs)
        start = accelerator.process_index * S
        out = list(inputs)
        for i in range(S):
            replacement = int(choice.replacement[(start + i) // num_generations])
            if replacement >= 0:
                out[i] = self.dataset_row(replacement)
        keys = torch.where(choice.skipped, pool[choice.replacement.clamp(min=0)], keys)  # (B,)
        return out, keys, int(choice.skipped.sum()), int(choice.unfilled.sum())

    def draw(self, accelerator, count: int, exclude: torch.Tensor, rows_per_process: int, num_generations: int,
             generator: torch.Generator):
        """`count` fresh prompts for a refill round: `(this process's rows, their keys (count,))`, or None when
        the dataset has fewer than `count` prompts left to draw."""
        pool = self.pool_keys
        streaks = self.history.streaks(pool) if self.skip else torch.zeros_like(pool)
        drawn = draw_prompts(count, pool, streaks, exclude, self.explore, generator)  # (n,)
        if drawn.numel() < count:
            return None
        rows = self.rows_for(drawn, accelerator.process_index, rows_per_process, num_generations)
        return rows, pool[drawn]


def generate(trainer, inputs: list[dict]) -> tuple[dict, torch.Tensor | None, dict]:
    """One generation batch with the prompt options on: `(batch, generation entropies or None, counts)`.

    The counts: `skipped`, `unfilled` (prompts the rule would skip but no replacement was left),
    `groups_generated`, `flat_generated`, `rounds`. On return `trainer._d3s_rewards_per_func` holds the
    rewards of the rows of the returned batch (all processes).
    """
    args, accelerator, G = trainer.args, trainer.accelerator, trainer.num_generations
    chooser: PromptChooser = trainer._d3s_prompts
    index = trainer.d3s_generation_index()
    chooser.start(index)
    generator = chooser.generator(index)
    keys = chooser.gather_keys(accelerator, inputs, G)  # (B,)
    B, S = keys.numel(), len(inputs)
    skipped = unfilled = 0
    if args.prompt_skip:
        inputs, keys, skipped, unfilled = chooser.skip_prompts(accelerator, inputs, keys, G, generator)

    batch, entropies = trainer._d3s_generate_once(inputs)
    rounds = [(batch, entropies, trainer._d3s_rewards_per_func, keys)]
    flats = [flat_groups(weighted_rewards(rounds[0][2], trainer.reward_weights), G).cpu()]  # (B,) per round
    if args.dynamic_sampling:
        while int(sum((~f).sum() for f in flats)) < B and len(rounds) <= args.dynamic_sampling_max_rounds:
            drawn = chooser.draw(accelerator, B, torch.cat([r[3] for r in rounds]), S, G, generator)
            if drawn is None:
                break
            more, more_entropies = trainer._d3s_generate_once(drawn[0])
            rounds.append((more, more_entropies, trainer._d3s_rewards_per_func, drawn[1]))
            flats.append(flat_groups(weighted_rewards(rounds[-1][2], trainer.reward_weights), G).cpu())
    all_keys, all_flat = torch.cat([r[3] for r in rounds]), torch.cat(flats)  # (R*B,)
    chooser.record(index, all_keys, all_flat)
    counts = {"skipped": skipped, "unfilled": unfilled, "groups_generated": all_flat.numel(),
              "flat_generated": int(all_flat.sum()), "rounds": len(rounds)}
    if len(rounds) == 1:
        return batch, entropies, counts

    # The groups with signal first in generation order, then flat ones, B in all; kept in generation order
    position = torch.arange(all_flat.numel())
    ranked = torch.cat([position[~all_flat], position[all_flat]])[:B]
    groups = ranked.sort().values  # (B,) over all rounds' groups
    rows = (groups.unsqueeze(1) * G + torch.arange(G)).reshape(-1)  # (B*G,) over all rounds' global rows
    with_entropy = all(r[1] is not None for r in rounds)
    parts = [{**r[0], "d3s_entropies": r[1] if with_entropy else None} for r in rounds]
    merged = merge_generations(parts, rows.to(accelerator.device), accelerator=accelerator,
                               pad_token_id=trainer.processing_class.pad_token_id,
                               cut_columns=trainer.pad_to_multiple_of is None)
    entropies = merged.pop("d3s_entropies", None)
    rewards_per_func = torch.cat([r[2] for r in rounds])  # (R*B*G, F)
    trainer._d3s_rewards_per_func = rewards_per_func[rows.to(rewards_per_func.device)]  # (B*G, F)
    return merged, entropies, counts


def save_history(trainer, trial) -> None:
    """Write the prompt history (prompt_skip) into the checkpoint TRL just saved, as TRL keeps its entropy state."""
    chooser = trainer._d3s_prompts
    if chooser is None or not chooser.skip or not trainer.args.should_save:
        return
    folder = os.path.join(trainer._get_output_dir(trial=trial), f"checkpoint-{trainer.state.global_step}")
    next_index = generation_index(trainer.state.global_step, 0, trainer.args.gradient_accumulation_steps,
                                  trainer.args.steps_per_generation * trainer.num_iterations)
    torch.save(chooser.state_dict(next_index), os.path.join(folder, CHECKPOINT_FILE))


def load_history(trainer, checkpoint: str | None) -> None:
    """Restore the prompt history of `checkpoint`; one written without prompt_skip has none: it starts empty."""
    chooser = trainer._d3s_prompts
    if checkpoint is None or chooser is None or not chooser.skip:
        return
    path = os.path.join(checkpoint, CHECKPOINT_FILE)
    if os.path.isfile(path):
        chooser.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
