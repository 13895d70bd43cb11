// Block-quantized linear layers for the CPU: weights in blocks of 32 with a float scale per block,
// activations quantized on the fly to INT8 blocks of 32 (one scale per block), integer dot products.
// This is the arithmetic of llama.cpp's Q4_1 x Q8_1 and Q8_0 x Q8_0 kernels.
//
// Layout. Blocks go in pairs (K is a multiple of 64). Within a pair the two blocks a and b are
// interleaved four bytes at a time: a0..a3 b0..b3 a4..a7 b4..b7 ... (64 values). A 32-bit lane of an
// integer dot product then always covers one block, lanes alternating a, b, so a pair's two scales
// broadcast as one [a, b, a, b, ...] vector.
//   8 bits: qweight [N, K] int8, the pairs' 64 interleaved values in a row. w = d*q.
//   4 bits: qweight [N, K/2] uint8, 32 bytes per pair: byte j holds interleaved value j in its low
//           nibble and value 32 + j in its high nibble. w = d*q + m, q in 0..15.
//   scales (d), mins (m, 4 bits only): [N, K/32] float32, in block order.
//
// y[i, n] = sum_b sx[i,b] * (d[n,b] * dot(q[n,b], xq[i,b]) + m[n,b] * sum(xq[i,b])),
// where x[i, block b] ~ sx[i,b] * xq[i,b], xq in -127..127.
//
// Up to 48 activation rows (decoding, verification) use integer dot products; each row's result is
// the same whatever the number of rows. More rows (a prompt) use a float GEMM on the weights
// dequantized a tile at a time: there the integer path's per-block float work costs more.
//
// Three code paths, chosen by the caller from the CPU's features: AVX-512 VNNI, AVX2, and portable
// C++. Callers check a model's result against the float model before using it.

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

constexpr int64_t kBlock = 32;
constexpr int64_t kPair = 64;
constexpr int64_t kIntegerRows = 48;  // more activation rows than this take the float GEMM (INTEGER_ROWS)
constexpr int64_t kTile = 256;        // weight rows dequantized at a time for it

// Position of value j (0..63) of a pair in block order: j's four-byte chunk alternates blocks.
inline int64_t pair_source(int64_t j) { return (j / 4 % 2) * kBlock + (j / 8) * 4 + j % 4; }

struct Activations {
  std::vector<int8_t> q;          // [M, K], -127..127, pairs interleaved like the weights
  std::vector<float> scale;       // [M, K/32]: x ~ scale * q, block by block
  std::vector<float> scaled_sum;  // [M, K/32]: scale * sum(q) over the block
};

Activations quantize_activations(const float* x, int64_t m, int64_t k) {
  const int64_t blocks = k / kBlock;
  Activations a{std::vector<int8_t>(m * k), std::vector<float>(m * blocks), std::vector<float>(m * blocks)};
  std::vector<int8_t> plain(kPair);
  for (int64_t p = 0; p < m * k / kPair; ++p) {
    for (int half = 0; half < 2; ++half) {
      const int64_t b = 2 * p + half;
      const float* src = x + b * kBlock;
      float amax = 0.f;
      for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
      const float inverse = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t j = 0; j < kBlock; ++j) {
        const int v = std::max(-127, std::min(127, static_cast<int>(std::lrintf(src[j] * inverse))));
        plain[half * kBlock + j] = static_cast<int8_t>(v);
        sum += v;
      }
      a.scale[b] = amax / 127.f;
      a.scaled_sum[b] = a.scale[b] * static_cast<float>(sum);
    }
    int8_t* dst = a.q.data() + p * kPair;
    for (int64_t j = 0; j < kPair; ++j) dst[j] = plain[pair_source(j)];
  }
  return a;
}

// Interleaved value j (0..63) of pair p in one row of the layout.
inline int stored_value(const uint8_t* row, int64_t bits, int64_t p, int64_t j) {
  if (bits == 8) return reinterpret_cast<const int8_t*>(row)[p * kPair + j];
  const uint8_t byte = row[p * 32 + j % 32];
  return j < 32 ? (byte & 0x0F) : (byte >> 4);
}

// ---- portable ----------------------------------------------------------------------------------

