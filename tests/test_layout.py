"""The package's layout: no import cycles, each floor imports only the floors below it,
nothing under the session touches the terminal, and `import llama_chat` stays light.

Imports are read from the source, so every one counts: at module level, inside functions,
under TYPE_CHECKING, and module names handed to importlib as strings.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llama_chat"

# Floors in the order data flows through them; a module may import its own floor and lower ones.
FLOORS = [
    {"errors", "options", "paths", "disk_cache", "directories", "process_memory"},
    {"text"},
    {"engine"},
    {"checkpoints"},
    {"kernels", "parallel"},
    {"llama", "loading", "default_model", "model_info"},
    {"chat"},
    {"repl", "train"},
    {"cli", "__main__", "__init__"},
]
SESSION_FLOOR = next(number for number, floor in enumerate(FLOORS) if "chat" in floor)
TERMINAL_MODULES = {"rich", "prompt_toolkit", "termios", "tty", "curses"}


def module_name(path: Path) -> str:
    parts = ["llama_chat", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, modules: set[str]) -> set[str]:
    """Every module an AST imports: `import X`, `from X import Y` (X.Y when that is one of
    `modules`, else X), and string constants that name a submodule (for importlib)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "imports inside the package are absolute"
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Constant) and node.value in modules and "." in node.value:
            names.add(node.value)
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The imports between the package's modules, and everything each module imports."""
    sources = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    everything = {
        name: imported_names(ast.parse(path.read_text(encoding="utf-8")), set(sources))
        for name, path in sources.items()
    }
    graph = {name: (imported & set(sources)) - {name} for name, imported in everything.items()}
    return graph, everything


def floor_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for number, floor in enumerate(FLOORS):
        if top in floor:
            return number
    raise AssertionError(f"{module} is on no floor: add its package to FLOORS")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other (size > 1)."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_the_graph_sees_imports_inside_functions_and_as_strings():
    graph, _ = import_graph()
    # cli imports the chat inside main(), and names the sub-commands' modules as strings.
    assert "llama_chat.cli.chat" in graph["llama_chat.cli"]
    assert "llama_chat.cli.bench" in graph["llama_chat.cli.subcommands"]
    # a cycle made of such imports is found
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph, _ = import_graph()
    assert strongly_connected(graph) == []


def test_each_floor_imports_only_itself_and_the_floors_below():
    graph, _ = import_graph()
    upward = sorted(
        f"{module} -> {target}" for module, targets in graph.items() for target in targets
        if floor_of(target) > floor_of(module)
    )
    assert upward == []


@pytest.mark.parametrize("floor", range(SESSION_FLOOR + 1))
def test_nothing_up_to_the_session_knows_the_terminal(floor):
    _, everything = import_graph()
    touching = sorted(
        f"{module} imports {name}" for module, names in everything.items() if floor_of(module) == floor
        for name in names if name.split(".")[0] in TERMINAL_MODULES
    )
    assert touching == []


def test_import_llama_chat_pulls_in_no_checkpoint_reader_template_engine_or_terminal():
    code = (
        "import sys, llama_chat\n"
        "from llama_chat import Llama, SamplingSettings\n"
        "print(sorted(m for m in ('jinja2', 'gguf', 'safetensors', 'sentencepiece', 'rich', 'prompt_toolkit',"
        " 'llama_chat.loading', 'llama_chat.checkpoints.gguf', 'llama_chat.checkpoints.hf') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


BACKEND_MODULES = "kernels/*backend*.py"  # the back-ends and their interface (kernels/backend.py)


def backend_classes() -> set[str]:
    """WeightBackend and every class of the back-end modules derived from it."""
    bases = {}
    for path in PACKAGE.glob(BACKEND_MODULES):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {base.id for base in node.bases if isinstance(base, ast.Name)}
    found = {"WeightBackend"}
    while more := {name for name, parents in bases.items() if parents & found} - found:
        found |= more
    return found


def type_tests_of(tree: ast.AST, classes: set[str]) -> list[str]:
    """Each isinstance or issubclass in `tree` naming one of `classes` (alone or in a tuple)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2
                and node.func.id in ("isinstance", "issubclass")):
            continue
        second = node.args[1]
        for candidate in second.elts if isinstance(second, ast.Tuple) else [second]:
            name = candidate.id if isinstance(candidate, ast.Name) else getattr(candidate, "attr", None)
            if name in classes:
                found.append(f"line {node.lineno}: {node.func.id}(..., {name})")
    return found


def test_the_type_test_check_sees_back_end_classes_however_named():
    classes = backend_classes()
    assert {"WeightBackend", "PackedBackend", "DenseWeights", "PyTorchKernels", "BlockKernels"} <= classes
    assert "Source" not in classes  # a class of those modules that is no back-end
    source = "if isinstance(b, (int, BlockKernels)) or isinstance(b, block_backend.PyTorchKernels): pass\n"
    assert type_tests_of(ast.parse(source), classes) == [
        "line 1: isinstance(..., BlockKernels)", "line 1: isinstance(..., PyTorchKernels)"
    ]
    assert type_tests_of(ast.parse("isinstance(module, BlockLinear)"), classes) == []


def test_only_the_back_end_modules_tell_back_ends_apart_by_type():
    """The rest of the package (the loader first) calls the back-ends' interface, whichever
    back-end was chosen."""
    classes = backend_classes()
    inside = set(PACKAGE.glob(BACKEND_MODULES))
    found = [
        f"{module_name(path)} {use}" for path in sorted(PACKAGE.rglob("*.py")) if path not in inside
        for use in type_tests_of(ast.parse(path.read_text(encoding="utf-8")), classes)
    ]
    assert found == []
