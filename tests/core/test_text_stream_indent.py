"""llama-server's ``n_indent`` in the worker's TextStream (scheduler/worker/output.py): a line
after a new line whose indentation (spaces and tabs) is shorter than ``n_indent`` ends the text
there, as llama-server's ``process_token`` cuts ``generated_text`` (``erase(pos)``, ``pos`` the
line's first character that is not a space or a tab: the new line and the line's indentation
stay, the rest of the line goes). Nothing a client received is taken back, and nothing is held
for it: the indentation goes out whatever the line holds next."""

from __future__ import annotations

import codecs

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.worker.output import TextStream

from .test_text_stream import byte_pieces


def reference_cut(text: str, n_indent: int) -> tuple[str, bool]:
    """The rule on the whole text: (the text it leaves, whether it cut). Every line after a new
    line is checked, in order; its indentation ends at its first character that is neither a
    space nor a tab (a new line too: an empty line is under-indented, as in llama-server); a line
    with such a character and fewer than ``n_indent`` spaces and tabs before it is cut there. The
    first line (the rest of the cursor's line) is never checked."""
    if n_indent <= 0:
        return text, False
    nl = text.find("\n")
    while nl >= 0:
        pos = nl + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - (nl + 1) < n_indent:
            return text[:pos], True
        nl = text.find("\n", nl + 1)
    return text, False


def stream_of(pieces: list[bytes], n_indent: int, stop: list[str] | None = None, resumed: str = "") -> TextStream:
    return TextStream(pieces.__getitem__, stop, resumed, n_indent=n_indent)


def run(pieces: list[bytes], n_indent: int, stop: list[str] | None = None) -> tuple[list[str], TextStream]:
    stream = stream_of(pieces, n_indent, stop)
    out = [stream.push(t) for t in range(len(pieces))]
    out.append(stream.flush())
    return out, stream


def test_an_under_indented_line_ends_the_text_at_its_first_character() -> None:
    out, stream = run([b"x = 1\n", b"    y = 2\n", b"  z", b" = 3\n", b"    w\n"], 4)
    assert "".join(out) == "x = 1\n    y = 2\n  "
    assert out == ["x = 1\n", "    y = 2\n", "  ", "", "", ""]
    assert stream.stopped and stream.limited and stream.stop_word is None


def test_lines_indented_enough_and_the_first_line_are_not_cut() -> None:
    text = "x\n    a\n\tb\n     c\n\t\t\td"  # a tab counts as one, as llama-server counts it
    out, stream = run([text.encode()], 1)
    assert "".join(out) == text and not stream.stopped and not stream.limited
    out, stream = run([b"no new line at all"], 8)
    assert "".join(out) == "no new line at all" and not stream.limited


def test_the_indentation_is_not_held_it_goes_out_whatever_follows() -> None:
    """The text held for n_indent is none: the new line and the spaces after it stay in the
    text whether the line turns out indented enough or not (llama-server cuts after them)."""
    stream = stream_of([b"a\n", b"  ", b"  ", b"b", b"\n", b" ", b"c"], 4)
    assert [stream.push(t) for t in range(4)] == ["a\n", "  ", "  ", "b"]  # four: enough
    assert stream.push(4) == "\n" and stream.push(5) == " " and not stream.stopped
    assert stream.push(6) == "" and stream.stopped and stream.limited  # one space, then "c": cut
    assert stream.flush() == "" and stream.push(0) == ""  # nothing after the cut


def test_an_empty_line_is_under_indented_as_in_llama_server() -> None:
    """llama-server counts spaces and tabs from the line's start and cuts at the first other
    character when there are too few: the next new line is such a character."""
    out, stream = run([b"    a\n", b"\n", b"    b"], 4)
    assert "".join(out) == "    a\n" and stream.limited
    out, stream = run([b"    a\n  \n    b"], 4)  # spaces, then the line ends
    assert "".join(out) == "    a\n  " and stream.limited
    out, stream = run([b"    a\n      \n    b"], 4)  # indented enough before it ends: not cut
    assert "".join(out) == "    a\n      \n    b" and not stream.limited


def test_a_line_of_only_indentation_at_the_end_stays() -> None:
    out, stream = run([b"a\n", b"  "], 4)
    assert "".join(out) == "a\n  " and not stream.stopped  # no character after it: nothing to cut


def test_without_n_indent_nothing_is_cut() -> None:
    out, stream = run([b"a\nb\n c"], 0)
    assert "".join(out) == "a\nb\n c" and not stream.limited


def test_the_earlier_of_a_stop_string_and_an_under_indented_line_ends_the_text() -> None:
    out, stream = run([b"    a\n  b;c"], 4, [";"])  # the line comes first
    assert "".join(out) == "    a\n  " and stream.limited and stream.stop_word is None
    out, stream = run([b"    a;\n  b"], 4, [";"])  # the stop string comes first
    assert "".join(out) == "    a" and not stream.limited and stream.stop_word == ";"
    out, stream = run([b"    a\n  ", b"bx"], 4, ["bx"])  # a stop string at the cut: the stop string's
    assert "".join(out) == "    a\n  " and not stream.limited and stream.stop_word == "bx"


