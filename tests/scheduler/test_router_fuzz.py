"""Property-based fuzzing of the Ray router's HTTP layer (issue 17, Tests): the native server's fuzz
bodies (tests/native/test_http_fuzz.py: random types, ranges, unicode, NaN, huge numbers, broken
JSON) sent through the router to the package's 2 native replicas (conftest.py). Every answer is a
2xx or a 4xx whose JSON names the problem, never a 5xx; greedy victim streams running beside the
fuzzer, one after the other, each end with exactly their solo output and no retry; afterwards both
replicas are up. Bounded for CI: derandomized, 15 examples per endpoint."""

import json
import re
import threading

import httpx
from hypothesis import HealthCheck, given, settings

from tests.native.test_http_fuzz import chat_body, check_answer, completion_body, raw

VICTIM = {"prompt": "the router's victim stream: unharmed by the fuzzer ", "max_tokens": 120,
          "temperature": 0, "ignore_eos": True, "stream": True}


def _victim(url):
    """(text, [DONE] seen, retries) of one streamed greedy completion through the router."""
    text, done, meta = "", False, None
    with httpx.stream("POST", url + "/v1/completions", json=VICTIM, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith(": replayssm "):
                meta = json.loads(line[len(": replayssm "):])
            elif line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: "):])
                assert "error" not in chunk, chunk
                text += chunk["choices"][0]["text"]
    return text, done, meta["retries"] if meta else None


class Victims:
    """Victim streams one after the other until stopped; every result kept."""

    def __init__(self, url):
        self.url, self.results, self.errors = url, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                self.results.append(_victim(self.url))
            except Exception as e:   # asserted empty
                self.errors.append(repr(e))

    def finish(self):
        self.stop.set()
        self.thread.join(180)
        assert not self.thread.is_alive(), "a victim stream hung"
        return self.results, self.errors


_state = {}


FUZZ = settings(max_examples=15, deadline=60_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def test_solo_victim(cluster):
    text, done, retries = _victim(cluster["url"])
    assert done and len(text) == VICTIM["max_tokens"] and retries == 0
    _state["solo"] = text
    _state["victims"] = Victims(cluster["url"])   # from here on, beside every fuzzed request


@FUZZ
@given(body=raw(completion_body))
def test_fuzzed_completions_through_the_router(cluster, body):
    check_answer(cluster["url"], "/v1/completions", body, timeout=120)


@FUZZ
@given(body=raw(chat_body))
def test_fuzzed_chat_through_the_router(cluster, body):
    check_answer(cluster["url"], "/v1/chat/completions", body, timeout=120)


def test_victims_unharmed_and_router_healthy_after_the_fuzzing(cluster):
    results, errors = _state.pop("victims").finish()
    assert not errors, errors
    assert results, "no victim stream ran beside the fuzzer"
    for text, done, retries in results:
        assert done and retries == 0 and text == _state["solo"]
    assert httpx.get(cluster["url"] + "/health", timeout=10).status_code == 200
    text = httpx.get(cluster["url"] + "/metrics", timeout=10).text
    up = set(re.findall(r'^replayssm_router_replica_up\{replica="([^"]+)"\} 1', text, re.M))
    assert len(up) == 2, up
