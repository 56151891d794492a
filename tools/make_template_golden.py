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
(independent of how the C++ renderer decides). Tool calls, tool responses and multimodal content
parts are out of scope: every message is {role, content: str}.
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


def render_plain(template: str, messages, add_generation_prompt, enable_thinking) -> str:
    kwargs = dict(SPECIAL_TOKENS)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if not messages:  # apply_chat_template refuses an empty conversation before rendering
        raise ValueError("Cannot apply chat template to an empty conversation.")
    return jinja_env().from_string(template).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **kwargs)


def render_hf(template: str, messages, add_generation_prompt, enable_thinking):
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:  # transformers not installed: the plain rendering stands alone
        return None
    kwargs = dict(SPECIAL_TOKENS)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation.")
    rendered, _ = render_jinja_template(conversations=[messages], tools=None, documents=None,
                                        chat_template=template, add_generation_prompt=add_generation_prompt,
                                        **kwargs)
    return rendered[0]


def render(template, messages, add_generation_prompt, enable_thinking):
    """Returns ("ok", text) or ("error", message); both renderers must agree."""
    results = []
    for fn in (render_plain, render_hf):
        try:
            out = fn(template, messages, add_generation_prompt, enable_thinking)
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
    try:
        import transformers
        hf = transformers.__version__
    except Exception:
        hf = None
    return {
        "generator": "tools/make_template_golden.py",
        "renderer": {"jinja2": jinja2.__version__, "transformers_render_jinja_template": hf},
        "templates": meta,
        "cases": cases,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file on disk instead of writing")
    ap.add_argument("--out", default=os.path.join(ROOT, OUT))
    args = ap.parse_args()
    text = json.dumps(build(), ensure_ascii=False, indent=1) + "\n"
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.out} is stale; rerun tools/make_template_golden.py", file=sys.stderr)
                return 1
        print("golden file up to date")
        return 0
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(CASES)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
