"""Reading a configuration: training recipe files (``recipe=NAME``, ``defaults:`` inheritance), Hydra-style
``key=value`` overrides (:func:`load_config`) and a run's saved ``config.yaml`` (:func:`from_yaml_file`)."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import typing
from typing import Any

from minite_util.choices import did_you_mean
from trainers.config.schema import DEFAULT_RECIPE, SELF_BUILT, Config, ConfigError, _hints, _is_dc
from trainers.config.validation import _unknown, build, validate

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def recipe_dirs() -> list[pathlib.Path]:
    dirs = []
    env = os.environ.get("MINITE_RECIPES_DIR")
    if env:
        dirs.append(pathlib.Path(env))
    dirs += [pathlib.Path.cwd() / "recipes", REPO_ROOT / "recipes"]
    out: list[pathlib.Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def list_recipes() -> list[str]:
    names = set()
    for d in recipe_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def find_recipe(name: str) -> pathlib.Path:
    p = pathlib.Path(name).expanduser()
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    for d in recipe_dirs():
        q = d / f"{name}.yaml"
        if q.is_file():
            return q
    valid = list_recipes()
    searched = ", ".join(str(d) for d in recipe_dirs()) or "recipes/"
    raise ConfigError(f"unknown recipe {name!r}{did_you_mean(name, valid)}; valid recipes: "
                      f"{', '.join(valid) or '(none found)'} (searched {searched})")


def _load_recipe_tree(name: str, seen: tuple[str, ...] = ()) -> dict:
    from omegaconf import OmegaConf

    path = find_recipe(name)
    if str(path.resolve()) in seen:
        raise ConfigError(f"recipe inheritance cycle: {' -> '.join(seen + (str(path),))}")
    try:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception as e:
        raise ConfigError(f"cannot parse recipe {path}: {e}") from e
    if not isinstance(node, dict):
        raise ConfigError(f"recipe {path} must be a YAML mapping")
    parents = node.pop("defaults", []) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict = {}
    for parent in parents:
        pname = pathlib.Path(path).parent / f"{parent}.yaml"
        merged = _merge(merged, _load_recipe_tree(str(pname) if pname.is_file() else parent,
                                                  seen + (str(path.resolve()),)))
    return _merge(merged, node)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _parse_value(key: str, raw: str) -> Any:
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.from_dotlist([f"v={raw}"])
        return OmegaConf.to_container(node, resolve=True)["v"]
    except Exception as e:
        raise ConfigError(f"cannot parse the value of override {key}={raw!r}: {e}") from e


def _free_form_parent(path: list[str]) -> bool:
    """True when path[:-1] points to a dict-typed field or a section that starts empty (e.g. algorithm.triage)."""
    cls: Any = Config
    for i, part in enumerate(path[:-1]):
        hints = _hints(cls) if _is_dc(cls) else {}
        if part not in hints:
            return False
        tp = hints[part]
        if tp is dict or typing.get_origin(tp) is dict or tp in SELF_BUILT:
            return True
        cls = tp
    return False


def _exists(tree: dict, path: list[str]) -> bool:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _set(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def _delete(tree: dict, path: list[str]) -> None:
    node: Any = tree
    for part in path[:-1]:
        node = node.get(part, {})
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _defaults_tree() -> dict:
    def conv(obj: Any) -> Any:
        if isinstance(obj, SELF_BUILT):
            return {}
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple):
            return [conv(v) for v in obj]
        return obj
    return conv(Config())


def load_config(args: list[str] | tuple[str, ...] = ()) -> Config:
    """Parse ``recipe=NAME`` and overrides into a validated :class:`Config`."""
    recipe = DEFAULT_RECIPE
    overrides: list[str] = []
    for a in args:
        if a.startswith("recipe="):
            recipe = a.split("=", 1)[1]
        elif a.startswith("--"):
            raise ConfigError(f"unknown option {a!r}; use key=value overrides (e.g. trainer.max_steps=5)")
        else:
            overrides.append(a)
    tree = _merge(_defaults_tree(), _load_recipe_tree(recipe))
    tree["recipe"] = recipe
    # keys the recipe files introduced are validated by build(); overrides follow Hydra's grammar
    for ov in overrides:
        if ov.startswith("~"):
            path = ov[1:].split("=", 1)[0].split(".")
            _delete(tree, path)
            default = _defaults_tree()
            node: Any = default
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                _set(tree, path, node)
            continue
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} must look like key=value (or +key=value to add a key)")
        key, raw = ov.split("=", 1)
        if key == "precision":  # shorthand: one precision recipe for learner and sampler
            _set(tree, ["precision", "learner"], raw)
            _set(tree, ["precision", "sampler"], raw)
            continue
        plus = key.startswith("+")
        key = key.lstrip("+")
        path = key.split(".")
        if key == "recipe":
            continue
        exists = _exists(tree, path)
        if plus and exists:
            raise ConfigError(f"override +{key}: key already exists; drop the '+' to change it")
        if not plus and not exists and not _free_form_parent(path):
            raise _unknown(key)
        _set(tree, path, _parse_value(key, raw))
    return validate(build(Config, tree))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1, "c": {}}}`` -> ``{"a.b": 1, "a.c": {}}``: dotted keys, as overrides write them (an empty
    mapping stays a value)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def from_yaml_file(path: str | os.PathLike) -> Config:
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return validate(build(Config, tree))
