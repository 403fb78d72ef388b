"""Tool sets that real agents send, as test data: each tool as the chat API's ``function``
(``name``, ``description``, ``parameters``) and, for each, a realistic call (the arguments a model
writes) and calls that break its schema.

Written from the tools' public schemas, shortened where a description is long, faithful in shape:
Claude Code's (zod-to-json-schema output: draft-07 ``$schema``, ``additionalProperties: false``,
TodoWrite's array of objects with enums, MultiEdit's ``minItems``), OpenAI Codex's (``shell``
with an array-of-strings command, ``apply_patch`` as a custom tool served as a function of one
string ``input``, ``update_plan``), MCP servers' (the filesystem server's zod schemas, GitHub's
Go server: enums, ``minimum``/``maximum``, nullable types), a generic MCP server's
(``$defs``/``$ref``, ``format``, ``pattern``, ``anyOf``/``oneOf``, ``additionalProperties``
schemas, ``default``, ``examples``, descriptions with quotes, new lines and unicode), pydantic's
(made by pydantic itself: titles, ``$defs`` with references, a discriminated union, a
``Decimal``'s pattern with a lookahead, ``allOf`` around one reference) and zod's
(``exclusiveMinimum`` as a number, and draft-04's boolean form beside ``minimum``, a pattern
with a non-capturing group). A ``number``'s ``minimum``/``maximum`` (GitHub's ``perPage``) and
the string ``format``s ``email`` and ``uri`` are not enforced (docs/api.md), so no broken call
here rests on them."""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False, "$schema": DRAFT_07, **extra},
    }


S = {"type": "string"}
N = {"type": "number"}
B = {"type": "boolean"}


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


# -- Claude Code ------------------------------------------------------------------------------

