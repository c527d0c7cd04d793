"""The wire formats (cupycoll.wire): index codec round trips, sizes, paths bit-equal; values.

In-process and fast. Every codec path (numpy twin, numba loops, kernels compiled for the CPU)
must write the same bytes; decoding must give back the stream bit for bit. Values rounding is
checked against independent references: numpy's float16 cast, and for bfloat16 the nearest of
the two neighbouring bfloat16 numbers computed exactly with fractions (ties to even).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupycoll import wire
from cupycoll.errors import InvalidArgument, InvalidType
from cupycoll.wire import _index_codec as twin
from cupycoll.wire import _numba as loops

from ._gpu import no_device_reason

DENSITIES = (1e-4, 1e-3, 1e-2, 0.1, 0.3, 0.6, 1.0)


def _stream(rng, n, density, lo=0, dtype=np.int64):
    idx = np.flatnonzero(rng.random(n) < density).astype(np.int64) + lo
    return idx.astype(dtype)


def _cases():
    rng = np.random.default_rng(7)
    for d in DENSITIES:
        for dtype in (np.int32, np.int64):
            yield f"d{d}-{np.dtype(dtype).name}", _stream(rng, 20000, d, 0, dtype), 0, 20000
    yield "empty", np.zeros(0, np.int32), 0, 10
    yield "empty-int64", np.zeros(0, np.int64), 5, 5
    yield "single", np.array([7], np.int32), 0, 8
    yield "single-lo", np.array([7], np.int64), 7, 8
    yield "runs", np.concatenate([np.arange(100, 300), np.arange(1000, 1040),
                                  np.arange(5000, 9000, 3)]).astype(np.int32), 0, 10000
    yield "lo>0", _stream(rng, 5000, 0.02, 123456, np.int32), 123456, 128456
    yield "near-2^31", np.array([0, 2**31 - 3, 2**31 - 2, 2**31 - 1], np.int32), 0, 2**31
    top = 2**31 - 5000
    yield "near-2^31-dense", _stream(rng, 5000, 0.5, top, np.int32), top, 2**31
    yield "near-2^40", _stream(rng, 3000, 0.01, 2**40 - 1500, np.int64), 2**40 - 1500, 2**40 + 1500
    yield "2^40-sparse", np.array([3, 2**33, 2**40 - 1, 2**40, 2**40 + 7]), 0, 2**41
    yield "full-range", np.array([0, 1, 2**62, 2**63 - 2]), 0, 2**63 - 1
    yield "huge-gaps", np.arange(40, dtype=np.int64) * (2**57) + 11, 0, 2**63 - 1


CASES = list(_cases())
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("label,idx,lo,hi", CASES, ids=IDS)
def test_round_trip_bit_exact_every_path(label, idx, lo, hi):
    want = twin.encode(idx, lo, hi)
    assert want.dtype == np.uint8 and want.ndim == 1
    assert len(want) == wire.encoded_nbytes(idx, lo, hi) == twin.encoded_nbytes(idx, lo, hi) \
        == loops.encoded_nbytes(idx, lo, hi)
    np.testing.assert_array_equal(loops.encode(idx, lo, hi), want)
    np.testing.assert_array_equal(wire.encode_indices(idx, lo, hi), want)
    for dtype in (idx.dtype, np.int64):
        for decode in (twin.decode, loops.decode, wire.decode_indices):
            got = decode(want, dtype)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, idx)


@pytest.mark.parametrize("label,idx,lo,hi", CASES[:6], ids=IDS[:6])
def test_decode_from_an_unaligned_slice_with_trailing_bytes(label, idx, lo, hi):
    enc = twin.encode(idx, lo, hi)
    big = np.full(len(enc) + 20, 0xAB, np.uint8)
    big[3:3 + len(enc)] = enc
    for decode in (twin.decode, loops.decode):
        np.testing.assert_array_equal(decode(big[3:], idx.dtype), idx)  # self-delimiting
        np.testing.assert_array_equal(decode(big[3:3 + len(enc)], idx.dtype), idx)


def test_bit_lengths_match_pythons_int_bit_length():
    """Every width class 0..64, its edges (2**k - 1, 2**k) and random values of every length."""
    edges = [v for k in range(65) for v in (2 ** k - 1, 2 ** k) if v < 2 ** 64]
    rng = np.random.default_rng(3)
    shifted = rng.integers(0, 2 ** 63, 2000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    drawn = shifted >> rng.integers(0, 64, 2000).astype(np.uint64)
    x = np.concatenate([np.array(edges, np.uint64), drawn])
    assert twin.bit_lengths(x).tolist() == [int(v).bit_length() for v in x]


def test_size_at_one_percent_and_format_choice(capsys):
    rng = np.random.default_rng(8)
    n = 1 << 22
    idx = _stream(rng, n, 0.01, 0, np.int32)
    size = wire.encoded_nbytes(idx, 0, n)
    per_index = size / idx.size
    assert size <= idx.nbytes
    assert 1.0 <= per_index <= 1.3, per_index
    enc = wire.encode_indices(idx, 0, n)
    assert enc[0] == twin.DELTA and len(enc) == size
    with capsys.disabled():
        print(f"\n1% uniform, n=2^22: {per_index:.3f} bytes/index, {size / idx.nbytes:.3f}x int32")
    for density in (0.3, 0.5, 0.8):  # dense: the bitmap (<= 1/8 byte per position)
        dense = _stream(rng, 1 << 16, density)
        enc = wire.encode_indices(dense, 0, 1 << 16)
        assert enc[0] == twin.BITMAP, density
        assert len(enc) <= (1 << 16) // 8 + 16
    runs = np.arange(1000, 100000, dtype=np.int64)  # consecutive: 0-bit blocks beat the bitmap
    assert wire.encode_indices(runs, 0, 10**6)[0] == twin.DELTA
    assert wire.encoded_nbytes(runs, 0, 10**6) < runs.size // 30


def test_every_density_is_smaller_than_raw():
    rng = np.random.default_rng(9)
    for d in DENSITIES:
        for dtype in (np.int32, np.int64):
            idx = _stream(rng, 1 << 16, d, 0, dtype)
            assert wire.encoded_nbytes(idx, 0, 1 << 16) <= idx.nbytes, (d, dtype)


@pytest.mark.parametrize("n", [2**50, 2**56, 2**60, 2**62 - 1])
def test_the_model_prices_indices_spread_over_any_n(n):
    """``auto`` prices a compact block of a few indices over a huge n: the model's sample span
    stops at 2^62 (int64 draws beyond 2^63 raised numpy's ValueError on every rank), and its
    price still grows with the gap and stays within the raw indices' bytes plus a header."""
    from cupycoll.wire._model import expected_index_nbytes

    sparse = expected_index_nbytes(700, n, 8)
    assert expected_index_nbytes(700, 2**40, 8) <= sparse <= 700 * 8 + 64


def test_numpy_path_choice(monkeypatch):
    """numba loops for large host streams, numpy for small ones or with CUPYCOLL_NUMBA=off."""
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert wire.fast(1 << 20) is loops and wire.fast(10) is None
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    assert wire.fast(1 << 20) is None


@settings(max_examples=200, deadline=None, database=None)  # (no .hypothesis/ in the tree)
@given(values=st.sets(st.integers(0, 2**41), max_size=300), lo=st.integers(0, 50),
       pad=st.integers(1, 2**20), int32=st.booleans())
def test_round_trip_property(values, lo, pad, int32):
    idx = np.array(sorted(v + lo for v in values), np.int64)
    if int32:
        idx = idx[idx < 2**31].astype(np.int32)
    hi = (int(idx[-1]) if idx.size else lo) + pad
    enc = twin.encode(idx, lo, hi)
    assert len(enc) == twin.encoded_nbytes(idx, lo, hi) == loops.encoded_nbytes(idx, lo, hi)
    np.testing.assert_array_equal(loops.encode(idx, lo, hi), enc)
    np.testing.assert_array_equal(twin.decode(enc, idx.dtype), idx)
    np.testing.assert_array_equal(loops.decode(enc, idx.dtype), idx)


#: non-increasing int64 streams with ends inside [0, 2**63 - 1) whose steps overflow int64
FAR_APART = ([2**62, -2**62 - 1, -1, 2**62 + 5], [2**62, -2**62 - 1, -1, 2**62 + 2**61])


@pytest.mark.parametrize("encode", [twin.encode, loops.encode, wire.encode_indices,
                                    twin.encoded_nbytes, loops.encoded_nbytes])
def test_bad_streams_raise(encode):
    with pytest.raises(InvalidArgument,
                       match=r"strictly increasing \(got 'idx\[2\] = 3 after idx\[1\] = 3'\)"):
        encode(np.array([1, 3, 3, 9]), 0, 10)
    with pytest.raises(InvalidArgument, match=r"idx\[1\] = 2 after idx\[0\] = 5"):
        encode(np.array([5, 2]), 0, 10)
    for far_apart in FAR_APART:  # a signed step between them overflows int64
        with pytest.raises(InvalidArgument, match="strictly increasing"):
            encode(np.array(far_apart, np.int64), 0, 2**63 - 1)
    with pytest.raises(InvalidArgument, match=r"\[lo, hi\)"):
        encode(np.array([1, 3]), 2, 10)
    with pytest.raises(InvalidArgument, match=r"\[lo, hi\)"):
        encode(np.array([1, 10]), 0, 10)
    with pytest.raises(InvalidType):
        encode(np.array([1.0, 2.0]), 0, 10)
    with pytest.raises(InvalidArgument):
        encode(np.array([1, 2]), -1, 10)


@pytest.mark.parametrize("decode", [twin.decode, loops.decode, wire.decode_indices])
def test_bad_buffers_raise(decode):
    enc = twin.encode(np.arange(0, 3000, 7), 0, 3000)
    with pytest.raises(InvalidArgument, match="truncated"):
        decode(enc[:-1])
    with pytest.raises(InvalidArgument, match="format tag"):
        decode(np.zeros(8, np.uint8))
    with pytest.raises(InvalidType):
        decode(enc.view(np.int8))
    with pytest.raises(InvalidArgument, match="int32"):
        decode(twin.encode(np.array([2**31]), 0, 2**32), np.int32)
    # a D stream (tag 'D', 2 indices, first 2^63 - 2) whose one 63-bit gap passes 2^63
    past = np.array([0x44, 0x02, 0xFE] + [0xFF] * 7 + [0x7F, 63] + [0xFF] * 8, np.uint8)
    with pytest.raises(InvalidArgument, match="pass 2\\^63"):
        decode(past)
    for header in CORRUPT_HEADERS:
        with pytest.raises(InvalidArgument, match="truncated|corrupt encoded index header"):
            decode(np.array(header, np.uint8))


def _varint(value: int) -> list[int]:
    out = []
    while True:
        out.append(value & 0x7F | (0x80 if value >= 0x80 else 0))
        value >>= 7
        if not out[-1] & 0x80:
            return out


#: headers no encoder writes: a first index or span past 2^63, a count a stream or a bitmap
#: cannot hold (each decoder refuses them before allocating the count's output)
CORRUPT_HEADERS = [
    [0x44] + _varint(1) + _varint(2**63),
    [0x44] + _varint(1) + _varint(2**64),
    [0x42] + _varint(2) + _varint(2**63) + _varint(1) + [3],
    [0x42] + _varint(2) + _varint(0) + _varint(2**64) + [3],
    [0x44] + _varint(2**40) + _varint(0) + [0] * 40,
    [0x42] + _varint(2**40) + _varint(0) + _varint(7) + [255],
]


# ---------------------------------------------------------------------------- values
def _bf16_all_positive() -> np.ndarray:
    """Every finite non-negative bfloat16 value (bits 0..0x7f7f, in value order) as float64."""
    return (np.arange(0x7F80, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


_BF16 = _bf16_all_positive()


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """RNE to bfloat16 bits, independently: the exact nearest neighbour, ties to even bits."""
    out = np.empty(x.size, np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        wide = x.astype(np.float64).ravel()
    for k, v in enumerate(wide):
        sign = 0x8000 if np.signbit(v) else 0
        if np.isnan(v):
            out[k] = 0x7FC0  # any NaN: compared as NaN below
            continue
        a = abs(v)
        i = int(np.searchsorted(_BF16, a, side="right")) - 1  # _BF16[i] <= a
        if np.isinf(a):
            out[k] = sign | 0x7F80
            continue
        below = Fraction(float(_BF16[i]))
        above = Fraction(2) ** 128 if i + 1 == _BF16.size else Fraction(float(_BF16[i + 1]))
        exact = Fraction(float(a))
        if exact == below:
            bits = i
        else:
            d_lo, d_hi = exact - below, above - exact
            bits = i if d_lo < d_hi or (d_lo == d_hi and i % 2 == 0) else i + 1
        out[k] = sign | bits  # i + 1 == 0x7f80 is inf
    return out.reshape(x.shape)


def _special_values(dtype) -> np.ndarray:
    f32 = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000,
                    0x7F7F7FFF, 0x00008000, 0x00018000, 0x00000001, 0x807FFFFF, 0x80000000,
                    0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA00000, 0x00800000, 0x0000FFFF],
                   np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        f32 = f32.astype(dtype)
    x = np.concatenate([f32, np.array([65504, 65520, 65519.99, 1e-8, 6e-8, -3e-8,
                                                     2.0**-24 * 1.5, 2.0**-25], dtype)])
    if dtype == np.float64:  # ties and near-ties that only float64 can hold; overflow
        one = 1 + 2.0**-8
        x = np.concatenate([x, [one, one + 2.0**-40, one - 2.0**-40, 1 + 3 * 2.0**-8,
                                3.3961e38, 3.39617e38, 1e300, -1e300, 1e-300, -1e-45,
                                2.0**-134, 2.0**-134 * (1 + 2.0**-30), 2.0**-133 * 1.5,
                                # float16 ties and near-ties, normal and subnormal
                                1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-40, 1 + 3 * 2.0**-11,
                                1 + 2.0**-11 - 2.0**-45, 2.0**-25, 3 * 2.0**-25,
                                2.0**-25 + 2.0**-60, 65520 - 2.0**-30, 65520.0]])
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bfloat16_rounds_to_nearest_even(dtype):
    rng = np.random.default_rng(10)
    x = np.concatenate([_special_values(dtype), (rng.standard_normal(3000) *
                        np.exp2(rng.integers(-140, 128, 3000))).astype(dtype)])
    with np.errstate(over="ignore"):
        payload, rounded = wire.round_values(x, "bfloat16")
    assert payload.dtype == np.uint16 and payload.shape == x.shape
    assert rounded.dtype == dtype
    want = _bf16_reference(x)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(rounded), nan)
    np.testing.assert_array_equal(payload[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(rounded), np.signbit(x))
    wide = wire.widen_values(payload, "bfloat16", dtype)
    np.testing.assert_array_equal(wide.view(f"u{wide.itemsize}"), rounded.view(f"u{wide.itemsize}"))
    assert np.isinf(rounded[np.isinf(x)]).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float16_matches_numpy(dtype):
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        x = np.concatenate([_special_values(dtype) if dtype != np.float16 else np.zeros(0, dtype),
                            (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 20, 3000)))
                            .astype(dtype)])
    with np.errstate(over="ignore"):
        payload, rounded = wire.round_values(x.reshape(-1, 1), "float16")
        want = x.astype(np.float16).reshape(-1, 1)
    assert payload.shape == (x.size, 1) and payload.dtype == np.uint16
    nan = np.isnan(want)
    np.testing.assert_array_equal(payload[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(rounded[nan]).all()
    assert rounded.dtype == (np.float64 if dtype == np.float64 else np.float32)
    np.testing.assert_array_equal(rounded[~nan], want[~nan].astype(rounded.dtype))


def test_bfloat16_of_float16_is_exact_rounding():
    x = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16)  # every finite float16 >= 0
    payload, rounded = wire.round_values(x, "bfloat16")
    np.testing.assert_array_equal(payload, _bf16_reference(x.astype(np.float32)))
    assert rounded.dtype == np.float32


def test_a_value_that_travels_as_inf_keeps_no_error_feedback():
    """1e5 and -7e4 travel as +-inf in float16 (IEEE rounding): their error is 0 (the update is
    inf there and a residual that kept them sent them again at every step), not value - inf;
    an infinite value travels as itself: error 0, not NaN (an Ok-Topk owner's or gTopk root's
    sum made infinite by a sender's overflow left NaN in that rank's residual for good)."""
    from cupycoll.wire._values import rounding_error

    x = np.array([1e5, -7e4, 1.5, 65504.0, np.inf], np.float32)
    _, rounded = wire.round_values(x, "float16")
    assert np.isinf(rounded[:2]).all() and rounded[3] == 65504.0
    error = rounding_error(x, rounded)
    np.testing.assert_array_equal(error, [0.0, 0.0, 0.0, 0.0, 0.0])
    assert rounding_error(-x[4:], -rounded[4:])[0] == 0.0


def test_values_bad_arguments():
    with pytest.raises(InvalidArgument):
        wire.round_values(np.ones(3, np.float32), "int8")
    with pytest.raises(InvalidType):
        wire.round_values(np.ones(3, np.int32), "bfloat16")
    with pytest.raises(InvalidType):
        wire.widen_values(np.ones(3, np.int16), "float16")
    with pytest.raises(InvalidType):
        wire.widen_values(np.ones(3, np.uint16), "float16", np.float16)


# ---------------------------------------------------------------------------- kernels
@pytest.fixture(scope="module")
def shim_codec():
    """The codec of kernels/wire.cu compiled for the CPU (cached g++ build), on numpy arrays."""
    from cupycoll.testing import kernel_shim
    from cupycoll.wire._cupy import WireKernels

    if kernel_shim.compiler() is None:
        pytest.fail("the kernel tests need a C++17 compiler (g++) on PATH")
    return WireKernels(kernel_shim.ShimLauncher(kernel_shim.kernel_libraries()))


def test_kernels_on_cpu_refuse_corrupt_headers(shim_codec):
    for header in CORRUPT_HEADERS:
        with pytest.raises(InvalidArgument, match="truncated|corrupt encoded index header"):
            shim_codec.decode(np.array(header, np.uint8), np.int64)


@pytest.mark.parametrize("label,idx,lo,hi", CASES, ids=IDS)
def test_kernels_on_cpu_equal_the_twin(shim_codec, label, idx, lo, hi):
    want = twin.encode(idx, lo, hi)
    np.testing.assert_array_equal(shim_codec.encode(idx, lo, hi), want)
    big = np.zeros(len(want) + 13, np.uint8)
    big[5:5 + len(want)] = want  # an unaligned view with trailing bytes
    for dtype in (idx.dtype, np.int64):
        got = shim_codec.decode(big[5:], dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, idx)


def test_kernels_reject_like_the_twin(shim_codec):
    with pytest.raises(InvalidArgument, match=r"idx\[2\] = 3 after idx\[1\] = 3"):
        shim_codec.encode(np.array([1, 3, 3, 9]), 0, 10)
    with pytest.raises(InvalidArgument, match=r"\[lo, hi\)"):
        shim_codec.encode(np.array([1, 10]), 0, 10)
    for far_apart in FAR_APART:
        with pytest.raises(InvalidArgument, match="strictly increasing"):
            shim_codec.encode(np.array(far_apart, np.int64), 0, 2**63 - 1)
    with pytest.raises(InvalidArgument, match="format tag"):
        shim_codec.decode(np.zeros(8, np.uint8))


def test_device_path_syncs_once_per_call():
    """On the sync-counting stand-in for CuPy (kernels on the CPU): encode reads one small array
    (the size must be known), decode reads the header; the values never leave the device."""
    from cupycoll.testing.sync_counting import xp
    from cupycoll.testing.syncs import count_host_syncs

    rng = np.random.default_rng(12)
    for density in (0.01, 0.5):
        idx = _stream(rng, 30000, density, 0, np.int32)
        dev = xp.asarray(idx)
        with count_host_syncs() as enc_syncs:
            enc = wire.encode_indices(dev, 0, 30000)
        with count_host_syncs() as dec_syncs:
            out = wire.decode_indices(enc, np.int32)
        assert enc_syncs.total == 1 and dec_syncs.total == 1, (enc_syncs, dec_syncs)
        assert type(enc) is type(dev) and type(out) is type(dev)
        np.testing.assert_array_equal(np.asarray(enc), twin.encode(idx, 0, 30000))
        np.testing.assert_array_equal(np.asarray(out), idx)
        payload, rounded = wire.round_values(xp.asarray(rng.standard_normal(50, np.float32)),
                                             "bfloat16")
        assert type(payload) is type(dev) and payload.dtype == np.uint16


@pytest.mark.gpu
@pytest.mark.parametrize("label,idx,lo,hi", CASES, ids=IDS)
def test_gpu_parity(label, idx, lo, hi):
    reason = no_device_reason()  # skip only when no CUDA device exists
    if reason is not None:
        pytest.skip(reason)
    import cupy

    want = twin.encode(idx, lo, hi)
    got = wire.encode_indices(cupy.asarray(idx), lo, hi)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
    big = cupy.zeros(len(want) + 11, np.uint8)
    big[3:3 + len(want)] = cupy.asarray(want)
    for dtype in (idx.dtype, np.int64):
        out = wire.decode_indices(big[3:], dtype)
        assert isinstance(out, cupy.ndarray) and out.dtype == dtype
        np.testing.assert_array_equal(cupy.asnumpy(out), idx)
    x = np.random.default_rng(13).standard_normal(1000).astype(np.float32)
    for fmt in wire.FORMATS:
        payload, rounded = wire.round_values(cupy.asarray(x), fmt)
        want_payload, want_rounded = wire.round_values(x, fmt)
        np.testing.assert_array_equal(cupy.asnumpy(payload), want_payload)
        np.testing.assert_array_equal(cupy.asnumpy(rounded), want_rounded)


@pytest.mark.gpu
def test_gpu_parity_large():
    reason = no_device_reason()  # skip only when no CUDA device exists
    if reason is not None:
        pytest.skip(reason)
    import cupy

    rng = np.random.default_rng(14)
    for density in (0.01, 0.4):
        idx = _stream(rng, 1 << 22, density, 0, np.int32)
        want = twin.encode(idx, 0, 1 << 22)
        got = wire.encode_indices(cupy.asarray(idx), 0, 1 << 22)
        np.testing.assert_array_equal(cupy.asnumpy(got), want)
        np.testing.assert_array_equal(cupy.asnumpy(wire.decode_indices(got, np.int32)), idx)


_EMULATED = '''
import numpy as np, cupy
from cupycoll import wire
from cupycoll.wire import _index_codec as twin
rng = np.random.default_rng(15)
for density in (0.01, 0.5):
    for dtype in (np.int32, np.int64):
        idx = np.flatnonzero(rng.random(20000) < density).astype(dtype)
        enc = wire.encode_indices(cupy.asarray(idx), 0, 20000)
        assert np.array_equal(cupy.asnumpy(enc), twin.encode(idx, 0, 20000))
        big = cupy.zeros(len(enc) + 7, np.uint8)
        big[3:3 + len(enc)] = enc
        out = wire.decode_indices(big[3:], dtype)
        assert out.dtype == dtype and np.array_equal(cupy.asnumpy(out), idx)
x = rng.standard_normal(100)
for fmt in wire.FORMATS:
    payload, rounded = wire.round_values(cupy.asarray(x), fmt)
    assert np.array_equal(cupy.asnumpy(payload), wire.round_values(x, fmt)[0])
print("emulated wire ok")
'''


@pytest.mark.mpi
def test_device_path_under_the_strict_gpu_emulation(tmp_path):
    """The cupy path on the emulated GPU (cupycoll.testing.emulation): stream order, device and
    launch rules enforced, kernels compiled for the CPU from the cached-cubin path."""
    import os
    import subprocess
    import sys

    from ._mpi import ROOT, mpiexec

    script = tmp_path / "emulated_wire.py"
    script.write_text(_EMULATED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([mpiexec(), "-n", "1", sys.executable, "-m", "mpi4py", "-m",
                           "cupycoll.testing.emulation", str(script)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env, start_new_session=True)
    assert proc.returncode == 0 and "emulated wire ok" in proc.stdout, proc.stdout + proc.stderr
