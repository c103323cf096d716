"""Each broken config stops with one plain sentence naming the key, before anything starts."""
import pytest

import ray_gpt

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"

CASES = [
    # (id, overrides, expected fragments of the message)
    ("typo-role-key", [f"{A}.tensor_model_paralel_size=2"], ["tensor_model_paralel_size", "did you mean `tensor_model_parallel_size`"]),
    ("typo-training-key", ["training.global_batch_sise=4"], ["training.global_batch_sise", "global_batch_size"]),
    ("ppo-critic-section", ["critic.lr=1e-6"], ["critic", "GRPO"]),
    ("unknown-algorithm-key", ["algorithm.adv_estimater=grpo"], ["algorithm.adv_estimater", "adv_estimator"]),
    ("tp-not-dividing-heads", [f"{A}.tensor_model_parallel_size=3", "resource_pool.actor_rollout=[3]", "training.global_batch_size=3", f"{A}.ppo_mini_batch_size=3", f"{A}.micro_batch_size=8"],
     ["tensor_model_parallel_size: 3", "num_attention_heads 4"]),
    ("pp-not-dividing-layers", [f"{A}.pipeline_model_parallel_size=4", "resource_pool.actor_rollout=[4]", f"{A}.micro_batch_size=32"],
     ["pipeline_model_parallel_size: 4", "num_layers 2"]),
    ("sp-with-native-rollout", [f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true", "resource_pool.actor_rollout=[2]"],
     ["sequence_parallel: true`: the native megatron rollout engine cannot decode with sequence parallelism"]),
    ("tp-pp-vs-devices", [f"{A}.tensor_model_parallel_size=2", "resource_pool.actor_rollout=[3]"], ["= 2 does not divide its 3 training devices"]),
    ("train-infer-split", [f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=2", "resource_pool.actor_rollout=[2]"], ["num_gpus_for_train: 1", "must add up to the 2 devices"]),
    ("gbs-vs-mini", ["training.global_batch_size=10", f"{A}.ppo_mini_batch_size=4"], ["global_batch_size: 10", "ppo_mini_batch_size: 4"]),
    ("mini-vs-micro", [f"{A}.micro_batch_size=48"], ["micro_batch_size 48"]),
    ("temperature-zero", [f"{A}.temperature=0"], ["temperature: 0.0", "do_sample: false"]),
    ("bad-estimator", ["algorithm.adv_estimator=ppo_gae"], ["algorithm.adv_estimator: ppo_gae", "group_norm"]),
    ("unknown-verifier", ["algorithm.verifier_function=[nope]"], ["`nope` is not a verifier"]),
    ("verifier-weights", ["algorithm.verifier_weight=[0.5,0.5]"], ["verifier_weight` has 2"]),
    ("missing-load", [f"{A}.load=/nonexistent/ckpt"], ["load: /nonexistent/ckpt` does not exist"]),
    ("missing-tokenizer", ["training.tokenizer_name_or_path=/nonexistent/tok"], ["tokenizer_name_or_path: /nonexistent/tok` does not exist"]),
    ("missing-data", [f"{A}.data_path=/nonexistent/gsm8k"], ["data_path: /nonexistent/gsm8k", "preprocess_data.py"]),
    ("wrong-type", ["training.train_iters=abc"], ["`training.train_iters` must be an integer"]),
    ("bf16-and-fp16", ["training.bf16=true", "training.fp16=true"], ["bf16 and fp16 are both true"]),
    ("empty-actor-pool", ["resource_pool.actor_rollout=[]"], ["resource_pool.actor_rollout` is empty"]),
    ("bad-pool-entry", ["resource_pool.ref=[0]"], ["resource_pool.ref", "positive device counts"]),
    ("ppo-stage", ["training.stage=ray_ppo"], ["training.stage: ray_ppo", "ray_grpo"]),
    ("reward-model-without-load", ["resource_pool.reward=[1]"], ["reward.load` is not set"]),
    ("no-room-for-response", ["training.seq_length=16"], ["leaves no room for a response"]),
    ("undefined-model", [f"{A}.model=llama9"], ["model: llama9` names no model file entry", "tiny"]),
    ("sequence-parallel-tp1", [f"{A}.sequence_parallel=true"], ["sequence_parallel: true` needs tensor_model_parallel_size > 1"]),
    ("no-reward-at-all", ["reward.verifier=false"], ["no reward"]),
    ("dual-clip", [f"{A}.clip_ratio_c=0.5"], ["clip_ratio_c: 0.5", "> 1"]),
    ("bad-truncation", [f"{A}.truncation=middle"], ["truncation: middle", "filter"]),
    ("blended-data-path", [f"{A}.data_path='1,a,b'"], ["weight,prefix"]),
]


@pytest.mark.parametrize("overrides,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_config_message(overrides, fragments, capsys):
    code = ray_gpt.main(["--config-name", TINY, *overrides, "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


def test_pp2_actor_generating_with_native_engine_validates(capsys):
    """Pipeline-parallel generation is supported (rollout/native.py): PP=2 on the train+generate ranks plans."""
    code = ray_gpt.main(["--config-name", TINY, f"{A}.pipeline_model_parallel_size=2", "resource_pool.actor_rollout=[2]",
                         "dry_run=true"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ranks 0-1: train+generate" in captured.out


def test_unknown_config_name_lists_available(capsys):
    assert ray_gpt.main(["--config-name", "grpo_trainer_nope", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "grpo_trainer_nope" in err and "grpo_trainer_tiny" in err


def test_bad_cli_argument():
    with pytest.raises(SystemExit) as exc:
        ray_gpt.main(["--config-name", TINY, "--frobnicate"])
    assert exc.value.code == 2
