"""The YAML tree: each file read strictly (no duplicate keys, no YAML 1.1 traps), then composed, overridden and
interpolated by OmegaConf as Hydra does it for RLinf (`defaults:` lists, `key=value`, `${a.b}`, RLinf's resolvers);
a plain dict comes out (load.py types it).

OmegaConf reads no file here: its own YAML reader keeps a duplicate key's last value and reads `1:30` as 90, so each
file goes through the strict reader below and OmegaConf gets the plain dict. A file with no `defaults:` list, no
`${...}` and no `key=value` is returned as read: OmegaConf would give it back unchanged, and importing it and
building its tree cost more than reading the file (docs/performance.md).
"""

import dataclasses
import functools
import importlib
import re
from pathlib import Path
from typing import Any

import yaml

from rlinf_mini.config.schema import ConfigError, TrainConfig


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML reads YAML 1.1, where `lr: 1e-3` (no dot) is the string '1e-3'; read it as a float, as YAML 1.2 and
    RLinf's OmegaConf do. Quoted values stay strings. libyaml's parser where PyYAML has it (faster; a
    plain scalar's style is '' there, None in the pure-Python one)."""


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


# --------------------------------------------------------------------------------------------------------------------
# OmegaConf: RLinf's resolvers, Hydra's defaults lists, overrides, interpolation

# RLinf registers these on `import rlinf` (rlinf/utils/omega_resolver.py), with the same names and math; its reasoning
# YAMLs write `max_new_tokens: ${subtract:${runner.seq_length}, ${data.max_prompt_length}}`. torch.dtype imports
# torch only when a file uses it (no rlinf_mini key takes a dtype: such a key reports it as a wrong type).
RESOLVERS = {
    "multiply": lambda x, y: x * y,
    "int_div": lambda x, y: x // y,
    "subtract": lambda x, y: x - y,
    "not": lambda x: not bool(x),
    "torch.dtype": lambda name: getattr(importlib.import_module("torch"), name),
}
_NOT_FOUND = re.compile(r"Interpolation key '([^']*)' not found")
_KEY_PART = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


@functools.cache
def _omegaconf() -> Any:
    """omegaconf.OmegaConf, imported on first use (~60 ms) with RLinf's resolvers registered (replace=True: an
    `import rlinf` in the same process registers the same functions)."""
    import omegaconf
    from omegaconf import OmegaConf

    # OmegaConf 2.4 renamed register_new_resolver to register_resolver (the old name warns); in 2.3
    # register_resolver is the legacy string-only API
    new_api = tuple(int(part) for part in omegaconf.__version__.split(".")[:2]) >= (2, 4)
    register = OmegaConf.register_resolver if new_api else OmegaConf.register_new_resolver
    for name, fn in RESOLVERS.items():
        register(name, fn, replace=True)
    return OmegaConf


def _create(data: dict) -> Any:
    # allow_objects: a YAML date or a !!binary value stays a Python object, reported by its key as a wrong type
    return _omegaconf().create(data, flags={"allow_objects": True})


def _nested(package: str, value: dict) -> dict:
    """`value` nested under the dotted `package` ('' = the top)."""
    for part in reversed([p for p in package.split(".") if p]):
        value = {part: value}
    return value


def _defaults_order(file: Path, root: Path, package: str, depth: int = 0) -> list[tuple[str, dict]]:
    """A file and its Hydra `defaults:` list, flattened into the order Hydra merges them: [(source, keys placed at
    their package)]. Each entry `group/option[@package]` (or `{group: option}`) reads <dir>/group/option.yaml, <dir>
    being the including file's folder (the first file's for `/group/...`), and is placed at `package` (default: the
    group path); `_self_` marks where the file's own keys go (default: last). `override hydra/...` entries configure
    Hydra itself and are skipped; `optional` entries may be absent."""
    if depth > 20:
        raise ConfigError(f"{file}: defaults: lists include each other in a cycle")
    data = _load_yaml_file(file)
    entries = data.pop("defaults", []) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{file}: defaults: expected a list, got {entries!r}")
    order: list[tuple[str, dict]] = []
    own, self_done = (str(file), _nested(package, data)), False
    for i, entry in enumerate(entries):
        where = f"{file}: defaults[{i}]"
        if entry == "_self_":
            order.append(own)
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
        order += _defaults_order(sub, root, target.strip("."), depth + 1)
    if not self_done:
        order.append(own)
    return order


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    return isinstance(value, str) and "${" in value


@functools.cache
def _defaults() -> dict:
    return dataclasses.asdict(TrainConfig())


def _absent(defaults: dict, tree: dict) -> dict:
    """The defaults that `tree` does not set (where both hold a section, its absent keys): merged under the tree,
    they let `${actor.seed}` find the dataclass default without a dict/list clash and without adding keys."""
    out = {}
    for key, value in defaults.items():
        if key not in tree:
            out[key] = value
        elif isinstance(value, dict) and isinstance(tree[key], dict):
            out[key] = _absent(value, tree[key])
    return out


def _only(resolved: Any, written: Any) -> Any:
    """`resolved` cut down to the keys of `written` (the tree before the defaults were merged under it)."""
    if isinstance(written, dict) and isinstance(resolved, dict):
        return {k: _only(resolved[k], v) for k, v in written.items()}
    return resolved


def _as_written(tree: Any, full_key: str) -> Any:
    node = tree
    for index, name in _KEY_PART.findall(full_key or ""):
        key = int(index) if index.isdigit() else (index or name)
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _clash(into: Any, new: Any, path: str = "") -> str:
    """The first key where merging `new` into `into` meets a mapping and a list (OmegaConf names no key then)."""
    if isinstance(into, dict) and isinstance(new, dict):
        for key in new.keys() & into.keys():
            if found := _clash(into[key], new[key], f"{path}.{key}" if path else str(key)):
                return found
        return ""
    return path if isinstance(into, (dict, list)) and isinstance(new, (dict, list)) else ""


def _one_line(e: Exception, source: str, written: dict, key: str = "") -> ConfigError:
    """An OmegaConf error (a message over several lines, the key in `full_key`) as one line naming the key."""
    key = str(getattr(e, "full_key", "") or "") or key
    value = _as_written(written, key)
    message = str(e).split("\n")[0].strip()
    kind = type(e).__name__
    where = f"{source}: {key}" if key else source
    if kind == "InterpolationKeyError" and (m := _NOT_FOUND.search(message)):
        return ConfigError(f"{where}: {value} points to {m.group(1)}, which neither the file nor the defaults have")
    if "Recursive interpolation" in message or "Interpolation to parent node" in message:
        return ConfigError(f"{where}: {value}: interpolations point at each other in a cycle")
    if kind == "UnsupportedInterpolationType":
        return ConfigError(f"{where}: {value}: {message.replace('Unsupported interpolation type', 'no resolver')} "
                           f"(there are OmegaConf's oc.* and RLinf's {', '.join(RESOLVERS)})")
    if kind == "GrammarParseError":
        return ConfigError(f"{where}: {value!r} is not an interpolation OmegaConf can read ({message}); write \\${{ "
                           f"for a literal ${{")
    return ConfigError(f"{where}: {message}" + (f" (in {value!r})" if isinstance(value, str) else ""))


def read_yaml_tree(file: str | Path | None, overrides: list[tuple[str, Any]] = (),
                   overlays: list[str | Path] = ()) -> dict:
    """The YAML file as a plain dict: its `defaults:` list merged (OmegaConf.merge, in Hydra's order), then each
    overlay file (a second `--config`) merged over it, `key=value` overrides set (OmegaConf.update, before
    interpolations resolve, so `${a.b}` sees an overridden a.b, as in Hydra), interpolations resolved by OmegaConf
    (a target the file does not set is the dataclass default; the `hydra:` section, Hydra's own settings, stays as
    written). An overlay's `cluster.component_placement` replaces the file's whole: a placement is one layout, and
    merging `env: 0` into `env,rollout,actor: all` would place the env twice."""
    source = str(file or "command line")
    order = [] if file is None else _defaults_order(Path(file), Path(file).parent, "")
    overlay_parts = set()  # the first part of each overlay: where its placement replaces the one merged so far
    for overlay in overlays:
        parts = _defaults_order(Path(overlay), Path(overlay).parent, "")
        overlay_parts.add(len(order))
        order += parts
    if len(order) == 1 and not overrides and not _has_interpolation(order[0][1]):
        return order[0][1]  # nothing for OmegaConf to do
    OmegaConf = _omegaconf()
    from omegaconf.errors import OmegaConfBaseException

    cfg, written, part = None, {}, source
    try:
        for index, (part, data) in enumerate(order):
            try:
                new = _create(data)
                if cfg is None:
                    cfg = new
                else:
                    if (index in overlay_parts and "component_placement" in (data.get("cluster") or {})
                            and "component_placement" in (cfg.get("cluster") or {})):
                        del cfg.cluster["component_placement"]
                    cfg.merge_with(new)
            except OmegaConfBaseException as e:
                clash = "" if cfg is None else _clash(OmegaConf.to_container(cfg), data)
                raise _one_line(e, part, data, clash) from None
        cfg = _create({}) if cfg is None else cfg
        part = "command line"
        for key, value in overrides:
            try:
                OmegaConf.update(cfg, key, value, merge=False)
            except (ValueError, IndexError, TypeError) as e:  # a dotted key through a list: not OmegaConf's own
                raise ConfigError(f"command line: {key}: cannot be set there ({e})") from None
        part = source
        written = OmegaConf.to_container(cfg)
        resolving = {k: v for k, v in written.items() if k != "hydra"}
        if not _has_interpolation(resolving):
            return written
        if "hydra" in cfg:
            del cfg["hydra"]  # Hydra's own settings (its search path reads ${oc.env:...}) stay as written
        cfg.merge_with(_absent(_defaults(), resolving))  # only keys the tree lacks: a fallback, never an override
        resolved = _only(OmegaConf.to_container(cfg, resolve=True), resolving)
    except OmegaConfBaseException as e:
        raise _one_line(e, part, written) from None
    return {k: resolved[k] if k in resolved else v for k, v in written.items()}
