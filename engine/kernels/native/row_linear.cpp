// A float32 linear layer for the few activation rows of decoding and verification, y = x W^T + b.
//
// Why: at one to a few rows per call a linear layer only streams its weights, and the BLAS GEMM's
// small-M path reads them less efficiently than its M = 1 path (a 5-token verify forward cost 1.74
// single steps). Here every weight row is read once per call and dotted with every activation row
// while it sits in L1, so a verify forward over a few tokens costs little more than one token.
//
// Row-exact: each output y[i, n] is computed the same way whatever the number of rows M: one
// accumulator vector over K in order, the same horizontal sum, then the bias. A verify forward's rows
// are then bit for bit the one-token step's, which keeps speculative decoding's greedy output the
// target's own.
//
// Code paths: AVX-512 and AVX2 (chosen by the caller from the CPU's features). More rows than a path's
// max_rows (a long prompt) go to the BLAS GEMM, where it is the faster one.
//
// AVX2 prefetches: with two or more rows, the FMAs of one group of weight rows took as long as
// streaming it, and the two did not overlap (an AMD Zen 1 core issues one 256-bit FMA a cycle), so a
// 4-token verify forward cost 1.4 single steps and an 8-token one 1.9. The first pass over a group
// now asks for the next group and the second pass for the one after, and a verify forward of up to
// five tokens costs about one step (eight: about 1.5).
//
// AVX2, one row (every decoding step): eight weight rows at a time, in groups of 48, prefetching 16
// rows ahead, streamed the built-in model's layers 4 % faster than four rows in groups of 12 (27.9
// against 26.8 GB/s, interleaved runs on a quiet 2-core Zen 1; within the noise on a busy host).
// Each output is still computed as above, so rows stay bit for bit the same.
//
// AVX-512 prefetches (a 2-core Zen 4; the built-in model's 121 weight matrices as the fast path runs
// them; medians of 9 interleaved runs on a busy host): reading four weight rows side by side is four
// streams of memory 2.3 KB apart, which this CPU's own prefetchers served worse than one stream (one
// row at a time was faster at one activation row, but then each FMA needs its own load of the
// activations). Every pass now asks for the four rows 24 rows on, in address order, into L2 (T1;
// into L1 it was slower than none). 1 / 2 / 3 / 4 / 5 / 6 / 8 / 16 activation rows then cost 25.0 /
// 23.8 / 23.3 / 24.3 / 24.6 / 25.9 / 30.9 / 44.4 ms, against 28.7 / 31.4 / 30.7 / 34.7 / 37.3 / 39.8 /
// 51.3 / 66.5 ms unprefetched, same run: a verify forward of up to six tokens costs about one step.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels.h"
#include "simd_common.h"