template <int BITS>
void rows_portable(const uint8_t* weights, const float* d, const float* mn, const Activations& a, int64_t m,
                   int64_t k, int64_t r0, int64_t r1, int64_t n, float* out) {
  const int64_t blocks = k / kBlock, row_bytes = BITS == 4 ? k / 2 : k;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.f;
      for (int64_t p = 0; p < k / kPair; ++p) {
        int32_t dot[2] = {0, 0};
        for (int64_t j = 0; j < kPair; ++j)
          dot[pair_source(j) / kBlock] += stored_value(weights + r * row_bytes, BITS, p, j) * a.q[i * k + p * kPair + j];
        for (int half = 0; half < 2; ++half) {
          const int64_t b = 2 * p + half;
          acc += a.scale[i * blocks + b] * d[r * blocks + b] * static_cast<float>(dot[half]);
          if (BITS == 4) acc += mn[r * blocks + b] * a.scaled_sum[i * blocks + b];
        }
      }
      out[i * n + r] = acc;
    }
  }
}

#ifdef TANDEM_X86

// The per-row terms outside the integer dot: the 4-bit offsets m, or -128 * sum(x) after dot(w + 128, x).
template <int BITS>
__attribute__((target(TANDEM_AVX2))) inline float row_offset(const float* d, const float* mn, const float* sums,
                                                             int64_t row, int64_t blocks, bool flipped) {
  if (BITS == 4) return dot_floats256(mn + row * blocks, sums, blocks);
  return flipped ? -128.f * dot_floats256(d + row * blocks, sums, blocks) : 0.f;
}

// quantize_activations with vector instructions, bit for bit the same: the same max, the same
// float products, rounded to nearest even as lrintf rounds by default. (One scalar value at a time
// it cost about a third of a millisecond per activation row and step of the built-in model.)
__attribute__((target(TANDEM_AVX2))) Activations quantize_activations_avx2(const float* x, int64_t m, int64_t k) {
  const int64_t blocks = k / kBlock;
  Activations a{std::vector<int8_t>(m * k), std::vector<float>(m * blocks), std::vector<float>(m * blocks)};
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i lowest = _mm256_set1_epi32(-127), highest = _mm256_set1_epi32(127);
  alignas(32) int32_t plain[2][kBlock];
  for (int64_t p = 0; p < m * k / kPair; ++p) {
    for (int half = 0; half < 2; ++half) {
      const int64_t b = 2 * p + half;
      const float* src = x + b * kBlock;
      __m256 v[4], top = _mm256_setzero_ps();
      for (int t = 0; t < 4; ++t) {
        v[t] = _mm256_loadu_ps(src + 8 * t);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[t]));
      }
      __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(t4, _mm_movehdup_ps(t4)));
      const __m256 inverse = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      __m256i sum = _mm256_setzero_si256();
      for (int t = 0; t < 4; ++t) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v[t], inverse));
        q = _mm256_min_epi32(_mm256_max_epi32(q, lowest), highest);
        sum = _mm256_add_epi32(sum, q);
        _mm256_store_si256(reinterpret_cast<__m256i*>(plain[half] + 8 * t), q);
      }
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      a.scale[b] = amax / 127.f;
      a.scaled_sum[b] = a.scale[b] * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
    int8_t* dst = a.q.data() + p * kPair;
    for (int64_t j = 0; j < kPair; ++j) {
      const int64_t source = pair_source(j);
      dst[j] = static_cast<int8_t>(plain[source / kBlock][source % kBlock]);
    }
  }
  return a;
}

// dequantize_rows with vector instructions, the same floats (d * q, then + m, two roundings as the
// portable loop has them): a prompt's chunk of more than INTEGER_ROWS tokens turns every weight back
// into floats, and one value at a time that took about 0.1 s for the built-in model's weights.
// A pair's 64 interleaved values, in four-byte chunks a b a b ..., go back to block order with one
// byte shuffle per 128-bit lane ([a a b b]) and one 64-bit permute ([a a a a | b b b b]).
__attribute__((target(TANDEM_AVX2))) inline __m256i split_blocks(__m256i chunks) {
  const __m256i gather = _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15,
                                          0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(chunks, gather), 0xD8);
}

// 16 values of one block (bytes, unsigned at 4 bits, signed at 8) -> d * q + m into dst[0..16).
template <int BITS>
__attribute__((target(TANDEM_AVX2))) inline void store_block16(__m128i q, float d, float m, float* dst) {
  const __m256 scale = _mm256_set1_ps(d), offset = _mm256_set1_ps(m);
  for (int half = 0; half < 2; ++half) {
    const __m128i bytes = half ? _mm_unpackhi_epi64(q, q) : q;
    const __m256i ints = BITS == 4 ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
    __m256 w = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(ints));
    __asm__("" : "+x"(w));  // the product rounded on its own: no fused multiply-add with the offset
    if (BITS == 4) w = _mm256_add_ps(w, offset);
    _mm256_storeu_ps(dst + 8 * half, w);
  }
}

