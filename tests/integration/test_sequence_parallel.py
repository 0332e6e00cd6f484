"""Ulysses sequence parallel on 2 gloo ranks (``diffrl.models.sequence_parallel``): a tiny Wan
transformer with a peft LoRA gives one process's output, and its LoRA gradients summed over the
sequence group are one process's, within float tolerance; also with FSDP2 sharding it over the
flattened data x sequence axis."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from diffusers import WanTransformer3DModel
from peft import LoraConfig, inject_adapter_in_model
from torch.distributed.fsdp import fully_shard

from diffrl.models.sequence_parallel import enable_sequence_parallel
from diffrl.parallel import free_port, sequence_mesh


def tiny_wan() -> WanTransformer3DModel:
    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    )
    lora = LoraConfig(
        r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights=False
    )
    return inject_adapter_in_model(lora, model).eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(B, C, F, H, W)`` latents: 5 frames of 8x8 -> 5 * 4 * 4 = 80 tokens (split 40 + 40)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 5, 8, 8, generator=g)
    return x, torch.tensor([900.0, 300.0]), torch.randn(2, 6, 32, generator=g)


def forward_backward(model) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x, t, text = inputs()
    out = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    out.square().mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if "lora_" in n}


def _rank(rank: int, port: int, path: str, fsdp: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        model = tiny_wan()
        mesh = sequence_mesh("cpu", 1, 2)
        enable_sequence_parallel(model, mesh)
        if fsdp:  # FSDP2 over the flattened dp x sp axis (one sequence group of 2 here)
            flat = mesh["dp", "ulysses"]._flatten("dp_sp")
            for block in model.blocks:
                fully_shard(block, mesh=flat)
            fully_shard(model, mesh=flat)
        out, grads = forward_backward(model)
        own = {k: g.clone() for k, g in grads.items()}  # this rank's part alone
        if fsdp:
            # FSDP2 averages over dp x sp, but the sequence parts must be summed: times sp (in
            # training the loss is scaled by sp instead; gloo has no PREMUL_SUM for a divide factor)
            grads = {k: g.full_tensor() * 2 for k, g in grads.items()}
        else:
            for g in grads.values():  # each rank's backward covered its half of the sequence
                dist.all_reduce(g, group=mesh["ulysses"].get_group())
        if rank == 0:
            torch.save({"out": out, "grads": grads, "own": own}, path)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "fsdp2"])
def test_two_sequence_ranks_give_one_process_s_output_and_gradients(tmp_path, fsdp):
    model = tiny_wan()
    out, grads = forward_backward(model)
    path = str(tmp_path / "rank0.pt")
    mp.spawn(_rank, args=(free_port(), path, fsdp), nprocs=2, join=True)
    got = torch.load(path)
    torch.testing.assert_close(got["out"], out, rtol=0, atol=1e-6)
    assert got["grads"].keys() == grads.keys() and grads
    for k, g in grads.items():
        torch.testing.assert_close(got["grads"][k], g, rtol=1e-5, atol=1e-7, msg=k)
    if not fsdp:  # the sequence was split: one rank's backward alone is not the whole gradient
        assert not all(torch.allclose(got["own"][k], g, rtol=1e-3, atol=1e-6) for k, g in grads.items())


def _bare(rank: int, port: int, path: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        from diffusers import ContextParallelConfig

        try:
            tiny_wan().enable_parallelism(
                config=ContextParallelConfig(ulysses_degree=2, mesh=sequence_mesh("cpu", 1, 2))
            )
            outcome = "ok"
        except ZeroDivisionError:
            outcome = "ZeroDivisionError"
        if rank == 0:
            torch.save(outcome, path)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.accelerator.device_count() > 0, reason="the workaround is for CPU-only machines")
def test_diffusers_still_divides_by_the_accelerator_count(tmp_path):
    """What ``_one_accelerator_without_one`` works around: if diffusers stops dividing by
    ``torch.accelerator.device_count()`` (0 on CPU) before it reads a given mesh, this fails and the
    workaround can go."""
    path = str(tmp_path / "bare.pt")
    mp.spawn(_bare, args=(free_port(), path), nprocs=2, join=True)
    assert torch.load(path) == "ZeroDivisionError"
