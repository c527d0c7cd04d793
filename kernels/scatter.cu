// Scatter-reduce of values (1-D, or rows of `width`) into a dense array: dense[idx[j]] op= v[j].
//
// cc_scatter_unique: the indices are distinct (the host checks they are strictly increasing), so
// every element is written by one thread and no ordering question arises.
// cc_scatter_atomic: integer values with repeated indices. Integer sum, product (both wrapping),
// max and min are associative and commutative, so global atomics give the exact, deterministic
// left-fold result in any order. Floats with repeated indices go through segment.cu instead,
// whose sequential fold keeps numpy's order of rounding.
#include "common.cuh"

template <typename T, typename I, typename OP>
__global__ void cc_scatter_unique(T* __restrict__ dense, const I* __restrict__ idx,
                                  const T* __restrict__ values, long long m, long long width) {
  const long long total = m * width;
  for (long long g = cc_thread_id(); g < total; g += cc_thread_count()) {
    long long j = g / width;
    T* dst = dense + (long long)idx[j] * width + (g - j * width);
    *dst = OP::apply(*dst, values[g]);
  }
}

template <typename OP>
struct cc_atomic;

template <>
struct cc_atomic<cc_op_sum> {
  static __device__ __forceinline__ void apply(int* p, int v) { atomicAdd(p, v); }
  static __device__ __forceinline__ void apply(long long* p, long long v) {
    atomicAdd((cc_u64*)p, (cc_u64)v);
  }
};

template <>
struct cc_atomic<cc_op_max> {
  static __device__ __forceinline__ void apply(int* p, int v) { atomicMax(p, v); }
  static __device__ __forceinline__ void apply(long long* p, long long v) { atomicMax(p, v); }
};

template <>
struct cc_atomic<cc_op_min> {
  static __device__ __forceinline__ void apply(int* p, int v) { atomicMin(p, v); }
  static __device__ __forceinline__ void apply(long long* p, long long v) { atomicMin(p, v); }
};

template <>
struct cc_atomic<cc_op_prod> {  // compare-and-swap loop over the wrapping product
  static __device__ __forceinline__ void apply(int* p, int v) {
    unsigned int* a = (unsigned int*)p;
    unsigned int seen = *a, want;
    do {
      want = seen;
      seen = atomicCAS(a, want, want * (unsigned int)v);
    } while (seen != want);
  }
  static __device__ __forceinline__ void apply(long long* p, long long v) {
    cc_u64* a = (cc_u64*)p;
    cc_u64 seen = *a, want;
    do {
      want = seen;
      seen = atomicCAS(a, want, want * (cc_u64)v);
    } while (seen != want);
  }
};

template <typename T, typename I, typename OP>
__global__ void cc_scatter_atomic(T* __restrict__ dense, const I* __restrict__ idx,
                                  const T* __restrict__ values, long long m, long long width) {
  const long long total = m * width;
  for (long long g = cc_thread_id(); g < total; g += cc_thread_count()) {
    long long j = g / width;
    cc_atomic<OP>::apply(dense + (long long)idx[j] * width + (g - j * width), values[g]);
  }
}

CC_EXPORT(cc_scatter_unique<cc_half, int, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<float, int, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<double, int, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<int, int, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<long long, int, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<cc_half, int, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<float, int, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<double, int, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<int, int, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<long long, int, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<cc_half, int, cc_op_max>)
CC_EXPORT(cc_scatter_unique<float, int, cc_op_max>)
CC_EXPORT(cc_scatter_unique<double, int, cc_op_max>)
CC_EXPORT(cc_scatter_unique<int, int, cc_op_max>)
CC_EXPORT(cc_scatter_unique<long long, int, cc_op_max>)
CC_EXPORT(cc_scatter_unique<cc_half, int, cc_op_min>)
CC_EXPORT(cc_scatter_unique<float, int, cc_op_min>)
CC_EXPORT(cc_scatter_unique<double, int, cc_op_min>)
CC_EXPORT(cc_scatter_unique<int, int, cc_op_min>)
CC_EXPORT(cc_scatter_unique<long long, int, cc_op_min>)
CC_EXPORT(cc_scatter_unique<cc_half, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<float, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<double, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<int, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<long long, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_unique<cc_half, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<float, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<double, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<int, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<long long, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_unique<cc_half, long long, cc_op_max>)
CC_EXPORT(cc_scatter_unique<float, long long, cc_op_max>)
CC_EXPORT(cc_scatter_unique<double, long long, cc_op_max>)
CC_EXPORT(cc_scatter_unique<int, long long, cc_op_max>)
CC_EXPORT(cc_scatter_unique<long long, long long, cc_op_max>)
CC_EXPORT(cc_scatter_unique<cc_half, long long, cc_op_min>)
CC_EXPORT(cc_scatter_unique<float, long long, cc_op_min>)
CC_EXPORT(cc_scatter_unique<double, long long, cc_op_min>)
CC_EXPORT(cc_scatter_unique<int, long long, cc_op_min>)
CC_EXPORT(cc_scatter_unique<long long, long long, cc_op_min>)
CC_EXPORT(cc_scatter_atomic<int, int, cc_op_sum>)
CC_EXPORT(cc_scatter_atomic<long long, int, cc_op_sum>)
CC_EXPORT(cc_scatter_atomic<int, int, cc_op_prod>)
CC_EXPORT(cc_scatter_atomic<long long, int, cc_op_prod>)
CC_EXPORT(cc_scatter_atomic<int, int, cc_op_max>)
CC_EXPORT(cc_scatter_atomic<long long, int, cc_op_max>)
CC_EXPORT(cc_scatter_atomic<int, int, cc_op_min>)
CC_EXPORT(cc_scatter_atomic<long long, int, cc_op_min>)
CC_EXPORT(cc_scatter_atomic<int, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_atomic<long long, long long, cc_op_sum>)
CC_EXPORT(cc_scatter_atomic<int, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_atomic<long long, long long, cc_op_prod>)
CC_EXPORT(cc_scatter_atomic<int, long long, cc_op_max>)
CC_EXPORT(cc_scatter_atomic<long long, long long, cc_op_max>)
CC_EXPORT(cc_scatter_atomic<int, long long, cc_op_min>)
CC_EXPORT(cc_scatter_atomic<long long, long long, cc_op_min>)