template <int BITS>
__attribute__((target(TANDEM_AVX2))) void dequantize_rows_avx2(const uint8_t* weights, const float* d,
                                                               const float* mn, int64_t k, int64_t r0, int64_t r1,
                                                               float* out) {
  const int64_t blocks = k / kBlock, row_bytes = BITS == 4 ? k / 2 : k;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t p = 0; p < k / kPair; ++p) {
      const uint8_t* w = weights + r * row_bytes + p * (BITS == 4 ? 32 : 64);
      __m256i first, second;  // interleaved values 0..31 and 32..63
      if (BITS == 4) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        first = _mm256_and_si256(packed, low);
        second = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
      } else {
        first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
      }
      first = split_blocks(first);    // a[0..16) | b[0..16)
      second = split_blocks(second);  // a[16..32) | b[16..32)
      const int64_t a = r * blocks + 2 * p, b = a + 1;
      const float ma = BITS == 4 ? mn[a] : 0.f, mb = BITS == 4 ? mn[b] : 0.f;
      float* dst = out + (r - r0) * k + p * kPair;
      store_block16<BITS>(_mm256_castsi256_si128(first), d[a], ma, dst);
      store_block16<BITS>(_mm256_castsi256_si128(second), d[a], ma, dst + 16);
      store_block16<BITS>(_mm256_extracti128_si256(first, 1), d[b], mb, dst + kBlock);
      store_block16<BITS>(_mm256_extracti128_si256(second, 1), d[b], mb, dst + kBlock + 16);
    }
  }
}

// [a, b, a, b, ...]: a pair's two floats broadcast.
__attribute__((target(TANDEM_AVX2))) inline __m256 pair8(const float* ab) {
  return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(ab)));
}

// ---- AVX2: maddubs multiplies unsigned by signed bytes into saturating 16-bit pairs ------------
// 4 bits: 0..15 x -127..127 cannot saturate. 8 bits: |w| x sign(x, w), at most 2 * 127 * 127.
//
// A pass takes R weight rows and C activation rows at a time: each weight pair is unpacked once for
// all C rows. Each (weight row, activation row) accumulator sees the same operations in the same
// order whatever R and C, so a row's result is the same whatever the number of rows.
//
// Prefetch: one weight row's bytes and scales are read once per step, from memory. Unprefetched, the
// unpacking and integer products of a tile did not overlap with fetching it (an AMD Zen 1 core:
// about 8 ns per weight pair from memory against 5.5 in cache); each tile now asks for the rows
// kAvx2Ahead past it while it computes.

constexpr int64_t kAvx2Ahead = 4;  // weight rows
constexpr int64_t kAvx2Chunk = 4;  // activation rows per pass over the weights, at most

template <int BITS>
__attribute__((target(TANDEM_AVX2))) inline void unpack_avx2(const uint8_t* w, __m256i& w0, __m256i& w1) {
  if (BITS == 4) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i low = _mm256_set1_epi8(0x0F);
    w0 = _mm256_and_si256(packed, low);
    w1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  } else {
    w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
  }
}

// int32 dot of one unpacked weight pair with one activation pair, lanes alternating the two blocks
template <int BITS>
__attribute__((target(TANDEM_AVX2))) inline __m256i unpacked_dot_avx2(__m256i w0, __m256i w1, const int8_t* xq) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
  if (BITS == 4)  // 16-bit sums of the two halves stay below 2 * 2 * 15 * 127: add before widening
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1)), ones);
  const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0));
  const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x1, w1));
  return _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
}