namespace {

// At most this many activation rows take the kernel (row_linear.EXACT_ROWS); more go to the BLAS GEMM.
// AVX-512 (a 2-core Zen 4, the built-in model's 120 layer matrices against MKL's GEMM, same run): the
// kernel took 0.43 / 0.56 / 0.68 / 0.84 / 0.80-0.97 / 0.93-1.18 of the GEMM's time at 8 / 16 / 32 / 64 /
// 128 / 256 rows, so a short prompt, a wide token tree or a long verify forward runs on it too. The AVX2
// path, run on the same CPU, was at par with the GEMM at about 20 rows, and it keeps 16.
constexpr int64_t kMaxRows512 = 128;
constexpr int64_t kMaxRows256 = 16;
constexpr int64_t kChunk = 8;      // activation rows per pass over a group of weight rows, at most
constexpr int64_t kGroup = 12;     // weight rows per group (a multiple of every R below)
constexpr int64_t kAheadRows = kGroup;  // AVX2: how far ahead of the weight rows in use a pass prefetches
constexpr int64_t kAhead512 = 24;       // AVX-512: the same, for every pass and for one activation row
constexpr int64_t kOneRowGroup = 48;     // one activation row: weight rows per group
constexpr int64_t kOneRowAhead = 16;     // AVX2, one activation row: how far ahead of the rows in use it prefetches
constexpr int64_t kTaskWeights = 32768;  // weights per parallel task, at the least: a small layer runs on
                                          // one thread, where waking the other costs more than it saves

#ifdef TANDEM_X86

// ---- AVX-512: 16 lanes ---------------------------------------------------------------------------

// Weight rows [r, r + R) against activation rows [i, i + C), K tail masked into the same accumulator.
template <int R, int C>
__attribute__((target(TANDEM_AVX512))) inline void block512(const float* x, const float* w, const float* bias,
                                                           int64_t k, int64_t n, int64_t r, int64_t i, float* out,
                                                           int64_t ahead) {
  if (r + R + ahead > n) ahead = 0;  // the matrix's last rows: nothing past them to ask for
  __m512 acc[R][C];
  for (int a = 0; a < R; ++a)
    for (int c = 0; c < C; ++c) acc[a][c] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    __m512 xv[C];
    for (int c = 0; c < C; ++c) {
      xv[c] = _mm512_loadu_ps(x + (i + c) * k + j);
      // keep the activations in registers: folded into each FMA they would be loaded R times, and
      // loads, not FMAs, then bound the loop (CPUs with one 512-bit load a cycle)
      asm volatile("" : "+v"(xv[c]));
    }
    if (ahead) {  // R lines a step, in address order, of the R rows `ahead` on: into L2 (see the top)
      const char* next = reinterpret_cast<const char*>(w + (r + ahead) * k) + (j / 16) * R * 64;
      for (int a = 0; a < R; ++a) _mm_prefetch(next + a * 64, _MM_HINT_T1);
    }
    for (int a = 0; a < R; ++a) {
      const __m512 wv = _mm512_loadu_ps(w + (r + a) * k + j);
      for (int c = 0; c < C; ++c) acc[a][c] = _mm512_fmadd_ps(wv, xv[c], acc[a][c]);
    }
  }
  if (j < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - j)) - 1);
    __m512 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = _mm512_maskz_loadu_ps(mask, x + (i + c) * k + j);
    for (int a = 0; a < R; ++a) {
      const __m512 wv = _mm512_maskz_loadu_ps(mask, w + (r + a) * k + j);
      for (int c = 0; c < C; ++c) acc[a][c] = _mm512_fmadd_ps(wv, xv[c], acc[a][c]);
    }
  }
  for (int a = 0; a < R; ++a)
    for (int c = 0; c < C; ++c)
      out[(i + c) * n + r + a] = _mm512_reduce_add_ps(acc[a][c]) + (bias ? bias[r + a] : 0.f);
}

// ---- AVX2: 8 lanes -------------------------------------------------------------------------------

// `ahead`: prefetch the weight rows that far past [r, r + R) (0: none), one cache line per row and step.
template <int R, int C>
__attribute__((target(TANDEM_AVX2))) inline void block256(const float* x, const float* w, const float* bias,
                                                         int64_t k, int64_t n, int64_t r, int64_t i, float* out,
                                                         int64_t ahead) {
  if (r + R + ahead > n) ahead = 0;  // the matrix's last rows: nothing past them to ask for
  __m256 acc[R][C];
  for (int a = 0; a < R; ++a)
    for (int c = 0; c < C; ++c) acc[a][c] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(x + (i + c) * k + j);
    if (ahead && (j & 15) == 0)  // one 64-byte line is 16 floats
      for (int a = 0; a < R; ++a) _mm_prefetch(reinterpret_cast<const char*>(w + (r + a + ahead) * k + j), _MM_HINT_T0);
    for (int a = 0; a < R; ++a) {
      const __m256 wv = _mm256_loadu_ps(w + (r + a) * k + j);
      for (int c = 0; c < C; ++c) acc[a][c] = _mm256_fmadd_ps(wv, xv[c], acc[a][c]);
    }
  }
  for (int a = 0; a < R; ++a) {
    for (int c = 0; c < C; ++c) {
      float total = hsum8(acc[a][c]);
      for (int64_t t = j; t < k; ++t) total += w[(r + a) * k + t] * x[(i + c) * k + t];
      out[(i + c) * n + r + a] = total + (bias ? bias[r + a] : 0.f);
    }
  }
}

#endif

using Block = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);

// The kernels for one code path: weight rows dotted together (R) and activation rows per pass (c)
// are chosen so that the R * c accumulators stay in registers: with AVX-512 (32 registers) the c
// activation vectors and a weight vector as well; with AVX2 (16) the activations are FMA operands.
struct Kernels {
  int64_t max_rows;                // at most this many activation rows take the kernel (row_linear.EXACT_ROWS)
  int64_t pass[kChunk + 1];        // activation rows of the next pass when this many (up to kChunk) remain
  int64_t rows[kChunk + 1];        // R for a pass of c activation rows
  Block block[kChunk + 1];         // the kernel for R rows and c activation rows
  Block single[kChunk + 1];        // the kernel for 1 weight row (a group's tail) and c activation rows
  int64_t ahead_rows;              // passes over several activation rows prefetch the weight rows that far
                                   // ahead in a first pass, twice that in later ones (0: none)
  Block one_row;                   // one activation row: one_row_rows weight rows at a time, or none
  int64_t one_row_rows;
  int64_t one_row_ahead;           // ... prefetching that many weight rows ahead (0: none)
};

