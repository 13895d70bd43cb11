// Attention of a few query rows over the static KV cache, each row on its own, for decoding and verification.
//
// Why: a verify forward's rows must round as one-token steps do (see engine/runtime/attention.py),
// which SDPA only gives with one call per row and layer: 5 tokens x 30 layers is 150 calls a
// forward, each paying dispatch and BLAS set-up for a 64-wide dot product over a few hundred slots.
// Here one call per layer computes every (head, token) row, and each row's arithmetic is the same
// whatever the number of rows: scores in slot order, the same max, the same sum of exponentials,
// the same weighted sum of values. A verify row is then bit for bit the one-token step's, and a
// token tree's rows too (a row skips the slots its mask hides, which a one-token step never had).
//
// q: [T, H, D], k/v caches: [1, KV, S, D] (query head h reads KV head h / (H / KV)),
// lengths: [T] (row t sees slots [0, lengths[t])) or mask: [T, W] bool (row t sees slot j where
// mask[t][j]). Returns [T, H, D]. AVX2 + FMA (+ F16C for a float16 cache), D in {32, 64, 96, 128}; the
// caller checks both.
//
// The caches are float32 or float16 (the fast path keeps float16: half the memory and the bytes read per
// step). A float16 value widens to float32 exactly, so every row still computes alike.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "simd_common.h"

namespace {

constexpr int64_t kTaskSlots = 2048;  // slots x rows per parallel task, at the least: a short context
                                      // runs on one thread, where waking the other costs more

#ifdef TANDEM_X86

// 8 cache values as float32 lanes: loaded as they are, or widened from float16 (exact).
__attribute__((target(TANDEM_AVX2))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target(TANDEM_AVX2_F16C))) inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The dot products of q with 8 consecutive key rows, one lane each, every lane summed the same way.
template <int L, typename T>  // L = D / 8; T: the cache's element type
__attribute__((target(TANDEM_AVX2_F16C))) inline __m256 scores8(const float* q, const T* k) {
  __m256 a[8];
  for (int s = 0; s < 8; ++s) a[s] = _mm256_setzero_ps();
  for (int i = 0; i < L; ++i) {
    const __m256 qv = _mm256_loadu_ps(q + 8 * i);
    for (int s = 0; s < 8; ++s) a[s] = _mm256_fmadd_ps(qv, load8(k + s * 8 * L + 8 * i), a[s]);
  }
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// One query row over the visible slots [0, length) of one KV head: `visible` is null (all of them)
// or a mask row. `weights` holds `length` rounded up to 8 floats; `pad` holds 8 key rows, for a last
// block that would read past the cache's `slots`.
template <int L, typename T>
__attribute__((target(TANDEM_AVX2_F16C))) void attend_row(const float* q, const T* k, const T* v, int64_t length,
                                                         int64_t slots, const bool* visible, float scale,
                                                         float* weights, T* pad, float* out) {
  constexpr int64_t d = 8 * L;
  const __m256 scale8 = _mm256_set1_ps(scale), minus_inf = _mm256_set1_ps(-INFINITY);
  __m256 top8 = minus_inf;
  for (int64_t j = 0; j < length; j += 8) {
    const T* kj = k + j * d;
    if (j + 8 > slots) {  // the cache's last keys, then zeros, so that the block reads no further
      std::fill(pad, pad + 8 * d, T(0.f));
      std::copy(kj, kj + (slots - j) * d, pad);
      kj = pad;
    }
    __m256 s = _mm256_mul_ps(scores8<L, T>(q, kj), scale8);
    if (visible != nullptr || j + 8 > length) {
      alignas(32) float hide[8];
      for (int u = 0; u < 8; ++u)
        hide[u] = (j + u >= length || (visible != nullptr && !visible[j + u])) ? -1.f : 0.f;
      s = _mm256_blendv_ps(s, minus_inf, _mm256_load_ps(hide));
    }
    _mm256_storeu_ps(weights + j, s);
    top8 = _mm256_max_ps(top8, s);
  }
  alignas(32) float tops[8];
  _mm256_store_ps(tops, top8);
  float top = tops[0];
  for (int u = 1; u < 8; ++u) top = std::max(top, tops[u]);
  const __m256 top_b = _mm256_set1_ps(top);
  for (int64_t j = 0; j < length; j += 8) {
    const __m256 s = _mm256_loadu_ps(weights + j);
    const __m256 hidden = _mm256_cmp_ps(s, minus_inf, _CMP_EQ_OQ);
    _mm256_storeu_ps(weights + j, _mm256_andnot_ps(hidden, exp8(_mm256_sub_ps(s, top_b))));
  }
  // The sum in slot order, one at a time: a token tree's row (its hidden slots adding zeros) sums
  // exactly as the one-token step over the same slots, packed, does. It runs beside the FMAs.
  float total = 0.f;
  __m256 acc[L];
  for (int i = 0; i < L; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < length; ++j) {
    total += weights[j];
    if (visible != nullptr && weights[j] == 0.f) continue;  // hidden: adding zeros changes nothing
    const __m256 p = _mm256_set1_ps(weights[j]);
    for (int i = 0; i < L; ++i) acc[i] = _mm256_fmadd_ps(p, load8(v + j * d + 8 * i), acc[i]);
  }
  const __m256 inv = _mm256_set1_ps(1.f / total);
  for (int i = 0; i < L; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], inv));
}

