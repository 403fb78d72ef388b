"""What the tool-call grammars cost for the tool sets real agents send: for each set of
``testkit/agent_tools.py`` (Claude Code's, Codex's, MCP servers', pydantic's and zod's output, and
an agent with three MCP servers at once) and each call format, the grammar a forced call
(``tool_choice`` required) and ``tool_choice`` auto (the lazy grammar) get: its size, the time to
build it (``scheduler.engines.grammar``, uncached: a new tool set's first request pays it, on the
engine thread) and the time llama.cpp takes to parse it into a grammar sampler (each lane bind of
a constrained job pays it). Medians of ``--repeat`` builds and parses.

    python bench/tool_grammars.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.engines import grammar as grammars  # noqa: E402
from scheduler.engines.llama_cpp import LlamaCppEngine  # noqa: E402
from scheduler.engines.models import default_model_path  # noqa: E402
from testkit.agent_tools import SETS  # noqa: E402

FORMATS = ("hermes", "qwen3_coder", "glm45", "llama3", "mistral", "harmony")


def _uncached() -> None:
    """Forget every grammar built so far (the module's lru_caches)."""
    for value in vars(grammars).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()


def _grammar(tools: list[dict[str, Any]], fmt: str, auto: bool) -> str | None:
    if auto:
        return grammars.lazy_tool_grammar(tools, True, fmt=fmt)
    if fmt == "harmony":  # (a forced call is the <tool_call> format whatever the model's)
        return None
    return grammars.tool_grammar(tools, "required", True, fmt=fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    engine = LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=512)
    print("| tool set | tools | format | tool_choice | grammar KB | rules | build ms | llama.cpp parse ms |")
    print("|---|--:|---|---|--:|--:|--:|--:|")
    for name, (tools, _calls, _invalid) in SETS.items():
        for fmt in FORMATS:
            for auto in (False, True):
                builds, parses, grammar = [], [], None
                for _ in range(args.repeat):
                    _uncached()
                    t0 = time.perf_counter()
                    grammar = _grammar(tools, fmt, auto)
                    builds.append(time.perf_counter() - t0)
                    if grammar is None:
                        break
                    t0 = time.perf_counter()
                    error = engine.check_grammar(grammar)
                    parses.append(time.perf_counter() - t0)
                    if error:
                        raise SystemExit(f"{name} {fmt}: llama.cpp refused the grammar: {error}")
                if grammar is None:
                    continue
                rules = sum(1 for line in grammar.splitlines() if "::=" in line)
                print(
                    f"| {name} | {len(tools)} | {fmt} | {'auto' if auto else 'required'} | {len(grammar) / 1024:.1f} | {rules} "
                    f"| {statistics.median(builds) * 1000:.1f} | {statistics.median(parses) * 1000:.2f} |"
                )
    engine.close()


if __name__ == "__main__":
    main()
