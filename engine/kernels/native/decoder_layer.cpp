// One Llama/Qwen2 decoder layer in one call, for decoding, verification and short prompts: float32 weights
// on row_linear.cpp, 4- and 8-bit blocks on block_quant.cpp (a quantized draft), or a GGUF file's own
// blocks on gguf_quant.cpp (a GGUF target), activations float32.
//
// Why: at one token a step of the built-in model is 30 layers of a few hundred-row matmuls and about
// ten small ops around them per layer (two norms, RoPE, the cache writes, attention, SiLU, two
// residual adds). Each op is a call from the compiled graph's Python wrapper or from eager PyTorch,
// and those calls, not the arithmetic, cost milliseconds a step: the uncompiled float target spent
// about 5 ms of a 19 ms step between its matmuls, the compiled one about 1.5 ms, the INT8 draft 1.4 ms
// of 6.5. Here a layer is one call: its matmuls are the row or block kernel's, its attention
// attention.cpp's, and everything between them is done in place on the rows.
//
// Row-exact, as the float kernels it calls: every row's norm, RoPE, SiLU and residual add is computed the
// same way whatever the number of rows, so a verify forward's rows stay bit for bit the one-token
// steps' results and speculative decoding's greedy output the target's own.
//
// x: [T, C]; caches [1, KV, S, D] float32 or float16, written at `slots` (the new keys after RoPE, and the
// values, rounded to float16 as torch's own conversion rounds: to nearest, ties to even);
// cos, sin_signed: [T, D] (rotate_half's sign folded into sin); lengths [T] or mask [T, W] as in
// attention.cpp. Returns the layer's output [T, C].

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"
#include "simd_common.h"

namespace {

constexpr int64_t kTaskValues = 16384;  // values per parallel task, at the least: a few rows run on one thread

// weight * (x * 1/sqrt(mean(x^2) + eps)), as the model's RMSNorm, with the squares summed on 8 lanes in order.
void rms_norm_row(const float* x, const float* weight, float eps, int64_t c, float* out) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= c; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += x[i + l] * x[i + l];
  for (int l = 0; i < c; ++i, ++l) lanes[l] += x[i] * x[i];
  float total = 0.f;
  for (float lane : lanes) total += lane;
  const float scale = 1.f / std::sqrt(total / static_cast<float>(c) + eps);
  for (i = 0; i < c; ++i) out[i] = weight[i] * (x[i] * scale);
}

// x * cos + roll(x, D/2) * sin_signed over one head's D values.
void rope_head(const float* x, const float* cos, const float* sin_signed, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) out[i] = x[i] * cos[i] + x[(i + half) % d] * sin_signed[i];
}

// One head's D values into a cache row, as they are or rounded to float16.
void store_head(const float* values, int64_t d, float* out) { std::copy(values, values + d, out); }
void store_head(const float* values, int64_t d, at::Half* out) {
  for (int64_t i = 0; i < d; ++i) out[i] = at::Half(values[i]);
}

// The new keys (after RoPE) and values of one token into every KV head's row at cache slot `slot`.
template <typename T>
void write_kv(const float* row, const float* cos, const float* sin_signed, int64_t heads, int64_t kv_heads,
              int64_t d, int64_t cache_slots, int64_t slot, float* roped, T* k_cache, T* v_cache) {
  for (int64_t kv = 0; kv < kv_heads; ++kv) {
    const int64_t at = (kv * cache_slots + slot) * d;
    rope_head(row + (heads + kv) * d, cos, sin_signed, d, roped);
    store_head(roped, d, k_cache + at);
    store_head(row + (heads + kv_heads + kv) * d, d, v_cache + at);
  }
}

#ifdef TANDEM_X86
// silu(gate) * up, 8 lanes at a time; a last partial block goes through the same lanes.
__attribute__((target(TANDEM_AVX2))) void silu_mul_row(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t j = 0; j < n; j += 8) {
    alignas(32) float g[8] = {0.f}, u[8] = {0.f}, y[8];
    const int64_t width = std::min<int64_t>(8, n - j);
    std::copy(gate + j, gate + j + width, g);
    std::copy(up + j, up + j + width, u);
    const __m256 gv = _mm256_load_ps(g);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    _mm256_store_ps(y, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_load_ps(u)));
    std::copy(y, y + width, out + j);
  }
}
#endif

