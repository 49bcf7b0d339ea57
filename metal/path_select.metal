// Candidate-path selection in one launch (twin: selector.path_select_ops).
// Body for mx.fast.metal_kernel; MLX generates the signature.
//   inputs : unary [N, K] f32, pred_ids [N, K] i32, cand_ids [N, K] i32,
//            gate [N, R], pred_codebook [Va, R], succ_codebook [Vb, R],
//            temperature [1] f32 (0 = greedy), uniforms [N] f32
//   outputs: picks [N] i32, q_rows [N, K] f32, lattice [N, K, K] f32 (scratch)
//   launch : ONE threadgroup, grid == threadgroup (any size; 256 on Metal).
// The walk is a sequential chain over positions, and threadgroups cannot wait
// for each other, so scoring and walking share a single threadgroup.
const uint N = unary_shape[0];
const uint K = unary_shape[1];
const uint R = gate_shape[1];
const uint tid = thread_index_in_threadgroup;
const uint nthreads =
    threads_per_threadgroup.x * threads_per_threadgroup.y * threads_per_threadgroup.z;

// Phase 1: all threads score a strided share of the N*K*K lattice entries,
// S_t[p, c] = unary[t, c] + sum_j A[pred_t,p][j] * gate[t][j] * B[cand_t,c][j],
// in fp32 with a sequential sum over j (the twin gathers and uses a matmul).
const uint total = N * K * K;
for (uint s = tid; s < total; s += nthreads) {
  const uint t = s / (K * K);
  const uint p = (s / K) % K;
  const uint c = s % K;
  const size_t a_row = size_t(pred_ids[t * K + p]) * R;
  const size_t b_row = size_t(cand_ids[t * K + c]) * R;
  const size_t g_row = size_t(t) * R;
  float acc = 0.0f;
  for (uint j = 0; j < R; ++j) {
    const float gated = float(pred_codebook[a_row + j]) * float(gate[g_row + j]);
    acc += gated * float(succ_codebook[b_row + j]);
  }
  lattice[s] = unary[t * K + c] + acc;
}
threadgroup_barrier(mem_flags::mem_device);
if (tid != 0) {
  return;
}

// Phase 2: thread 0 walks the lattices; row t uses S_t[i_{t-1}, :], i_0 = 0.
const float temp = temperature[0];
uint prev = 0;
for (uint t = 0; t < N; ++t) {
  const size_t row = (size_t(t) * K + prev) * K;
  const size_t q = size_t(t) * K;
  if (temp == 0.0f) {
    // Greedy: strict '>' keeps the first maximum, i.e. ties go to the smallest index.
    uint best = 0;
    float best_score = lattice[row];
    for (uint c = 1; c < K; ++c) {
      if (lattice[row + c] > best_score) {
        best_score = lattice[row + c];
        best = c;
      }
    }
    for (uint c = 0; c < K; ++c) {
      q_rows[q + c] = c == best ? 1.0f : 0.0f;
    }
    prev = best;
  } else {
    // Sampled: q = softmax(S / T) (max-subtracted, scaled by 1/sum like MLX),
    // then inverse CDF: i_t = min(last, #{c : cdf[c] <= u_t}), `last` the last
    // candidate with q > 0. The fp32 CDF can end below 1 with u above it; a
    // plain clamp to K - 1 could pick a q that underflowed to 0, which
    // verification would then always accept.
    float m = lattice[row] / temp;
    for (uint c = 1; c < K; ++c) {
      const float v = lattice[row + c] / temp;
      m = v > m ? v : m;
    }
    float sum = 0.0f;
    for (uint c = 0; c < K; ++c) {
      const float e = metal::exp(lattice[row + c] / temp - m);
      q_rows[q + c] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    const float u = uniforms[t];
    float cdf = 0.0f;
    uint count = 0;
    uint last = 0;
    for (uint c = 0; c < K; ++c) {
      const float qc = q_rows[q + c] * inv;
      q_rows[q + c] = qc;
      cdf += qc;
      count += cdf <= u ? 1u : 0u;
      last = qc > 0.0f ? c : last;
    }
    prev = count < last ? count : last;
  }
  picks[t] = int(prev);
}
