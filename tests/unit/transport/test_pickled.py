"""The restricted unpickler (:mod:`diffrl.transport.pickled`): what the peers' pickles hold is read
as plain values under every pickle protocol they may write; anything that names a global outside
the allow-list is refused by its name before it runs (the marker file proves it did not), and
NumPy's own globals cannot be made to allocate, crash or change the process; bodies are bounded in
opcodes, values and depth."""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import pickletools
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from diffrl.transport.pickled import (
    MAX_PICKLE_DEPTH,
    MAX_PICKLE_OPS,
    MAX_PICKLE_VALUES,
    PickleRefused,
    count_ops,
    dumps,
    loads,
)

PROTOCOLS = [2, 3, 4, 5]


def refused(data: bytes, **bounds) -> PickleRefused:
    with pytest.raises(PickleRefused) as e:
        loads(data, "the body", **bounds)
    return e.value


# -- what peers send is read -------------------------------------------------------------------------


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_the_peers_bodies_read_as_plain_values(proto):
    body = {
        "images": [b"\xff\xd8\xff\xe0jpeg", b"\x89PNG"],
        # flow_grpo's UnifiedReward client: np.array_split of the prompts; GenEval's: of the metadata
        "prompts": np.array_split(np.array(["a cat", "a dog", "b"]), 1)[0],
        "meta_datas": list(np.array_split(np.array([{"tag": "counting"}], dtype=object), 1)[0]),
        "only_strict": True,
        "metadata": {},
        "scores": [np.float32(0.5), np.float64(0.25), np.int64(3), np.bool_(True), 1.5, math.nan, None],
        "outputs": np.arange(6.0).reshape(2, 3).T,  # not C-contiguous: protocol 5 writes its axis order
        "big_endian": np.array([1, 2], dtype=">i4"),
        "pair": (1, "x"),
        "word": np.str_("hi"),
    }
    got = loads(pickle.dumps(body, protocol=proto))
    assert got["images"] == body["images"] and got["prompts"] == ["a cat", "a dog", "b"]
    assert got["meta_datas"] == [{"tag": "counting"}] and got["only_strict"] is True and got["metadata"] == {}
    assert got["scores"][:6] == [0.5, 0.25, 3, True, 1.5, got["scores"][5]] and math.isnan(got["scores"][5])
    assert [type(s) for s in got["scores"][:4]] == [float, float, int, bool] and got["scores"][6] is None
    assert got["outputs"] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]] and got["big_endian"] == [1, 2]
    assert got["pair"] == [1, "x"] and got["word"] == "hi" and type(got["word"]) is str


def test_what_diffrl_writes_names_no_global_and_reads_back():
    body = {"images": [b"\xff\xd8"], "prompts": ["a"], "metadata": {"meta_datas": [{"k": [1, 2.5]}]}}
    data = dumps(body)
    assert not [op for op, _, _ in pickletools.genops(data) if "GLOBAL" in op.name or op.name == "REDUCE"]
    assert loads(data) == body == pickle.loads(data)


# -- code never runs ---------------------------------------------------------------------------------


class Reduces:
    """Unpickling this calls ``fn(*args)``: the attack a pickled body carries."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


class Custom:
    """A plain class of the sender's: unpickling it imports this module and builds one."""


def hostile(marker: Path, proto: int) -> list[tuple[object, str]]:
    """(object, the global its pickle names) for attacks that would create ``marker``."""
    return [
        (Reduces(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        (Reduces(eval, f"open({str(marker)!r}, 'w')"), "builtins.eval"),
        (Reduces(subprocess.call, ["touch", str(marker)]), "subprocess.call"),
        # a method: protocol 4 names it by its dotted name, older ones through getattr
        (Reduces(Path.touch, marker), "pathlib.Path.touch" if proto >= 4 else "builtins.getattr"),
        (Reduces(__import__, "os"), "builtins.__import__"),
    ]


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_a_reduce_that_runs_code_is_refused_by_name_and_does_not_run(proto, tmp_path):
    marker = tmp_path / "ran"
    for attack, name in hostile(marker, proto):
        e = refused(pickle.dumps({"images": [b"x"], "metadata": attack}, protocol=proto))
        assert e.status == 400 and f"it names {name}" in e.detail, e.detail
        assert "which diffrl does not unpickle" in e.detail
    assert not marker.exists()
    # the same pickles do run under plain pickle.loads: the test would see it (proto 4 only, once)
    if proto == 4:
        pickle.loads(pickle.dumps(Reduces(Path.touch, marker)))
        assert marker.exists()


@pytest.mark.parametrize(
    "value, name",
    [
        (collections.OrderedDict(a=1), "collections.OrderedDict"),
        (Custom(), f"{__name__}.Custom"),
        (torch.tensor([0.5]), "torch._utils._rebuild_tensor_v2"),
        ({1, 2}, None),  # protocol 4+: a set is an opcode, refused once built
        (np.array([1, "a"], dtype=object), "numpy.dtype('O8')"),
        (np.array([1 + 2j]), "numpy.dtype('c16')"),
        (np.dtype("float64"), "numpy.dtype"),
    ],
    ids=["OrderedDict", "custom-class", "torch-tensor", "set", "object-array", "complex", "a-dtype"],
)
def test_anything_outside_the_allow_list_is_refused(value, name):
    for proto in PROTOCOLS:
        e = refused(pickle.dumps({"x": value}, protocol=proto))
        shown = name or ("a set" if proto >= 4 else "builtins.set")
        assert e.status == 400 and shown in e.detail, e.detail


# -- NumPy's globals, abused -------------------------------------------------------------------------


class Pickled:
    """Pickles as ``fn(*args)``, then ``BUILD`` with ``state``: NumPy's own pickle, hand-made."""

    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy._core.multiarray._reconstruct


def test_numpy_globals_cannot_allocate_what_the_body_does_not_carry():
    huge = (10**12,)
    cases = {
        # ndarray(shape) itself (REDUCE), or by NEWOBJ: would allocate 8 TB
        "ndarray-call": pickle.dumps(Pickled(np.ndarray, (huge,))),
        # _reconstruct of a non-empty shape allocates before any data is checked
        "reconstruct-shape": pickle.dumps(Pickled(RECONSTRUCT, (np.ndarray, huge, b"b"))),
        # a shape that the data does not fill
        "short-data": pickle.dumps(
            Pickled(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, huge, np.dtype("f8"), False, b"\0" * 8))
        ),
        # a list as the data: NumPy reads it as an object array's items (a mismatched one crashes it)
        "list-data": pickle.dumps(
            Pickled(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2,), np.dtype("f8"), False, [1.0, 2.0]))
        ),
        "object-dtype": pickle.dumps(
            Pickled(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, huge, np.dtype("O"), False, [1, 2]))
        ),
        "scalar-short": pickle.dumps(Pickled(np.float64(0).__reduce__()[0], (np.dtype("f8"), b"\0"))),
        "codec": pickle.dumps(Pickled(__import__("_codecs").encode, ("x", "rot13"))),
    }
    for name, data in cases.items():
        e = refused(data)
        assert e.status == 400 and "it " in e.detail, (name, e.detail)
    newobj = b"\x80\x04\x8c\x05numpy\x8c\x07ndarray\x93J\x00\xe4\x0bT\x85\x85\x81."  # NEWOBJ ndarray((2e9,))
    assert "builds a numpy.ndarray other than as NumPy pickles one" in refused(newobj).detail


