// Lets the Metal bodies in this folder run as mx.fast.cuda_kernel bodies.
// MLX pastes this header (the `header=` argument) before the generated
// signature. The bodies only use a small Metal subset: address-space
// qualifiers, a few thread attributes, one device-memory barrier and
// metal::exp, so a handful of defines cover it. CUDA passes every input as a
// plain pointer, which is why scalars travel as one-element arrays.

typedef unsigned int uint;

// Metal's attributes, rebuilt from CUDA's builtins.
__device__ inline uint3 dflash2_thread_position_in_grid() {
  return make_uint3(
      blockIdx.x * blockDim.x + threadIdx.x,
      blockIdx.y * blockDim.y + threadIdx.y,
      blockIdx.z * blockDim.z + threadIdx.z);
}
#define thread_position_in_grid dflash2_thread_position_in_grid()
#define thread_index_in_threadgroup \
  (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))
#define threads_per_threadgroup blockDim

// __syncthreads orders global and shared memory within the block, which is
// what the bodies ask of mem_device / mem_threadgroup barriers.
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
#define threadgroup_barrier(flags) __syncthreads()

namespace metal {
__device__ inline float exp(float x) {
  return expf(x);
}
} // namespace metal

// Metal address spaces have no CUDA spelling for kernel arguments. Defined
// last: CUDA's own `__device__` expands through the word `device`.
#define device
#define constant
#define thread
#define threadgroup __shared__
