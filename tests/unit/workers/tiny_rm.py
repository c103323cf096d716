"""A tiny random reward model for the built-in tiny task (imported by the dist and e2e tests)."""
from testing_utils import save_random_reward_model


def make_tiny_task_rm(out_dir, seed=0, vocab_size=16):
    """Save a random fp32 Qwen2ForSequenceClassification (num_labels=1) with the tiny model's
    architecture (configs/rlxf/model/tiny.yaml: 2 layers, hidden 64, 4 heads / 2 kv heads of 16)
    over the tiny task tokenizer's 13 ids (vocab_size >= 13; 16 splits over TP=2). Returns it."""
    import transformers as tf

    config = tf.Qwen2Config(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, vocab_size=vocab_size, max_position_embeddings=64,
                            rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, num_labels=1,
                            pad_token_id=0)
    return save_random_reward_model(config, out_dir, seed)