CLAUDE_CODE = [
    _tool(
        "Task",
        "Launch a new agent to handle complex, multi-step tasks autonomously.\n\nAvailable agent types:\n- general-purpose: ...",
        {"description": _s("A short (3-5 word) description of the task"), "prompt": _s("The task for the agent to perform"),
         "subagent_type": _s("The type of specialized agent to use for this task")},
        ["description", "prompt", "subagent_type"],
    ),
    _tool(
        "Bash",
        'Executes a given bash command in a persistent shell session.\n\nIMPORTANT: use "quotes" around paths with spaces — e.g. cd "/Users/name/My Documents"',
        {"command": _s("The command to execute"), "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
         "description": _s("Clear, concise description of what this command does in 5-10 words."),
         "run_in_background": {"type": "boolean", "description": "Set to true to run this command in the background."}},
        ["command"],
    ),
    _tool(
        "Glob",
        'Fast file pattern matching tool. Supports glob patterns like "**/*.js" or "src/**/*.ts".',
        {"pattern": _s("The glob pattern to match files against"), "path": _s("The directory to search in. Omit it for the default; do not enter \"undefined\" or \"null\".")},
        ["pattern"],
    ),
    _tool(
        "Grep",
        "A powerful search tool built on ripgrep.",
        {
            "pattern": _s("The regular expression pattern to search for in file contents"),
            "path": _s("File or directory to search in (rg PATH). Defaults to current working directory."),
            "glob": _s('Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}") - maps to rg --glob'),
            "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"], "description": 'Output mode. Defaults to "files_with_matches".'},
            "-B": {"type": "number", "description": "Number of lines to show before each match (rg -B)."},
            "-A": {"type": "number", "description": "Number of lines to show after each match (rg -A)."},
            "-C": {"type": "number", "description": "Number of lines to show before and after each match (rg -C)."},
            "-n": {"type": "boolean", "description": "Show line numbers in output (rg -n)."},
            "-i": {"type": "boolean", "description": "Case insensitive search (rg -i)"},
            "type": _s("File type to search (rg --type). Common types: js, py, rust, go, java, etc."),
            "head_limit": {"type": "number", "description": 'Limit output to first N lines/entries, equivalent to "| head -N".'},
            "multiline": {"type": "boolean", "description": "Enable multiline mode where . matches newlines (rg -U --multiline-dotall)."},
        },
        ["pattern"],
    ),
    _tool("ExitPlanMode", "Prompts the user to exit plan mode and start coding.", {"plan": _s("The plan you came up with, in markdown.")}, ["plan"]),
    _tool(
        "Read",
        "Reads a file from the local filesystem.",
        {"file_path": _s("The absolute path to the file to read"), "offset": {"type": "number", "description": "The line number to start reading from."},
         "limit": {"type": "number", "description": "The number of lines to read."}},
        ["file_path"],
    ),
    _tool(
        "Edit",
        "Performs exact string replacements in files.",
        {"file_path": _s("The absolute path to the file to modify"), "old_string": _s("The text to replace"),
         "new_string": _s("The text to replace it with (must be different from old_string)"),
         "replace_all": {"type": "boolean", "default": False, "description": "Replace all occurences of old_string (default false)"}},
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "MultiEdit",
        "Makes multiple edits to a single file in one operation.",
        {
            "file_path": _s("The absolute path to the file to modify"),
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"old_string": _s("The text to replace"), "new_string": _s("The text to replace it with"),
                                   "replace_all": {"type": "boolean", "default": False, "description": "Replace all occurences of old_string (default false)."}},
                    "required": ["old_string", "new_string"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "description": "Array of edit operations to perform sequentially on the file",
            },
        },
        ["file_path", "edits"],
    ),
    _tool("Write", "Writes a file to the local filesystem.", {"file_path": _s("The absolute path to the file to write (must be absolute, not relative)"), "content": _s("The content to write to the file")}, ["file_path", "content"]),
    _tool(
        "NotebookEdit",
        "Completely replaces the contents of a specific cell in a Jupyter notebook (.ipynb file) with new source.",
        {"notebook_path": _s("The absolute path to the Jupyter notebook file to edit"), "cell_id": _s("The ID of the cell to edit."),
         "new_source": _s("The new source for the cell"), "cell_type": {"type": "string", "enum": ["code", "markdown"], "description": "The type of the cell (code or markdown)."},
         "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"], "description": "The type of edit to make (replace, insert, delete). Defaults to replace."}},
        ["notebook_path", "new_source"],
    ),
    _tool("WebFetch", "Fetches content from a specified URL and processes it using an AI model", {"url": _s("The URL to fetch content from", format="uri"), "prompt": _s("The prompt to run on the fetched content")}, ["url", "prompt"]),
    _tool(
        "TodoWrite",
        "Use this tool to create and manage a structured task list for your current coding session.",
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"content": {"type": "string", "minLength": 1}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                                   "activeForm": {"type": "string", "minLength": 1}},
                    "required": ["content", "status", "activeForm"],
                    "additionalProperties": False,
                },
                "description": "The updated todo list",
            }
        },
        ["todos"],
    ),
    _tool(
        "WebSearch",
        "Allows Claude to search the web and use the results to inform responses.",
        {"query": {"type": "string", "minLength": 2, "description": "The search query to use"},
         "allowed_domains": {"type": "array", "items": S, "description": "Only include search results from these domains"},
         "blocked_domains": {"type": "array", "items": S, "description": "Never include search results from these domains"}},
        ["query"],
    ),
    _tool("BashOutput", "Retrieves output from a running or completed background bash shell", {"bash_id": _s("The ID of the background shell to retrieve output from"), "filter": _s("Optional regular expression to filter the output lines.")}, ["bash_id"]),
    _tool("KillShell", "Kills a running background bash shell by its ID", {"shell_id": _s("The ID of the background shell to kill")}, ["shell_id"]),
    _tool("SlashCommand", "Execute a slash command within the main conversation", {"command": _s('The slash command to execute with its arguments, e.g., "/review-pr 123"')}, ["command"]),
]

