"""Ulysses sequence parallel for LTX-2 (``LTX2VideoTransformer3DModel``, diffusers 0.42.1): diffrl's
own context-parallel plan in place of the class's, the cross-attentions run locally on each rank.

The class's ``_cp_plan`` (``models/transformers/transformer_ltx2.py:1125``, LTX-Video's plan) fails
four ways (diffusers issue 14316): its rope split expects ``(B, S, D)`` while ``rope_type="split"``
(the released checkpoints) gives ``(B, H, S, D / 2)``, so the split is skipped; it splits the text
and its mask, but the attention processor shapes the mask for all heads (``:176``) while a rank
holds ``H / N`` of them after the all-to-all; the audio <-> video cross-attention's ropes are not in
it; and the audio stream is not split, so every rank computes every audio token and a sum of
gradients over the group counts the audio path ``N`` times.

**What is split.** :func:`sequence_parallel_plan` splits the video and the audio tokens on the way
in (each stream's ``(B, S, C)``; every token of either stream is computed on exactly one rank), and
the two self-attention ropes on their token dim, which depends on ``rope_type``; it gathers both
outputs. The video and the audio self-attention then go Ulysses through diffusers' attention
dispatch (its all-to-all): both heads counts must split.

**Cross-attentions run locally** (this rank's queries, all heads, against the whole keys and values):

- Text (``attn2``, ``audio_attn2``): the text is not split, every rank holds all of it and its whole
  mask. diffusers does the same for Wan's text cross-attention (``transformer_wan.py:152``); it
  sidesteps the head-shaped mask, which no plan entry can reach (it is made inside the processor),
  without assuming the mask is all ones.
- Audio <-> video (``audio_to_video_attn``, ``video_to_audio_attn``): diffusers' Ulysses cannot train
  them. Its backward (``attention_dispatch.py:2619-2630``, ``TemplatedUlyssesAttention``) reshapes the
  keys' and values' gradients with the queries' local length, which holds for self-attention only;
  video queries against audio keys fail there. So the other stream's keys (after ``norm_k``, before
  the rope) and values (``to_v``) are all-gathered over the sequence group (:class:`GatherKeysValues`,
  PyTorch's autograd all-gather, whose backward sums every rank's gradient for the part a rank
  sent). diffusers' own gather (``ContextParallelOutput``) cannot do this: its backward keeps this
  rank's slice of this rank's gradient (``hooks/context_parallel.py:254-266``), right only where
  every rank holds the same loss, at the model's output. The cross-attention ropes stay whole (the
  keys are whole) and the plan splits each attention's ``query_rotary_emb`` for its local queries.

A plan cannot say "no all-to-all here": ``enable_parallelism`` hands its parallel config to every
attention processor (``modeling_utils.py:1816-1823``), so the four local attentions get processors
that keep none (:data:`LOCAL`).

**Gradients.** Unsplit, on every rank: the rope coordinates, the timestep embeddings and modulation
(one per sample), the text projection and the text keys and values. Only a rank's own tokens reach
its loss (the output gather's backward keeps its slice), so each rank's gradients are its tokens'
part and their sum over the group is one process's: the actor's loss scaling sums them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from diffusers import LTX2VideoTransformer3DModel
from diffusers.models._modeling_parallel import (
    ContextParallelInput,
    ContextParallelModelPlan,
    ContextParallelOutput,
)
from diffusers.models.transformers.transformer_ltx2 import (
    LTX2AudioVideoAttnProcessor,
    LTX2PerturbedAttnProcessor,
)
from torch import nn

CROSS_MODAL = ("audio_to_video_attn", "video_to_audio_attn")
"""The audio <-> video cross-attentions of each block (``transformer_ltx2.py:764-799``): video
queries on audio keys, audio queries on video keys; each takes the query's rope and the key's."""
LOCAL_ATTENTIONS = ("attn2", "audio_attn2", *CROSS_MODAL)
"""The attentions of each block that run locally (see the module docstring)."""


def sequence_parallel_plan(config: Any) -> dict[str, ContextParallelModelPlan]:
    """The plan for an ``LTX2VideoTransformer3DModel`` of ``config``: a dict like the class's
    ``_cp_plan`` (``transformer_ltx2.py:1125``), for ``ModelMixin.enable_parallelism``."""
    tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
    if config.rope_type == "split":  # cos and sin each (B, H, S, D / 2) (:1075)
        rope = dict(split_dim=2, expected_dims=4)
    else:  # "interleaved": (B, S, D) (:1045-1051), as the class's plan
        rope = dict(split_dim=1, expected_dims=3)
    rope_output = ContextParallelInput(**rope, split_output=True)
    rope_input = ContextParallelInput(**rope, split_output=False)
    return {
        # the packed tokens of each stream (B, S, C), before proj_in and audio_proj_in (:1514-1515)
        "": {"hidden_states": tokens, "audio_hidden_states": tokens},
        # the self-attention ropes (:1505-1506), from the whole grid's coordinates
        "rope": {0: rope_output, 1: rope_output},
        "audio_rope": {0: rope_output, 1: rope_output},
        # the cross-modal ropes (:1508-1511) stay whole for the gathered keys; the queries' are split
        # where they enter the attention (:776, :795)
        **{
            f"transformer_blocks.*.{name}": {"query_rotary_emb": [rope_input, rope_input]}
            for name in CROSS_MODAL
        },
        # each stream's velocity (B, S, C) (:1682, :1689)
        "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        "audio_proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


class _NoParallelConfig:
    """Keeps ``_parallel_config`` None whatever ``enable_parallelism`` sets: the processor's
    ``dispatch_attention_fn(..., parallel_config=self._parallel_config)`` (``transformer_ltx2.py:214``,
    ``:309``) then runs plain attention on this rank's queries."""

    _parallel_config = property(lambda self: None, lambda self, config: None)


