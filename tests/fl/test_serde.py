import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from plinth.fl import serde
from plinth.fl.messages import ErrorRes, EvaluateIns, EvaluateRes, FitIns, FitRes

DTYPES = ["<f4", "<f8", "<f2", "<i8", "<i4", "|u1", "|i1", "|b1", ">f4", ">i8"]


@settings(max_examples=60, deadline=None)
@given(st.lists(hnp.arrays(st.sampled_from(DTYPES).map(np.dtype),
                           hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
                max_size=5))
def test_arrays_round_trip_any_dtype_and_shape(arrays):
    back = serde.arrays_from_bytes(serde.arrays_to_bytes(arrays))
    assert len(back) == len(arrays)
    for a, b in zip(arrays, back):
        assert b.shape == a.shape
        assert b.dtype == a.dtype.newbyteorder("<") or a.dtype.itemsize == 1
        assert b.dtype.byteorder in "<|="
        np.testing.assert_array_equal(a, b)


def test_decode_is_zero_copy_and_aligned():
    buf = serde.encode(FitIns(3, [np.arange(100, dtype=np.float32), np.ones((3, 7))], {"a": 1}))
    msg = serde.decode(buf)
    raw = np.frombuffer(buf, np.uint8)
    for a in msg.parameters:
        assert np.shares_memory(a, raw)
        assert a.ctypes.data % serde.ALIGN == raw.ctypes.data % serde.ALIGN
    msg.parameters[0][0] = 42.0  # bytearray → writable views into the same buffer
    assert serde.decode(buf).parameters[0][0] == 42.0
    ro = serde.decode(bytes(buf)).parameters[0]
    assert not ro.flags.writeable


@pytest.mark.parametrize("msg", [
    FitIns(1, [np.zeros((2, 2), np.float32)], {"lr": 0.1, "name": "x", "flag": True}),
    FitRes(2, [np.arange(5, dtype=np.int64)], 17, {"loss": 0.5}, "q8", {"arrays": [{"lo": 1}]}),
    EvaluateIns(4, [], {}),
    EvaluateRes(5, 0.25, 9, {"accuracy": 0.75}),
    ErrorRes(6, "ValueError: boom"),
])
def test_message_round_trip(msg):
    back = serde.decode(serde.encode(msg))
    assert type(back) is type(msg)
    for f in msg.__dataclass_fields__:
        a, b = getattr(msg, f), getattr(back, f)
        if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        else:
            assert a == b


def test_big_endian_input_travels_little_endian():
    a = np.arange(6, dtype=">f8").reshape(2, 3)
    b = serde.arrays_from_bytes(serde.arrays_to_bytes([a]))[0]
    assert b.dtype.str == "<f8"
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mutate, words", [
    (lambda b: b"XXXX" + b[4:], "bad magic"),
    (lambda b: b[:6], "shorter"),
    (lambda b: b[:40], "exceeds"),
    (lambda b: b[:-100], "outside"),
    (lambda b: b.replace(b'"<f4"', b'"|O8"'), "not allowed"),
    (lambda b: b.replace(b'"fit_ins"', b'"fit_xxx"'), "unknown kind"),
    (lambda b: b.replace(b'"round"', b'"rouse"'), "unknown fields"),
])
def test_corrupt_buffers_give_one_line_errors(mutate, words):
    good = bytes(serde.encode(FitIns(1, [np.zeros(100, np.float32)])))
    with pytest.raises(serde.SerdeError) as e:
        serde.decode(mutate(good))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_object_arrays_are_refused():
    with pytest.raises(serde.SerdeError, match="dtype"):
        serde.arrays_to_bytes([np.array(["a"], dtype=object)])


def test_decode_checks_expected_kind():
    buf = serde.encode(EvaluateRes(1, 0.0, 1))
    with pytest.raises(serde.SerdeError, match="expected fit_res"):
        serde.decode(buf, expect=FitRes)


def test_chunks_join_round_trip():
    buf = serde.encode(FitIns(1, [np.random.default_rng(0).random(10_000)]))
    pieces = list(serde.chunks(buf, 4096))
    assert max(len(p) for p in pieces) <= 4096
    assert serde.join(iter(pieces), len(buf)) == buf
    assert serde.join(iter(pieces)) == buf
    with pytest.raises(serde.SerdeError, match="announced"):
        serde.join(iter(pieces), len(buf) + 1)
