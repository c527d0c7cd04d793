// Segmented left fold of sorted COO runs, for coo_reduce, merge_sorted and scatter_reduce.
//
// The host sorts the indices stably (perm = stable argsort) and finds where each run of equal
// indices starts (starts[s]; the last run ends at m). One thread folds one (run, column) pair
// sequentially in perm order, so duplicates reduce in input order, bit for bit like numpy's
// ufunc.at, and neighbouring threads touch neighbouring columns of a row.
// rows == nullptr: out[s, c] = v[perm[lo]] op v[perm[lo + 1]] op ... (the coalesced values).
// rows != nullptr: out[rows[s], c] = out[rows[s], c] op v[perm[lo]] op ... (scatter into dense).
#include "common.cuh"

template <typename T, typename OP>
__global__ void cc_segment_fold(const T* __restrict__ values, const long long* __restrict__ perm,
                                long long m, long long width, const long long* __restrict__ starts,
                                long long nseg, const long long* __restrict__ rows,
                                T* __restrict__ out) {
  const long long total = nseg * width;
  for (long long g = cc_thread_id(); g < total; g += cc_thread_count()) {
    long long s = g / width, c = g - s * width;
    long long lo = starts[s], hi = s + 1 < nseg ? starts[s + 1] : m;
    T* dst = rows ? out + rows[s] * width + c : out + g;
    T acc = rows ? *dst : values[perm[lo++] * width + c];
    for (long long j = lo; j < hi; ++j) acc = OP::apply(acc, values[perm[j] * width + c]);
    *dst = acc;
  }
}

CC_EXPORT(cc_segment_fold<cc_half, cc_op_sum>)
CC_EXPORT(cc_segment_fold<float, cc_op_sum>)
CC_EXPORT(cc_segment_fold<double, cc_op_sum>)
CC_EXPORT(cc_segment_fold<int, cc_op_sum>)
CC_EXPORT(cc_segment_fold<long long, cc_op_sum>)
CC_EXPORT(cc_segment_fold<cc_half, cc_op_prod>)
CC_EXPORT(cc_segment_fold<float, cc_op_prod>)
CC_EXPORT(cc_segment_fold<double, cc_op_prod>)
CC_EXPORT(cc_segment_fold<int, cc_op_prod>)
CC_EXPORT(cc_segment_fold<long long, cc_op_prod>)
CC_EXPORT(cc_segment_fold<cc_half, cc_op_max>)
CC_EXPORT(cc_segment_fold<float, cc_op_max>)
CC_EXPORT(cc_segment_fold<double, cc_op_max>)
CC_EXPORT(cc_segment_fold<int, cc_op_max>)
CC_EXPORT(cc_segment_fold<long long, cc_op_max>)
CC_EXPORT(cc_segment_fold<cc_half, cc_op_min>)
CC_EXPORT(cc_segment_fold<float, cc_op_min>)
CC_EXPORT(cc_segment_fold<double, cc_op_min>)
CC_EXPORT(cc_segment_fold<int, cc_op_min>)
CC_EXPORT(cc_segment_fold<long long, cc_op_min>)