CLAUDE_CODE_CALLS = [
    ("Task", {"description": "Find auth handlers", "prompt": "Search the codebase for every place that checks a session token and report file:line.", "subagent_type": "general-purpose"}),
    ("Bash", {"command": 'cd "/home/me/My Project" && git status --short', "description": "Show working tree status"}),
    ("Bash", {"command": "pytest -x -q tests/", "timeout": 120000, "run_in_background": True}),
    ("Glob", {"pattern": "src/**/*.{ts,tsx}"}),
    ("Grep", {"pattern": "def \\w+\\(self", "path": "scheduler", "glob": "*.py", "output_mode": "content", "-C": 2, "-n": True, "head_limit": 50}),
    ("ExitPlanMode", {"plan": "1. Add the test\n2. Fix `parse()`\n3. Run **ruff**"}),
    ("Read", {"file_path": "/repo/api/responses.py", "offset": 340, "limit": 60}),
    ("Edit", {"file_path": "/repo/a.py", "old_string": 'print("hi")\n', "new_string": 'print("hé — \\u00e9")\n', "replace_all": False}),
    ("MultiEdit", {"file_path": "/repo/b.py", "edits": [{"old_string": "x = 1", "new_string": "x = 2"}, {"old_string": "foo", "new_string": "bar", "replace_all": True}]}),
    ("Write", {"file_path": "/repo/README.md", "content": "# Title\n\nSome \"quoted\" text, a tab\there, and <function=x> </tool_call> in prose.\n"}),
    ("NotebookEdit", {"notebook_path": "/repo/n.ipynb", "cell_id": "abc123", "new_source": "import numpy as np", "cell_type": "code", "edit_mode": "insert"}),
    ("WebFetch", {"url": "https://docs.python.org/3/library/json.html", "prompt": "What does json.dumps do with NaN?"}),
    ("TodoWrite", {"todos": [{"content": "Write the failing test", "status": "completed", "activeForm": "Writing the failing test"},
                             {"content": "Fix the parser", "status": "in_progress", "activeForm": "Fixing the parser"},
                             {"content": "Update docs", "status": "pending", "activeForm": "Updating docs"}]}),
    ("WebSearch", {"query": "llguidance lark grammar", "allowed_domains": ["github.com"]}),
    ("BashOutput", {"bash_id": "bash_1"}),
    ("KillShell", {"shell_id": "bash_1"}),
    ("SlashCommand", {"command": "/review-pr 123"}),
]

CLAUDE_CODE_INVALID = [
    ("TodoWrite", {"todos": [{"content": "x", "status": "doing", "activeForm": "x"}]}),  # not one of the enum
    ("TodoWrite", {"todos": [{"content": "x", "status": "pending"}]}),  # activeForm missing
    ("TodoWrite", {"todos": [{"content": "", "status": "pending", "activeForm": "x"}]}),  # under minLength
    ("Edit", {"file_path": "/a", "old_string": "x"}),  # new_string missing
    ("Bash", {"command": "ls", "timeout": "60s"}),  # not a number
    ("Grep", {"pattern": "x", "output_mode": "lines"}),  # not one of the enum
    ("MultiEdit", {"file_path": "/a", "edits": []}),  # under minItems
    ("Read", {"file_path": "/a", "encoding": "utf-8"}),  # no such property
]

# -- OpenAI Codex -----------------------------------------------------------------------------

CODEX = [
    {
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": S, "description": "The command to execute"},
                "workdir": _s("The working directory to execute the command in"),
                "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds"},
                "with_escalated_permissions": {"type": "boolean", "description": "Whether to request escalated permissions. Set to true if command needs to be run without sandbox restrictions"},
                "justification": _s("Only set if with_escalated_permissions is true. 1-sentence explanation of why we want to run this command."),
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    # a custom (freeform) tool as api/responses_api.py serves it: a function of one string
    {
        "name": "apply_patch",
        "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
        "parameters": {"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input, as free text."}}, "required": ["input"], "additionalProperties": False},
    },
    {
        "name": "update_plan",
        "description": "Updates the task plan.\nProvide an optional explanation and a list of plan items, each with a step and status.\nAt most one step can be in_progress at a time.",
        "parameters": {
            "type": "object",
            "properties": {
                "explanation": S,
                "plan": {
                    "type": "array",
                    "description": "The list of steps",
                    "items": {"type": "object", "properties": {"step": S, "status": {"type": "string", "description": "One of: pending, in_progress, completed"}},
                              "required": ["step", "status"], "additionalProperties": False},
                },
            },
            "required": ["plan"],
            "additionalProperties": False,
        },
    },
    {"name": "view_image", "description": "Attach a local image (by filesystem path) to the conversation context for this turn.",
     "parameters": {"type": "object", "properties": {"path": _s("Local filesystem path to an image file")}, "required": ["path"], "additionalProperties": False}},
    {
        "name": "exec_command",
        "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        "parameters": {"type": "object", "properties": {"cmd": S, "workdir": S, "yield_time_ms": N, "max_output_tokens": N, "shell": S, "login": B}, "required": ["cmd"], "additionalProperties": False},
    },
    {"name": "write_stdin", "description": "Writes characters to an existing unified exec session and returns recent output.",
     "parameters": {"type": "object", "properties": {"session_id": N, "chars": S, "yield_time_ms": N}, "required": ["session_id"], "additionalProperties": False}},
]

