"""Read a task YAML file into a validated `TaskSpec`, with ``file:line`` in every error.

    load(Path("task.yaml"), overrides={"num_nodes": 2})  # flag values win over the file
    parse(text, source="task.yaml", base_dir=Path("."))
    from_flags({"name": "exp1", "num_nodes": 2})  # no file at all

Every error is a `ConfigError` (chained to the `SpecError` or YAML error it came from)::

    task.yaml:3: unknown field 'num_node' — did you mean 'num_nodes'?; allowed: ...
    task.yaml:7: invalid YAML: expected ',' or ']', but got ... (while parsing ... on line 4)
    task.yaml:5: duplicate key 'resources.spot' (first on line 4)
    task.yaml: num_nodes 0 is out of range; ...  # the bad value came from an override: no line

Nothing here touches a provider; validation is `cloudtrain.spec.task_from_dict`, against the
names the registry and the catalog know (`known`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import ConfigError
from cloudtrain.spec import TASK_FIELDS, Known, SpecError, TaskSpec, task_from_dict

__all__ = ["from_flags", "known", "load", "parse"]

if TYPE_CHECKING:
    import yaml

_MERGE_TAG = "tag:yaml.org,2002:merge"


def known() -> Known:
    """The provider and accelerator names a task may use: the registry's and the catalog's."""
    from cloudtrain.plan import catalog
    from cloudtrain.provision import registry

    return Known(
        registry.known(), catalog.load().accelerators(), registry.default(), registry.stores()
    )


def load(path: Path, overrides: Mapping[str, Any] | None = None) -> TaskSpec:
    """Read and validate the task file at `path`; a relative `workdir` is taken from its folder.

    Raises `ConfigError` if the file cannot be read, is not valid YAML or fails validation.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such task file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the task file is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the task file: {exc.strerror}") from exc
    return parse(text, source=str(path), base_dir=path.parent, overrides=overrides)


def parse(
    text: str,
    *,
    source: str = "<task>",
    base_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TaskSpec:
    """Parse and validate task YAML `text`. `source` names it in errors; `base_dir` anchors
    a relative `workdir` (default: the current directory).

    `overrides` maps dotted paths (``num_nodes``, ``resources.accelerator``) to values set on
    top of the file's; None values are skipped. Raises `ConfigError`.
    """
    data, lines = _read(text, source)
    return _validate(data, lines, source, base_dir, overrides)


def from_flags(overrides: Mapping[str, Any], *, base_dir: Path | None = None) -> TaskSpec:
    """A task from command-line values alone, as if from an empty file: `name` is required.

    Errors carry spec's message with no prefix. Raises `ConfigError`.
    """
    return _validate({}, {}, None, base_dir, overrides)


def _read(text: str, source: str) -> tuple[dict[Any, Any], dict[str, int]]:
    """The top-level mapping of `text`, and the line of every key by dotted path."""
    import yaml  # here: a task given by flags alone (most `up`s) needs no YAML

    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise ConfigError(
                    f"{source}: the file is empty; a task file is a mapping of fields "
                    f"({', '.join(TASK_FIELDS)})"
                )
            if not isinstance(node, yaml.MappingNode):
                kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
                raise ConfigError(
                    f"{source}:{_line(node)}: the top level must be a mapping of fields "
                    f"({', '.join(TASK_FIELDS)}), got {kind}"
                )
            lines: dict[str, int] = {}
            _index(node, "", lines, source, set())
            data: dict[Any, Any] = loader.construct_document(node)
            _keep_node_range(node, data)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_yaml_message(exc, source)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
    return data, lines


def _index(
    node: yaml.MappingNode,
    prefix: str,
    lines: dict[str, int],
    source: str,
    walked: set[int],
) -> None:
    """Record each key's line under its dotted path; raise on a key given twice. Each node is
    walked once: an alias of a mapping already walked (or of one it is inside) is not walked
    again, so nested aliases (a "billion laughs" file) cost their size, not their expansion."""
    import yaml

    walked.add(id(node))
    seen: dict[tuple[str, str], int] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
            continue
        path = prefix + key.value
        if (key.tag, key.value) in seen:
            first = seen[key.tag, key.value]
            raise ConfigError(
                f"{source}:{_line(key)}: duplicate key {path!r} (first on line {first})"
            )
        seen[key.tag, key.value] = lines[path] = _line(key)
        if isinstance(value, yaml.MappingNode) and id(value) not in walked:
            _index(value, path + ".", lines, source, walked)


def _keep_node_range(node: yaml.MappingNode, data: dict[Any, Any]) -> None:
    """``num_nodes: 1:4`` as written: YAML 1.1 reads a plain ``1:4`` as a base-60 number (64)."""
    import yaml

    for key, value in node.value:
        plain = isinstance(value, yaml.ScalarNode) and value.style is None
        if isinstance(key, yaml.ScalarNode) and key.value == "num_nodes" and plain:
            data["num_nodes"] = value.value if ":" in value.value else data["num_nodes"]


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _yaml_message(exc: yaml.MarkedYAMLError, source: str) -> str:
    """``file:line: invalid YAML: problem``, plus where the unfinished construct began."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}:{mark.line + 1}" if mark else source
    if exc.problem and exc.context and exc.problem.startswith("but "):
        return f"{where}: invalid YAML: {exc.context}, {exc.problem}"  # one sentence in two
    message = f"{where}: invalid YAML: {exc.problem or exc.context or 'cannot parse'}"
    began, failed = exc.context_mark, exc.problem_mark
    if exc.context and began and failed and began.line != failed.line:  # left unfinished
        message += f" ({exc.context} on line {began.line + 1})"
    return message


def _validate(
    data: Mapping[Any, Any],
    lines: Mapping[str, int],
    source: str | None,
    base_dir: Path | None,
    overrides: Mapping[str, Any] | None,
) -> TaskSpec:
    """Apply the overrides and validate; a `SpecError` becomes ``source:line: message``.

    A field set by an override gets no line (the file is not where it came from): its error
    is ``source: message``, and spec's message already names the field.
    """
    given = {path: value for path, value in (overrides or {}).items() if value is not None}
    try:
        return task_from_dict(_apply(data, given), known(), base_dir=base_dir)
    except SpecError as exc:
        from_flag = any(exc.field == p or exc.field.startswith(p + ".") for p in given)
        line = None if from_flag else _field_line(exc.field, lines)
        if source is None:
            raise ConfigError(str(exc)) from exc
        where = source if line is None else f"{source}:{line}"
        raise ConfigError(f"{where}: {exc}") from exc


def _apply(data: Mapping[Any, Any], overrides: Mapping[str, Any]) -> dict[Any, Any]:
    """A copy of `data` with each override set at its dotted path; `data` is not changed."""
    merged = dict(data)
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        target = merged
        for depth, part in enumerate(parents, 1):
            child = target.get(part)
            if child is not None and not isinstance(child, Mapping):
                where = ".".join(parents[:depth])
                raise SpecError(where, f"{where} must be a mapping, got {child!r}")
            target[part] = dict(child or {})
            target = target[part]
        target[leaf] = value
    return merged


def _field_line(field: str, lines: Mapping[str, int]) -> int | None:
    """The line of `field`, else of its nearest parent that has one, else None."""
    parts = field.split(".")
    while parts:
        line = lines.get(".".join(parts))
        if line is not None:
            return line
        parts.pop()
    return None
