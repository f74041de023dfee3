"""Imports run one way (DESIGN.md): chat_app -> gpu -> weights, and inside gpu/ the engine ->
scheduler -> block manager, the model runner -> model -> backends -> kernels, with no circle
anywhere. Every product module's imports are read with ast (lazy imports inside functions and
TYPE_CHECKING blocks count too), so a new module or a new arrow is checked without running it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chat_app", "gpu", "weights")  # top first: each may import only those after it

# gpu's layers, top first. A module may import its own layer and the layers below it, never one
# above. A module belongs to the first entry that is its name or a package above it.
GPU_LAYERS: list[tuple[str, ...]] = [
    # clients of the engine: the benchmark, the OpenAI server
    ("gpu.bench", "gpu.entrypoints"),
    # the public API and what builds and hosts an engine
    ("gpu", "gpu.llm", "gpu.loader", "gpu.engine_core", "gpu.engine_thread"),
    ("gpu.engine", "gpu.output_processor"),
    ("gpu.model_runner", "gpu.sampling_batch"),
    ("gpu.scheduler",),
    ("gpu.block_manager",),
    ("gpu.model", "gpu.model_weights", "gpu.rope"),
    ("gpu.backends",),
    ("gpu.kernels",),
    # plain data every layer shares: requests, batches, settings, sampling metadata
    (
        "gpu.config",
        "gpu.forward_batch",
        "gpu.outputs",
        "gpu.presets",
        "gpu.sampling",
        "gpu.sampling_params",
        "gpu.sampling_presets",
        "gpu.sequence",
    ),
]


def product_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules `name` imports: `from a.b import c` names a.b.c where c is a module,
    else a.b. A package's own __init__ is not implied by importing one of its modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def gpu_layer(name: str) -> int:
    """The index in GPU_LAYERS (0: top) of a gpu module."""
    best = None
    for index, layer in enumerate(GPU_LAYERS):
        for prefix in layer:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    if best is None:
        raise AssertionError(f"{name} is in no layer of GPU_LAYERS: place it there")
    return best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_the_graph_is_read(graph):
    """The reader sees the arrows that are known to exist (a broken reader passes everything)."""
    assert "gpu.kernels.attention_decode" in graph["gpu.backends.cuda.backend"]
    assert "gpu.engine" in graph["gpu.llm"]
    assert "weights.bf16" in graph["gpu.kernels.bf16"]
    assert "gpu.kernels.launch" in graph["gpu.kernels.attention_decode"]


def test_packages_import_downward(graph):
    rank = {package: i for i, package in enumerate(PACKAGES)}
    upward = [
        f"{a} -> {b}"
        for a, deps in graph.items()
        for b in deps
        if rank[b.split(".")[0]] < rank[a.split(".")[0]]
    ]
    assert not upward, "imports that run up (chat_app -> gpu -> weights):\n" + "\n".join(upward)


def test_gpu_layers_import_downward(graph):
    upward = [
        f"{a} -> {b}"
        for a, deps in graph.items()
        if a.split(".")[0] == "gpu"
        for b in deps
        if b.split(".")[0] == "gpu" and gpu_layer(b) < gpu_layer(a)
    ]
    assert not upward, "imports that run up a layer of gpu/:\n" + "\n".join(sorted(upward))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module (circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_circles(graph):
    circles = strongly_connected(graph)
    assert not circles, "modules that import each other:\n" + "\n".join(map(str, circles))


def test_a_circle_and_an_upward_arrow_are_caught():
    """The checks themselves, on a made-up graph."""
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(made_up) == [["a", "b", "c"]]
    assert gpu_layer("gpu.kernels.gemv") > gpu_layer("gpu.backends.cuda.backend")
    assert gpu_layer("gpu.model_runner") < gpu_layer("gpu.model") < gpu_layer("gpu.backends.cpu")
    assert gpu_layer("gpu.engine") < gpu_layer("gpu.scheduler") < gpu_layer("gpu.block_manager")