constexpr int64_t kGGUF = -1;  // `bits` of projections on a GGUF file's own blocks (gguf_quant.cpp)

// x W^T + b: W is [weight] for the float row kernel (bits 0), [qweight, scales, mins] in 4- or 8-bit
// blocks (block_quant.cpp; its bias added after, as engine.kernels.block_quant.BlockQuantLinear does), or
// (bits kGGUF) GGUF block parts of block types `types`, side by side.
torch::Tensor project(const torch::Tensor& x, at::TensorList weight, const c10::optional<torch::Tensor>& bias,
                      int64_t bits, at::IntArrayRef types, const std::string& path) {
  if (bits == kGGUF) {
    torch::Tensor y = gguf_linear(x, weight, types, path);
    if (bias.has_value() && bias->defined()) y.add_(*bias);
    return y;
  }
  if (bits == 0) {
    TORCH_CHECK(weight.size() == 1, "decoder layer: a float projection is one weight");
    return row_linear(x, weight[0], bias, path);
  }
  TORCH_CHECK(weight.size() == 3, "decoder layer: a block-quantized projection is codes, scales and mins");
  torch::Tensor y = block_quant_linear(x, weight[0], weight[1], weight[2], bits, path);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

int64_t out_features(at::TensorList weight, int64_t bits) {
  if (bits == kGGUF) {
    int64_t rows = 0;
    for (const torch::Tensor& part : weight) rows += part.size(0);
    return rows;
  }
  return bits == 0 ? weight[0].size(0) : weight[1].size(0);  // the scales are [N, K/32]
}

template <typename Fn>
void for_rows(int64_t rows, int64_t width, const Fn& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kTaskValues / std::max<int64_t>(1, width)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t t = begin; t < end; ++t) fn(t);
                   });
}

