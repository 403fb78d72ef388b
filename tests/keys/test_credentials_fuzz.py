"""Fuzz: whatever a client puts in its headers, the key it presented is a well-formed candidate
or none, never an exception, and only the exact secret finds its key."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from keys.credentials import digest_of, digests_match, new_secret, secret_from_headers
from keys.snapshot import Key, Snapshot

FAST = settings(max_examples=300, deadline=None)
OWS = " \t"  # what HTTP trims around a header's value

# header values as the server hands them over: bytes decoded as Latin-1 (api/consumers.py, edge.py)
latin1 = st.text(st.characters(max_codepoint=0xFF), max_size=40)
schemes = st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Token", "", "Bearer\t", "Bearer\xa0"])
authorizations = latin1 | st.builds(lambda s, sep, v: s + sep + v, schemes, st.sampled_from([" ", "  ", "\t", ""]), latin1)
headers = st.fixed_dictionaries({}, optional={"authorization": authorizations, "x-api-key": latin1, "cookie": latin1})
secret_chars = st.text(string.ascii_letters + string.digits + "-_.~+/=", min_size=1, max_size=50)
SECRET = new_secret()
SNAPSHOT = Snapshot(version=1, keys_by_digest={digest_of(SECRET): Key(id=1, name="alice", digest=digest_of(SECRET))})


@FAST
@given(headers)
def test_any_headers_give_a_well_formed_candidate_or_none(sent: dict[str, str]) -> None:
    candidate = secret_from_headers(sent)
    if candidate is None:
        return
    # trimmed of what HTTP trims (spaces, tabs) and no more: a secret's UTF-8 may end in a byte
    # that Latin-1 calls whitespace (0xA0, 0x85), and that byte is part of it
    assert isinstance(candidate, str) and candidate and candidate == candidate.strip(OWS)
    # it came from one of the two headers, never from elsewhere
    assert candidate in sent.get("authorization", "") or candidate in sent.get("x-api-key", "")
    # and the lookup it goes to takes it without an exception
    digest = digest_of(candidate)
    assert len(digest) == 64 and digests_match(digest, digest)
    assert SNAPSHOT.lookup(candidate) is None or candidate == SECRET


@FAST
@given(headers)
def test_an_empty_or_blank_presentation_is_no_key(sent: dict[str, str]) -> None:
    auth = sent.get("authorization", "").strip(OWS)
    bearer = auth.partition(" ")[0].lower() == "bearer" and auth.partition(" ")[2].strip(OWS)
    if not bearer and not sent.get("x-api-key", "").strip(OWS):
        assert secret_from_headers(sent) is None


@FAST
@given(secret_chars, st.sampled_from(["Bearer", "bearer", "BeArEr"]), st.text(" ", min_size=1, max_size=3), st.none() | latin1)
def test_a_bearer_token_is_the_key_whatever_x_api_key_holds(token: str, scheme: str, gap: str, other: str | None) -> None:
    sent = {"authorization": f"{scheme}{gap}{token} "}
    if other is not None:
        sent["x-api-key"] = other
    assert secret_from_headers(sent) == token


@FAST
@given(secret_chars, st.none() | st.sampled_from(["", " ", "Basic dXNlcjpwdw==", "Bearer", "Bearer   "]))
def test_x_api_key_is_the_key_without_a_bearer_token(token: str, auth: str | None) -> None:
    sent = {"x-api-key": f" {token}\t"}
    if auth is not None:
        sent["authorization"] = auth
    assert secret_from_headers(sent) == token


@FAST
@given(latin1)
def test_only_the_exact_secret_finds_its_key(noise: str) -> None:
    for sent in ({"authorization": f"Bearer {SECRET}{noise}"}, {"x-api-key": noise + SECRET}):
        candidate = secret_from_headers(sent)
        found = SNAPSHOT.lookup(candidate) if candidate is not None else None
        assert (found is not None) == (candidate == SECRET)
