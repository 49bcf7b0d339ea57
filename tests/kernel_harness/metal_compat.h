// Just enough of the Metal Shading Language for the kernel bodies in metal/
// to compile as C++ (g++ -std=c++20) in the CPU harness.
//
// What is mirrored, and how:
//  * scalar types: uint, uint3, and the dtype names MLX writes into generated
//    signatures (float16_t, bfloat16_t, int32_t, ...). The 16-bit floats are
//    2-byte structs, so buffers have the real memory layout; they convert to
//    float exactly and from float with round-to-nearest-even.
//  * address spaces: `device`, `constant`, `thread` vanish; `threadgroup`
//    becomes `static`, one copy shared by the threads of the threadgroup the
//    harness is running (groups run one after another).
//  * threadgroup_barrier: every simulated thread of a group is an OS thread
//    and the barrier is a std::barrier, so code between barriers really runs
//    concurrently and data races / missing barriers can show up as wrong results.
//  * metal::exp & co.: the float overloads from <cmath>.
// Not mirrored: simdgroup functions (simd_sum, ...), atomics, textures. A body
// that uses them fails to compile here instead of being checked wrongly.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>  // for the driver after the kernels (here so the PCH has it)
#include <vector>

typedef unsigned int uint;

struct uint3 {
  uint x, y, z;
};

struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fc0;  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
      bits = uint16_t(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct float16_t {
  uint16_t bits;
  float16_t() = default;
  float16_t(float f) {
    _Float16 h = static_cast<_Float16>(f);  // IEEE round-to-nearest-even
    std::memcpy(&bits, &h, 2);
  }
  operator float() const {
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return static_cast<float>(h);
  }
};
static_assert(sizeof(bfloat16_t) == 2 && sizeof(float16_t) == 2, "16-bit floats must be 2 bytes");

typedef bfloat16_t bfloat;
typedef float16_t half;

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

// Set by the harness on each simulated thread when the body has barriers.
inline thread_local std::barrier<>* harness_barrier = nullptr;

inline void threadgroup_barrier(mem_flags) {
  if (harness_barrier == nullptr) {
    std::fprintf(stderr, "threadgroup_barrier outside a concurrent threadgroup\n");
    std::abort();
  }
  harness_barrier->arrive_and_wait();
}

namespace metal {
using std::abs;
using std::exp;
using std::fabs;
using std::log;
using std::max;
using std::min;
using std::sqrt;
using std::tanh;
inline float rsqrt(float x) {
  return 1.0f / std::sqrt(x);
}
}  // namespace metal

// Address-space qualifiers: last, so no standard header above sees them.
#define device
#define constant
#define thread
#define threadgroup static
