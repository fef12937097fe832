"""The study file: :class:`StudyConfig` and its :class:`EvalSpec`, read and checked up front
(:func:`load_study`), and the trainer arguments each run of the grid gets (:func:`train_args`)."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any


class StudyError(ValueError):
    """A bad study file or override; the message names the key and the valid values."""


@dataclass(frozen=True)
class EvalSpec:
    tasks: str = "arithmetic"
    temperature: float = 0.0
    max_new_tokens: int = 64
    samples: int = 1
    limit: int | None = None
    seed: int = 0
    batch_size: int = 32  # sequences per generation batch
    # > 0: every run also evaluates itself every N steps and after its last (the trainer's eval.every, in
    # <run>/eval/step_<N>): every run at the same steps, by its own sampler, without loading a checkpoint
    every: int = 0
    # also evaluate the untrained model, once per distinct eval setting (sampler precision, dtype, ...): the
    # baseline every arm's checkpoints are read against, in <output_dir>/step0/
    step0: bool = True
    # with `every`: each run is also evaluated under this one sampler precision (bf16 or a recipe name; the trainer's
    # eval.precision, in <run>/eval@<precision>/), so that every arm is read at the same precision next to its own
    precision: str | None = None


@dataclass(frozen=True)
class StudyConfig:
    name: str
    output_dir: str
    arms: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    parallel: int = 1
    # GPU memory one run holds at its peak (GB); > 0 caps `parallel` at what the GPU holds (runner.run_parallel),
    # so one grid fits an 80 GB H100 and a 141 GB H200 alike; 0: no cap
    gpu_gb_per_run: float = 0.0
    train: dict[str, Any] = field(default_factory=dict)
    eval: EvalSpec | None = field(default_factory=EvalSpec)
    steps_at: tuple[int, ...] = ()
    window: int = 10
    # the arm every other is compared against at equal steps (trainers/compare.py); None: no comparison
    baseline: str | None = None
    # more contrasts paired by seed (trainers/paired.py), each [arm, against]: e.g. [nvfp4, strict_nvfp4]
    pairs: tuple[tuple[str, str], ...] = ()
    # arms read from another study's recorded runs instead of run again, each (arm, that study's directory): the
    # runs must have been trained with the settings this study gives the arm (:func:`check_borrowed`)
    borrow: tuple[tuple[str, str], ...] = ()

    @property
    def root(self) -> pathlib.Path:
        return pathlib.Path(self.output_dir)

    @property
    def compared_arms(self) -> tuple[str, ...]:
        """The arms the study trains, then those it borrows: every arm its tables and contrasts read."""
        return self.arms + tuple(arm for arm, _ in self.borrow)

    def run_dir(self, arm: str, seed: int) -> pathlib.Path:
        lent = dict(self.borrow).get(arm)
        return (self.root if lent is None else pathlib.Path(lent)) / arm / f"seed{seed}"


def load_study(path: str | os.PathLike, overrides: list[str] = ()) -> StudyConfig:
    """Read the study YAML, apply ``key=value`` overrides (OmegaConf dotlist), validate everything up front."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = pathlib.Path(path)
    if not p.is_file():
        raise StudyError(f"study file {str(p)!r} does not exist")
    try:
        tree = OmegaConf.to_container(OmegaConf.merge(_with_defaults(p), OmegaConf.from_dotlist(list(overrides))))
    except (OmegaConfBaseException, ValueError) as e:
        raise StudyError(f"{p}: cannot parse the study or its overrides ({e})") from None
    if not isinstance(tree, dict):
        raise StudyError(f"{p}: expected a mapping at the top level")
    known = {f.name for f in dataclasses.fields(StudyConfig)}
    unknown = sorted(set(tree) - known)
    if unknown:
        raise StudyError(f"{p}: unknown key(s) {unknown}; valid: {sorted(known)}")
    for key in ("name", "output_dir", "arms"):
        if key not in tree:
            raise StudyError(f"{p}: {key!r} is required")
    return _build(tree, p)


def _with_defaults(p: pathlib.Path, seen: tuple[pathlib.Path, ...] = ()):
    """The study file merged over the studies its ``defaults: [name, ...]`` names (files ``<name>.yaml`` beside
    it, themselves resolved the same way; later ones and the file itself win; lists are replaced, not joined)."""
    from omegaconf import OmegaConf

    if p.resolve() in seen:
        raise StudyError(f"{p}: defaults form a cycle ({' -> '.join(str(s) for s in (*seen, p))})")
    own = OmegaConf.load(p)
    names = own.pop("defaults", None) or []
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise StudyError(f"{p}: defaults must be a list of study names (files beside it), got {names!r}")
    parts = []
    for name in names:
        base = p.parent / f"{name}.yaml"
        if not base.is_file():
            have = sorted(f.stem for f in p.parent.glob("*.yaml") if f != p)
            raise StudyError(f"{p}: defaults: no study {name!r} beside it; valid: {', '.join(have)}")
        parts.append(_with_defaults(base, (*seen, p.resolve())))
    return OmegaConf.merge(*parts, own)


