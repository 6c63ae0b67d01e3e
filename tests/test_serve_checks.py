"""genlm serve's pieces without a server: the token's scheme and sources, the Host names,
the strict JSON and request models, the cap on the bodies read at once, the phase stamps that tile a round trip, and the
histograms /metrics renders. Oracles: hand-written expectations."""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from genlm_core.serve.bodies import OpenBodies, read_body
from genlm_core.serve.inputs import HTTPError, SampleRequest, TokenizeRequest, parse_json
from genlm_core.serve.limits import TOKEN_ENV, ServeLimits, read_token, token_matches
from genlm_core.serve.phases import ROUND_TRIP, ForwardClock, Histogram, RequestClock, round_trip_phases
from genlm_core.serve.security import RequestGuard, allowed_host_names, parse_host

TOKEN = "0123456789abcdef-token"


def test_the_bearer_scheme_in_any_case_and_nothing_else() -> None:
    assert token_matches(None, None)  # no token set: everything passes
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER  {TOKEN} "):
        assert token_matches(TOKEN, header), header
    for header in (TOKEN, f"Token {TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN}x", "", None):
        assert not token_matches(TOKEN, header), header


def test_the_token_sources(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert read_token(None, None) == TOKEN
    monkeypatch.delenv(TOKEN_ENV)
    assert read_token(None, None) is None
    f = tmp_path / "t"
    f.write_text(TOKEN + "\n")
    os.chmod(f, 0o600)
    assert read_token(None, str(f)) == TOKEN
    os.chmod(f, 0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        read_token(None, str(f))
    with pytest.raises(ValueError, match="give the token once"):
        read_token(TOKEN, str(f))
    assert read_token(TOKEN, None) == TOKEN
    assert "visible to every user" in capsys.readouterr().err


def test_host_names() -> None:
    assert parse_host("[::1]:8765") == ("::1", 8765) and parse_host("Example.COM.:80") == ("example.com", 80)
    assert parse_host("127.0.0.1") == ("127.0.0.1", None) and parse_host("localhost:1") == ("localhost", 1)
    hosts = allowed_host_names("127.0.0.1", ["box.internal"])
    assert {"127.0.0.1", "localhost", "::1", "box.internal"} <= hosts and "attacker.example" not in hosts
    guard = RequestGuard(None, hosts=hosts, any_ip=False, token=None, media_types={"/p": "application/json"})

    def scope(**headers: str) -> dict:
        raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        return {"type": "http", "method": "POST", "path": "/p", "headers": raw}

    assert guard.problem(scope(host="localhost:9", content_type="application/json")) is None
    assert guard.problem(scope(host="rebind.example:9", content_type="application/json"))[0] == 403
    assert guard.problem(scope(host="10.1.2.3", content_type="application/json"))[0] == 403
    assert guard.problem(scope(host="localhost", content_type="text/plain"))[0] == 415
    own = scope(host="localhost:9", origin="http://localhost:9", content_type="application/json")
    assert guard.problem(own) is None
    other_port = scope(host="localhost:9", origin="http://localhost:3000", content_type="application/json")
    assert guard.problem(other_port)[0] == 403
    wild = RequestGuard(None, hosts=hosts, any_ip=True, token=None, media_types={})
    assert wild.problem(scope(host="10.1.2.3")) is None and wild.problem(scope(host="x.example"))[0] == 403


@pytest.mark.parametrize(
    ("host", "fault"),
    [
        ("localhost:evil.com", "port 'evil.com'"),
        ("localhost:18765@evil.com", "port '18765@evil.com'"),
        ("[::1]evil.com", "'evil.com' follows ']'"),
        ("localhost..", "not a host name"),
        ("localhost:8765:1", "port '8765:1'"),
        ("[::1", "no ']' closes"),
        ("[localhost]:1", "not an IPv6 address"),
        ("::1", "in brackets"),
        ("localhost:65536", "port '65536'"),
        ("", "no Host"),
    ],
)
def test_a_host_that_is_not_exactly_host_port_is_refused(host, fault) -> None:
    """The whole header is parsed (RFC 3986 host, RFC 7230 ``host[:port]``): a header that
    starts with an allowed name but goes on otherwise is a 403 naming the fault, never the
    name it started with."""
    with pytest.raises(ValueError, match=re.escape(fault)):
        parse_host(host)
    guard = RequestGuard(None, hosts=allowed_host_names("127.0.0.1"), any_ip=True, token=None, media_types={})
    status, message, kind = guard.problem({"type": "http", "method": "GET", "path": "/v1/stats",
                                           "headers": [(b"host", host.encode())]})  # fmt: skip
    assert (status, kind) == (403, "HostNotAllowed") and fault in message and "HOST[:PORT]" in message


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"[" * 100000, "nested too deeply"),
        (b'{"a": NaN}', "NaN"),
        (b"[1]", "JSON object"),
        (b"\xff", "not JSON"),
    ],
)
def test_strict_json(body, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_json(body)


def test_a_sample_request_names_every_bad_field() -> None:
    with pytest.raises(ValueError) as err:
        SampleRequest.parse(
            {"prompts": [[1, True]], "max_tokens": -1, "temperature": 1e999, "x": 0}, "sample"
        )
    for field in ("'prompts.0.1'", "'max_tokens'", "'temperature'", "'x'"):
        assert field in str(err.value)
    ok = SampleRequest.parse({"prompts": [[1]], "max_tokens": 2, "temperature": 0, "seed": -5}, "sample")
    assert ok.temperature == 0.0 and ok.seed == -5 and ok.batch


def test_tokenize_text_is_characters_not_lone_surrogates() -> None:
    """JSON's \\ud800 escape decodes to a lone surrogate, which no tokenizer takes: a 400
    naming the field and the code point, before any tokenizer sees it."""
    for raw, at in (
        (b'{"text": "\\ud800"}', "U+D800 at character 0"),
        (b'{"text": "ab\\udfff"}', "U+DFFF at character 2"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"field 'text': Value error, lone surrogate {at}")):
            TokenizeRequest.parse(parse_json(raw), "tokenize")
    pair = TokenizeRequest.parse(parse_json(b'{"text": "\\ud83d\\ude00"}'), "tokenize")
    assert pair.text == "\U0001f600"  # an escaped pair is one character


def test_the_phases_tile_a_round_trip() -> None:
    stamps = {"entry": 1.5, "decoded": 1.6, "released": 1.9, "first_start": 2.0, "last_end": 3.0,
              "rows": 3.1, "encoded": 3.3}  # fmt: skip
    parts = round_trip_phases(1.0, 1.2, 3.7, 4.0, stamps)
    assert list(parts) == list(ROUND_TRIP)
    assert sum(parts.values()) == pytest.approx(3.0, abs=1e-12)  # done - start
    assert parts["request_transport"] == pytest.approx(0.3) and parts["computing"] == pytest.approx(1.0)
    assert parts["response_transport"] == pytest.approx(0.4) and parts["held"] == pytest.approx(0.3)
    # another host's clock (the entry outside the round trip) or no stamps: all transport
    for bad in ({**stamps, "entry": 99.0}, None, {"entry": 1.5}):
        parts = round_trip_phases(1.0, 1.2, 3.7, 4.0, bad)
        assert parts["request_transport"] == pytest.approx(2.5) and parts["computing"] == 0.0


def test_a_request_owns_the_passes_between_its_release_and_its_rows() -> None:
    clock = ForwardClock()
    clock.record(0.5, 1.5, 8)  # started before the request was released: someone else's
    clock.record(2.0, 3.0, 16)
    clock.record(3.0, 3.5, 4)
    req = RequestClock()
    req.released, req.rows = 1.0, 3.6
    req.attribute(clock)
    assert (req.first_start, req.last_end) == (2.0, 3.5)
    cached = RequestClock()
    cached.released, cached.rows = 4.0, 4.1
    cached.attribute(clock)  # no pass of its own: every row from a cache
    assert cached.phases()["computing"] == 0.0 and cached.phases()["queued"] == 0.0
    assert clock.stats()["passes"] == 3 and clock.busy_s == pytest.approx(2.5)
    assert clock.rows.as_dict()["buckets"]["8"] == 2 and clock.rows.count == 3 and clock.rows.sum == 28


def test_a_histogram_is_cumulative_with_an_infinite_bucket() -> None:
    h = Histogram([1, 10])
    for v in (0.5, 1, 5, 50):
        h.observe(v)
    assert h.cumulative() == [(1, 2), (10, 3), (float("inf"), 4)]
    assert h.as_dict()["buckets"] == {"1": 2, "10": 3, "+Inf": 4} and h.sum == 56.5


class _Body:
    """A request whose body is ``chunks``, then (before its end) waits for ``more``."""

    def __init__(self, chunks: list[bytes], more: asyncio.Event) -> None:
        self.headers: dict[str, str] = {}
        self.chunks, self.more = chunks, more

    async def stream(self):  # type: ignore[no-untyped-def]
        for chunk in self.chunks:
            yield chunk
        await self.more.wait()
        yield b""


@pytest.mark.parametrize(("count", "total"), [(2, 1 << 20), (10, 2048)])
async def test_the_bodies_read_at_once_make_room_from_the_idlest(count, total) -> None:
    """At most ``count`` bodies of ``total`` bytes together: a third body (by count, or by
    bytes) takes the place of the one idle longest, which gets a 408 naming the limits;
    the others are read whole."""
    limits = ServeLimits(max_body_bytes=1024, max_open_bodies=count, max_open_body_bytes=total)
    bodies = OpenBodies(count, total)
    more = asyncio.Event()
    reads = []
    for i in range(3):
        reads.append(asyncio.create_task(read_body(_Body([bytes([i]) * 1000], more), limits, bodies)))
        await asyncio.sleep(0.05)  # each idle from a later time than the one before
    more.set()
    first, *others = await asyncio.gather(*reads, return_exceptions=True)
    assert isinstance(first, HTTPError) and first.status == 408, first
    assert "dropped to make room" in first.message and "--max-open-bodies" in first.message
    assert others == [b"\x01" * 1000, b"\x02" * 1000]
    assert bodies.stats() == {"open": 0, "bytes": 0, "dropped": {"room": 1}}


def test_one_body_of_the_largest_size_fits_in_the_bodies_read_at_once() -> None:
    with pytest.raises(ValueError, match="raise --max-open-body-bytes or lower --max-body-bytes"):
        ServeLimits(max_body_bytes=4096, max_open_body_bytes=2048)


def test_a_served_backend_keeps_its_output_cache_in_host_memory() -> None:
    """``genlm serve`` loads its backend with ``cache_to_cpu=True`` unless told otherwise
    (every client's rows would sit in GPU memory beside the model's KV buffers)."""
    import genlm_core
    from genlm_core.serve.run import served_backend_options

    assert served_backend_options("mock", {"model": "m"}) == {"model": "m", "cache_to_cpu": True}
    assert served_backend_options("mock", {"cache_to_cpu": False}) == {"cache_to_cpu": False}
    llm = genlm_core.load("mock", **served_backend_options("mock", {}))
    try:
        assert llm.output_cache.to_cpu is True
        row = llm.next_token_logprobs_sync([1, 2])
        assert llm.next_token_logprobs_sync([1, 2]).equal(row)
    finally:
        llm.close()


def test_a_request_with_two_host_headers_is_a_bad_request() -> None:
    """RFC 7230 section 5.4: a request carrying more than one Host is answered 400, whatever
    the first one names (a check reading only one of them lets the other through to
    whatever reads it next: a proxy, a log, a handler)."""
    guard = RequestGuard(
        None, hosts=allowed_host_names("127.0.0.1"), any_ip=False, token=None, media_types={}
    )

    def scope(*hosts: str) -> dict:
        return {"type": "http", "method": "GET", "path": "/v1/stats",
                "headers": [(b"host", h.encode()) for h in hosts]}  # fmt: skip

    assert guard.problem(scope("127.0.0.1:9")) is None
    for hosts in (("127.0.0.1:9", "evil.com"), ("evil.com", "127.0.0.1:9"), ("127.0.0.1:9", "127.0.0.1:9")):
        status, message, kind = guard.problem(scope(*hosts))
        assert (status, kind) == (400, "BadRequest"), hosts
        assert "2 Host headers" in message and "RFC 7230" in message, message
