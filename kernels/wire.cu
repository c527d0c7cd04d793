// Index codec of cupycoll.wire (layout in docs/wire.md): bit-packed gap blocks and bitmaps.
//
// A strictly increasing stream idx[0..n) is coded as gaps g_i = idx[i] - idx[i-1] - 1, i >= 1,
// in blocks of CC_WIRE_BLOCK; block b stores its gaps in widths[b] bits each, LSB first, from
// byte starts[b] (blocks are whole bytes: 32 * w bits). Encoding: cc_wire_plan (one thread per
// block: width, bytes, order check), a prefix sum of the bytes on the host side's array library,
// cc_wire_pack (one thread per block). Decoding: cc_wire_block_bytes, a prefix sum, cc_wire_unpack
// (one thread per gap, steps = gap + 1) and a prefix sum of the steps. Bitmaps: bit j of byte
// j >> 3 (LSB first) stands for first + j; cc_wire_bitmap_pack (one thread per byte, binary
// search), cc_wire_popcount, a prefix sum, cc_wire_bitmap_unpack (one thread per byte).
// Encoded buffers may sit at any byte offset: everything is read and written byte by byte, and
// decoders never read at or past len.
#include "common.cuh"

#define CC_WIRE_BLOCK 32

__device__ __forceinline__ int cc_bit_length(cc_u64 x) {
  int w = 0;
  for (int step = 32; step > 0; step >>= 1) {
    if (x >> step) {
      w += step;
      x >>= step;
    }
  }
  return w + (int)(x != 0);
}

__device__ __forceinline__ int cc_popcount8(unsigned int byte) {
  int c = 0;
  for (; byte; byte &= byte - 1u) ++c;
  return c;
}

template <typename I>
__global__ void cc_wire_plan(const I* __restrict__ idx, long long n, long long nblocks,
                             unsigned char* __restrict__ widths, long long* __restrict__ sizes,
                             int* __restrict__ bad) {
  for (long long b = cc_thread_id(); b < nblocks; b += cc_thread_count()) {
    long long begin = 1 + b * CC_WIRE_BLOCK, end = cc_min(n, begin + CC_WIRE_BLOCK);
    cc_u64 top = 0;
    for (long long i = begin; i < end; ++i) {
      if (idx[i] <= idx[i - 1]) *bad = 1;  // every writer stores the same value
      // unsigned: a signed step of far-apart (bad) indices would overflow
      cc_u64 gap = (cc_u64)(long long)idx[i] - (cc_u64)(long long)idx[i - 1] - 1u;
      top = gap > top ? gap : top;
    }
    int w = cc_bit_length(top);
    widths[b] = (unsigned char)w;
    sizes[b] = ((end - begin) * w + 7) / 8;
  }
}

template <typename I>
__global__ void cc_wire_pack(const I* __restrict__ idx, long long n, long long nblocks,
                             const unsigned char* __restrict__ widths,
                             const long long* __restrict__ starts, unsigned char* __restrict__ out) {
  for (long long b = cc_thread_id(); b < nblocks; b += cc_thread_count()) {
    long long begin = 1 + b * CC_WIRE_BLOCK, end = cc_min(n, begin + CC_WIRE_BLOCK);
    int w = widths[b];
    unsigned char* p = out + starts[b];
    cc_u64 acc = 0;  // fewer than 8 pending bits between pieces of at most 32 bits
    int fill = 0;
    for (long long i = begin; i < end; ++i) {
      cc_u64 v = (cc_u64)((long long)idx[i] - (long long)idx[i - 1] - 1);
      for (int left = w; left > 0;) {
        int take = left < 32 ? left : 32;
        acc |= (v & ((1ull << take) - 1ull)) << fill;
        v >>= take;
        fill += take;
        left -= take;
        for (; fill >= 8; fill -= 8, acc >>= 8) *p++ = (unsigned char)(acc & 0xffu);
      }
    }
    if (fill) *p = (unsigned char)acc;
  }
}

