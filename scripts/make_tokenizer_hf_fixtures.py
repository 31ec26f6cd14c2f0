"""Small Hugging Face tokenizer directories and their reference tokenizations.

Trains two tiny tokenizers with the `tokenizers` library on the tokenizer corpus and writes
them under crates/model/tests/fixtures/tokenizer_hf/<name>/ (tokenizer.json,
tokenizer_config.json, generation_config.json), plus reference.json holding what
transformers' AutoTokenizer gives for every corpus string:
  ids = tok(text)["input_ids"] (add_special_tokens=True: BOS as the directory says),
  decoded = tok.decode(tok(text, add_special_tokens=False)["input_ids"]).

* byte_level: GPT-2 style byte-level BPE with individual digits; BOS is added by the
  post-processor (tokenizer_config.json does not say add_bos_token); a user-defined token.
* sentencepiece: Llama-style BPE over `▁`-joined text with byte fallback, the legacy
  Prepend/Replace normalizer and add_bos_token = true in tokenizer_config.json.
"""

import json
import sys
from pathlib import Path

from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "model" / "tests" / "fixtures" / "tokenizer_hf"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_corpus import corpus  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] | trim }}"
            "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def byte_level() -> tuple[Tokenizer, dict, dict]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens([AddedToken("<tool>", normalized=False, special=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              "bos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False,
                            "rstrip": False, "normalized": False, "single_word": False},
              "eos_token": "<|im_end|>",
              "chat_template": [{"name": "default", "template": TEMPLATE},
                                {"name": "tool_use", "template": "unused"}]}
    return tok, config, {"eos_token_id": [2, 0]}


def sentencepiece() -> tuple[Tokenizer, dict, dict]:
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    ascii_text = [s for s in corpus() if s.isascii()]
    tok.train_from_iterator(ascii_text, trainer)
    # Byte-fallback pieces <0x00>..<0xFF> become ordinary vocabulary entries.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True,
              "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "chat_template": TEMPLATE}
    return tok, config, {"eos_token_id": 2}


def main() -> None:
    import transformers
    from transformers import AutoTokenizer

    for name, build in [("byte_level", byte_level), ("sentencepiece", sentencepiece)]:
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        tok, config, gen = build()
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
        (d / "generation_config.json").write_text(json.dumps(gen, indent=1) + "\n")
        hf = AutoTokenizer.from_pretrained(str(d))
        cases = []
        for text in corpus():
            ids = hf(text)["input_ids"]
            plain = hf(text, add_special_tokens=False)["input_ids"]
            cases.append({"text": text, "ids": ids, "decoded": hf.decode(plain)})
        ref = {"transformers": transformers.__version__, "bos_token": hf.bos_token,
               "eos_token": hf.eos_token, "cases": cases}
        (d / "reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n",
                                          encoding="utf-8")
        sizes = {p.name: p.stat().st_size for p in d.iterdir()}
        print(name, len(tok.get_vocab()), sizes)


if __name__ == "__main__":
    main()
