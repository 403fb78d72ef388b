"""The docs name the interface (docs/api.md's endpoints and error codes, docs/configuration.md's
serving flags, their variables and defaults, management commands and system checks): hold them
to the code, both ways where the doc says it lists everything."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API_MD = (DOCS / "api.md").read_text()
CONFIGURATION_MD = (DOCS / "configuration.md").read_text()
KEYS_MD = (DOCS / "keys.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in ``text`` (header and rule rows left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows[1:] if rows else rows


# -- error codes ------------------------------------------------------------------------------

# the HTTP layer's ways to make an error: helper -> its status (the ApiError calls carry theirs)
HELPERS = {"invalid_request": 400, "forbidden": 403, "rate_limited": 429}
CODE = re.compile(r"^[a-z]+(?:_[a-z]+)*$")
SNAKE = re.compile(r"^[a-z]+(?:_[a-z]+)+$")  # a code among a tuple's other strings ("key", "ip") has an underscore
# codes the server sends only on its own bug (a version skew between web and worker)
INTERNAL_CODES = {"duplicate_id", "invalid_job"}


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def raised_codes() -> dict[str, set[int]]:
    """code -> the HTTP statuses it is sent with, read from the source: every ApiError(status, ...,
    code=...), invalid_request/forbidden/rate_limited call, and the worker's reasons
    (api/link_errors.py). A code passed through a variable is taken from the tuples its function
    builds (the rate-limit buckets)."""
    from api.link_errors import _STATUS

    found: dict[str, set[int]] = {}
    for _reason, (status, _type, code) in _STATUS.items():
        found.setdefault(code, set()).add(status)
    for path in [*sorted((ROOT / "api").glob("*.py")), *sorted((ROOT / "batches").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = getattr(call.func, "id", getattr(call.func, "attr", ""))
            if name == "ApiError" and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, int):
                status = call.args[0].value
                code_node: ast.AST | None = next((k.value for k in call.keywords if k.arg == "code"), None)
            elif name in HELPERS:
                status = HELPERS[name]
                code_node = next((k.value for k in call.keywords if k.arg == "code"), None)
                if code_node is None and name != "invalid_request" and len(call.args) > 1:
                    code_node = call.args[1]
            else:
                continue
            if code_node is None:
                continue
            if isinstance(code_node, ast.Name):  # from the tuples built in the same function
                scope = next(f for f in functions if f.lineno <= call.lineno <= (f.end_lineno or 0))
                tuples = [t for t in ast.walk(scope) if isinstance(t, ast.Tuple)]
                codes = {s for t in tuples for s in _strings(t) if SNAKE.match(s)}
            else:
                codes = {s for s in _strings(code_node) if CODE.match(s)}  # not the "HTTP_HOST" an if tests
            for code in codes:
                found.setdefault(code, set()).add(status)
    return found


def documented_error_codes() -> dict[str, set[int]]:
    """code -> statuses, from docs/api.md's Errors table."""
    table: dict[str, set[int]] = {}
    for cells in table_rows(section(API_MD, "Errors")):
        status, codes = int(cells[0]), re.sub(r"\(type [^)]*\)", "", cells[1])  # "none (type `server_error`)"
        for code in re.findall(r"`([a-z_]+)`", codes):
            table.setdefault(code, set()).add(status)
    return table


def test_every_error_code_docs_api_md_tabulates_is_raised_with_that_status() -> None:
    raised = raised_codes()
    documented = documented_error_codes()
    assert len(documented) > 25
    wrong = {code: (sorted(statuses), sorted(raised.get(code, ()))) for code, statuses in documented.items() if not statuses <= raised.get(code, set())}
    assert wrong == {}  # code: (documented statuses, statuses the code sends it with)


def test_every_error_code_the_server_sends_is_in_docs_api_md_errors_table() -> None:
    raised = raised_codes()
    assert {"queue_full", "rate_limit_exceeded", "completion_rate_limited", "engine_crashed", "admin_key_required"} <= set(raised)
    missing = sorted(set(raised) - set(documented_error_codes()) - INTERNAL_CODES)
    assert missing == []