__global__ void cc_wire_block_bytes(const unsigned char* __restrict__ widths, long long nblocks,
                                    long long ngaps, long long* __restrict__ sizes) {
  for (long long b = cc_thread_id(); b < nblocks; b += cc_thread_count()) {
    long long len = cc_min(ngaps - b * CC_WIRE_BLOCK, CC_WIRE_BLOCK);
    sizes[b] = (len * widths[b] + 7) / 8;
  }
}

__global__ void cc_wire_unpack(const unsigned char* __restrict__ buf, long long len,
                               const unsigned char* __restrict__ widths,
                               const long long* __restrict__ starts, long long ngaps,
                               long long* __restrict__ steps) {
  for (long long j = cc_thread_id(); j < ngaps; j += cc_thread_count()) {
    long long b = j / CC_WIRE_BLOCK;
    int w = widths[b] & 63;  // a corrupt width above 63: defined bits, not a shift past 63
    long long bit = starts[b] * 8 + (j - b * CC_WIRE_BLOCK) * w;
    long long byte = bit >> 3;
    int shift = (int)(bit & 7);
    int nbytes = (shift + w + 7) >> 3;  // at most 9
    cc_u64 v = 0;
    for (int t = 0; t < nbytes; ++t) {
      cc_u64 x = byte + t < len ? (cc_u64)buf[byte + t] : 0ull;
      int at = 8 * t - shift;
      if (at < 64) v |= at >= 0 ? x << at : x >> -at;  // bits past 63 are dropped
    }
    if (w < 64) v &= (1ull << w) - 1ull;
    steps[j + 1] = (long long)(v + 1ull);
  }
}

template <typename I>
__global__ void cc_wire_bitmap_pack(const I* __restrict__ idx, long long n, long long first,
                                    long long nbytes, unsigned char* __restrict__ out) {
  for (long long k = cc_thread_id(); k < nbytes; k += cc_thread_count()) {
    long long lo = first + 8 * k, a = 0, b = n;
    while (a < b) {  // first entry >= lo
      long long m = a + (b - a) / 2;
      if ((long long)idx[m] < lo) a = m + 1; else b = m;
    }
    unsigned int acc = 0;
    for (; a < n && (long long)idx[a] < lo + 8; ++a) acc |= 1u << ((long long)idx[a] - lo);
    out[k] = (unsigned char)acc;
  }
}

// bits set in byte k among positions <= span
__global__ void cc_wire_popcount(const unsigned char* __restrict__ bits, long long nbytes,
                                 long long span, long long* __restrict__ counts) {
  for (long long k = cc_thread_id(); k < nbytes; k += cc_thread_count()) {
    unsigned int byte = bits[k];
    long long keep = span - 8 * k + 1;  // positions of this byte that belong to the stream
    if (keep < 8) byte &= (1u << keep) - 1u;
    counts[k] = cc_popcount8(byte);
  }
}

template <typename I>
__global__ void cc_wire_bitmap_unpack(const unsigned char* __restrict__ bits, long long nbytes,
                                      long long span, const long long* __restrict__ starts,
                                      long long first, long long n, I* __restrict__ out) {
  for (long long k = cc_thread_id(); k < nbytes; k += cc_thread_count()) {
    unsigned int byte = bits[k];
    long long keep = span - 8 * k + 1;
    if (keep < 8) byte &= (1u << keep) - 1u;
    long long pos = starts[k];
    for (int t = 0; t < 8; ++t) {
      if (byte >> t & 1u) {
        if (pos < n) out[pos] = (I)(first + 8 * k + t);
        ++pos;
      }
    }
  }
}

CC_EXPORT(cc_wire_plan<int>)
CC_EXPORT(cc_wire_plan<long long>)
CC_EXPORT(cc_wire_pack<int>)
CC_EXPORT(cc_wire_pack<long long>)
CC_EXPORT(cc_wire_block_bytes)
CC_EXPORT(cc_wire_unpack)
CC_EXPORT(cc_wire_bitmap_pack<int>)
CC_EXPORT(cc_wire_bitmap_pack<long long>)
CC_EXPORT(cc_wire_popcount)
CC_EXPORT(cc_wire_bitmap_unpack<int>)
CC_EXPORT(cc_wire_bitmap_unpack<long long>)
