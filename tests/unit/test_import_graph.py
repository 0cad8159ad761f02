"""The import graph of supervisor/: no cycles, no arrow up the layers, and the daemon never imports the dev server.

Every `import` and `from ... import` in supervisor/**/*.py counts, wherever it stands (a function-level import
is an arrow too). The layers, lowest first; a module belongs to the longest prefix that names it, and may
import its own layer and the layers below:

  base     the package itself, backoff, exactjson, exitcodes, cpus, sdkworker, job (the claimed job's record,
           which the parent and the child read), cli (its subcommands are imported by name at run time), proto
           (the gRPC API and its generated stubs)
  client   the API clients: calls (Call, typed errors), transport (the interface), rest, blocking, loophttp,
           httpconn, grpc_transport, events, hosts
  ops      services any process may use: logs, title, nullhooks (the hooks interface), metrics, health,
           notify, cgroup, procmem, budget, deletion_cost
  config   flags, variables -> Config
  child    the child process and its forkserver
  parent   the parts of the parent the arbiter wires (pool, membership, pacer, ...), its facts, its hooks
  jobs     parent.jobs: the jobs wing (the in-flight table, claiming, settling), which knows the parts
           below it only through the facts and orders it returns
  arbiter  parent.arbiter: the loop, which wires the parts and the wing
  top      what wires it together: commands, testing, demo_handlers, __main__

The dev server is beside them: it may import the base layer only, and nothing outside it imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())  # wherever tests/ nests it
PACKAGE = ROOT / "supervisor"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("supervisor", "supervisor.backoff", "supervisor.exactjson", "supervisor.exitcodes", "supervisor.cpus",
              "supervisor.sdkworker", "supervisor.job", "supervisor.cli", "supervisor.proto")),
    ("client", ("supervisor.client",)),
    ("ops", ("supervisor.ops",)),
    ("config", ("supervisor.config",)),
    ("child", ("supervisor.child",)),
    ("parent", ("supervisor.parent",)),
    ("jobs", ("supervisor.parent.jobs",)),
    ("arbiter", ("supervisor.parent.arbiter",)),
    ("top", ("supervisor.commands", "supervisor.testing", "supervisor.demo_handlers", "supervisor.__main__")),
]
DEVSERVER = "supervisor.devserver"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The supervisor modules `node` imports (a `from pkg import name` counts pkg.name when it is a module)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for target in targets:
        while target and target not in known:  # `import supervisor.client.rest.X`: the module is the prefix
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(imported(name, path, node, known))
    return graph


def layer_of(name: str) -> int | None:
    """The index in LAYERS of the longest prefix naming `name`; None for the dev server."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return None if name == DEVSERVER or name.startswith(DEVSERVER + ".") else best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_every_module():
    graph = import_graph()
    assert {"supervisor.parent.arbiter", "supervisor.client.rest", "supervisor.devserver.app"} <= set(graph)
    assert "supervisor.client.calls" in graph["supervisor.client.rest"]  # `from supervisor.client.calls import ...`
    assert "supervisor.devserver.store" in graph["supervisor.devserver.grpc_server"]  # relative imports resolve
    assert "supervisor.proto.spooled_pb2" in graph["supervisor.client.grpc_transport"]  # function-level ones count


def test_every_module_has_a_layer():
    assert [name for name in import_graph() if layer_of(name) is None and not name.startswith(DEVSERVER)] == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_higher_layer():
    upward = []
    for name, targets in sorted(import_graph().items()):
        mine = layer_of(name)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} ({LAYERS[mine][0]}) -> {target} ({LAYERS[theirs][0]})")
    assert upward == []


def test_the_daemon_never_imports_the_dev_server_and_the_dev_server_only_the_base():
    wrong = []
    for name, targets in sorted(import_graph().items()):
        inside = name.startswith(DEVSERVER)
        embeds = name == "supervisor.commands.dev"  # `dev` runs the dev server in its own process, beside the daemon
        for target in sorted(targets):
            if not inside and not embeds and target.startswith(DEVSERVER):
                wrong.append(f"{name} -> {target}")
            if inside and not target.startswith(DEVSERVER) and layer_of(target) != 0:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_checks_catch_a_cycle_and_an_upward_arrow():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("supervisor.parent.hooks") > layer_of("supervisor.config") > layer_of("supervisor.ops.logs")
    assert layer_of("supervisor.parent.arbiter") > layer_of("supervisor.parent.jobs.wing") > layer_of(
        "supervisor.parent.pool") > layer_of("supervisor.child.wire") > layer_of("supervisor.job")
    assert layer_of("supervisor.proto.spooled_pb2") == 0 and layer_of("supervisor.devserver.app") is None
