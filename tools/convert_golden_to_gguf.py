#!/usr/bin/env python3
"""Convert the tiny golden checkpoints in tests/golden/ to GGUF with llama.cpp's own converter.

Development-only tool. It runs llama.cpp's `convert_hf_to_gguf.py` (imported, not copied) from a
llama.cpp source tree, with `--outtype f32`, and writes `tests/golden/<fixture>/model-f32.gguf`.
The engine's GGUF loader can then be tested against the same transformers references
(`reference.safetensors`) as the safetensors loader.

The converter used for the checked-in files is the llama.cpp vendored in the llama-cpp-python
0.3.36 source distribution (ggml-org/llama.cpp@0c1e57098). Get it, with no build, by:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcpp-src
    tar xzf /tmp/lcpp-src/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcpp-src

Usage (from the repository root):

    python3 tools/convert_golden_to_gguf.py                       # all four fixtures
    python3 tools/convert_golden_to_gguf.py --only gemma3-tiny    # one fixture
    python3 tools/convert_golden_to_gguf.py --lcpp DIR            # another llama.cpp tree
    python3 tools/convert_golden_to_gguf.py --dump                # also print metadata + tensors
    python3 tools/convert_golden_to_gguf.py --dump-only           # only print, convert nothing
    python3 tools/convert_golden_to_gguf.py --check-llama-cpp     # also compare llama_cpp logits

Needs: torch, transformers (the converter reads config.json through AutoConfig; 5.24.0 was used),
safetensors, numpy, sentencepiece (llama.cpp reads Gemma 3's tokenizer.model with it), and the
llama.cpp tree. `--check-llama-cpp` also needs the `llama_cpp` package. Nothing is downloaded.

The fixtures ship no tokenizer, and llama.cpp's converter cannot run without one. So each
fixture is copied into a temporary directory named after the fixture (the directory name becomes
`general.name`), and a minimal, deterministic 512-token vocabulary is written beside it:

  ids 0..4 <pad> <eos> <bos> <unk> <mask> (as in Google's Gemma vocabularies), 5..260
  byte-fallback tokens <0x00>..<0xFF>, 261 "\u2581" (SentencePiece space), 262 "\n", 263..356
  the printable ASCII characters '!'..'~', 357..364 the results of 8 BPE merges ("\u2581\u2581"
  "\u2581t" "he" "\u2581the" "in" "er" "an" "on"), 365..511 <unused0>..<unused146>.

- Gemma 3 gets a `tokenizer.model` (a SentencePiece BPE model with byte fallback, serialized here
  by hand), as Google's Gemma 3 checkpoints have; llama.cpp then takes its sentencepiece path
  (tokenizer.ggml.model = "llama") and keeps ALL 512 embedding rows.
- Gemma 4 gets a `tokenizer.json` (HF BPE with byte_fallback and the 8 merges; llama.cpp refuses
  a "gemma4" vocabulary without merges), as Google's Gemma 4 checkpoints have; llama.cpp reads it
  with transformers' AutoTokenizer (tokenizer.ggml.model = "gemma4"). Its embedding-row
  truncation keeps len(vocab) + len(added_tokens) = 512 + 5 >= 512 rows, i.e. all of them.
- Both get a `tokenizer_config.json` (tokenizer_class GemmaTokenizer, add_bos_token true,
  add_eos_token false, the five special tokens).

Nothing else is changed: the weights, config.json and generation_config.json are copied as they
are. llama.cpp's converter reads transformers 5.24's `per_layer_config` schema itself, so the
hub-schema config is not needed (set --hub-schema to use config.hub-schema.json as config.json).

The output is deterministic: two runs give byte-identical GGUF files (checked by this script's
--check-determinism, which converts twice and compares the bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF writer's progress bar

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
DEFAULT_LCPP = Path("/tmp/lcpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp")
FIXTURES = ["gemma3-tiny", "gemma4-e2b-tiny", "gemma4-31b-tiny", "gemma4-26b-a4b-tiny"]
OUT_NAME = "model-f32.gguf"
VOCAB_SIZE = 512
MAX_BYTES = 4 * 1024 * 1024

# ids 0..4 as in Google's Gemma vocabularies (config.json: pad 0, eos 1, bos 2). <mask> is there
# because transformers' GemmaTokenizer adds a "<mask>" token when the vocabulary has none.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]


# ---------------------------------------------------------------------------------------------
# Minimal vocabulary
# ---------------------------------------------------------------------------------------------


# A few BPE merges, so that the vocabulary is a working BPE one (llama.cpp refuses to load a
# "gemma4" tokenizer without tokenizer.ggml.merges). Each merge's result is a vocabulary entry.
MERGES = [("\u2581", "\u2581"), ("\u2581", "t"), ("h", "e"), ("\u2581t", "he"),
          ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n")]


def vocab_pieces() -> list[str]:
    pieces = list(SPECIALS)
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581", "\n"]
    pieces += [chr(c) for c in range(0x21, 0x7F)]
    pieces += [a + b for a, b in MERGES]
    n_unused = VOCAB_SIZE - len(pieces)
    pieces += [f"<unused{i}>" for i in range(n_unused)]
    assert len(pieces) == VOCAB_SIZE and len(set(pieces)) == VOCAB_SIZE
    return pieces


FIRST_NORMAL = len(SPECIALS) + 256  # id of "\u2581"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_varint(field: int, value: int) -> bytes:
    return _varint(field << 3 | 0) + _varint(value)


def _pb_bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _pb_float(field: int, value: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", value)


def sentencepiece_model_bytes() -> bytes:
    """A SentencePiece ModelProto (sentencepiece_model.proto), BPE with byte fallback.

    Piece types: NORMAL=1, UNKNOWN=2, CONTROL=3, BYTE=6. Scores: 0 for special/byte pieces,
    -(rank) for the normal ones (SentencePiece BPE derives the merge order from the scores)."""
    out = bytearray()
    for i, p in enumerate(vocab_pieces()):
        if i < len(SPECIALS):
            typ, score = (2 if p == "<unk>" else 3), 0.0
        elif i < FIRST_NORMAL:
            typ, score = 6, 0.0
        else:
            typ, score = 1, -float(i - FIRST_NORMAL)
        out += _pb_bytes(1, _pb_bytes(1, p.encode("utf-8")) + _pb_float(2, score) + _pb_varint(3, typ))
    trainer = (
        _pb_varint(3, 2)  # model_type BPE
        + _pb_varint(4, VOCAB_SIZE)  # vocab_size
        + _pb_varint(35, 1)  # byte_fallback
        + _pb_varint(40, 3)  # unk_id
        + _pb_varint(41, 2)  # bos_id
        + _pb_varint(42, 1)  # eos_id
        + _pb_varint(43, 0)  # pad_id
        + _pb_bytes(45, b"<unk>")
        + _pb_bytes(46, b"<bos>")
        + _pb_bytes(47, b"<eos>")
        + _pb_bytes(48, b"<pad>")
    )
    normalizer = (
        _pb_bytes(1, b"identity")
        + _pb_varint(3, 0)  # add_dummy_prefix false
        + _pb_varint(4, 0)  # remove_extra_whitespaces false
        + _pb_varint(5, 1)  # escape_whitespaces true
    )
    out += _pb_bytes(2, trainer) + _pb_bytes(3, normalizer)
    return bytes(out)


def added_token_entries() -> list[dict]:
    return [
        {"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, p in enumerate(SPECIALS)
    ]


def tokenizer_json() -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_token_entries(),
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {p: i for i, p in enumerate(vocab_pieces())},
            "merges": [[a, b] for a, b in MERGES],
        },
    }


def tokenizer_config_json() -> dict:
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(e["id"]): {k: v for k, v in e.items() if k != "id"} for e in added_token_entries()
        },
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "mask_token": "<mask>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 128,
        "tokenizer_class": "GemmaTokenizer",
    }


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, sort_keys=False)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# llama.cpp
# ---------------------------------------------------------------------------------------------


def import_llama_cpp_converter(lcpp: Path):
    """Put the llama.cpp tree's gguf-py first on sys.path and import its converter modules."""
    lcpp = lcpp.resolve()
    if not (lcpp / "convert_hf_to_gguf.py").is_file() or not (lcpp / "gguf-py" / "gguf").is_dir():
        sys.exit(f"error: {lcpp} is not a llama.cpp source tree (see the docstring for how to get one)")
    for p in (str(lcpp), str(lcpp / "gguf-py")):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    if "gguf" in sys.modules and not str(Path(sys.modules["gguf"].__file__).resolve()).startswith(str(lcpp)):
        sys.exit("error: a different gguf package was imported before the vendored one")
    import gguf  # noqa: E402
    import convert_hf_to_gguf  # noqa: E402

    gguf_file = Path(gguf.__file__).resolve()
    if not str(gguf_file).startswith(str(lcpp)):
        sys.exit(f"error: imported gguf from {gguf_file}, not from {lcpp}/gguf-py")
    return gguf, convert_hf_to_gguf