// R weight rows [r, r + R) against C activation rows [i, i + C); `ahead` > 0 prefetches the rows that far on.
template <int BITS, int R, int C>
__attribute__((target(TANDEM_AVX2))) inline void tile_avx2(const uint8_t* weights, const float* d, const float* mn,
                                                           const Activations& a, int64_t k, int64_t r, int64_t i,
                                                           int64_t n, float* out, int64_t ahead) {
  const int64_t blocks = k / kBlock, pairs = k / kPair, row_bytes = BITS == 4 ? k / 2 : k;
  const int64_t pair_bytes = BITS == 4 ? 32 : 64;
  if (ahead) {  // the scales of the rows to come: a few cache lines each
    for (int j = 0; j < R; ++j)
      for (int64_t b = 0; b < blocks; b += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(d + (r + j + ahead) * blocks + b), _MM_HINT_T0);
        if (BITS == 4) _mm_prefetch(reinterpret_cast<const char*>(mn + (r + j + ahead) * blocks + b), _MM_HINT_T0);
      }
  }
  __m256 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm256_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    if (ahead && (p * pair_bytes) % 64 == 0)
      for (int j = 0; j < R; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(weights + (r + j + ahead) * row_bytes + p * pair_bytes), _MM_HINT_T0);
    for (int j = 0; j < R; ++j) {
      __m256i w0, w1;
      unpack_avx2<BITS>(weights + (r + j) * row_bytes + p * pair_bytes, w0, w1);
      const __m256 dj = pair8(d + (r + j) * blocks + 2 * p);
      for (int c = 0; c < C; ++c) {
        const __m256i dot = unpacked_dot_avx2<BITS>(w0, w1, a.q.data() + (i + c) * k + p * kPair);
        const __m256 s = pair8(a.scale.data() + (i + c) * blocks + 2 * p);
        acc[j][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s, dj), acc[j][c]);
      }
    }
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c)
      out[(i + c) * n + r + j] = hsum8(acc[j][c]) +
          row_offset<BITS>(d, mn, a.scaled_sum.data() + (i + c) * blocks, r + j, blocks, false);
}

template <int BITS, int C>
__attribute__((target(TANDEM_AVX2))) void pass_avx2(const uint8_t* weights, const float* d, const float* mn,
                                                    const Activations& a, int64_t k, int64_t r0, int64_t r1,
                                                    int64_t i, int64_t n, float* out) {
  constexpr int R = C <= 2 ? 4 : 2;  // R * C accumulators, the unpacked pair and the constants in 16 registers
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    tile_avx2<BITS, R, C>(weights, d, mn, a, k, r, i, n, out, r + R + kAvx2Ahead <= r1 ? kAvx2Ahead : 0);
  for (; r < r1; ++r) tile_avx2<BITS, 1, C>(weights, d, mn, a, k, r, i, n, out, 0);
}

template <int BITS>
__attribute__((target(TANDEM_AVX2))) void rows_avx2(const uint8_t* weights, const float* d, const float* mn,
                                                    const Activations& a, int64_t m, int64_t k, int64_t r0,
                                                    int64_t r1, int64_t n, float* out) {
  for (int64_t i = 0; i < m;) {
    const int64_t c = std::min(kAvx2Chunk, m - i);
    if (c == 1) pass_avx2<BITS, 1>(weights, d, mn, a, k, r0, r1, i, n, out);
    else if (c == 2) pass_avx2<BITS, 2>(weights, d, mn, a, k, r0, r1, i, n, out);
    else if (c == 3) pass_avx2<BITS, 3>(weights, d, mn, a, k, r0, r1, i, n, out);
    else pass_avx2<BITS, 4>(weights, d, mn, a, k, r0, r1, i, n, out);
    i += c;
  }
}

// ---- AVX-512 VNNI: dpbusd multiplies unsigned by signed bytes straight into 32 bits, a pair per op --
// 8-bit weights are made unsigned by flipping the sign bit (w + 128), which row_offset undoes.
//
// A pass takes four weight rows and up to four activation rows: each weight pair is unpacked once
// for all of them, and each (weight row, activation row) accumulator sees the same operations in the
// same order whatever the number of rows. Each group of four weight rows first asks for the rows
// kVnniAhead on into L2, as the float kernel does (engine/kernels/native/row_linear.cpp).

constexpr int64_t kVnniRows = 4;    // weight rows per pass
constexpr int64_t kVnniChunk = 4;   // activation rows per pass, at most
constexpr int64_t kVnniAhead = 32;  // weight rows

__attribute__((target(TANDEM_AVX512_VNNI))) inline __m512 pair16(const float* ab) {
  return _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(ab)));
}

template <int BITS>
__attribute__((target(TANDEM_AVX512_VNNI))) inline __m512i unpack_vnni(const uint8_t* w) {
  if (BITS == 4) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i low = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(packed, low)),
                              _mm256_and_si256(_mm256_srli_epi16(packed, 4), low), 1);
  }
  return _mm512_xor_si512(_mm512_loadu_si512(w), _mm512_set1_epi8(static_cast<char>(0x80)));
}

