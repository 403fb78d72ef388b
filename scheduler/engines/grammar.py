"""Constraints as GBNF grammars: ``response_format`` (JSON, a JSON Schema, a raw grammar) and
tool calls, for llama.cpp's grammar sampler.

JSON Schema to GBNF is llama-cpp-python's own converter (``llama_cpp.llama_grammar``, the port of
llama.cpp's ``json_schema_to_grammar``), imported only when a schema is converted. Tool calls are
written in the generic format of :mod:`scheduler.engines.chat`::

    <tool_call>
    {"name": "get_weather", "arguments": {...}}
    </tool_call>

or, for a model that writes Qwen3-Coder's format, in that one where it can hold the tools'
parameters to their schemas (``_xml_tool_grammar``).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import json
import math
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

# JSON with at most one space between tokens: llama.cpp's json.gbnf allows runs of newlines and
# indentation, which a small model can fill until max_tokens without ever closing the object.
JSON_OBJECT_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
ws     ::= " "?
"""

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
MAX_PARALLEL_CALLS = 4


class GrammarError(ValueError):
    """A schema or grammar that cannot be turned into a constraint: the request's fault."""


# What a grammar may be, checked before llama.cpp (or llguidance) sees it. llama.cpp's GBNF parser
# recurses once per nested group with no limit of its own: ~20,000 nested "(" crash the worker
# (SIGSEGV, measured on 0.3.36), and a crashed worker is restarted and handed the same request.
# x{m,n} copies x m times and adds n - m rules; a schema's minLength 30,000,000 made a 150 MB
# grammar. The tool grammar for 40 tools is 109 KB.
MAX_GRAMMAR_CHARS = 1 << 20
MAX_GRAMMAR_DEPTH = 1000
MAX_GRAMMAR_REPEAT = 10_000
# x{m,n} copies x's elements max(m, n) times (llama.cpp's parser writes each copy out; a group or
# a rule name is one element, a literal one per character): "<60,000 chars>"{2000} took 6.7 s and
# 2.1 GB to parse, and the worker parses a grammar twice; one of 1 MiB would need ~16 GB. The
# repetitions' copies in all, counted before llama.cpp parses, are bounded (a schema's maxLength
# 10,000 is 10,000: its item is a rule name).
MAX_GRAMMAR_EXPANSION = 1 << 21
# a literal, a character class, a comment (each skipped whole), or what this check counts
_GBNF_SCAN = re.compile(r'"(?:\\.|[^"\\])*"?|\[(?:\\.|[^\]\\])*\]?|#[^\n]*|[()]|\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}')


def check_bounds(grammar: str) -> None:
    """GrammarError unless ``grammar`` (GBNF) is at most MAX_GRAMMAR_CHARS long, nests groups
    at most MAX_GRAMMAR_DEPTH deep, repeats (``{m,n}``) at most MAX_GRAMMAR_REPEAT times and
    its repetitions copy at most MAX_GRAMMAR_EXPANSION elements in all."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is {len(grammar):,} characters long; at most {MAX_GRAMMAR_CHARS:,} are allowed")
    depth = expansion = 0
    previous: re.Match[str] | None = None
    for m in _GBNF_SCAN.finditer(grammar):
        token = m.group()
        item, previous = previous, m
        if token == "(":
            depth += 1
            if depth > MAX_GRAMMAR_DEPTH:
                raise GrammarError(f"the grammar nests groups more than {MAX_GRAMMAR_DEPTH} deep")
        elif token == ")":
            depth -= 1
        elif token.startswith("{"):
            counts = [g for g in m.groups() if g]
            if any(len(g) > 6 or int(g) > MAX_GRAMMAR_REPEAT for g in counts):
                raise GrammarError(f"the grammar repeats an item more than {MAX_GRAMMAR_REPEAT:,} times (a length, item count or pattern bound)")
            if m.group(2) and int(m.group(2)) < int(m.group(1)):
                # llama.cpp's parser takes max - min copies as a count: below 0 it allocated
                # until the worker was killed
                raise GrammarError(f"the grammar repeats an item at least {int(m.group(1))} and at most {int(m.group(2))} times")
            # the item repeated: the literal or class right before (its length bounds its
            # elements), else a group or a rule name (one element)
            adjacent = item is not None and item.group()[:1] in ('"', "[") and not grammar[item.end() : m.start()].strip()
            size = len(item.group()) if adjacent and item is not None else 1
            expansion += size * max(int(g) for g in counts)
            if expansion > MAX_GRAMMAR_EXPANSION:
                raise GrammarError(
                    f"the grammar's repetitions ({{m,n}}) expand to more than {MAX_GRAMMAR_EXPANSION:,} elements (a long literal repeated many times)"
                )
    _StackCounter(grammar).check()


# llama.cpp keeps every way the grammar can go on as a stack, and expands a rule reference at a
# stack's top into one stack per way the rule can start; an optional or otherwise nullable element
# lets the expansion reach past it into what follows. A chain of rules that each start with two
# optional references to the next ("r0 ::= r1? r1?", ...) multiplies the ways by about 2 a rule:
# 900 such rules (20 KB) hung the worker in llama.cpp's grammar set-up for good, every other
# request with it. The ways each rule, group and sequence suffix can start are counted before
# llama.cpp sees the grammar, and bounded (a tool grammar for 600 tools counts ~600).
MAX_GRAMMAR_STACKS = 100_000
_GBNF_TOKEN = re.compile(
    r'\s+|#[^\n]*|"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|::=|[A-Za-z0-9_-]+|\{\s*\d*\s*(?:,\s*\d*\s*)?\}|[()|?*+.]|.'
)
_CAP = MAX_GRAMMAR_STACKS + 1  # counts are kept at most this: only "too many" matters
_NAME = re.compile(r"[A-Za-z0-9_-]+")


class _StackCounter:
    """Counts, for each element, (a, b): the stacks it starts when it is at a stack's top, ``a``
    of them ending in one of its terminals and ``b`` of them past its end (it is nullable), each
    of which goes on into what follows it. A sequence folds its elements' counts from the right
    (every suffix is where a stack may stand); a rule sums its alternatives'. Groups become rules
    of their own, and rules are counted after the rules they name, without recursion (a chain of
    thousands of rules is a chain of thousands of steps)."""

    def __init__(self, grammar: str) -> None:
        tokens = [t for t in _GBNF_TOKEN.findall(grammar) if t.strip() and not t.startswith("#")]
        self.rules: dict[str, list[str]] = {}
        starts = [i for i in range(len(tokens) - 1) if tokens[i + 1] == "::=" and _NAME.fullmatch(tokens[i])]
        for n, i in enumerate(starts):
            open_groups: list[list[str]] = [[]]
            for token in tokens[i + 2 : starts[n + 1] if n + 1 < len(starts) else len(tokens)]:
                if token == "(":
                    open_groups.append([])
                elif token == ")" and len(open_groups) > 1:
                    self._group(open_groups)
                else:
                    open_groups[-1].append(token)
            while len(open_groups) > 1:  # unclosed: llama.cpp's parser refuses it
                self._group(open_groups)
            self.rules[tokens[i]] = open_groups[0]
        self.worst = 0

    def _group(self, open_groups: list[list[str]]) -> None:
        name = f"({len(self.rules)})"  # no GBNF name has parentheses
        self.rules[name] = open_groups.pop()
        open_groups[-1].append(name)

    def check(self) -> None:
        memo: dict[str, tuple[int, int]] = {}
        for first in self.rules:
            stack, on_path = [first], set()
            while stack:
                name = stack[-1]
                if name in memo:
                    stack.pop()
                elif name not in on_path:
                    on_path.add(name)
                    stack += [t for t in self.rules[name] if t in self.rules and t not in memo and t not in on_path]
                else:  # what it names is counted, or is on the path (recursion: llama.cpp refuses it at a start)
                    memo[name] = self._count(self.rules[name], memo)
                    on_path.discard(name)
                    stack.pop()
        if self.worst > MAX_GRAMMAR_STACKS:
            raise GrammarError(
                f"the grammar can start in more than {MAX_GRAMMAR_STACKS:,} ways at one point (optional or empty rules chained at the start of others)"
            )

    def _count(self, tokens: list[str], memo: dict[str, tuple[int, int]]) -> tuple[int, int]:
        total_a = total_b = 0
        elements: list[tuple[int, int]] = []
        for token in [*tokens, "|"]:
            if token == "|":
                a, b = 0, 1
                for ea, eb in reversed(elements):
                    a, b = min(_CAP, ea + eb * a), min(_CAP, eb * b)
                    self.worst = max(self.worst, a + b)
                total_a, total_b, elements = min(_CAP, total_a + a), min(_CAP, total_b + b), []
            elif token in ("?", "*", "+") or token.startswith("{"):
                if elements:
                    elements[-1] = self._repeated(elements[-1], token)
            elif token.startswith('"'):
                elements.append((0, 1) if token == '""' else (1, 0))
            elif token.startswith("[") or token == ".":
                elements.append((1, 0))
            elif token in self.rules:
                elements.append(memo.get(token, (1, 0)))
            elif _NAME.fullmatch(token):
                elements.append((1, 0))  # undefined: llama.cpp's parser refuses it
        self.worst = max(self.worst, total_a, total_b)
        return total_a, total_b

    @staticmethod
    def _repeated(value: tuple[int, int], op: str) -> tuple[int, int]:
        a, b = value
        if op == "?":
            return a, min(_CAP, b + 1)
        star = (a, 1) if b == 0 else (_CAP, _CAP)  # x* ::= x x* | (empty); a nullable x: left recursion
        if op in ("*", "+"):
            return star
        bounds = [int(g) if g.strip() else None for g in op.strip("{}").split(",")]
        low = min(bounds[0] or 0, MAX_GRAMMAR_REPEAT)
        high = bounds[-1] if len(bounds) > 1 else low
        tail = star if high is None else (0, 1)
        for _ in range(0 if high is None else max(0, min(high, MAX_GRAMMAR_REPEAT) - low)):  # (x (x ...)?)?
            step = (min(_CAP, a + b * tail[0]), min(_CAP, b * tail[1] + 1))
            if step == tail:
                break  # a fixed point: more copies count the same
            tail = step
        for _ in range(low):  # x x ... then the tail
            tail = (min(_CAP, a + b * tail[0]), min(_CAP, b * tail[1]))
            if b == 0:
                break  # the first copy ends every stack
        return tail


def _compact_repetition(item: str, min_items: int, max_items: int | None, separator_rule: str | None = None, item_rule_is_literal: bool = False) -> str:
    """``item`` min_items to max_items times (None: unbounded) as GBNF's ``{m,n}``, as llama.cpp's
    own converter writes it: llama-cpp-python's writes max_items nested optional groups
    (maxLength 20,000 nests 20,000 deep) and min_items copies of the item. The converter hands
    a schema's ``minLength``... over as they are: each is made a whole count first
    (_repetition_count)."""
    min_items, max_items = _repetition_count(min_items, low=True) or 0, _repetition_count(max_items, low=False)
    if max_items is not None and max_items < min_items:
        # (a length's, an item count's or a pattern's bounds) no length fits: the converter's
        # repetition allowed another, and llama.cpp's parser allocated until the worker was
        # killed on the x{3,1} it wrote for a string
        raise GrammarError(f"a minimum of {min_items} is above the maximum of {max_items} (minLength/maxLength, minItems/maxItems or a pattern's {{m,n}})")
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return f"{item}?"
    if not separator_rule:
        if min_items == 1 and max_items is None:
            return f"{item}+"
        if min_items == 0 and max_items is None:
            return f"{item}*"
        return f"{item}{{{min_items},{'' if max_items is None else max_items}}}"
    rest = _compact_repetition(f"({separator_rule} {item})", max(0, min_items - 1), None if max_items is None else max_items - 1)
    result = f"{item} {rest}".rstrip()
    return f"({result})?" if min_items == 0 else result


def _repetition_count(value: Any, *, low: bool) -> int | None:
    """A length's or an item count's bound (``minLength``/``maxLength``, ``minItems``/``maxItems``)
    as the whole count it allows: a lower bound rounded up and at least 0 (2.5 characters or more
    is 3 or more), an upper one rounded down; a missing (None) lower bound is 0, a missing upper
    one None (unbounded). The converter wrote a float into the grammar as it was (``char{2.5,}``,
    ``{0,1e+20}``), which no engine's parser reads. GrammarError for what is no number."""
    if value is None:
        return 0 if low else None
    if not _is_json_number(value):
        raise GrammarError(f"'minLength'/'maxLength' and 'minItems'/'maxItems' must be non-negative integers, not {json.dumps(value)[:100]}")
    return int(max(0, math.ceil(value)) if low else math.floor(value))


def _converter() -> Any:
    from llama_cpp import llama_grammar

    llama_grammar._build_repetition = _compact_repetition  # looked up at each call
    # no prop_order: every object's properties in its schema's order (a call's schema lists
    # "name" before "arguments"; an order for those two names reordered every schema's)
    conv = llama_grammar.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    conv._build_object_rule = functools.partial(_build_object_rule, conv)
    conv.visit = functools.partial(_visit, conv, conv.visit)  # its own recursive calls come here too
    conv._format_literal = _format_literal
    conv._generate_constant_rule = _json_literal
    conv._resolve_ref = functools.partial(_resolve_ref, conv, {}, set(), set())
    return conv


# the rules this module names itself in a root it writes (a tool grammar's): no definition may
# take their names
_OWN_RULES = frozenset({"root", "call", "answer", "llama-call", "mistral-item"})


def _resolve_ref(conv: Any, rules: dict[str, str], names: set[str], recursive: set[str], ref: str) -> str:
    """The rule for ``ref`` (a resolved reference: ``request-call#/$defs/args1/$defs/Item``), one
    rule per reference. The converter named a definition's rule by the reference's last segment
    and took any rule of that name already there for it: two tools' ``#/$defs/Item``, a tool's
    and the answer format's, a property ``user`` beside ``#/$defs/user`` or a definition named
    ``call`` got the other's rule. ``rules``: reference -> its rule's name, set before the
    definition is visited, so a recursive reference (noted in ``recursive``) names the rule
    being made; ``names``: the names handed out."""
    from llama_cpp import llama_grammar

    if ref in rules:
        if rules[ref] not in conv._rules:
            recursive.add(ref)
        return rules[ref]
    base = llama_grammar.INVALID_RULE_CHARS_RE.sub("-", ref.split("/")[-1]) or "ref"
    i, name = 0, base
    while True:
        rule = name + "-" if name in llama_grammar.RESERVED_NAMES else name  # as ``visit`` names it
        if rule not in conv._rules and rule not in names and rule not in _OWN_RULES:
            break
        name, i = f"{base}{i}", i + 1
    rules[ref] = rule
    names.add(rule)
    made = str(conv.visit(conv._refs[ref], name))
    if made != rule:  # a primitive type's rule is the primitive's own ("integer"): refer to it
        if ref in recursive and rule not in conv._rules:
            conv._rules[rule] = made
        else:
            rules[ref] = made
    return rules[ref]


_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}


