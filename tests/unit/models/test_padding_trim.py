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


def test_output_layer_runs_on_the_response_columns_only(gloo_world1):
    """compute_log_probs(from_position=P-1), as the actor calls it: the output layer sees only the
    columns from P-1 of each (trimmed) micro-batch, and the values there equal the full pass."""
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(ARGS).eval()
    g = torch.Generator().manual_seed(1)
    P = 5
    ids = torch.randint(1, 40, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, :2] = 0  # a left-padded prompt
    mask[[2, 3], 8:] = 0  # short responses: their micro-batch is trimmed to columns 0..7
    rows = []
    handle = model.output_layer.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    try:
        part, part_ent = compute_log_probs(model, ids, mask, 2, temperature=0.8, with_entropy=True, from_position=P - 1)
        full, full_ent = compute_log_probs(model, ids, mask, 2, temperature=0.8, with_entropy=True)
    finally:
        handle.remove()
    assert rows == [8 - (P - 1), 12 - (P - 1), 8, 12]  # hidden states reaching the output layer, per micro-batch
    real = (mask[:, :-1] * mask[:, 1:]).bool()
    real[:, :P - 1] = False
    assert (part - full).abs()[real].max() <= 1e-6
    assert (part_ent - full_ent).abs()[real].max() <= 1e-6
    assert not part[:, :P - 1].any() and not part_ent[:, :P - 1].any()
