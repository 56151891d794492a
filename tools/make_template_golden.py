#!/usr/bin/env python3
"""Render golden chat prompts for tests/chat_template_test.cc with the official Jinja templates.

Development-only tool. It needs `jinja2` (3.1.6 was used); when `transformers` is importable
(5.24.0 was used) every case is also rendered through transformers' own
`render_jinja_template` (the function `apply_chat_template(..., tokenize=False)` calls) and the two
renderings must agree byte for byte. Nothing is downloaded. Run from the repository root:

    python3 tools/make_template_golden.py          # rewrites tests/data/chat_template_golden.json
    python3 tools/make_template_golden.py --check  # exits 1 if the file on disk is stale

Template texts (tools/templates/, first line = a provenance header that is stripped here):
  gemma3_chat_template.jinja  Google's Gemma 3 IT template, from huggingface/transformers
                              models/gemma3/convert_gemma3_weights.py (_CHAT_TEMPLATE).
  gemma4_chat_template.jinja  Google's Gemma 4 31B-it template, from ggml-org/llama.cpp
                              models/templates/google-gemma-4-31B-it-interleaved.jinja.

The Jinja environment copies what transformers configures for chat templates
(utils/chat_template_utils.py `_compile_jinja_template`): ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True, the loopcontrols extension, a `raise_exception` global that
raises TemplateError. The template variables are the ones `apply_chat_template` passes: messages,
tools=None, documents=None, add_generation_prompt, the tokenizer's special tokens (bos_token "<bos>",
eos_token "<eos>", unk_token "<unk>", pad_token "<pad>") and, only when a case sets it,
enable_thinking (omitted means "not passed", which the Gemma 4 template treats like false).

Error cases record the message of the exception and, for per-message errors, the index of the first
message that makes the template raise, found by rendering growing prefixes of the conversation
(independent of how the C++ renderer decides). Multimodal content parts are out of scope.

Tool cases (TOOL_CASES, written to tests/data/chat_template_tools_golden.json) hold OpenAI-shaped
requests: `tools` and messages with assistant `tool_calls` (arguments as JSON text) and `tool`
messages. The Gemma 4 template reads calls' arguments as mappings and results as `tool_responses`
on the model message, so each case is first turned into the template's shapes by
`openai_to_gemma4` (the rules the C++ renderer documents in chat_template.h), then rendered.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = {
    "gemma3": {
        "file": "tools/templates/gemma3_chat_template.jinja",
        "source": "huggingface/transformers src/transformers/models/gemma3/convert_gemma3_weights.py "
        "_CHAT_TEMPLATE @ c1a83acdb3fd77f2e897215d94a5ceaf05c885f1 (= google/gemma-3-*-it "
        "tokenizer_config.json chat_template)",
    },
    "gemma4": {
        "file": "tools/templates/gemma4_chat_template.jinja",
        "source": "ggml-org/llama.cpp models/templates/google-gemma-4-31B-it-interleaved.jinja @ "
        "3240d8f92c08e9db0be78358b29e06a1f531fe33 (Google's gemma-4-31B-it chat template)",
    },
}
OUT = "tests/data/chat_template_golden.json"
TOOLS_OUT = "tests/data/chat_template_tools_golden.json"
SPECIAL_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}


def U(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# (name, template, messages, add_generation_prompt, enable_thinking or None for "not passed")
CASES = [
    # ---------------- Gemma 3 ----------------
    ("g3_single_user", "gemma3", [U("user", "Hello")], True, None),
    ("g3_single_user_no_generation_prompt", "gemma3", [U("user", "Hello")], False, None),
    ("g3_system_user", "gemma3", [U("system", "You are a helpful assistant."), U("user", "Hi")], True, None),
    ("g3_system_not_trimmed_user_trimmed", "gemma3",
     [U("system", "  Be brief.  \n"), U("user", "  hi there \t\n")], True, None),
    ("g3_multi_turn", "gemma3",
     [U("user", "What is 2+2?"), U("assistant", "4."), U("user", "And 3+3?"), U("assistant", "6."),
      U("user", "Thanks!")], True, None),
    ("g3_system_multi_turn", "gemma3",
     [U("system", "Answer in French."), U("user", "Hello"), U("assistant", "Bonjour"),
      U("user", "Goodbye")], True, None),
    ("g3_model_role_alias", "gemma3", [U("user", "Hi"), U("model", "Hello!"), U("user", "Bye")], True, None),
    ("g3_whitespace_trim", "gemma3",
     [U("user", "  \n Hello there \t\n"), U("assistant", "\n\nSure.  "), U("user", "   ok")], True, None),
    ("g3_unicode", "gemma3",
     [U("user", "Привет, 世界! 🙂 café"), U("assistant", "नमस्ते 👋🏽"), U("user", "日本語で答えて")], True, None),
    ("g3_unicode_whitespace_trim", "gemma3",
     [U("user", "\u00a0\u3000h\u00e9llo\u2003w\u00f6rld\u2003\u2028\u0085\n")], True, None),
    ("g3_empty_user_content", "gemma3", [U("user", "")], True, None),
    ("g3_only_system", "gemma3", [U("system", "Be brief.")], True, None),
    ("g3_ends_with_assistant_no_generation_prompt", "gemma3",
     [U("user", "Hi"), U("assistant", "Hello!")], False, None),
    ("g3_enable_thinking_is_ignored", "gemma3", [U("user", "Hi")], True, True),
    ("g3_system_at_odd_position_renders", "gemma3",
     [U("user", "Hi"), U("system", "Late system text"), U("user", "Again")], True, None),
    ("g3_assistant_thinking_markup_kept", "gemma3",
     [U("user", "Hi"), U("assistant", "<|channel>thought\nhmm<channel|>Hello"), U("user", "ok")], True, None),
    # Gemma 3 errors (alternation), index = first offending message in the caller's list.
    ("g3_err_starts_with_assistant", "gemma3", [U("assistant", "Hi")], True, None),
    ("g3_err_two_users", "gemma3", [U("user", "a"), U("user", "b")], True, None),
    ("g3_err_system_then_assistant", "gemma3", [U("system", "s"), U("assistant", "a")], True, None),
    ("g3_err_two_assistants", "gemma3", [U("user", "u"), U("assistant", "a"), U("assistant", "b")], True, None),
    ("g3_err_system_at_even_position", "gemma3",
     [U("user", "u"), U("assistant", "a"), U("system", "s")], True, None),
    ("g3_err_empty", "gemma3", [], True, None),
    # ---------------- Gemma 4 ----------------
    ("g4_single_user", "gemma4", [U("user", "Hello")], True, None),
    ("g4_single_user_thinking_false", "gemma4", [U("user", "Hello")], True, False),
    ("g4_single_user_no_generation_prompt", "gemma4", [U("user", "Hello")], False, None),
    ("g4_thinking_on", "gemma4", [U("user", "Hello")], True, True),
    ("g4_thinking_on_no_generation_prompt", "gemma4", [U("user", "Hello")], False, True),
    ("g4_system_user", "gemma4", [U("system", "You are a helpful assistant."), U("user", "Hi")], True, None),
    ("g4_system_user_thinking_on", "gemma4",
     [U("system", "You are a helpful assistant."), U("user", "Hi")], True, True),
    ("g4_system_trimmed", "gemma4", [U("system", "  Be brief.\n\n"), U("user", " hi ")], True, None),
    ("g4_multi_turn", "gemma4",
     [U("user", "What is 2+2?"), U("assistant", "4."), U("user", "And 3+3?"), U("assistant", "6."),
      U("user", "Thanks!")], True, None),
    ("g4_strip_thinking", "gemma4",
     [U("user", "What is 2+2?"),
      U("assistant", "<|channel>thought\nTwo plus two is four.<channel|>The answer is 4."),
      U("user", "Sure?")], True, None),
    ("g4_strip_thinking_thinking_on", "gemma4",
     [U("system", "Think first."), U("user", "What is 2+2?"),
      U("assistant", "<|channel>thought\nTwo plus two.<channel|>4"), U("user", "Sure?")], True, True),
    ("g4_strip_thinking_multiple_blocks", "gemma4",
     [U("user", "q"), U("assistant", " A <|channel>t1<channel|> B <|channel>t2<channel|> C "), U("user", "r")],
     True, None),
    ("g4_strip_thinking_unclosed_channel", "gemma4",
     [U("user", "q"), U("assistant", "Answer.<|channel>thought\nunfinished")], True, None),
    ("g4_strip_thinking_stray_close", "gemma4",
     [U("user", "q"), U("assistant", "stray<channel|> tail")], True, None),
    ("g4_strip_thinking_only_thought", "gemma4",
     [U("user", "q"), U("assistant", "<|channel>thought\nonly thinking<channel|>")], True, None),
    ("g4_last_assistant_stripped_no_generation_prompt", "gemma4",
     [U("user", "q"), U("assistant", "<|channel>thought\nx<channel|>\n\nFinal.\n")], False, None),
    ("g4_user_channel_markup_not_stripped", "gemma4",
     [U("user", "  <|channel>keep<channel|> me  ")], True, None),
    ("g4_whitespace_trim", "gemma4",
     [U("user", "  \n Hello there \t\n"), U("assistant", "\n\nSure.  "), U("user", "   ok")], True, None),
    ("g4_unicode", "gemma4",
     [U("system", "Réponds en français 🇫🇷"), U("user", "Привет, 世界! 🙂 café"), U("assistant", "नमस्ते 👋🏽"),
      U("user", "日本語で答えて")], True, None),
    ("g4_unicode_whitespace_trim", "gemma4",
     [U("user", "\u00a0\u3000h\u00e9llo\u2003w\u00f6rld\u2003\u2028\u0085\n"),
      U("assistant", "\u3000<|channel>t<channel|>\u00a0r\u00e9ponse\u2009")], True, None),
    ("g4_model_role_alias", "gemma4",
     [U("user", "Hi"), U("model", "<|channel>t<channel|>Hello!"), U("user", "Bye")], True, None),
    ("g4_consecutive_users", "gemma4", [U("user", "first"), U("user", "second")], True, None),
    ("g4_consecutive_assistants", "gemma4",
     [U("user", "q"), U("assistant", "part one"), U("assistant", "part two")], True, None),
    ("g4_starts_with_assistant", "gemma4", [U("assistant", "Hi"), U("user", "Hello")], True, None),
    ("g4_system_mid_conversation", "gemma4",
     [U("user", "Hi"), U("system", " Late system text "), U("user", "Again")], True, None),
    ("g4_only_system", "gemma4", [U("system", "Be brief.")], True, None),
    ("g4_only_system_thinking_on", "gemma4", [U("system", "Be brief.")], True, True),
    ("g4_empty_user_content", "gemma4", [U("user", "")], True, None),
    ("g4_empty_system_content", "gemma4", [U("system", ""), U("user", "Hi")], True, None),
    ("g4_err_empty", "gemma4", [], True, None),
]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the documentation.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "description": "Maximum results", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Filter tags"},
        "filters": {"type": "object", "description": "Field filters", "properties": {
            "Author": {"type": "string"}, "year": {"type": "integer"}}, "required": ["year"]},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                            "required": ["id"]}},
        "exact": {"type": "boolean"}},
        "required": ["query", "limit"]}}}
NO_PARAMS = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
EMPTY_PARAMS = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
WITH_RESPONSE = {"type": "function", "function": {
    "name": "lookup", "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    "response": {"type": "object", "description": "The value found."}}}


def A(content=None, tool_calls=None, reasoning=None) -> dict:
    m = {"role": "assistant", "content": content}
    if tool_calls is not None:
        m["tool_calls"] = tool_calls
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def call(id_, name, args) -> dict:
    return {"id": id_, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def T(id_, content) -> dict:
    return {"role": "tool", "tool_call_id": id_, "content": content}


# (name, messages, tools, add_generation_prompt, enable_thinking or None)
TOOL_CASES = [
    ("t_declaration_weather", [U("user", "Weather in Paris?")], [WEATHER], True, None),
    ("t_declarations_many", [U("system", "Be helpful."), U("user", "Find docs")],
     [WEATHER, SEARCH, NO_PARAMS, EMPTY_PARAMS, WITH_RESPONSE], True, None),
    ("t_declarations_thinking_on", [U("system", "Be helpful."), U("user", "Weather?")], [WEATHER], True, True),
    ("t_call_round_trip", [U("user", "Weather in Paris?"),
                           A(None, [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]),
                           T("call_1", '{"temperature": 21, "sky": "clear"}')], [WEATHER], True, None),
    ("t_call_round_trip_answered", [U("user", "Weather in Paris?"),
                                    A("", [call("call_1", "get_weather", {"city": "Paris"})]),
                                    T("call_1", '{"temperature": 21.5}'),
                                    A("It is 21.5 degrees."), U("user", "Thanks")], [WEATHER], True, None),
    ("t_call_string_result", [U("user", "Weather?"), A(None, [call("c", "get_weather", {"city": "Oslo"})]),
                              T("c", "sunny, 12 C")], [WEATHER], True, None),
    ("t_call_non_object_json_result", [U("user", "Weather?"), A(None, [call("c", "get_weather", {"city": "Oslo"})]),
                                       T("c", "[1, 2]")], [WEATHER], True, None),
    ("t_parallel_calls", [U("user", "Paris and Rome?"),
                          A(None, [call("a", "get_weather", {"city": "Paris"}),
                                   call("b", "get_weather", {"city": "Rome"})]),
                          T("b", '{"t": 25}'), T("a", '{"t": 20}')], [WEATHER], True, None),
    ("t_parallel_calls_ids_unmatched", [U("user", "Paris and Rome?"),
                                        A(None, [call("a", "get_weather", {"city": "Paris"}),
                                                 call("b", "search_docs", {"query": "Rome"})]),
                                        T("x", "one"), T("y", "two")], [WEATHER, SEARCH], True, None),
    ("t_two_rounds", [U("user", "Weather then docs"),
                      A(None, [call("a", "get_weather", {"city": "Paris"})]), T("a", '{"t": 20}'),
                      A(None, [call("b", "search_docs", {"query": "umbrella", "limit": 3})]), T("b", '{"hits": []}'),
                      A("Done.")], [WEATHER, SEARCH], True, None),
    ("t_argument_types", [U("user", "q"),
                          A(None, [call("a", "search_docs",
                                        {"query": "a \"quoted\" text", "limit": 10, "exact": False, "score": 0.25,
                                         "big": 1e20, "small": 1e-05, "none": None, "tags": ["x", "y"],
                                         "filters": {"year": 2024, "Author": "Ann", "nested": {"b": [1, {"c": True}]}},
                                         "Zeta": "upper first"})]),
                          T("a", '{"Rows": [{"id": 1}], "ok": true, "n": null, "f": 2.0}')], [SEARCH], True, None),
    ("t_arguments_not_json", [U("user", "q"), A(None, [call("a", "get_weather", "city:<|\"|>Paris<|\"|>")]),
                              T("a", "ok")], [WEATHER], True, None),
    ("t_reasoning_kept_after_last_user", [U("user", "Weather?"),
                                          A(None, [call("a", "get_weather", {"city": "Paris"})], reasoning="Need the tool."),
                                          T("a", '{"t": 20}')], [WEATHER], True, True),
    ("t_reasoning_dropped_before_last_user", [U("user", "Weather?"),
                                              A(None, [call("a", "get_weather", {"city": "Paris"})], reasoning="Need it."),
                                              T("a", '{"t": 20}'), A("20 degrees."), U("user", "And now?")],
     [WEATHER], True, True),
    ("t_tool_result_no_generation_prompt", [U("user", "Weather?"), A(None, [call("a", "get_weather", {"city": "Paris"})]),
                                            T("a", '{"t": 20}')], [WEATHER], False, None),
    ("t_history_calls_without_tools", [U("user", "Weather?"), A(None, [call("a", "get_weather", {"city": "Paris"})]),
                                       T("a", '{"t": 20}'), A("20."), U("user", "ok")], None, True, None),
    ("t_call_with_content_and_thought", [U("user", "Weather?"),
                                         A("<|channel>thought\nhm<channel|>Let me check.",
                                           [call("a", "get_weather", {"city": "Paris"})]),
                                         T("a", "20")], [WEATHER], True, None),
    ("t_unicode_arguments", [U("user", "Wetter in München?"),
                             A(None, [call("a", "get_weather", {"city": "München 🌧"})]), T("a", '{"desc": "Regen ☔"}')],
     [WEATHER], True, None),
]


def openai_to_gemma4(messages):
    """OpenAI tool shapes -> the Gemma 4 template's: arguments that are a JSON object become a mapping
    (other text stays as is); each `tool` message becomes a tool_responses entry {name, response} of
    the assistant message with tool_calls before it (name: the call whose id is tool_call_id, else the
    call at the same position, else "unknown"; response: the content if it is a JSON object, else the
    content text; a tool_call_id matches only when given); an assistant message without tool_calls right after tool results, when the message
    holding them has no content, gives that message its content instead of a turn of its own."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                f = dict(c["function"])
                try:
                    args = json.loads(f["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    f["arguments"] = args
                calls.append({**c, "function": f})
            m["tool_calls"] = calls
        if m["role"] == "tool":
            host = out[-1]
            assert host["role"] in ("assistant", "model") and host.get("tool_calls"), "tool message without a call"
            responses = host.setdefault("tool_responses", [])
            calls = host["tool_calls"]
            name = next((c["function"]["name"] for c in calls
                         if m.get("tool_call_id") and c.get("id") == m.get("tool_call_id")), None)
            if name is None:
                name = calls[len(responses)]["function"]["name"] if len(responses) < len(calls) else "unknown"
            try:
                value = json.loads(m["content"])
            except ValueError:
                value = None
            responses.append({"name": name, "response": value if isinstance(value, dict) else m["content"]})
            continue
        if (m["role"] in ("assistant", "model") and not m.get("tool_calls") and out and out[-1].get("tool_responses")
                and not out[-1].get("content")):
            out[-1]["content"] = m["content"]
            continue
        out.append(m)
    return out


def read_template(name: str) -> str:
    with open(os.path.join(ROOT, TEMPLATES[name]["file"]), encoding="utf-8") as f:
        text = f.read()
    first, rest = text.split("\n", 1)
    assert first.startswith("{#-") and first.endswith("-#}"), "template file lacks its provenance header"
    return rest


def jinja_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def render_plain(template: str, messages, add_generation_prompt, enable_thinking, tools=None) -> str:
    kwargs = dict(SPECIAL_TOKENS)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if not messages:  # apply_chat_template refuses an empty conversation before rendering
        raise ValueError("Cannot apply chat template to an empty conversation.")
    return jinja_env().from_string(template).render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kwargs)


def render_hf(template: str, messages, add_generation_prompt, enable_thinking, tools=None):
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:  # transformers not installed: the plain rendering stands alone
        return None
    kwargs = dict(SPECIAL_TOKENS)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation.")
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, documents=None,
                                        chat_template=template, add_generation_prompt=add_generation_prompt,
                                        **kwargs)
    return rendered[0]


