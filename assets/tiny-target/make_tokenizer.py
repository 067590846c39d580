#!/usr/bin/env python3
"""Tokenizer files of the embedded tiny target: tokenizer.json and tokenizer_config.json.

The tiny target is byte-level (see README.md): token id = byte value 0..255, 256 = MASK (the
drafter's mask token, never in data), 257 = EOS/BOS (<|endoftext|>), 258..263 unused by
training. This writes that vocabulary as an HF `tokenizers` file — a BPE model without merges
over the GPT-2 byte-to-unicode alphabet, ordered so that the byte value is the id, a ByteLevel
pre-tokenizer without the split regex and a ByteLevel decoder — with 256..263 as added
special tokens: 256 <|mask|>, 257 <|endoftext|>, 258 <|im_start|>, 259 <|im_end|>,
260..263 <|unused_0|>..<|unused_3|>.

tokenizer_config.json carries a ChatML chat template (the Qwen form without thinking):
    <|im_start|>{role}\\n{content}<|im_end|>\\n ... [<|im_start|>assistant\\n]
<|im_start|> and <|im_end|> never occurred in the target's training text, so their
embeddings are untrained: conversations prepared with this template exercise the whole
`dflash prepare` -> `dflash train` path, not a chat model.

Usage: python3 assets/tiny-target/make_tokenizer.py [--out-dir DIR]
Needs only the standard library; with `tokenizers` (and `transformers`) installed it also
checks the result: every byte encodes to its own id, the specials to theirs, and
apply_chat_template renders and tokenizes as expected.
"""
import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

SPECIALS = ["<|mask|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
            "<|unused_0|>", "<|unused_1|>", "<|unused_2|>", "<|unused_3|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json():
    b2u = bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, s in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {b2u[b]: b for b in range(256)},
            "merges": [],
        },
    }


def tokenizer_config():
    return {
        "added_tokens_decoder": {
            str(256 + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)
        },
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def check(out_dir):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("tokenizers not installed: not checked")
        return
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    text = "déf f(x):\n\treturn x  # ✓"
    enc = tok.encode(text, add_special_tokens=False)
    assert enc.ids == list(text.encode("utf-8")), enc.ids
    assert tok.encode("<|im_start|>a<|im_end|><|endoftext|>").ids == [258, 97, 259, 257]
    assert tok.get_vocab_size(with_added_tokens=True) == 264
    assert tok.decode(list(text.encode("utf-8"))) == text
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("transformers not installed: chat template not checked")
        return
    t = AutoTokenizer.from_pretrained(out_dir)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rendered = t.apply_chat_template(msgs, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n", rendered
    ids = t.apply_chat_template(msgs, tokenize=True, return_dict=False)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    assert ids == [258, *b"user\nhi", 259, 10, 258, *b"assistant\nyo", 259, 10], ids
    print("checked with tokenizers and transformers")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    for name, obj in (("tokenizer.json", tokenizer_json()), ("tokenizer_config.json", tokenizer_config())):
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2)
            f.write("\n")
    check(args.out_dir)


if __name__ == "__main__":
    main()