def _build(tree: dict, p: pathlib.Path) -> StudyConfig:
    from trainers.config import flatten, list_recipes

    recipes = list_recipes()
    arms = tree["arms"]
    if isinstance(arms, str) or not isinstance(arms, list) or not arms:
        raise StudyError(f"{p}: arms must be a non-empty list of training recipes; valid: {', '.join(recipes)}")
    bad = [a for a in arms if a not in recipes]
    if bad:
        raise StudyError(f"{p}: arms {bad} are not training recipes; valid: {', '.join(recipes)}")
    if len(set(arms)) != len(arms):
        raise StudyError(f"{p}: an arm is listed twice in {arms}")
    seeds = tree.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                            for s in seeds) or len(set(seeds)) != len(seeds):
        raise StudyError(f"{p}: seeds must be a non-empty list of distinct integers, got {seeds!r}")
    parallel = tree.get("parallel", 1)
    if not isinstance(parallel, int) or parallel < 1:
        raise StudyError(f"{p}: parallel must be an integer >= 1, got {parallel!r}")
    gpu_gb = tree.get("gpu_gb_per_run", 0.0)
    if isinstance(gpu_gb, bool) or not isinstance(gpu_gb, (int, float)) or gpu_gb < 0:
        raise StudyError(f"{p}: gpu_gb_per_run must be a number >= 0 (GB; 0: no cap), got {gpu_gb!r}")
    train = flatten(tree.get("train") or {})
    reserved = sorted(k for k in train if k in ("recipe", "trainer.seed", "trainer.output_dir"))
    if reserved:
        raise StudyError(f"{p}: train.{reserved[0]} is set by the study for each run (arms, seeds, output_dir)")
    in_eval = sorted(k for k in train if k.startswith("eval."))
    if in_eval:
        raise StudyError(f"{p}: train.{in_eval[0]}: a study's held-out eval is its `eval` section (eval.every "
                         "evaluates inside the runs), so that every run and the untrained model use the same one")
    ev = tree.get("eval", {})
    if ev is None:
        eval_spec = None
    else:
        try:
            eval_spec = EvalSpec(**ev)
        except TypeError as e:
            raise StudyError(f"{p}: eval: {e}; valid keys: "
                             f"{[f.name for f in dataclasses.fields(EvalSpec)]}") from None
    if eval_spec is not None and eval_spec.precision is not None and not eval_spec.every:
        raise StudyError(f"{p}: eval.precision={eval_spec.precision} is evaluated inside the runs: set eval.every=N")
    steps_at = tree.get("steps_at") or []
    window = tree.get("window", 10)
    if not isinstance(window, int) or window < 1:
        raise StudyError(f"{p}: window must be an integer >= 1, got {window!r}")
    borrow = tree.get("borrow") or {}
    if not isinstance(borrow, dict) or not all(isinstance(v, str) for v in borrow.values()):
        raise StudyError(f"{p}: borrow must map arms to the directory of a recorded study "
                         f"(e.g. {{rollout_nvfp4: benchmarks/learning/study_headroom}}), got {borrow!r}")
    for arm, where in borrow.items():
        if arm not in recipes or arm in arms:
            raise StudyError(f"{p}: borrow: {arm!r} must be a training recipe that is not one of the arms "
                             f"({', '.join(arms)}); valid: {', '.join(r for r in recipes if r not in arms)}")
        if not (pathlib.Path(where) / arm).is_dir():
            raise StudyError(f"{p}: borrow: {arm} has no runs under {where!r} ({where}/{arm}/ does not exist)")
    compared = [*arms, *borrow]
    baseline = tree.get("baseline")
    if baseline is not None and baseline not in compared:
        from minite_util.choices import did_you_mean

        raise StudyError(f"{p}: baseline {baseline!r} is not one of the arms; valid: {', '.join(compared)}"
                         f"{did_you_mean(str(baseline), compared)}")
    pairs = tree.get("pairs") or []
    if not isinstance(pairs, list) or not all(isinstance(x, list) and len(x) == 2 and x[0] != x[1] for x in pairs):
        raise StudyError(f"{p}: pairs must be a list of [arm, against] pairs of two different arms, got {pairs!r}")
    bad = sorted({a for x in pairs for a in x if a not in compared})
    if bad:
        raise StudyError(f"{p}: pairs name {bad}, not arms of this study; valid: {', '.join(compared)} "
                         "(to run a subset of the arms, also override pairs=[])")
    cfg = StudyConfig(name=str(tree["name"]), output_dir=str(tree["output_dir"]), arms=tuple(arms),
                      seeds=tuple(seeds), parallel=parallel, gpu_gb_per_run=float(gpu_gb), train=train,
                      eval=eval_spec,
                      steps_at=tuple(int(s) for s in steps_at), window=window, baseline=baseline,
                      pairs=tuple((str(a), str(b)) for a, b in pairs),
                      borrow=tuple((str(a), str(w)) for a, w in borrow.items()))
    _check_train_overrides(cfg, p)
    check_borrowed(cfg, p)
    return cfg