def render(template, messages, add_generation_prompt, enable_thinking, tools=None):
    """Returns ("ok", text) or ("error", message); both renderers must agree."""
    results = []
    for fn in (render_plain, render_hf):
        try:
            out = fn(template, messages, add_generation_prompt, enable_thinking, tools)
            if out is None:
                continue
            results.append(("ok", out))
        except (jinja2.exceptions.TemplateError, ValueError) as e:
            results.append(("error", str(e)))
    assert all(r == results[0] for r in results), f"renderers disagree: {results}"
    return results[0]


def first_failing_index(template, messages, add_generation_prompt, enable_thinking):
    for k in range(len(messages)):
        status, _ = render(template, messages[:k + 1], add_generation_prompt, enable_thinking)
        if status == "error":
            return k
    raise AssertionError("no prefix fails although the whole conversation does")


def build() -> dict:
    templates = {name: read_template(name) for name in TEMPLATES}
    cases = []
    names = set()
    for name, tmpl, messages, agp, thinking in CASES:
        assert name not in names, name
        names.add(name)
        case = {"name": name, "template": tmpl, "messages": messages, "add_generation_prompt": agp,
                "enable_thinking": thinking}
        status, value = render(templates[tmpl], messages, agp, thinking)
        expect_error = "_err_" in name
        assert (status == "error") == expect_error, f"{name}: {status}: {value!r}"
        if status == "ok":
            case["expected"] = value
        else:
            case["error"] = value
            case["error_index"] = (first_failing_index(templates[tmpl], messages, agp, thinking)
                                   if messages else None)
        cases.append(case)
    meta = {}
    for name, info in TEMPLATES.items():
        meta[name] = {"file": info["file"], "source": info["source"],
                      "sha256_without_header": hashlib.sha256(templates[name].encode("utf-8")).hexdigest()}
    return {
        "generator": "tools/make_template_golden.py",
        "renderer": renderer_versions(),
        "templates": meta,
        "cases": cases,
    }