def test_a_stop_strings_start_held_goes_out_when_the_line_cuts_first() -> None:
    """Text held because it may begin a stop string goes out at the cut when it lies before it:
    the stop string cannot complete any more."""
    out, stream = run([b"    a\n", b" ", b"x"], 4, ["\n x;"])
    assert "".join(out) == "    a\n " and stream.limited
    assert out[0] == "    a" and out[2] == "\n "  # "\n " held while it may begin the stop string


def test_the_tokens_out_at_the_cut_are_those_with_text_before_it() -> None:
    stream = stream_of([b"a\n", b" b", b"c"], 2)
    stream.push(0)
    assert stream.push(1) == " " and stream.limited
    assert stream.tokens_out == 2  # " b": its space went out


def test_a_character_split_across_tokens_is_checked_once_whole() -> None:
    stream = stream_of([b"a\n", "\u00e9".encode()[:1], "\u00e9".encode()[1:]], 1)
    assert stream.push(0) == "a\n" and stream.push(1) == "" and not stream.stopped
    assert stream.push(2) == "" and stream.limited


def test_a_resumed_stream_goes_on_from_the_line_the_lost_worker_left() -> None:
    """A job submitted again after its worker was lost: the text already sent ended inside a
    line's indentation, or after a line that was checked."""
    stream = stream_of([b"  x"], 4, resumed="a\n  ")
    assert stream.push(0) == "  x" and not stream.stopped  # four spaces in all: two sent, two now
    stream = stream_of([b"x"], 4, resumed="a\n  ")
    assert stream.push(0) == "" and stream.limited  # two spaces, then "x"
    stream = stream_of([b"b\n", b"c"], 4, resumed="a\n    ")
    assert stream.push(0) == "b\n" and stream.push(1) == "" and stream.limited
    stream = stream_of([b"more"], 4, resumed="first line")
    assert stream.push(0) == "more" and not stream.stopped


# -- properties -----------------------------------------------------------------------------------

ALPHABET = "ab \t\n\r\u00e9\u4e2d;"


# text, its tokens' byte sizes in turn, n_indent
TEXTS = st.text(ALPHABET, max_size=60)
CUTS = st.lists(st.integers(1, 6), min_size=1, max_size=40)
INDENTS = st.integers(0, 5)


@settings(max_examples=500, deadline=None)
@given(text=TEXTS, cuts=CUTS, n_indent=INDENTS)
def test_any_text_in_any_tokens_comes_out_as_the_rule_cuts_the_whole_text(text: str, cuts: list[int], n_indent: int) -> None:
    """What goes out in all equals the rule on the whole text, and after every token what went
    out is the rule on the text decoded so far: nothing is held but a character's first bytes."""
    pieces = byte_pieces(text, cuts)
    stream = stream_of(pieces, n_indent)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoded = sent = ""
    for token, piece in enumerate(pieces):
        sent += stream.push(token)
        decoded += decoder.decode(piece)
        expected, cut = reference_cut(decoded, n_indent)
        assert sent == expected, (pieces, token)
        assert stream.stopped is cut and stream.limited is cut
        if cut:
            break
    sent += stream.flush()
    expected, cut = reference_cut(text, n_indent)
    assert sent == expected and stream.limited is cut, (pieces, n_indent)


class NaiveStream:
    """Stop strings and n_indent written plainly: on the text decoded so far, the earliest
    complete stop string and the first under-indented line; whichever begins first ends the text
    (a stop string at the very place of the cut wins: it is what ended it); otherwise hold back
    what may begin a stop string."""

    def __init__(self, stop: list[str], n_indent: int) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop, self.n_indent = [s for s in stop if s], n_indent
        self.text, self.sent = "", 0
        self.stopped = self.limited = False

    def push(self, piece: bytes, final: bool = False) -> str:
        if self.stopped:
            return ""
        self.text += self.decoder.decode(piece, final=final)
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        line, cut = reference_cut(self.text, self.n_indent)
        if hits and (not cut or min(hits) <= len(line)):
            self.stopped = True
            return self.text[self.sent : min(hits)]
        if cut:
            self.stopped = self.limited = True
            return self.text[self.sent : len(line)]
        keep = 0 if final else max((n for s in self.stop for n in range(1, len(s)) if self.text.endswith(s[:n])), default=0)
        end = max(self.sent, len(self.text) - keep)
        out, self.sent = self.text[self.sent : end], end
        return out


@settings(max_examples=400, deadline=None)
@given(text=TEXTS, cuts=CUTS, n_indent=INDENTS, stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3))
def test_with_stop_strings_the_stream_releases_what_the_plain_rule_says(text: str, cuts: list[int], n_indent: int, stops: list[str]) -> None:
    pieces = byte_pieces(text, cuts)
    ours, plain = stream_of(pieces, n_indent, stops), NaiveStream(stops, n_indent)
    for token, piece in enumerate(pieces):
        assert ours.push(token) == plain.push(piece), (stops, pieces, n_indent, token)
        assert (ours.stopped, ours.limited) == (plain.stopped, plain.limited)
    assert ours.flush() == plain.push(b"", final=True)
    assert (ours.stopped, ours.limited) == (plain.stopped, plain.limited)
