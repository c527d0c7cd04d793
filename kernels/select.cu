// Threshold count and compaction by magnitude rank, with deterministic ascending output.
//
// The input is cut into tiles of `chunk` consecutive elements, one tile per block at a time
// (grid-stride over tiles). Within a tile the block reads `blockDim.x` consecutive elements per
// round, one per thread, so a warp's loads are coalesced. Pass 1 (cc_rank_count) counts, per
// tile, the elements whose rank is above `r` and those equal to `r`; the host turns the counts
// into exclusive offsets with a scan; pass 2 (cc_rank_select) walks each tile again and writes its
// selected elements in index order: an element's output position is the number of elements of
// rank > r before it plus min(ties before it, need_eq), both from the tile's offsets plus a block
// scan of the round (shared memory, barriers). So the output is in ascending index order whatever
// the launch shape. Selected: every rank > r, and the first `need_eq` elements (in index order)
// of rank == r. select_abs_ge uses need_eq = 0; topk_abs uses r = the k-th rank and its ties.
#include "common.cuh"

// Largest block the tile kernels take (CUDA's limit): the size of their scan buffer.
#define CC_TILE_MAX_THREADS 1024

// Exclusive scan of `v` over the block's threads in threadIdx order; `*total` = the block's sum.
// Every thread of the block must call it (it has barriers).
__device__ __forceinline__ cc_u64 cc_block_scan(cc_u64 v, cc_u64* total, cc_u64* buf) {
  const unsigned int t = threadIdx.x, nt = blockDim.x;
  buf[t] = v;
  __syncthreads();
  for (unsigned int step = 1; step < nt; step <<= 1) {
    cc_u64 add = t >= step ? buf[t - step] : 0;
    __syncthreads();
    buf[t] += add;
    __syncthreads();
  }
  cc_u64 inclusive = buf[t];
  *total = buf[nt - 1];
  __syncthreads();  // buf is reused by the next call
  return inclusive - v;
}

// (rank > r, rank == r) of x[i] packed as high word `equal`, low word `above`; 0 past the end.
template <typename T>
__device__ __forceinline__ cc_u64 cc_rank_flags(const T* x, long long i, long long end, cc_u64 r) {
  if (i >= end) return 0;
  cc_u64 k = cc_value<T>::rank(x[i]);
  return ((cc_u64)(k == r) << 32) | (cc_u64)(k > r);
}

template <typename T>
__global__ void cc_rank_count(const T* __restrict__ x, long long n, long long chunk, cc_u64 r,
                              long long nchunks, long long* __restrict__ counts) {
  __shared__ cc_u64 buf[CC_TILE_MAX_THREADS];
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const long long end = cc_min(n, (c + 1) * chunk);
    cc_u64 mine = 0;  // this thread's (equal, above), each < 2^32 as long as chunk is
    for (long long i = c * chunk + threadIdx.x; i < end; i += blockDim.x) {
      mine += cc_rank_flags(x, i, end, r);
    }
    cc_u64 total;
    cc_block_scan(mine, &total, buf);
    if (threadIdx.x == 0) {
      counts[c] = (long long)(total & 0xffffffffull);
      counts[nchunks + c] = (long long)(total >> 32);
    }
  }
}

template <typename T, typename I>
__global__ void cc_rank_select(const T* __restrict__ x, long long n, long long chunk, cc_u64 r,
                               long long nchunks, const long long* __restrict__ offsets,
                               long long need_eq, I* __restrict__ out_idx, T* __restrict__ out_val) {
  __shared__ cc_u64 buf[CC_TILE_MAX_THREADS];
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const long long end = cc_min(n, (c + 1) * chunk);
    long long above = offsets[c], ties = offsets[nchunks + c];  // before this round
    for (long long base = c * chunk; base < end; base += blockDim.x) {  // the same for the block
      const long long i = base + threadIdx.x;
      const cc_u64 flags = cc_rank_flags(x, i, end, r);
      cc_u64 total;
      const cc_u64 before = cc_block_scan(flags, &total, buf);
      const long long a = above + (long long)(before & 0xffffffffull);
      const long long e = ties + (long long)(before >> 32);
      if ((flags & 1ull) || ((flags >> 32) && e < need_eq)) {
        const long long pos = a + cc_min(e, need_eq);
        out_idx[pos] = (I)i;
        out_val[pos] = x[i];
      }
      above += (long long)(total & 0xffffffffull);
      ties += (long long)(total >> 32);
    }
  }
}

CC_EXPORT(cc_rank_count<cc_half>)
CC_EXPORT(cc_rank_count<float>)
CC_EXPORT(cc_rank_count<double>)
CC_EXPORT(cc_rank_count<int>)
CC_EXPORT(cc_rank_count<long long>)
CC_EXPORT(cc_rank_select<cc_half, int>)
CC_EXPORT(cc_rank_select<float, int>)
CC_EXPORT(cc_rank_select<double, int>)
CC_EXPORT(cc_rank_select<int, int>)
CC_EXPORT(cc_rank_select<long long, int>)
CC_EXPORT(cc_rank_select<cc_half, long long>)
CC_EXPORT(cc_rank_select<float, long long>)
CC_EXPORT(cc_rank_select<double, long long>)
CC_EXPORT(cc_rank_select<int, long long>)
CC_EXPORT(cc_rank_select<long long, long long>)