class LocalAttnProcessor(_NoParallelConfig, LTX2AudioVideoAttnProcessor):
    """``LTX2AudioVideoAttnProcessor`` that never goes Ulysses."""


class LocalPerturbedAttnProcessor(_NoParallelConfig, LTX2PerturbedAttnProcessor):
    """``LTX2PerturbedAttnProcessor`` (LTX-2.3's blocks) that never goes Ulysses."""


LOCAL = {
    LTX2AudioVideoAttnProcessor: LocalAttnProcessor,
    LTX2PerturbedAttnProcessor: LocalPerturbedAttnProcessor,
}
"""Each processor class diffusers gives LTX-2's attentions, to its local twin."""


class GatherKeysValues:
    """A forward hook on a cross-modal attention's ``norm_k`` or ``to_v``: their ``(B, S / N, D)``
    output -> the whole ``(B, S, D)`` over ``model``'s sequence group (the plan's split group, its
    ``_flattened_mesh``), once ``enable_parallelism`` has run (before, it passes the output on).
    An object, not a closure, so that a deep copy of the model gathers over the copy's config."""

    def __init__(self, model: LTX2VideoTransformer3DModel):
        self.model = model

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        config = self.model._parallel_config
        if config is None or config.context_parallel_config is None:
            return output
        # differentiable (reduce-scatter backward); what torch.distributed.nn.functional.all_gather's
        # deprecation notice points to, and the module diffusers' own collectives use
        return funcol.all_gather_single(
            output.contiguous(), 1, config.context_parallel_config._flattened_mesh
        )


def prepare_sequence_parallel(model: LTX2VideoTransformer3DModel) -> LTX2VideoTransformer3DModel:
    """Ready ``model`` for :func:`~diffrl.models.sequence_parallel.enable_sequence_parallel`:
    :func:`sequence_parallel_plan` as its ``_cp_plan`` (an instance attribute, which
    ``enable_parallelism`` reads when given no plan, ``modeling_utils.py:1829``), :data:`LOCAL`
    processors for :data:`LOCAL_ATTENTIONS` and :class:`GatherKeysValues` on the cross-modal
    attentions' keys and values. Once per model; returns ``model``."""
    if "_cp_plan" in vars(model):
        raise ValueError("ltx2 sequence parallel: this transformer was prepared already")
    model._cp_plan = sequence_parallel_plan(model.config)
    gather = GatherKeysValues(model)
    for block in model.transformer_blocks:
        for name in LOCAL_ATTENTIONS:
            attn = getattr(block, name)
            kind = type(attn.processor)
            if kind not in LOCAL:
                raise ValueError(
                    f"ltx2 sequence parallel: block attention {name} has a {kind.__name__}; diffrl runs "
                    f"it locally only with {', '.join(c.__name__ for c in LOCAL)}"
                )
            local = LOCAL[kind]()
            local._attention_backend = attn.processor._attention_backend
            attn.set_processor(local)
        for name in CROSS_MODAL:
            attn = getattr(block, name)
            attn.norm_k.register_forward_hook(gather)
            attn.to_v.register_forward_hook(gather)
    return model
