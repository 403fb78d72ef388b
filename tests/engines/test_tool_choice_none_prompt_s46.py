"""``tool_choice: "none"`` keeps the tools in the prompt: the model sees them (as under OpenAI, and
as llama-server gives them to the template: common_chat_params_init_without_tools renders
``inputs.tools``) and is not let to call them. Before, the worker dropped them: an agent's
"answer now in text" turn rendered a conversation whose earlier calls named functions the model
was no longer shown, and its prompt no longer began as the same conversation's ``auto`` turns
did, so the cached prefix was lost at the system message."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.worker.loop import EngineWorker

TOOL = {"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def _worker(engine: SimEngine) -> EngineWorker:
    return EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=4096), model_name="m", prepare_in_thread=False)


def _prompt(worker: EngineWorker, choice: str) -> str:
    request = {"endpoint": "chat", "messages": MESSAGES, "tools": [TOOL], "tool_choice": choice}
    tokens, *_ = worker._prompt_tokens(request, "")
    return bytes(t % 256 for t in tokens).decode()


def test_the_generic_prompt_lists_the_tools_under_none_as_under_auto() -> None:
    worker = _worker(SimEngine(n_lanes=1, lane_ctx=4096))
    none, auto = _prompt(worker, "none"), _prompt(worker, "auto")
    assert "get_weather" in none and "The weather in a city." in none
    assert none == auto  # the same prompt: the same cached prefix for the conversation's turns


def test_a_template_that_renders_tools_gets_them_under_none() -> None:
    engine = SimEngine(n_lanes=1, lane_ctx=4096)
    engine.features = frozenset({"template_vars"})
    engine.chat_template = "{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    seen: list[Any] = []

    def render(messages: list[dict[str, Any]], **extra: Any) -> str:
        seen.append(extra.get("tools"))
        names = "".join(t["function"]["name"] for t in extra.get("tools") or [])
        return names + "".join(str(m["content"]) for m in messages)

    engine.render_chat = render  # type: ignore[method-assign]
    text = _prompt(_worker(engine), "none")
    assert text.startswith("get_weather") and seen and all(t and t[0]["function"]["name"] == "get_weather" for t in seen)