def lcpp_version(lcpp: Path) -> str:
    """Best-effort description of the llama.cpp tree: llama-cpp-python sdist + CHANGELOG commit."""
    lcpp = lcpp.resolve()
    sdist = lcpp.parent.parent
    desc = str(lcpp)
    pkg = sdist / "PKG-INFO"
    if pkg.is_file():
        info = dict(
            line.split(": ", 1) for line in pkg.read_text().splitlines()[:5] if ": " in line
        )
        desc = f"{info.get('Name', '?')} {info.get('Version', '?')} vendored llama.cpp"
        changelog = sdist / "CHANGELOG.md"
        if changelog.is_file():
            for line in changelog.read_text().splitlines():
                if "ggml-org/llama.cpp@" in line:
                    desc += " (" + line.split("ggml-org/llama.cpp@", 1)[1].split()[0] + ")"
                    break
    return desc


def prepare_input_dir(fixture_dir: Path, work: Path, hub_schema: bool) -> str:
    """Copy the checkpoint into `work` and add the minimal tokenizer. Returns the architecture."""
    work.mkdir(parents=True)
    config_src = fixture_dir / ("config.hub-schema.json" if hub_schema else "config.json")
    shutil.copyfile(config_src, work / "config.json")
    for f in sorted(fixture_dir.iterdir()):
        if f.name.startswith("model") and f.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copyfile(f, work / f.name)
        elif f.name == "generation_config.json":
            shutil.copyfile(f, work / f.name)
    with open(work / "config.json", encoding="utf-8") as f:
        arch = json.load(f)["architectures"][0]
    if arch.startswith("Gemma3"):
        (work / "tokenizer.model").write_bytes(sentencepiece_model_bytes())
    else:
        _write_json(work / "tokenizer.json", tokenizer_json())
    _write_json(work / "tokenizer_config.json", tokenizer_config_json())
    return arch


