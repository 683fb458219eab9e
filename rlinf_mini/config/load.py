"""Loading a run's config in one pass: `--config FILE` (a second one an overlay) and `key=value` into one YAML tree
(yaml_tree.py), the tree into typed dataclasses (every unknown key at once, strict types), then tyro's `--key value`
flags; and writing the resolved config back.

Why not `OmegaConf.structured(TrainConfig)` for the typing: OmegaConf 2.3 refuses the schema's `Literal` keys
("Unexpected type annotation"), and it converts what the bad-input corpus refuses (`yes` for a bool, `5` for a
string, `'1e-3'` for a float). docs/architecture.md has the layers and the figures."""

import contextlib
import dataclasses
import difflib
import io
import itertools
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from rlinf_mini.config.checks import validate_config
from rlinf_mini.config.schema import ConfigError, TrainConfig
from rlinf_mini.config.schema_embodied import InitParams
from rlinf_mini.config.yaml_tree import _check_nodes, _YamlLoader, read_yaml_tree

# --------------------------------------------------------------------------------------------------------------------
# Reading YAML strictly


def _convert(tp: Any, value: Any, path: str, source: str) -> Any:
    """Check `value` against the type annotation `tp` and convert it; raise ConfigError naming `path` otherwise."""
    origin = typing.get_origin(tp)
    where = f"{source}: {path}"
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of keys, got {value!r}")
        return _dataclass_from_dict(tp, value, path, source)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path, source)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        if typing.get_args(tp)[1] is not str:  # init_params.make_kwargs: YAML scalars, kept as they are
            for k, v in value.items():
                if not isinstance(v, (bool, int, float, str)):
                    raise ConfigError(f"{where}.{k}: expected a number, true/false or a string, got {v!r}")
            return {str(k): v for k, v in value.items()}
        # component_placement values may be YAML ints (`actor: 0`); keys and values are kept as strings, and
        # `all` is read in any case, as RLinf does
        return {str(k): _convert(str, str(v) if isinstance(v, int) and not isinstance(v, bool)
                                 else ("all" if isinstance(v, str) and v.strip().lower() == "all" else v),
                                 f"{path}.{k}", source)
                for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"rlinf_mini.config cannot read type {tp!r} at {path}")  # a schema bug, not a user error


def _with_make_kwargs(cls: type, data: dict) -> dict:
    """init_params: the keys that are not its fields are gymnasium.make's keyword arguments (make_kwargs)."""
    if cls is not InitParams:
        return data
    hints = typing.get_type_hints(cls)
    extra = {k: v for k, v in data.items() if k not in hints}
    if not extra:
        return data
    kept = {k: v for k, v in data.items() if k in hints}
    return kept | {"make_kwargs": {**(kept.get("make_kwargs") or {}), **extra}}


def _dataclass_from_dict(cls: type, data: dict, path: str, source: str) -> Any:
    data = _with_make_kwargs(cls, data)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in fields:  # unknown_keys() reported these before conversion started
            raise ConfigError(f"{source}: {key_path}: unknown key")
        kwargs[key] = _convert(hints[key], value, key_path, source)
    return cls(**kwargs)