def test_a_dtype_state_cannot_add_object_fields_nor_change_numpys_float64():
    # NumPy's own dtype setstate takes fields (and flags that make them hold objects) on any dtype
    state = (3, ">", None, ("a",), {"a": (np.dtype("f8"), 0)}, 8, 1, 0x3F)
    e = refused(pickle.dumps(Pickled(np.dtype, ("f8", False, False), state)))
    assert "gives a numpy.dtype a subarray or fields" in e.detail
    swapped = pickle.dumps(
        {"x": Pickled(np.dtype, ("f8", False, False), (3, ">", None, None, None, -1, -1, 0))}
    )
    with pytest.raises(PickleRefused, match="holds a numpy.dtype"):
        loads(swapped)
    assert np.dtype("f8").byteorder == "=" and np.zeros(1).dtype.isnative  # the process's float64, unchanged


# -- bounds ------------------------------------------------------------------------------------------


def test_opcodes_are_counted_before_anything_is_built():
    empty_lists = b"\x80\x04" + b"]" * 1000 + b"."  # each "]" would be a 56-byte list
    e = refused(empty_lists, max_ops=999)
    assert e.status == 413 and "over 999 pickle opcodes" in e.detail
    assert count_ops(b"\x80\x04" + b"]" * 10 + b".", "x") == 12 and MAX_PICKLE_OPS == 2**20


def test_values_are_counted_as_visited_so_a_shared_list_costs_nothing():
    a = [None]
    for _ in range(30):  # 2**30 visits through the memo's shared references, from a 200-byte pickle
        a = [a, a]
    e = refused(pickle.dumps(a), max_values=10_000)
    assert e.status == 413 and "holds over 10000 values" in e.detail and MAX_PICKLE_VALUES == 2**18
    e = refused(pickle.dumps(np.zeros(2000, dtype=np.uint8)), max_values=1000)  # an array: its items
    assert e.status == 413 and "holds over 1000 values" in e.detail


def test_nesting_and_self_reference_are_bounded():
    deep = []
    for _ in range(MAX_PICKLE_DEPTH + 1):
        deep = [deep]
    assert "nests deeper than 40 levels" in refused(pickle.dumps(deep)).detail
    loop = []
    loop.append(loop)
    assert "nests deeper than 40 levels (or holds itself)" in refused(pickle.dumps(loop)).detail


@pytest.mark.parametrize(
    "data, message",
    [
        (b'{"scores": [1]}', "is not a pickle (ValueError: at position 0, opcode b'{' unknown)"),
        (pickle.dumps([1, 2])[:-1], "pickle exhausted before seeing STOP"),
        (
            pickle.dumps(pickle.PickleBuffer(bytearray(b"ab")), 5, buffer_callback=lambda b: False),
            "out-of-band data",
        ),
    ],
    ids=["json", "truncated", "out-of-band"],
)
def test_what_is_no_pickle_diffrl_reads_is_a_400(data, message):
    e = refused(data)
    assert e.status == 400 and message in e.detail, e.detail


def test_a_persistent_id_is_refused():
    class Persistent(pickle.Pickler):
        def persistent_id(self, obj):
            return "storage" if obj == "p" else None

    out = io.BytesIO()
    Persistent(out, 4).dump(["p"])
    assert "persistent" in refused(out.getvalue()).detail
