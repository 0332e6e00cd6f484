"""Python pickle read safely: the restricted unpickler of the peers' pickled reward bodies.

verl-omni's HTTP scorer and flow_grpo's reward servers (:mod:`diffrl.transport.protocols` cites
them) send and answer ``pickle.dumps`` of plain dicts. Plain ``pickle.loads`` of such a body runs
whatever its sender put in it: any importable callable, with any arguments (a ``__reduce__``
returning ``(os.system, ("...",))``). :func:`loads` reads one instead, as the pickle docs'
"Restricting Globals" recipe does, in three steps, each bounded:

1. the opcodes are counted before anything is built (:func:`pickletools.genops`; at most
   :data:`MAX_PICKLE_OPS`): a pickle builds at most one object per opcode, and 64 MB of ``]``
   would otherwise be 64 M empty lists (3.5 GB);
2. the C unpickler runs with :meth:`_Unpickler.find_class` answering only :data:`ALLOWED`:
   builtins come from opcodes and need no global; the globals allowed are the ones NumPy's arrays
   and scalars pickle as (``numpy[._]core.multiarray._reconstruct`` and ``scalar``,
   ``numpy[._]core.numeric._frombuffer`` for protocol 5, ``numpy.dtype``, ``numpy.ndarray``) and
   ``_codecs.encode`` (protocol 2's bytes), each wrapped so that what it is given cannot allocate
   more than the body carries, build an object array (NumPy's own ``__setstate__`` crashes the
   process on a list that does not fill its shape) or change NumPy's process-wide dtypes (the
   wrappers take only the arguments and states NumPy itself writes). Any other global is refused
   by its name (``posix.system``,
   ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2``) before it is imported; so
   are persistent ids and out-of-band buffers;
3. the result is walked once (at most :data:`MAX_PICKLE_VALUES` values, arrays counted by their
   items, and :data:`MAX_PICKLE_DEPTH` levels, so a value shared a billion times or a list holding
   itself costs nothing) into plain Python: ``dict``, ``list`` (tuples too), ``str``, ``bytes``,
   ``int``, ``float``, ``bool``, ``None``; a NumPy array of numbers, bools, strings or bytes
   becomes lists of them, a NumPy scalar its Python value. Anything else (a set, an array of
   objects, a complex number) is refused.

Every refusal is a :class:`PickleRefused` with an HTTP status (413 past a bound, 400 else) and a
detail that names what was refused. Writing is :func:`dumps`: plain values only, so the bytes name
no global at all.
"""

from __future__ import annotations

import _compat_pickle  # the stdlib's table of Python 2 names, which pickle's own find_class uses
import io
import math
import pickle
import pickletools
from typing import Any

import numpy as np

try:
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
    from numpy._core.multiarray import scalar as _np_scalar
    from numpy._core.numeric import _frombuffer as _np_frombuffer
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct as _np_reconstruct
    from numpy.core.multiarray import scalar as _np_scalar
    from numpy.core.numeric import _frombuffer as _np_frombuffer

MAX_PICKLE_OPS = 2**20
"""Opcodes one pickle may hold, counted before it is unpickled (as ``MAX_JSON_ITEMS`` bounds JSON)."""
MAX_PICKLE_VALUES = 2**18
"""Values one unpickled body may hold (a container, a string, a number: one each; an array: its
items), counted as visited: a walk of that many takes about a second of Python, and a peer's body
(B images, prompts, a metadata map each) holds a few per image."""
MAX_PICKLE_DEPTH = 40
"""Containers nested in one body at most: a sample's metadata may nest 32 (the server's
``MAX_METADATA_DEPTH``) inside the body's dict and list."""
WRITE_PROTOCOL = 4
"""The pickle protocol :func:`dumps` writes: Python 3.8+'s default, which every peer reads."""
PLAIN = (
    "containers (dict, list, tuple), str, bytes, int, float, bool, None, and NumPy arrays and "
    "scalars of numbers, bools, strings or bytes"
)
NUMPY_KINDS = "biufUS"
"""NumPy dtype kinds read: bool, signed and unsigned int, float, str, bytes."""


