"""Servers that fail in ugly ways: a grammar that kills llama.cpp's server (real server), a
deterministic HTTP 500 (real server) told from a passing one (FAKE server: a real one cannot be
made to fail once on demand), HTML where JSON was expected, and ``Retry-After`` as a date."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from grouppref.models.served.grammar import GrammarError, check_grammar
from grouppref.models.served.pool import ServerError, ServerPool, ServerUnreachable
from grouppref.models.served.protocol import CHAT, RequestRefused, error_message, retry_after_seconds
from grouppref.models.served.settings import ServerSettings
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.stage import run_rank
from tests.support.cli import grouppref_here
from tests.support.factories import imported_run
from tests.support.fake_http import JsonHandler, chat_completion, serve
from tests.support.judges import GROUPS, _judge
from tests.support.llama_server import MODEL_ALIAS, posted_bodies, running_llama_server
from tests.support.paths import REPO

REPO = REPO
BODY = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Say yes."}],
        "max_tokens": 2}
# grammars llama.cpp's parser takes (json.gbnf's string rule, repetitions, classes, comments)
GOOD = ['root ::= ("yes" | "no")', 'root ::= "a"{2,3} [^a] .', 'root ::= (\n  "a"\n  | "b"\n) # c',
        'root ::= "\\"" ([^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}))* '
        '"\\""', 'root ::= x\nx ::= "\\u00e9"+ "!"?']
# and what it refuses (each message as llama.cpp's, where it has one)
BAD = {'root ::= ("yes" | "no"': "expecting ')'", "root ::= foo": "undefined rule 'foo'",
       'x ::= "a"': "no 'root' rule", "root ::= [a-": "unexpected end of input",
       'root := "a"': "expecting ::=", 'root ::= "a" # c\n  | "b"': "expecting name at line 2",
       'root ::= "\\q"': "unknown escape", 'root ::= "a"{3,1}': "min > max",
       'root ::= *"a"': "expecting preceding item"}


def test_grammar_check_follows_llama_cpp_parser(llama_server: str) -> None:
    """Every grammar the check lets through, the real server answers. Each one it refuses was
    sent to llama-cpp-python 0.3.x's server by hand when the check was written: its parser
    refused each one and the server died (SIGSEGV), but ``{3,1}``, on which it hangs; the next
    test sends one of them again."""
    for grammar, message in BAD.items():
        with pytest.raises(GrammarError, match=re.escape(message)):
            check_grammar(grammar)
    settings = ServerSettings(base_url=llama_server, max_retries=0)
    with ServerPool({llama_server: settings}) as pool:
        answers = pool.post(llama_server, CHAT, [{**BODY, "grammar": g} for g in GOOD])
    for grammar, answer in zip(GOOD, answers, strict=True):
        check_grammar(grammar)
        assert isinstance(answer, dict) and answer["choices"], grammar
    with pytest.raises(ValueError, match=r"server_params grammar: undefined rule 'foo'.*crashes"):
        ServerSettings(server_params={"grammar": "root ::= foo"})
    ServerSettings(server_params={"grammar": {"type": "json", "value": {}}})  # TGI's form


def test_a_bad_grammar_on_the_command_line_is_one_line_before_any_request(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_id": "a", "prompt": "Say yes."}\n')
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    cli = grouppref_here("generate", "--prompts", prompts, "--out", tmp_path / "run", "--model",
                         "openai:m@http://127.0.0.1:9/v1", "--server-param",
                         'grammar=root ::= ("yes" | "no"', env=env)  # cli.main() in this process
    assert cli.returncode == 2 and cli.stderr.strip() == (
        "error: generate: --server-param: server_params grammar: expecting ')' at line 1 "
        "(llama.cpp's GBNF; a grammar its parser refuses crashes llama-cpp-python's server)")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_grammar_that_kills_the_server_is_named(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A left-recursive grammar passes the syntax check and kills llama-cpp-python's server
    (SIGSEGV) at the judge's first question: the rank stage stops before it opens, with one
    line naming ``grammar`` and the crash; at the pool, a grammar that does not parse does the
    same."""
    store = imported_run(tmp_path, GROUPS)
    params = {"grammar": 'root ::= root "a" | "Yes"'}
    with running_llama_server(tmp_path / "s1.log") as server:
        config = RankConfig(rankers=[_judge(server.base_url, server={
            "server_params": params, "max_retries": 1})])
        with posted_bodies(monkeypatch) as bodies, pytest.raises(ServerUnreachable) as raised:
            run_rank(store, config)
        assert server.process.wait(timeout=30) != 0  # the grammar killed it
    message = str(raised.value)
    assert "\n" not in message and len(bodies) == 2 and bodies[0]["grammar"] == params["grammar"]
    assert "stopped answering after requests that carried grammar: a bad value there can " \
           "crash a llama.cpp server" in message
    assert store.manifest("rank") is None
    with running_llama_server(tmp_path / "s2.log") as server:
        url = server.base_url
        with ServerPool({url: ServerSettings(base_url=url, max_retries=1)},
                        backoff=(0.01, 0.01)) as pool:
            with pytest.raises(ServerUnreachable, match="carried grammar: a bad value"):
                pool.post(url, CHAT, [{**BODY, "grammar": "root ::= foo"}])
            [usage] = pool.usage()
    assert (usage.requests, usage.failures) == (2, {"connection": 2})


