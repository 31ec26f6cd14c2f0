"""A vocabulary-only GGUF with a SentencePiece (`tokenizer.ggml.model = llama`) vocabulary,
and llama.cpp's tokenization of the tokenizer corpus with it.

Trains a small SentencePiece BPE model (byte fallback on) on the corpus, writes its pieces,
scores and types into crates/model/tests/fixtures/tokenizer_spm/vocab.gguf the way
llama.cpp's converter does for Llama/Mistral vocabularies (types: 1 normal, 2 unknown,
3 control, 6 byte), and records llama-cpp-python's ids
(`tokenize(text, add_bos=True, special=True)`: BOS as add_bos_token says) in reference.json.
"""

import io
import json
import sys
from pathlib import Path

import gguf
import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "model" / "tests" / "fixtures" / "tokenizer_spm"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_corpus import corpus  # noqa: E402


def train() -> spm.SentencePieceProcessor:
    model = io.BytesIO()
    lines = [s.replace("\n", " ") for s in corpus() if s.strip()] * 3
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=600,
        byte_fallback=True, character_coverage=0.98, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def write_gguf(sp: spm.SentencePieceProcessor, path: Path) -> None:
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        elif tokens[-1].startswith("<|"):
            types.append(4)
        else:
            types.append(1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    import llama_cpp

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "vocab.gguf"
    write_gguf(train(), path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = [{"text": t, "ids": [int(i) for i in llm.tokenize(t.encode(), add_bos=True,
                                                               special=True)]}
             for t in corpus()]
    ref = {"llama_cpp_python": llama_cpp.__version__, "cases": cases}
    (OUT / "reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n",
                                        encoding="utf-8")
    print(path.stat().st_size, len(cases))


if __name__ == "__main__":
    main()
