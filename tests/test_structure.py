"""The packages' import structure, read from the source (nothing is imported): the runtime's
modules import each other without a cycle, imports inside functions included; and the
emulator, a backend below the runtime's API, takes nothing from that API."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = "zyfa_runtime"


def modules(package: str) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of ``package`` (a package as its __init__)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict) -> list[tuple[str, str | None, int]]:
    """Every import in the module, at any depth of its code: (the module imported, the name
    taken from it where ``from M import name`` takes no submodule, line).  ``known``: the modules
    a ``from M import x`` may name as a submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, None, node.lineno) if sub in known else (base, a.name, node.lineno))
    return found


def own_names(init: pathlib.Path) -> set[str]:
    """The names a package's __init__ binds before its first import (``__version__``): taking
    one needs none of the modules the __init__ imports."""
    names = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def runtime_graph() -> dict[str, set[str]]:
    """Module -> the runtime modules it imports.  Importing ``a.b`` also runs ``a``'s __init__;
    that is not counted as ``a`` being imported."""
    mods = modules(RUNTIME)
    early = own_names(mods[RUNTIME])
    graph = {}
    for name, path in mods.items():
        graph[name] = {target for target, taken, _ in imports(name, path, mods)
                       if target in mods and target != name and not (target == RUNTIME and taken in early)}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its modules in order, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False


def test_the_runtime_modules_import_each_other_without_a_cycle():
    found = cycle(runtime_graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_emulator_takes_nothing_from_the_runtime_api():
    """zyfa_emulator is a driver backend: it may use the driver interface
    (zyfa_runtime.driver.base), the errors and the catalogue, but not the public API --
    neither zyfa_runtime.api nor a module that leads to it, nor a name of the package's own
    face (``from zyfa_runtime import flash_attn_func``)."""
    graph, runtime = runtime_graph(), modules(RUNTIME)
    early = own_names(runtime[RUNTIME])
    bad = []
    for name, path in modules("zyfa_emulator").items():
        for target, taken, line in imports(name, path, runtime):
            face = target == RUNTIME and taken not in early
            api = target != RUNTIME and target in runtime and reaches(graph, target, f"{RUNTIME}.api")
            if face or api:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {target}{'.' + taken if taken else ''}")
    assert not bad, "the emulator imports the runtime's API: " + ", ".join(bad)