// The bytes of weight rows [r, r + count) and their scales (and mins), into L2.
__attribute__((target(TANDEM_AVX512_VNNI))) inline void prefetch_rows(const uint8_t* weights, const float* d,
                                                                 const float* mn, int64_t row_bytes,
                                                                 int64_t blocks, int64_t r, int64_t count) {
  const char* w = reinterpret_cast<const char*>(weights + r * row_bytes);
  for (int64_t b = 0; b < count * row_bytes; b += 64) _mm_prefetch(w + b, _MM_HINT_T1);
  for (int64_t b = 0; b < count * blocks; b += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(d + r * blocks + b), _MM_HINT_T1);
    if (mn) _mm_prefetch(reinterpret_cast<const char*>(mn + r * blocks + b), _MM_HINT_T1);
  }
}

template <int BITS, int R, int C>
__attribute__((target(TANDEM_AVX512_VNNI))) inline void tile_vnni(const uint8_t* weights, const float* d,
                                                             const float* mn, const Activations& a, int64_t k,
                                                             int64_t r, int64_t i, int64_t n, float* out) {
  const int64_t blocks = k / kBlock, pairs = k / kPair, row_bytes = BITS == 4 ? k / 2 : k;
  const int64_t pair_bytes = BITS == 4 ? 32 : 64;
  __m512 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i x[C];
    __m512 s[C];
    for (int c = 0; c < C; ++c) {
      x[c] = _mm512_loadu_si512(a.q.data() + (i + c) * k + p * kPair);
      s[c] = pair16(a.scale.data() + (i + c) * blocks + 2 * p);
    }
    for (int j = 0; j < R; ++j) {
      const __m512i w = unpack_vnni<BITS>(weights + (r + j) * row_bytes + p * pair_bytes);
      const __m512 dj = pair16(d + (r + j) * blocks + 2 * p);
      for (int c = 0; c < C; ++c) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x[c]);
        acc[j][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s[c], dj), acc[j][c]);
      }
    }
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c)
      out[(i + c) * n + r + j] = _mm512_reduce_add_ps(acc[j][c]) +
          row_offset<BITS>(d, mn, a.scaled_sum.data() + (i + c) * blocks, r + j, blocks, true);
}

// R weight rows [r, r + R) against every activation row, at most kVnniChunk at a time.
template <int BITS, int R>
__attribute__((target(TANDEM_AVX512_VNNI))) inline void rows_group_vnni(const uint8_t* weights, const float* d,
                                                                   const float* mn, const Activations& a, int64_t m,
                                                                   int64_t k, int64_t r, int64_t n, float* out) {
  for (int64_t i = 0; i < m;) {
    const int64_t c = std::min(kVnniChunk, m - i);
    if (c == 1) tile_vnni<BITS, R, 1>(weights, d, mn, a, k, r, i, n, out);
    else if (c == 2) tile_vnni<BITS, R, 2>(weights, d, mn, a, k, r, i, n, out);
    else if (c == 3) tile_vnni<BITS, R, 3>(weights, d, mn, a, k, r, i, n, out);
    else tile_vnni<BITS, R, 4>(weights, d, mn, a, k, r, i, n, out);
    i += c;
  }
}

template <int BITS>
__attribute__((target(TANDEM_AVX512_VNNI))) void rows_vnni(const uint8_t* weights, const float* d, const float* mn,
                                                      const Activations& a, int64_t m, int64_t k, int64_t r0,
                                                      int64_t r1, int64_t n, float* out) {
  const int64_t blocks = k / kBlock, row_bytes = BITS == 4 ? k / 2 : k;
  int64_t r = r0;
  for (; r + kVnniRows <= r1; r += kVnniRows) {
    if (r + kVnniRows + kVnniAhead <= r1)
      prefetch_rows(weights, d, BITS == 4 ? mn : nullptr, row_bytes, blocks, r + kVnniAhead, kVnniRows);
    rows_group_vnni<BITS, kVnniRows>(weights, d, mn, a, m, k, r, n, out);
  }
  for (; r < r1; ++r) rows_group_vnni<BITS, 1>(weights, d, mn, a, m, k, r, n, out);
}

#endif

// Rows [r0, r1) of the weight back in float, block order: [r1 - r0, K].
void dequantize_rows(const uint8_t* weights, const float* d, const float* mn, int64_t bits, int64_t k, int64_t r0,
                     int64_t r1, float* out) {
  const int64_t blocks = k / kBlock, row_bytes = bits == 4 ? k / 2 : k;
  for (int64_t r = r0; r < r1; ++r) {
    float* dst = out + (r - r0) * k;
    for (int64_t p = 0; p < k / kPair; ++p) {
      for (int64_t j = 0; j < kPair; ++j) {
        const int q = stored_value(weights + r * row_bytes, bits, p, j);
        const int64_t position = p * kPair + pair_source(j), b = position / kBlock;
        dst[position] = d[r * blocks + b] * static_cast<float>(q) + (bits == 4 ? mn[r * blocks + b] : 0.f);
      }
    }
  }
}