template <typename T>
using RowFn = void (*)(const float*, const T*, const T*, int64_t, int64_t, const bool*, float, float*, T*, float*);

template <typename T>
RowFn<T> row_fn(int64_t d) {
  switch (d) {
    case 32: return attend_row<4, T>;
    case 64: return attend_row<8, T>;
    case 96: return attend_row<12, T>;
    case 128: return attend_row<16, T>;
    default: return nullptr;
  }
}

// Every (head, token) row over caches of element type T; see row_attention for the arguments.
template <typename T>
void attend_all(const float* qp, const T* kp, const T* vp, const int64_t* lp, const bool* mp, int64_t tokens,
                int64_t heads, int64_t kv_heads, int64_t slots, int64_t d, int64_t width, float* yp) {
  const RowFn<T> attend_one = row_fn<T>(d);
  const bool masked = mp != nullptr;
  const int64_t group = heads / kv_heads, rows = tokens * heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t span = masked ? width : lp[tokens - 1];
  const int64_t grain = std::max<int64_t>(1, kTaskSlots / std::max<int64_t>(1, span));
  // Rows ordered head-major, so that the rows reading one KV head run together while it is in cache.
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> weights((masked ? width : slots) + 8);
    std::vector<T> pad(8 * d);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t h = r / tokens, t = r % tokens, kv = h / group;
      const T* kh = kp + kv * slots * d;
      const T* vh = vp + kv * slots * d;
      const int64_t length = masked ? width : lp[t];
      attend_one(qp + (t * heads + h) * d, kh, vh, length, slots, masked ? mp + t * width : nullptr, scale,
                 weights.data(), pad.data(), yp + (t * heads + h) * d);
    }
  });
}

#endif  // TANDEM_X86

}  // namespace

torch::Tensor row_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const c10::optional<torch::Tensor>& lengths, const c10::optional<torch::Tensor>& mask) {
#ifndef TANDEM_X86
  TORCH_CHECK(false, "attention: this build has no x86 code path");
#else
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "attention: q must be [T, H, D] and the caches [1, KV, S, D]");
  const bool half = k_cache.scalar_type() == torch::kHalf;
  TORCH_CHECK(q.scalar_type() == torch::kFloat && (half || k_cache.scalar_type() == torch::kFloat) &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "attention: q must be float32 and the caches float32 or float16, both alike");
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), slots = k_cache.size(2);
  TORCH_CHECK(k_cache.size(0) == 1 && k_cache.size(3) == d && heads % kv_heads == 0,
              "attention: shapes do not match");
  TORCH_CHECK(row_fn<float>(d) != nullptr, "attention: head size ", d, " is not 32, 64, 96 or 128");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "attention: the caches must be contiguous");
  const bool masked = mask.has_value();
  TORCH_CHECK(masked || lengths.has_value(), "attention: give each row's length or a mask");
  torch::Tensor lens = masked ? torch::Tensor() : lengths->to(torch::kLong).contiguous();
  torch::Tensor m;
  if (masked) {
    m = mask->to(torch::kBool).contiguous();
    TORCH_CHECK(m.dim() == 2 && m.size(0) == tokens && m.size(1) <= slots, "attention: mask must be [T, W <= S]");
  } else {
    TORCH_CHECK(lens.numel() == tokens, "attention: lengths must hold one length per token");
  }
  const int64_t* lp = masked ? nullptr : lens.data_ptr<int64_t>();
  const int64_t width = masked ? m.size(1) : 0;
  for (int64_t t = 0; t < tokens && !masked; ++t)
    TORCH_CHECK(lp[t] >= 1 && lp[t] <= slots, "attention: a row's length is outside the cache");
  const bool* mp = masked ? m.data_ptr<bool>() : nullptr;
  const torch::Tensor qc = q.contiguous();
  const float* qp = qc.data_ptr<float>();
  torch::Tensor y = torch::empty({tokens, heads, d}, q.options());
  float* yp = y.data_ptr<float>();
  if (half) {
    attend_all<at::Half>(qp, k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>(), lp, mp, tokens, heads,
                         kv_heads, slots, d, width, yp);
  } else {
    attend_all<float>(qp, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), lp, mp, tokens, heads, kv_heads,
                      slots, d, width, yp);
  }
  return y;
#endif
}

TORCH_LIBRARY(tandem_attention, lib) {
  lib.def("attend(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? lengths, Tensor? mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem_attention, CPU, lib) { lib.impl("attend", row_attention); }
