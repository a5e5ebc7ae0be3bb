"""The error types of the `d3s` command's own making; every module of `d3s.app` may import them."""

from __future__ import annotations

from typing import Any, Callable


class UsageError(ValueError):
    """A value from the user (recipe, option, file, model name) that cannot be used. The message is one
    line naming the value and what would be valid; `d3s` prints it and exits with status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that a command stops the same way (Python's default for SIGTERM is to die at
    once, without a word); `d3s` then says so and exits with status 143."""


class RecipeError(UsageError):
    """A recipe or command line that cannot be used; the message is one line for the user."""


class RunFolderError(RecipeError):
    """A run's output folder or one of its files that cannot be used as asked; the message is one line for the user."""


class ModelLoadError(UsageError):
    """A model that cannot be found or loaded (a folder that does not exist, weights d3s will not load)."""


class SettingsError(ValueError):
    """Settings that do not go together, each shown as `name=value` in the message.

    `template` holds one `{name}` per setting; `named(rename)` is the message with the names the user
    wrote them under (a recipe's `task_min_terms` for a task's `min_terms`), `str()` with the names as given.
    """

    def __init__(self, template: str, **settings: Any) -> None:
        self.template, self.settings = template, settings
        super().__init__(self.named())

    def named(self, rename: Callable[[str], str] = str) -> str:
        return self.template.format(**{name: f"{rename(name)}={value!r}" for name, value in self.settings.items()})
