"""The package's layout: no import cycles, each floor imports only the floors below it,
nothing under the session touches the terminal, and `import llama_chat` stays light.

Imports are read from the source, so every one counts: at module level, inside functions,
under TYPE_CHECKING, and module names handed to importlib as strings.
"""

import ast
import collections
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llama_chat"

# Floors in the order data flows through them; a module may import its own floor and lower ones.
FLOORS = [
    {"errors", "options", "environment", "paths", "disk_cache", "directories", "process_memory", "parent_watch",
     "untrusted_files"},
    {"text", "tools"},
    {"engine"},
    {"checkpoints"},
    {"kernels", "parallel"},
    {"llama", "loading", "default_model", "model_info", "models"},
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


ENVIRONMENT_MODULE = "llama_chat.environment"  # the one module that reads LLAMA_CHAT_* variables


def environment_reads(tree: ast.AST) -> set[str]:
    """The LLAMA_CHAT_* variables a module reads: `os.environ[NAME]`, `X.environ.get(NAME)`,
    `os.getenv(NAME)`, and `environ.get(NAME)` or `environ[NAME]` on a mapping called environ,
    NAME being the variable's name or a module-level constant holding it."""
    constants = {
        target.id: node.value.value
        for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def named(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id in ("environ", "environment"))

    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            reads.add(named(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            function = node.func
            if (function.attr in ("get", "pop", "setdefault") and is_environ(function.value)) or (
                function.attr == "getenv" and isinstance(function.value, ast.Name) and function.value.id == "os"
            ):
                reads.add(named(node.args[0]))
    return {name for name in reads if name and name.startswith("LLAMA_CHAT_")}


def test_the_environment_reads_are_found_however_written():
    source = (
        "import os\nLIBRARY = 'LLAMA_CHAT_KERNELS_LIBRARY'\n"
        "def f(environ):\n"
        "    return (os.environ.get('LLAMA_CHAT_A'), os.environ['LLAMA_CHAT_B'], os.getenv(LIBRARY),\n"
        "            environ.get('LLAMA_CHAT_C', '1'), os.environ.get('HOME'), 'LLAMA_CHAT_D=off: a message')\n"
    )
    assert environment_reads(ast.parse(source)) == {"LLAMA_CHAT_A", "LLAMA_CHAT_B", "LLAMA_CHAT_KERNELS_LIBRARY",
                                                     "LLAMA_CHAT_C"}


def test_only_the_environment_module_reads_llama_chat_variables():
    sources = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    readers = {
        name: sorted(environment_reads(ast.parse(path.read_text(encoding="utf-8"))))
        for name, path in sources.items()
    }
    assert readers[ENVIRONMENT_MODULE]  # the reads are seen where they are
    assert {name: reads for name, reads in readers.items() if reads and name != ENVIRONMENT_MODULE} == {}


def variable_names(tree: ast.AST) -> set[str]:
    """The LLAMA_CHAT_* variables a module names as strings of their own (to read them, or to
    pass them on to a child), not within messages."""
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"LLAMA_CHAT_[A-Z0-9_]+", node.value)}


def test_only_the_environment_module_names_llama_chat_variables():
    """Another module passes a variable on to a child through environment.py's helpers, and
    names none itself."""
    named = {module_name(path): sorted(variable_names(ast.parse(path.read_text(encoding="utf-8"))))
             for path in PACKAGE.rglob("*.py")}
    assert named[ENVIRONMENT_MODULE]  # the names are seen where they are
    assert {name: found for name, found in named.items() if found and name != ENVIRONMENT_MODULE} == {}


def test_the_attention_kernel_counts_held_positions_by_an_integer():
    """No bias tensor whose length carries the position: the kernel takes the position, and
    a mask only where one hides something."""
    users = [module_name(path) for path in sorted(PACKAGE.rglob("*")) if path.suffix in (".py", ".cpp", ".h")
             and "past_bias" in path.read_text(encoding="utf-8")]
    assert users == []


# The floors of a package a newcomer can read: short functions and modules, each name one
# thing, nothing kept only for the tests.
MAX_FUNCTION_LINES, MAX_MODULE_LINES = 50, 400
ENTRY_POINTS = {"main"}  # each command's module has its own
STORE_READERS = {"store_roots"}  # each other tool's store (models/ollama.py, models/lmstudio.py) names its folders alike
HOOKS = {"extra_repr", "reset_parameters", "unsafe_undefined", "validate_tool_result"}  # called by PyTorch, jinja2, mcp


def package_sources() -> dict[str, str]:
    return {module_name(path): path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")}


def oversized(name: str, source: str) -> list[str]:
    """The module if it is over MAX_MODULE_LINES, and each function of it over MAX_FUNCTION_LINES."""
    found = [f"{name}: {lines} lines"] if (lines := len(source.splitlines())) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}.{node.name}: {length} lines")
    return found


def public_definitions(source: str) -> list[str]:
    """The module's public classes and functions, and its classes' public methods."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            names.append(node.name)
        if isinstance(node, ast.ClassDef):
            names += [item.name for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_")]
    return names


def unused_definitions(sources: dict[str, str]) -> list[str]:
    """Public names no module of the package names beyond their definitions (a use by the
    tests alone does not count)."""
    defined = collections.Counter(name for source in sources.values() for name in public_definitions(source))
    text = "\n".join(sources.values())
    return sorted(name for name, count in defined.items()
                  if name not in HOOKS and len(re.findall(rf"\b{re.escape(name)}\b", text)) <= count)


def test_the_floor_checks_see_what_they_look_for():
    long_body = "\n".join(f"    x = {n}" for n in range(MAX_FUNCTION_LINES))
    assert oversized("m", f"def f():\n{long_body}\n") == ["m.f: 51 lines"]
    assert oversized("m", "x = 1\n" * (MAX_MODULE_LINES + 1)) == [f"m: {MAX_MODULE_LINES + 1} lines"]
    sources = {"a": "class A:\n    def used(self): pass\n    def spare(self): pass\ndef g(): A().used()\n",
               "b": "from a import g\ng()\n"}
    assert unused_definitions(sources) == ["spare"]


def test_no_function_over_50_lines_and_no_module_over_400():
    assert [found for name, source in package_sources().items() for found in oversized(name, source)] == []


def test_each_public_name_is_defined_once():
    """A name defined in two modules is two different things under one name, but for the
    commands' entry points and the other tools' store readers, which are one thing each."""
    where = collections.defaultdict(list)
    for name, source in package_sources().items():
        for node in ast.parse(source).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                where[node.name].append(name)
    shared = ENTRY_POINTS | STORE_READERS
    assert {name: modules for name, modules in where.items() if len(modules) > 1 and name not in shared} == {}


def test_nothing_in_the_package_is_there_for_the_tests_alone():
    assert unused_definitions(package_sources()) == []



ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def message_way() -> tuple[set[str], int]:
    """A message sent through the real REPL with a tiny model: the package's modules on the
    stack wherever it changes form (encoded, through the model, sampled, detokenized, shown),
    and the most generator frames on the stack at a model call."""
    from llama_chat import SamplingSettings
    from llama_chat.chat.session import Session

    from .test_repl import chat
    from .test_session import chat_model

    points = {("llama_chat.text.tokenizer", "encode"), ("llama_chat.engine.model", "forward")}
    whole = {"llama_chat.text.detokenizer", "llama_chat.engine.sampling"}
    modules, generators = set(), 0

    def on_stack(frame) -> None:
        nonlocal generators
        names, count = set(), 0
        while frame is not None:
            if (name := frame.f_globals.get("__name__", "")).startswith("llama_chat"):
                names.add(name)
                count += bool(frame.f_code.co_flags & inspect.CO_GENERATOR)
            frame = frame.f_back
        modules.update(names)
        if "llama_chat.engine.model" in names:
            generators = max(generators, count)

    def profile(frame, event, _) -> None:
        name, function = frame.f_globals.get("__name__", ""), frame.f_code.co_name
        shown = name.startswith("rich.console") and function == "print"
        if event == "call" and ((name, function) in points or name in whole or shown):
            on_stack(frame)

    session = Session(chat_model(), SamplingSettings(max_tokens=4))
    chat(session, "hi", "/quit")  # what a first message alone does (imports, a first compile) is done
    sys.setprofile(profile)
    try:
        chat(session, "hello there", "/quit")
    finally:
        sys.setprofile(None)
    return modules, generators


def test_the_way_of_a_message_is_the_one_documented_with_one_generator_a_token():
    block = ARCHITECTURE.read_text(encoding="utf-8").split("```")[1]  # the way of one message
    documented = {"llama_chat." + path.removesuffix(".py").replace("/", ".")
                  for path in re.findall(r"\b[a-z_]+(?:/[a-z_]+)?\.py\b", block)}
    modules, generators = message_way()
    assert {"llama_chat.engine.model", "llama_chat.text.tokenizer", "llama_chat.repl.render"} <= modules
    assert sorted(modules - documented) == []
    assert len(modules) <= 12, sorted(modules)
    assert generators == 1  # Turn.events: the model's tokens reach the screen through no other
