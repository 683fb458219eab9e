"""The YAML tree: strict scalars, no duplicate keys, Hydra `defaults:` lists, `${a.b}` interpolation, `key=value`
overrides set on it; the result is a plain dict (load.py types it)."""

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from rlinf_mini.config.schema import ConfigError, TrainConfig


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML reads YAML 1.1, where `lr: 1e-3` (no dot) is the string '1e-3'; read it as a float, as YAML 1.2 and
    RLinf's OmegaConf do. Quoted values stay strings. libyaml's parser where PyYAML has it (~5x faster; a plain
    scalar's style is '' there, None in the pure-Python one)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?: [0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?   # 1.5, 1., 1.5e-3
                           | [0-9][0-9_]*[eE][-+]?[0-9]+                 # 1e-3 (the case YAML 1.1 misses)
                           | \.[0-9_]+(?:[eE][-+]?[0-9]+)? )$""", re.X),  # .5
    list("-+0123456789."),
)

# YAML 1.1 numbers that surprise: `1:30` is 90 (base 60) and `010` is 8 (octal); refused, with the text as written
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_OCTAL = re.compile(r"^[-+]?0[0-7_]+$")
_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")


def _check_nodes(node: yaml.Node, path: str, source: str) -> None:
    """Walk the composed YAML: a key twice in one mapping, or a sexagesimal / octal number, is a ConfigError."""
    where = f"{source}: {path}" if path else source
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{source}: {path + '.' if path else ''}{key}: duplicate key (lines {seen[key]} and "
                                  f"{line}); YAML would silently keep the last")
            seen[key] = line
            _check_nodes(value_node, f"{path}.{key}" if path else key, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_nodes(item, f"{path}[{i}]", source)
    elif isinstance(node, yaml.ScalarNode) and not node.style and node.tag in ("tag:yaml.org,2002:int",
                                                                                   "tag:yaml.org,2002:float"):
        if _SEXAGESIMAL.match(node.value):
            raise ConfigError(f"{where}: {node.value} is a YAML 1.1 base-60 number (it would read as "
                              f"{yaml.safe_load(node.value)}); quote it or write the number you mean")
        if _OCTAL.match(node.value):
            raise ConfigError(f"{where}: {node.value} is a YAML 1.1 octal number (it would read as "
                              f"{yaml.safe_load(node.value)}); write it without the leading 0")


def _load_yaml_file(file: Path) -> dict:
    if not file.is_file():
        raise ConfigError(f"{file}: config file not found")
    loader = _YamlLoader(file.read_text())
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_nodes(node, "", str(file))
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{file}: YAML syntax error{at}: {getattr(e, 'problem', e)}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _merge(into: dict, new: dict) -> dict:
    """Deep merge, `new` wins (OmegaConf.merge for plain dicts)."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)
    return into


def _place(tree: dict, package: str, value: dict) -> dict:
    """`value` nested under the dotted `package` ('' = the top)."""
    for part in reversed([p for p in package.split(".") if p]):
        value = {part: value}
    return _merge(tree, value)


def _read_with_defaults(file: Path, root: Path, package: str, depth: int = 0) -> dict:
    """A file and its Hydra `defaults:` list, merged: each entry `group/option[@package]` (or `{group: option}`)
    reads <dir>/group/option.yaml, <dir> being the including file's folder (the first file's for `/group/...`), and
    is placed at `package` (default: the group path); `_self_` marks where the file's own keys go (default: last).
    `override hydra/...` entries configure Hydra itself and are skipped; `optional` entries may be absent."""
    if depth > 20:
        raise ConfigError(f"{file}: defaults: lists include each other in a cycle")
    data = _load_yaml_file(file)
    entries = data.pop("defaults", []) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{file}: defaults: expected a list, got {entries!r}")
    tree: dict = {}
    own = {k: v for k, v in data.items()}
    self_done = False
    for i, entry in enumerate(entries):
        where = f"{file}: defaults[{i}]"
        if entry == "_self_":
            _place(tree, package, own)
            self_done = True
            continue
        if isinstance(entry, dict) and len(entry) == 1:
            (group, option), = entry.items()
            spec = f"{group}/{option}" if option not in (None, "???") else None
        elif isinstance(entry, str):
            spec = entry
        else:
            raise ConfigError(f"{where}: expected 'group/option' or {{group: option}}, got {entry!r}")
        if spec is None:
            continue
        spec = spec.strip()
        optional = spec.startswith("optional ")
        spec = spec.removeprefix("optional ").removeprefix("override ").strip()
        if spec.startswith("hydra/") or spec.startswith("/hydra/"):
            continue  # Hydra's own logging / launcher settings
        path_part, _, at = spec.partition("@")
        base = root if path_part.startswith("/") else file.parent
        group = str(Path(path_part.strip("/")).parent).replace("/", ".").strip(".")
        target = package if at == "_here_" else (at if at else ".".join(p for p in (package, group) if p))
        sub = base / f"{path_part.strip('/')}.yaml"
        if not sub.is_file():
            if optional:
                continue
            raise ConfigError(f"{where}: {entry!r}: no file {sub}")
        _merge(tree, _read_with_defaults(sub, root, target.strip("."), depth + 1))
    if not self_done:
        _place(tree, package, own)
    return tree


def _lookup(tree: dict, dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def resolve_interpolations(tree: dict, source: str, fallback: dict | None = None) -> dict:
    """Replace `${a.b}` (absolute) and `${..b}` (relative: each dot after the first goes up one level) with the
    value they point to, in the tree or else in `fallback` (the dataclass defaults). A value that is one whole
    interpolation keeps the target's type; one inside text becomes text. Resolvers (`${oc.env:X}`) stay as written:
    rlinf_mini has none, and a key that reads one reports it as a wrong type."""

    def resolve(value: Any, here: list[str], key_path: str, depth: int = 0) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, [*here, str(k)], f"{key_path}.{k}" if key_path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, here, f"{key_path}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        if depth > 20:
            raise ConfigError(f"{source}: {key_path}: interpolations point at each other in a cycle")

        def target(expr: str) -> Any:
            expr = expr.strip()
            if ":" in expr:
                return None  # a resolver
            if expr.startswith("."):
                dots = len(expr) - len(expr.lstrip("."))
                parent = here[:-1][: max(len(here) - dots, 0)]
                expr = ".".join([*parent, expr.lstrip(".")])
            for where in (tree, fallback or {}):
                try:
                    found = _lookup(where, expr)
                except KeyError:
                    continue
                return resolve(found, expr.split("."), expr, depth + 1)
            raise ConfigError(f"{source}: {key_path}: {value} points to {expr}, which neither the file nor the "
                              f"defaults have")

        whole = _INTERPOLATION.fullmatch(value)
        if whole:
            found = target(whole.group(1))
            return value if found is None else found
        return _INTERPOLATION.sub(lambda m: m.group(0) if (t := target(m.group(1))) is None else str(t), value)

    return resolve(tree, [], "")


def read_yaml_tree(file: str | Path | None, overrides: list[tuple[str, Any]] = ()) -> dict:
    """The YAML file as a plain dict: `defaults:` lists merged, `key=value` overrides set (before interpolations
    resolve, so `${a.b}` sees an overridden a.b, as in Hydra), interpolations resolved."""
    tree = {} if file is None else _read_with_defaults(Path(file), Path(file).parent, "")
    for key, value in overrides:
        _set_dotted(tree, key, value)
    return resolve_interpolations(tree, str(file or "command line"), dataclasses.asdict(TrainConfig()))


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