#: run settings a borrowed run may differ in: where it ran and with how many CPU threads
_NOT_COMPARED = ("trainer.output_dir", "trainer.cpu_threads")


def check_borrowed(cfg: StudyConfig, p: pathlib.Path | str = "study") -> None:
    """Every recorded run of a borrowed arm (its ``config.yaml``) against the trainer config this study would give
    that arm and seed: a setting both name must be equal (the run's directory and CPU threads aside). Settings
    only one side names (keys the trainer gained or lost since the run) are not compared."""
    import yaml

    from trainers.config import flatten, load_config, to_container

    for arm, where in cfg.borrow:
        # the config of seed s differs from seed 0's only in trainer.seed (and the directory): built once per arm
        base = flatten(to_container(load_config(train_args(cfg, arm, cfg.seeds[0]))))
        for seed in cfg.seeds:
            recorded = cfg.run_dir(arm, seed) / "config.yaml"
            if not recorded.is_file():
                continue
            was = flatten(yaml.load(recorded.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
            now = base | {"trainer.seed": seed}
            differ = sorted(k for k in set(was) & set(now) if k not in _NOT_COMPARED and was[k] != now[k])
            if differ:
                k = differ[0]
                raise StudyError(f"{p}: borrow: {where}/{arm}/seed{seed} ran with {k}={was[k]!r}, this study gives "
                                 f"{k}={now[k]!r} ({len(differ)} setting(s) differ: {', '.join(differ[:5])})")


def _check_train_overrides(cfg: StudyConfig, p: pathlib.Path) -> None:
    """Build every run's trainer config now, so a bad key fails before the first run starts."""
    from trainers.config import ConfigError, load_config

    for arm in cfg.arms:
        try:
            load_config(train_args(cfg, arm, cfg.seeds[0]))
        except ConfigError as e:
            raise StudyError(f"{p}: arm {arm}: {e}") from None


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)


def study_threads(parallel: int) -> int:
    """CPU threads per run: the cores shared evenly between the ``parallel`` runs that go at once."""
    return max(1, (os.cpu_count() or 1) // parallel)


def train_args(cfg: StudyConfig, arm: str, seed: int) -> list[str]:
    args = [f"recipe={arm}", f"trainer.seed={seed}", f"trainer.output_dir={cfg.run_dir(arm, seed)}"]
    if "trainer.cpu_threads" not in cfg.train:
        # fixed by the study, not left to the trainer's load check: a run started right after another sees that
        # run's load average and would drop to 1 thread, and CPU results depend on the thread count
        args.append(f"trainer.cpu_threads={study_threads(cfg.parallel)}")
    args += [f"{k}={_value(v)}" for k, v in cfg.train.items()]
    e = cfg.eval
    if e is not None and e.every:  # the same held-out eval as the checkpoints' `eval run`, inside the run
        args += [f"eval.every={e.every}", f"eval.tasks={_value(e.tasks.split(','))}", f"eval.samples={e.samples}",
                 f"eval.temperature={e.temperature}", f"eval.max_new_tokens={e.max_new_tokens}",
                 f"eval.seed={e.seed}", f"eval.batch_size={e.batch_size}", f"eval.limit={_value(e.limit)}"]
        if e.precision is not None:
            args.append(f"eval.precision={e.precision}")
    return args


def max_steps(cfg: StudyConfig, arm: str) -> int:
    from trainers.config import load_config

    return load_config(train_args(cfg, arm, cfg.seeds[0])).trainer.max_steps


def _config_dict(cfg: StudyConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["arms"], d["seeds"], d["steps_at"] = list(cfg.arms), list(cfg.seeds), list(cfg.steps_at)
    return d
