// Exact k-th largest magnitude by radix select over the magnitude ranks (see common.cuh).
//
// The rank is fixed 4 bits per pass, from the most significant digit down. cc_radix_histogram
// counts, for the elements whose higher digits equal the prefix found so far, how many have each
// value of the current digit; every thread keeps its 16 counters in registers and writes them to
// its own column of `partial` (no atomics, no shared memory), and the host sums the columns.
// cc_radix_pick (one thread) then picks the digit holding the k-th largest and updates the state
// in device memory, so the passes run back to back without a round trip to the host.
// state[0] = prefix (the rank being built), state[1] = k within the elements matching the prefix.
#include "common.cuh"

template <typename T>
__global__ void cc_radix_histogram(const T* __restrict__ x, long long n,
                                   const cc_u64* __restrict__ state, int shift,
                                   unsigned int* __restrict__ partial) {
  const cc_u64 prefix = state[0];
  const cc_u64 high = shift + 4 >= 64 ? 0ull : ~0ull << (shift + 4);
  unsigned int h[16];
#pragma unroll
  for (int b = 0; b < 16; ++b) h[b] = 0u;
  for (long long i = cc_thread_id(); i < n; i += cc_thread_count()) {
    cc_u64 k = cc_value<T>::rank(x[i]);
    if (((k ^ prefix) & high) == 0ull) {
      unsigned int d = (unsigned int)(k >> shift) & 15u;
#pragma unroll
      for (int b = 0; b < 16; ++b) h[b] += d == (unsigned int)b;  // stays in registers
    }
  }
  const long long tid = cc_thread_id(), threads = cc_thread_count();
#pragma unroll
  for (int b = 0; b < 16; ++b) partial[b * threads + tid] = h[b];
}

extern "C" __global__ void cc_radix_pick(const cc_u64* __restrict__ hist, int shift,
                                         cc_u64* __restrict__ state) {
  if (cc_thread_id() != 0) return;
  cc_u64 k = state[1];
  for (int b = 15; b >= 0; --b) {
    if (k <= hist[b]) {
      state[0] |= (cc_u64)b << shift;
      state[1] = k;
      return;
    }
    k -= hist[b];
  }
}

CC_EXPORT(cc_radix_histogram<cc_half>)
CC_EXPORT(cc_radix_histogram<float>)
CC_EXPORT(cc_radix_histogram<double>)
CC_EXPORT(cc_radix_histogram<int>)
CC_EXPORT(cc_radix_histogram<long long>)
CC_EXPORT(cc_radix_pick)