def run_converter(convert_hf_to_gguf, model_dir: Path, outfile: Path) -> None:
    argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", str(outfile), str(model_dir)]
    print("  $ " + " ".join(argv), flush=True)
    old_argv = sys.argv
    sys.argv = argv
    try:
        convert_hf_to_gguf.main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"llama.cpp's converter exited with {e.code}") from None
    finally:
        sys.argv = old_argv


def convert_fixture(name: str, convert_hf_to_gguf, out_path: Path, hub_schema: bool, verbose: bool) -> None:
    fixture_dir = GOLDEN / name
    if not fixture_dir.is_dir():
        raise FileNotFoundError(fixture_dir)
    with tempfile.TemporaryDirectory(prefix="golden-gguf-") as tmp:
        work = Path(tmp) / name  # general.name is derived from this directory name
        arch = prepare_input_dir(fixture_dir, work, hub_schema)
        tok = "tokenizer.model (sentencepiece)" if arch.startswith("Gemma3") else "tokenizer.json"
        print(f"[{name}] {arch}: copied checkpoint to {work}, wrote minimal 512-token {tok} "
              f"+ tokenizer_config.json{' (config.hub-schema.json as config.json)' if hub_schema else ''}",
              flush=True)
        tmp_out = Path(tmp) / OUT_NAME
        log_ctx = contextlib.nullcontext() if verbose else _quiet_logging()
        with log_ctx:
            run_converter(convert_hf_to_gguf, work, tmp_out)
        size = tmp_out.stat().st_size
        if size > MAX_BYTES:
            raise RuntimeError(f"{tmp_out} is {size} bytes, over the {MAX_BYTES} limit")
        shutil.copyfile(tmp_out, out_path)
    digest = hashlib.sha256(out_path.read_bytes()).hexdigest()
    print(f"[{name}] wrote {out_path.relative_to(REPO) if out_path.is_relative_to(REPO) else out_path} "
          f"({size} bytes, sha256 {digest[:16]})", flush=True)