PATCH = "*** Begin Patch\n*** Update File: src/app.py\n@@ def main():\n-    print(\"hi\")\n+    print(\"hello\")\n*** End Patch\n"
CODEX_CALLS = [
    ("shell", {"command": ["bash", "-lc", "rg -n 'TODO' src | head -20"], "workdir": "/repo", "timeout_ms": 10000}),
    ("shell", {"command": ["git", "diff", "--stat"]}),
    ("apply_patch", {"input": PATCH}),
    ("update_plan", {"explanation": "Two steps left.", "plan": [{"step": "Reproduce the bug", "status": "completed"}, {"step": "Fix it", "status": "in_progress"}]}),
    ("view_image", {"path": "/tmp/screenshot.png"}),
    ("exec_command", {"cmd": "python -m http.server", "yield_time_ms": 1000}),
    ("write_stdin", {"session_id": 3, "chars": "q\n"}),
]

CODEX_INVALID = [
    ("shell", {"command": "ls -la"}),  # a string, not an array of strings
    ("shell", {"command": ["ls", 3]}),  # an item not a string
    ("update_plan", {"plan": [{"step": "x"}]}),  # status missing
    ("apply_patch", {"patch": PATCH}),  # no such property
    ("write_stdin", {"chars": "q"}),  # session_id missing
]

# -- MCP: the filesystem server (zod schemas through zod-to-json-schema) ------------------------