def renderer_versions() -> dict:
    try:
        import transformers
        hf = transformers.__version__
    except Exception:
        hf = None
    return {"jinja2": jinja2.__version__, "transformers_render_jinja_template": hf}


def build_tools() -> dict:
    template = read_template("gemma4")
    cases = []
    for name, messages, tools, agp, thinking in TOOL_CASES:
        status, value = render(template, openai_to_gemma4(messages), agp, thinking, tools)
        assert status == "ok", f"{name}: {value}"
        cases.append({"name": name, "template": "gemma4", "messages": messages, "tools": tools,
                      "add_generation_prompt": agp, "enable_thinking": thinking, "expected": value})
    return {"generator": "tools/make_template_golden.py", "renderer": renderer_versions(),
            "templates": {"gemma4": {"file": TEMPLATES["gemma4"]["file"], "source": TEMPLATES["gemma4"]["source"],
                                     "sha256_without_header": hashlib.sha256(template.encode("utf-8")).hexdigest()}},
            "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file on disk instead of writing")
    ap.add_argument("--out", default=os.path.join(ROOT, OUT))
    ap.add_argument("--tools-out", default=os.path.join(ROOT, TOOLS_OUT))
    args = ap.parse_args()
    stale = 0
    for path, doc in ((args.out, build()), (args.tools_out, build_tools())):
        text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
        if args.check:
            with open(path, encoding="utf-8") as f:
                if f.read() != text:
                    print(f"{path} is stale; rerun tools/make_template_golden.py", file=sys.stderr)
                    stale = 1
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print(f"wrote {path} ({len(doc['cases'])} cases)")
    if args.check and not stale:
        print("golden files up to date")
    return stale


if __name__ == "__main__":
    sys.exit(main())