# -- endpoints --------------------------------------------------------------------------------


def routed_paths() -> set[str]:
    """Every HTTP path the application routes (ASGI consumers and Django's URLconf), with
    parameters as ``{}``; the catch-alls left out."""
    from superfluid_site.asgi import application
    from superfluid_site.urls import urlpatterns

    def norm(pattern: str) -> str:
        pattern = pattern.lstrip("^").rstrip("$")
        pattern = re.sub(r"<[^>]+>|\(\?P<[^>]+>[^)]*\)", "{}", pattern)
        return "/" + pattern

    paths = set()
    for route in application.application_mapping["http"].routes:
        paths.add(norm(str(route.pattern)))
    for entry in urlpatterns:
        text = str(entry.pattern)
        if text.startswith("admin/") or "(?P<rest>" in text or text in ("", "^v1$"):
            continue
        paths.add(norm(text))
    paths.discard("/")  # the ASGI router's catch-all to Django
    return paths


def documented_paths() -> set[str]:
    paths = set()
    for cells in table_rows(section(API_MD, "Endpoints")):
        for path in re.findall(r"`(/[^`]*)`", cells[1]):
            paths.add(re.sub(r"\{[^}]+\}", "{}", path))
    return paths


def test_docs_api_md_endpoints_are_exactly_the_routed_paths() -> None:
    documented, routed = documented_paths(), routed_paths()
    # /v1/internal/models/{}/{} is load|unload: the doc spells both
    expanded = {p.replace("{}/{}", "{}/load") for p in routed} | {p.replace("{}/{}", "{}/unload") for p in routed if "{}/{}" in p}
    expanded = {p for p in expanded if "{}/{}" not in p}
    assert sorted(documented - expanded) == []  # documented, not routed
    assert sorted(expanded - documented) == []  # routed, not documented
    assert "/v1/chat/completions" in documented and "/v1/batches/{}/cancel" in documented


def test_docs_api_md_endpoint_methods_are_the_routed_ones() -> None:
    """A POST-only route is documented as POST; a route documented under GET answers GET."""
    from django.test import Client

    from api.edge import GENERATION_PATHS

    client = Client(HTTP_HOST="127.0.0.1")
    consumers = set(GENERATION_PATHS)  # the Channels consumers' routes (superfluid_site/asgi.py)
    for cells in table_rows(section(API_MD, "Endpoints")):
        method = cells[0]
        for path in re.findall(r"`(/[^`]*)`", cells[1]):
            if path in consumers or path.startswith("/dashboard") or path.startswith("/ws/"):
                assert method == "POST" or path.startswith(("/dashboard", "/ws/"))
                continue
            url = re.sub(r"\{[^}]+\}", "x", path)
            other = client.generic("PATCH", url)
            assert other.status_code == 405, (path, other.status_code)
            allowed = {m.strip() for m in other["Allow"].split(",")}
            assert method in allowed, (path, method, allowed)


# -- serving flags: variables and defaults ----------------------------------------------------

FLAG_ROW = re.compile(r"^`(--[a-z-]+)")


def serve_flag_rows() -> list[tuple[str, str, str]]:
    """(flag, variable cell, default cell) of configuration.md's serving flags table."""
    rows = []
    for cells in table_rows(section(CONFIGURATION_MD, "Serving flags")):
        m = FLAG_ROW.match(cells[0])
        if m:
            rows.append((m.group(1), cells[1], cells[2]))
    return rows


PROBE = """
import argparse, json, django
django.setup()
from scheduler.management.commands.serve import Command
parser = argparse.ArgumentParser()
Command().add_arguments(parser)
print(json.dumps({k: v for k, v in vars(parser.parse_args([])).items()}, default=str))
"""