@contextlib.contextmanager
def _quiet_logging():
    """Only warnings from the converter (its INFO log lists every tensor)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.WARNING, format="  %(name)s %(levelname)s: %(message)s")
    old = root.level
    root.setLevel(logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("hf-to-gguf", "gguf", "gguf.gguf_writer", "gguf.vocab")]
    old_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(old)
        for lg, lvl in zip(loggers, old_levels):
            lg.setLevel(lvl)


# ---------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------


def _field_value(gguf, field):
    t = field.types[0] if field.types else None
    if t == gguf.GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return field.parts[field.data[0]].tolist()[0]


def _compact(v) -> str:
    if isinstance(v, list):
        if len(v) > 16 and all(isinstance(x, (int, float)) for x in v):
            return f"[{len(v)}] " + json.dumps(v[:8])[:-1] + ", ...]"
        if len(v) > 16:
            return f"[{len(v)} strings] " + json.dumps(v[:6], ensure_ascii=False)[:-1] + ", ...]"
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v, ensure_ascii=False)


def dump_gguf(gguf, path: Path) -> None:
    r = gguf.GGUFReader(str(path))
    print(f"=== {path.relative_to(REPO) if path.is_relative_to(REPO) else path}: "
          f"{path.stat().st_size} bytes, {len(r.fields)} KV, {len(r.tensors)} tensors")
    for name, field in r.fields.items():
        v = _field_value(gguf, field)
        if name == "tokenizer.ggml.tokens":
            print(f"  {name} = [{len(v)} tokens] (list omitted)")
            continue
        tname = gguf.GGUFValueType(field.types[0]).name if field.types else "?"
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and len(field.types) > 1:
            tname = f"ARRAY[{gguf.GGUFValueType(field.types[1]).name}]"
        print(f"  {name} ({tname}) = {_compact(v)}")
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        print(f"  T {t.name:<40} ne={ne} {t.tensor_type.name}")


def llama_cpp_worker(name: str, gguf_path: Path) -> int:
    """Runs in a child process: llama.cpp aborts the process on some configs (GGML_ASSERT)."""
    import numpy as np
    from safetensors.numpy import load_file

    import llama_cpp

    ref = load_file(str(GOLDEN / name / "reference.safetensors"))
    ids = [int(x) for x in ref["input_ids"]]
    want = ref["logits"].astype(np.float64)
    kv = os.environ.get("GOLDEN_LLAMA_KV", "f32")  # llama.cpp's default KV cache type is f16
    kv_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[kv]
    llm = llama_cpp.Llama(model_path=str(gguf_path), logits_all=True, n_ctx=128, n_threads=2,
                          n_batch=128, type_k=kv_type, type_v=kv_type, verbose=False)
    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    abs_diff = np.abs(got - want)
    per_tok = abs_diff.max(axis=1) / np.abs(want).max(axis=1)
    argmax_eq = int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
    print(f"[{name}] llama_cpp {llama_cpp.__version__} (KV {kv}): logits max|diff| {abs_diff.max():.3e}, "
          f"max rel diff (|diff| / max|ref|) {abs_diff.max() / np.abs(want).max():.3e}, "
          f"token 0 (BOS) rel {per_tok[0]:.3e}, worst token {int(per_tok.argmax())} rel {per_tok.max():.3e}, "
          f"argmax equal {argmax_eq}/{len(ids)}", flush=True)
    return 0


def check_llama_cpp(name: str, gguf_path: Path) -> None:
    import subprocess

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print(f"[{name}] llama_cpp is not installed; llama.cpp check skipped")
        return
    proc = subprocess.run([sys.executable, __file__, "--llama-cpp-worker", name, str(gguf_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    if proc.returncode == 0:
        print("\n".join(l for l in lines if l.startswith(f"[{name}]")))
        return
    why = [l for l in lines if "GGML_ASSERT" in l or "error" in l.lower() or "exception" in l.lower()]
    print(f"[{name}] llama_cpp FAILED (exit {proc.returncode}): " + (" | ".join(why[:3]) or "\n".join(lines[-5:])))


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lcpp", type=Path, default=Path(os.environ.get("LLAMA_CPP_DIR", DEFAULT_LCPP)),
                    help=f"llama.cpp source tree (default: $LLAMA_CPP_DIR or {DEFAULT_LCPP})")
    ap.add_argument("--only", action="append", choices=FIXTURES, help="convert only this fixture (repeatable)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="write <out-dir>/<fixture>/model-f32.gguf instead of into tests/golden/")
    ap.add_argument("--hub-schema", action="store_true", help="feed config.hub-schema.json as config.json")
    ap.add_argument("--dump", action="store_true", help="print metadata and tensors of each GGUF")
    ap.add_argument("--dump-only", action="store_true", help="do not convert; only dump existing GGUFs")
    ap.add_argument("--check-llama-cpp", action="store_true",
                    help="run each GGUF through llama_cpp.Llama and compare logits with reference.safetensors")
    ap.add_argument("--check-determinism", action="store_true", help="convert twice and compare bytes")
    ap.add_argument("--verbose", action="store_true", help="show the converter's INFO log")
    ap.add_argument("--llama-cpp-worker", nargs=2, metavar=("FIXTURE", "GGUF"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_cpp_worker:
        return llama_cpp_worker(args.llama_cpp_worker[0], Path(args.llama_cpp_worker[1]))

    fixtures = args.only or FIXTURES
    if not args.dump_only and any(f.startswith("gemma3") for f in fixtures):
        try:
            import sentencepiece  # noqa: F401
        except ImportError:
            sys.exit("error: llama.cpp reads Gemma 3's tokenizer.model with sentencepiece: pip install sentencepiece")
    print(f"llama.cpp converter: {lcpp_version(args.lcpp)} at {args.lcpp}")
    gguf, convert_hf_to_gguf = import_llama_cpp_converter(args.lcpp)
    print(f"gguf-py: {Path(gguf.__file__).parent}")

    def out_for(name: str) -> Path:
        if args.out_dir is None:
            return GOLDEN / name / OUT_NAME
        d = args.out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        return d / OUT_NAME

    import torch

    torch.set_num_threads(1)
    for name in fixtures:
        out = out_for(name)
        if not args.dump_only:
            convert_fixture(name, convert_hf_to_gguf, out, args.hub_schema, args.verbose)
            if args.check_determinism:
                with tempfile.TemporaryDirectory() as tmp:
                    again = Path(tmp) / OUT_NAME
                    convert_fixture(name, convert_hf_to_gguf, again, args.hub_schema, args.verbose)
                    same = again.read_bytes() == out.read_bytes()
                    print(f"[{name}] determinism: second conversion {'identical' if same else 'DIFFERS'}")
                    if not same:
                        return 1
        if args.dump or args.dump_only:
            dump_gguf(gguf, out)
        if args.check_llama_cpp:
            check_llama_cpp(name, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
