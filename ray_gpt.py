"""GRPO training of LLMs: compose + validate the config, connect Ray, build the roles, fit.

    python ray_gpt.py                                   # the built-in tiny task on CPU
    python ray_gpt.py --config-name grpo_trainer_qwen25_7b training.train_iters=10
    python ray_gpt.py --config-name X dry_run=true      # validate, print the plan, exit

Configs live in configs/rlxf/ (experiments) and configs/rlxf/model/ (architectures), in the
vocabulary of MindSpeed-LLM's ray_gpt. Bad input stops here with one sentence per problem,
before any Ray worker starts.
"""
from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="ray_gpt.py", description="GRPO training with Ray and Megatron-core.",
        epilog="Overrides are hydra-style key=value pairs, e.g. training.train_iters=10 "
               "actor_rollout_ref.actor_rollout.lr=1e-6 dry_run=true.")
    parser.add_argument("--config-name", "-cn", default="grpo_trainer_tiny", help="experiment yaml in --config-dir")
    parser.add_argument("--config-dir", "-cd", "--config-path", "-cp", default=None,
                        help="folder of experiment yaml files (default: configs/rlxf of this repo)")
    parser.add_argument("--skip-version-check", action="store_true",
                        help="start even if the accelerator stack (torch, torch_npu, CANN, MindSpeed, megatron-core, "
                             "vllm) does not match mindspeed_rl/platform/versions.py (also training.skip_version_check)")
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unrecognized argument {bad[0]!r}; overrides look like key=value (e.g. training.train_iters=10)")
    return args, rest


def version_mismatches(cfg) -> list[str]:
    """The installed accelerator stack against the matrix, for the platform this run uses."""
    from mindspeed_rl.platform import get_platform
    from mindspeed_rl.platform.versions import check_versions, installed_versions

    return check_versions(installed_versions(), get_platform(cfg.run.platform).name)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    from mindspeed_rl.config import load_config
    from mindspeed_rl.distributed.plan import make_plan
    from mindspeed_rl.utils.errors import UserInputError
    from mindspeed_rl.utils.report import print_run_summary

    try:
        cfg = load_config(args.config_name, overrides, args.config_dir)
        plan = make_plan(cfg)
    except UserInputError as err:
        print(f"ray_gpt.py: {err}", file=sys.stderr)
        return 2
    if not (args.skip_version_check or cfg.run.skip_version_check):
        mismatches = version_mismatches(cfg)
        if mismatches:
            for line in mismatches:
                print(f"ray_gpt.py: {line}", file=sys.stderr)
            print("ray_gpt.py: the accelerator stack does not match the tested matrix (mindspeed_rl/platform/versions.py); "
                  "fix the above, or pass --skip-version-check to start anyway.", file=sys.stderr)
            return 2
    print_run_summary(cfg, plan)
    if cfg.dry_run:
        print("dry_run: the config is valid; nothing was started.")
        return 0
    from mindspeed_rl.distributed.cluster import ClusterError
    from mindspeed_rl.distributed.worker_group import WorkerGroupError
    from mindspeed_rl.rollout.sync_check import RolloutSyncError
    from mindspeed_rl.trainer.grpo import TrainingHalted
    from mindspeed_rl.trainer.launch import run
    from mindspeed_rl.utils.logging import quiet_library_warnings

    quiet_library_warnings()
    try:
        return run(cfg, plan)
    except UserInputError as err:
        print(f"ray_gpt.py: {err}", file=sys.stderr)
        return 2
    except (ClusterError, WorkerGroupError, ConnectionError, TrainingHalted, RolloutSyncError) as err:
        print(f"ray_gpt.py: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ray_gpt.py: interrupted; workers were shut down.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