def serve_defaults(env: dict[str, str]) -> dict[str, Any]:
    """serve's parsed defaults in a fresh process with ``env`` (settings read it at import)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERFLUID_", "DJANGO_")) and k != "REDIS_URL"}
    clean.update(DJANGO_SETTINGS_MODULE="superfluid_site.settings", SUPERFLUID_DATA_DIR=os.environ.get("SUPERFLUID_DATA_DIR", str(ROOT / "data")), **env)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=clean, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _sentinel(value: Any) -> str:
    if isinstance(value, bool):
        return "1"
    if isinstance(value, (int, float)):
        return str(int(value) + 7)
    return "sentinel-value"


def test_each_serve_flags_documented_variable_and_default_are_the_codes() -> None:
    rows = serve_flag_rows()
    assert len(rows) > 40
    defaults = serve_defaults({})
    dest = {f: f.lstrip("-").replace("-", "_") for f, _v, _d in rows}
    dest.update({"--no-http-qos-header": "no_http_qos_header", "--no-repack": "repack"})
    env: dict[str, str] = {}
    expect: dict[str, Any] = {}
    for flag, var_cell, default_cell in rows:
        key = dest[flag]
        # the default column: a literal in backticks at its start is the parsed default
        literal = re.match(r"`([^`]+)`", default_cell)
        if literal and key in defaults and flag not in ("--no-repack",):
            assert str(defaults[key]) == literal.group(1), (flag, defaults[key], literal.group(1))
        var = re.match(r"`([A-Z_]+)(?:=([01]))?`", var_cell)
        if var is None:
            continue
        name, given = var.group(1), var.group(2)
        if flag == "--model":
            env[name], expect["model_env"] = "/sentinel/model.gguf", "/sentinel/model.gguf"
        elif flag == "--config":
            env[name], expect["config_env"] = "/sentinel/models.yaml", "/sentinel/models.yaml"
        elif flag == "--no-repack":
            continue  # SUPERFLUID_NO_REPACK=1 is SUPERFLUID_REPACK=off: tried on its own below
        elif default_cell.startswith("`on`"):  # an on/off flag: its variable is a boolean
            env[name], expect[key] = "0", "off"
        elif given is not None:  # a boolean flag: VAR=1 sets it, VAR=0 (a negated one) sets it too
            env[name] = given
            expect[key] = True
        else:
            env[name] = _sentinel(defaults[key])
            expect[key] = type(defaults[key])(env[name]) if not isinstance(defaults[key], bool) else True
    env["SUPERFLUID_HOST"] = "127.0.0.9"  # a host that is still loopback
    expect["host"] = "127.0.0.9"
    got = serve_defaults(env)
    wrong = {k: (v, got.get(k)) for k, v in expect.items() if got.get(k) != v}
    assert wrong == {}  # dest: (what the documented variable should give, what it gave)
    assert serve_defaults({"SUPERFLUID_NO_REPACK": "1"})["repack"] == "off"


def serve_parser() -> argparse.ArgumentParser:
    from scheduler.management.commands.serve import Command as Serve

    parser = argparse.ArgumentParser()
    Serve().add_arguments(parser)
    return parser


def test_every_serve_flag_has_its_row_in_the_serving_flags_table() -> None:
    """Named somewhere in the page is not enough (tests/core/test_docs_flags.py checks that): a
    flag without its row has no documented variable nor default for the test above to hold."""
    flags = {s for action in serve_parser()._actions for s in action.option_strings if s.startswith("--") and s != "--help"}
    rows = {flag for flag, _var, _default in serve_flag_rows()}
    assert sorted(flags - rows) == []  # serve flags without a row
    assert sorted(rows - flags) == []  # rows of no serve flag


def test_the_variables_said_to_take_a_fraction_are_those_of_the_float_flags() -> None:
    """configuration.md names the variables read as numbers (``0.5``) rather than integers: each
    float flag's (SUPERFLUID_SSE_KEEPALIVE was left out of "the two fractional flags")."""
    start = CONFIGURATION_MD.index("\nBooleans read ")
    paragraph = CONFIGURATION_MD[start : CONFIGURATION_MD.index("\n\n", start)]
    floats = {a.option_strings[0] for a in serve_parser()._actions if a.type is float}
    assert {"--aging-divisor", "--body-timeout", "--sse-keepalive"} <= floats
    variables = {"SUPERFLUID_" + flag.lstrip("-").upper().replace("-", "_") for flag in floats}
    assert sorted(variables - set(re.findall(r"`(SUPERFLUID_[A-Z_]+)`", paragraph))) == []


