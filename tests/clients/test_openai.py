"""`gemma4rt serve` through the official OpenAI Python SDK (run by scripts/test-clients.sh).

The server must already run; the script passes its address and key in the environment:
  GEMMA4RT_BASE_URL  e.g. http://127.0.0.1:PORT
  GEMMA4RT_API_KEY   the key the server was started with (--api-key)
The model is the default Gemma 3 270M GGUF; greedy outputs below are what the engine produces
(`gemma4rt generate --temp 0`), e.g. " Paris" then a newline for CAPITALS.
"""

import os
import urllib.request

import openai
import pytest

BASE_URL = os.environ.get("GEMMA4RT_BASE_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("GEMMA4RT_API_KEY", "test-key")
CAPITALS = (
    "Question: What is the capital of Germany?\nAnswer: Berlin\n"
    "Question: What is the capital of France?\nAnswer:"
)


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].object == "model"
    return models[0].id


def test_models_lists_the_served_model(client, model):
    assert model.endswith(".gguf")
    assert client.models.list().data[0].owned_by == "gemma4rt"


def test_models_retrieve(client, model):
    m = client.models.retrieve(model)
    assert m.id == model and m.object == "model" and m.owned_by == "gemma4rt"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"


def test_chat_completion(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == model
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]  # llama-server style extension
    assert timings["predicted_n"] == r.usage.completion_tokens
    # prompt_n: tokens prefilled; cache_n: reused from a slot's KV cache (llama-server's meanings)
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens
    assert timings["cache_n"] == r.usage.prompt_tokens_details.cached_tokens


def test_next_turn_reuses_the_cached_prefix(client, model):
    """The second turn of a chat reuses the first's tokens from the slot's KV cache (at least its
    whole prompt), with the same greedy output as without reuse (cache_prompt false)."""
    messages = [{"role": "user", "content": "Name three rivers in Europe."}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And three in Asia?"}]
    reused = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert reused.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                           extra_body={"cache_prompt": False})
    assert plain.usage.prompt_tokens_details.cached_tokens == 0
    assert plain.choices[0].message.content == reused.choices[0].message.content


def test_completion_greedy_paris(client, model):
    r = client.completions.create(model=model, prompt=CAPITALS, max_tokens=2, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == " Paris\n"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 2


def test_chat_streaming_with_usage_equals_non_streamed(client, model):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.id == chunks[0].id for c in chunks)
    assert all(c.choices[0].finish_reason is None for c in content_chunks[:-1])
    assert content_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == whole.choices[0].message.content
    assert "\ufffd" not in text
    usage = chunks[-1]
    assert usage.choices == []
    assert usage.usage.total_tokens == whole.usage.total_tokens
    assert usage.usage.completion_tokens == whole.usage.completion_tokens


def test_completion_streaming_equals_non_streamed(client, model):
    whole = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=10, temperature=0)
    stream = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=10, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == whole.choices[0].text


def test_stop_strings(client, model):
    r = client.completions.create(model=model, prompt=CAPITALS, max_tokens=5, temperature=0, stop=["\n"])
    assert r.choices[0].text == " Paris"
    assert r.choices[0].finish_reason == "stop"
    straddling = client.completions.create(model=model, prompt=CAPITALS, max_tokens=5, temperature=0, stop="ris")
    assert straddling.choices[0].text == " Pa"
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count from 1 to 5."}], max_tokens=30, temperature=0, stop=["3"]
    )
    assert "3" not in chat.choices[0].message.content


def test_seed_reproducibility(client, model):
    kwargs = dict(model=model, prompt="Once upon a time", max_tokens=10, temperature=1.0, top_p=1.0, seed=4242)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b
    c = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tell me a word."}], max_tokens=6, temperature=1.2, seed=99
    ).choices[0].message.content
    d = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tell me a word."}], max_tokens=6, temperature=1.2, seed=99
    ).choices[0].message.content
    assert c == d


def test_logprobs(client, model):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=5, temperature=0)
    whole = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    shown = [e for e in content if e.token != "<end_of_turn>"]  # the end of turn has an entry, no text
    assert "".join(e.token for e in shown) == whole.choices[0].message.content
    for e in content:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 2
        assert e.top_logprobs[0].token == e.token  # greedy: the most likely one
        assert e.top_logprobs[0].logprob == e.logprob >= e.top_logprobs[1].logprob
        if not e.token.startswith("bytes:"):  # a byte of a character split over tokens
            assert bytes(e.bytes).decode() == e.token
    streamed = [
        e
        for c in client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2, stream=True)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert client.chat.completions.create(**kwargs).choices[0].logprobs is None
    r = client.completions.create(model=model, prompt=CAPITALS, max_tokens=2, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp.tokens == [" Paris", "\n"]
    assert lp.text_offset == [0, 6]
    assert all(len(t) == 3 and t[tok] == x == max(t.values()) for t, tok, x in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**kwargs, top_logprobs=2)
    assert e.value.param == "top_logprobs"


def test_echo_scores_a_text_as_lm_eval_does(client, model):
    # lm-evaluation-harness's loglikelihood request: the prompt echoed with its tokens' logprobs.
    r = client.completions.create(model=model, prompt=CAPITALS + " Paris", max_tokens=1, temperature=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(CAPITALS + " Paris")
    assert lp.tokens[0] == "<bos>" and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    paris = lp.tokens.index(" Paris")
    assert lp.text_offset[paris] == len(CAPITALS)
    assert -1.0 < lp.token_logprobs[paris] < 0  # the model expects Paris here
    assert all(x <= 0 for x in lp.token_logprobs[1:])


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=10**9), "max_tokens"),
        (dict(n=2), "n"),
        (dict(presence_penalty=5), "presence_penalty"),
        (dict(extra_body={"top_k": "many"}), "top_k"),
    ],
)
def test_bad_requests_name_the_parameter(client, model, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], **kwargs)
    assert e.value.status_code == 400
    assert e.value.param == param
    assert e.value.type == "invalid_request_error"


def test_bad_messages_and_prompt_too_long(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "wizard", "content": "hi"}])
    assert e.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="word " * 5000, max_tokens=1)
    assert e.value.code == "context_length_exceeded"
    assert e.value.param == "prompt"


def test_tools_on_gemma3_are_refused_saying_why(client, model):
    # Gemma 3 has no tool-call syntax of its own (Gemma 4 models declare and parse tools).
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], tools=[tool])
    assert e.value.param == "tools"
    assert "Gemma 3" in e.value.message and "tool" in e.value.message
    # tool_choice "none" without tools is a plain chat.
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       tool_choice="none")
    assert r.choices[0].finish_reason in ("stop", "length")


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    assert e.value.param == "model"


def test_wrong_api_key_is_unauthorized(model):
    bad = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 401
    # /health stays public.
    with urllib.request.urlopen(BASE_URL + "/health") as r:
        assert r.status == 200


def test_server_still_healthy_after_errors(client, model):
    r = client.completions.create(model=model, prompt=CAPITALS, max_tokens=1, temperature=0)
    assert r.choices[0].text == " Paris"
    req = urllib.request.Request(BASE_URL + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req) as m:
        text = m.read().decode()
    assert "gemma4rt_requests_total" in text
    assert "gemma4rt_time_to_first_token_seconds_bucket" in text
