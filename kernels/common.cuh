// Shared definitions of the cupycoll kernels: value types, magnitude ranks, reduction ops,
// grid-stride helpers and the CC_EXPORT list of template instantiations.
//
// Kernels use no warp intrinsics; shared memory and __syncthreads() are allowed (cpu_shim.h runs
// a block's threads as fibers that meet at each barrier), so the same source compiles with
// NVRTC/nvcc for the GPU and, with cpu_shim.h, as plain C++ for tests on a CPU.
// float16 is handled as its raw bits (cc_half) with exact software conversions, so the kernels
// need no cuda_fp16.h (which NVRTC from the pip wheels cannot find) and round exactly like numpy.
#pragma once

#define CC_CAT2(a, b) a##b
#define CC_CAT(a, b) CC_CAT2(a, b)

// CC_EXPORT(name<types>) lists one instantiation by its NVRTC name expression. The Python loader
// reads these lines; under nvcc they force the instantiation (each .cu compiles standalone), under
// NVRTC the name expressions do it, and cpu_shim.h turns them into CPU launchers.
#if defined(CUPYCOLL_CPU_SHIM)
// defined by cpu_shim.h
#elif defined(__CUDACC_RTC__)
#define CC_EXPORT(...)
#else
#define CC_EXPORT(...) [[maybe_unused]] static void* const CC_CAT(cc_export_, __LINE__) = (void*)&__VA_ARGS__;
#endif

typedef unsigned long long cc_u64;

struct cc_half {
  unsigned short bits;
};

