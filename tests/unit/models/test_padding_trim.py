"""No compute on padding (issue 15): each micro-batch runs only on the columns where some row has a
real token, and the results equal the full-width computation at the precision of the other
log-prob tests (the update's exactness is test_train_step.py's, which trims its micro-batches too)."""
import torch

from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.models.forward import compute_log_probs, forward_microbatches, padding_span, vocab_parallel_log_probs

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=40, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


def test_padding_span_is_the_union_of_the_real_columns():
    m = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]])
    assert padding_span(m) == (1, 5)
    assert padding_span(torch.zeros(2, 3)) == (0, 3)


def test_log_probs_of_trimmed_micro_batches_equal_the_full_width(gloo_world1):
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(ARGS).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (4, 12), generator=g)
    mask = torch.zeros(4, 12, dtype=torch.long)
    mask[[0, 1, 3]] = 1  # full width
    mask[2, 3:7] = 1  # two short rows, sorted into one micro-batch: columns 2..8 only
    mask[0] = 0
    mask[0, 2:9] = 1
    widths = []
    original = model.forward

    def spy(input_ids, *a, **k):
        widths.append(input_ids.shape[1])
        return original(input_ids, *a, **k)

    model.forward = spy
    try:
        trimmed, _ = compute_log_probs(model, ids, mask, 2)
        post = lambda logits, mb: vocab_parallel_log_probs(logits[:, :-1], mb["input_ids"][:, 1:])[0]  # noqa: E731
        full = torch.cat(forward_microbatches(model, ids, mask, 2, post, trim_padding=False))
    finally:
        model.forward = original
    assert widths == [7, 12, 12, 12]  # the two short rows were put together and ran on their 7 real columns
    real = (mask[:, :-1] * mask[:, 1:]).bool()  # predictions of a real token from a real token
    assert trimmed.shape == full.shape == (4, 11)
    assert (trimmed - full).abs()[real].max() <= 1e-5
