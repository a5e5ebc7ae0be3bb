"""The one error type of the `d3s` command's own making."""


class UsageError(ValueError):
    """A value from the user (recipe, option, file, model name) that cannot be used. The message is one
    line naming the value and what would be valid; `d3s` prints it and exits with status 2."""
