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
PROVIDERS = ROOT / "providers"
#: the core: every module but the providers' own
CORE = sorted(p for p in ROOT.rglob("*.py") if not p.is_relative_to(PROVIDERS))


def _module(path: Path) -> str:
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
            for branch in node.orelse:
                visit(branch)
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
    files = list(ROOT.rglob("*.py"))
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
                    "upkeep",
                )
            },
        ),
        (
            "cloudtrain.node.upkeep",
            {
                "cloudtrain.node." + m
                for m in ("agent", "notices", "procs", "restarts", "selfstop", "unattended")
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


#: The built-in providers' names, read from their folders (as the registry finds them).
PROVIDER_NAMES = {p.name for p in PROVIDERS.iterdir() if (p / "__init__.py").is_file()}
PROVIDERS_PACKAGE = "cloudtrain.providers"
#: Provider names that are ordinary words too (the ``ssh`` command, a ``local`` path): named as
#: a provider only where a value is chosen (compared, assigned, defaulted, returned).
WORDS = {"ssh", "local"}
#: Core modules that still reach into a provider, each with what removes it. Only shrinks.


def _module_text(node: ast.expr) -> str:
    """What a module name given to `import_module` says for sure: a string, or an f-string's
    constant parts (``f"cloudtrain.providers.{name}._check"``: ``cloudtrain.providers.._check``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
    return ""


def _chosen(node: ast.AST) -> list[ast.AST]:
    """The values `node` chooses among or sets: compared (with a collection's elements),
    `or`-ed, an `if`-expression's, an assignment's, a default's, a return's."""
    if isinstance(node, ast.Compare):
        values = [node.left, *node.comparators]
        return [e for v in values for e in (v.elts if isinstance(v, ast.Tuple | ast.Set) else [v])]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.Return) and node.value is not None:
        return [node.value]
    if isinstance(node, ast.arguments):
        return [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
    return []


def provider_references(source: str) -> list[str]:
    """How `source` (a core module) names a provider: an import of a provider's module
    (function-local ones too), an `import_module` whose name, string or f-string, reaches into
    the providers' package, or a string that is a built-in provider's name."""
    found: list[str] = []
    tree = ast.parse(source)
    chosen = {
        id(value)
        for node in ast.walk(tree)
        for value in _chosen(node)
        if isinstance(value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [
                f"{base}.{a.name}" if base == PROVIDERS_PACKAGE else base for a in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and (
                getattr(node.func, "attr", None) == "import_module"
                or getattr(node.func, "id", None) == "import_module"
            )
        ):
            text = _module_text(node.args[0])
            if text.startswith(PROVIDERS_PACKAGE + "."):
                found.append(f"import_module {text}")
            continue
        elif isinstance(node, ast.Constant) and node.value in PROVIDER_NAMES:
            if node.value not in WORDS or id(node) in chosen:
                found.append(repr(node.value))
            continue
        else:
            continue
        found += [f"import {m}" for m in modules if m.startswith(PROVIDERS_PACKAGE + ".")]
    return sorted(set(found))


def test_no_provider_is_named_outside_its_package() -> None:
    """The core learns what a provider takes and gives from its plugin (`Plugin`: options,
    credentials, quota and price readers, checkpoint store) and its class's `capabilities`,
    never from its name:
    a new provider is a folder, and no core module changes. The registry finds the folders."""
    named = {
        rel: found
        for path in CORE
        if (found := provider_references(path.read_text(encoding="utf-8")))
        for rel in [str(path.relative_to(ROOT))]
    }
    assert named == {}


@pytest.mark.parametrize(
    "planted",
    [
        'importlib.import_module(f"cloudtrain.providers.{provider}._check")',
        "def f():\n    from cloudtrain.providers.aws._client import Clients\n",
        "from cloudtrain.providers import gcp\n",
        "import cloudtrain.providers.azure.provider\n",
        'DEFAULT = "local"\n',
        'name = record.provider if record else "ssh"\n',
        'CLOUDS = ("aws", "gcp")\n',
        'if spec.provider == "aws":\n    pass\n',
    ],
)
def test_a_provider_planted_in_the_core_is_seen(planted: str) -> None:
    """Each channel the core once used to reach a provider (an f-string import, a
    function-local import, a name compared) is caught."""
    assert provider_references("import importlib\n" + planted)
    assert not provider_references("import importlib\nimport cloudtrain.providers\n")
    assert not provider_references('argv = ["ssh", "-p", "22"]\nrun("ssh", {"local": 1})\n')


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
        for path in CORE
        if not (rel := str(path.relative_to(ROOT))).startswith(node_side + registry)
        and _strings(path) & names
    }
    assert not named


def test_the_jobs_call_the_lifecycle_and_never_the_verbs_above_both() -> None:
    """`api` gives the verbs over the lifecycle with the jobs' part filled in; the jobs call the
    lifecycle itself, which learns how to stop jobs from its caller: no layer calls back up."""
    jobs = {m for m in GRAPH if m.startswith("cloudtrain.jobs")}
    assert not {m for m in jobs if "cloudtrain.api" in _reach(m)}
    assert not {m for m in _reach("cloudtrain.lifecycle") if m in jobs | {"cloudtrain.api"}}