class PickleRefused(Exception):
    """A pickle :func:`loads` does not read: ``status`` (400, or 413 past a bound) and ``detail``."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _bad(detail: str) -> PickleRefused:
    return PickleRefused(400, f"it {detail}")


class _Dtype:
    """What ``numpy.dtype`` names in a pickle: a plain dtype (:data:`NUMPY_KINDS`, no fields) from
    its spec string, copied. Its ``__setstate__`` (``BUILD``) takes a byte order only: NumPy's own
    can give any dtype object fields (an array of them, unpickled from a list that does not match
    its shape, crashes the process), and without the copy ``np.dtype('f8')`` is the process-wide
    float64 that ``BUILD`` would change."""

    dtype: np.dtype | None = None  # None: made without __init__ (NEWOBJ), refused where used

    def __init__(self, spec: Any, align: Any = False, copy: Any = True):
        try:
            dtype = np.dtype(spec) if isinstance(spec, str) and len(spec) <= 16 else None
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in NUMPY_KINDS or dtype.fields is not None or dtype.subdtype:
            raise _bad(f"builds numpy.dtype({str(spec)[:40]!r}); only dtypes of kinds {NUMPY_KINDS} are read")
        self.dtype = dtype

    def __setstate__(self, state: Any) -> None:
        if self.dtype is None or not (
            isinstance(state, tuple) and len(state) >= 8 and state[1] in ("<", ">", "|", "=")
        ):
            raise _bad("sets a numpy.dtype's state to something NumPy does not write")
        if any(part is not None for part in state[2:5]):  # subarray, names, fields
            raise _bad("gives a numpy.dtype a subarray or fields")
        if state[5] not in (-1, self.dtype.itemsize):
            raise _bad(
                f"gives a numpy.dtype of {self.dtype.itemsize} bytes an item size of {str(state[5])[:20]}"
            )
        if state[1] != "|":
            self.dtype = self.dtype.newbyteorder(state[1])


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, _Dtype) or value.dtype is None:
        raise _bad("gives NumPy a dtype that is not a numpy.dtype")
    return value.dtype


def _shape(value: Any) -> tuple[int, ...]:
    if not (isinstance(value, tuple) and len(value) <= 32 and all(type(s) is int and s >= 0 for s in value)):
        raise _bad(f"gives a NumPy array the shape {str(value)[:60]}")
    return value


class _Array(np.ndarray):
    """The array ``_reconstruct`` gives: its ``__setstate__`` (``BUILD``) checks that the data
    are bytes of exactly the shape's size in a :class:`_Dtype` before NumPy's own runs (which
    would read a list as the items of an object array)."""

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _bad("sets a NumPy array's state to something NumPy does not write")
        version, shape, dtype, fortran, data = state
        dtype, shape = _dtype(dtype), _shape(shape)
        if not isinstance(data, bytes | bytearray) or len(data) != math.prod(shape) * dtype.itemsize:
            size = len(data) if isinstance(data, bytes | bytearray) else type(data).__name__
            raise _bad(f"gives a NumPy array of shape {shape} and dtype {dtype} the data {size}")
        super().__setstate__((version, shape, dtype, bool(fortran), data))


class _NdarrayName:
    """What ``numpy.ndarray`` names in a pickle: the subtype argument of ``_reconstruct`` only.
    Called (``REDUCE``) or instantiated (``NEWOBJ``) itself it refuses: ``ndarray(shape)`` would
    allocate whatever shape the sender chose."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _bad("builds a numpy.ndarray other than as NumPy pickles one")


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """NumPy's ``_reconstruct``, as ``ndarray.__reduce__`` calls it: ``(ndarray, (0,), b'b')``, an
    empty array whose ``__setstate__`` then takes the shape, dtype and data (:class:`_Array`). Any
    other shape would allocate before that check."""
    if subtype is not _NdarrayName:
        raise _bad("reconstructs an array of a type other than numpy.ndarray")
    if math.prod(_shape(shape)) != 0:
        raise _bad(f"reconstructs an array of shape {shape}, not an empty one")
    return _np_reconstruct(_Array, (0,), b"b")


def _scalar(dtype: Any, data: Any) -> np.generic:
    """NumPy's ``scalar``: one item of a :class:`_Dtype` from exactly its bytes."""
    dtype = _dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise _bad(f"gives a NumPy scalar of dtype {dtype} something other than its {dtype.itemsize} bytes")
    return _np_scalar(dtype, data)


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any, axis_order: Any = None) -> np.ndarray:
    """NumPy's protocol-5 ``_frombuffer``: the array views bytes the body carries, and
    ``reshape`` checks the shape against them."""
    dtype, shape = _dtype(dtype), _shape(shape)
    if not isinstance(buf, bytes | bytearray | pickle.PickleBuffer) or order not in ("C", "F", "A", "K"):
        raise _bad("rebuilds a NumPy array from something other than its bytes")
    if axis_order is not None and not (isinstance(axis_order, tuple) and len(axis_order) == len(shape)):
        raise _bad(f"gives a NumPy array the axis order {str(axis_order)[:60]}")
    return _np_frombuffer(buf, dtype, shape, order, axis_order)


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode(text, 'latin1')``: how protocol 2 writes bytes; no other codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _bad(f"calls _codecs.encode with codec {str(encoding)[:40]!r}")
    return text.encode("latin-1")