def _format_literal(literal: str) -> str:
    """``literal`` as a GBNF string literal. The converter's left backslashes as they were, and
    it writes JSON text (an enum's or a const's value, a property's name) as literals: ``"a\\nb"``
    became a raw line break inside the reply's string (not JSON), ``"a\\\\b"`` a backspace, and a
    ``"`` a grammar that does not parse. Any other control character is written as its ``\\xHH``
    escape, which both parsers read: llguidance's lexer refuses one raw (a property's name or an
    enum value holding one, which Qwen3-Coder's format writes as it is, was a 400 on MLX). Not
    NUL: no sampled text holds one (llama.cpp reads a token's text as a C string), so a grammar
    with one is refused, not one that would leave the model no token to go on with."""
    return '"' + re.sub(r'[\\"\r\n\x01-\x1f\x7f]', lambda m: _LITERAL_ESCAPES.get(m.group()) or f"\\x{ord(m.group()):02x}", literal) + '"'


def _json_literal(value: Any) -> str:
    """GBNF for ``value``'s JSON text (an enum's or a const's value, a property's name): its
    non-ASCII characters as they are, as llama.cpp's converter writes them, or all as ``\\u``
    escapes, as the converter here wrote them (the only form it allowed: a reply showed
    ``"\\u662f"`` for ``"是"``, and the model chose between non-ASCII values on hex digits). A
    lone surrogate, which no UTF-8 holds, is only escaped."""
    escaped = json.dumps(value)
    raw = json.dumps(value, ensure_ascii=False)
    if raw == escaped or any("\ud800" <= c <= "\udfff" for c in raw):
        return _format_literal(escaped)
    return f"({_format_literal(raw)} | {_format_literal(escaped)})"


