"""Checkpoints: LoRA weights, EMA and optimizer state round-trip and are refused by another
family; they are verified before use: a truncated, corrupt, mixed or incomplete checkpoint is
refused naming the file, ``latest`` skips it; identical states write identical files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffrl.models.base import FamilyMismatchError
from diffrl.models.registry import load_family
from diffrl.models.tiny import TinyDescription, TinyFamily
from diffrl.preflight import load_config
from diffrl.sampling.sampler import initial_noise
from diffrl.train.actor import Actor, apply_lora
from diffrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_optimizer_state,
    load_resume_state,
    load_weights_into,
    prune_checkpoints,
    remove_partial_writes,
    save_checkpoint,
    verify_checkpoint,
)
from diffrl.train.manifest import run_folder_hint, seal


class OtherDescription(TinyDescription):
    name = "other"


class OtherFamily(TinyFamily):
    """A second family (same code, another name) to check cross-family refusals (also named by
    ``tests/integration/test_sft_end_to_end.py`` as ``tests.unit.train.test_checkpoint:OtherFamily``)."""

    description = OtherDescription


def _velocity(family, prompts=('the text "AB3"', 'the number "42"')):
    x = initial_noise(family, [(0, "t", i) for i in range(len(prompts))], 32, 64)
    with torch.no_grad():
        return family.velocity(x, torch.tensor([0.7, 0.3]), family.encode_prompts(list(prompts)))


def _save(actor, path, iteration=2):
    return save_checkpoint(path, actor, actor.config, iteration, run_id="r1", loop_state={"evals": []})


def test_identical_states_write_identical_files(tmp_path, actor):
    a = verify_checkpoint(_save(actor, tmp_path / "a"))["files"]
    b = verify_checkpoint(_save(actor, tmp_path / "b"))["files"]
    assert a == b and {"trainable.safetensors", "optimizer.safetensors", "ema.safetensors"} <= a.keys()


def _truncate(path):
    f = path / "trainable.safetensors"
    f.write_bytes(f.read_bytes()[:100])


def _corrupt_json(path):
    f = path / "checkpoint.json"
    f.write_text(f.read_text()[:50])


def _mix(path, other):
    shutil.copy(other / "optimizer.safetensors", path / "optimizer.safetensors")


def _foreign(path):
    (path / "extra.safetensors").write_bytes(b"x")


def _missing(path):
    (path / "ema.safetensors").unlink()


@pytest.mark.parametrize(
    "damage, message",
    [
        (_truncate, "trainable.safetensors does not match its sha256"),
        (_corrupt_json, "checkpoint.json is corrupt"),
        ("mix", "optimizer.safetensors does not match its sha256"),
        (_foreign, "extra.safetensors is not one of its files"),
        (_missing, "ema.safetensors is missing"),
    ],
    ids=["truncated", "corrupt-json", "mixed", "foreign-file", "missing-file"],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, actor, damage, message):
    path = _save(actor, tmp_path / "ckpt")
    if damage == "mix":  # another state's optimizer file in this checkpoint
        other_actor = Actor(load_family(actor.config), actor.config)
        _mix(path, _save(other_actor, tmp_path / "other"))
    else:
        damage(path)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match=message):
        load_resume_state(actor, path)


def test_latest_skips_a_damaged_newest_checkpoint_and_keep_last_prunes(tmp_path, actor):
    out = tmp_path / "run"
    for step in (2, 4, 6):
        _save(actor, out / "checkpoints" / f"step_{step:05d}", step)
    _truncate(out / "checkpoints" / "step_00006")
    (out / "checkpoints" / ".tmp-step_00008-123").mkdir()  # a write cut short: never a candidate
    path, skipped = latest_checkpoint(out)
    assert path == out / "checkpoints" / "step_00004"
    assert len(skipped) == 1 and "step_00006" in skipped[0]
    # keep_last counts good checkpoints up to the step just written: the damaged newer one is
    # neither counted nor removed, and the one resumed from stays
    removed = prune_checkpoints(out, keep_last=1, step=4)
    assert [p.name for p in removed] == ["step_00002"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        ".tmp-step_00008-123",
        "step_00004",
        "step_00006",
    ]


def test_latest_takes_best_only_where_it_is_the_newest(tmp_path, actor):
    """``checkpoints/best`` (train.keep_best) is a complete checkpoint of its iteration: resumed
    from when it is newer than every step checkpoint, never over a step or final one of its own
    iteration (whatever order the folder lists them in)."""
    out = tmp_path / "run"
    _save(actor, out / "checkpoints" / "best", 4)
    _save(actor, out / "checkpoints" / "step_00004", 4)
    assert latest_checkpoint(out)[0] == out / "checkpoints" / "step_00004"
    shutil.rmtree(out / "checkpoints" / "best")
    _save(actor, out / "checkpoints" / "best", 6)  # the best moved after the last step checkpoint
    assert latest_checkpoint(out)[0] == out / "checkpoints" / "best"
    _save(actor, out / "checkpoints" / "final", 6)
    assert latest_checkpoint(out)[0] == out / "checkpoints" / "final"


def test_a_run_folder_given_for_a_checkpoint_names_its_best_too(tmp_path, actor):
    out = tmp_path / "run"
    (out / "metrics.jsonl").parent.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("")
    _save(actor, out / "checkpoints" / "step_00004", 4)
    assert run_folder_hint(out).endswith(f"did you mean {str(out / 'checkpoints' / 'step_00004')!r}?")
    _save(actor, out / "checkpoints" / "best", 2)
    assert run_folder_hint(out).endswith(
        f"did you mean {str(out / 'checkpoints' / 'step_00004')!r} "
        f"(or its best, {str(out / 'checkpoints' / 'best')!r})?"
    )


def test_a_checkpoint_killed_while_being_replaced_is_moved_back(tmp_path, actor):
    out = tmp_path / "run"
    good = _save(actor, out / "checkpoints" / "final", iteration=4)
    good.rename(out / "checkpoints" / ".tmp-final-77-old")  # moved aside; its successor never arrived
    (out / "checkpoints" / ".tmp-final-77").mkdir()
    remove_partial_writes(out)
    assert verify_checkpoint(out / "checkpoints" / "final")["iteration"] == 4
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["final"]


def test_a_manifest_without_the_weights_is_refused(tmp_path, actor):
    path = _save(actor, tmp_path / "ckpt")
    info = json.loads((path / "checkpoint.json").read_text())
    del info["files"]["trainable.safetensors"]
    (path / "trainable.safetensors").unlink()
    (path / "checkpoint.json").write_text(json.dumps(seal(info)))  # as if written so
    with pytest.raises(CheckpointError, match="does not list trainable.safetensors"):
        verify_checkpoint(path)


def test_rewriting_a_checkpoint_replaces_it_whole(tmp_path, actor):
    path = _save(actor, tmp_path / "ckpt", iteration=2)
    (path / "stale.txt").write_text("from an earlier write")
    _save(actor, path, iteration=3)
    assert verify_checkpoint(path)["iteration"] == 3
    assert not (path / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary folder left


def test_a_manifest_with_a_garbled_field_is_refused(tmp_path, actor):
    path = _save(actor, tmp_path / "ckpt")
    info = json.loads((path / "checkpoint.json").read_text())
    info["iteration"] = "two"
    (path / "checkpoint.json").write_text(json.dumps(seal(info)))
    with pytest.raises(CheckpointError, match="lacks or garbles iteration"):
        verify_checkpoint(path)


def test_weights_of_another_shape_are_refused_naming_the_tensor(tmp_path, actor):
    path = _save(actor, tmp_path / "ckpt")
    cfg = load_config({"model": {"path": "random", "lora": {"rank": 3}}})
    other = Actor(load_family(cfg), cfg)
    with pytest.raises(
        CheckpointError, match=r"do not fit this model: .*lora_A.weight is \(2, .*\) in the checkpoint"
    ):
        load_resume_state(other, path)


def test_lora_checkpoint_roundtrip_and_family_check(tmp_path):
    cfg = load_config({"model": {"path": "random", "lora": {"rank": 4}}, "train": {"ema_decay": 0.9}})
    family = load_family(cfg)
    actor = Actor(family, cfg)
    names = [n for n, p in family.transformer.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    with torch.no_grad():  # make the adapter do something, and give the optimizer a state
        for p in actor.params:
            p.add_(0.01 * torch.randn_like(p))
    actor.params[0].grad = torch.ones_like(actor.params[0])
    actor.optimizer.step()
    want = _velocity(family)
    ckpt = save_checkpoint(tmp_path / "ckpt", actor, cfg, iteration=1)

    fresh = load_family(cfg)
    apply_lora(fresh, cfg.model.lora)
    load_weights_into(fresh, ckpt, use_ema=False)
    torch.testing.assert_close(_velocity(fresh), want)

    actor2 = Actor(load_family(cfg), cfg)
    load_optimizer_state(actor2, ckpt)
    s1, s2 = actor.optimizer.state_dict()["state"][0], actor2.optimizer.state_dict()["state"][0]
    torch.testing.assert_close(s1["exp_avg"], s2["exp_avg"])

    other = OtherFamily.load("random", torch.device("cpu"), torch.float32, OtherDescription.Options())
    with pytest.raises(FamilyMismatchError, match="trained on the 'tiny' family, not 'other'"):
        load_weights_into(other, ckpt)


def test_a_full_disk_is_recognised_in_each_form_safetensors_reports_it():
    """safetensors carries the OS error in its message, as Rust's Debug (``Os { code: 28, ...``) or
    Display (``... (os error 28)``) form; a wrapper raised from one is recognised through its cause;
    an error that only mentions a number is not a full disk (issue 53, class 2)."""
    import errno

    from safetensors import SafetensorError

    from diffrl.train.checkpoint import storage_errno

    debug = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "x" })')
    display = SafetensorError("Error while serializing: No space left on device (os error 28)")
    assert storage_errno(debug) == storage_errno(display) == errno.ENOSPC
    try:
        try:
            raise display
        except SafetensorError as e:
            raise RuntimeError("the rank's save failed") from e
    except RuntimeError as wrapped:
        assert storage_errno(wrapped) == errno.ENOSPC
    assert storage_errno(SafetensorError("header too large (os error 9999)")) is None
    assert storage_errno(ValueError("No space left on device (os error 28)")) is None
