"""Tool calls and thinking through the official OpenAI Python SDK (run by scripts/test-clients.sh).

The server is tests/scripted_serve.cc (gemma4rt_scripted_serve): the real HTTP server, request
layer and scheduler over a backend that replays tests/clients/tools_script.json, one reply per
request that reaches the engine, in this file's order. GEMMA4RT_SCRIPTED_URL is its address.
"""

import json
import os
import urllib.request

import openai
import pytest

URL = os.environ.get("GEMMA4RT_SCRIPTED_URL")
pytestmark = pytest.mark.skipif(not URL, reason="GEMMA4RT_SCRIPTED_URL not set (scripts/test-clients.sh sets it)")
MODEL = "scripted-gemma4"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def first_call(client):
    r = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[WEATHER])
    return r


def test_the_model_calls_a_tool(first_call):
    choice = first_call.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_") and len(call.id) == 29
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_the_tool_result_goes_back_and_the_model_answers(client, first_call):
    assistant = first_call.choices[0].message
    messages = [
        QUESTION,
        assistant.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": assistant.tool_calls[0].id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    # The prompt the server renders for this history (llama-server's /apply-template).
    body = json.dumps({"messages": messages, "tools": [WEATHER]}).encode()
    req = urllib.request.Request(URL + "/apply-template", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        prompt = json.load(resp)["prompt"]
    assert prompt.endswith(
        "<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>"
        "<|tool_response>response:get_weather{sky:<|\"|>clear<|\"|>,temperature:21}<tool_response|>"
        "<|channel>thought\n<channel|>"
    ), prompt
    assert "<|tool>declaration:get_weather{" in prompt
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "It is 21 degrees and clear in Paris."
    assert not r.choices[0].message.tool_calls


def test_streamed_thinking_and_parallel_calls(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
        tools=[WEATHER],
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.id or ""
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Two cities: two calls."
    assert content == ""
    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert json.loads(calls[1]["arguments"]) == {"city": "Rome"}  # written (city=Rome): a drift
    assert calls[0]["id"] != calls[1]["id"]


def test_text_that_is_no_call_stays_content(client):
    r = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[WEATHER])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "<|tool_call>call:{oops}<tool_call|>"
    assert not r.choices[0].message.tool_calls


def test_tool_choice_required_starts_the_reply_inside_a_call(client):
    # The prompt ends with "<|tool_call>call:"; the scripted reply goes on from there.
    r = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