def _one_edit_apart(a: str, b: str) -> bool:
    """One letter inserted, deleted or replaced turns a into b (`lrr` -> `lr`, `seeed` -> `seed`)."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[i + 1:] == b[i + 1:] or a[i + 1:] == b[i:] or a[i:] == b[i + 1:]


def closest_key(key: str, keys: list[str]) -> str | None:
    """The key meant by a misspelling: a near spelling (difflib ratio >= 0.85, so `temperature_eval` does not suggest
    `temperature_train`), or one letter off (what the ratio misses in a short key: `lrr` for `lr`)."""
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.85)
    return close[0] if close else next((k for k in keys if _one_edit_apart(key, k)), None)


def unknown_keys(cls: type, data: dict, path: str = "") -> list[tuple[str, str]]:
    """Every key path in `data` that the schema `cls` does not have, with a hint where one is likely right
    (closest_key), else ''."""
    hints = typing.get_type_hints(cls)
    out = []
    for key, value in _with_make_kwargs(cls, data).items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in hints:
            close = closest_key(str(key), list(hints))
            out.append((key_path, f" (did you mean {f'{path}.{close}' if path else close!r}?)" if close else ""))
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            out += unknown_keys(hints[key], value, key_path)
    return out


def config_from_tree(tree: dict, source: str) -> TrainConfig:
    """A plain dict (from read_yaml_tree) into a TrainConfig: every unknown key at once, then the types."""
    unknown = unknown_keys(TrainConfig, tree)
    port = "`python -m rlinf_mini.port_config FILE` ports an RLinf file"
    if len(unknown) == 1:
        raise ConfigError(f"{source}: {unknown[0][0]}: unknown key{unknown[0][1] or f' ({port})'}")
    if unknown:
        raise ConfigError(f"{source}: {len(unknown)} unknown keys: {', '.join(k + h for k, h in unknown)}; {port}")
    return _dataclass_from_dict(TrainConfig, tree, "", source)


def config_from_yaml(file: str | Path) -> TrainConfig:
    """Read a YAML file into a TrainConfig; keys absent from the file keep their defaults."""
    return config_from_tree(read_yaml_tree(file), str(file))


def config_to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: TrainConfig, file: str | Path) -> None:
    """Write the resolved config as YAML; `config_from_yaml(file) == cfg`."""
    Path(file).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# --------------------------------------------------------------------------------------------------------------------
# Command line: `--config FILE`, `key=value`, then tyro's `--key value` flags


def _flag_type(parts: list[str]) -> Any:
    """The annotation of the key that a flag's dotted parts name (`runner.no_progress_bar`: runner.progress_bar's
    bool); a section's dataclass for a section; None where the schema has no such key (or the parts go on under a
    dict: tyro makes a flag per key of a dict's value, cluster.component_placement.actor)."""
    tp: Any = TrainConfig
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(tp):
            return None
        hints = typing.get_type_hints(tp)
        tp = hints.get(part, hints.get(part[3:]) if depth == len(parts) - 1 and part.startswith("no_") else None)
    return tp


def unknown_flag(arg: str) -> str | None:
    """For a `--section.key[=value]` argument whose key path the schema lacks: one line naming it, with the closest
    key path as a hint; else None. Read from the schema: tyro lists a value such as `1e-3` as a second unknown
    argument and hints nothing."""
    if not arg.startswith("--") or arg in ("--help", "--config"):
        return None
    flag = arg.split("=", 1)[0]
    parts = flag[2:].replace("-", "_").split(".")
    for depth in range(len(parts)):
        section = _flag_type(parts[:depth])
        if not dataclasses.is_dataclass(section):
            return None  # under a dict (cluster.component_placement.critic): tyro names it unrecognized
        if _flag_type(parts[: depth + 1]) is not None:
            continue
        hints = list(typing.get_type_hints(section))
        close = closest_key(parts[depth], hints)
        hint = "--" + ".".join([*parts[:depth], close, *parts[depth + 1:]]).replace("_", "-") if close else ""
        prefix = ".".join(parts[:depth])
        where = f"{prefix} has no key {parts[depth]!r}" if prefix else f"no section {parts[depth]!r}"
        return f"{flag}: unknown flag ({where}{f'; did you mean {hint}?' if hint else ''})"
    return None


def flag_error(flags: list[str], unread: list[str] = ()) -> str:
    """Why tyro refused the flags, in one line (tyro's own message is a framed box, not read): an unknown flag, a flag
    without its value, a value its key's type cannot hold, or the arguments tyro left unread."""
    for arg in [*flags, *unread]:
        if message := unknown_flag(arg):
            return message
    for i, arg in enumerate(flags):
        flag, eq, inline = arg.partition("=")
        tp = _flag_type(flag[2:].replace("-", "_").split(".")) if arg.startswith("--") else None
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType)  # X | None: the text None, or an X
        if optional:
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        values = [inline] if eq else list(itertools.takewhile(lambda a: not a.startswith("--"), flags[i + 1:]))
        if typing.get_origin(tp) is list:  # every value up to the next flag
            tp = typing.get_args(tp)[0]
        elif tp in (int, float, str) or typing.get_origin(tp) is Literal:  # one value (bool flags take none)
            if not values:
                return f"Missing value for argument {flag!r}. Expected 1 values."
            values = values[:1]
        else:
            continue
        for value in values:
            if optional and value == "None":
                continue
            if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
                return f"invalid choice {value!r} for argument {flag!r}. Expected one of {typing.get_args(tp)}."
            try:
                if tp in (int, float):
                    tp(value)
            except ValueError as e:  # Python's own words, as tyro gives them: invalid literal for int() ...
                return f"Error parsing {flag}: {e}"
    if unread:
        return f"Unrecognized options: {', '.join(unread)}"
    return f"cannot read {' '.join(flags)} (--help lists the flags)"


_OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)+)=(.*)$", re.S)


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """Hydra-style `section.key=value` arguments (also `+key=value`) -> [(dotted key, YAML value)]; the rest stays.
    Dashes in the key read as underscores, as tyro's `--section.some-key` does."""
    rest, overrides = [], []
    for arg in argv:
        m = _OVERRIDE.match(arg)
        if not m or m.group(1).split(".")[0] not in typing.get_type_hints(TrainConfig):
            rest.append(arg)
            continue
        key, text = m.group(1).replace("-", "_"), m.group(2)
        loader = _YamlLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_nodes(node, key, "command line")
            value = "" if node is None else loader.construct_document(node)
        except yaml.YAMLError as e:
            raise ConfigError(f"command line: {key}: cannot read {text!r} as a YAML value: "
                              f"{getattr(e, 'problem', e)}") from None
        finally:
            loader.dispose()
        overrides.append((key, value))
    return rest, overrides


def _config_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """The `--config FILE` (or `--config=FILE`) files, in order, and the other arguments. A `--config` without a file
    is left in the rest."""
    files, rest, args = [], [], list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith("--config="):
            files.append(arg.removeprefix("--config="))
        elif arg == "--config" and args:
            files.append(args.pop(0))
        else:
            rest.append(arg)
    return files, rest


HELP_HEAD = f"""{TrainConfig.__doc__}

--config FILE: the run's YAML (RLinf's schema); keys not in it keep the defaults shown below. A second --config
FILE is an overlay merged over the first (its component_placement replaces the first's whole), e.g. the one
`python -m rlinf_mini.autotune` writes.

--explain: print the plan (placement, devices, batches, every check) and start nothing.

Overrides: actor.optim.lr=1e-3 (Hydra style, applied after the file), or the flags below (--actor.optim.lr 1e-3),
which win over both. Longer notes on each key, and where it differs from RLinf: docs/rlinf_keys.md."""


def load_config(argv: list[str] | None = None, validate: bool = True) -> TrainConfig:
    """Parse `[--config FILE] [section.key=value ...] [--section.key VALUE ...]` into a validated TrainConfig.

    One pass: the files (with their `defaults:` lists, a second `--config` as an overlay) and the `key=value`
    overrides become one tree (read_yaml_tree), typed into a TrainConfig (config_from_tree); tyro then applies the
    `--key value` flags. Precedence: dataclass defaults < YAML < `key=value` < `--key value`. Raises ConfigError (one
    line, naming the key and the file) on bad input; `--help` prints every key and exits.
    `validate=False` skips `validate_config` (the types are still checked): `--explain` reports what breaks itself.
    """
    files, rest = _config_files(sys.argv[1:] if argv is None else argv)
    if "--config" in rest:
        raise ConfigError("command line: --config needs a file")
    flags, overrides = split_overrides(rest)
    named = " + ".join(files) or "defaults"
    source = named + (" + command line" if overrides else "")
    cfg = (config_from_tree(read_yaml_tree(files[0] if files else None, overrides, files[1:]), source)
           if files or overrides else TrainConfig())
    if flags:  # no flag: tyro would build its whole parser only to return cfg
        import tyro  # imported here so that reading YAML alone (tests, tutorials, runs without flags) stays light

        if "-h" in flags or "--help" in flags:
            tyro.cli(TrainConfig, default=cfg, args=flags, prog="python -m rlinf_mini.train [--config FILE]",
                     description=HELP_HEAD)
        try:  # tyro frames its error in a box on the console; flag_error says it in one line from the schema
            # (silenced: console_outputs=False still lets a value error print)
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                cfg, unread = tyro.cli(TrainConfig, default=cfg, args=flags, return_unknown_args=True,
                                       console_outputs=False)
        except SystemExit:
            raise ConfigError(f"command line: {flag_error(flags)}") from None
        if unread:
            raise ConfigError(f"command line: {flag_error([], unread)}")
    if validate:
        validate_config(cfg, f"{named} + command line" if flags or overrides else named)
    return cfg


def config_source(argv: list[str]) -> str:
    """How error messages name where the config came from: the YAML file, and whether the command line changed it."""
    files, rest = _config_files(argv)
    source = " + ".join(files) or "defaults"
    return f"{source} + command line" if rest else source
