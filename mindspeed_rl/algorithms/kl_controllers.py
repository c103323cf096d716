"""KL coefficient controllers: the beta that weighs the KL penalty (in the reward or the loss).

    fixed      beta never changes
    adaptive   Ziegler et al. 2019 (arXiv:1909.08593, section 2.2), the PPO-paper rule:
               e = clip(KL / target_kl - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon)

`build_kl_controller(kind, kl_coef, target_kl, horizon)` maps the config's
`algorithm.kl_ctrl.{type, kl_coef, target_kl, horizon}` onto a controller. Same rule as verl,
TRL and the seed (ray_gpt).
"""

from collections.abc import Callable


class FixedKLController:
    """A constant beta. `value` is read by the trainer each step."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient ignores the observed KL."""


class AdaptiveKLController:
    """beta follows the observed KL towards `target_kl`, by at most 20% per `horizon` samples."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not target_kl > 0:
            raise ValueError(f"adaptive KL controller needs target_kl > 0, got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"adaptive KL controller needs horizon > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move beta after a step that saw `current_kl` (mean KL) over `n_steps` samples."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def _fixed(kl_coef: float, target_kl: float | None, horizon: int | None) -> FixedKLController:
    return FixedKLController(kl_coef)


def _adaptive(kl_coef: float, target_kl: float | None, horizon: int | None) -> AdaptiveKLController:
    if target_kl is None or horizon is None:
        raise ValueError("kl_ctrl type 'adaptive' needs both target_kl and horizon")
    return AdaptiveKLController(kl_coef, target_kl, horizon)


KL_CONTROLLERS: dict[str, Callable[..., FixedKLController | AdaptiveKLController]] = {
    "fixed": _fixed,
    "adaptive": _adaptive,
}


def build_kl_controller(
    kind: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """The KL controller named `kind` ('fixed' or 'adaptive'), starting at beta = kl_coef.

    Raises:
        ValueError: unknown kind, or adaptive without a positive target_kl and horizon.
    """
    if kind not in KL_CONTROLLERS:
        raise ValueError(f"unknown kl_ctrl type {kind!r}; valid: {', '.join(KL_CONTROLLERS)}")
    return KL_CONTROLLERS[kind](kl_coef, target_kl, horizon)
