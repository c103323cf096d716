"""Valid names that live in other packages (algorithms, rewards, data), asked for lazily.

The config package never duplicates these lists: it asks the package that owns each dict, so a
new estimator or verifier is valid in configs the moment it is added there.
"""
from __future__ import annotations

import os


def advantage_estimators() -> tuple[str, ...]:
    from mindspeed_rl.algorithms import ESTIMATORS
    return tuple(ESTIMATORS)


def kl_kinds() -> tuple[str, ...]:
    from mindspeed_rl.algorithms import KL_ESTIMATORS
    return tuple(KL_ESTIMATORS)


def loss_agg_modes() -> tuple[str, ...]:
    from mindspeed_rl.algorithms import AGGREGATION_MODES
    return tuple(AGGREGATION_MODES)


def kl_controllers() -> tuple[str, ...]:
    from mindspeed_rl.algorithms import KL_CONTROLLERS
    return tuple(KL_CONTROLLERS)


def verifier_problem(name: str) -> str | None:
    """None when `name` is a built-in verifier or a loadable user function, else the reason."""
    from mindspeed_rl.rewards import VERIFIERS, load_user_function
    from mindspeed_rl.utils.errors import UserInputError

    if name in VERIFIERS:
        return None
    if ":" in name:
        try:
            load_user_function(name)
        except UserInputError as err:
            return str(err)
        return None
    return f"`{name}` is not a verifier; use one of: {', '.join(VERIFIERS)}, or module.path:function / /path/file.py:function."


def data_path_problem(value: str) -> str | None:
    """None when every dataset in `value` (a raw file, an indexed prefix, or '1,prefA,1,prefB') exists."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    paths = parts[1::2] if len(parts) > 1 else parts
    if len(parts) > 1 and (len(parts) % 2 or not all(_is_number(w) for w in parts[0::2])):
        return "a blended data_path is 'weight,prefix,weight,prefix,...'; check the commas."
    for path in paths:
        if os.path.isfile(path):
            continue
        candidates = (f"{path}.idx", f"{path}_packed_input_ids_document.idx", f"{path}_text_document.idx")
        found = [c for c in candidates if os.path.isfile(c)]
        if not found:
            return (f"no such file or indexed dataset ({path} or {path}_packed_input_ids_document.idx/.bin); "
                    f"run preprocess_data.py or point it at a jsonl/parquet file.")
        idx = found[0]
        bin_path = idx[: -len(".idx")] + ".bin"
        if not os.path.isfile(bin_path):  # the .idx alone is the index; the token ids live in the .bin
            return (f"{idx} is there but its {os.path.basename(bin_path)} is missing; copy the .bin next to the .idx "
                    f"(they are written as a pair) or run preprocess_data.py again.")
        if os.path.getsize(bin_path) == 0 and os.path.getsize(idx) > 64:
            return f"{bin_path} is empty while its .idx lists documents; the copy was cut short, so copy it again."
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
