"""Compose the layered yaml with hydra and convert it, once, into the typed `Config`.

    cfg = load_config("grpo_trainer_tiny", ["training.train_iters=5"])

Precedence per role, as in ray_gpt: role section > `training` > model file. Every flat key is
routed to its group dataclass (schema.py); an unknown key is an error that names the yaml path and
suggests the closest known key. Cross-field checks live in validate.py; derived defaults here.
Plain `a.b=c` overrides are passed to hydra as `++a.b=c` so that a typo reaches our did-you-mean
check instead of hydra's struct error.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
import warnings
from pathlib import Path
from typing import Any

from mindspeed_rl.config import compat, schema
from mindspeed_rl.config.schema import (AlgorithmConfig, Config, DataConfig, KLCtrlConfig,
                                        ResourcePoolConfig, RoleConfig, RunConfig)
from mindspeed_rl.utils.errors import UserInputError

REPO_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "rlxf"
TOP_LEVEL_KEYS = ("model", "training", "actor_rollout_ref", "reward", "algorithm", "resource_pool", "dry_run")
ROLE_PATHS = {"actor_rollout": "actor_rollout_ref.actor_rollout", "ref": "actor_rollout_ref.ref", "reward": "reward"}


# ---------------------------------------------------------------------------- hydra composition
def compose_yaml(config_name: str, overrides: list[str] = (), config_dir: str | None = None) -> dict:
    """Compose configs/rlxf/<config_name>.yaml (+ its model files) with hydra; return a plain dict."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    primary = Path(config_dir).resolve() if config_dir else REPO_CONFIG_DIR
    if not primary.is_dir():
        raise UserInputError(f"--config-dir {config_dir} is not a directory; point it at a folder of experiment yaml files.")
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    if not (primary / f"{name}.yaml").is_file():
        have = sorted(p.stem for p in primary.glob("*.yaml"))
        raise UserInputError(f"--config-name {config_name}: there is no {primary / (name + '.yaml')}; "
                             f"available: {', '.join(have) or 'none'}.")
    hydra_overrides = [_force(o) for o in overrides]
    if config_dir:  # a user's own config dir still finds our model files
        hydra_overrides.append(f"hydra.searchpath=[file://{REPO_CONFIG_DIR}]")
    GlobalHydra.instance().clear()
    try:
        # ray_gpt configs have no `_self_` in their defaults; hydra's default order (the experiment
        # overrides its model files) is the one they expect, so the reminder is noise.
        warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`", category=UserWarning)
        with initialize_config_dir(config_dir=str(primary), version_base=None):
            cfg = compose(config_name=name, overrides=hydra_overrides)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except yaml.YAMLError as err:  # hydra lets the parser's error through, with its own traceback
        raise UserInputError(yaml_error_sentence(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        msg = str(err).strip().splitlines()[0]
        raise UserInputError(f"config {name}: {msg}") from None
    finally:
        GlobalHydra.instance().clear()
    raw.pop("hydra", None)
    return raw


# what usually causes each parser complaint, and the fix, in the user's words
_YAML_FIXES = (
    ("mapping values are not allowed", "a `key: value` line is indented differently from its neighbours, or a value "
     "holds an unquoted `: `; line keys up under their parent and quote values that contain `: `"),
    ("could not find expected ':'", "a line has no `key: value` form, or a quote opened earlier is not closed; "
     "add the `:` or close the quote"),
    ("expected ',' or ']'", "a `[` list is not closed; end it with `]` on the same line"),
    ("expected ',' or '}'", "a `{` mapping is not closed; end it with `}` on the same line"),
    ("found character '\\t'", "a tab indents this line; yaml indents with spaces only"),
    ("found undefined alias", "`*name` refers to no `&name` anchor; define the anchor or quote the value"),
    ("found unexpected end of stream", "a quote is not closed; close it on the same line"),
    ("did not find expected key", "the indentation changes within a block; indent every key of the block the same"),
    ("did not find expected '-' indicator", "a list item is indented differently from the others; align the `-`s"),
)


def yaml_error_sentence(err) -> str:
    """A yaml parser error as `file, line N, column M: problem; fix` (no traceback)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
    fix = next((f for pattern, f in _YAML_FIXES if pattern in problem),
               "check the indentation (spaces only) and that every quote and bracket is closed")
    ctx = getattr(err, "context_mark", None)
    if ctx is not None and mark is not None and ctx.line != mark.line:  # an unclosed `[`, `{` or quote:
        # where it opened is what the user must fix; where the parser gave up is often the file's end
        where = f"{ctx.name}, line {ctx.line + 1}, column {ctx.column + 1} (the parser gave up at line {mark.line + 1})"
    return f"{where}: yaml syntax error ({problem}); {fix}."


def _force(override: str) -> str:
    """`a.b=c` -> `++a.b=c` (set or add); group overrides and explicit prefixes pass unchanged."""
    key = override.split("=", 1)[0]
    if "=" not in override or key.startswith(("+", "~")) or key == "model" or key.startswith("hydra"):
        return override
    return "++" + override


# ---------------------------------------------------------------------------- conversion
def load_config(config_name: str, overrides: list[str] = (), config_dir: str | None = None,
                check_paths: bool = True) -> Config:
    """Compose, convert, derive and validate. Raises UserInputError listing every problem found."""
    from mindspeed_rl.config.validate import validate

    raw = compose_yaml(config_name, overrides, config_dir)
    cfg = build_config(raw, config_name)
    validate(cfg, check_paths=check_paths)
    return cfg


def build_config(raw: dict, config_name: str = "experiment") -> Config:
    """Convert a composed ray_gpt-style dict into a Config with derived defaults (no cross-checks)."""
    raw = dict(raw)
    _check_keys("", raw, TOP_LEVEL_KEYS, extra_hint={"critic": "the critic role is PPO's; this framework runs the GRPO family, so remove the critic section"})
    models = raw.get("model") or {}
    training = _section(raw, "training")
    arr = raw.get("actor_rollout_ref") or {}
    _check_keys("actor_rollout_ref.", arr, ("actor_rollout", "ref"))
    sections = {"actor_rollout": _section(arr, "actor_rollout"), "ref": _section(arr, "ref"),
                "reward": _section(raw, "reward")}
    ignored: dict[str, str] = {}
    # an empty model file entry (`name:` with no keys) is a model taken wholly from its checkpoint
    models = {name: {} if entry is None else entry for name, entry in models.items()}
    for name, entry in models.items():
        if not isinstance(entry, dict):
            raise UserInputError(f"model.{name} must be a mapping of Megatron arguments (num_layers: ..., hidden_size: ...), got {entry!r}.")
        _check_flat_keys(f"model.{name}", entry)
    _check_flat_keys("training", training)
    for role, sec in sections.items():
        _check_flat_keys(ROLE_PATHS[role], sec)

    roles = {role: _build_role(role, models, training, sec, ignored) for role, sec in sections.items()}
    actor_view, origin = _merged_view(models, training, sections["actor_rollout"], "actor_rollout")
    run = _fill(RunConfig(), actor_view, origin)
    data = _fill(DataConfig(), actor_view, origin)
    algorithm = _build_algorithm(raw.get("algorithm") or {})
    pool = _build_pool(raw.get("resource_pool") or {})
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise UserInputError(f"dry_run must be true or false, got {dry_run!r}.")
    cfg = Config(config_name=config_name, run=run, data=data, algorithm=algorithm, resource_pool=pool,
                 actor=roles["actor_rollout"], ref=roles["ref"], reward=roles["reward"],
                 dry_run=dry_run, ignored=ignored)
    _derive(cfg)
    return cfg


def _section(parent: dict, key: str) -> dict:
    value = parent.get(key) or {}
    if not isinstance(value, dict):
        raise UserInputError(f"{key} must be a mapping of keys to values, got {value!r}.")
    return {compat.normalize_key(k): v for k, v in value.items()}


def _suggest(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else "; see the key reference, docs/config_keys.md."


def _check_keys(prefix: str, section: dict, allowed, extra_hint: dict | None = None) -> None:
    for key in section:
        if key in allowed:
            continue
        if extra_hint and key in extra_hint:
            raise UserInputError(f"`{prefix}{key}`: {extra_hint[key]}.")
        raise UserInputError(f"`{prefix}{key}` is not a known section{_suggest(key, allowed)}")


def _check_flat_keys(path: str, section: dict) -> None:
    """Every key is in our schema or in the Megatron-LM / MindSpeed-LLM vocabulary (config/compat.py)."""
    for key, value in section.items():
        key = compat.normalize_key(key)
        kind = compat.route(key)
        if kind == "unsupported":
            err = compat.unsupported_problem(key, value)
            if err:
                raise UserInputError(f"`{path}.{key}` {err}.")
        if kind is not None:
            continue
        ours = schema.all_flat_keys() | set(compat.MINDSPEED_SWITCHES)
        hint = _suggest(key, ours)  # our own keys first: a typo of one of them is the likely case
        if "did you mean" not in hint:
            hint = _suggest(key, compat.suggestion_pool())
        raise UserInputError(f"`{path}.{key}` is not a known key (neither ours nor a Megatron-LM / MindSpeed-LLM "
                             f"argument){hint}")


def _merged_view(models: dict, training: dict, role_sec: dict, role: str) -> tuple[dict, dict]:
    """role > training > model, with the yaml path each value came from."""
    model_name = role_sec.get("model", training.get("model"))
    if model_name is None and len(models) == 1:
        model_name = next(iter(models))
    layers = []
    if model_name is not None:
        if model_name not in models:
            raise UserInputError(f"`{ROLE_PATHS[role]}.model: {model_name}` names no model file entry; "
                                 f"defined: {', '.join(models) or 'none'} (add it under defaults: - model: [...]).")
        layers.append((f"model.{model_name}", {compat.normalize_key(k): v for k, v in models[model_name].items()}))
    layers += [("training", training), (ROLE_PATHS[role], role_sec)]
    merged, origin = {"model": model_name}, {}
    for path, sec in layers:
        for key, (value, where) in _renamed(path, sec).items():
            merged[key], origin[key] = value, where
    _derived_aliases(merged, origin)
    return merged, origin


def _renamed(path: str, sec: dict) -> dict:
    """{key: (value, yaml path)} of one section, MindSpeed-LLM's and Megatron-LM's other spellings
    (compat.ALIASES) under the schema's names; a section giving both with different values is refused."""
    out = {}
    for key, value in sec.items():
        target = compat.ALIASES.get(key)
        if target is None:
            out.setdefault(key, (value, f"{path}.{key}"))
            continue
        if key in compat.ALIAS_VALUES:
            try:
                value = compat.ALIAS_VALUES[key](value)
            except (TypeError, ValueError):
                raise UserInputError(f"`{path}.{key}: {value!r}` is not a value it takes; see "
                                     f"{target} in docs/config_keys.md.") from None
            if value is None:
                continue
        if target in sec and sec[target] != value:
            raise UserInputError(f"`{path}.{key}: {sec[key]}` (another name for {target}: {value}) disagrees with "
                                 f"`{path}.{target}: {sec[target]}`; keep one of the two.")
        out[target] = (value, f"{path}.{key}")
    return out


def _hf_config_of(merged: dict) -> dict:
    """config.json of the role's `load` when it is a HF directory, else {} (read only for the keys that
    derive a schema key from others)."""
    from mindspeed_rl.models.hf_bridge.loader import hf_config_of

    load = merged.get("load")
    try:
        return (hf_config_of(load) if isinstance(load, str) else None) or {}
    except (OSError, ValueError):
        return {}  # validate() reports an unreadable config.json with its own sentence


def _derived_aliases(merged: dict, origin: dict) -> None:
    """MindSpeed-LLM keys that set a schema key from other keys too (compat.DERIVED), as MindSpeed-LLM
    2.3.0 resolves them; num_layers and the widths come from config.json when the yaml leaves them out."""
    from mindspeed_rl.models.hf_moe_config import expert_count

    given = {k: (merged.pop(k), origin.pop(k)) for k in compat.DERIVED if k in merged}
    hf = _hf_config_of(merged) if given else {}
    if not given or not (hf or merged.get("hidden_size")):  # none, or a role without a model (a rule reward)
        return
    if "first_k_dense_replace" in given:
        dense, where = _count(*given["first_k_dense_replace"])
        freq = merged.get("moe_layer_freq", 1)
        layers = merged.get("num_layers") or hf.get("num_hidden_layers")
        if (merged.get("num_experts") or expert_count(hf)) and dense:  # MindSpeed-LLM: MoE models only
            if not isinstance(freq, int) or isinstance(freq, bool) or freq < 1:
                raise UserInputError(f"`{where}` makes the first {dense} layers dense in an interval pattern, but "
                                     f"`{origin.get('moe_layer_freq', 'moe_layer_freq')}` is {freq!r}; with a list of "
                                     f"0 / 1 per layer drop first_k_dense_replace (the list says which layers are dense).")
            if not layers:
                raise UserInputError(f"`{where}` needs num_layers (in the model file, or a HF `load:` directory).")
            if dense >= layers:
                raise UserInputError(f"`{where}: {dense}` leaves no MoE layer among num_layers {layers}; it must be "
                                     f"smaller than num_layers.")
            merged["moe_layer_freq"] = [int(i >= dense and i % freq == 0) for i in range(layers)]
            origin["moe_layer_freq"] = where
    if "n_shared_experts" in given:
        shared, where = _count(*given["n_shared_experts"])
        if shared and merged.get("moe_shared_expert_intermediate_size") is None:  # an explicit width wins, as there
            width = (merged.get("moe_ffn_hidden_size") or merged.get("ffn_hidden_size")
                     or hf.get("moe_intermediate_size") or hf.get("intermediate_size"))
            if not width:
                raise UserInputError(f"`{where}` needs the expert width: set moe_ffn_hidden_size (MindSpeed-LLM: "
                                     f"moe_intermediate_size) or load a HF directory.")
            merged["moe_shared_expert_intermediate_size"] = shared * width
            origin["moe_shared_expert_intermediate_size"] = where
    seq_aux, where = given.get("seq_aux", (False, None))
    if seq_aux:  # MindSpeed-LLM's store_true switch; false means unset
        kind = merged.get("moe_router_load_balancing_type", "aux_loss")
        if kind not in ("aux_loss", "seq_aux_loss"):
            raise UserInputError(f"`{where}: true` computes the aux loss per sequence, which needs "
                                 f"moe_router_load_balancing_type aux_loss, but `{origin['moe_router_load_balancing_type']}` "
                                 f"is {kind}; drop one of the two.")
        merged["moe_router_load_balancing_type"] = "seq_aux_loss"
        origin["moe_router_load_balancing_type"] = where


def _count(value, where: str) -> tuple[int, str]:
    """A non-negative integer key (first_k_dense_replace, n_shared_experts) and where it was written."""
    value = _coerce(value, int, where)
    if value < 0:
        raise UserInputError(f"`{where}` must be an integer of at least 0, got {value!r}.")
    return value, where


def _build_role(role: str, models: dict, training: dict, sec: dict, ignored: dict) -> RoleConfig:
    view, origin = _merged_view(models, training, sec, role)
    cfg = RoleConfig(role=role, model_name=view.pop("model") or "")
    cfg = _fill(cfg, view, origin)
    # what the user wrote (model file, training, role section, overrides), not what has a default:
    # with a HF `load` only these are held against config.json (schema defaults never override it)
    arch_fields = set(schema.field_names(schema.ModelArch))
    cfg.arch_set = {k: origin.get(k, k) for k, v in view.items() if k in arch_fields and v is not None}
    for group in schema.ROLE_GROUPS:
        setattr(cfg, group, _fill(getattr(cfg, group), view, origin))
    for key, value in view.items():
        kind = compat.route(key)
        if kind == "mindspeed":
            cfg.mindspeed_switches[key] = value
        elif kind in ("no_effect", "unsupported"):  # an unsupported one reaching here is off
            ignored.setdefault(key, compat.no_effect_reason(key) if kind == "no_effect"
                               else f"off; {compat.UNSUPPORTED[key][1]}")
    return cfg


def _fill(obj, view: dict, origin: dict):
    """Set the fields of dataclass `obj` that appear in `view`, type-checked; nested ones skipped."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name in view and not dataclasses.is_dataclass(hints[f.name]):
            setattr(obj, f.name, _coerce(view[f.name], hints[f.name], origin.get(f.name, f.name)))
    return obj


def _coerce(value: Any, hint, where: str) -> Any:
    """Check a yaml value against a field type; ints are fine where floats are wanted."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if value is None:
        if optional:
            return None
        raise UserInputError(f"`{where}` must not be null; give it a value or delete the line for the default.")
    if base is bool:
        if isinstance(value, bool):
            return value
        kind = "true or false"
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        kind = "an integer"
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # yaml reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        kind = "a number"
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        kind = "a string"
    elif base is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        kind = "a list"
    elif base is dict:
        if isinstance(value, dict):
            return value
        kind = "a mapping"
    else:
        return value
    raise UserInputError(f"`{where}` must be {kind}, got {value!r}.")


def _build_algorithm(section: dict) -> AlgorithmConfig:
    section = {compat.normalize_key(k): v for k, v in section.items()}
    known = schema.field_names(AlgorithmConfig)
    _check_keys("algorithm.", section, known)
    alg = _fill(AlgorithmConfig(), section, {k: f"algorithm.{k}" for k in section})
    kl = section.get("kl_ctrl") or {}
    if not isinstance(kl, dict):
        raise UserInputError(f"`algorithm.kl_ctrl` must be a mapping (type: fixed, kl_coef: 0.05), got {kl!r}.")
    _check_keys("algorithm.kl_ctrl.", kl, schema.field_names(KLCtrlConfig))
    alg.kl_ctrl = _fill(KLCtrlConfig(), kl, {k: f"algorithm.kl_ctrl.{k}" for k in kl})
    if isinstance(section.get("verifier_function"), str):
        alg.verifier_function = [section["verifier_function"]]
    return alg


def _build_pool(section: dict) -> ResourcePoolConfig:
    _check_keys("resource_pool.", section, schema.field_names(ResourcePoolConfig),
                extra_hint={"critic": "the critic role is PPO's; this framework runs the GRPO family, so remove resource_pool.critic"})
    pool = ResourcePoolConfig()
    for key, value in section.items():
        value = [] if value is None else [value] if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise UserInputError(f"`resource_pool.{key}` must be a list of positive device counts per node "
                                 f"(e.g. [8, 8] for two nodes), got {value!r}.")
        setattr(pool, key, list(value))
    return pool


# ---------------------------------------------------------------------------- derived fields
def _derive(cfg: Config) -> None:
    run, data = cfg.run, cfg.data
    if run.output_dir is None:
        run.output_dir = os.path.join("outputs", cfg.config_name)
    if run.tensorboard_dir is None:
        run.tensorboard_dir = os.path.join(run.output_dir, "tensorboard")
    for role in (cfg.actor, cfg.ref, cfg.reward):
        a = role.arch
        if role.load and _is_hf_dir(role.load):
            _arch_from_config_json(role)
        else:
            if a.hidden_size and a.num_attention_heads:
                a.kv_channels = a.kv_channels or a.hidden_size // a.num_attention_heads
                a.ffn_hidden_size = a.ffn_hidden_size or 4 * a.hidden_size
            if not a.group_query_attention:
                a.num_query_groups = a.num_attention_heads
            a.max_position_embeddings = a.max_position_embeddings or run.seq_length
        _from_hybrid_pattern(a)
        p = role.ppo
        p.clip_ratio_low = p.clip_ratio if p.clip_ratio_low is None else p.clip_ratio_low
        p.clip_ratio_high = p.clip_ratio if p.clip_ratio_high is None else p.clip_ratio_high
        p.ppo_mini_batch_size = p.ppo_mini_batch_size or run.global_batch_size
        r = role.rollout
        if r.max_new_tokens is None:
            r.max_new_tokens = run.seq_length - data.max_prompt_length
        if role.save is None:
            role.save = os.path.join(run.output_dir, "checkpoints")
    if data.data_path is None:  # the built-in tiny task: its data and tokenizer ship in the package
        from mindspeed_rl.data import tiny_task
        data.data_path, data.val_data_path = tiny_task.TRAIN_FILE, data.val_data_path or tiny_task.VAL_FILE
        run.tokenizer_name_or_path = run.tokenizer_name_or_path or tiny_task.TOKENIZER_DIR
    if run.tokenizer_name_or_path is None and cfg.actor.load and _is_hf_dir(cfg.actor.load):
        run.tokenizer_name_or_path = cfg.actor.load


def _from_hybrid_pattern(a) -> None:
    """hybrid_override_pattern (Nemotron-H's one block per layer) sets num_layers, mamba_layers, moe_layer_freq and
    no_rope_freq (attention without RoPE) where they are unset; a pattern that is not one, or that disagrees with
    them, is validate()'s to report."""
    from mindspeed_rl.models import hybrid_pattern

    pattern = a.hybrid_override_pattern
    if pattern is None or hybrid_pattern.problem(pattern) or (a.num_layers and a.num_layers != len(pattern)):
        return
    a.num_layers = a.num_layers or len(pattern)
    if a.mamba_layers is None and "M" in pattern:
        a.mamba_layers = hybrid_pattern.mamba_marks(pattern)
    if "E" in pattern and a.moe_layer_freq == 1:
        a.moe_layer_freq = hybrid_pattern.moe_marks(pattern)
    if a.no_rope_freq is None:  # its attention layers have no RoPE (Nemotron-H; Megatron-LM's hybrid model)
        a.no_rope_freq = [1] * len(pattern)


def _arch_from_config_json(role: RoleConfig) -> None:
    """Every architecture key the user left unset takes config.json's value (models/arch_check.py).
    A config.json that cannot be read or is unsupported is left to validate(), which says why."""
    from mindspeed_rl.models.arch_check import resolve_arch

    try:
        resolved = resolve_arch(dataclasses.asdict(role.arch), role.arch_set, role.load)
    except UserInputError:
        return
    for key, value in resolved.items():
        if hasattr(role.arch, key):
            setattr(role.arch, key, value)


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))
