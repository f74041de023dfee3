"""docs/course.md names real code: every `file:Name` it cites is defined there (read with ast,
nothing imported), every path and pytest node id it gives exists, its chapters are the course's
list in order, each with its three parts. The scripts of docs/examples/ check their own claims
(a forward equals the engine's, online softmax equals softmax, ...): they run here, in-process,
on toy sizes."""

from __future__ import annotations

import ast
import re
import runpy
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "docs" / "course.md"
EXAMPLES = ROOT / "docs" / "examples"

CHAPTERS = [
    "Safetensors and your model",
    "Floating point and bfloat16",
    "GPU and CPU memory",
    "Single-token inference",
    "Tokenization",
    "Embedding",
    "The embedding kernel",
    "RMSNorm and parallel reduction",
    "RoPE",
    "Residual connections",
    "cublasGemmEx",
    "The column-major to row-major transpose trick",
    "Prefill vs decode",
    "Why the KV cache exists",
    "Attention",
    "GQA",
    "SiLU",
    "Softmax",
    "The causal mask",
    "Argmax",
    "The feed-forward network",
    "Buffer reuse",
    "Static batching",
    "Continuous batching",
    "Online softmax",
    "PagedAttention",
    "The paged KV cache",
    "The paged-attention kernel",
    "Sampling on the GPU",
    "The engine core and the server",
    "Batch invariance",
]
PARTS = ("**Read first**", "**Fast**", "**See it work**")

CODE_REF = re.compile(r"`([\w./-]+\.py):([A-Za-z_][\w.]*)`")
NODE_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)(?:::(\w+))?")
PATH = re.compile(r"\b((?:gpu|weights|chat_app|tests|docs)/[\w/]+\.py)\b")
SCRIPT = re.compile(r"`python (docs/examples/\w+\.py)")


def course() -> str:
    return COURSE.read_text(encoding="utf-8")


def chapters() -> list[tuple[str, str]]:
    parts = re.split(r"^## \d+\. (.+)$", course(), flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


@cache
def definitions(path: str) -> dict[str, ast.AST]:
    """Names a module defines at its top level (functions, classes, assignments, also inside
    module-level if/try blocks), and Class.method for the methods of its classes."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            names[f"{node.name}.{item.name}"] = item
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return names


def test_the_chapters_are_the_course_in_order_each_with_its_three_parts() -> None:
    found = chapters()
    assert [title for title, _ in found] == CHAPTERS
    for title, text in found:
        missing = [part for part in PARTS if part not in text]
        assert not missing, f"chapter {title!r} lacks {missing}"
        assert CODE_REF.search(text), f"chapter {title!r} names no file:function"


def test_every_file_and_function_it_names_exists() -> None:
    refs = sorted(set(CODE_REF.findall(course())))
    assert len(refs) > 50
    missing = []
    for path, name in refs:
        if not (ROOT / path).is_file():
            missing.append(f"{path} (no such file)")
        elif name not in definitions(path):
            missing.append(f"{path}:{name}")
    assert not missing, "docs/course.md names what does not exist: " + ", ".join(missing)


def test_every_path_it_mentions_exists() -> None:
    paths = sorted(set(PATH.findall(course())))
    assert not [p for p in paths if not (ROOT / p).is_file()]


def test_every_test_it_runs_exists() -> None:
    ids = sorted(set(NODE_ID.findall(course())))
    assert len(ids) >= 20
    missing = []
    for path, first, second in ids:
        if not (ROOT / path).is_file():
            missing.append(path)
            continue
        name = f"{first}.{second}" if second else first
        if name not in definitions(path) or not name.split(".")[-1].startswith("test"):
            missing.append(f"{path}::{name.replace('.', '::')}")
    assert not missing, "docs/course.md runs tests that do not exist: " + ", ".join(missing)


def test_every_example_it_runs_is_in_docs_examples() -> None:
    scripts = set(SCRIPT.findall(course()))
    assert scripts, "the course runs no example"
    on_disk = {
        f"docs/examples/{p.name}" for p in EXAMPLES.glob("*.py") if p.name != "tiny_model.py"
    }
    assert scripts == on_disk


@pytest.mark.parametrize(
    "script", sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "tiny_model.py")
)
def test_example_runs_and_its_checks_hold(script: str, monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [script])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    assert capsys.readouterr().out.strip()
