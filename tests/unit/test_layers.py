"""The package's layers, read from its source: which module imports which.

Imports inside functions count (they are how a module defers cost, not how it escapes its
layer); imports under ``if TYPE_CHECKING:`` do not (they run only for the type checker).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cloudtrain

ROOT = Path(cloudtrain.__file__).parent
PROVIDERS = ROOT.parent / "providers"


def _module(path: Path) -> str:
    if path.is_relative_to(PROVIDERS):
        parts = ("cloudtrain", "providers", *path.relative_to(PROVIDERS).with_suffix("").parts)
    else:
        parts = ("cloudtrain", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, known: set[str]) -> set[str]:
    """The cloudtrain modules `tree` imports at run time."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cloudtrain"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cloudtrain"):
            for alias in node.names:  # `from cloudtrain import catalog` names a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else str(node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    files = [*ROOT.rglob("*.py"), *PROVIDERS.rglob("*.py")]
    trees = {_module(f): ast.parse(f.read_text(encoding="utf-8")) for f in files}
    known = set(trees)
    return {m: {i for i in _imports(t, known) if i in known and i != m} for m, t in trees.items()}


GRAPH = _graph()


def _reach(start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in GRAPH.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_module_imports_itself_back() -> None:
    circles = sorted(m for m in GRAPH if m in _reach(m))
    assert not circles, f"import circles through: {', '.join(circles)}"


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("cloudtrain.errors", set()),
        (
            "cloudtrain.spec",
            {"cloudtrain.errors", "cloudtrain.spec.limits", "cloudtrain.spec.frameworks"},
        ),
        ("cloudtrain.spec.limits", {"cloudtrain.errors"}),
        ("cloudtrain.spec.frameworks", {"cloudtrain.errors"}),
        ("cloudtrain.model", set()),
        # the node agent runs on the nodes, with whatever cloudtrain is there: stdlib only
        (
            "cloudtrain.node",
            {
                "cloudtrain.node." + m
                for m in (
                    "agent",
                    "bootstrap",
                    "notices",
                    "procs",
                    "selfstop",
                    "spawn",
                    "runtimes",
                    "horovod",
                    "unattended",
                    "oom",
                    "restarts",
                )
            },
        ),
        ("cloudtrain.node.spawn", {"cloudtrain.node.horovod"}),
        ("cloudtrain.node.horovod", set()),
        (
            "cloudtrain.node.agent",
            {"cloudtrain.node." + m for m in ("notices", "procs", "restarts", "selfstop")},
        ),
        ("cloudtrain.node.selfstop", set()),
        (
            "cloudtrain.node.unattended",
            {"cloudtrain.node." + m for m in ("agent", "notices", "procs", "restarts", "selfstop")},
        ),
        ("cloudtrain.node.procs", {"cloudtrain.node.notices"}),
        ("cloudtrain.node.notices", set()),
        ("cloudtrain.node.oom", set()),
        ("cloudtrain.node.restarts", set()),
    ],
)
def test_the_bottom_layers_import_nothing_above_them(module: str, allowed: set[str]) -> None:
    assert _reach(module) <= allowed


def _strings(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_no_provider_is_named_outside_its_package_and_the_registry() -> None:
    """The core learns what a provider takes and gives from its declarations (`options`,
    `capabilities`), never from its name."""
    clouds = {"aws", "gcp", "azure"}
    named = {
        str(path.relative_to(ROOT)): sorted(_strings(path) & clouds)
        for path in ROOT.rglob("*.py")
        if path.name != "registry.py" and _strings(path) & clouds
    }
    assert not named
    cli = {str(p.relative_to(ROOT)) for p in (ROOT / "cli").rglob("*.py")
           if _strings(p) & {"ssh", "local", "fake"}}  # fmt: skip
    assert not cli


def test_no_runtime_is_named_outside_its_module_and_the_node_side() -> None:
    """The coordinator and the CLI learn what a runtime needs from `cloudtrain.jobs.runtimes`
    (its `check`, `workers_per_node`, `installs`, `argvs`), never from its name. The node side
    (the agent's installers, the workers' own library, which launcher started a worker) knows
    the frameworks it runs under."""
    names = {"tensorflow", "horovod"}
    node_side = ("node/", "runtime/", "jobs/launched.py")
    registry = ("spec/frameworks.py", "jobs/runtimes/tensorflow.py", "jobs/runtimes/horovod.py")
    named = {
        rel: sorted(_strings(path) & names)
        for path in ROOT.rglob("*.py")
        if not (rel := str(path.relative_to(ROOT))).startswith(node_side + registry)
        and _strings(path) & names
    }
    assert not named
