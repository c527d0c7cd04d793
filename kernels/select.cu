// Threshold count and compaction by magnitude rank, with deterministic ascending output.
//
// The input is cut into fixed chunks of `chunk` consecutive elements. Pass 1 (cc_rank_count)
// counts, per chunk, the elements whose rank is above `r` and those equal to `r`; the host turns
// the counts into exclusive offsets with a scan; pass 2 (cc_rank_select) walks each chunk again and
// writes its selected elements at its offset, so the output is in ascending index order whatever
// the launch shape. Selected: every rank > r, and the first `need_eq` elements (in index order) of
// rank == r. select_abs_ge uses need_eq = 0; topk_abs uses r = the k-th rank and its tie budget.
#include "common.cuh"

template <typename T>
__global__ void cc_rank_count(const T* __restrict__ x, long long n, long long chunk, cc_u64 r,
                              long long nchunks, long long* __restrict__ counts) {
  for (long long c = cc_thread_id(); c < nchunks; c += cc_thread_count()) {
    long long above = 0, equal = 0;
    long long end = cc_min(n, (c + 1) * chunk);
    for (long long i = c * chunk; i < end; ++i) {
      cc_u64 k = cc_value<T>::rank(x[i]);
      above += k > r;
      equal += k == r;
    }
    counts[c] = above;
    counts[nchunks + c] = equal;
  }
}

template <typename T, typename I>
__global__ void cc_rank_select(const T* __restrict__ x, long long n, long long chunk, cc_u64 r,
                               long long nchunks, const long long* __restrict__ offsets,
                               long long need_eq, I* __restrict__ out_idx, T* __restrict__ out_val) {
  for (long long c = cc_thread_id(); c < nchunks; c += cc_thread_count()) {
    long long tie = offsets[nchunks + c];
    long long pos = offsets[c] + cc_min(tie, need_eq);
    long long end = cc_min(n, (c + 1) * chunk);
    for (long long i = c * chunk; i < end; ++i) {
      cc_u64 k = cc_value<T>::rank(x[i]);
      if (k > r || (k == r && tie++ < need_eq)) {
        out_idx[pos] = (I)i;
        out_val[pos] = x[i];
        ++pos;
      }
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
