"""LTX-2 under Ulysses sequence parallel on 2 gloo ranks (:mod:`diffrl.models.ltx2_sequence_parallel`):
the tiny LTX-2's guided velocity (``family.velocity``: CFG on ``[negative, positive]``, the STG pass,
the modality-isolation pass), with a text mask that hides tokens, gives one process's output, and its
gradients summed over the sequence group are one process's, for both rope layouts; lengths that do
not split are config errors.

Measured (CPU, float32): the velocity is bit for bit one process's; the largest gradient difference
is 7.0e-7 of the largest gradient entry ("split" rope) and 9.8e-7 ("interleaved"), over every
parameter (base and LoRA): the two ranks add their tokens' parts in another order than one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from diffusers.models.attention_dispatch import dispatch_attention_fn
from peft import LoraConfig, inject_adapter_in_model

from diffrl.config import ConfigError
from diffrl.core.parallel import free_port, sequence_mesh
from diffrl.core.rollout import Conditioning
from diffrl.models.ltx2 import LTX2_LORA_TARGETS
from diffrl.models.registry import load_family
from diffrl.models.sequence_parallel import enable_sequence_parallel
from tests.integration.test_ltx2 import ATTENTIONS, SIZE, ltx2_config, write_tiny_ltx2
from tests.ranks import run_ranks

OPTIONS = "{num_frames: 5, frame_rate: 12.5, max_sequence_length: 16, stg_blocks: [1]}"
"""3 x 8 x 8 = 192 video tokens and 5 / 12.5 s x 25 = 10 audio tokens: both split over 2 ranks."""
ROPES = ("split", "interleaved")
GRAD_RTOL = 1e-5
"""The gradients' largest difference over the largest gradient entry (measured <= 9.8e-7)."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny LTX-2.3 (perturbed attention) per rope layout."""
    out = {}
    for rope in ROPES:
        out[rope] = tmp_path_factory.mktemp(f"ltx2_{rope}")
        write_tiny_ltx2(out[rope], rope_type=rope)
    return out


def forward_backward(config, mesh=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The guided velocity of 2 samples and the gradients of its mean square for every parameter
    (the base weights and a LoRA with non-zero B, so that every gradient is non-zero), with the
    transformer split over ``mesh``'s sequence ranks when given."""
    torch.manual_seed(0)
    family = load_family(config)
    transformer = family.transformer
    lora = LoraConfig(r=2, lora_alpha=2, target_modules=LTX2_LORA_TARGETS, init_lora_weights=False)
    inject_adapter_in_model(lora, transformer).requires_grad_(True)
    if mesh is not None:
        for part in family.description.sequence_parallel_modules(transformer):
            enable_sequence_parallel(part, mesh)
    (n,) = family.latent_shape(SIZE, SIZE)
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.9, 0.4])
    cond = family.encode_prompts(["a red ball bouncing", "waves"])
    # the tiny connectors' registers make the mask all ones: hide 4 tokens of the first prompt, as
    # connectors without registers would its padding (both text cross-attentions take the mask)
    mask = cond.tensors["encoder_attention_mask"].clone()
    mask[0, :4] = 0
    cond = Conditioning({**cond.tensors, "encoder_attention_mask": mask})
    negative = family.negative("", 3.0, cond)
    v = family.velocity(x, sigma, cond, 3.0, negative)
    v.square().mean().backward()
    return v.detach(), {k: p.grad.clone() for k, p in transformer.named_parameters()}, transformer


def ulysses_cross_attention_backward(parallel_config) -> str:
    """What diffusers' Ulysses attention does in the backward of 4 local queries against 2 local
    keys: "RuntimeError" while ``TemplatedUlyssesAttention.backward`` reshapes the keys' gradients
    with the queries' length (diffusers 0.42.1, ``attention_dispatch.py:2619-2630``), the reason
    the audio <-> video cross-attentions gather their keys instead."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, n, 2, 4, generator=g, requires_grad=True) for n in (4, 2, 2))
    try:
        dispatch_attention_fn(q, k, v, parallel_config=parallel_config).sum().backward()
    except RuntimeError:
        return "RuntimeError"
    return "ok"


def _rank(rank: int, port: int, configs: dict, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        mesh = sequence_mesh("cpu", 1, 2)
        results = {}
        for rope, config in configs.items():
            v, grads, transformer = forward_backward(config, mesh)
            own = {k: g.clone() for k, g in grads.items()}  # this rank's part alone
            for g in grads.values():  # each rank's backward covered its part of both streams
                dist.all_reduce(g, group=mesh["ulysses"].get_group())
            results[rope] = (v, grads, own)
        results["ulysses"] = ulysses_cross_attention_backward(transformer._parallel_config)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def test_two_sequence_ranks_give_one_process_s_velocity_and_gradients(tmp_path, folders):
    configs = {
        rope: ltx2_config(tmp_path / rope, folders[rope], **{"model.options": OPTIONS}) for rope in ROPES
    }
    out = str(tmp_path / "rank0.pt")
    run_ranks(_rank, free_port(), configs, out)
    results = torch.load(out)
    for rope, config in configs.items():
        v, grads, _ = forward_backward(config)
        got_v, got, own = results[rope]
        torch.testing.assert_close(got_v, v, rtol=0, atol=1e-6, msg=rope)
        assert got.keys() == grads.keys()
        assert all(g.abs().max() > 0 for g in grads.values()), rope
        assert all(any(f".{a}.to_q.lora_B" in k for k in grads) for a in ATTENTIONS)
        largest = max(g.abs().max().item() for g in grads.values())
        worst = max((got[k] - g).abs().max().item() / largest for k, g in grads.items())
        print(f"{rope} rope: velocity difference {(got_v - v).abs().max().item():.1e}, gradients {worst:.1e}")
        assert worst < GRAD_RTOL, rope
        # the tokens were split: one rank's backward alone is not the whole gradient
        assert max((own[k] - g).abs().max().item() for k, g in grads.items()) > 1e-3 * largest
    # when this fails, diffusers trains Ulysses cross-attention between streams of different
    # lengths: the audio <-> video cross-attentions could then go Ulysses instead of gathering
    assert results["ulysses"] == "RuntimeError"


def test_sequence_parallel_lengths_that_do_not_split_are_config_errors(tmp_path, folders):
    """``parallel.sequence: 4``: 5 frames of 32 x 32 at 24 fps are 3 x 8 x 8 = 192 video tokens
    (they split) and 5 / 24 s x 25 = 5 audio tokens; the tiny transformer has 2 heads per stream.
    The text is not split, so 16 text tokens need not divide."""
    sp = {"runner": "ray", "parallel.trainer_ranks": 4, "parallel.sequence": 4}
    options = "{num_frames: 5, max_sequence_length: 16, stg_blocks: [1]}"
    with pytest.raises(ConfigError) as e:
        ltx2_config(tmp_path, folders["split"], **sp, **{"model.options": options})
    msg = str(e.value)
    assert "video tokens" not in msg
    assert (
        "parallel.sequence=4: the ltx2 model's audio tokens (5) do not split over 4 ranks (Ulysses "
        "needs a multiple of 4; change model.options.num_frames or frame_rate)" in msg
    )
    for stream in ("video", "audio"):
        assert f"the ltx2 model's {stream} attention heads (2) do not split over 4 ranks" in msg
    # 2 ranks: 10 audio tokens at 12.5 fps, 192 video tokens and 2 heads per stream split
    sp = {**sp, "parallel.trainer_ranks": 2, "parallel.sequence": 2}
    assert ltx2_config(tmp_path, folders["split"], **sp, **{"model.options": OPTIONS}).parallel.sequence == 2