def test_a_deterministic_500_is_refused_at_the_second_answer(llama_server: str) -> None:
    """A ``logit_bias`` key that is not a token id: llama-cpp-python answers the same HTTP 500
    each time; the request is refused after the second answer, not retried for seconds."""
    settings = ServerSettings(base_url=llama_server, max_retries=5)
    with ServerPool({llama_server: settings}) as pool:
        [refused] = pool.post(llama_server, CHAT, [{**BODY, "logit_bias": {"abc": 5}}])
        [usage] = pool.usage()
    assert isinstance(refused, RequestRefused)
    assert "HTTP 500: invalid literal for int() with base 10: 'abc'" in str(refused)
    assert "the same HTTP 500 answer twice" in str(refused) and "\n" not in str(refused)
    assert (usage.requests, usage.retried, usage.refused, usage.failures) == (2, 1, 1, {"500": 2})


def test_a_deterministic_500_from_server_params_stops_the_judge_at_once(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the rank stage: the first question and the probe are each answered the same 500
    twice (4 requests), and the one-line error names the server_params field they carried."""
    store = imported_run(tmp_path, GROUPS)
    config = RankConfig(rankers=[_judge(llama_server, server={
        "server_params": {"logit_bias": {"abc": 5}}})])
    with posted_bodies(monkeypatch) as bodies, pytest.raises(ServerError) as raised:
        run_rank(store, config)
    message = str(raised.value)
    assert len(bodies) == 4 and "\n" not in message
    assert "invalid literal for int() with base 10: 'abc'" in message
    assert "it carried logit_bias from server_params: check their values" in message
    assert store.manifest("rank") is None


def _flaky(answers: list[tuple[int, str]]) -> type[JsonHandler]:
    """A FAKE server answering POSTs with ``answers`` (status, raw body) in turn, then 200."""
    class Flaky(JsonHandler):
        models = ("fake",)
        posts: list[dict[str, Any]] = []

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.posts.append(self.read_json())
            if len(self.posts) > len(answers):
                self.send_json(chat_completion("ok", None))
                return
            status, text = answers[len(self.posts) - 1]
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Flaky


@pytest.mark.parametrize(("answers", "refused"), [
    ([(500, '{"error": {"message": "CUDA error"}}'), (500, '{"error": {"message": "busy"}}')],
     False),
    ([(500, ""), (500, "")], False),  # no body: nothing tells a fault from a bad request
    ([(500, '{"error": {"message": "bad key"}}')] * 2, True),
    ([(503, '{"error": {"message": "overloaded"}}')] * 2, False),  # only 500 can be a verdict
])
def test_a_passing_500_is_retried_and_a_repeated_one_refused(
        answers: list[tuple[int, str]], refused: bool) -> None:
    handler = _flaky(answers)
    with serve(handler) as url:
        with ServerPool({url: ServerSettings(base_url=url, max_retries=3)},
                        backoff=(0.01, 0.01)) as pool:
            [answer] = pool.post(url, CHAT, [{"model": "fake", "messages": []}])
            [usage] = pool.usage()
    assert isinstance(answer, RequestRefused) is refused
    assert len(handler.posts) == usage.requests == 2 + (not refused)
    if refused:
        assert str(answer).endswith("HTTP 500: bad key (the same HTTP 500 answer twice: an "
                                    "error in the request, not a passing fault)")


def _html(status: int) -> type[JsonHandler]:
    class Html(JsonHandler):
        page = (b"<!DOCTYPE html><html><head><title>Bad Gateway</title><style>h1{x:y}</style>"
                b"</head><body><h1>502 Bad Gateway</h1><hr>nginx</body></html>")

        def do_GET(self) -> None:  # noqa: N802 - a web UI where the API was expected
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(self.page)

    return Html


def test_html_instead_of_json_names_the_base_url() -> None:
    with serve(_html(200)) as url:
        with ServerPool({url: ServerSettings(base_url=url)}) as pool:
            with pytest.raises(ServerError, match=r"the answer is not JSON \('<!DOCTYPE html>.*"
                                                  r"is the base URL an OpenAI-compatible API"):
                pool.check_model(url, "m")
    page = _html(502).page.decode()
    assert error_message(502, page) == "HTTP 502: Bad Gateway 502 Bad Gateway nginx"


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    from email.utils import formatdate

    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    # a date 60 s ahead: what is left is 60 s less the time the call itself took (measured
    # here, so a stalled machine cannot fail it) and the date's 1 s resolution
    before = time.time()
    left = retry_after_seconds(formatdate(before + 60, usegmt=True))
    assert 60 - (time.time() - before) - 1 <= left <= 60
    assert retry_after_seconds("later") is None
