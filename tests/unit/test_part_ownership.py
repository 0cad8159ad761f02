"""Each part of the parent owns its state: an attribute is assigned only by its own class's methods,
on `self`, and declared in that class's `__init__` (or as a dataclass field).

Read from the source with `ast`, so a newcomer's `other.attr = ...` fails here before review. The one
exception is by design: `Entry` is `InFlight`'s record, and `InFlight`'s methods write its fields.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PARENT = Path(__file__).resolve().parents[2] / "supervisor" / "parent"
# (class whose methods may write, class whose fields they write): Entry is InFlight's record.
RECORDS = {("InFlight", "Entry")}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "sort", "reverse", "__setitem__", "__delitem__"}


@dataclass(frozen=True)
class Violation:
    where: str  # file:line
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def declared(cls: ast.ClassDef) -> set[str]:
    """What a class declares: class-body fields (dataclass fields, constants) and `self.x` set in __init__."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for target in assigned_targets(node):
                if isinstance(target, ast.Attribute) and is_self(target.value):
                    names.add(target.attr)
    return names


CONTAINER_TYPES = {"dict", "list", "set", "deque", "SimpleQueue", "defaultdict", "OrderedDict"}


def names_in(node: ast.AST | None) -> set[str]:
    """The names and attribute names in an expression: `collections.deque` -> {"collections", "deque"}."""
    if node is None:
        return set()
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def is_container(value: ast.AST | None, annotation: ast.AST | None = None) -> bool:
    """A declaration that makes a dict, list, set or queue (by its literal, its constructor or its annotation)."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call) and names_in(value.func) & (CONTAINER_TYPES | {"field"}):
        return bool(names_in(value.func) & CONTAINER_TYPES) or any(
            names_in(k.value) & CONTAINER_TYPES for k in value.keywords if k.arg == "default_factory")
    return annotation is not None and isinstance(annotation, ast.Subscript) and bool(
        names_in(annotation.value) & CONTAINER_TYPES)


def container_attrs(cls: ast.ClassDef) -> set[str]:
    """The attributes a class declares as containers (whose mutating methods change its state)."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_container(node.value,
                                                                                                  node.annotation):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.AnnAssign) and owned_by_self(stmt.target) and is_container(stmt.value,
                                                                                                   stmt.annotation):
                    names.add(stmt.target.attr)  # type: ignore[union-attr]
                elif isinstance(stmt, ast.Assign) and is_container(stmt.value):
                    names.update(t.attr for t in stmt.targets if owned_by_self(t))  # type: ignore[union-attr]
    return names


def flatten(target: ast.expr) -> list[ast.expr]:
    """`a, (b, *c) = ...` -> [a, b, c]."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for elt in target.elts for t in flatten(elt)]
    if isinstance(target, ast.Starred):
        return flatten(target.value)
    return [target]


def targets_of(node: ast.AST) -> list[ast.expr]:
    """What one statement assigns (or deletes)."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    return []


def assigned_targets(fn: ast.AST) -> list[ast.expr]:
    """Every expression assigned (or deleted) in `fn`, tuples unpacked."""
    return [t for node in ast.walk(fn) for target in targets_of(node) for t in flatten(target)]


def is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def owned_by_self(node: ast.expr) -> bool:
    """`self.x` (one step from self): the object's own attribute, so its container is its own."""
    return isinstance(node, ast.Attribute) and is_self(node.value)


@dataclass(frozen=True)
class Scope:
    """A function being checked: its file, its class (None at module level) and what it may write."""

    rel: Path
    fn: ast.FunctionDef | ast.AsyncFunctionDef
    cls: ast.ClassDef | None
    own: frozenset[str]  # its class's declared attributes
    record_fields: frozenset[str]  # fields of records it owns (InFlight: Entry's)
    containers: frozenset[str]  # attribute names any class declares as a container

    def at(self, node: ast.AST) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', '?')}"

    @property
    def name(self) -> str:
        return f"{self.cls.name}.{self.fn.name}" if self.cls else self.fn.name


def check_attribute(target: ast.Attribute, scope: Scope) -> list[Violation]:
    text = ast.unparse(target)
    if is_self(target.value):
        if scope.cls is None:
            return [Violation(scope.at(target), f"`{text}` assigned outside a class")]
        if target.attr not in scope.own:
            return [Violation(scope.at(target), f"`{text}` is not declared in {scope.cls.name}.__init__ or its fields")]
        return []
    if isinstance(target.value, ast.Name) and target.attr in scope.record_fields:
        return []  # InFlight writing its Entry
    return [Violation(scope.at(target), f"`{text}` assigns another object's attribute (in {scope.name})")]


def check_target(target: ast.expr, scope: Scope) -> list[Violation]:
    if isinstance(target, ast.Attribute):
        return check_attribute(target, scope)
    container = target.value if isinstance(target, ast.Subscript) else None
    if isinstance(container, ast.Attribute) and not owned_by_self(container):
        return [Violation(scope.at(target), f"`{ast.unparse(target)}` changes another object's container")]
    return []


def check_call(node: ast.Call, scope: Scope) -> list[Violation]:
    func = node.func
    if (isinstance(func, ast.Name) and func.id in ("setattr", "delattr")) or (
            isinstance(func, ast.Attribute) and func.attr == "__setattr__"):
        return [Violation(scope.at(node), f"`{ast.unparse(node)}`")]
    if (isinstance(func, ast.Attribute) and func.attr in MUTATORS and isinstance(func.value, ast.Attribute)
            and func.value.attr in scope.containers and not owned_by_self(func.value)):
        return [Violation(scope.at(node), f"`{ast.unparse(func)}(...)` changes another object's container")]
    return []


