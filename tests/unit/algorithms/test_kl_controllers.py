"""Fixed and adaptive KL controllers, worked by hand."""

import pytest

from mindspeed_rl.algorithms import AdaptiveKLController, FixedKLController, build_kl_controller


def test_fixed_never_moves():
    ctrl = build_kl_controller("fixed", kl_coef=0.001)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=5.0, n_steps=256)
    assert ctrl.value == 0.001


def test_adaptive_by_hand():
    ctrl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.01, horizon=10000)
    assert isinstance(ctrl, AdaptiveKLController)
    # KL twice the target: error clip(2 - 1) = +0.2 -> x (1 + 0.2 * 256 / 10000) = x 1.00512
    ctrl.update(current_kl=0.02, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512)
    # KL 0.009: error -0.1 -> x (1 - 0.1 * 256 / 10000) = x 0.99744
    ctrl.update(current_kl=0.009, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512 * 0.99744)
    # KL 0: error clipped at -0.2
    ctrl.value = 1.0
    ctrl.update(current_kl=0.0, n_steps=10000)
    assert ctrl.value == pytest.approx(0.8)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="'pid'.*fixed.*adaptive|'pid'.*adaptive"):
        build_kl_controller("pid", kl_coef=0.1)
    with pytest.raises(ValueError, match="target_kl and horizon"):
        build_kl_controller("adaptive", kl_coef=0.1)
    with pytest.raises(ValueError, match="horizon > 0"):
        build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="target_kl > 0"):
        build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.0, horizon=10)
