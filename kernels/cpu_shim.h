// CPU shim: compiles the cupycoll kernels as plain C++ so tests can run them without a GPU.
//
//   g++ -x c++ -std=c++17 -O1 -shared -fPIC -fvisibility=hidden -include cpu_shim.h
//       -o select.so select.cu
//
// It defines the CUDA keywords, the built-in index variables, the bit-cast intrinsics, the
// atomics, __shared__ and __syncthreads() the kernels use, and turns each CC_EXPORT(name<types>)
// line into a launcher
//   void launch(unsigned grid, unsigned block, void** args)
// with cuLaunchKernel's argument convention (args[i] points at the i-th argument). Blocks run one
// after another; the threads of a block run as fibers on one OS thread: each runs
// until it reaches __syncthreads() or ends, then the next one, so every thread has reached a
// barrier before any thread passes it. That is one legal schedule; atomics are therefore plain
// read-modify-writes, and a __shared__ variable (a thread_local static) is the block's, as blocks
// never overlap. The built-ins are thread_local too: two host threads may launch at once (an
// async call's worker and the caller), as long as they do not share output arrays. The launchers are listed by cc_shim_count / cc_shim_name / cc_shim_launcher, named by
// the CC_EXPORT text; they are the library's only exported symbols, so several kernel libraries
// can be loaded into one process side by side.
#pragma once
#define CUPYCOLL_CPU_SHIM 1
// Fibers switch stacks with _longjmp: glibc's fortified longjmp rejects that as a jump into an
// "uninitialized stack frame", so the shim (included first) turns fortification off.
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <ucontext.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local

struct cc_shim_dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
static thread_local cc_shim_dim3 blockIdx, threadIdx, blockDim, gridDim;

template <typename To, typename From>
inline To cc_shim_bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
  To out;
  std::memcpy(&out, &v, sizeof(To));
  return out;
}
inline unsigned int __float_as_uint(float v) { return cc_shim_bit_cast<unsigned int>(v); }
inline float __uint_as_float(unsigned int v) { return cc_shim_bit_cast<float>(v); }
inline long long __double_as_longlong(double v) { return cc_shim_bit_cast<long long>(v); }

inline int atomicAdd(int* p, int v) {
  int old = *p;
  *p = (int)((unsigned int)old + (unsigned int)v);
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  T old = *p;
  *p = old > v ? old : v;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  T old = *p;
  *p = old < v ? old : v;
  return old;
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

typedef void (*cc_shim_launch_fn)(unsigned int grid, unsigned int block, void** args);

template <typename... P, std::size_t... I>
inline void cc_shim_call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_reference_t<P>*>(args[I])...);
}

// The fibers: one per thread of a block, each on its own 64 KiB stack, created on first need and
// kept (parked) per host thread, so a launch costs no allocation and no system call. A fiber
// runs the block's body, then parks until the next block; it meets the scheduler at each
// barrier. Switches are _setjmp/_longjmp (swapcontext would save and restore the signal mask
// with a system call at every switch); makecontext/setcontext only start a fiber once.
struct cc_shim_fiber {
  jmp_buf resume;
  std::unique_ptr<char[]> stack;
  bool done = true;
};
struct cc_shim_fibers {
  std::vector<std::unique_ptr<cc_shim_fiber>> fibers;
  jmp_buf scheduler;
  const std::function<void()>* body = nullptr;
  unsigned int current = 0;
};
static thread_local cc_shim_fibers cc_shim_pool;
constexpr std::size_t cc_shim_stack_bytes = 1 << 16;

// From the running fiber back to the scheduler; returns when the scheduler resumes it.
__attribute__((noinline)) inline void cc_shim_park() {
  cc_shim_fibers& pool = cc_shim_pool;
  if (!_setjmp(pool.fibers[pool.current]->resume)) _longjmp(pool.scheduler, 1);
}

inline void cc_shim_fiber_main() {
  for (;;) {
    cc_shim_park();  // until the scheduler hands this fiber a thread of a block
    cc_shim_fibers& pool = cc_shim_pool;
    (*pool.body)();
    pool.fibers[pool.current]->done = true;
  }
}

inline void cc_shim_start_fiber(unsigned int t) {
  cc_shim_fibers& pool = cc_shim_pool;
  auto fiber = std::make_unique<cc_shim_fiber>();
  fiber->stack.reset(new char[cc_shim_stack_bytes]);
  ucontext_t start;
  getcontext(&start);
  start.uc_stack.ss_sp = fiber->stack.get();
  start.uc_stack.ss_size = cc_shim_stack_bytes;
  start.uc_link = nullptr;  // a fiber never returns: it parks
  makecontext(&start, cc_shim_fiber_main, 0);
  pool.fibers.push_back(std::move(fiber));
  pool.current = t;
  if (!_setjmp(pool.scheduler)) setcontext(&start);  // back here once it has parked
}

inline void __syncthreads() {
  unsigned int me = cc_shim_pool.current;
  cc_shim_park();  // resumed in the next round
  threadIdx.x = me;
}

// Run one block: every thread up to its next barrier, round after round, until all have ended.
inline void cc_shim_run_block(unsigned int threads, const std::function<void()>& body) {
  cc_shim_fibers& pool = cc_shim_pool;
  while (pool.fibers.size() < threads) cc_shim_start_fiber((unsigned int)pool.fibers.size());
  pool.body = &body;
  for (unsigned int t = 0; t < threads; ++t) pool.fibers[t]->done = false;
  for (volatile bool active = true; active;) {
    active = false;
    for (volatile unsigned int t = 0; t < threads; ++t) {
      if (pool.fibers[t]->done) continue;
      pool.current = t;
      threadIdx.x = t;
      if (!_setjmp(pool.scheduler)) _longjmp(pool.fibers[t]->resume, 1);
      if (!pool.fibers[t]->done) active = true;
    }
  }
  pool.body = nullptr;
}

template <typename... P>
inline void cc_shim_run(void (*kernel)(P...), unsigned int grid, unsigned int block, void** args) {
  gridDim.x = grid;
  blockDim.x = block;
  const std::function<void()> body = [&] {
    cc_shim_call(kernel, args, std::index_sequence_for<P...>{});
  };
  for (unsigned int b = 0; b < grid; ++b) {
    blockIdx.x = b;
    cc_shim_run_block(block, body);
  }
}

template <auto Kernel>
void cc_shim_launch(unsigned int grid, unsigned int block, void** args) {
  cc_shim_run(Kernel, grid, block, args);
}

struct cc_shim_entry {
  const char* name;
  cc_shim_launch_fn launch;
};
static std::vector<cc_shim_entry> cc_shim_table;  // filled by the CC_EXPORT lines below it

struct cc_shim_register {
  cc_shim_register(const char* name, cc_shim_launch_fn launch) {
    cc_shim_table.push_back(cc_shim_entry{name, launch});
  }
};

#define CC_SHIM_API extern "C" __attribute__((visibility("default")))
CC_SHIM_API int cc_shim_count() { return (int)cc_shim_table.size(); }
CC_SHIM_API const char* cc_shim_name(int i) { return cc_shim_table[i].name; }
CC_SHIM_API cc_shim_launch_fn cc_shim_launcher(int i) { return cc_shim_table[i].launch; }

#define CC_SHIM_CAT2(a, b) a##b
#define CC_SHIM_CAT(a, b) CC_SHIM_CAT2(a, b)
#define CC_EXPORT(...)                                                   \
  static const cc_shim_register CC_SHIM_CAT(cc_shim_reg_, __LINE__)( \
      #__VA_ARGS__, &cc_shim_launch<&__VA_ARGS__>);
