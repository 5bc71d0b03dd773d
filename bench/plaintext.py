"""What sentence-transformers' plain-text handling of a chat-template folder costs the worker's CPU side: prepare
(tokenise) of the corpus's first `--limit` texts as requests of `--chunk` texts, on all-MiniLM-L6-v2 given a chat
template and a `message` modality (as ST 6 saves such a folder), rendered as user messages (the default) vs
tokenised raw (--raw-text), rows alternating in one run, each row's best of `--repeat`. No forward pass.

    PYTHONPATH=. .venv/bin/python bench/plaintext.py [--limit 2000] [--chunk 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from bench._common import Timer, add_corpus_flags, describe_machine, load_corpus, model_path, ratio, table
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.preprocess import prepare

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_folder(root: str) -> str:
    """MiniLM with a chat template and the `message` entry ST 6 writes for such a tokenizer."""
    from transformers import AutoTokenizer

    folder = os.path.join(root, "minilm-chat")
    shutil.copytree(model_path(), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    path = os.path.join(folder, "sentence_bert_config.json")
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    forward = {"method": "forward", "method_output_name": "last_hidden_state"}
    config["modality_config"] = {"text": forward, "message": {**forward, "format": "flat"}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, 2000)
    parser.add_argument("--chunk", type=int, default=32, help="texts per request")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs; each row keeps its best")
    args = parser.parse_args()
    texts = load_corpus(args.corpus, args.limit)
    requests = [EmbedRequest(model="m", inputs=texts[i:i + args.chunk], params={"truncate_prompt_tokens": -1})
                for i in range(0, len(texts), args.chunk)]
    with tempfile.TemporaryDirectory() as root:
        folder = chat_folder(root)
        models = {"messages (ST 6, default)": load_model(folder, served_name="m"),
                  "raw (--raw-text)": load_model(folder, served_name="m", raw_text=True)}
        best = dict.fromkeys(models, 0.0)
        tokens = {}
        for _ in range(args.repeat):
            for label, model in models.items():
                with Timer() as timer:
                    tokens[label] = sum(prepare(model, request).prompt_tokens for request in requests)
                best[label] = max(best[label], len(texts) / timer.seconds)
    raw = best["raw (--raw-text)"]
    rows = [[label, rate, ratio(rate, raw), tokens[label] / len(texts)] for label, rate in best.items()]
    print(describe_machine())
    print(table(["plain text", "texts/s (prepare)", "x raw", "tokens/text"], rows,
                f"prepare of {len(texts)} texts in requests of {args.chunk}, best of {args.repeat}"))


if __name__ == "__main__":
    main()
