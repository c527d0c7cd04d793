// Gather of values (1-D, or rows of `width`) from a dense array: out[j] = dense[idx[j]].
// One thread per output element, consecutive threads on consecutive columns of a row.
#include "common.cuh"

template <typename T, typename I>
__global__ void cc_gather_rows(const T* __restrict__ dense, const I* __restrict__ idx,
                               long long m, long long width, T* __restrict__ out) {
  const long long total = m * width;
  for (long long g = cc_thread_id(); g < total; g += cc_thread_count()) {
    long long j = g / width;
    out[g] = dense[(long long)idx[j] * width + (g - j * width)];
  }
}

CC_EXPORT(cc_gather_rows<cc_half, int>)
CC_EXPORT(cc_gather_rows<float, int>)
CC_EXPORT(cc_gather_rows<double, int>)
CC_EXPORT(cc_gather_rows<int, int>)
CC_EXPORT(cc_gather_rows<long long, int>)
CC_EXPORT(cc_gather_rows<cc_half, long long>)
CC_EXPORT(cc_gather_rows<float, long long>)
CC_EXPORT(cc_gather_rows<double, long long>)
CC_EXPORT(cc_gather_rows<int, long long>)
CC_EXPORT(cc_gather_rows<long long, long long>)
