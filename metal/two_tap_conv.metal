// Two-tap block-local depthwise convolution (twin: conv.two_tap_conv_ops).
// Body for mx.fast.metal_kernel; MLX generates the signature.
//   inputs : x [N, B, H] (T), delta [N, B, 2, G], base [2, H]
//   output : y [N, B, H] (T)
//   template: T = x's dtype, GS = group size (G = H / GS)
//   launch : grid (H, B, N), threadgroup (min(H, 256), 1, 1)
// One thread per output element: no threadgroup memory, no barriers.
const uint c = thread_position_in_grid.x;
const uint t = thread_position_in_grid.y;
const uint n = thread_position_in_grid.z;
const uint N = x_shape[0];
const uint B = x_shape[1];
const uint H = x_shape[2];
// Metal dispatches the grid exactly; CUDA rounds it up to whole blocks.
if (c >= H || t >= B || n >= N) {
  return;
}
const uint G = H / GS;
const uint g = c / GS;
const size_t row = size_t(n) * B + t;
const size_t d = row * 2 * G;
// Coefficient = base kernel + this row's correction for the channel's group.
// Everything is computed in fp32 and rounded to T once, at the store.
const float c0 = float(base[c]) + float(delta[d + g]);
const float c1 = float(base[H + c]) + float(delta[d + G + g]);
const float cur = float(x[row * H + c]);
// Block-local shift: row 0 of every block reads zero, never the previous block.
const float prev = t > 0 ? float(x[(row - 1) * H + c]) : 0.0f;
y[row * H + c] = static_cast<T>(c0 * cur + c1 * prev);