// The vector versions wherever a vector code path was chosen; they give the portable ones' results.
Activations quantize_for(const std::string& path, const float* x, int64_t m, int64_t k) {
#ifdef TANDEM_X86
  if (path != "portable") return quantize_activations_avx2(x, m, k);
#endif
  return quantize_activations(x, m, k);
}

void dequantize_for(const std::string& path, const uint8_t* weights, const float* d, const float* mn,
                    int64_t bits, int64_t k, int64_t r0, int64_t r1, float* out) {
#ifdef TANDEM_X86
  if (path != "portable") {
    if (bits == 4) dequantize_rows_avx2<4>(weights, d, mn, k, r0, r1, out);
    else dequantize_rows_avx2<8>(weights, d, mn, k, r0, r1, out);
    return;
  }
#endif
  dequantize_rows(weights, d, mn, bits, k, r0, r1, out);
}

using Rows = void (*)(const uint8_t*, const float*, const float*, const Activations&, int64_t, int64_t, int64_t,
                     int64_t, int64_t, float*);

Rows pick(const std::string& path, int64_t bits) {
  const bool four = bits == 4;
#ifdef TANDEM_X86
  if (path == "vnni") return four ? rows_vnni<4> : rows_vnni<8>;
  if (path == "avx2") return four ? rows_avx2<4> : rows_avx2<8>;
#endif
  if (path == "portable") return four ? rows_portable<4> : rows_portable<8>;
  TORCH_CHECK(false, "block_quant: no code path '", path, "' in this build");
}

}  // namespace

torch::Tensor block_quant_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                                 const torch::Tensor& mins, int64_t bits, const std::string& path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "block_quant: x must be [M, K] float32");
  TORCH_CHECK(bits == 4 || bits == 8, "block_quant: bits must be 4 or 8");
  const int64_t m = x.size(0), k = x.size(1), n = qweight.size(0), blocks = k / kBlock;
  TORCH_CHECK(k % kPair == 0, "block_quant: K must be a multiple of 64");
  TORCH_CHECK(qweight.is_contiguous() && qweight.size(1) == (bits == 4 ? k / 2 : k),
              "block_quant: weight does not match K");
  TORCH_CHECK(scales.is_contiguous() && scales.size(0) == n && scales.size(1) == blocks,
              "block_quant: scales must be [N, K/32]");
  TORCH_CHECK(bits == 8 || (mins.is_contiguous() && mins.sizes() == scales.sizes()),
              "block_quant: mins must be [N, K/32]");
  const Rows rows = pick(path, bits);
  const torch::Tensor xc = x.contiguous();
  const uint8_t* weights = static_cast<const uint8_t*>(qweight.data_ptr());
  const float* d = scales.data_ptr<float>();
  const float* mn = bits == 4 ? mins.data_ptr<float>() : nullptr;
  if (m > kIntegerRows) {
    // Many rows (a prompt): the weights go back to float a tile at a time, for the float GEMM, which
    // is faster than integer dot products at this size. Decoding and verification stay below.
    torch::Tensor y = torch::empty({m, n}, x.options());
    const bool inference = c10::InferenceMode::is_enabled();  // worker threads do not inherit it
    at::parallel_for(0, n, kTile, [&](int64_t begin, int64_t end) {
      c10::InferenceMode guard(inference);
      for (int64_t t = begin; t < end; t += kTile) {
        const int64_t stop = std::min(end, t + kTile);
        torch::Tensor tile = torch::empty({stop - t, k}, x.options());
        dequantize_for(path, weights, d, mn, bits, k, t, stop, tile.data_ptr<float>());
        y.narrow(1, t, stop - t).copy_(at::mm(xc, tile.t()));
      }
    });
    return y;
  }
  const Activations a = quantize_for(path, xc.data_ptr<float>(), m, k);
  torch::Tensor y = torch::empty({m, n}, x.options());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) { rows(weights, d, mn, a, m, k, begin, end, n, out); });
  return y;
}

TORCH_LIBRARY(tandem_block_quant, lib) {
  lib.def("linear(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int bits, str path) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem_block_quant, CPU, lib) { lib.impl("linear", block_quant_linear); }
