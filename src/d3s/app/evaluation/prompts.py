"""Prompt templates (paper sec. 4.1 evaluates instruction / math models in their own format).

A template is a string with a `{question}` placeholder, filled with `str.replace` (templates hold
LaTeX braces such as `\\boxed{}`, so `str.format` is not used). The filled text becomes the user
message of the model's chat template when the model has one (`chat="auto"`), or the raw prompt.
"""

from __future__ import annotations

from typing import Any, Literal

from d3s.app.errors import UsageError
from d3s.app.math_data import MATH_INSTRUCTION
from d3s.app.tasks import ARITH_INSTRUCTION

ChatMode = Literal["auto", "on", "off"]

BOXED_TEMPLATE = "{question}\n" + MATH_INSTRUCTION
"""Qwen2.5-Math's chain-of-thought instruction, the usual one for math-verify scoring."""

ARITH_TEMPLATE = "{question} " + ARITH_INSTRUCTION
"""The embedded task's own prompt (identical to `d3s.app.tasks.prompt_text`)."""


def default_template(benchmark: str) -> str:
    """Template a benchmark uses unless the user gives one."""
    return ARITH_TEMPLATE if benchmark == "arith" else BOXED_TEMPLATE


def fill_template(template: str, question: str) -> str:
    """The user message for one question."""
    if "{question}" not in template:
        raise UsageError(f"prompt template {template!r:.80} has no {{question}} placeholder")
    return template.replace("{question}", question)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat(tokenizer: Any, chat: ChatMode) -> bool:
    """Whether prompts go through the chat template; `on` without one is an error."""
    if chat == "auto":
        return has_chat_template(tokenizer)
    elif chat == "on":
        if not has_chat_template(tokenizer):
            raise UsageError(
                "--chat on, but the model's tokenizer has no chat template; use --chat off or auto"
            )
        return True
    elif chat == "off":
        return False
    else:
        raise UsageError(f"chat={chat!r}; valid: auto, on, off")


def render_prompt(
    tokenizer: Any, user_text: str, chat: ChatMode = "auto", system_prompt: str | None = None
) -> str:
    """Final prompt text: chat-formatted with a generation prompt, or the plain user text."""
    if uses_chat(tokenizer, chat):
        messages = [{"role": "user", "content": user_text}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
