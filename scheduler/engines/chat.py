"""Chat templates, rendered the same way for every engine: Jinja in a sandbox, as llama.cpp's
server and Hugging Face tokenizers render them."""

from __future__ import annotations

import time
from typing import Any

from scheduler.engines.base import EngineError

# For models that ship no template.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def compile_chat_template(source: str | None) -> Any:
    """A compiled template for ``source`` (ChatML when None). A template that does not compile is
    the model's fault, not the request's: a permanent EngineError, not a ValueError (a 400)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def strftime_now(fmt: str) -> str:
        return time.strftime(fmt)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source or CHATML)
    except jinja2.TemplateSyntaxError as exc:
        raise EngineError(f"the model's chat template does not compile: {exc}", permanent=True) from exc


def render_chat_template(template: Any, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str) -> str:
    """``messages`` through ``template`` with the generation prompt added. Template errors
    (``raise_exception``, or messages the template cannot handle) surface as ``ValueError``:
    they are the request's fault as far as a client is told."""
    import jinja2

    try:
        return str(
            template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        )
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template failed: {exc}") from exc
