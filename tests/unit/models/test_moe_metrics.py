"""ExpertLoadMeter on what the actor holds: one model, or a virtual pipeline's list of chunks."""
import torch

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, padded_vocab_size=40,
            max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True,
            num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16)


def test_the_meter_finds_the_routers_of_every_chunk_and_counts_every_routed_token(gloo_world1):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.models.moe_metrics import ExpertLoadMeter

    init_parallel_state(1, 1)
    model = build_gpt_model(ARGS).eval()
    assert len(ExpertLoadMeter(model).routers) == 2
    assert len(ExpertLoadMeter([model, model]).routers) == 4  # a chunk list (VPP), as update_actor passes it
    ids, mask = torch.randint(0, 40, (2, 5)), torch.ones(2, 5, dtype=torch.long)
    with ExpertLoadMeter([model]) as meter, torch.no_grad():
        model(ids, position_ids_from_mask(mask), attention_mask_4d(mask))
    assert [float(c.sum()) for c in meter.counts.values()] == [20.0, 20.0]  # 10 tokens x top-2, per layer
    assert meter.stats()["moe/aux_loss"] > 0
