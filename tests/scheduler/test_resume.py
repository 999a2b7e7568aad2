"""The body of each attempt of a routed request (scheduler/resume.py, issue 17 item 11), without Ray:
exact resume from token ids on the native engine, text resume on SGLang (a completion without
max_tokens resumes with the rest of the default 16; a ["text"] prompt is one text; a token-id prompt
cannot be extended by text and says so)."""

import pytest

from sglang_replayssm.scheduler.resume import ResumeError, attempt_body

SENT = {"text": "abc", "tokens": 3, "token_ids": [97, 98, 99]}


def test_first_attempt_streams_and_asks_native_engines_for_token_ids():
    b = attempt_body("completions", {"prompt": "hi", "n": 1}, "native")
    assert b["stream"] is True and b["return_token_ids"] is True and "n" not in b and "replayssm_resume" not in b
    assert "return_token_ids" not in attempt_body("completions", {"prompt": "hi"}, "sglang")


@pytest.mark.parametrize("kind, body", [
    ("completions", {"prompt": "hi"}),                       # no max_tokens: the engine's default applies
    ("completions", {"prompt": [256, 104, 105], "max_tokens": 9}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_native_resume_sends_the_original_request_and_the_delivered_ids(kind, body):
    b = attempt_body(kind, body, "native", SENT)
    assert b["replayssm_resume"] == {"token_ids": [97, 98, 99], "text_chars": 3}
    assert {k: v for k, v in b.items() if k in body} == body   # prompt, messages and max_tokens unchanged


def test_sglang_text_resume():
    b = attempt_body("completions", {"prompt": "hi"}, "sglang", SENT)
    assert (b["prompt"], b["max_tokens"]) == ("hiabc", 13)
    b = attempt_body("completions", {"prompt": ["hi"], "max_tokens": 5}, "sglang", SENT)
    assert (b["prompt"], b["max_tokens"]) == ("hiabc", 2)
    b = attempt_body("chat", {"messages": [{"role": "user", "content": "q"}]}, "sglang", SENT)
    assert b["messages"][-1] == {"role": "assistant", "content": "abc"} and b["continue_final_message"]
    assert "max_tokens" not in b   # runs to the context, as the uncut chat would
    with pytest.raises(ResumeError, match="token ids"):
        attempt_body("completions", {"prompt": [1, 2, 3]}, "sglang", SENT)


def test_the_native_engine_continues_a_resumed_answer_exactly():
    """Engine.add_request(resume=(ids delivered, characters delivered)): the rest of the events' text
    and the final ids are the uncut request's, max_tokens counting the delivered ids."""
    from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

    engine = Engine(EngineArgs(max_running_requests=1, max_model_len=64))
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=("zzz",))

    def run(**kw):
        req = engine.add_request("resume me: ", params, **kw)
        events = []
        while engine.has_work():
            events += [e for e in engine.step() if e["rid"] == req.rid]
        return req, events

    full, events = run()
    k = 7
    upto = [e for e in events if sum(len(x["token_ids"]) for x in events[:events.index(e) + 1]) <= k]
    delivered = "".join(e["text"] for e in upto)
    ids = [t for e in upto for t in e["token_ids"]]
    assert len(ids) == k
    resumed, rest = run(resume=(ids, len(delivered)))
    assert resumed.output == full.output and len(resumed.output) == 20
    assert delivered + "".join(e["text"] for e in rest) == "".join(e["text"] for e in events)
    assert rest[-1]["completion_tokens"] == 20 and rest[-1]["finish_reason"] == "length"