__device__ __forceinline__ long long cc_thread_id() {
  return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long cc_thread_count() {
  return (long long)gridDim.x * blockDim.x;
}

__device__ __forceinline__ long long cc_min(long long a, long long b) { return a < b ? a : b; }

// float16 <-> float, exact and round-to-nearest-even (numpy's npy_half <-> float semantics).
__device__ __forceinline__ float cc_half_to_float(cc_half h) {
  unsigned int sign = (unsigned int)(h.bits & 0x8000u) << 16;
  unsigned int exp = (h.bits >> 10) & 0x1fu;
  unsigned int man = h.bits & 0x3ffu;
  if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    float mag = (float)man * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ __forceinline__ cc_half cc_float_to_half(float f) {
  unsigned int x = __float_as_uint(f);
  unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
  unsigned int ax = x & 0x7fffffffu;
  cc_half out;
  if (ax >= 0x7f800000u) {  // inf stays inf, NaN stays a (quiet) NaN
    out.bits = sign | (ax > 0x7f800000u ? (unsigned short)(0x7e00u | ((ax >> 13) & 0x3ffu))
                                        : (unsigned short)0x7c00u);
    return out;
  }
  unsigned int e = ax >> 23;
  if (e >= 143u) {  // >= 65536: overflow to inf
    out.bits = sign | 0x7c00u;
    return out;
  }
  unsigned int q, rem, halfway;
  if (e < 113u) {  // half subnormal: units of 2^-24
    unsigned int shift = 126u - e;
    if (shift > 24u) {
      out.bits = sign;
      return out;
    }
    unsigned int m = (ax & 0x7fffffu) | 0x800000u;
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
  } else {
    q = ((e - 112u) << 10) | ((ax >> 13) & 0x3ffu);
    rem = ax & 0x1fffu;
    halfway = 0x1000u;
  }
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // a carry may reach inf: correct
  out.bits = (unsigned short)(sign | q);
  return out;
}

// cc_value<T>: per-dtype magnitude rank and reduction arithmetic.
//   rank(v): 0 for NaN, else |v| as an unsigned key + 1, so that ranks order magnitudes with NaN
//   below every number (positive float bits order like their values; |INT_MIN| is exact).
//   add/mul wrap for integers (like numpy); max/min follow numpy's np.maximum/np.minimum bit for
//   bit (NaN propagates, the first NaN stays), except that a +0.0/-0.0 tie gives +0.0 for max and
//   -0.0 for min whatever the order, like cupycoll.primitives.combine.
template <typename T>
struct cc_value;

template <>
struct cc_value<cc_half> {
  static __device__ __forceinline__ cc_u64 rank(cc_half v) {
    unsigned int key = v.bits & 0x7fffu;
    return key > 0x7c00u ? 0ull : (cc_u64)key + 1ull;
  }
  static __device__ __forceinline__ bool is_nan(cc_half v) { return (v.bits & 0x7fffu) > 0x7c00u; }
  static __device__ __forceinline__ cc_half add(cc_half a, cc_half b) {
    return cc_float_to_half(cc_half_to_float(a) + cc_half_to_float(b));
  }
  static __device__ __forceinline__ cc_half mul(cc_half a, cc_half b) {
    return cc_float_to_half(cc_half_to_float(a) * cc_half_to_float(b));
  }
  static __device__ __forceinline__ bool zero_tie(cc_half a, cc_half b) {
    return (a.bits & 0x7fffu) == 0 && (b.bits & 0x7fffu) == 0;
  }
  static __device__ __forceinline__ cc_half max(cc_half a, cc_half b) {
    if (zero_tie(a, b)) return (a.bits & 0x8000u) ? b : a;
    return (cc_half_to_float(a) >= cc_half_to_float(b) || is_nan(a)) ? a : b;
  }
  static __device__ __forceinline__ cc_half min(cc_half a, cc_half b) {
    if (zero_tie(a, b)) return (a.bits & 0x8000u) ? a : b;
    return (cc_half_to_float(a) <= cc_half_to_float(b) || is_nan(a)) ? a : b;
  }
};

template <typename F>
struct cc_float_value {
  static __device__ __forceinline__ bool is_nan(F v) { return v != v; }
  static __device__ __forceinline__ F add(F a, F b) { return a + b; }
  static __device__ __forceinline__ F mul(F a, F b) { return a * b; }
  // on a +0/-0 tie: +0 + -0 = +0 for max, -(-0 + +0) = -0 for min
  static __device__ __forceinline__ F max(F a, F b) {
    if (a == F(0) && b == F(0)) return a + b;
    return is_nan(a) ? a : (is_nan(b) || !(a > b)) ? b : a;
  }
  static __device__ __forceinline__ F min(F a, F b) {
    if (a == F(0) && b == F(0)) return -((-a) + (-b));
    return is_nan(a) ? a : (is_nan(b) || !(a < b)) ? b : a;
  }
};

template <>
struct cc_value<float> : cc_float_value<float> {
  static __device__ __forceinline__ cc_u64 rank(float v) {
    unsigned int key = __float_as_uint(v) & 0x7fffffffu;
    return key > 0x7f800000u ? 0ull : (cc_u64)key + 1ull;
  }
};

template <>
struct cc_value<double> : cc_float_value<double> {
  static __device__ __forceinline__ cc_u64 rank(double v) {
    cc_u64 key = (cc_u64)__double_as_longlong(v) & 0x7fffffffffffffffull;
    return key > 0x7ff0000000000000ull ? 0ull : key + 1ull;
  }
};

template <typename S, typename U>
struct cc_int_value {
  static __device__ __forceinline__ cc_u64 rank(S v) {
    U mag = v < 0 ? (U)0 - (U)v : (U)v;
    return (cc_u64)mag + 1ull;
  }
  static __device__ __forceinline__ S add(S a, S b) { return (S)((U)a + (U)b); }
  static __device__ __forceinline__ S mul(S a, S b) { return (S)((U)a * (U)b); }
  static __device__ __forceinline__ S max(S a, S b) { return a > b ? a : b; }
  static __device__ __forceinline__ S min(S a, S b) { return a < b ? a : b; }
};

template <>
struct cc_value<int> : cc_int_value<int, unsigned int> {};

template <>
struct cc_value<long long> : cc_int_value<long long, cc_u64> {};

// Reduction ops, used as template arguments (name expressions say e.g. cc_op_sum).
struct cc_op_sum {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) { return cc_value<T>::add(a, b); }
};
struct cc_op_prod {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) { return cc_value<T>::mul(a, b); }
};
struct cc_op_max {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) { return cc_value<T>::max(a, b); }
};
struct cc_op_min {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) { return cc_value<T>::min(a, b); }
};