def _fs(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return _tool(name, description, properties, required)


FILESYSTEM = [
    _fs("read_text_file", "Read the complete contents of a file from the file system as text. Use the 'head' parameter to read only the first N lines.",
        {"path": S, "tail": {"type": "number", "description": "If provided, returns only the last N lines of the file"},
         "head": {"type": "number", "description": "If provided, returns only the first N lines of the file"}}, ["path"]),
    _fs("read_multiple_files", "Read the contents of multiple files simultaneously.", {"paths": {"type": "array", "items": S}}, ["paths"]),
    _fs("write_file", "Create a new file or completely overwrite an existing file with new content.", {"path": S, "content": S}, ["path", "content"]),
    _fs("edit_file", "Make line-based edits to a text file. Returns a git-style diff showing the changes made.",
        {"path": S,
         "edits": {"type": "array", "items": {"type": "object", "properties": {"oldText": _s("Text to search for - must match exactly"), "newText": _s("Text to replace with")},
                                               "required": ["oldText", "newText"], "additionalProperties": False}},
         "dryRun": {"type": "boolean", "default": False, "description": "Preview changes using git-style diff format"}},
        ["path", "edits"]),
    _fs("create_directory", "Create a new directory or ensure a directory exists.", {"path": S}, ["path"]),
    _fs("list_directory_with_sizes", "Get a detailed listing of all files and directories in a specified path, including sizes.",
        {"path": S, "sortBy": {"type": "string", "enum": ["name", "size"], "default": "name", "description": "Sort entries by name or size"}}, ["path"]),
    _fs("directory_tree", "Get a recursive tree view of files and directories as a JSON structure.",
        {"path": S, "excludePatterns": {"type": "array", "items": S, "default": []}}, ["path"]),
    _fs("move_file", "Move or rename files and directories.", {"source": S, "destination": S}, ["source", "destination"]),
    _fs("search_files", "Recursively search for files and directories matching a pattern.",
        {"path": S, "pattern": S, "excludePatterns": {"type": "array", "items": S, "default": []}}, ["path", "pattern"]),
    _fs("get_file_info", "Retrieve detailed metadata about a file or directory.", {"path": S}, ["path"]),
    _fs("list_allowed_directories", "Returns the list of directories that this server is allowed to access.", {}, []),
]

FILESYSTEM_CALLS = [
    ("read_text_file", {"path": "/data/notes.txt", "head": 20}),
    ("read_multiple_files", {"paths": ["/data/a.txt", "/data/b.txt"]}),
    ("write_file", {"path": "/data/out.json", "content": '{"ok": true}\n'}),
    ("edit_file", {"path": "/data/a.txt", "edits": [{"oldText": "foo", "newText": "bar"}], "dryRun": True}),
    ("create_directory", {"path": "/data/new"}),
    ("list_directory_with_sizes", {"path": "/data", "sortBy": "size"}),
    ("directory_tree", {"path": "/data"}),
    ("move_file", {"source": "/data/a.txt", "destination": "/data/archive/a.txt"}),
    ("search_files", {"path": "/data", "pattern": "*.md", "excludePatterns": ["node_modules"]}),
    ("get_file_info", {"path": "/data/a.txt"}),
    ("list_allowed_directories", {}),
]

FILESYSTEM_INVALID = [
    ("list_directory_with_sizes", {"path": "/data", "sortBy": "date"}),
    ("edit_file", {"path": "/a", "edits": [{"oldText": "x"}]}),
    ("read_multiple_files", {"paths": "/a"}),
    ("list_allowed_directories", {"path": "/"}),
]

# -- MCP: GitHub's server -----------------------------------------------------------------------

OWNER = _s("Repository owner (username or organization)")
REPO = _s("Repository name")
PAGE = {"type": "number", "minimum": 1, "description": "Page number for pagination (min 1)"}
PER_PAGE = {"type": "number", "minimum": 1, "maximum": 100, "description": "Results per page for pagination (min 1, max 100)"}

GITHUB = [
    _tool("create_issue", "Create a new issue in a GitHub repository.",
          {"owner": OWNER, "repo": REPO, "title": _s("Issue title"), "body": _s("Issue body content"),
           "assignees": {"type": "array", "items": S, "description": "Usernames to assign to this issue"},
           "labels": {"type": "array", "items": S, "description": "Labels to apply to this issue"},
           "milestone": {"type": "number", "description": "Milestone number"}},
          ["owner", "repo", "title"]),
    _tool("list_issues", "List issues in a GitHub repository.",
          {"owner": OWNER, "repo": REPO, "state": {"type": "string", "enum": ["OPEN", "CLOSED"], "description": "Filter by state"},
           "labels": {"type": "array", "items": S}, "orderBy": {"type": "string", "enum": ["CREATED_AT", "UPDATED_AT", "COMMENTS"]},
           "direction": {"type": "string", "enum": ["ASC", "DESC"]}, "since": _s("Filter by date (ISO 8601 timestamp)", format="date-time"),
           "page": PAGE, "perPage": PER_PAGE},
          ["owner", "repo"]),
    _tool("create_pull_request", "Create a new pull request in a GitHub repository.",
          {"owner": OWNER, "repo": REPO, "title": _s("PR title"), "body": _s("PR description"), "head": _s("Branch containing changes"),
           "base": _s("Branch to merge into"), "draft": _s("Create as draft PR", type="boolean"), "maintainer_can_modify": {"type": "boolean"}},
          ["owner", "repo", "title", "head", "base"]),
    _tool("create_or_update_file", "Create or update a single file in a GitHub repository.",
          {"owner": OWNER, "repo": REPO, "path": _s("Path where to create/update the file"), "content": _s("Content of the file"),
           "message": _s("Commit message"), "branch": _s("Branch to create/update the file in"),
           "sha": _s("Required if updating an existing file. The blob SHA of the file being replaced.", pattern="^[0-9a-f]{40}$")},
          ["owner", "repo", "path", "content", "message", "branch"]),
    _tool("push_files", "Push multiple files to a GitHub repository in a single commit",
          {"owner": OWNER, "repo": REPO, "branch": S,
           "files": {"type": "array", "items": {"type": "object", "properties": {"path": S, "content": S}, "required": ["path", "content"], "additionalProperties": False},
                     "description": "Array of file objects to push, each object with path (string) and content (string)"},
           "message": S},
          ["owner", "repo", "branch", "files", "message"]),
    _tool("search_code", "Fast and precise code search across ALL GitHub repositories using GitHub's native search engine.",
          {"query": _s("Search query using GitHub's powerful code search syntax. Examples: 'content:Skill language:Java org:github'"),
           "sort": _s("Sort field ('indexed' only)"), "order": {"type": "string", "enum": ["asc", "desc"]}, "page": PAGE, "perPage": PER_PAGE},
          ["query"]),
    _tool("add_issue_comment", "Add a comment to a specific issue in a GitHub repository.",
          {"owner": OWNER, "repo": REPO, "issue_number": {"type": "number"}, "body": _s("Comment content")}, ["owner", "repo", "issue_number", "body"]),
    _tool("create_pull_request_review", "Create a review on a pull request",
          {"owner": OWNER, "repo": REPO, "pull_number": N, "body": S, "event": {"type": "string", "enum": ["APPROVE", "REQUEST_CHANGES", "COMMENT"]},
           "commit_id": {"type": ["string", "null"]},
           "comments": {"type": "array", "items": {"anyOf": [
               {"type": "object", "properties": {"path": S, "position": N, "body": S}, "required": ["path", "position", "body"], "additionalProperties": False},
               {"type": "object", "properties": {"path": S, "line": N, "body": S}, "required": ["path", "line", "body"], "additionalProperties": False},
           ]}}},
          ["owner", "repo", "pull_number", "event"]),
]

GITHUB_CALLS = [
    ("create_issue", {"owner": "octo-org", "repo": "hello", "title": "Crash on \"empty\" input", "body": "Steps:\n1. run `x`\n2. 💥", "labels": ["bug"], "milestone": 3}),
    ("list_issues", {"owner": "octo-org", "repo": "hello", "state": "OPEN", "since": "2025-01-31T12:00:00Z", "page": 1, "perPage": 50}),
    ("create_pull_request", {"owner": "octo-org", "repo": "hello", "title": "Fix crash", "head": "fix-crash", "base": "main", "draft": True}),
    ("create_or_update_file", {"owner": "o", "repo": "r", "path": "docs/a.md", "content": "# A\n", "message": "Add a", "branch": "main", "sha": "0123456789abcdef0123456789abcdef01234567"}),
    ("push_files", {"owner": "o", "repo": "r", "branch": "main", "files": [{"path": "a.txt", "content": "a"}, {"path": "b/c.txt", "content": "c\n"}], "message": "Add files"}),
    ("search_code", {"query": "content:Skill language:Java org:github", "order": "desc", "perPage": 10}),
    ("add_issue_comment", {"owner": "o", "repo": "r", "issue_number": 42, "body": "Thanks! 🎉"}),
    ("create_pull_request_review", {"owner": "o", "repo": "r", "pull_number": 7, "event": "REQUEST_CHANGES", "commit_id": None,
                                    "comments": [{"path": "a.py", "line": 3, "body": "nit"}, {"path": "b.py", "position": 1, "body": "why?"}]}),
]

GITHUB_INVALID = [
    ("list_issues", {"owner": "o", "repo": "r", "state": "open"}),  # the enum is upper case
    ("create_or_update_file", {"owner": "o", "repo": "r", "path": "a", "content": "", "message": "m", "branch": "b", "sha": "xyz"}),  # pattern
    ("create_pull_request", {"owner": "o", "repo": "r", "title": "t", "head": "h"}),  # base missing
    ("create_pull_request_review", {"owner": "o", "repo": "r", "pull_number": 7, "event": "COMMENT", "comments": [{"path": "a", "body": "b"}]}),  # neither branch
]

# -- a generic MCP server: $defs/$ref, format, pattern, anyOf/oneOf, nullable types ---------------

CALENDAR = [
    {
        "name": "create_event",
        "description": "Create a calendar event.\n\nTimes are RFC 3339 (\"2025-03-01T09:00:00+01:00\"). Überprüfen Sie die Zeitzone — 時間帯.",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "Attendee": {"type": "object", "properties": {"email": {"type": "string", "format": "email"}, "optional": {"type": "boolean", "default": False}},
                             "required": ["email"], "additionalProperties": False},
                "Reminder": {"oneOf": [
                    {"type": "object", "properties": {"method": {"const": "email"}, "minutes": {"type": "integer", "minimum": 0, "maximum": 40320}}, "required": ["method", "minutes"], "additionalProperties": False},
                    {"type": "object", "properties": {"method": {"const": "popup"}, "minutes": {"type": "integer", "minimum": 0}}, "required": ["method", "minutes"], "additionalProperties": False},
                ]},
            },
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 200, "examples": ["Team sync"]},
                "start": {"type": "string", "format": "date-time"},
                "end": {"type": "string", "format": "date-time"},
                "attendees": {"type": "array", "items": {"$ref": "#/$defs/Attendee"}, "minItems": 1},
                "location": {"type": ["string", "null"], "default": None},
                "color": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$", "description": "Hex colour like \"#1a2b3c\""},
                "reminders": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Reminder"}, "maxItems": 5}, {"type": "null"}]},
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Free-form key/value labels"},
                "visibility": {"enum": ["default", "public", "private"], "default": "default"},
                "calendar_url": {"type": "string", "format": "uri"},
            },
            "required": ["title", "start", "end"],
            "additionalProperties": False,
        },
    },
    {
        "name": "find_free_time",
        "description": "Find free slots. 'duration' is in minutes.",
        "parameters": {
            "type": "object",
            "properties": {
                "calendars": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 1, "maxItems": 10},
                "duration": {"type": "integer", "exclusiveMinimum": 0, "multipleOf": 15},
                "window": {"type": "object", "properties": {"from": {"type": "string", "format": "date"}, "to": {"type": "string", "format": "date"}}, "required": ["from", "to"]},
                "timezone": {"type": "string", "default": "UTC", "examples": ["Europe/Paris", "America/New_York"]},
            },
            "required": ["calendars", "duration"],
        },
    },
]

