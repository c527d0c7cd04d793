// CPU shim: compiles the cupycoll kernels as plain C++ so tests can run them without a GPU.
//
//   g++ -x c++ -std=c++17 -O1 -shared -fPIC -fvisibility=hidden -include cpu_shim.h
//       -o select.so select.cu
//
// It defines the CUDA keywords, the built-in index variables, the bit-cast intrinsics and the
// atomics the kernels use, and turns each CC_EXPORT(name<types>) line into a launcher
//   void launch(unsigned grid, unsigned block, void** args)
// that runs the kernel for every (block, thread) in turn with cuLaunchKernel's argument
// convention (args[i] points at the i-th argument). Threads run one after another, which is one
// legal schedule of kernels that use no barriers and no shared memory; atomics are therefore
// plain read-modify-writes. The launchers are listed by cc_shim_count / cc_shim_name /
// cc_shim_launcher, named by the CC_EXPORT text; they are the library's only exported symbols, so
// several kernel libraries can be loaded into one process side by side.
#pragma once
#define CUPYCOLL_CPU_SHIM 1

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct cc_shim_dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
static cc_shim_dim3 blockIdx, threadIdx, blockDim, gridDim;

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

template <typename... P>
inline void cc_shim_run(void (*kernel)(P...), unsigned int grid, unsigned int block, void** args) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned int b = 0; b < grid; ++b) {
    blockIdx.x = b;
    for (unsigned int t = 0; t < block; ++t) {
      threadIdx.x = t;
      cc_shim_call(kernel, args, std::index_sequence_for<P...>{});
    }
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