def check_function(scope: Scope) -> list[Violation]:
    found = [v for target in assigned_targets(scope.fn) for v in check_target(target, scope)]
    found += [v for node in ast.walk(scope.fn) if isinstance(node, ast.Call) for v in check_call(node, scope)]
    return found


def scope_for(rel: Path, fn, cls: ast.ClassDef | None, fields_of: dict[str, set[str]],
              containers: frozenset[str]) -> Scope:
    own = fields_of.get(cls.name, set()) if cls else set()
    records = [rec for owner, rec in RECORDS if cls is not None and owner == cls.name]
    record_fields = set().union(*(fields_of[r] for r in records)) if records else set()
    return Scope(rel, fn, cls, frozenset(own), frozenset(record_fields), containers)


def check_module(path: Path, fields_of: dict[str, set[str]], containers: frozenset[str],
                 root: Path = PARENT.parent.parent) -> list[Violation]:
    """Every function of the module (methods with their class; nested functions are walked with theirs)."""
    rel = path.relative_to(root)
    found: list[Violation] = []

    def visit(body: list[ast.stmt], cls: ast.ClassDef | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.extend(check_function(scope_for(rel, node, cls, fields_of, containers)))

    visit(ast.parse(path.read_text(), filename=str(path)).body, None)
    return found


def parent_modules() -> list[Path]:
    return sorted(PARENT.rglob("*.py"))


def all_fields() -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    for path in parent_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.name not in fields, f"two classes named {node.name} in supervisor/parent"
                fields[node.name] = declared(node)
    return fields


def all_containers() -> frozenset[str]:
    return frozenset(name for path in parent_modules() for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.ClassDef) for name in container_attrs(node))


def violations() -> list[Violation]:
    fields, containers = all_fields(), all_containers()
    return [v for path in parent_modules() for v in check_module(path, fields, containers)]


def test_every_attribute_of_the_parent_is_assigned_only_by_its_own_class():
    assert {"Arbiter", "ChildPool", "Jobs", "Claiming", "Settling", "InFlight", "Membership", "Pacer", "MemoryPressure",
            "Listener", "OneAtATime"} <= set(all_fields())  # the parts checked
    found = violations()
    assert not found, "state assigned from outside its owner:\n" + "\n".join(map(str, found))


def test_the_check_catches_what_it_is_for(tmp_path):
    """The checker itself: each kind of violation in a sample module is reported, the allowed writes are not."""
    code = '''
from dataclasses import dataclass

@dataclass
class Entry:
    slot: int | None = None

class InFlight:
    def __init__(self):
        self.jobs = {}
    def start(self, entry, slot):
        entry.slot = slot                    # allowed: InFlight writes its Entry

class Pool:
    def __init__(self):
        self.children = {}
        self.target = 1
    def grow(self, other, child):
        self.target += 1                     # own, declared
        self.children[0] = child             # own container
        self.surprise = True                 # not declared in __init__
        other.target = 3                     # another object's attribute
        child.state, x = "busy", 1           # in a tuple, too
        other.children[1] = child            # another object's container
        self.arbiter.jobs.pop("a")           # mutating another's container
        setattr(other, "target", 4)
        entry.slot = 2                       # only InFlight may write an Entry
'''
    fields = {"Entry": {"slot"}, "InFlight": {"jobs"}, "Pool": {"children", "target"}}
    sample = tmp_path / "sample.py"
    sample.write_text(code)
    tree = ast.parse(code)
    containers = frozenset(n for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in container_attrs(c))
    assert containers == {"jobs", "children"}
    found = [v.what for v in check_module(sample, fields, containers, root=tmp_path)]
    assert len(found) == 7, "\n".join(found)
    assert any("self.surprise" in w for w in found) and any("other.target" in w for w in found)
    assert any("child.state" in w for w in found) and any("other.children[1]" in w for w in found)
    assert any("self.arbiter.jobs.pop" in w for w in found) and any("setattr" in w for w in found)
    assert any("entry.slot" in w and "Pool.grow" in w for w in found)
    assert not any("self.target" in w or "self.children[0]" in w for w in found)


# The parts the arbiter wires (the jobs wing is the package supervisor.parent.jobs), and the jobs wing's own
# parts, which the wing wires: none imports a sibling, and none the one that wires it.
PARTS = {"supervisor.parent.pool": "pool.py", "supervisor.parent.membership": "membership.py",
         "supervisor.parent.jobs": "jobs/*.py"}
WING_PARTS = ("claiming", "settling")


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_parts_do_not_import_each_other_or_the_arbiter():
    found = []
    for part, pattern in PARTS.items():
        others = {name for name in PARTS if name != part} | {"supervisor.parent.arbiter"}
        for path in sorted(PARENT.glob(pattern)):
            for module in sorted(imports_of(path)):
                if any(module == other or module.startswith(other + ".") for other in others):
                    found.append(f"{path.relative_to(PARENT.parent.parent)} imports {module}")
    for part in WING_PARTS:
        others = {f"supervisor.parent.jobs.{name}" for name in (*WING_PARTS, "wing") if name != part}
        others |= {"supervisor.parent.jobs", "supervisor.parent.arbiter"}
        for module in sorted(imports_of(PARENT / "jobs" / f"{part}.py") & others):
            found.append(f"supervisor/parent/jobs/{part}.py imports {module}")
    assert not found, "\n".join(found)