CALENDAR_CALLS = [
    ("create_event", {"title": "Team sync", "start": "2025-03-01T09:00:00+01:00", "end": "2025-03-01T09:30:00+01:00",
                      "attendees": [{"email": "ann@example.com"}, {"email": "bob@example.org", "optional": True}],
                      "location": None, "color": "#1a2B3c", "reminders": [{"method": "popup", "minutes": 10}, {"method": "email", "minutes": 1440}],
                      "metadata": {"team": "infra", "note": "weekly — 毎週"}, "visibility": "private", "calendar_url": "https://cal.example.com/c/1"}),
    ("create_event", {"title": "1:1", "start": "2025-03-02T10:00:00Z", "end": "2025-03-02T10:30:00Z", "reminders": None}),
    ("find_free_time", {"calendars": ["primary", "team@example.com"], "duration": 30, "window": {"from": "2025-03-01", "to": "2025-03-07"}, "timezone": "Europe/Paris"}),
]

CALENDAR_INVALID = [
    ("create_event", {"title": "", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:00:00Z"}),  # under minLength
    ("create_event", {"title": "x", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:00:00Z", "color": "red"}),  # pattern
    ("create_event", {"title": "x", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:00:00Z", "attendees": []}),  # minItems
    ("create_event", {"title": "x", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:00:00Z", "reminders": [{"method": "sms", "minutes": 5}]}),  # neither branch
    ("create_event", {"title": "x", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:00:00Z", "metadata": {"k": 1}}),  # not a string value
    ("find_free_time", {"calendars": ["a"], "duration": 0}),  # exclusiveMinimum
]

# -- pydantic (made by pydantic itself) -------------------------------------------------------------


class Priority(StrEnum):
    low = "low"
    high = "high"


class Label(BaseModel):
    name: str = Field(description='A label\'s "name"')
    color: str | None = None


class ByPath(BaseModel):
    kind: Literal["path"]
    path: str


class ByGlob(BaseModel):
    kind: Literal["glob"]
    glob: str
    max_matches: int = Field(default=100, ge=1, le=1000)


class TicketArgs(BaseModel):
    """Open a ticket."""

    title: str = Field(min_length=3, description="One line.\nNo trailing period.")
    priority: Priority = Priority.low
    labels: list[Label] = Field(default_factory=list)
    parent: Label | None = None
    target: Annotated[ByPath | ByGlob, Field(discriminator="kind")]
    estimate_hours: float | None = Field(default=None, gt=0)
    budget: Decimal | None = None  # a number, or a string of a pattern with a lookahead


class Point(BaseModel):
    x: float
    y: float


class ShapeArgs(BaseModel):
    origin: Point
    points: list[Point] = Field(min_length=2)


PYDANTIC = [
    {"name": "open_ticket", "description": "Open a ticket.", "parameters": TicketArgs.model_json_schema()},
    {"name": "draw_shape", "description": "Draw a polyline.", "parameters": ShapeArgs.model_json_schema()},
    # older pydantic (and FastAPI) wrote a described reference as an allOf of one $ref
    {
        "name": "set_priority",
        "description": "Set a ticket's priority.",
        "parameters": {
            "$defs": {"Priority": {"enum": ["low", "high"], "title": "Priority", "type": "string"}},
            "properties": {"ticket": {"title": "Ticket", "type": "integer"}, "priority": {"allOf": [{"$ref": "#/$defs/Priority"}], "default": "low", "description": "The new priority"}},
            "required": ["ticket"],
            "title": "SetPriorityArgs",
            "type": "object",
        },
    },
]

PYDANTIC_CALLS = [
    ("open_ticket", {"title": "Crash on start", "priority": "high", "labels": [{"name": "bug", "color": "red"}, {"name": "p1", "color": None}],
                     "parent": None, "target": {"kind": "glob", "glob": "src/**/*.py", "max_matches": 10}, "estimate_hours": 1.5, "budget": "1250.00"}),
    ("open_ticket", {"title": "Typo", "target": {"kind": "path", "path": "README.md"}, "budget": 99.5}),
    ("draw_shape", {"origin": {"x": 0, "y": 0}, "points": [{"x": 1.5, "y": -2}, {"x": 3, "y": 4e2}]}),
    ("set_priority", {"ticket": 12, "priority": "high"}),
]

PYDANTIC_INVALID = [
    ("open_ticket", {"title": "Crash", "priority": "urgent", "target": {"kind": "path", "path": "a"}}),  # enum
    ("open_ticket", {"title": "Crash", "target": {"kind": "glob", "path": "a"}}),  # the branch's own property missing
    ("open_ticket", {"title": "Crash"}),  # target missing
    ("open_ticket", {"title": "Crash", "target": {"kind": "path", "path": "a"}, "budget": "+."}),  # no digit
    ("draw_shape", {"origin": {"x": 0, "y": 0}, "points": [{"x": 1, "y": 1}]}),  # min_length
    ("set_priority", {"ticket": "12"}),  # not an integer
]

# -- zod (zod-to-json-schema output) ----------------------------------------------------------------

ZOD = [
    {
        "name": "schedule_job",
        "description": "Schedule a job.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "slug": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$"},  # a non-capturing group
                "retries": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10},  # z.number().int().positive().max(10)
                "delay_s": {"type": "number", "minimum": 0, "exclusiveMinimum": True},  # openApi3 target: draft-04's boolean form
                "cron": {"type": "string", "pattern": "^(\\S+\\s){4}\\S+$"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},  # z.record(z.string())
                "notify": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},  # .nullable()
                "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                "mode": {"type": "string", "enum": ["once", "repeat"], "default": "once"},
            },
            "required": ["name", "retries"],
            "additionalProperties": False,
            "$schema": DRAFT_07,
        },
    },
    {
        "name": "query_logs",
        "description": "Query logs between two instants.",
        "parameters": {
            "type": "object",
            "properties": {
                "filter": {"type": ["string", "null"], "description": "LogQL filter, e.g. {app=\"api\"} |= \"error\""},
                "from": {"type": "string", "format": "date-time"},
                "limit": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5000, "default": 100},
                "level": {"type": "array", "items": {"type": "string", "enum": ["debug", "info", "warn", "error"]}, "minItems": 1},
            },
            "required": ["from"],
            "additionalProperties": False,
            "$schema": DRAFT_07,
        },
    },
]

ZOD_CALLS = [
    ("schedule_job", {"name": "Nightly backup", "slug": "nightly-backup", "retries": 3, "delay_s": 0.5, "cron": "0 3 * * *", "env": {"BUCKET": "s3://b"}, "notify": None, "tags": ["ops"], "mode": "repeat"}),
    ("schedule_job", {"name": "once", "retries": 1, "notify": "ops@example.com"}),
    ("query_logs", {"filter": '{app="api"} |= "error"', "from": "2025-01-01T00:00:00Z", "limit": 250, "level": ["warn", "error"]}),
    ("query_logs", {"filter": None, "from": "2025-01-01T00:00:00.123+02:00"}),
]

ZOD_INVALID = [
    ("schedule_job", {"name": "x", "retries": 0}),  # exclusiveMinimum 0
    ("schedule_job", {"name": "x", "retries": 11}),  # maximum
    ("schedule_job", {"name": "x", "slug": "Nightly--x", "retries": 1}),  # pattern
    ("schedule_job", {"name": "x", "retries": 1, "mode": "daily"}),  # enum
    ("schedule_job", {"name": "x", "retries": 1, "env": {"A": 1}}),  # a record of strings
    ("query_logs", {"from": "2025-01-01T00:00:00Z", "level": []}),  # minItems
    ("query_logs", {"filter": "x"}),  # from missing
]

# -- the sets, as an agent sends them ------------------------------------------------------------

SETS: dict[str, tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]] = {
    "claude_code": (CLAUDE_CODE, CLAUDE_CODE_CALLS, CLAUDE_CODE_INVALID),
    "codex": (CODEX, CODEX_CALLS, CODEX_INVALID),
    "mcp_filesystem": (FILESYSTEM, FILESYSTEM_CALLS, FILESYSTEM_INVALID),
    "mcp_github": (GITHUB, GITHUB_CALLS, GITHUB_INVALID),
    "mcp_calendar": (CALENDAR, CALENDAR_CALLS, CALENDAR_INVALID),
    "pydantic": (PYDANTIC, PYDANTIC_CALLS, PYDANTIC_INVALID),
    "zod": (ZOD, ZOD_CALLS, ZOD_INVALID),
}
# an agent with its own tools and three MCP servers' at once: 50-odd tools
SETS["agent_with_mcp"] = tuple(sum((list(SETS[k][i]) for k in ("claude_code", "mcp_filesystem", "mcp_github", "mcp_calendar")), []) for i in range(3))  # type: ignore[assignment]