#ifdef TANDEM_X86
Kernels avx512_kernels() {
  return Kernels{kMaxRows512,
                 {0, 1, 2, 3, 4, 5, 6, 7, 8},
                 {0, 4, 4, 4, 4, 4, 4, 2, 2},
                 {nullptr, block512<4, 1>, block512<4, 2>, block512<4, 3>, block512<4, 4>, block512<4, 5>,
                  block512<4, 6>, block512<2, 7>, block512<2, 8>},
                 {nullptr, block512<1, 1>, block512<1, 2>, block512<1, 3>, block512<1, 4>, block512<1, 5>,
                  block512<1, 6>, block512<1, 7>, block512<1, 8>},
                 kAhead512,
                 block512<4, 1>,
                 4,
                 kAhead512};
}

// Five rows in one pass (2 x 5 accumulators); six to eight in two passes of three or four.
Kernels avx2_kernels() {
  return Kernels{kMaxRows256,
                 {0, 1, 2, 3, 4, 5, 3, 4, 4},
                 {0, 4, 4, 4, 3, 2, 0, 0, 0},
                 {nullptr, block256<4, 1>, block256<4, 2>, block256<4, 3>, block256<3, 4>, block256<2, 5>, nullptr,
                  nullptr, nullptr},
                 {nullptr, block256<1, 1>, block256<1, 2>, block256<1, 3>, block256<1, 4>, block256<1, 5>, nullptr,
                  nullptr, nullptr},
                 kAheadRows,
                 block256<8, 1>,
                 8,
                 kOneRowAhead};
}
#endif

}  // namespace

torch::Tensor row_linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                         const std::string& path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "row_linear: x must be [M, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32 && weight.size(1) == x.size(1),
              "row_linear: weight must be [N, K] float32");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  const bool has_bias = bias.has_value() && bias->defined();
  Kernels kernels{};
#ifdef TANDEM_X86
  if (path == "avx512")
    kernels = avx512_kernels();
  else if (path == "avx2")
    kernels = avx2_kernels();
  else
#endif
    TORCH_CHECK(false, "row_linear: no code path '", path, "' in this build");
  if (m > kernels.max_rows) return has_bias ? at::addmm(*bias, x, weight.t()) : at::mm(x, weight.t());
  const torch::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const torch::Tensor bc = has_bias ? bias->contiguous() : torch::Tensor();
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  const float* bp = has_bias ? bc.data_ptr<float>() : nullptr;
  torch::Tensor y = torch::empty({m, n}, x.options());
  float* out = y.data_ptr<float>();
  if (m == 1 && kernels.one_row != nullptr) {
    const int64_t step = kernels.one_row_rows;
    const int64_t one_grain = std::max<int64_t>(1, kTaskWeights / (kOneRowGroup * k));
    at::parallel_for(0, (n + kOneRowGroup - 1) / kOneRowGroup, one_grain, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const int64_t r1 = std::min(n, (g + 1) * kOneRowGroup);
        int64_t r = g * kOneRowGroup;
        for (; r + step <= r1; r += step) kernels.one_row(xp, wp, bp, k, n, r, 0, out, kernels.one_row_ahead);
        for (; r < r1; ++r) kernels.single[1](xp, wp, bp, k, n, r, 0, out, 0);
      }
    });
    return y;
  }
  const int64_t grain = std::max<int64_t>(1, kTaskWeights / (kGroup * k));
  at::parallel_for(0, (n + kGroup - 1) / kGroup, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t r0 = g * kGroup, r1 = std::min(n, r0 + kGroup);
      for (int64_t i = 0, passes = 0; i < m; ++passes) {
        const int64_t c = kernels.pass[std::min(kChunk, m - i)], step = kernels.rows[c];
        // the first pass asks for the rows ahead_rows on (AVX2: the next group), a later one twice as far
        const int64_t ahead = m > 1 ? kernels.ahead_rows * std::min<int64_t>(passes + 1, 2) : 0;
        int64_t r = r0;
        for (; r + step <= r1; r += step) kernels.block[c](xp, wp, bp, k, n, r, i, out, ahead);
        for (; r < r1; ++r) kernels.single[c](xp, wp, bp, k, n, r, i, out, 0);
        i += c;
      }
    }
  });
  return y;
}

TORCH_LIBRARY(tandem_row_linear, lib) {
  lib.def("linear(Tensor x, Tensor weight, Tensor? bias, str path) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem_row_linear, CPU, lib) { lib.impl("linear", row_linear); }
