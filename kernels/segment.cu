// Segmented left fold of sorted COO runs, for coo_reduce, merge_sorted and scatter_reduce.
//
// The host sorts the indices stably (perm = stable argsort) and finds where each run of equal
// indices starts (starts[s]; the last run ends at m). Each (run, column) pair is one work item;
// a block takes blockDim consecutive items at a time (grid-stride over these tiles), so
// neighbouring threads touch neighbouring columns of a row.
//  - A short run is folded by its own thread, sequentially in perm order: duplicates reduce in
//    input order, bit for bit like numpy's ufunc.at.
//  - A long run (>= CC_SEGMENT_LONG_PER_THREAD * blockDim elements: one hot index) is folded by
//    the whole block when the op's result does not depend on how the fold is bracketed: every
//    integer op (wrapping sum and product, max, min) and float max/min (the first NaN wins, and
//    a +-0 tie gives +0 for max, -0 for min, whatever the order: common.cuh). Each thread folds
//    one contiguous piece in order, then an in-order tree in shared memory combines the pieces
//    (left operand always the earlier piece), so the result is the left fold's.
//  - Float sum and product always fold in order in one thread: their rounding depends on the
//    order, and numpy's ufunc.at defines the result as the left fold.
// The choice is made on the device from the run lengths, so the host does not read them.
// rows == nullptr: out[s, c] = v[perm[lo]] op v[perm[lo + 1]] op ... (the coalesced values).
// rows != nullptr: out[rows[s], c] = out[rows[s], c] op v[perm[lo]] op ... (scatter into dense).
#include "common.cuh"

// Largest block the kernel takes (CUDA's limit): the size of its shared buffers.
#define CC_SEGMENT_MAX_THREADS 1024
// A run this many elements per thread of the block, or longer, is folded by the whole block.
#define CC_SEGMENT_LONG_PER_THREAD 4

// Whether folding (T, OP) as a tree of in-order pieces gives the left fold's bits.
template <typename T>
struct cc_exact_int {
  static constexpr bool value = false;
};
template <>
struct cc_exact_int<int> {
  static constexpr bool value = true;
};
template <>
struct cc_exact_int<long long> {
  static constexpr bool value = true;
};
template <typename OP>
struct cc_selecting_op {  // max and min pick one operand: no rounding
  static constexpr bool value = false;
};
template <>
struct cc_selecting_op<cc_op_max> {
  static constexpr bool value = true;
};
template <>
struct cc_selecting_op<cc_op_min> {
  static constexpr bool value = true;
};
template <typename T, typename OP>
struct cc_tree_fold {
  static constexpr bool value = cc_exact_int<T>::value || cc_selecting_op<OP>::value;
};

// acc op values[perm[lo]] op ... op values[perm[hi - 1]] of column c, in order.
template <typename T, typename OP>
__device__ __forceinline__ T cc_fold_range(T acc, const T* values, const long long* perm,
                                           long long lo, long long hi, long long width,
                                           long long c) {
  for (long long j = lo; j < hi; ++j) acc = OP::apply(acc, values[perm[j] * width + c]);
  return acc;
}

template <typename T, typename OP>
__global__ void cc_segment_fold(const T* __restrict__ values, const long long* __restrict__ perm,
                                long long m, long long width, const long long* __restrict__ starts,
                                long long nseg, const long long* __restrict__ rows,
                                T* __restrict__ out) {
  constexpr bool tree = cc_tree_fold<T, OP>::value;
  __shared__ T part[tree ? CC_SEGMENT_MAX_THREADS : 1];
  __shared__ int is_long[tree ? CC_SEGMENT_MAX_THREADS : 1];
  const long long total = nseg * width, nt = blockDim.x, t = threadIdx.x;
  const long long long_run = CC_SEGMENT_LONG_PER_THREAD * nt;
  // base is the same for every thread of the block, so all meet the same barriers
  for (long long base = (long long)blockIdx.x * nt; base < total; base += cc_thread_count()) {
    const long long g = base + t;
    if (g < total) {
      long long s = g / width, c = g - s * width;
      long long lo = starts[s], hi = s + 1 < nseg ? starts[s + 1] : m;
      const bool mine = !tree || hi - lo < long_run;
      if (tree) is_long[t] = !mine;
      if (mine) {
        T* dst = rows ? out + rows[s] * width + c : out + g;
        T acc = rows ? *dst : values[perm[lo++] * width + c];
        *dst = cc_fold_range<T, OP>(acc, values, perm, lo, hi, width, c);
      }
    } else if (tree) {
      is_long[t] = 0;
    }
    if (!tree) continue;
    __syncthreads();
    for (long long k = 0; k < nt; ++k) {  // the tile's long runs, one after another
      if (!is_long[k]) continue;  // shared: the same decision in every thread
      const long long item = base + k, s = item / width, c = item - s * width;
      const long long lo = starts[s], len = (s + 1 < nseg ? starts[s + 1] : m) - lo;
      const long long q = len / nt, r = len % nt;  // len >= nt: every piece has an element
      const long long from = lo + t * q + cc_min(t, r), to = from + q + (t < r);
      part[t] = cc_fold_range<T, OP>(values[perm[from] * width + c], values, perm, from + 1, to,
                                     width, c);
      __syncthreads();
      for (long long step = 1; step < nt; step <<= 1) {  // part[t] covers pieces t .. t+step-1
        if (t % (2 * step) == 0 && t + step < nt) part[t] = OP::apply(part[t], part[t + step]);
        __syncthreads();
      }
      if (t == 0) {
        T* dst = rows ? out + rows[s] * width + c : out + item;
        *dst = rows ? OP::apply(*dst, part[0]) : part[0];
      }
    }
    __syncthreads();  // every thread has read is_long before the next tile rewrites it
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