ALLOWED: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1,
    ("numpy", "dtype"): _Dtype,
    ("numpy", "ndarray"): _NdarrayName,
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.multiarray", "scalar"): _scalar for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _frombuffer for core in ("core", "_core")},
}
"""The globals a pickle may name -> what it gets. NumPy 1 pickles name ``numpy.core``, NumPy 2
``numpy._core``; each is looked up here, never imported."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # protocol 2 names Python 2's modules (``__builtin__``, ``commands`` for subprocess), as
        # pickle's own find_class maps them back
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = ALLOWED.get((module, name))
        if found is None:
            raise PickleRefused(
                400,
                f"it names {module[:80]}.{name[:80]}, which diffrl does not unpickle (a global outside "
                f"the allow-list could run code); a body may hold only {PLAIN}",
            )
        return found


def count_ops(data: bytes | bytearray, what: str, most: int = MAX_PICKLE_OPS) -> int:
    """The opcodes of the pickle ``data``, read without building anything; :class:`PickleRefused`
    413 past ``most``, 400 if it is no pickle (an unknown opcode, or no ``STOP``)."""
    ops = 0
    try:
        for _ in pickletools.genops(data):
            ops += 1
            if ops > most:
                raise PickleRefused(413, f"{what} holds over {most} pickle opcodes")
    except (ValueError, EOFError, UnicodeDecodeError) as e:
        raise PickleRefused(400, f"{what} is not a pickle ({type(e).__name__}: {str(e)[:200]})") from e
    return ops


def loads(
    data: bytes | bytearray,
    what: str = "the body",
    max_ops: int = MAX_PICKLE_OPS,
    max_values: int = MAX_PICKLE_VALUES,
) -> Any:
    """The pickle ``data`` as plain Python (module docstring), or :class:`PickleRefused` naming
    what it holds that diffrl does not read. ``what`` names ``data`` in messages. A
    ``MemoryError`` passes through (the server answers it 503)."""
    count_ops(data, what, max_ops)
    try:
        value = _Unpickler(io.BytesIO(data)).load()
    except PickleRefused as e:
        raise PickleRefused(e.status, f"{what} is refused: {e.detail}") from None
    except MemoryError:
        raise
    except Exception as e:  # UnpicklingError, a NumPy ValueError, a memo KeyError, ... on a broken body
        raise PickleRefused(
            400, f"{what} is not a pickle diffrl reads ({type(e).__name__}: {str(e)[:200]})"
        ) from e
    return _Plain(what, max_values).of(value, 0)


class _Plain:
    """The walk of step 3 (module docstring): bounded by values visited, not objects, so a list
    that a pickle's memo repeats a billion times is refused after ``most`` visits."""

    def __init__(self, what: str, most: int):
        self.what, self.most, self.seen = what, most, 0

    def _count(self, n: int) -> None:
        self.seen += n
        if self.seen > self.most:
            raise PickleRefused(413, f"{self.what} holds over {self.most} values")

    def _refuse(self, what: str) -> PickleRefused:
        return PickleRefused(400, f"{self.what} holds {what}; a body may hold only {PLAIN}")

    def of(self, value: Any, depth: int) -> Any:
        self._count(1)
        kind = type(value)  # exact types: np.float64 is a float, np.str_ a str
        if kind in (str, bytes, int, float, bool) or value is None:
            return value
        if kind in (list, tuple, dict):
            if depth >= MAX_PICKLE_DEPTH:
                raise PickleRefused(
                    400, f"{self.what} nests deeper than {MAX_PICKLE_DEPTH} levels (or holds itself)"
                )
            if kind is not dict:
                return [self.of(v, depth + 1) for v in value]
            out = {}
            for k, v in value.items():
                key = self.of(k, depth + 1)
                if type(key) not in (str, int, float, bool, bytes) and key is not None:
                    raise self._refuse(f"a map key of type {type(k).__name__}")
                out[key] = self.of(v, depth + 1)
            return out
        if isinstance(value, np.generic | np.ndarray):
            if value.dtype.kind not in NUMPY_KINDS:
                what = "array" if isinstance(value, np.ndarray) else "scalar"
                raise self._refuse(f"a NumPy {what} of dtype {str(value.dtype)[:40]}")
            if isinstance(value, np.ndarray):
                self._count(value.size)
                return value.tolist()
            return value.item()
        if kind is bytearray:
            return bytes(value)
        name = "numpy.dtype" if isinstance(value, _Dtype) else kind.__name__[:40]
        raise self._refuse(f"a {name}")


def dumps(value: Any) -> bytes:
    """``value`` (plain: what :func:`loads` returns) as a pickle of :data:`WRITE_PROTOCOL`."""
    return pickle.dumps(value, protocol=WRITE_PROTOCOL)
