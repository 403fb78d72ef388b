"""Grammar constraints as token masks, for engines that sample in NumPy (MLX): llguidance.

The constraint is the same GBNF the llama.cpp engine gives its grammar sampler
(:mod:`scheduler.engines.grammar`: JSON, a JSON Schema, forced tool calls, a client's own
grammar), converted to llguidance's Lark dialect by llguidance's own ``gbnf_to_lark``, so both
engines enforce one grammar. Why llguidance: docs/engines.md (``bench/token_masks.py``).

A :class:`GrammarMatcher` is one lane's matcher: its state is the tokens it has accepted, so a
lane that is parked and bound again replays its generated tokens into a fresh matcher and
continues exactly where it stopped, as llama.cpp's grammar sampler is replayed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np


class GrammarCompileError(ValueError):
    """A GBNF grammar that llguidance cannot convert or compile."""


# a literal, a character class, a comment, a repetition's bounds (each kept whole), or a rule name
_GBNF_PIECE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|\{[^}]*\}|[A-Za-z0-9_-]+')


def _lark_key(name: str) -> str:
    """The name ``gbnf_to_lark`` gives a rule, but for case (``-`` to ``_``, ``fooBar`` to
    ``foo_bar``; a terminal's upper case, another's lower); ``root`` becomes ``start``."""
    return "start" if name == "root" else re.sub(r"([a-z])([A-Z])", r"\1_\2", name.replace("-", "_")).lower()


_LARK_NAME = re.compile(r"_?[a-z][a-z0-9_]*")


def _distinct_rule_names(gbnf: str) -> str:
    """``gbnf`` with the rules whose Lark names would be the same renamed apart: ``gbnf_to_lark``
    refuses two rules it renames alike, and JSON Schema grammars have them (a pydantic model's
    ``$defs`` ``Address`` beside its property ``address``; a property named ``start``, the name
    it gives ``root``)."""
    names = list(dict.fromkeys(m.group() for m in _GBNF_PIECE.finditer(gbnf) if m.group()[0] not in '"[#{'))
    if "root" in names:
        names.remove("root")
        names.insert(0, "root")
    owners: set[str] = set()
    renamed: dict[str, str] = {}
    for name in names:
        # a Lark name is a letter after at most one "_": a property's rule named after its
        # first character, a digit or a non-ASCII one (made "-"), was no name at all
        base = name if _LARK_NAME.fullmatch(_lark_key(name)) else f"r{name}"
        new, k = base, 1
        while _lark_key(new) in owners:
            k += 1
            new = f"{base}-{k}"
        owners.add(_lark_key(new))
        if new != name:
            renamed[name] = new
    if not renamed:
        return gbnf
    return _GBNF_PIECE.sub(lambda m: renamed.get(m.group(), m.group()), gbnf)


@functools.lru_cache(maxsize=64)
def _lark(gbnf: str) -> str:
    """llguidance's grammar text for a GBNF grammar (root rule ``root``), cached: agents send the
    same schema again and again."""
    import llguidance
    from llguidance.gbnf_to_lark import GrammarParser, resolve

    gbnf = _distinct_rule_names(gbnf)
    try:
        rules = GrammarParser().parse(gbnf)
        resolve(rules)
        lark = _lark_text(_char_level(rules) if _lexemes_compete(rules) else rules)  # else gbnf_to_lark's
    except Exception as exc:  # the converter's own parse errors, whatever their class
        raise GrammarCompileError(f"the grammar does not parse: {exc}") from None
    return str(llguidance.grammar_from("lark", lark))


def _lexemes_compete(rules: dict[str, Any]) -> bool:
    """Whether two lexemes of ``gbnf_to_lark``'s parser rules can begin with the same byte (other
    than two of its terminals, which its lexer reads as one regular expression). llguidance's
    lexer is greedy and does not backtrack, so it then refuses what the grammar allows: a
    recursive object (``"{"``) beside a flat one (the terminal ``{"x"...``), a recursive object's
    declared key (``"\\"kids\\""``) beside its additional ones (a string), ``"ab" | "a" "bc"``."""
    from llguidance.gbnf_to_lark import LiteralNode, RegexNode, RuleRefNode, SequenceNode

    bytes_ = [chr(i) for i in range(128)] + ["\u00e9"]  # ASCII, and one stand-in for the rest

    firsts: dict[int, tuple[set[str], bool]] = {}

    def first(node: Any) -> tuple[set[str], bool]:  # the first characters, and whether it may be empty
        if id(node) not in firsts:
            firsts[id(node)] = _first(node)
        return firsts[id(node)]

    def _first(node: Any) -> tuple[set[str], bool]:
        if isinstance(node, LiteralNode):
            if not node.value:
                return set(), True
            head = _LARK_CHAR.match(node.value).group()  # type: ignore[union-attr]
            if head.startswith("\\"):
                head = {"n": "\n", "r": "\r", "t": "\t"}.get(head[1], head[1]) if head[1] not in "xuU" else "\u00e9"
                head = head if len(head) == 1 and head in bytes_ else "\u00e9"
            return {head if head < "\x80" else "\u00e9"}, False
        if isinstance(node, RegexNode):
            try:
                rx = re.compile(node.rx)
            except re.error:  # Python's syntax is not quite Rust's (``\\ue9``): any character
                return set(bytes_), False
            return {c for c in bytes_ if rx.fullmatch(c)}, False
        if isinstance(node, RuleRefNode):
            return first(node.target.alternatives) if node.target is not None else (set(bytes_), False)
        if hasattr(node, "nodes"):
            out: set[str] = set()
            for child in node.nodes:
                chars, empty = first(child)
                out |= chars
                if not empty:
                    return out, False
            return out, True
        if hasattr(node, "alternatives"):
            alts = [first(c) for c in node.alternatives]
            return set().union(*(f for f, _ in alts)), any(e for _, e in alts)
        if hasattr(node, "node"):
            chars, empty = first(node.node)
            return chars, empty or node.min_times == 0
        return set(bytes_), True

    chars_of: dict[int, tuple[str, ...]] = {}

    def chars(literal: Any) -> tuple[str, ...]:
        if id(literal) not in chars_of:
            chars_of[id(literal)] = tuple(_LARK_CHAR.findall(literal.value))
        return chars_of[id(literal)]

    def clash(groups: list[list[Any]]) -> bool:
        """Whether a lexeme of one group competes with a lexeme of another: a literal a proper
        prefix of another literal, or (unless both are terminals, or both one character) two
        lexemes that may begin with the same byte."""
        literals: dict[tuple[str, ...], set[int]] = {}
        by_byte: dict[str, list[tuple[int, str, str, bool]]] = {}  # group, lexeme, kind, one character
        for g, lexemes in enumerate(groups):
            for x in lexemes:
                if isinstance(x, LiteralNode):
                    literals.setdefault(chars(x), set()).add(g)
                    kind, single = "literal", len(chars(x)) == 1
                else:
                    kind, single = ("terminal", False) if isinstance(x, RuleRefNode) else ("regex", True)
                for c in first(x)[0]:
                    by_byte.setdefault(c, []).append((g, str(x), kind, single))
        for text, owners in literals.items():
            for k in range(1, len(text)):
                shorter = literals.get(text[:k])
                if shorter and any(a != b for a in shorter for b in owners):
                    return True
        for entries in by_byte.values():
            for g, key, kind, single in entries:
                if kind == "literal":
                    continue  # against another literal: the prefixes above
                for g2, key2, kind2, single2 in entries:
                    if g2 != g and key2 != key and not (kind == kind2 == "terminal") and not (single and single2):
                        return True
        return False

    memo: dict[str, tuple[list[Any], bool]] = {}

    def starts(node: Any) -> tuple[list[Any], bool]:  # the lexemes it may begin with; whether it may be empty
        if isinstance(node, (LiteralNode, RegexNode)) or (isinstance(node, RuleRefNode) and node.is_terminal()):
            return [node], first(node)[1]
        if isinstance(node, RuleRefNode):
            if node.name not in memo:
                memo[node.name] = ([], True)  # a rule within itself: its own starts are counted once
                memo[node.name] = starts(node.target.alternatives)
            return memo[node.name]
        if hasattr(node, "nodes"):
            out: list[Any] = []
            for child in node.nodes:
                lex, empty = starts(child)
                out += lex
                if not empty:
                    return out, False
            return out, True
        if hasattr(node, "alternatives"):
            parts = [starts(c) for c in node.alternatives]
            return [x for lex, _ in parts for x in lex], any(e for _, e in parts)
        if hasattr(node, "node"):
            lex, empty = starts(node.node)
            return lex, empty or node.min_times == 0
        return [], True

    ends: dict[str, list[Any]] = {}

    def open_starts(node: Any) -> list[Any]:
        return list({id(x): x for x in _open_starts(node)}.values())  # (each once: clash compares pairs)

    def _open_starts(node: Any) -> list[Any]:
        """The lexemes that may begin where a text of ``node`` may also end (a rule that is not
        empty but may go on after any character: ``t0 ::= [^<] t1 | "<" t2``, ``t2 ::= | "/" t3 |
        ...``): each competes with what follows ``node`` as if ``node`` were empty."""
        if isinstance(node, (LiteralNode, RegexNode)) or (isinstance(node, RuleRefNode) and node.is_terminal()):
            return []
        if isinstance(node, RuleRefNode):
            if node.name not in ends:
                ends[node.name] = []  # a rule within itself: counted once
                ends[node.name] = open_starts(node.target.alternatives) if node.target is not None else []
            return ends[node.name]
        if hasattr(node, "nodes"):
            out: list[Any] = []
            for child in reversed(node.nodes):
                out += open_starts(child)
                lex, empty = starts(child)
                if not empty:
                    break
                out += lex  # it may end before this child, then go on into it
            return out
        if hasattr(node, "alternatives"):
            return [x for c in node.alternatives for x in open_starts(c)]
        if hasattr(node, "node"):
            return open_starts(node.node) + (starts(node.node)[0] if node.max_times != 1 else [])
        return []

    alphabets: dict[int, set[str]] = {}

    def alphabet(node: Any) -> set[str]:  # every character a text of it may hold
        if id(node) not in alphabets:
            alphabets[id(node)] = set()  # a rule within itself
            if isinstance(node, LiteralNode):
                alphabets[id(node)] = set().union(*(_first(LiteralNode(c))[0] for c in chars(node)))
            else:
                inner = [node.target.alternatives] if isinstance(node, RuleRefNode) and node.target is not None else node.children()
                alphabets[id(node)] = first(node)[0].union(*(alphabet(c) for c in inner))
        return alphabets[id(node)]

    conts: dict[int, set[str]] = {}

    def cont(node: Any) -> set[str]:
        """The characters that may follow a whole text of ``node`` within a longer one of it:
        what a lexeme of it, read greedily, may take past the end of a text of it."""
        if id(node) not in conts:
            conts[id(node)] = set()  # a rule within itself
            conts[id(node)] = _cont(node)
        return conts[id(node)]

    def _cont(node: Any) -> set[str]:
        if isinstance(node, (LiteralNode, RegexNode)):
            return set()
        if isinstance(node, RuleRefNode):
            return cont(node.target.alternatives) if node.target is not None else set(bytes_)
        if hasattr(node, "nodes"):
            out: set[str] = set()
            for child in reversed(node.nodes):
                out |= cont(child)
                head, nullable = first(child)
                if not nullable:
                    break
                out |= head  # it may end before this child, then go on into it
            return out
        if hasattr(node, "alternatives"):
            out = set().union(*(cont(c) for c in node.alternatives))
            # one alternative's text may be the start of another's: an empty one's, or where
            # two begin alike (then, an over-estimate, any of their characters)
            heads = [first(c) for c in node.alternatives]
            if any(empty for _, empty in heads):
                out |= set().union(*(head for head, _ in heads))
            if sum(len(head) for head, _ in heads) > len(set().union(*(head for head, _ in heads))):
                out |= alphabet(node)
            return out
        if hasattr(node, "node"):
            return cont(node.node) | (first(node.node)[0] if node.max_times != 1 else set())
        return set(bytes_)

    tails: dict[str, set[str]] = {}

    def tail_cont(node: Any) -> set[str]:
        """``cont`` of the terminals (lexemes) a text of ``node``, a parser-level node, may end with."""
        if isinstance(node, RuleRefNode) and node.is_terminal():
            return cont(node)
        if isinstance(node, RuleRefNode):
            if node.name not in tails:
                tails[node.name] = set()  # a rule within itself
                tails[node.name] = tail_cont(node.target.alternatives) if node.target is not None else set()
            return tails[node.name]
        if hasattr(node, "nodes"):
            out: set[str] = set()
            for child in reversed(node.nodes):
                out |= tail_cont(child)
                if not first(child)[1]:
                    break
            return out
        if hasattr(node, "alternatives"):
            return set().union(*(tail_cont(c) for c in node.alternatives))
        if hasattr(node, "node"):
            return tail_cont(node.node)
        return set()

    def walk(node: Any) -> bool:
        """Whether two lexemes that may come at one point in ``node`` compete, or a lexeme may
        read on into the one after it (``val ::= [^\\n]+`` before ``"}"``)."""
        if isinstance(node, (LiteralNode, RegexNode, RuleRefNode)):
            return False
        if hasattr(node, "alternatives"):
            if clash([starts(c)[0] for c in node.alternatives]):
                return True
        if hasattr(node, "nodes"):
            for i, child in enumerate(node.nodes[:-1]):
                lex, empty = starts(child)
                again = hasattr(child, "node") and child.max_times != 1
                if (empty or again) and clash([lex, starts(SequenceNode(node.nodes[i + 1 :]))[0]]):
                    return True
                going_on = open_starts(child)
                if going_on and clash([going_on, starts(SequenceNode(node.nodes[i + 1 :]))[0]]):
                    return True
                follows: set[str] = set()  # what the rest may begin with (not memoised: a new node)
                for after in node.nodes[i + 1 :]:
                    head, nullable = first(after)
                    follows |= head
                    if not nullable:
                        break
                try:
                    if tail_cont(child) & follows:
                        return True
                except RecursionError:  # nested past Python's stack (a name of hundreds of characters): as if it did
                    return True
        return any(walk(c) for c in node.children())

    def refs(rule: Any) -> list[Any]:  # the rules a rule names
        out, todo = [], [rule.alternatives]
        while todo:
            node = todo.pop()
            if isinstance(node, RuleRefNode):
                if node.target is not None:
                    out.append(node)
            elif not isinstance(node, (LiteralNode, RegexNode)):
                todo.extend(node.children())
        return out

    # each rule's first characters and open_starts made after those of the rules it names
    # (depth first, without recursion): a chain of rules as long as an object's properties
    # (each optional one's "-rest" names the next) recursed past Python's stack
    finished: set[str] = set()
    for name, rule in rules.items():
        if name in finished:
            continue
        finished.add(name)
        stack = [(name, rule, iter(refs(rule)))]
        while stack:
            for ref in stack[-1][2]:
                if ref.name not in finished:
                    finished.add(ref.name)
                    stack.append((ref.name, ref.target, iter(refs(ref.target))))
                    break
            else:
                done_name, done_rule, _ = stack.pop()
                first(done_rule.alternatives)
                if not done_rule.rule_is_terminal and done_name not in ends:
                    ends[done_name] = []
                    ends[done_name] = open_starts(done_rule.alternatives)
    return any(walk(rule.alternatives) for rule in rules.values() if not rule.rule_is_terminal)


# one character of a converted literal: an escape, or a \u or \U escape with the rest (its hex
# digits are not delimited), or a character
_LARK_CHAR = re.compile(r"\\[uU][0-9a-fA-F]*.*|\\x[0-9a-fA-F]{2}|\\.|.", re.S)


def _char_level(rules: dict[str, Any]) -> dict[str, Any]:
    """The grammar as llama.cpp reads it, one character at a time: every rule a parser rule and
    every literal split into its characters, so no two lexemes compete beyond one character and
    llguidance's Earley parser, not its lexer, chooses between alternatives."""
    from llguidance.gbnf_to_lark import LiteralNode, SequenceNode

    def split(node: Any) -> Any:
        if isinstance(node, LiteralNode):
            chars = _LARK_CHAR.findall(node.value)
            return SequenceNode([LiteralNode(c) for c in chars]) if len(chars) > 1 else node
        for attr in ("nodes", "alternatives"):
            children = getattr(node, attr, None)
            if isinstance(children, list):
                setattr(node, attr, [split(c) for c in children])
        if hasattr(node, "node"):
            node.node = split(node.node)
        return node

    for rule in rules.values():
        rule.rule_is_terminal = False
        rule.name = rule.name.lower()
        rule.alternatives = split(rule.alternatives)
    return rules


def _lark_text(rules: dict[str, Any]) -> str:
    """The Lark text of resolved rules, as ``gbnf_to_lark`` writes it (in the GBNF's order)."""
    ordered = sorted(rules.values(), key=lambda r: r.order)
    return "%llguidance {}\n\n" + "\n\n".join(str(r) for r in ordered) + "\n"


class TokenMasks:
    """llguidance's view of one model's vocabulary (built once per engine: about half a second)
    and the grammars compiled against it.

    llguidance takes an added token that is special, or that looks like a tag (``<tool_call>``,
    ``<think>``: Qwen's, GLM's), for a special token, which no text in a grammar matches: a
    grammar with the literal ``"<tool_call>"`` allowed only the tag spelled in pieces, and masked
    the one token the model writes it with (its tool calls in ``tool_choice`` auto, whose
    grammar allows the tag where a call opens, were masked away). llama.cpp's grammar sampler
    reads every token as its text, control tokens included. So here too: a special token (not
    an end of generation) whose text a grammar holds as a literal stands for that text, spelled
    in ordinary tokens for the matcher (:class:`GrammarMatcher`); one the engine writes into a
    reply as text (``rendered``: gpt-oss's markers, its <|end|>) stands for its text in any
    grammar, as its piece is that text to llama.cpp's sampler."""

    def __init__(self, tokenizer_json: Path, n_vocab: int, eos_tokens: list[int], rendered: Collection[str] = ()) -> None:
        import json

        import llguidance

        self._ll = llguidance
        self.n_vocab = n_vocab
        source = tokenizer_json.read_text(encoding="utf-8")
        self._tokenizer = llguidance.LLTokenizer(source, n_vocab=n_vocab, eos_token=sorted(eos_tokens))
        self._specials: dict[str, tuple[int, list[int]]] = {}  # text -> (the special token, its text in ordinary tokens)
        self._rendered = frozenset(rendered)
        added = json.loads(source).get("added_tokens") or []
        tok = self._tokenizer
        for entry in added if isinstance(added, list) else []:
            token, text = entry.get("id"), entry.get("content")
            if not isinstance(token, int) or not isinstance(text, str) or not text or not 0 <= token < n_vocab or token in eos_tokens:
                continue
            if not tok.is_special_token(token):
                continue
            spelled = tok.greedy_tokenize(text)
            if spelled and not any(tok.is_special_token(t) for t in spelled) and tok.decode_bytes(spelled) == text.encode():
                self._specials[text] = (token, spelled)

    def check(self, gbnf: str) -> str | None:
        """Why ``gbnf`` cannot be enforced; None if it can."""
        try:
            grammar = _lark(gbnf)
        except GrammarCompileError as exc:
            return str(exc)
        error = self._ll.LLMatcher.validate_grammar(grammar, self._tokenizer)
        return error or None

    def matcher(self, gbnf: str) -> GrammarMatcher:
        grammar = _lark(gbnf)
        matcher = self._ll.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarCompileError(f"the grammar cannot be enforced: {matcher.get_error()}")
        # (the special tokens whose text the grammar writes: a few, so a mask checks each cheaply)
        spelled = dict(pair for text, pair in self._specials.items() if text in self._rendered or text in gbnf)
        return GrammarMatcher(matcher, self.n_vocab, spelled)


class GrammarMatcher:
    """One lane's grammar state: which tokens may come next, and the tokens it has taken."""

    def __init__(self, matcher: Any, n_vocab: int, spelled: dict[int, list[int]] | None = None) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._words = np.zeros(((n_vocab + 31) // 32,), dtype=np.int32)
        # special tokens that stand for their text (TokenMasks): the text in ordinary tokens
        self._spelled = spelled or {}

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary of the tokens the grammar allows next (only the
        end-of-generation tokens once the grammar is complete; none once it has failed)."""
        m = self._matcher
        if m.is_error():
            return np.zeros(self._n_vocab, dtype=bool)
        m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        mask = bits[: self._n_vocab].astype(bool)
        for token, text in self._spelled.items():
            if mask[text[0]] and m.validate_tokens(text) == len(text):
                mask[token] = True
        return mask

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one the mask allowed; anything else puts the matcher in its
        error state, where it allows nothing)."""
        if not self._matcher.is_error() and not self._matcher.is_stopped():
            text = self._spelled.get(int(token))
            if text is None:
                self._matcher.consume_token(int(token))
            else:
                self._matcher.consume_tokens(text)

    def accept_prefix(self, tokens: list[int]) -> int:
        """Advance past the longest prefix of ``tokens`` the grammar allows (a resumed job's
        history), staying out of the error state; how many tokens that took."""
        m = self._matcher
        if m.is_error() or m.is_stopped():
            return 0
        if not self._spelled.keys() & set(tokens):
            return int(m.try_consume_tokens([int(t) for t in tokens]))
        taken = 0
        for token in tokens:  # (a special token is its text: taken whole or not at all)
            text = self._spelled.get(int(token), [int(token)])
            done = int(m.try_consume_tokens(text))
            if done < len(text):
                if done:
                    m.rollback(done)
                break
            taken += 1
        return taken