# What llama-cpp-python's converter acts on in a schema; a schema with none of these (``{}``, or
# only annotations: a pydantic ``Any`` field is ``{"title": ...}``) allows any JSON value.
_CONSTRAINING = frozenset(
    ("$ref", "oneOf", "anyOf", "allOf", "type", "const", "enum", "properties", "items", "prefixItems", "pattern", "format")
)
_JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def _named_rule(conv: Any, name: str, body: str) -> str:
    """Rule ``name`` (as the converter's ``visit`` names it: a reserved name gets a "-", none is
    ``root``) with ``body``."""
    from llama_cpp import llama_grammar

    return str(conv._add_rule(name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root", body))


def _visit(conv: Any, visit: Any, schema: Any, name: str) -> str:
    """The converter's ``visit`` with what it gets wrong made plain first: ``true`` and a schema
    that constrains nothing allow any JSON value (the converter made ``{}`` any object, and
    refused a schema of annotations only); ``items: {}`` is any items (the converter took the
    empty schema for a missing one and failed), as are an array's ``minItems``/``maxItems``
    without ``items`` (the converter dropped them); a list of types keeps the schema's other keywords
    in each of its branches (the converter kept the bare types, so ``["object", "null"]`` allowed
    any object and ``["string", "null"]`` dropped its ``enum``, ``maxLength``...); and an
    integer's ``minimum``/``maximum`` (and exclusive bounds) hold, one-sided or wide (the
    converter ignored them: ``_bounded_integers`` made only small closed ranges an enum)."""
    if schema is True or (
        isinstance(schema, dict) and not _CONSTRAINING.intersection(schema) and schema.get("additionalProperties", True) is True
    ):
        from llama_cpp import llama_grammar

        return _named_rule(conv, name, conv._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"]))
    if isinstance(schema, dict) and isinstance(schema.get("allOf"), list) and not any(k in schema for k in ("$ref", "oneOf", "anyOf")):
        merged = _merged_all_of(schema)
        merged = _merged_objects(conv, schema) if merged is None else merged
        if merged is not None:
            return _visit(conv, visit, merged, name)
        raise GrammarError("an 'allOf' is enforced where its parts merge into one schema (each keyword with one value, or objects' properties), and these do not")
    unions = [k for k in ("anyOf", "oneOf") if isinstance(schema, dict) and isinstance(schema.get(k), list)]
    if len(unions) == 1 and "$ref" not in schema and set(schema) - _ANNOTATIONS - {unions[0]}:
        # the converter wrote only the branches, without the keywords beside them: ``{"type":
        # "object", "properties": ..., "anyOf": [{"required": ["a"]}, ...]}`` allowed any JSON
        # value; each branch holds them too, where they merge
        rest = {k: v for k, v in schema.items() if k != unions[0]}
        # each branch converts its copy: bounded as a schema's own text is (a wide object beside
        # many branches, converted once per branch, held the engine thread)
        copied = len(json.dumps({k: v for k, v in rest.items() if k not in _ANNOTATIONS})) * len(schema[unions[0]])
        conv._sf_copied = getattr(conv, "_sf_copied", 0) + copied
        if conv._sf_copied > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the keywords beside an '{unions[0]}' are copied into each of its branches, more than {MAX_GRAMMAR_CHARS:,} characters in all")
        # (a branch no value of which fits them is dropped; one that does not merge is written
        # bare, without them, as the converter wrote every branch)
        branches = [b for b in (_union_branch(conv, rest, branch) for branch in schema[unions[0]]) if b is not None]
        if unions[0] == "oneOf" and ("const" in rest or isinstance(rest.get("enum"), list)):
            # an enum's values: oneOf's exclusivity holds (a value that fits two branches fits
            # no oneOf), where the branches are known to hold it
            check = _value_check(conv)
            shared = {_json_key(v) for v in ([rest["const"]] if "const" in rest else rest["enum"]) if [check.allows(b, v) for b in schema["oneOf"]].count(True) > 1}
            branches = [{**b, "enum": [v for v in b["enum"] if _json_key(v) not in shared]} if isinstance(b, dict) and isinstance(b.get("enum"), list) else b for b in branches]
            branches = [b for b in branches if not (isinstance(b, dict) and b.get("enum") == [])]
        if not branches:
            raise GrammarError(f"no branch of the '{unions[0]}' allows a value that the keywords beside it allow")
        schema = {unions[0]: branches}
    elif len(unions) == 1 and "$ref" not in schema and any(_allows_no_value(conv, b) for b in schema[unions[0]]):
        # a branch that allows nothing (an enum none of whose values fits its type) refused the
        # whole schema, though the others allow values
        branches = [b for b in schema[unions[0]] if not _allows_no_value(conv, b)]
        if not branches:
            raise GrammarError(f"no branch of the '{unions[0]}' allows a value")
        schema = {**schema, unions[0]: branches}
    if isinstance(schema, dict):
        if schema.get("type") == "array" and schema.get("items") is False and not schema.get("prefixItems"):
            # no item fits: the empty array (the converter read prefixItems, a KeyError, a 400
            # that said only "'prefixItems'")
            if _is_json_number(schema.get("minItems")) and schema["minItems"] > 0:
                raise GrammarError(f"'items': false allows no item, and 'minItems' asks for {schema['minItems']}")
            return _named_rule(conv, name, '"[" space "]" space')
        if schema.get("items") == {} or (
            schema.get("type") == "array" and "items" not in schema and "prefixItems" not in schema and ("minItems" in schema or "maxItems" in schema)
        ):
            schema = {**schema, "items": True}
        if schema.get("type") == "object" and "properties" not in schema and isinstance(schema.get("required"), list) and schema["required"]:
            # any object but with the required keys (the converter's any object dropped them)
            schema = {**schema, "properties": {}, "additionalProperties": schema.get("additionalProperties", True)}
        kinds = schema.get("type")
        if ("enum" in schema or "const" in schema) and not any(k in schema for k in ("oneOf", "anyOf")):
            # the converter wrote an enum's (a const's) values whatever the keywords beside
            # them: ``{"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}`` let 1 and
            # "bb" through; only the values that fit them are written (a ``$ref`` beside, which
            # the converter wrote instead of the values, too)
            schema = _fitting_values(conv, schema)
            kinds = schema.get("type")
        if isinstance(kinds, list) and not any(k in schema for k in ("$ref", "oneOf", "anyOf")):
            if not kinds or not all(k in _JSON_TYPES for k in kinds):
                raise GrammarError(f"'type' must name JSON types ({', '.join(_JSON_TYPES)}), not {kinds!r}")
            rest = {k: v for k, v in schema.items() if k not in ("type", "$defs", "definitions")}
            branches = [_bounded_integer({**rest, "type": kind}) for kind in dict.fromkeys(kinds)]
            if len(branches) == 1:  # one type: its schema, made plain as any (``required`` without properties...)
                return _visit(conv, visit, branches[0], name)
            schema = {"anyOf": branches}
        if schema.get("type") == "integer" and not any(k in schema for k in ("$ref", "oneOf", "anyOf", "const", "enum")):
            lo, hi = _integer_bounds(schema)
            if lo is not None or hi is not None:  # the converter ignores an integer's bounds
                return _named_rule(conv, name, f"({_integer_range(lo, hi)}) space")
        if isinstance(schema.get("pattern"), str):
            schema = _pattern_with_lengths({**schema, "pattern": _LOOKAHEAD_FREE.get(schema["pattern"], schema["pattern"])})
            schema = {**schema, "pattern": _gbnf_pattern(schema["pattern"])}
    return str(visit(schema, name))


# patterns that generators write with a lookahead (which no grammar here can hold), each as the
# same strings without one. pydantic's ``Decimal`` (a money amount in many tools' parameters) is
# ``anyOf`` a number or a string of this pattern: not only signs and dots, then a decimal
# number's text; a decimal's text with at least one digit is the same strings. Without it
# every tool with a Decimal field was a 400 when forced, and unheld in auto.
_LOOKAHEAD_FREE = {r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$": r"^[+-]?(\d+\.?\d*|\.\d+)$"}


# a pattern that is one character's unit repeated: ``^[a-z]*$``, ``^\d{2,5}$``, ``^.+$``
_ONE_UNIT_REPEATED = re.compile(r"\^(?P<unit>\[\^?\]?(?:\\.|[^\]\\])*\]|\\.|[^\\()|^$*+?{}\[\]])(?P<q>[*+?]|\{\d+(?:,\d*)?\})?\$")


def _width(pattern: str) -> tuple[int, int] | None:
    """The fewest and most characters a string that ``pattern`` matches whole can hold (as Python
    reads the pattern), or None where Python does not read it."""
    try:
        lo, hi = re._parser.parse(pattern).getwidth()  # type: ignore[attr-defined]
    except (re.error, RecursionError, OverflowError):
        return None
    return int(lo), int(hi)


def _pattern_with_lengths(schema: dict[str, Any]) -> dict[str, Any]:
    """A string's ``minLength``/``maxLength`` beside its ``pattern`` (which the converter dropped:
    ``{"pattern": "^a*$", "maxLength": 2}`` let ``"aaaa"`` through): kept in the pattern where it
    is one character's unit repeated (the repetition's bounds meet the lengths'), dropped where
    every string the pattern matches already fits them, and refused otherwise (a general
    pattern's language and a length's do not intersect in the converter's grammar)."""
    if schema.get("type", "string") != "string" or not ({"minLength", "maxLength"} & set(schema)):
        return schema
    if any(k in schema for k in ("enum", "const", "$ref", "anyOf", "oneOf", "allOf")):
        return schema  # the converter writes these, not the pattern (an enum's values are checked)
    low, high = _repetition_count(schema.get("minLength"), low=True) or 0, _repetition_count(schema.get("maxLength"), low=False)
    rest = {k: v for k, v in schema.items() if k not in ("minLength", "maxLength")}
    pattern = schema["pattern"]
    width = _width(pattern)
    if width is not None and width[0] >= low and (high is None or width[1] <= high):
        return rest
    m = _ONE_UNIT_REPEATED.fullmatch(pattern)
    if m and _width(m["unit"]) == (1, 1):
        q = m["q"] or "{1}"
        if q in "*+?":
            q_low, q_high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[q]
        else:
            bounds = q[1:-1].split(",")
            q_low = int(bounds[0])
            q_high = q_low if len(bounds) == 1 else (int(bounds[1]) if bounds[1] else None)
        lo = max(low, q_low)
        hi = q_high if high is None else high if q_high is None else min(high, q_high)
        if hi is not None and lo > hi:
            raise GrammarError(f"no string of {low} to {high} characters matches the pattern {pattern[:100]!r}")
        return {**rest, "pattern": f"^{m['unit']}{{{lo},{'' if hi is None else hi}}}$"}
    raise GrammarError(
        f"'minLength'/'maxLength' beside a 'pattern' is enforced where the pattern is one character repeated (such as ^[a-z]*$) "
        f"or matches only strings of those lengths, and {pattern[:100]!r} is neither"
    )


def _value_check(conv: Any) -> _ValueCheck:
    """The conversion's value check (one time budget for its patterns)."""
    if not hasattr(conv, "_sf_check"):
        conv._sf_check = _ValueCheck(conv._refs)
    return conv._sf_check  # type: ignore[no-any-return]


def _fitting_values(conv: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, an enum or a const beside other keywords, with only the enum's values that
    fit them; GrammarError if none (or not the const) does."""
    what = "const" if "const" in schema else "enum"
    if what == "enum" and not isinstance(schema["enum"], list):
        return schema
    values = [schema["const"]] if what == "const" else schema["enum"]
    rest = {k: v for k, v in schema.items() if k != what and k not in _ANNOTATIONS}
    if not rest:
        return schema
    check = _value_check(conv)
    kept = [v for v in values if check.allows(rest, v) is not False]
    beside = ", ".join(f"'{k}'" for k in rest)
    if not kept and what == "const":
        raise GrammarError(f"the 'const' value {json.dumps(schema['const'])[:100]} does not fit the keywords beside it ({beside})")
    if not kept:
        raise GrammarError(f"no 'enum' value fits the keywords beside it ({beside})")
    if "$ref" in schema:
        schema = {k: v for k, v in schema.items() if k != "$ref"}
    kinds = schema.get("type")
    if isinstance(kinds, list) and kinds and all(k in _JSON_TYPES for k in kinds):
        # (the values fit: a list of types split into one branch per type, and the value
        # refused a branch of a type it was not of)
        schema = {k: v for k, v in schema.items() if k != "type"}
    return schema if what == "const" else {**schema, "enum": kept}


# the keywords that act on values of one type only
_TYPE_KEYWORDS = {
    "string": frozenset(("minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType")),
    "number": frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
    "array": frozenset(("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems")),
    "object": frozenset(
        ("properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
         "dependentSchemas", "dependencies", "unevaluatedProperties")
    ),
}


def _common_types(a: Any, b: Any) -> list[str] | None:
    """The JSON types both ``type`` values ``a`` and ``b`` allow (``integer`` of ``number``);
    None where either is missing or names no JSON type."""
    kinds = [[t] if isinstance(t, str) else t for t in (a, b)]
    if not all(isinstance(k, list) and k and all(t in _JSON_TYPES for t in k) for k in kinds):
        return None
    common = []
    for x in kinds[0]:
        for y in kinds[1]:
            if x == y or {x, y} == {"integer", "number"}:
                common.append("integer" if {x, y} == {"integer", "number"} else x)
    return list(dict.fromkeys(common))


def _allows_nothing(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` (one type) certainly allows no value: bounds that cross."""
    kind = schema.get("type")
    if kind == "integer":
        lo, hi = _integer_bounds(schema)
        return lo is not None and hi is not None and lo > hi
    low, high = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"), "object": ("minProperties", "maxProperties")}.get(str(kind), ("", ""))
    return _is_json_number(schema.get(low)) and _is_json_number(schema.get(high)) and schema[low] > schema[high]


_LOWER_BOUNDS = frozenset(("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"))
_UPPER_BOUNDS = frozenset(("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"))


def _joined_keywords(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``a`` and ``b`` with the keywords both hold with two values that join into one moved
    into ``b``: the tighter of two bounds, the names of two ``required``, the allOf of two
    ``items`` schemas (no ``prefixItems`` beside)."""
    a, b = dict(a), dict(b)
    for key in [k for k in a if k in b and a[k] != b[k]]:
        x, y = a[key], b[key]
        if key in _LOWER_BOUNDS | _UPPER_BOUNDS and _is_json_number(x) and _is_json_number(y):
            b[key] = max(x, y) if key in _LOWER_BOUNDS else min(x, y)
        elif key == "required" and isinstance(x, list) and isinstance(y, list):
            b[key] = list(dict.fromkeys([*x, *y]))
        elif key == "items" and isinstance(x, (dict, bool)) and isinstance(y, (dict, bool)) and "prefixItems" not in a and "prefixItems" not in b:
            b[key] = {"allOf": [x, y]}
        else:
            continue
        del a[key]
    return a, b


def _allows_no_value(conv: Any, schema: Any) -> bool:
    """Whether ``schema`` certainly allows no value: ``false``, an enum (a const) none of whose
    values fits the keywords beside it, bounds that cross."""
    if schema is False:
        return True
    if not isinstance(schema, dict):
        return False
    if isinstance(schema.get("allOf"), list) and not any(k in schema for k in ("$ref", "oneOf", "anyOf")):
        merged = _merged_all_of(schema)
        return merged is not None and "allOf" not in merged and _allows_no_value(conv, merged)
    unions = [k for k in ("anyOf", "oneOf") if isinstance(schema.get(k), list)]
    if len(unions) == 1 and "$ref" not in schema:
        rest = {k: v for k, v in schema.items() if k != unions[0]}
        if not set(rest) - _ANNOTATIONS:
            return all(_allows_no_value(conv, b) for b in schema[unions[0]])
        return all(_union_branch(conv, rest, b) is None for b in schema[unions[0]])
    if "const" in schema or isinstance(schema.get("enum"), list):
        check = _value_check(conv)
        return all(check.allows(schema, v) is False for v in ([schema["const"]] if "const" in schema else schema["enum"]))
    return _allows_nothing(schema)


def _union_branch(conv: Any, rest: dict[str, Any], branch: Any) -> Any:
    """A union's ``branch`` with the keywords beside the union (``rest``) merged in: an enum's
    (a const's) values that fit both, the one schema of both where they merge, else the bare
    branch (the keywords are not enforced on it); None where no value fits both (types that
    do not meet, no enum value that fits, bounds that cross)."""
    if branch is False:
        return None
    check = _value_check(conv)
    target = conv._refs.get(branch["$ref"]) if isinstance(branch, dict) and set(branch) - _ANNOTATIONS == {"$ref"} else None
    if isinstance(target, dict) and "$ref" not in target:
        # a reference's schema, copied here to hold the keywords too (counted as they are;
        # past the bound the branch is the bare reference)
        copied = getattr(conv, "_sf_copied", 0) + len(json.dumps(target))
        if copied > MAX_GRAMMAR_CHARS:
            return branch
        conv._sf_copied = copied
        merged_target = _union_branch(conv, rest, target)
        return branch if merged_target is target else merged_target
    for part in (rest, branch):
        if isinstance(part, dict) and ("const" in part or isinstance(part.get("enum"), list)):
            values = [part["const"]] if "const" in part else part["enum"]
            kept = [v for v in values if check.allows(rest, v) is not False and check.allows(branch, v) is not False]
            return {"enum": kept} if kept else None
    merged = _merged_all_of({"allOf": [rest, branch]})
    if merged is None and isinstance(branch, dict):
        rest, branch = _joined_keywords(rest, branch)
        merged = _merged_all_of({"allOf": [rest, branch]})
    if merged is None and isinstance(branch, dict):
        common = _common_types(rest.get("type", branch.get("type")), branch.get("type", rest.get("type")))
        if common == []:
            return None
        if common is not None:
            # the types both allow, and only the keywords that act on them (a string's
            # ``minLength`` says nothing of an object)
            kind: Any = common[0] if len(common) == 1 else common
            idle = set().union(*(v for k, v in _TYPE_KEYWORDS.items() if k not in common and not (k == "number" and "integer" in common)))
            rest, branch = ({**{k: v for k, v in part.items() if k not in idle}, "type": kind} for part in (rest, branch))
            merged = _merged_all_of({"allOf": [rest, branch]})
    unions = [k for k in ("anyOf", "oneOf") if isinstance(branch, dict) and k in branch]
    if merged is None and len(unions) == 1 and all(rest[k] == branch[k] for k in (set(rest) & set(branch)) - _ANNOTATIONS):
        merged = {**rest, **branch}  # a union in the branch: they hold in each of its branches
    if merged is None and isinstance(branch, dict) and not unions:
        try:  # objects: their properties merged (as an allOf's are)
            merged = _merged_objects(conv, {**rest, "allOf": [*(rest["allOf"] if isinstance(rest.get("allOf"), list) else []), branch]})
        except GrammarError:  # a required property that the other forbids
            return None
    if merged is None:
        return branch
    return None if _allows_no_value(conv, merged) else merged


def _is_of_type(value: Any, kind: str) -> bool:
    """Whether ``value`` (JSON data) is of the JSON Schema type ``kind`` (``1.0`` is an integer)."""
    if kind == "integer":
        return _is_json_number(value) and (isinstance(value, int) or float(value).is_integer())
    if kind == "number":
        return _is_json_number(value)
    types: dict[str, Any] = {"string": str, "boolean": bool, "null": type(None), "array": list, "object": dict}
    return kind in types and isinstance(value, types[kind])


def _is_json_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number (an int of any size, or a finite float): this module's
    one test of a number. An int is never given to ``math.isfinite`` (or ``float``), which raises
    OverflowError for one past a float's range: a client's 401-digit literal reads as 10**400.
    Such an int compares with a float exactly, and ``math.floor``/``ceil`` keep it whole."""
    return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and math.isfinite(value))


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema's equality: ``1`` is ``1.0``, ``true`` is not ``1``."""
    if _is_json_number(a) and _is_json_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _json_key(value: Any) -> str:
    """A text equal for values ``_json_equal`` holds equal (``1`` and ``1.0``), else different."""

    def plain(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return json.dumps(plain(value), sort_keys=True)


# assertions the check below does not evaluate: a value under one of them may or may not fit
_UNCHECKED = frozenset(
    ("contains", "minContains", "maxContains", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
     "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef")
)
# how long checking a pattern against data (an enum's values) may take, all of a schema's together
MAX_PATTERN_CHECK_SECONDS = 0.25


class _ValueCheck:
    """Whether a JSON value fits a schema, for the keywords the grammar enforces (and a few
    more): True, False, or None where it cannot tell (a keyword it does not evaluate, a
    reference it cannot resolve). ``refs``: the converter's resolved references."""

    def __init__(self, refs: dict[str, Any] | None = None) -> None:
        self.refs = refs or {}
        self.spent = 0.0  # seconds spent matching patterns
        self.enums: dict[int, tuple[list[Any], set[str]]] = {}  # an enum's values as keys (the list kept: its id stays its own)

    def allows(self, schema: Any, value: Any, depth: int = 0) -> bool | None:
        if schema is True or schema == {}:
            return True
        if schema is False:
            return False
        if not isinstance(schema, dict) or depth > 64:
            return None
        unknown = False
        for key in schema:
            verdict = self._keyword(schema, key, value, depth)
            if verdict is False:
                return False
            unknown = unknown or verdict is None
        return None if unknown else True

    def _all(self, verdicts: Any) -> bool | None:
        unknown = False
        for verdict in verdicts:
            if verdict is False:
                return False
            unknown = unknown or verdict is None
        return None if unknown else True

    def _keyword(self, schema: dict[str, Any], key: str, value: Any, depth: int) -> bool | None:
        v = schema[key]
        if key in _UNCHECKED:
            return None
        if key == "$ref":
            return self.allows(self.refs[v], value, depth + 1) if isinstance(v, str) and v in self.refs else None
        if key == "type":
            kinds = [v] if isinstance(v, str) else v
            if not isinstance(kinds, list) or not kinds or not all(k in _JSON_TYPES for k in kinds):
                return None
            return any(_is_of_type(value, k) for k in kinds)
        if key == "const":
            return _json_equal(value, v)
        if key == "enum":
            if not isinstance(v, list):
                return None
            if id(v) not in self.enums:
                self.enums[id(v)] = (v, {_json_key(e) for e in v})
            return _json_key(value) in self.enums[id(v)][1]
        if key in ("allOf", "anyOf", "oneOf"):
            if not isinstance(v, list) or not v:
                return None
            verdicts = [self.allows(branch, value, depth + 1) for branch in v]
            if key == "allOf":
                return self._all(verdicts)
            yes = verdicts.count(True)
            if key == "anyOf":
                return True if yes else (False if None not in verdicts else None)
            if yes > 1:
                return False
            return None if None in verdicts else yes == 1
        if key == "not":
            verdict = self.allows(v, value, depth + 1)
            return None if verdict is None else not verdict
        if isinstance(value, str):
            return self._string(key, v, value)
        if _is_json_number(value):
            return self._number(schema, key, v, value)
        if isinstance(value, list):
            return self._array(schema, key, v, value, depth)
        if isinstance(value, dict):
            return self._object(schema, key, v, value, depth)
        return True

    def _string(self, key: str, v: Any, value: str) -> bool | None:
        if key in ("minLength", "maxLength"):
            if not _is_json_number(v):
                return None
            return len(value) >= v if key == "minLength" else len(value) <= v
        if key == "pattern":
            return self._search(v, value)
        return True

    def _search(self, pattern: Any, text: str) -> bool | None:
        """Whether ``pattern`` matches in ``text`` (as jsonschema reads a pattern, a Python
        regular expression), within MAX_PATTERN_CHECK_SECONDS in all: a pattern that
        backtracks for ever against a value is refused, not run on the engine thread."""
        try:
            import regex  # (a time limit: the standard library's re has none)
        except ImportError:
            return None
        if not isinstance(pattern, str):
            return None
        start = time.monotonic()
        try:
            return regex.search(pattern, text, timeout=max(MAX_PATTERN_CHECK_SECONDS - self.spent, 0.001)) is not None
        except TimeoutError:
            raise GrammarError(f"checking the pattern {pattern[:100]!r} against the schema's values takes too long") from None
        except (regex.error, ValueError, OverflowError):
            return None
        finally:
            self.spent += time.monotonic() - start

    @staticmethod
    def _number(schema: dict[str, Any], key: str, v: Any, value: Any) -> bool | None:
        if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(v, bool):  # draft 4: minimum/maximum exclusive (checked there)
                return True
            if not _is_json_number(v):
                return None
            exclusive = schema.get("exclusiveMinimum" if key == "minimum" else "exclusiveMaximum") is True
            if key == "minimum":
                return bool(value > v if exclusive else value >= v)
            if key == "maximum":
                return bool(value < v if exclusive else value <= v)
            return bool(value > v) if key == "exclusiveMinimum" else bool(value < v)
        if key == "multipleOf":
            if not _is_json_number(v) or v <= 0:
                return None
            try:  # exact, as the JSON texts are written
                return (Fraction(repr(value)) / Fraction(repr(v))).denominator == 1
            except (ValueError, OverflowError):
                return None
        return True

    def _array(self, schema: dict[str, Any], key: str, v: Any, value: list[Any], depth: int) -> bool | None:
        if key in ("minItems", "maxItems"):
            if not _is_json_number(v):
                return None
            return len(value) >= v if key == "minItems" else len(value) <= v
        if key == "uniqueItems":
            return not v or len({_json_key(item) for item in value}) == len(value)
        if key == "prefixItems":
            if not isinstance(v, list):
                return None
            return self._all(self.allows(s, item, depth + 1) for s, item in zip(v, value, strict=False))
        if key == "items":
            if isinstance(v, list):  # draft 4's tuple
                return None
            prefix = schema.get("prefixItems")
            skip = len(prefix) if isinstance(prefix, list) else 0
            return self._all(self.allows(v, item, depth + 1) for item in value[skip:])
        return True

    def _object(self, schema: dict[str, Any], key: str, v: Any, value: dict[str, Any], depth: int) -> bool | None:
        if key in ("minProperties", "maxProperties"):
            if not _is_json_number(v):
                return None
            return len(value) >= v if key == "minProperties" else len(value) <= v
        if key == "required":
            return all(name in value for name in v) if isinstance(v, list) else None
        if key == "properties":
            if not isinstance(v, dict):
                return None
            return self._all(self.allows(v[name], item, depth + 1) for name, item in value.items() if name in v)
        if key == "patternProperties":
            if not isinstance(v, dict):
                return None
            verdicts = []
            for p, sub in v.items():
                for name, item in value.items():
                    matched = self._search(p, name)
                    if matched is not False:
                        verdict = self.allows(sub, item, depth + 1)
                        verdicts.append(None if matched is None and verdict is False else verdict)
            return self._all(verdicts)
        if key == "additionalProperties":
            declared = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
            patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
            verdicts = []
            for name, item in value.items():
                if name in declared:
                    continue
                matched = [self._search(p, name) for p in patterns]
                if True in matched:
                    continue
                verdict = self.allows(v, item, depth + 1)
                verdicts.append(None if verdict is False and None in matched else verdict)
            return self._all(verdicts)
        return True


# keywords that constrain nothing (an allOf's part of only these adds nothing to the others)
_ANNOTATIONS = frozenset(
    ("title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly", "$schema", "$id", "$defs", "definitions")
)
# keywords that act together (additionalProperties means the properties beside it): parts that
# hold keywords of one such group apart are not merged
_KEYWORD_GROUPS = (
    frozenset(("properties", "additionalProperties", "patternProperties", "unevaluatedProperties")),
    frozenset(("items", "prefixItems", "additionalItems", "unevaluatedItems", "contains", "minContains", "maxContains")),
    frozenset(("if", "then", "else")),
    frozenset(("const", "enum")),  # (the converter writes a const's value and drops an enum beside it)
)


def _merged_all_of(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema``'s ``allOf`` as one schema, where that is exact: the one part that constrains
    anything (pydantic's ``{"allOf": [{"$ref": ...}], "default": ...}``, a part beside
    annotations only), or parts whose keywords are all different (``{"type": "string", "allOf":
    [{"maxLength": 3}]}``; a keyword in several parts with one value), which hold together as
    one. None otherwise (objects: _merged_objects). The converter read an allOf only as objects
    to merge: a part without properties (a ``$ref`` to an enum, a string's bounds) was dropped,
    and only ``{}`` was allowed, which fits none of them."""
    rest = {k: v for k, v in schema.items() if k != "allOf"}
    parts = [p for p in [rest, *schema["allOf"]] if p is not True]
    if not all(isinstance(p, dict) for p in parts):
        return None
    constraining = [p for p in parts if set(p) - _ANNOTATIONS]
    if len(constraining) <= 1:
        return constraining[0] if constraining else {}
    if any("$ref" in p or "anyOf" in p or "oneOf" in p for p in constraining):
        return None  # (objects of a union's branches: _merged_objects)
    merged: dict[str, Any] = {}
    for p in constraining:
        for k, v in p.items():
            if k in merged and json.dumps(merged[k], sort_keys=True) != json.dumps(v, sort_keys=True):
                return None  # a keyword in two parts with two values (two "type"s, two "properties")
            if k not in _ANNOTATIONS:
                merged[k] = v
    for group in _KEYWORD_GROUPS:  # one part's keywords of a group, or the same in each part
        if len({json.dumps({k: v for k, v in p.items() if k in group}, sort_keys=True) for p in constraining if group & set(p)}) > 1:
            return None
    return merged


_OBJECT_KEYWORDS = frozenset(("type", "properties", "required", "additionalProperties"))


def _merged_objects(conv: Any, schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema``'s ``allOf`` of objects (each part, or what its ``$ref`` names, only
    ``properties``, ``required`` and ``additionalProperties``) as one object: the properties of
    all parts, one named in several parts the allOf of its schemas, required what any part
    requires, and no other property (as the converter wrote it). None if a part is more. The
    converter wrote a property named in two parts twice (``{"a": 1, "a": 1}``, the only
    object that fitted) and made every part's properties required."""
    def resolved(part: Any) -> Any:
        return conv._refs.get(part["$ref"]) if isinstance(part, dict) and set(part) - _ANNOTATIONS == {"$ref"} else part

    properties: dict[str, list[Any]] = {}
    required: list[Any] = []
    closed: list[tuple[set[str], Any]] = []  # a whole part's own names and the additional properties' schema
    parts = [(resolved(p), True) for p in [{k: v for k, v in schema.items() if k != "allOf"}, *schema["allOf"]]]
    while parts:
        part, whole = parts.pop(0)
        if part is True:
            continue
        if isinstance(part, dict) and whole and isinstance(part.get("anyOf"), list) and not set(part) - _ANNOTATIONS - {"anyOf"}:
            # a union of objects: their properties, none required (as the converter wrote it)
            parts += [(resolved(p), False) for p in part["anyOf"]]
            continue
        if not isinstance(part, dict) or set(part) - _ANNOTATIONS - _OBJECT_KEYWORDS:
            return None
        if part.get("type", "object") != "object" or not isinstance(part.get("properties", {}), dict) or not isinstance(part.get("required", []), list):
            return None
        for key, sub in part.get("properties", {}).items():
            properties.setdefault(key, []).append(sub)
        required += part.get("required", []) if whole else []
        if whole and part.get("additionalProperties", True) is not True:
            closed.append((set(part.get("properties", {})), part["additionalProperties"]))
    # a property another part names is an additional one of a part that does not: its
    # ``additionalProperties`` holds for it (they were dropped: a property that a part's
    # ``false`` forbids was written)
    for name in required:
        if isinstance(name, str) and name not in properties:
            raise GrammarError(f"an 'allOf' requires {name!r}, which its parts do not name in 'properties' (and no other property is written)")
    for own, extra in closed:
        for key in [k for k in properties if k not in own]:
            if extra is False and key in required:
                raise GrammarError(f"an 'allOf' requires {key!r}, which a part's 'additionalProperties': false forbids")
            if extra is False:
                del properties[key]
            else:
                properties[key].append(extra)
    return {
        "type": "object",
        "properties": {key: subs[0] if len(subs) == 1 else {"allOf": subs} for key, subs in properties.items()},
        "required": list(dict.fromkeys(r for r in required if isinstance(r, str))),
        "additionalProperties": False,
    }


# a regular expression's class escapes as GBNF class contents, in a JSON string's text: a space
# is the only white space written raw there (the others are escapes)
_CLASS_ESCAPES = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}
_NOT_IN_STRING = '"\\\\\\x7F\\x00-\\x1F'  # what a JSON string's text never holds raw
# a regular expression's ``.`` in a JSON string's text: a character written raw, or a one-letter
# escape but a line break's
_JSON_STRING_CHAR = f'([^{_NOT_IN_STRING}]|\\\\["\\\\/bft])'
# escapes that GBNF reads as a regular expression does (or the converter takes), kept as they are
_KEPT_ESCAPES = frozenset("U[]")
# a regular expression's escapes of one character (as Python and ECMA-262 read them)
_CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
# how a JSON string's text writes a character it never holds raw (a control character, ``"``,
# a backslash; DEL too, as ``.`` takes none raw)
_JSON_TEXT_ESCAPES = {"\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t", '"': '"', "\\": "\\"}


def _is_escaped_in_json(ch: str) -> bool:
    return ord(ch) < 0x20 or ch in '"\\\x7f'


def _json_escape_pattern(ch: str) -> str:
    """The converter's pattern for the text a JSON string writes ``ch`` as (a backslash, then
    its letter or ``u00XX``), each character a ``\\xHH`` escape (never raw in a literal:
    llguidance refuses a raw control character, the converter reads a raw ``"`` as a quote)."""
    text = _JSON_TEXT_ESCAPES.get(ch) or f"u{ord(ch):04x}"
    return "(" + "".join(f"\\x{ord(t):02X}" for t in "\\" + text) + ")"


def _class_char(ch: str) -> str:
    """``ch`` inside a GBNF character class."""
    return ch if ch.isalnum() or ord(ch) >= 0x80 else f"\\x{ord(ch):02X}"


def _escaped_char(pattern: str, i: int) -> tuple[str | None, int]:
    """The character an escape at ``pattern[i]`` (its backslash) stands for, and where the
    pattern goes on; None where it is no one character (a class, an anchor...)."""
    e = pattern[i + 1]
    if e in _CHAR_ESCAPES:
        return _CHAR_ESCAPES[e], i + 2
    for letter, digits in (("x", 2), ("u", 4)):
        hexa = pattern[i + 2 : i + 2 + digits]
        if e == letter and len(hexa) == digits and all(h in "0123456789abcdefABCDEF" for h in hexa):
            return chr(int(hexa, 16)), i + 2 + digits
    if e.isascii() and e.isalnum():
        return None, i + 2
    return e, i + 2  # an escaped punctuation character: itself


def _class(pattern: str, i: int) -> tuple[str, int]:
    """The character class at ``pattern[i]`` (its ``[``) in a JSON string's text, and where the
    pattern goes on. Its characters a JSON string writes escaped (a tab, ``"``...) are taken as
    their escapes (a positive class; a negated one takes none of them)."""
    negated = pattern[i + 1 : i + 2] == "^"
    j = i + 1 + negated
    ranges: list[tuple[str, str]] = []
    shorthands: list[str] = []
    first = True
    while j < len(pattern) and (pattern[j] != "]" or first):
        first = False
        if pattern[j] == "\\" and j + 1 < len(pattern):
            e = pattern[j + 1]
            if e.lower() in _CLASS_ESCAPES:
                if not e.islower():
                    raise GrammarError(f"a pattern's \\{e} inside a character class is not supported")
                shorthands.append(_CLASS_ESCAPES[e])
                j += 2
                continue
            ch, j = _escaped_char(pattern, j)
            if ch is None:
                raise GrammarError(f"a pattern's \\{e} inside a character class is not supported")
        else:
            ch, j = pattern[j], j + 1
        if pattern[j : j + 1] == "-" and pattern[j + 1 : j + 2] not in ("]", ""):
            if pattern[j + 1] == "\\" and j + 2 < len(pattern):
                hi, j = _escaped_char(pattern, j + 1)
                if hi is None:
                    raise GrammarError(f"a pattern's range ending in \\{pattern[j - 1]} is not supported")
            else:
                hi, j = pattern[j + 1], j + 2
            if ord(hi) < ord(ch):
                raise GrammarError(f"a pattern's character range {ch!r}-{hi!r} is out of order")
            ranges.append((ch, hi))
        else:
            ranges.append((ch, ch))
    if j >= len(pattern):
        raise GrammarError("a pattern's character class is not closed")
    kept: list[str] = []
    escaped: list[str] = []
    for lo, hi in ranges:
        a = ord(lo)
        for c in range(ord(lo), ord(hi) + 2):
            if c > ord(hi) or _is_escaped_in_json(chr(c)):
                if a < c:  # the run a..c-1 written raw
                    kept.append(_class_char(chr(a)) + ("" if a == c - 1 else "-" + _class_char(chr(c - 1))))
                if c <= ord(hi):
                    escaped.append(chr(c))
                a = c + 1
            if c > 0x7F and c <= ord(hi):  # no escaped character above DEL: the rest in one run
                kept.append(_class_char(chr(a)) + ("" if a == ord(hi) else "-" + _class_char(hi)))
                break
    body = "".join(shorthands + kept)
    if negated:
        return f"[^{body}{_NOT_IN_STRING}]", j + 1
    alternatives = ([f"[{body}]"] if body else []) + [_json_escape_pattern(ch) for ch in dict.fromkeys(escaped)]
    if not alternatives:
        raise GrammarError("a pattern's empty character class matches nothing")
    return alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")", j + 1


def _gbnf_pattern(pattern: str) -> str:
    """``pattern`` as the converter can write it into a JSON string's grammar:

    - the regular-expression escapes GBNF does not know as classes: ``\\d``, ``\\w``, ``\\s``
      (and ``\\D``, ``\\W``, ``\\S``) and an escaped ``.``, ``-``, ``/``, ``^``, ``$``... The
      converter copied them as they were, which llama.cpp and llguidance both refuse ("unknown
      escape"): ``^\\d{5}$`` was a 400;
    - ``.`` and a negated class without a raw ``"``, backslash or control character (``.`` takes
      a one-letter escape instead): the converter's ``.`` (``[^\\x0A\\x0D]``) took them, so a
      reply on llama.cpp could hold ``"a"b"`` (not JSON), and llguidance's greedy lexer read the
      closing quote and what followed as more of the string: an object holding such a property
      never closed on the MLX engine;
    - a non-capturing group ``(?:...)`` as a group (the converter refused it);
    - a character a JSON string writes escaped (a tab, raw or ``\\t``, ``\\n``, ``\\x01``, a
      ``"``, an escaped backslash), alone or in a class, as its escape in the text (``\\t``,
      ``\\"``, ``\\\\``, ``\\u0001``): the converter wrote it raw into the grammar's literal, so
      llama.cpp's replies held a raw tab or quote (not JSON) and llguidance refused the grammar
      ("lexer error"): a 400 on the MLX engine."""
    out: list[str] = []
    depth = 0
    bars: list[int] = []  # where in ``out`` each "|" outside every group stands
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            if e.lower() in _CLASS_ESCAPES:
                chars = _CLASS_ESCAPES[e.lower()]
                out.append(f"[{chars}]" if e.islower() else f"[^{chars}{_NOT_IN_STRING}]")
                i += 2
            elif e in _KEPT_ESCAPES or e in "(){}*+?|":
                out.append(c + e)  # GBNF's own, the converter's, or one that neither knows
                i += 2
            else:
                ch, i = _escaped_char(pattern, i)
                if ch is None:
                    out.append(c + e)  # one that neither knows (refused after)
                elif _is_escaped_in_json(ch):
                    out.append(_json_escape_pattern(ch))
                else:
                    out.append(ch if ch.isalnum() or ord(ch) >= 0x80 else f"[\\x{ord(ch):02X}]")
            continue
        if c == "[":
            cls, i = _class(pattern, i)
            out.append(cls)
            continue
        if c == ".":
            out.append(_JSON_STRING_CHAR)
        elif c == "(" and pattern.startswith("?:", i + 1):
            # a non-capturing group matches what a group matches (the converter refused "(?:",
            # which real schemas' slug, semver and path patterns use: a 400)
            depth += 1
            out.append(c)
            i += 3
            continue
        elif _is_escaped_in_json(c):
            out.append(_json_escape_pattern(c))
        else:
            depth += {"(": 1, ")": -1}.get(c, 0)
            if c == "|" and depth == 0:
                bars.append(len(out))
            out.append(c)
        i += 1
    if bars and out[:1] == ["^"] and out[-1:] == ["$"]:
        # ``^a$|^b$``: the converter strips the first "^" and the last "$" and writes the rest
        # between the string's quotes, so its "|" split the quotes apart (``"\"" "a" "$" |
        # "^b" "\""``: a reply ``"a$`` never closed its string); each alternative goes in one
        # group, its own anchors dropped (an alternative anchored at one end only is then
        # anchored at both: fewer strings, all of which fit)
        alts = ["".join(out[a + 1 : b]) for a, b in zip([-1, *bars], [*bars, len(out)], strict=True)]
        return "^(" + "|".join(alt.removeprefix("^").removesuffix("$") for alt in alts) + ")$"
    return "".join(out)


def _build_object_rule(conv: Any, properties: list[tuple[str, Any]], required: set[str], name: str, additional_properties: Any) -> str:
    """An object's rule: its properties in the schema's order, each optional one written or left
    out, the additional ones (where allowed) after them. llama-cpp-python's converter (and
    llama.cpp's) wrote the required properties first and the optional ones after them, so a call
    written in the schema's order, an optional property before a required one (Claude Code's
    NotebookEdit ``cell_id`` before ``new_source``, Codex's update_plan ``explanation`` before
    ``plan``), did not fit; and its rule for the optional ones was remade for every suffix from
    each start, O(n²) work (three objects of 900 optional properties, an 84 KB schema, held the
    engine thread 9 s). Here each rule is made once: ``{prefix}{key}-rest`` is the text after the
    properties before ``key``, some of them written (each next one with its comma); the object
    begins with any property up to the first required one (linear rules, few ways to start)."""
    declared = {k for k, _ in properties}
    missing = [k for k in dict.fromkeys(required) if isinstance(k, str) and k not in declared]
    if missing:
        # a required name the properties do not declare: the grammar never wrote it, so every
        # reply lacked it ({"a": 1} for "required": ["a", "z"]); it is one more property, of
        # the additional properties' schema (any value where they are not given), or a 400
        # where no additional property is allowed (as OpenAI refuses "Extra required key")
        if additional_properties is False:
            raise GrammarError(f"'required' names {missing[0]!r}, which is not in 'properties' and 'additionalProperties': false forbids")
        extra = additional_properties if isinstance(additional_properties, dict) else {}
        properties = [*properties, *((k, extra) for k in missing)]
    prop_order = conv._prop_order
    sorted_props = [kv[0] for _, kv in sorted(enumerate(properties), key=lambda ikv: (prop_order.get(ikv[1][0], len(prop_order)), ikv[0]))]
    prefix = f"{name}{'-' if name else ''}"
    kv_rules = {}
    for prop_name, prop_schema in properties:
        # (a top-level property "" would take the name "", the root's: the root became its value)
        prop_rule_name = conv.visit(prop_schema, f"{prefix}{prop_name}" or "empty")
        kv_rules[prop_name] = conv._add_rule(f"{prefix}{prop_name}-kv", rf'{_json_literal(prop_name)} space ":" space {prop_rule_name}')
    keys = list(sorted_props)
    if additional_properties == True or isinstance(additional_properties, dict):  # noqa: E712 (the converter's test)
        sub_name = f"{prefix}additional"
        value_rule = conv.visit({} if additional_properties == True else additional_properties, f"{sub_name}-value")  # noqa: E712
        # an additional key is any string but a declared name (as llama.cpp's converter writes
        # it): else a declared property came through the extra-key rule with another type
        key_rule = conv._add_rule(f"{sub_name}-k", _not_names(conv, sorted_props, f"{sub_name}-k")) if sorted_props else conv._add_primitive("string", _primitive_string())
        kv_rules["*"] = conv._add_rule(f"{sub_name}-kv", key_rule + ' ":" space ' + value_rule)
        keys.append("*")
    # rest[i]: the text after some of keys[:i] were written, from keys[i] on (from the end, so
    # that no rule is made twice and no recursion runs as deep as the properties are many)
    rest = [""] * (len(keys) + 1)
    for i in reversed(range(len(keys))):
        k = keys[i]
        kv = kv_rules[k]
        piece = f'( "," space {kv} )*' if k == "*" else f'"," space {kv}' if k in required else f'( "," space {kv} )?'
        body = f"{piece} {rest[i + 1]}".rstrip()
        rest[i] = conv._add_rule(f"{prefix}{k}-rest", body) if i + 1 < len(keys) else body  # ("*" is last)
    firsts = []  # the object's first property: any up to the first required one
    for i, k in enumerate(keys):
        firsts.append(f"{kv_rules[k]} {rest[i] if k == '*' else rest[i + 1]}".rstrip())
        if k in required:
            break
    if not firsts:
        return '"{" space "}" space'
    alternatives = " | ".join(firsts)
    body = f"( {alternatives} )" if len(firsts) > 1 else alternatives
    if not any(k in required for k in keys):
        body = f"( {alternatives} )?"
    return f'"{{" space {body} "}}" space'


_HEX = "0123456789abcdefABCDEF"
_ESCAPES = '"\\/bfnrt'


def _json_units(text: str) -> list[str]:
    """The JSON string contents ``text`` (between the quotes) as the symbols of the trie in
    ``_not_names``: a character, a one-letter escape (``\\n``), or ``\\u`` then its four hex
    digits one at a time (each written ``0x``-prefixed, so no symbol is two things)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 2] == "u":
            out += ["\\u", *("0x" + d for d in text[i + 2 : i + 6])]
            i += 6
        elif text[i] == "\\":
            out.append(text[i : i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return out


def _class_chars(chars: str) -> str:
    """``chars`` inside a GBNF character class (after its first character): ``]`` and ``\\``
    escaped, ``-`` last (where it is no range)."""
    return "".join("\\" + c if c in "]\\" else c for c in chars if c != "-") + ("-" if "-" in chars else "")


def _not_names(conv: Any, names: list[str], rule: str) -> str:
    """GBNF for a JSON string (an object's key) that is none of ``names``, each as a property's
    literal writes it (``json.dumps``) or with its other characters raw: llama.cpp's own
    converter's ``_not_strings``, with escapes taken whole (its classes let a lone backslash
    through)."""
    from llama_cpp import llama_grammar

    char = conv._add_primitive("char", llama_grammar.PRIMITIVE_RULES["char"])
    trie: dict[str, Any] = {}
    for name in names:
        for text in dict.fromkeys((json.dumps(name)[1:-1], json.dumps(name, ensure_ascii=False)[1:-1])):
            node = trie
            for unit in _json_units(text):
                node = node.setdefault(unit, {})
            node[""] = {}  # a name ends here

    # each node's rule text, children first (no recursion: a name may be long), a name's path
    # cut into a rule every 8 characters (llguidance refuses a Lark rule nesting groups ~25 deep;
    # llama.cpp's parser recurses once per nested group)
    order: list[tuple[dict[str, Any], int, int]] = []
    stack = [(trie, 0, 0)]
    while stack:
        node, hex_left, depth = stack.pop()
        order.append((node, hex_left, depth))
        stack += [(child, 4 if unit == "\\u" else max(hex_left - 1, 0), depth + 1) for unit, child in node.items() if unit]
    text: dict[int, str] = {}
    # each alternative takes the string to its closing quote: no group is optional (llama.cpp
    # refuses "(...)?" around a group of 2,000 groups or more), and hex digits are written out
    # (it refuses x{4} in a grammar of as many rules)
    hex4, escape, tail = " ".join(["[0-9a-fA-F]"] * 4), "", f'{char}* "\\""'
    for node, hex_left, depth in reversed(order):
        children = [k for k in node if k]
        alts = []
        for unit in children:
            literal = _format_literal(unit[2:] if unit.startswith("0x") else unit)
            alts.append(f"{literal} {text[id(node[unit])]}")
        if hex_left:  # another digit than the names', the escape's others, then any characters
            other = "".join(d for d in _HEX if "0x" + d not in children)
            if other:
                alts.append(" ".join([f"[{other}]", *["[0-9a-fA-F]"] * (hex_left - 1), tail]))
        else:
            raw = _class_chars("".join(u for u in children if len(u) == 1))
            alts.append(f'[^"\\\\\\x7F\\x00-\\x1F{raw}] {tail}')
            escapes = _class_chars("".join(e for e in _ESCAPES if "\\" + e not in children))
            if escapes == _class_chars(_ESCAPES) and "\\u" not in children:  # any escape: one rule for all
                escape = escape or conv._add_rule(f"{rule}-escape", f'"\\\\" ([{escapes}] | "u" {hex4})')
                alts.append(f"{escape} {tail}")
            else:
                if escapes:
                    alts.append(f'"\\\\" [{escapes}] {tail}')
                if "\\u" not in children:
                    alts.append(f'"\\\\u" {hex4} {tail}')
            if "" not in node:  # no name ends here: the string may
                alts.append('"\\""')
        body = "(" + " | ".join(alts) + ")"
        text[id(node)] = conv._add_rule(f"{rule}-{depth}", body) if depth and depth % 8 == 0 else body
    return f'"\\"" {text[id(trie)]} space'


def _primitive_string() -> Any:
    from llama_cpp import llama_grammar

    return llama_grammar.PRIMITIVE_RULES["string"]


# llama-cpp-python's converter lets raw control characters into strings, which JSON forbids (and
# strict parsers reject); llama.cpp's own converter excludes them, as here.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
# and its ``\\uXXXX`` escape is one character, as JSON reads it (and ``minLength``/``maxLength``
# count): a surrogate pair (``"\\ud83d\\ude00"``, one character) is one escape of the rule, not
# two, which counted 😀 written so as 2 characters (written raw, it was 1); a lone surrogate,
# which is no character and whose pairs counted twice, is not written
_LOOSE_ESCAPE = '"u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
_HEX_DIGIT = "[0-9a-fA-F]"
_JSON_ESCAPE = (
    f'"u" ([0-9a-cA-Ce-fE-F] {_HEX_DIGIT} {_HEX_DIGIT} {_HEX_DIGIT} | [dD] [0-7] {_HEX_DIGIT} {_HEX_DIGIT}'
    f' | [dD] [89abAB] {_HEX_DIGIT} {_HEX_DIGIT} "\\\\u" [dD] [c-fC-F] {_HEX_DIGIT} {_HEX_DIGIT}))'
)


def _format(conv: Any) -> str:
    text = str(conv.format_grammar()).replace(_LOOSE_CHAR + ' "\\\\" (["\\\\/bfnrt] | ' + _LOOSE_ESCAPE, _JSON_CHAR + ' "\\\\" (["\\\\/bfnrt] | ' + _JSON_ESCAPE)
    text = text.replace(_LOOSE_CHAR, _JSON_CHAR)  # (a converter that writes its escapes otherwise)
    return _HIDDEN_LITERAL.sub(lambda m: conv._format_literal(base64.urlsafe_b64decode(m.group(1)).decode()), text)


# A const's or enum's value that holds a "$ref" key is data, but the converter resolves every
# "$ref" it meets (a 400 for a pointer that names nothing, a rewritten value for one that does):
# it goes through as a string that carries the value (_hide_data), and the string's literal in the
# grammar is put back as the value's own (_format). The nonce keeps a client's own string out.
_HIDDEN_MARK = f"sf-data-{secrets.token_hex(8)}:"
_HIDDEN_LITERAL = re.compile(r'"\\"' + _HIDDEN_MARK + r'([A-Za-z0-9_=-]*)\\""')


def _hidden(value: Any) -> str:
    return _HIDDEN_MARK + base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


def _has_ref(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return isinstance(node, dict) and ("$ref" in node or any(_has_ref(v) for v in node.values()))


def _hide_data(node: Any) -> Any:
    """``node`` with each const, enum value, default and example that holds a ``$ref`` key
    carried in a string the converter leaves alone (see _HIDDEN_MARK). One walk: each data value
    is searched for a ``$ref`` once, and a subtree where nothing is hidden is kept as it is (a
    search of each node's whole subtree, level by level, was quadratic in the nesting depth)."""
    return _hiding_data(node)[0]


def _hiding_data(node: Any) -> tuple[Any, bool]:
    """``_hide_data``'s ``node`` and whether anything in it was hidden."""
    if isinstance(node, list):
        done = [_hiding_data(v) for v in node]
        return ([v for v, _ in done], True) if any(hid for _, hid in done) else (node, False)
    if not isinstance(node, dict):
        return node, False
    out: dict[str, Any] = {}
    hid = False
    for k, v in node.items():
        if k in _DATA_KEYWORDS:
            if k in ("enum", "examples") and isinstance(v, list):
                flags = [_has_ref(x) for x in v]
                out[k] = [_hidden(x) if f else x for x, f in zip(v, flags, strict=True)] if any(flags) else v
                hid = hid or any(flags)
            elif _has_ref(v):
                out[k], hid = _hidden(v), True
            else:
                out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):
            subs = {name: _hiding_data(sub) for name, sub in v.items()}
            out[k] = {name: sub for name, (sub, _) in subs.items()}
            hid = hid or any(h for _, h in subs.values())
        else:
            out[k], sub_hid = _hiding_data(v)
            hid = hid or sub_hid
    return (out, True) if hid else (node, False)


def _local_refs(schema: Any) -> Any:
    """``schema`` (a copy where it changes) with every ``$ref`` one the converter follows;
    ValueError (a GrammarError, converted) for a remote one.

    - A ``$ref`` that is not a pointer into the schema itself (``https://...``, a relative URL) is
      refused here: the converter's own guard against fetching it is an ``assert``, which
      ``python -O`` (PYTHONOPTIMIZE) removes, and then the worker fetched any URL a client named.
    - A pointer with escaped segments (RFC 6901's ``~1`` for ``/``, ``~0`` for ``~``; %-encoding,
      as in a URI fragment) names a definition the converter could not find (it splits on every
      ``/`` and unescapes nothing): its target is put under ``$defs`` by a plain name and the
      reference points there."""
    refs: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                if not ref.startswith("#"):
                    raise GrammarError(f"the JSON Schema cannot be enforced: a remote $ref ({ref[:200]!r}) is not fetched; put the definition in $defs")
                refs.append(node)
            for value in node.values():
                walk(value)

    walk(schema)
    if not any(c in node["$ref"] for node in refs for c in "~%") or not isinstance(schema, dict):
        return schema
    schema, refs = copy.deepcopy(schema), []
    walk(schema)
    escaped = [node for node in refs if any(c in node["$ref"] for c in "~%")]
    if not isinstance(schema.setdefault("$defs", {}), dict):
        return schema
    defs = schema["$defs"]
    keys: dict[int, str] = {}  # a target's key: every reference to it the same (a recursive one too)
    for node in escaped:
        target: Any = schema
        segments = [urllib.parse.unquote(s).replace("~1", "/").replace("~0", "~") for s in node["$ref"][1:].split("/")[1:]]
        for segment in segments:
            if isinstance(target, list) and segment.isdigit() and int(segment) < len(target):
                target = target[int(segment)]
            elif isinstance(target, dict) and segment in target:
                target = target[segment]
            else:
                break  # not found: the converter's refusal names it
        else:
            if id(target) not in keys:
                base = re.sub(r"[^A-Za-z0-9]+", "-", segments[-1] if segments else "root").strip("-") or "ref"
                key, i = base, 0
                while key in defs:
                    key, i = f"{base}-{i}", i + 1
                defs[key] = target
                keys[id(target)] = key
            node["$ref"] = f"#/$defs/{keys[id(target)]}"
    return schema


def _schema_rules(schema: Any, name: str, conv: Any = None, refs: str | None = None) -> Any:
    """A converter holding ``schema`` as rule ``name`` (beside what ``conv`` holds already);
    GrammarError if it cannot convert. ``refs``: the name of a schema ``conv`` holds already
    whose ``$defs`` this one shares (the same definitions under the same names): its references
    are the rules made for that one's, not copies."""
    text = json.dumps(schema)
    if len(text) > MAX_GRAMMAR_CHARS:  # converting runs on the engine thread, ~1 s per MiB
        raise GrammarError(f"the JSON Schema is {len(text):,} characters long; at most {MAX_GRAMMAR_CHARS:,} are allowed")
    conv = conv or _converter()
    try:
        # each schema's references under a base of its own: two schemas' "#/$defs/X" differ
        resolved = conv.resolve_refs(json.loads(text), f"request-{refs or name}")
        made = str(conv.visit(resolved, name))
    except Exception as exc:  # the converter trusts its input: any failure is the schema's
        # (its words for a remote $ref name a flag of llama.cpp's command-line tool)
        why = str(exc).replace(" (use --allow-fetch for force)", "")
        raise GrammarError(f"the JSON Schema cannot be enforced: {why}") from None
    if name and made != name:
        # a primitive type's rule is the primitive's own ("integer"): rule ``name`` refers to it
        # (a root's "... | answer" beside tools named no rule for a format of {"type": "integer"},
        # and no engine's parser read the grammar)
        conv._add_rule(name, made)
    return conv


def schema_grammar(schema: Any) -> str:
    """GBNF for JSON that fits ``schema`` (a JSON Schema object; ``{}`` is any JSON value).
    Conversions are cached by the schema's text as sent (its key order is the reply's: never
    sorted): agents send the same schema again and again,
    and converting runs on the engine thread."""
    if schema in ({}, True):
        return JSON_OBJECT_GBNF.replace("root   ::= object", "root   ::= value")
    if not isinstance(schema, dict):
        raise GrammarError("the JSON Schema must be an object")
    try:
        return _cached_schema_grammar(json.dumps(schema))
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply") from None


@functools.lru_cache(maxsize=64)
def _cached_schema_grammar(schema_text: str) -> str:
    return _format(_schema_rules(_bounded_integers(_rooted(json.loads(schema_text))), ""))


def _rooted(schema: Any) -> Any:
    """``schema`` with the two root forms the converter cannot take made plain: a root ``$ref``
    into the schema's own ``$defs`` (what pydantic writes for a self-referencing model) is
    inlined beside them, and ``#`` (root recursion, OpenAI's own example of a recursive schema)
    points at a copy of the root kept in ``$defs``. Data that holds a ``$ref`` key is carried
    apart (_hide_data)."""
    schema = _local_refs(_hide_data(schema))
    if not isinstance(schema, dict):
        return schema
    for _ in range(8):  # a root $ref to a def that is itself a $ref, a few deep
        ref = schema.get("$ref")
        if not (isinstance(ref, str) and ref.count("/") == 2 and ref.split("/")[1] in ("$defs", "definitions")):
            break
        _, where, name = ref.split("/")
        target = schema.get(where, {}).get(name) if isinstance(schema.get(where), dict) else None
        if not isinstance(target, dict):
            break
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **{k: v for k, v in target.items() if k not in ("$defs", "definitions")}}
    if not _refers_to_root(schema):
        return schema
    defs = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else {}
    name = next(n for n in (f"RootSchema{i or ''}" for i in range(len(defs) + 1)) if n not in defs)
    body = _root_ref_to(schema, f"#/$defs/{name}")
    return {**body, "$defs": {**defs, name: {k: v for k, v in body.items() if k != "$defs"}}}


def _refers_to_root(node: Any) -> bool:
    if isinstance(node, list):
        return any(_refers_to_root(v) for v in node)
    return isinstance(node, dict) and (node.get("$ref") == "#" or any(_refers_to_root(v) for v in node.values()))


def _root_ref_to(node: Any, at: str) -> Any:
    if isinstance(node, list):
        return [_root_ref_to(v, at) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _root_ref_to(v, at) for k, v in node.items()}
    if out.get("$ref") == "#":
        out["$ref"] = at
    return out


MAX_INTEGER_ENUM = 1024


# a schema's keywords whose values are data (never rewritten), and those whose values map names
# to schemas (a property may be named "enum")
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
_SCHEMA_MAPS = frozenset(("properties", "$defs", "definitions", "patternProperties"))


def _bounded_integers(node: Any) -> Any:
    """llama-cpp-python's converter ignores ``minimum``/``maximum``; an integer with both bounds
    and at most MAX_INTEGER_ENUM values becomes the enum of them, which it does enforce. An enum's
    or a const's value is data: one shaped like such a schema is kept as it is."""
    if isinstance(node, list):
        return [_bounded_integers(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in _DATA_KEYWORDS:
            out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: _bounded_integers(s) for name, s in v.items()}
        else:
            out[k] = _bounded_integers(v)
    return _bounded_integer(out)


def _bounded_integer(out: dict[str, Any]) -> dict[str, Any]:
    """One schema node as ``_bounded_integers`` makes it, its subschemas as they are."""
    if out.get("type") == "integer" and "enum" not in out and "const" not in out:
        lo, hi = _integer_bounds(out)
        if lo is not None and hi is not None and 0 <= hi - lo < MAX_INTEGER_ENUM:
            return {"enum": list(range(lo, hi + 1))}
    return out


def _integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """The least and greatest integer ``node``'s ``minimum``, ``maximum`` and exclusive bounds
    (JSON Schema's numbers, or draft 4's booleans) allow; None where unbounded."""
    lo: int | None = None
    hi: int | None = None
    bounds: list[Any] = [node.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
    low, high, ex_low, ex_high = bounds
    if _is_json_number(low):
        lo = math.floor(low) + 1 if ex_low is True else math.ceil(low)
    if _is_json_number(high):
        hi = math.ceil(high) - 1 if ex_high is True else math.floor(high)
    if _is_json_number(ex_low):
        lo = max(math.floor(ex_low) + 1, lo if lo is not None else math.floor(ex_low) + 1)
    if _is_json_number(ex_high):
        hi = min(math.ceil(ex_high) - 1, hi if hi is not None else math.ceil(ex_high) - 1)
    return lo, hi


# the digits llama-cpp-python's ``integral-part`` allows; a bound past them is no bound
MAX_INTEGER_DIGITS = 16
MAX_BOUND_DIGITS = 100


def _integer_range(lo: int | None, hi: int | None) -> str:
    """GBNF for the JSON integers from ``lo`` to ``hi`` (None: unbounded, up to
    MAX_INTEGER_DIGITS digits), without leading zeros."""
    limit = 10**MAX_INTEGER_DIGITS
    lo = None if lo is not None and lo <= -limit else lo
    hi = None if hi is not None and hi >= limit else hi
    if any(b is not None and abs(b) >= 10**MAX_BOUND_DIGITS for b in (lo, hi)):  # (no str(): past 4,300 digits it raises)
        raise GrammarError(f"an integer's bounds may have at most {MAX_BOUND_DIGITS} digits")
    if lo is not None and hi is not None and lo > hi:
        raise GrammarError(f"no integer is at least {lo} and at most {hi}")
    alts = []
    if lo is None or lo < 0:
        alts.append(f'"-" ({_naturals(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)})')
    if hi is None or hi >= 0:
        alts.append(_naturals(0 if lo is None else max(lo, 0), hi))
    return " | ".join(alts)


def _naturals(a: int, b: int | None) -> str:
    """GBNF for the natural numbers ``a`` to ``b`` (None: any of up to MAX_INTEGER_DIGITS
    digits, or of ``a``'s length), written without leading zeros; ``a`` <= ``b``."""
    la = len(str(a))
    lb = len(str(b)) if b is not None else max(la, MAX_INTEGER_DIGITS)
    alts = []
    full: list[int] = []  # lengths taken whole, written as one alternative
    for length in range(la, lb + 1):
        first = a if length == la else 10 ** (length - 1)
        last = b if b is not None and length == lb else 10**length - 1
        if length > 1 and first == 10 ** (length - 1) and last == 10**length - 1:
            full.append(length)
        else:
            alts.append(_same_length(str(first), str(last)))
    if full:
        alts.append(f"[1-9] [0-9]{{{full[0] - 1},{full[-1] - 1}}}")
    return " | ".join(alts)


def _same_length(x: str, y: str) -> str:
    """GBNF for the digit strings from ``x`` to ``y``, both of one length (leading zeros kept)."""
    i = 0
    while i < len(x) and x[i] == y[i]:
        i += 1
    # a digit a literal (llguidance lexes "100" as one lexeme and, greedy, would not match 10
    # against "100" | [1-9] [0-9])
    head = " ".join(f'"{c}"' for c in x[:i])
    if i == len(x):
        return head
    x, y = x[i:], y[i:]
    n = len(x) - 1
    if n == 0:
        body = f"[{x}-{y}]"
    else:
        zeros, nines = "0" * n, "9" * n
        mid_lo = int(x[0]) if x[1:] == zeros else int(x[0]) + 1
        mid_hi = int(y[0]) if y[1:] == nines else int(y[0]) - 1
        parts = [] if x[1:] == zeros else [f'"{x[0]}" ({_same_length(x[1:], nines)})']
        if mid_lo <= mid_hi:
            parts.append(f"[{mid_lo}-{mid_hi}] [0-9]{{{n}}}")
        if y[1:] != nines:
            parts.append(f'"{y[0]}" ({_same_length(zeros, y[1:])})')
        body = "(" + " | ".join(parts) + ")"
    return f"{head} {body}".strip()


def response_grammar(response_format: dict[str, Any] | None) -> str | None:
    """The grammar for a request's normalised ``response_format`` (see ``api.schemas``)."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return JSON_OBJECT_GBNF
    if kind == "json_schema":
        return schema_grammar(response_format.get("schema") or {})
    if kind == "grammar":
        return str(response_format["grammar"])
    return None


def _rebased(node: Any, at: str) -> Any:
    """``node`` with every local ``$ref`` (``#``, ``#/$defs/X``...) rewritten to point inside
    ``at``, where the schema now sits in a larger one."""
    if isinstance(node, list):
        return [_rebased(v, at) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebased(v, at) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = at + ref[1:]
    return out


# the id a Mistral model may write after a call's arguments in its [TOOL_CALLS] array (Nemo's
# template writes an earlier call's so; llama.cpp's grammar asks for it)
MISTRAL_ID_SCHEMA = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}


def call_schema(tool: dict[str, Any], mistral_id: bool = False) -> dict[str, Any]:
    """The JSON Schema of one call of ``tool``: ``{"name": <its name>, "arguments": {...}}``,
    all of it, in that order; ``mistral_id``: maybe an ``"id"`` of Mistral's 9 characters
    after them."""
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    properties: dict[str, Any] = {"name": {"const": tool["name"]}, "arguments": params}
    required = list(properties)
    if mistral_id:
        properties["id"] = MISTRAL_ID_SCHEMA
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def calls_schema(tools: list[dict[str, Any]], mistral_id: bool = False) -> dict[str, Any]:
    """One call of any of ``tools`` (``mistral_id`` as :func:`call_schema`'s). Each tool's parameters sit in the root's ``$defs`` (as
    ``args0``, ``args1``...) with their own local references (a pydantic model's ``$defs``, a
    recursive ``#``) rebased there: nested under a call they no longer resolved. The ``$defs``
    are the same whatever the call's shape: a schema of another shape shares their rules
    (:func:`_schema_rules`'s ``refs``)."""
    defs, calls = {}, []
    for i, tool in enumerate(tools):
        name = f"args{i}"
        defs[name] = _rebased(_rooted(tool.get("parameters") or {"type": "object", "properties": {}}), f"#/$defs/{name}")
        shape = {"name": tool["name"], "parameters": {"$ref": f"#/$defs/{name}"}}
        calls.append(call_schema(shape, mistral_id=mistral_id))
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "$defs": defs}


def tool_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, fmt: str = "hermes") -> str | None:
    """GBNF forcing tool calls (``choice`` ``required`` or a named function; None for ``auto`` and
    ``none``): in the model's own format where that is Qwen3-Coder's and its tools' parameters can
    be held to their schemas in it, else in the generic JSON format (read for every model)."""
    if choice in ("auto", "none") or not tools:
        return None
    return _calls_grammar(tools, choice, parallel, fmt, lazy=False)


# -- tool_choice auto: free text, and from the call's opening on, held to a call --------------
# llama-server's "lazy grammar" (common/chat.cpp's grammar_lazy and grammar_triggers): the reply
# is the model's own text until it opens a call, and from there the forced call's grammar holds
# it to a valid call of one of the tools. The trigger is the opening (TOOL_OPEN) of the formats
# whose calls the forced grammar writes (the generic one, Qwen3-Coder's, GLM's); Llama 3.x's
# and Mistral's own openings are held too, by the same rules (_own_lazy_grammar, at the end).
#
# llama.cpp's lazy sampler does this by watching the text for the trigger and, once it is there,
# feeding the grammar the text from the trigger on unchecked: a token that completes the opening
# and goes on with text the grammar rejects ("<tool_call" then SmolLM2's token ">>", where the
# grammar wants ">\n") throws from C++ there (std::terminate: the worker's process ends, every
# lane with it; checked against llama-cpp-python 0.3.36). So the trigger is
# written into the grammar instead: its root is any text in which the opening does not occur,
# then optionally the calls. The same text is allowed, and every token goes through the grammar
# sampler's usual check (a token that finishes the opening wrongly is masked, not fed), on both
# engines' grammar samplers, and across parking and resumption as any grammar is.
LAZY_TOOL_FORMATS = frozenset({"hermes", "qwen3_coder", "glm45", "llama3", "mistral", "harmony"})


# While the model reasons, nothing is held (llama-server suspends its lazy grammar there too): a
# "<tool_call>" or "[TOOL_CALLS]" a model writes in its thinking is words about a call, and held
# it would end the reply inside the block. The block is the reasoning format's: Qwen 3's and
# DeepSeek R1's "<think>...</think>", Magistral's and Ministral 3 Reasoning's
# "[THINK]...[/THINK]" (scheduler.engines.chat.REASONING_BLOCKS, which the reply's splitter,
# api/reasoning.py, reads the same). ``opened``: the reply begins inside the block (the prompt
# opened it); else the reply may begin with the block's opening, after whitespace as the
# splitter skips it (up to LEAD_SPACE characters of it; a longer run is text held as any).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
LEAD_SPACE = 16
# what the splitter takes for whitespace (str.lstrip's: Python's str.isspace)
_SPACE_CLASS = "[" + "".join(_class_char(c) for c in map(chr, range(0x3001)) if c.isspace()) + "]"


class Thinking(NamedTuple):
    """Where a reply's reasoning block is, and its markers (``lazy_tool_grammar``'s ``thinking``)."""

    opened: bool
    opening: str = THINK_OPEN
    closing: str = THINK_CLOSE


THINKING_OPEN, THINKING_MAY_OPEN = Thinking(True), Thinking(False)


def lazy_tool_grammar(tools: list[dict[str, Any]], parallel: bool, fmt: str = "hermes", thinking: Thinking | None = None) -> str | None:
    """GBNF for ``tool_choice`` auto: any text without TOOL_OPEN in it, then optionally the calls
    ``required`` would force (TOOL_OPEN begins them): text before a call is free, a call is held
    to the tools' parameters; a reasoning block (``thinking``) is free whole. For Llama 3.x's and
    Mistral's formats the text also avoids their own openings, each followed by its calls
    (:func:`_own_lazy_grammar`); "harmony", gpt-oss's: free text until a call's recipient opens
    (:func:`_harmony_lazy_grammar`). None for a format not in LAZY_TOOL_FORMATS, and for Llama
    3.x's or gpt-oss's with a reasoning block (Llama's calls open only at the reply's start, and
    no template of its has one; gpt-oss reasons in channels, which its grammar leaves free)."""
    if fmt not in LAZY_TOOL_FORMATS or not tools or (fmt in ("llama3", "harmony") and thinking):
        return None
    return _calls_grammar(tools, "required", parallel, fmt, lazy=thinking or True)


# The tools (and choice) a cached tool grammar may be made of, in JSON characters: every request
# with tools and tool_choice auto now builds one, and 64 cached entries of bodies up to the
# 8 MiB limit could hold half a gigabyte in the worker. Agents' tool lists (Claude Code's, the
# largest seen, ~60 kB) stay under it and are made once; a bigger one is made per request.
MAX_CACHED_TOOLS_CHARS = 256 * 1024


def _calls_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, fmt: str, lazy: bool | Thinking) -> str | None:
    key = json.dumps([tools, choice, parallel, lazy])
    cached = len(key) <= MAX_CACHED_TOOLS_CHARS
    try:
        own = None
        if fmt == "qwen3_coder":
            own = _cached_xml_tool_grammar(key) if cached else _xml_tool_grammar(tools, choice, parallel, lazy)
        elif fmt == "glm45":
            own = _cached_glm_tool_grammar(key) if cached else _glm_tool_grammar(tools, choice, parallel, lazy)
        elif fmt == "harmony" and lazy:  # (a forced call is the generic format's: the reply is read raw)
            return _cached_own_lazy_grammar(key, fmt) if cached else _own_lazy_grammar(tools, parallel, fmt, lazy)
        elif fmt in ("llama3", "mistral") and lazy:
            own = _cached_own_lazy_grammar(key, fmt) if cached else _own_lazy_grammar(tools, parallel, fmt, lazy)
        if own is not None:
            return own
        return _cached_tool_grammar(key) if cached else _tool_grammar(tools, choice, parallel, lazy)
    except RecursionError:
        raise GrammarError("a tool's parameters are nested too deeply") from None


def _text_without(conv: Any, literal: str, base: str = "lazy-text", at_least: int = 0) -> str:
    """Rules for any text in which ``literal`` does not occur (of ``at_least`` characters or
    more), and the first rule's name."""
    return _free_text(conv, base, (literal,), at_least=at_least)


# in an opening's pattern (_free_text's): any run of whitespace, none included (the ``\s*`` of
# llama.cpp's trigger patterns; a JSON reader skips it where these openings have it), and one
# whitespace character (a ``\s+`` is SOME_SPACE then ANY_SPACE)
ANY_SPACE = None
SOME_SPACE = "\\s"  # (no character: a pattern's characters are one long)
_SPACE_CHARS = " \t\n\r"


def _free_text(
    conv: Any, base: str, anywhere: tuple[str | tuple[str | None, ...], ...], at_start: tuple[tuple[str | None, ...], ...] = (), at_least: int = 0
) -> str:
    """Rules for any text in which none of the literals ``anywhere`` occurs (at least one; each
    may also be a pattern as the openings are) and which does not begin with one of the openings
    ``at_start`` (each a sequence of characters, SOME_SPACE and ANY_SPACE), and the first rule's
    name. Each rule is the set of ways the text read so far may
    still go on into one of them (the subset construction of their automaton: each literal may
    begin at any character, each opening only at the first): each character leads to the rule of
    the set it leaves, and one that would complete a literal or an opening is left out. Any rule
    may end. One literal alone: rule k is the text ending with its first k characters (and no
    longer start of it), a KMP automaton. ``at_least``: the text has that many characters or
    more (each set is paired with how many were read, up to it, and only a rule that has read
    them all may end)."""
    while any(k == base or k.startswith(base + "-") for k in conv._rules):
        base += "x"  # (a tool's $defs may name rules of its own)
    patterns = [tuple(literal) for literal in anywhere] + list(at_start)
    restart = {(p, 0) for p in range(len(anywhere))}

    def closure(positions: set[tuple[int, int]]) -> frozenset[tuple[int, int]]:
        out, todo = set(positions), list(positions)
        while todo:
            p, i = todo.pop()
            if i < len(patterns[p]) and patterns[p][i] is ANY_SPACE and (p, i + 1) not in out:
                out.add((p, i + 1))
                todo.append((p, i + 1))
        return frozenset(out)

    def step(state: frozenset[tuple[int, int]], ch: str | None) -> frozenset[tuple[int, int]] | None:
        """The set after ``ch`` (None: a character none of them has), None where one is complete."""
        moved = {(p, i + 1) for p, i in state if i < len(patterns[p]) and ch is not None and (patterns[p][i] == ch or (patterns[p][i] == SOME_SPACE and ch in _SPACE_CHARS))}
        moved |= {(p, i) for p, i in state if i < len(patterns[p]) and patterns[p][i] is ANY_SPACE and ch is not None and ch in _SPACE_CHARS}
        after = closure(moved | restart)
        return None if any(i == len(patterns[p]) for p, i in after) else after

    spaced = any(ANY_SPACE in q or SOME_SPACE in q for q in patterns)
    chars = sorted({c for pattern in patterns for c in pattern if c not in (ANY_SPACE, SOME_SPACE)} | (set(_SPACE_CHARS) if spaced else set()))
    numbers = {(closure(restart | {(p, 0) for p in range(len(anywhere), len(patterns))}), 0): 0}
    todo = list(numbers)
    while todo:
        state, read = key = todo.pop(0)  # (breadth first: one literal's rule k is its k characters read)
        targets: dict[int, list[str]] = {}
        for ch in [*chars, None]:
            moved = step(state, ch)
            if moved is None:
                continue  # (the character that completes one is left out)
            after = (moved, min(read + 1, at_least))
            if after not in numbers:
                numbers[after] = len(numbers)
                todo.append(after)
            targets.setdefault(numbers[after], []).append(ch)  # type: ignore[arg-type]
        alternatives = [""] if read == at_least else []
        for target, by in targets.items():
            if None in by:  # any character but those that go elsewhere
                rest = "".join(_class_char(c) for c in chars if c not in by)
                alternatives.insert(1, f"[^{rest}] {base}-{target}")
            else:
                alternatives.append(f"{_format_literal(by[0])} {base}-{target}" if len(by) == 1 else f"[{''.join(map(_class_char, by))}] {base}-{target}")
        conv._add_rule(f"{base}-{numbers[key]}", " | ".join(alternatives))
    return f"{base}-0"


def _root(conv: Any, calls: str, lazy: bool | Thinking, openings: tuple[str, ...] = (TOOL_OPEN,)) -> None:
    """The grammar's root: the calls, or (``lazy``) text without any of ``openings`` (those the
    calls begin with) and then optionally the calls, after the reasoning block where ``lazy`` is
    a :class:`Thinking`: the block's text is anything without its closing."""
    if not lazy:
        conv._add_rule("root", calls)
        return
    held = f"{_free_text(conv, 'lazy-text', openings)} ({calls})?"
    if lazy is True:
        conv._add_rule("root", held)
        return
    opening, closing = _format_literal(lazy.opening), _format_literal(lazy.closing)
    block = f"{_text_without(conv, lazy.closing, 'lazy-think')} ({closing} {held})?"
    lead = f"{_SPACE_CLASS}{{0,{LEAD_SPACE}}}"
    conv._add_rule("root", block if lazy.opened else f"{lead} {opening} {block} | {held}")


def _from_key(key: str) -> tuple[Any, Any, bool, bool | Thinking]:
    """A cached grammar's arguments (tools, choice, parallel, lazy) from its key (a Thinking
    comes back from JSON as a list)."""
    tools, choice, parallel, lazy = json.loads(key)
    return tools, choice, parallel, Thinking(*lazy) if isinstance(lazy, list) else lazy


@functools.lru_cache(maxsize=64)
def _cached_tool_grammar(key: str) -> str | None:
    tools, choice, parallel, lazy = _from_key(key)
    return _tool_grammar(tools, choice, parallel, lazy)


def tools_or_format_grammar(tools: list[dict[str, Any]], parallel: bool, response_format: dict[str, Any]) -> str:
    """``tool_choice`` auto beside a ``response_format`` (agent frameworks send both): the reply
    is tool calls, or an answer in the format. GrammarError for a format that is a GBNF grammar
    of the client's own (it cannot be joined to another)."""
    kind = response_format.get("type")
    if kind == "json_object":
        answer: Any = {"type": "object"}
    elif kind == "json_schema":
        answer = response_format.get("schema")
        if answer in (None, True):  # any JSON value
            answer = {}
    else:
        raise GrammarError("a GBNF grammar cannot be combined with tools")
    try:
        key = json.dumps([tools, parallel, answer])
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply") from None
    try:
        return _cached_tools_or_format(key)
    except RecursionError:
        raise GrammarError("the JSON Schema is nested too deeply") from None


@functools.lru_cache(maxsize=64)
def _cached_tools_or_format(key: str) -> str:
    tools, parallel, answer = json.loads(key)
    conv = _schema_rules(calls_schema(tools), "call")
    _schema_rules(_bounded_integers(_rooted(answer)), "answer", conv)
    conv._add_rule("root", f"{_calls_rule(parallel)} | answer")
    return _format(conv)


def _calls_rule(parallel: bool) -> str:
    one = f'"{TOOL_OPEN}\\n" call "\\n{TOOL_CLOSE}"'
    return f'{one} ("\\n" {one}){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else one


def _tool_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, lazy: bool | Thinking = False) -> str | None:
    """GBNF forcing tool calls when ``choice`` is ``required`` or names a function; None for
    ``auto``/``none`` (the model may then answer in text). A named function is called once;
    ``required`` with ``parallel`` allows up to MAX_PARALLEL_CALLS calls."""
    if choice in ("auto", "none") or not tools:
        return None
    if isinstance(choice, dict):
        chosen = [t for t in tools if t["name"] == choice.get("name")]
    else:
        chosen = list(tools)
    conv = _schema_rules(calls_schema(chosen), "call")
    _root(conv, _calls_rule(parallel and not isinstance(choice, dict)), lazy)
    return _format(conv)


# -- Qwen3-Coder's own format, forced -------------------------------------------------------
# (scheduler.engines.chat.tool_call_format "qwen3_coder"; api/xml_tool_calls.py reads it):
#
#     <tool_call>
#     <function=get_weather>
#     <parameter=city>
#     Paris
#     </parameter>
#     </function>
#     </tool_call>
#
# as llama.cpp's common/parsers/qwen3-coder.cpp forces it: a string parameter's value is any text
# up to the "\n</parameter>" that closes it (text without "</parameter>" in it, which the reader
# takes for the closing), any other's the JSON its schema allows. A tool whose parameters this
# cannot hold to their schema gets the JSON format instead (tool_grammar).

_PARAM_END = "\n</parameter>"
_TEXT_END = "</parameter>"
# a parameter's name as the format writes it (<parameter=name>): what the reader takes back whole
# (no NUL: a grammar's literals are C strings to llama.cpp, and no sampled text holds one)
_XML_KEY = re.compile(r"[^\s<>=\x00]{1,256}")
# keywords that only describe: a string parameter with no other is any text
_XML_PLAIN_KEYS = frozenset({"type", "description", "title", "default", "examples", "nullable", "deprecated", "readOnly", "writeOnly"})
_NOT_STRING_TYPES = frozenset({"number", "integer", "boolean", "null", "object", "array"})


def _char_class(chars: str) -> str:
    return "".join("\\n" if c == "\n" else "\\" + c if c in "]\\^-" else c for c in chars)


def _text_rules(conv: Any) -> str:
    """Rules for any text without "</parameter>" in it (which is border-free and whose first
    character comes once in it: each rule is how much of it the text now ends with), and the
    first rule's name."""
    end = _TEXT_END
    for k in range(len(end)):
        alternatives = [""]  # (the text may end here: the closing that follows comes after it)
        if k == 0:
            alternatives += [f"[^{_char_class(end[0])}] xml-text-0", f"{_format_literal(end[0])} xml-text-1"]
        else:
            if k + 1 < len(end):
                alternatives.append(f"{_format_literal(end[k])} xml-text-{k + 1}")
            alternatives += [f"{_format_literal(end[0])} xml-text-1", f"[^{_char_class(end[0] + end[k])}] xml-text-0"]
        conv._add_rule(f"xml-text-{k}", " | ".join(alternatives))
    return "xml-text-0"


# the string formats the JSON Schema converter enforces (date, time, date-time, uuid): any other
# (uri, email, hostname...) is any string in the JSON format, so any text in a tagged one
_ENFORCED_FORMAT = re.compile(r"date|time|date-time|uuid[1-5]?|(date|time|date-time)-string")
# the longest minLength a tagged format's text holds (each character one more set of rules)
MAX_TEXT_MIN_LENGTH = 64


def _text_min_length(schema: dict[str, Any]) -> int | None:
    """The fewest characters a string parameter's text may have where a tagged format's text can
    hold its keywords (annotations, a ``format`` the JSON format does not enforce either, a
    small ``minLength``); None where it cannot."""
    if not schema.keys() <= _XML_PLAIN_KEYS | {"format", "minLength"}:
        return None
    fmt = schema.get("format")
    if fmt is not None and (not isinstance(fmt, str) or _ENFORCED_FORMAT.fullmatch(fmt)):
        return None
    least = schema.get("minLength", 0)
    if not _is_json_number(least) or least != int(least) or not 0 <= least <= MAX_TEXT_MIN_LENGTH:
        return None
    return int(least)


def _xml_value_rule(
    conv: Any, schema: Any, params: dict[str, Any], name: str, text: Callable[..., str] = _text_rules, text_end: str = _TEXT_END
) -> str | None:
    """The rule for a parameter's value as the format writes it; None where it cannot be held to
    ``schema`` (a string with a pattern, a union with a string in it, a reference...). ``text``
    makes the rule for any text without ``text_end`` (the value's closing) in it, and with
    ``at_least`` for such text of that many characters or more."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) and all(isinstance(k, str) for k in kind) else None
    if not kinds:
        return None
    if "string" in kinds:
        if not kinds <= {"string"} | (_NOT_STRING_TYPES - {"object", "array"}):
            return None
        if schema.keys() <= _XML_PLAIN_KEYS:
            return text(conv)  # any text (a scalar of another kind allowed is read as it)
        least = _text_min_length(schema) if kinds == {"string"} else None
        if least is not None:
            # (Claude Code's WebFetch url, format "uri"; WebSearch query, minLength 2)
            return text(conv, at_least=least) if least else text(conv)
        enum = schema.get("enum")
        if kinds == {"string"} and schema.keys() <= _XML_PLAIN_KEYS | {"enum"} and isinstance(enum, list) and enum and all(
            isinstance(v, str) and text_end not in v and "\x00" not in v for v in enum
        ):
            return str(conv._add_rule(name, " | ".join(_format_literal(v) for v in enum)))
        return None
    if not kinds <= _NOT_STRING_TYPES or _has_root_ref(schema):
        return None
    defs = {k: params[k] for k in ("$defs", "definitions") if isinstance(params.get(k), dict)}
    _schema_rules(_bounded_integers(_rooted({**schema, **defs})), name, conv)
    return name


def _has_root_ref(node: Any) -> bool:
    """Whether ``node`` refers to its root (``#``, or a path into the tool's parameters other
    than their ``$defs``), which means the whole parameters, not the one value."""
    if isinstance(node, list):
        return any(_has_root_ref(v) for v in node)
    if not isinstance(node, dict):
        return False
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref.startswith("#/$defs/") or ref.startswith("#/definitions/")):
        return True
    return any(_has_root_ref(v) for v in node.values())


def _tagged_params(tool: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]] | None:
    """A tool's (parameters, properties, required names) where a tagged format (one tag per
    argument: Qwen3-Coder's, GLM's) can write its arguments; None where it cannot and the JSON
    format holds them instead."""
    params = tool.get("parameters") or {}
    if not isinstance(params, dict):
        return None
    props = params.get("properties") or {}
    if params.get("type", "object") != "object" or not isinstance(props, dict):
        return None
    if not props and params.get("additionalProperties") not in (None, False):
        return None  # (keys of the client's choosing: the JSON format holds them)
    required = params.get("required") or []
    # (a client's schema: "required" of anything but names is the JSON format's to refuse)
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required) or not set(required) <= props.keys():
        return None
    return params, props, required


def _xml_tool_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, lazy: bool | Thinking = False) -> str | None:
    return _tagged_tool_grammar(_QWEN3_CODER, tools, choice, parallel, lazy)


@dataclasses.dataclass(frozen=True)
class _TaggedFormat:
    """A format that writes one tag an argument (Qwen3-Coder's, GLM's), as GBNF pieces."""

    rules: str  # the prefix of its rules' names
    opening: str  # TOOL_OPEN and what follows it, as one GBNF literal's text
    head: Callable[[str], str]  # a call's head after the opening, by the function's name
    part: Callable[[str, str], str]  # an argument, by its key and its value's rule
    tail: str  # after the arguments, before TOOL_CLOSE
    between: str  # between two calls
    value_end: str  # what ends a value (a string value is any text without it)
    text: Callable[[Any], str] | None  # makes a string value's rule (None: text without value_end)
    name: re.Pattern[str] | None  # the function names it can write (None: any)


_QWEN3_CODER = _TaggedFormat(
    rules="xml",
    opening=TOOL_OPEN + "\\n",
    head=lambda name: _format_literal(f"<function={name}>\n"),
    part=lambda key, rule: f"{_format_literal(f'<parameter={key}>' + chr(10))} {rule} {_format_literal(_PARAM_END + chr(10))}",
    tail=_format_literal("</function>\n"),
    between='"\\n"',
    value_end=_TEXT_END,
    text=_text_rules,
    name=None,
)


def _tagged_tool_grammar(fmt: _TaggedFormat, tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, lazy: bool | Thinking) -> str | None:
    """GBNF forcing calls of ``tools`` (``choice`` as in :func:`_tool_grammar`) in ``fmt``; None
    where a tool's name or parameters cannot be written in it (the JSON format holds them)."""
    chosen = [t for t in tools if t["name"] == choice.get("name")] if isinstance(choice, dict) else list(tools)
    conv = _converter()
    made: dict[int, str] = {}  # the string values' rules by their least length, each made once

    def text(conv: Any, at_least: int = 0) -> str:
        if fmt.text is not None and not at_least:
            return fmt.text(conv)
        if at_least not in made:  # (a $defs name may have taken the rules' own: _free_text)
            made[at_least] = _text_without(conv, fmt.value_end, f"{fmt.rules}-text{at_least or ''}", at_least)
        return made[at_least]

    for i, tool in enumerate(chosen):
        shape = _tagged_params(tool)
        if shape is None or (fmt.name is not None and not fmt.name.fullmatch(tool["name"])):
            return None
        params, props, required = shape
        parts = []
        for j, (key, schema) in enumerate(props.items()):
            rule = _xml_value_rule(conv, schema, params, f"{fmt.rules}-fn{i}-arg{j}", text, fmt.value_end) if _XML_KEY.fullmatch(key) else None
            if rule is None:
                return None
            part = fmt.part(key, rule)
            parts.append(part if key in required else f"({part})?")
        conv._add_rule(f"{fmt.rules}-fn{i}", " ".join([fmt.head(tool["name"]), *parts, *([fmt.tail] if fmt.tail else [])]))
    conv._add_rule(f"{fmt.rules}-call", " | ".join(f"{fmt.rules}-fn{i}" for i in range(len(chosen))))
    one = f'"{fmt.opening}" {fmt.rules}-call "{TOOL_CLOSE}"'
    many = parallel and not isinstance(choice, dict)
    _root(conv, f"{one} ({fmt.between} {one}){{0,{MAX_PARALLEL_CALLS - 1}}}" if many else one, lazy)
    return _format(conv)


@functools.lru_cache(maxsize=64)
def _cached_xml_tool_grammar(key: str) -> str | None:
    tools, choice, parallel, lazy = _from_key(key)
    return _xml_tool_grammar(tools, choice, parallel, lazy)


# -- GLM 4.5's own format, forced -----------------------------------------------------------
# (scheduler.engines.chat.tool_call_format "glm45"; api/xml_tool_calls.py reads it):
#
#     <tool_call>get_weather
#     <arg_key>city</arg_key>
#     <arg_value>Paris</arg_value>
#     </tool_call>
#
# GLM 4.5's and 4.6's templates write the newlines, 4.7's none: each is allowed, and the model
# writes the layout it learnt. A string parameter's value is any text without "</arg_value>" in
# it (the template writes a string as it is), any other's the JSON its schema allows (the
# template writes it as JSON). A tool whose name or parameters this cannot hold gets the JSON
# format instead, as Qwen3-Coder's.

_GLM_VALUE_END = "</arg_value>"
# a function's name as the format writes it: the reader takes it to the first whitespace or "<"
_GLM_NAME = re.compile(r"[^\s<\x00]{1,256}")


_GLM45 = _TaggedFormat(
    rules="glm",
    opening=TOOL_OPEN,
    head=lambda name: f'{_format_literal(name)} "\\n"?',
    part=lambda key, rule: f'{_format_literal(f"<arg_key>{key}</arg_key>")} "\\n"? "<arg_value>" {rule} "{_GLM_VALUE_END}" "\\n"?',
    tail="",
    between='"\\n"?',
    value_end=_GLM_VALUE_END,
    text=None,
    name=_GLM_NAME,
)


def _glm_tool_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, lazy: bool | Thinking = False) -> str | None:
    return _tagged_tool_grammar(_GLM45, tools, choice, parallel, lazy)


@functools.lru_cache(maxsize=64)
def _cached_glm_tool_grammar(key: str) -> str | None:
    tools, choice, parallel, lazy = _from_key(key)
    return _glm_tool_grammar(tools, choice, parallel, lazy)


# -- Llama 3.x's and Mistral's own calls, in tool_choice auto ----------------------------------
# (scheduler.engines.chat.tool_call_format "llama3" and "mistral"; api.responses reads them). A
# forced call of theirs is written in the <tool_call> format (tool_grammar), which is read for
# every model; left to themselves (auto) they write their own, which llama.cpp's common/chat.cpp
# holds with a lazy grammar of each (common_chat_params_init_llama_3_x, _mistral_nemo,
# _magistral, _ministral_3):
#
#     {"name": "get_weather", "parameters": {"city": "Paris"}}        Llama 3.x, at the reply's
#     <|python_tag|>{"type": "function", "name": ..., "parameters": ...}   start only: one call
#     [TOOL_CALLS][{"name": "get_weather", "arguments": {...}}, ...]   Mistral Nemo, Small 3.x
#     [TOOL_CALLS]get_weather[ARGS]{...}                              Magistral, Devstral, Ministral 3
#     [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{...}            the v13 tokenizer's models
#
# Llama's opening is llama.cpp's trigger pattern (anchored at the reply's start: "{", maybe
# "type": "function", then "name": " with any whitespace between; before it whitespace and
# maybe <|python_tag|>, which the reader also skips), Mistral's [TOOL_CALLS] anywhere, and for
# both <tool_call> anywhere (read for every model). The free text avoids all of them
# (_free_text); each is followed by its calls, of the forced calls' rules: the call object
# (``call``, ``{"name", "arguments"}``) and each tool's arguments rule. A Llama call is its
# opening, with any whitespace where the trigger has it (the free text avoids any: a call that
# took its JSON's one space alone left "{\n  \"name\": " nowhere to go), then an offered name
# and "parameters" in that JSON; a Mistral array holds call objects, each maybe with its
# 9-character "id" last (Nemo writes one; the reader keeps it, else gives the call one), the
# [ARGS] form a tool's arguments (no whitespace after [TOOL_CALLS], a literal the free text
# avoids whole). Then only the end of generation, as after a forced call.
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
# a function name api.responses reads in [TOOL_CALLS]name[ARGS] (any other's calls are an array)
_MISTRAL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ANY_SPACE_RULE = "[ \\t\\n\\r]*"


def _spaced(*parts: str | None) -> tuple[str | None, ...]:
    """An opening's pattern of literal parts and ANY_SPACE."""
    return tuple(item for part in parts for item in ((part,) if part is ANY_SPACE or part == SOME_SPACE else tuple(part)))


_LLAMA3_OPENINGS = tuple(
    _spaced(ANY_SPACE, *tag, "{", ANY_SPACE, *typed, '"name"', ANY_SPACE, ":", ANY_SPACE, '"')
    for tag in ((), (PYTHON_TAG, ANY_SPACE))
    for typed in ((), ('"type"', ANY_SPACE, ":", ANY_SPACE, '"function"', ANY_SPACE, ",", ANY_SPACE))
)


def _own_lazy_grammar(tools: list[dict[str, Any]], parallel: bool, fmt: str, lazy: bool | Thinking) -> str | None:
    """``tool_choice`` auto's grammar for Llama 3.x's (``fmt`` "llama3"), Mistral's or gpt-oss's
    ("harmony": :func:`_harmony_lazy_grammar`) calls."""
    conv = _schema_rules(calls_schema(tools), "call")
    if fmt == "harmony":
        return _harmony_lazy_grammar(conv, tools)
    tagged = _calls_rule(parallel)
    if fmt == "llama3":
        # (one call: SINGLE_CALL_FORMATS; the worker never asks it with a reasoning block) its
        # opening with any whitespace, as the free text avoids it: where the call took its
        # JSON's one space alone, "{\n  \"name\": " was free text with nowhere to go
        ws = _ANY_SPACE_RULE
        typed = f'{_format_literal(chr(34) + "type" + chr(34))} {ws} ":" {ws} {_format_literal(json.dumps("function"))} {ws} "," {ws}'
        opening = f'"{{" {ws} ({typed})? {_format_literal(json.dumps("name"))} {ws} ":" {ws}'
        args_key = _format_literal(json.dumps("parameters"))
        named = [
            f'{_json_literal(tool["name"])} space "," space {args_key} space ":" space '
            + f'{conv._resolve_ref(f"request-call#/$defs/args{i}")} space "}}" space'
            for i, tool in enumerate(tools)
        ]
        conv._add_rule("llama-call", f"{opening} ({' | '.join(named)})")
        free = _free_text(conv, "lazy-text", (TOOL_OPEN,), _LLAMA3_OPENINGS)
        lead = f"{_ANY_SPACE_RULE} ({_format_literal(PYTHON_TAG)} {_ANY_SPACE_RULE})?"
        conv._add_rule("root", f"{lead} llama-call | {free} ({tagged})?")
        return _format(conv)
    more = MAX_PARALLEL_CALLS - 1 if parallel else 0
    opening = _format_literal(MISTRAL_CALLS)
    # an array's calls may end with the id Mistral's models write there (Nemo's)
    _schema_rules(calls_schema(tools, mistral_id=True), "mistral-item", conv, refs="call")
    item = "mistral-item"
    forms = [f'{opening} "[" " "? {item}' + (f' ("," " "? {item}){{0,{more}}}' if more else "") + ' "]"']
    named = [
        f'{_format_literal(tool["name"])} ({_format_literal(MISTRAL_CALL_ID)} [A-Za-z0-9]{{9}})? {_format_literal(MISTRAL_ARGS)} '
        + conv._resolve_ref(f"request-call#/$defs/args{i}")
        for i, tool in enumerate(tools)
        if _MISTRAL_NAME.fullmatch(tool["name"])
    ]
    if named:
        one = f"{opening} {conv._add_rule('mistral-call', ' | '.join(named))}"
        forms.append(f"{one} ({one}){{0,{more}}}" if more else one)
    _root(conv, " | ".join([*forms, tagged]), lazy, (TOOL_OPEN, MISTRAL_CALLS))
    return _format(conv)


@functools.lru_cache(maxsize=64)
def _cached_own_lazy_grammar(key: str, fmt: str) -> str | None:
    tools, _choice, parallel, lazy = _from_key(key)
    return _own_lazy_grammar(tools, parallel, fmt, lazy)


# -- gpt-oss's harmony calls, in tool_choice auto ----------------------------------------------
# gpt-oss answers in harmony messages (scheduler.engines.chat.reasoning_format "harmony"; the
# reply's splitter, api/reasoning.py's HarmonySplitter, reads them), its markers text as
# llama.cpp renders them (chat.HARMONY_TOKENS, <|end|> among them):
#
#     <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
#     <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
#     <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{...}
#
# A call is a message whose recipient is functions.NAME, in its channel's header or its role's
# (the reply begins after the generation prompt's "<|start|>assistant", so there the role's
# recipient opens the reply), and it ends the reply: <|call|> is an end of generation. As
# llama.cpp's common_chat_params_init_gpt_oss holds it (its lazy grammar's triggers: the
# recipient after "<|start|>assistant", maybe after a commentary or analysis channel, or at
# the reply's start), the text is free until a call's recipient opens, and from there the
# name is one of the tools', then the rest of the header (the channel where it comes after the
# name, maybe a content type, "<|constrain|>json" or " json"), "<|message|>" and arguments of
# the forced call's rules for that tool, then only the end. Analysis, final answers and
# preambles stay free, and so does a "to=functions." written in a message's text, and a
# "<tool_call>" block (or another format's markup) there: the reader takes a message's text for
# text, a call only from a recipient (api/reasoning.py), as llama.cpp's parser reads it. The
# openings are the places the splitter reads a recipient that a model writes: after
# "<|start|>assistant" and whitespace, after a channel's name (commentary, analysis, final:
# the splitter reads a call in any, and a channel opened without a start, which gpt-oss-20b
# writes at times) and whitespace, and at the reply's start after any whitespace; a recipient
# other than functions (built-in tools', "to=assistant", which gpt-oss-20b writes at times
# before its channel) stays free, as the splitter drops it. The whitespace is any run, in the
# text and in the call alike. A name the splitter cannot read (with whitespace or "<" in it:
# its recipient ends there) has no call here.
HARMONY_RECIPIENT = "to=functions."
HARMONY_START = "<|start|>assistant"
HARMONY_CHANNELS = ("commentary", "analysis", "final")
# what the splitter reads as a recipient's name (api/reasoning.py's _H_RECIPIENT), less NUL
_HARMONY_NAME = re.compile(r"[^\s<\x00]+")
_HARMONY_OPENINGS = (
    _spaced(HARMONY_START, SOME_SPACE, ANY_SPACE, HARMONY_RECIPIENT),
    *(_spaced(f"<|channel|>{channel}", SOME_SPACE, ANY_SPACE, HARMONY_RECIPIENT) for channel in HARMONY_CHANNELS),
)


def _harmony_lazy_grammar(conv: Any, tools: list[dict[str, Any]]) -> str | None:
    """``tool_choice`` auto's grammar for gpt-oss's calls, of the forced call's rules made in
    ``conv`` (each tool's arguments); None where no tool's name can be written as a recipient."""
    named = [(i, tool["name"]) for i, tool in enumerate(tools) if _HARMONY_NAME.fullmatch(tool["name"])]
    if not named:
        return None
    space = _ANY_SPACE_RULE.removesuffix("*")
    # the content type: " <|constrain|>json" (maybe without the space) or a bare " json", as gpt-oss
    # writes it (llama.cpp allows any whitespace before it: a run the model could go on with)
    kind = conv._add_rule("harmony-type", '" "? "<|constrain|>" [A-Za-z0-9_-]{1,32} | " " [A-Za-z0-9_-]{1,32}')
    # the header's rest after the name: the recipient in the role's header, or in the channel's
    rests = {"role": f'"<|channel|>" ("commentary" | "analysis") {kind}? "<|message|>"', "channel": f'{kind}? "<|message|>"'}
    made = {}  # (the rules' names as made: a tool's $defs may have taken one)
    for form, rest in rests.items():
        calls = " | ".join(f"{_format_literal(name)} {rest} {conv._resolve_ref(f'request-call#/$defs/args{i}')}" for i, name in named)
        made[form] = conv._add_rule(f"harmony-{form}", f'"{HARMONY_RECIPIENT}" ({calls})')
    free = _free_text(conv, "lazy-text", _HARMONY_OPENINGS, (_spaced(ANY_SPACE, HARMONY_RECIPIENT),))
    channels = " | ".join(f'"{c}"' for c in HARMONY_CHANNELS)
    opened = f'"{HARMONY_START}" {space}+ {made["role"]} | "<|channel|>" ({channels}) {space}+ {made["channel"]}'
    conv._add_rule("root", f"{space}* {made['role']} | {free} ({opened})?")
    return _format(conv)