# the variables the product's code reads by name (the serving flags' own, made from the flag's
# name, are held to the flags table above); a test hook's are not the operator's
ENV_READ = re.compile(r'(?:env_(?:str|int|bool|float|list)\(|environ\.get\(|environ\[|getenv\()\s*"([A-Z][A-Z0-9_]*)"')
PRODUCT_DIRS = ("api", "activity", "batches", "dashboard", "keys", "scheduler", "superfluid_site")


def test_every_variable_the_code_reads_is_in_docs_configuration_md() -> None:
    read = {name for d in PRODUCT_DIRS for path in (ROOT / d).rglob("*.py") for name in ENV_READ.findall(path.read_text())}
    read |= set(ENV_READ.findall((ROOT / "manage.py").read_text()))
    read = {name for name in read if not name.startswith("SUPERFLUID_TEST_") and name != "DJANGO_SETTINGS_MODULE"}
    assert {"SUPERFLUID_DATA_DIR", "DATABASE_URL", "REDIS_URL", "SUPERFLUID_EVENT_LOOP"} <= read
    assert sorted(name for name in read if not re.search(rf"\b{name}\b", CONFIGURATION_MD)) == []


# -- management commands ----------------------------------------------------------------------

BASE_OPTIONS = {"--help", "--version", "--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color", "--force-color", "--skip-checks"}
# where each of the project's commands (serve aside: test_docs_flags.py) is documented, options included
DOCUMENTED_IN = {
    "runengine": CONFIGURATION_MD,
    "checkengine": CONFIGURATION_MD,
    "mlxconvert": CONFIGURATION_MD,
    "createkey": KEYS_MD,
    "revokekey": KEYS_MD,
    "pruneactivity": CONFIGURATION_MD,
}


def command_options(name: str) -> set[str]:
    command = load_command_class(get_commands()[name], name)
    parser = command.create_parser("manage.py", name)
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")} - BASE_OPTIONS


def test_every_project_command_is_documented_with_its_options() -> None:
    ours = {name for name, app in get_commands().items() if app in ("scheduler", "keys", "activity")}
    assert ours == set(DOCUMENTED_IN) | {"serve"}
    missing = {}
    for name, doc in DOCUMENTED_IN.items():
        if f"manage.py {name}" not in doc and f"`{name}" not in doc:
            missing[name] = ["the command itself"]
            continue
        absent = sorted(o for o in command_options(name) if f"`{o}" not in doc and f"{o} " not in doc and f"[{o}" not in doc)
        if absent:
            missing[name] = absent
    assert missing == {}


# -- system checks ----------------------------------------------------------------------------


def test_docs_configuration_md_lists_exactly_the_system_check_ids() -> None:
    source = (ROOT / "scheduler" / "checks.py").read_text()
    in_code = set(re.findall(r'id="(superfluid\.[EW]\d{3})"', source))
    table = section(CONFIGURATION_MD, "System checks")
    documented = {m for cells in table_rows(table) for m in re.findall(r"`(superfluid\.[EW]\d{3})`", cells[0])}
    assert len(in_code) >= 5
    assert documented == in_code


# outside tools' flags the docs give in their commands (pip, redis-server, celery)
OUTSIDE_FLAGS = {"--find-links", "--force-reinstall", "--no-cache-dir", "--save", "--appendonly", "--pool", "--concurrency"}
OPERATOR_DOCS = ("README.md", "docs/configuration.md", "docs/operations.md", "docs/architecture.md")


def test_every_flag_the_operators_docs_name_is_one_a_command_takes() -> None:
    """operations.md and architecture.md named a `--reconnect-timeout` no command has (the link's
    fixed 120 s): a flag an operator reads must be one a command of the project takes, or an
    outside tool's."""
    taken = {"--help"} | set().union(*(command_options(name) for name in (*DOCUMENTED_IN, "serve", "check")))
    named = {flag for doc in OPERATOR_DOCS for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", (ROOT / doc).read_text())}
    assert {"--max-batch", "--fim-model", "--days"} <= named
    assert sorted(named - taken - OUTSIDE_FLAGS) == []
