#!/usr/bin/env python3
"""Generates the tokenizer golden fixtures used by tests/tokenizer_test.cc.

  gemma3  Tokenizes a corpus with llama.cpp (through llama-cpp-python, vocab_only) using the real
          Gemma 3 270M GGUF and writes tests/data/tokenizer_gemma3_golden.json: ids for every
          (add_bos, parse_special) combination and llama.cpp's detokenized text.
  gemma4  Builds a small Gemma-4-style tokenizer with Hugging Face `tokenizers` (BPE with byte
          fallback; normalizer Replace(" ", "▁"); pre-tokenizer Split(" ", merged_with_previous);
          decoder Replace/ByteFallback/Fuse; Gemma 4 control and user-defined tokens), writes it to
          tests/data/tokenizer_gemma4_tiny/ together with the same vocabulary as a GGUF whose
          tokenizer.ggml.model is "gemma4", and records HF's ids and decoded text for the corpus in
          tests/data/tokenizer_gemma4_tiny_golden.json. When the installed llama-cpp-python can
          load that GGUF, llama.cpp's ids are recorded too.

Usage:
  python3 tools/make_tokenizer_golden.py gemma3 [--model PATH]
  python3 tools/make_tokenizer_golden.py gemma4
  python3 tools/make_tokenizer_golden.py all

Requirements: llama-cpp-python (gemma3), tokenizers and gguf (gemma4).
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def corpus(extra_special):
    """(name, text) pairs. `extra_special` are model-specific special-token strings."""
    long_prose = (
        "The quick brown fox jumps over the lazy dog. "
        "Tokenizers split text into pieces; engines turn pieces into ids.\n"
        "Numbers like 3.14159, 2,718 and 1e-9 appear too, as do URLs (https://example.org/a?b=c).\n\n"
    )
    code = (
        "def fib(n: int) -> int:\n"
        "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n"
        "\n"
        "\tif (x != y) {\n"
        "\t\treturn x->next;  // tab-indented C\n"
        "\t}\n"
    )
    cases = [
        ("empty", ""),
        ("hello", "Hello world"),
        ("leading_space", " Hello"),
        ("only_space", " "),
        ("space_runs", "a  b   c    d     e" + " " * 40 + "f"),
        ("trailing_spaces", "end   "),
        ("newline", "\n"),
        ("newline_runs", "line1\nline2\n\nline3\n\n\n\nx" + "\n" * 5 + "y" + "\n" * 40 + "z"),
        ("mixed_whitespace", " \t \n \r\n  x \u00a0 y\u3000z"),
        ("tabs", "\tindent\t\ttabs\t\t\t"),
        ("code", code),
        ("accents", "Café déjà vu, naïve façade, Ångström, São Paulo, Über, Ærøskøbing, ﬁne"),
        ("cjk", "你好，世界！日本語のテキストです。한국어 텍스트. 中文分词测试"),
        ("emoji", "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🦙"),
        ("rare_chars", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Ω≈ç√∫ \u200b zero\u200dwidth \u0001\u007f ᚠᛇᚻ 𓀀 \U0010fffd"),
        ("digits", "1234567890 3.14159 -42 1e10 2024-01-01 0x1F 007"),
        ("punctuation", "!!!??? ... ---- ==== ((()))[[]]{{}} <<>> @#$%^&*_+|~`"),
        ("url_json", 'https://example.com/path?q=1&r=2#frag {"key": [1, 2, {"nested": null}]}'),
        ("html", "<table><tr><td>cell</td></tr></table> <b>bold</b> <div class=\"x\">y</div>"),
        ("html_s", "<s>struck</s> <sub>2</sub> a</s>b<s>"),
        ("chat_gemma3",
         "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!<end_of_turn>\n"),
        ("chat_gemma4",
         "<|turn>user\nHello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>Hi!<turn|>\n"),
        ("bos_in_text", "<bos>text after a literal bos"),
        ("specials_adjacent", "<eos><eos>x<pad><mask>y<unk>"),
        ("partial_specials", "<start_of_turn <end_of_turn> <eos <|turn <turn| <|tool_call>call"),
        ("tool_syntax", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>'),
        ("long_prose", long_prose * 40),
        ("long_no_spaces", "abcdefghijklmnopqrstuvwxyz" * 300 + "中文" * 500 + "0123456789" * 100),
        ("long_spaces", " " * 2000 + "x" + "\n" * 1000 + "y"),
    ]
    for i, s in enumerate(extra_special):
        cases.append((f"special_{i}", f"a {s} b{s}{s}c"))
    # Deterministic random mixtures of whitespace runs, markup, special tokens and non-ASCII
    # text: they exercise special-token partitioning and merging in combinations.
    import random
    rng = random.Random(20240607)
    pool = ["a", "b", "the", "Hello", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\r\n", "<",
            ">", "</", "<td>", "</td>", "<b>", "<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>",
            "<unused3>", "<mask>", "</s>", "<s>", "<|turn>", "<turn|>", "<|tool_response>", '<|"|>', "<|channel>",
            "user", "model", "é", "ñ", "中", "文", "😀", "\U0010fffd", "\u00a0", "▁", "▁▁", "1", "23",
            ".", ",", "!", "    ", "        ", "_", "-"]
    for i in range(40):
        n = rng.randint(4, 40)
        cases.append((f"mix_{i}", "".join(rng.choice(pool) for _ in range(n))))
    return cases


def as_record(b: bytes):
    """Decoded bytes as JSON: {"text": ...} when valid UTF-8, else {"hex": ...}."""
    try:
        return {"text": b.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def dump(doc, path):
    """Writes `doc` with one line per scalar key and per case (ids stay on one line)."""
    lines = ["{"]
    items = list(doc.items())
    for k, (key, value) in enumerate(items):
        comma = "," if k + 1 < len(items) else ""
        if isinstance(value, list):
            lines.append(f"  {json.dumps(key)}: [")
            for i, v in enumerate(value):
                sep = "," if i + 1 < len(value) else ""
                lines.append("    " + json.dumps(v, ensure_ascii=False, separators=(",", ":")) + sep)
            lines.append("  ]" + comma)
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# llama.cpp reference (llama-cpp-python, low-level API on the model's vocab).

class LlamaRef:
    def __init__(self, path):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def tokenize(self, text: str, add_bos: bool, special: bool):
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, ids, unparse_special: bool) -> bytes:
        lc = self.lc
        n = len(ids)
        arr = (lc.llama_token * max(n, 1))(*ids)
        cap = 64 + 64 * n
        while True:
            buf = ctypes.create_string_buffer(cap)
            got = lc.llama_detokenize(self.vocab, arr, n, buf, cap, False, unparse_special)
            if got >= 0:
                return buf.raw[:got]
            cap = -got + 16

    @property
    def version(self):
        return getattr(self.lc, "__version__", "unknown")


def default_model_path():
    env = os.environ.get("GEMMA4RT_DEFAULT_MODEL")
    if env:
        return Path(env)
    out = subprocess.run([str(ROOT / "scripts" / "fetch-default-model.sh")], check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def golden_cases(encode, decode, cases):
    out = []
    for name, text in cases:
        encs = []
        for add_bos in (False, True):
            for special in (False, True):
                # Long texts: two of the four combinations suffice (keeps the file small).
                if len(text) >= 1000 and add_bos != special:
                    continue
                ids = encode(text, add_bos, special)
                rec = {"add_bos": add_bos, "parse_special": special, "ids": list(ids)}
                # Long texts: decoded text only once, to keep the file small.
                if decode is not None and (len(text) < 1000 or (add_bos and special)):
                    rec["decoded"] = as_record(decode(ids, True))
                    rec["decoded_skip_special"] = as_record(decode(ids, False))
                encs.append(rec)
        out.append({"name": name, "text": text, "encodings": encs})
    return out


def make_gemma3(model_path):
    ref = LlamaRef(model_path)
    cases = corpus(["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<unused7>", "<td>",
                    "<unk>"])
    doc = {
        "description": "Gemma 3 270M GGUF tokenizer, reference llama.cpp via llama-cpp-python "
                       "(Llama(vocab_only=True).tokenize(text, add_bos, special); "
                       "llama_detokenize(ids, remove_special=False, unparse_special=True/False) "
                       "for decoded / decoded_skip_special).",
        "generator": "tools/make_tokenizer_golden.py gemma3",
        "llama_cpp_python_version": ref.version,
        "model_file": model_path.name,
        "cases": golden_cases(ref.tokenize, ref.detokenize, cases),
    }
    DATA.mkdir(parents=True, exist_ok=True)
    out = DATA / "tokenizer_gemma3_golden.json"
    dump(doc, out)
    print(f"wrote {out} ({len(cases)} cases, llama-cpp-python {ref.version})")


# ----------------------------------------------------------------------------------------------
# Tiny Gemma-4-style tokenizer (HF tokenizers) and its GGUF twin.

G4_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|tool>", "<tool|>", "<|think|>",
              "<|turn>", "<turn|>", "<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>",
              "<audio|>", "<|video|>"]
# llama.cpp's Gemma 4 GGUF marks these seven USER_DEFINED (spec section 6.1).
G4_USER = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
           "<tool_response|>", '<|"|>']


def training_text():
    """Synthetic training text: a few real words plus Zipf-distributed pseudo-words built from
    syllables (deterministic), code, CJK and punctuation, so that BPE learns a few thousand merges."""
    import random
    rng = random.Random(1234)
    real = ("the of and to in is was for on that with as by at from his her they this which "
            "model token turn user system thought channel tool call response weather city "
            "hello world quick brown fox jumps over lazy dog numbers engine pieces text "
            "café déjà naïve façade über straße años niño mañana élève garçon").split()
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "str", "th", "tr"]
    nuclei = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "é", "ä", "ö"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "rt", "st", "ck", "sh"]
    pseudo = []
    for _ in range(3000):
        w = "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas)
                    for _ in range(rng.choice([1, 1, 2, 2, 3])))
        pseudo.append(w)
    vocab = real * 20 + pseudo
    weights = [1.0 / (1 + i) ** 0.8 for i in range(len(vocab))]
    lines = []
    for i in range(3000):
        n = rng.randint(3, 14)
        w = rng.choices(vocab, weights=weights, k=n)
        if rng.random() < 0.3:
            w[0] = w[0].capitalize()
        line = " ".join(w)
        if rng.random() < 0.1:
            line = line.replace(" ", "  ", 1)
        if rng.random() < 0.15:
            line = "    " * rng.randint(1, 3) + line
        if rng.random() < 0.2:
            line += " " + str(rng.randint(0, 99999))
        line += rng.choice([".", ",", "!", "?", ":", ";", "", ""])
        lines.append(line)
        if rng.random() < 0.1:
            lines.append("")
    text = "\n".join(lines)
    text += "\n\n" + "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 20
    text += "\n" + "你好世界，中文文本。日本語のテキスト。" * 20
    text += "\n" + "Hello, world! Hello world. (hello) [world] {x: y}\n" * 30
    return text


def build_tiny_hf():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers

    # 1. Train merges with a word-level pre-split (newline runs isolated, "▁" starts a word,
    #    digits one by one), as SentencePiece training would see the text.
    trainee = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    trainee.normalizer = normalizers.Replace(" ", "▁")
    trainee.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), "isolated"),
        pre_tokenizers.Split("▁", "merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    trainer = trainers.BpeTrainer(vocab_size=4000, min_frequency=2, special_tokens=[],
                                  limit_alphabet=160, show_progress=False)
    trainee.train_from_iterator([training_text()], trainer=trainer)
    trained = json.loads(trainee.to_str())["model"]
    trained_vocab = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained["merges"]]

    # 2. Lay out ids like Gemma: control/user-defined tokens first, then <0x00>..<0xFF>, then the
    #    trained pieces.
    pieces = list(G4_CONTROL) + list(G4_USER) + [f"<0x{b:02X}>" for b in range(256)]
    seen = set(pieces)
    for p, _ in trained_vocab:
        if p not in seen:
            seen.add(p)
            pieces.append(p)
    vocab = {p: i for i, p in enumerate(pieces)}

    # 3. The Gemma pipeline (HF v5 GemmaTokenizer).
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                               unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in G4_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in G4_USER])
    return tok, pieces, merges


def write_tiny_gguf(path, pieces, merges):
    import gguf
    types = []
    for p in pieces:
        if p in G4_CONTROL:
            types.append(gguf.TokenType.CONTROL)
        elif p in G4_USER:
            types.append(gguf.TokenType.USER_DEFINED)
        elif len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    scores = [-1000.0 if t == gguf.TokenType.CONTROL else 0.0 for t in types]
    w = gguf.GGUFWriter(str(path), "llama")
    # Minimal llama hparams so that llama.cpp can open the file with vocab_only.
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(pieces.index("<bos>"))
    w.add_eos_token_id(pieces.index("<eos>"))
    w.add_unk_token_id(pieces.index("<unk>"))
    w.add_pad_token_id(pieces.index("<pad>"))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_gemma4():
    import tokenizers
    tok, pieces, merges = build_tiny_hf()
    out_dir = DATA / "tokenizer_gemma4_tiny"
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": False}, indent=1) + "\n")
    gguf_path = out_dir / "tokenizer_gemma4_tiny.gguf"
    write_tiny_gguf(gguf_path, pieces, merges)

    bos = pieces.index("<bos>")

    def hf_encode(text, add_bos, special):
        tok.encode_special_tokens = not special
        ids = tok.encode(text, add_special_tokens=False).ids
        return ([bos] if add_bos else []) + ids

    def hf_decode(ids, render_special):
        return tok.decode(ids, skip_special_tokens=not render_special).encode("utf-8")

    cases = corpus(G4_CONTROL[5:] + G4_USER)
    doc = {
        "description": "Tiny Gemma-4-style tokenizer (tokenizer.json built by this script with HF "
                       "tokenizers). ids: tokenizer.encode(text, add_special_tokens=False) with "
                       "encode_special_tokens = not parse_special, bos prepended by hand when "
                       "add_bos; decoded: tokenizer.decode(ids, skip_special_tokens=False/True).",
        "generator": "tools/make_tokenizer_golden.py gemma4",
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": len(pieces),
        "num_merges": len(merges),
        "cases": golden_cases(hf_encode, hf_decode, cases),
    }
    # llama.cpp on the GGUF twin, when this llama-cpp-python knows tokenizer model "gemma4".
    try:
        ref = LlamaRef(gguf_path)
        doc["llama_cpp_python_version"] = ref.version
        doc["llama_cpp_gguf"] = golden_cases(ref.tokenize, ref.detokenize, cases)
    except Exception as e:  # noqa: BLE001 - record why there is no llama.cpp reference
        doc["llama_cpp_gguf_unavailable"] = f"{type(e).__name__}: {e}"
    out = DATA / "tokenizer_gemma4_tiny_golden.json"
    dump(doc, out)
    print(f"wrote {out} and {out_dir} ({len(pieces)} tokens, {len(merges)} merges, "
          f"tokenizers {tokenizers.__version__}; llama.cpp: "
          f"{'yes' if 'llama_cpp_gguf' in doc else doc['llama_cpp_gguf_unavailable']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["gemma3", "gemma4", "all"])
    ap.add_argument("--model", type=Path, help="Gemma 3 GGUF (default: scripts/fetch-default-model.sh)")
    args = ap.parse_args()
    if args.what in ("gemma3", "all"):
        make_gemma3(args.model or default_model_path())
    if args.what in ("gemma4", "all"):
        make_gemma4()


if __name__ == "__main__":
    sys.exit(main())