torch::Tensor decoder_layer(const torch::Tensor& x_in, const torch::Tensor& input_norm, const torch::Tensor& post_norm,
                            double eps, at::TensorList qkv_weight, const c10::optional<torch::Tensor>& qkv_bias,
                            at::TensorList o_weight, const c10::optional<torch::Tensor>& o_bias,
                            at::TensorList gate_up_weight, at::TensorList down_weight,
                            const c10::optional<torch::Tensor>& down_bias, int64_t bits, at::IntArrayRef types,
                            const torch::Tensor& cos_in,
                            const torch::Tensor& sin_in, torch::Tensor& k_cache, torch::Tensor& v_cache,
                            const torch::Tensor& slots_in, const c10::optional<torch::Tensor>& lengths,
                            const c10::optional<torch::Tensor>& mask, int64_t n_heads, const std::string& path) {
#ifndef TANDEM_X86
  TORCH_CHECK(false, "decoder layer: this build has no x86 code path");
#else
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == torch::kFloat, "decoder layer: x must be [T, C] float32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "decoder layer: the caches must be contiguous [1, KV, S, D]");
  const bool half_cache = k_cache.scalar_type() == torch::kHalf;
  TORCH_CHECK((half_cache || k_cache.scalar_type() == torch::kFloat) && v_cache.scalar_type() == k_cache.scalar_type(),
              "decoder layer: the caches must be float32 or float16, both alike");
  const torch::Tensor x = x_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const torch::Tensor slots = slots_in.to(torch::kLong).contiguous();
  const int64_t tokens = x.size(0), c = x.size(1);
  const int64_t kv_heads = k_cache.size(1), cache_slots = k_cache.size(2), d = k_cache.size(3);
  const int64_t heads = n_heads, qkv_heads = heads + 2 * kv_heads;
  TORCH_CHECK(heads % kv_heads == 0 && out_features(qkv_weight, bits) == qkv_heads * d,
              "decoder layer: head counts do not match");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == tokens && cos.size(1) == d && slots.numel() == tokens,
              "decoder layer: cos, sin and slots need one row per token");
  TORCH_CHECK(out_features(gate_up_weight, bits) % 2 == 0, "decoder layer: gate/up must have an even width");
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < cache_slots, "decoder layer: a slot is outside the cache");
  const float* xp = x.data_ptr<float>();
  const float norm_eps = static_cast<float>(eps);
  // GGUF projections: `types` lists every part's block type, qkv's first, then o's, gate/up's, down's
  const int64_t counts[4] = {static_cast<int64_t>(qkv_weight.size()), static_cast<int64_t>(o_weight.size()),
                             static_cast<int64_t>(gate_up_weight.size()), static_cast<int64_t>(down_weight.size())};
  TORCH_CHECK(bits != kGGUF || static_cast<int64_t>(types.size()) == counts[0] + counts[1] + counts[2] + counts[3],
              "decoder layer: one block type per GGUF part");
  const at::IntArrayRef qkv_types = bits == kGGUF ? types.slice(0, counts[0]) : types;
  const at::IntArrayRef o_types = bits == kGGUF ? types.slice(counts[0], counts[1]) : types;
  const at::IntArrayRef gate_up_types = bits == kGGUF ? types.slice(counts[0] + counts[1], counts[2]) : types;
  const at::IntArrayRef down_types = bits == kGGUF ? types.slice(counts[0] + counts[1] + counts[2], counts[3]) : types;

  torch::Tensor h = torch::empty({tokens, c}, x.options());
  float* hp = h.data_ptr<float>();
  const float* in_w = input_norm.data_ptr<float>();
  for_rows(tokens, c, [&](int64_t t) { rms_norm_row(xp + t * c, in_w, norm_eps, c, hp + t * c); });
  const torch::Tensor qkv = project(h, qkv_weight, qkv_bias, bits, qkv_types, path);  // [T, (H + 2 KV) D]

  torch::Tensor q = torch::empty({tokens, heads, d}, x.options());
  const float* qkvp = qkv.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  for_rows(tokens, qkv_heads * d, [&](int64_t t) {
    const float* row = qkvp + t * qkv_heads * d;
    const float *ct = cp + t * d, *st = snp + t * d;
    for (int64_t head = 0; head < heads; ++head) rope_head(row + head * d, ct, st, d, qp + (t * heads + head) * d);
    std::vector<float> roped(d);
    if (half_cache) {
      write_kv(row, ct, st, heads, kv_heads, d, cache_slots, sp[t], roped.data(), k_cache.data_ptr<at::Half>(),
               v_cache.data_ptr<at::Half>());
    } else {
      write_kv(row, ct, st, heads, kv_heads, d, cache_slots, sp[t], roped.data(), k_cache.data_ptr<float>(),
               v_cache.data_ptr<float>());
    }
  });
  const torch::Tensor attended = row_attention(q, k_cache, v_cache, lengths, mask);  // [T, H, D]

  torch::Tensor mid = project(attended.view({tokens, heads * d}), o_weight, o_bias, bits, o_types, path);  // + x below
  float* mp = mid.data_ptr<float>();
  const float* post_w = post_norm.data_ptr<float>();
  for_rows(tokens, c, [&](int64_t t) {
    for (int64_t i = 0; i < c; ++i) mp[t * c + i] = xp[t * c + i] + mp[t * c + i];
    rms_norm_row(mp + t * c, post_w, norm_eps, c, hp + t * c);
  });
  const torch::Tensor gate_up = project(h, gate_up_weight, c10::nullopt, bits, gate_up_types, path);  // [T, 2I]
  const int64_t inner = gate_up.size(1) / 2;
  torch::Tensor act = torch::empty({tokens, inner}, x.options());
  const float* gup = gate_up.data_ptr<float>();
  float* ap = act.data_ptr<float>();
  for_rows(tokens, 2 * inner,
           [&](int64_t t) { silu_mul_row(gup + t * 2 * inner, gup + t * 2 * inner + inner, inner, ap + t * inner); });
  torch::Tensor out = project(act, down_weight, down_bias, bits, down_types, path);
  float* op = out.data_ptr<float>();
  for_rows(tokens, c, [&](int64_t t) {
    for (int64_t i = 0; i < c; ++i) op[t * c + i] = mp[t * c + i] + op[t * c + i];
  });
  return out;
#endif
}

}  // namespace

TORCH_LIBRARY(tandem_layer, lib) {
  lib.def(
      "decoder_layer(Tensor x, Tensor input_norm, Tensor post_norm, float eps, Tensor[] qkv_weight, "
      "Tensor? qkv_bias, Tensor[] o_weight, Tensor? o_bias, Tensor[] gate_up_weight, Tensor[] down_weight, "
      "Tensor? down_bias, int bits, int[] types, Tensor cos, Tensor sin_signed, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, "
      "Tensor? lengths, Tensor? mask, int n_heads, str path) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem_layer, CPU, lib) { lib.impl("decoder_layer", decoder_layer); }
