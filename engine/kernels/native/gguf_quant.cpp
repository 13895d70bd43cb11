// Linear layers on a GGUF file's own quantized blocks, for the CPU: the weights stay exactly as the file
// stores them (memory-mapped, never repacked), activations are quantized per call to INT8 blocks of 32,
// or of 256 for the K-quants (as ggml's Q8_K).
//
// Formats (ggml's block layouts, as GGUF stores them; w is the weight a block holds):
//   Q4_0  32 values, 18 bytes: fp16 d, 16 bytes of nibbles (value j low, j + 16 high)     w = d (q - 8)
//   Q4_1  32 values, 20 bytes: fp16 d, fp16 m, nibbles as Q4_0                             w = d q + m
//   Q5_0  32 values, 22 bytes: fp16 d, 32 high bits (bit j: value j), nibbles as Q4_0       w = d (q - 16)
//   Q5_1  32 values, 24 bytes: fp16 d, fp16 m, high bits, nibbles                          w = d q + m
//   Q8_0  32 values, 34 bytes: fp16 d, 32 int8                                             w = d q
//   Q4_K 256 values, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins for eight
//        sub-blocks of 32, 128 bytes of nibbles (bytes 32p..32p+31: sub-block 2p low, 2p+1 high)
//                                                                          w = d sc_s q - dmin m_s
//   Q5_K 256 values, 176 bytes: as Q4_K with 32 bytes of high bits before the nibbles (byte l, bit s:
//        value l of sub-block s)                                           w = d sc_s q - dmin m_s
//   Q6_K 256 values, 210 bytes: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales for
//        sub-blocks of 16, fp16 d                                          w = d sc_s (q - 32)
//
// Arithmetic of the 32-value formats. Every weight is an unsigned integer u (q, or q + 128 for Q8_0) in a sub-block with a
// float scale s and, in the affine formats (Q4_1, Q5_1), a float offset o per block of 32; the
// symmetric formats subtract a bias b (8, 16 or 128) from u. An activation block of 32 is
// x ~ sx * xq, xq in -127..127. Then, per weight row and activation row,
//   y = sum_blocks sx * (s * (dot(u, xq) - b * sum(xq)) + o * sum(xq))
// The integer part is exact (an integer dot product started from -b * sum(xq) per group of four);
// the float part is one fused multiply-add per group of four values, the offsets one dot product at
// the end of the row.
//
// Arithmetic of the K-quants (Q4_K, Q5_K, Q6_K), as ggml's: an activation block of 256 is x ~ sx * xq
// with one float sx. Per block of 256, the 6-bit (Q6_K: 8-bit) sub-block scales sc_s multiply the integer
// sub-block dot products in integer arithmetic, and one float multiply-add takes the block:
//   y = sum_blocks d * sx * (sum_s sc_s * (dot_s(u, xq) - b * sum_s(xq)))  -  sum_s dmin m_s * sx * sum_s(xq)
// Q6_K's bias (b = 32) goes through the activations' sums of 16; the mins of Q4_K and Q5_K through their
// scaled sums of 32, one dot product at the end of the row.
//
// Row-exact: each output y[i, n] is computed by the same operations in the same order whatever the
// number of activation rows, so a verify forward's rows are bit for bit the one-token steps' and
// speculative decoding's greedy output is the target's own. Every row count takes this path (a prompt
// too): one weight block is unpacked once for up to four activation rows (up to eight for the
// K-quants on AVX-512, and every row of a verify of up to eight from one read of the weights; rows too
// long for a verify's activations to stay in L1 are read in passes, their sums kept between passes).
//
// Code paths, chosen by the caller from the CPU's features: AVX-512 VNNI (a pass takes four weight
// rows and up to four activation rows, 64 values at a time; dpbusd, or maddubs and dpwssd for the
// K-quants), AVX2 (32 values at a time, maddubs) and portable C++. Each is checked against the float weights the blocks hold (gguf's own dequantization) in the
// tests, on the machine that runs them.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"
#include "simd_common.h"

namespace {

constexpr int64_t kBlock = 32;  // activation block, and the unit of every format's float scale
constexpr int64_t kPair = 64;   // values one AVX-512 step takes
constexpr int64_t kSuper = 256;  // a K-quant's block, and its activation block
constexpr int64_t kTaskRows = 16;  // weight rows per parallel task, at the least

enum Type : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                      Q6_K = 14, BF16 = 30 };

// The block types the kernels read (the formats above), and every trait the code asks of one: the one
// table of them, read at run time (format_of) and, by the kernels templated on a type, at compile time
// (kFormat).
struct Format {
  int64_t type;
  int64_t values, bytes;  // a block's values and bytes
  int bits;               // bits per value
  int bias;               // subtracted from the unsigned values (the symmetric formats; Q8_0: its + 128)
  bool affine;            // a float offset besides the scale (m, or the K-quants' -dmin m_s)
};

constexpr Format kFormats[] = {
    {Q4_0, 32, 18, 4, 8, false},   {Q4_1, 32, 20, 4, 0, true},   {Q5_0, 32, 22, 5, 16, false},
    {Q5_1, 32, 24, 5, 0, true},    {Q8_0, 32, 34, 8, 128, false}, {Q4_K, 256, 144, 4, 0, true},
    {Q5_K, 256, 176, 5, 0, true},  {Q6_K, 256, 210, 6, 32, false},
};

// The table's row of `type`, or null for a type the kernels do not read.
constexpr const Format* find_format(int64_t type) {
  for (const Format& format : kFormats)
    if (format.type == type) return &format;
  return nullptr;
}

const Format& format_of(int64_t type) {
  const Format* format = find_format(type);
  TORCH_CHECK(format != nullptr, "gguf: unsupported block type ", type);
  return *format;
}

template <int64_t T>
constexpr Format kFormat = *find_format(T);  // a type the table lacks does not compile

// The K-quants, whose activations come in blocks of 256 (Activations::super_q).
constexpr bool super_format(int64_t type) {
  const Format* format = find_format(type);
  return format != nullptr && format->values == kSuper;
}

// The 32-value 4- and 5-bit formats, whose AVX-512 path reads activations in nibble order.
constexpr bool nibble_format(int64_t type) {
  const Format* format = find_format(type);
  return format != nullptr && format->values == kBlock && format->bits < 8;
}

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes.
inline void k_scale_min(const uint8_t* q, int s, int& scale, int& min) {
  if (s < 4) {
    scale = q[s] & 63;
    min = q[s + 4] & 63;
  } else {
    scale = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    min = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// ---- the float weights a row holds (embeddings, tests) ----------------------------------------------

void dequantize_row(const uint8_t* row, int64_t type, int64_t k, float* out) {
  const Format lay = format_of(type);
  for (int64_t b = 0; b < k / lay.values; ++b) {
    const uint8_t* blk = row + b * lay.bytes;
    float* y = out + b * lay.values;
    switch (type) {
      case Q4_0:
      case Q4_1:
      case Q5_0:
      case Q5_1: {
        const bool affine = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
        const float d = half_to_float(blk), m = affine ? half_to_float(blk + 2) : 0.f;
        uint32_t high = 0;
        if (five) std::memcpy(&high, blk + (affine ? 4 : 2), 4);
        const uint8_t* qs = blk + (affine ? 4 : 2) + (five ? 4 : 0);
        const int bias = affine ? 0 : (five ? 16 : 8);
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 0xF) | (five ? ((high >> j) & 1) << 4 : 0);
          const int hi = (qs[j] >> 4) | (five ? ((high >> (j + 16)) & 1) << 4 : 0);
          y[j] = affine ? d * lo + m : d * (lo - bias);
          y[j + 16] = affine ? d * hi + m : d * (hi - bias);
        }
        break;
      }
      case Q8_0: {
        const float d = half_to_float(blk);
        for (int j = 0; j < 32; ++j) y[j] = d * static_cast<int8_t>(blk[2 + j]);
        break;
      }
      case Q4_K:
      case Q5_K: {
        const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
        const uint8_t* scales = blk + 4;
        const bool five = type == Q5_K;
        const uint8_t* high = blk + 16;
        const uint8_t* qs = blk + (five ? 48 : 16);
        for (int s = 0; s < 8; ++s) {
          int sc, mn;
          k_scale_min(scales, s, sc, mn);
          const float scale = d * sc, offset = dmin * mn;
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = qs[(s / 2) * 32 + l];
            int q = s % 2 ? byte >> 4 : byte & 0xF;
            if (five) q |= ((high[l] >> s) & 1) << 4;
            y[s * 32 + l] = scale * q - offset;
          }
        }
        break;
      }
      case Q6_K: {
        const float d = half_to_float(blk + 208);
        const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* ql = blk + 64 * half;
          const uint8_t* qh = blk + 128 + 32 * half;
          for (int l = 0; l < 32; ++l) {
            const int q[4] = {(ql[l] & 0xF) | ((qh[l] & 3) << 4), (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                              (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4), (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)};
            for (int t = 0; t < 4; ++t) {
              const int v = 128 * half + 32 * t + l;
              y[v] = d * scales[v / 16] * (q[t] - 32);
            }
          }
        }
        break;
      }
      default: TORCH_CHECK(false, "gguf: unsupported block type ", type);
    }
  }
}

// ---- activations -----------------------------------------------------------------------------------

struct Activations {
  int64_t k = 0, padded = 0;   // padded: k rounded up to 64 (zeros past k)
  std::vector<int8_t> q;       // [m, padded]
  std::vector<float> scale;    // [m, padded/32]
  std::vector<float> scaled_sum;  // [m, padded/32]: scale * sum(q) over the block
  std::vector<int32_t> quad_sum;  // [m, padded/4]: sum of each four consecutive q
  // The same values in nibble order, for the 32-value 4- and 5-bit formats on AVX-512: each pair of
  // blocks a, b as a[0..16) b[0..16) a[16..32) b[16..32), the order two blocks' nibbles come out of one
  // 256-bit load (low nibbles, then high). Empty unless such a format is in the call.
  std::vector<int8_t> q_nibbles;        // [m, padded]
  std::vector<int32_t> quad_nibbles;    // [m, padded/4]
  std::vector<float> scaled_sum_pairs;  // [m, padded/64 * 4]: 0, scaled sum of a, 0, scaled sum of b
  // The K-quants' own blocks of 256 (ggml's Q8_K): one scale per 256 values, the sums of each 16 values
  // as integers and of each 32 as floats. Empty unless a K-quant is in the call.
  std::vector<int8_t> super_q;           // [m, k]
  std::vector<float> super_scale;        // [m, k/256]
  std::vector<int16_t> sums16;           // [m, k/16]
  std::vector<float> super_scaled_sum;   // [m, k/32]: super_scale * the sum of each 32 values
};

// q_nibbles, quad_nibbles and scaled_sum_pairs from the plain order.
void add_nibble_order(Activations& a, int64_t m) {
  const int64_t pairs = a.padded / kPair, blocks = a.padded / kBlock;
  a.q_nibbles.assign(m * a.padded, 0);
  a.quad_nibbles.assign(m * a.padded / 4, 0);
  a.scaled_sum_pairs.assign(m * pairs * 4, 0.f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < pairs; ++p) {
      const int8_t* src = a.q.data() + i * a.padded + p * kPair;
      int8_t* dst = a.q_nibbles.data() + i * a.padded + p * kPair;
      for (int half = 0; half < 2; ++half)      // values 0..15, then 16..31, of each block
        for (int block = 0; block < 2; ++block)  // a, then b
          std::memcpy(dst + 32 * half + 16 * block, src + 32 * block + 16 * half, 16);
      for (int lane = 0; lane < 16; ++lane)
        a.quad_nibbles[i * a.padded / 4 + p * 16 + lane] = dst[4 * lane] + dst[4 * lane + 1] + dst[4 * lane + 2] +
                                                           dst[4 * lane + 3];
      a.scaled_sum_pairs[(i * pairs + p) * 4 + 1] = a.scaled_sum[i * blocks + 2 * p];
      a.scaled_sum_pairs[(i * pairs + p) * 4 + 3] = a.scaled_sum[i * blocks + 2 * p + 1];
    }
}

// One row's blocks: amax/127 scales, values rounded to nearest even (lrintf under the default mode).
void quantize_row(const float* x, int64_t k, int8_t* q, float* scale, float* scaled_sum, int32_t* quad) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* src = x + b * kBlock;
    float amax = 0.f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float inverse = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int v = std::max(-127, std::min(127, static_cast<int>(std::lrintf(src[j] * inverse))));
      q[b * kBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    scale[b] = amax / 127.f;
    scaled_sum[b] = scale[b] * static_cast<float>(sum);
    for (int t = 0; t < kBlock / 4; ++t)
      quad[b * 8 + t] = q[b * kBlock + 4 * t] + q[b * kBlock + 4 * t + 1] + q[b * kBlock + 4 * t + 2] +
                        q[b * kBlock + 4 * t + 3];
  }
}

// One row's blocks of 256: amax/127 scales, values rounded to nearest even (the sum with 1.5 * 2^23
// rounds as lrintf does under the default mode, and lets the compiler vectorize the loop).
void quantize_super_row(const float* x, int64_t k, int8_t* q, float* scale, int16_t* sums16, float* scaled_sum) {
  constexpr float kRound = 12582912.f;
  for (int64_t b = 0; b < k / kSuper; ++b) {
    const float* src = x + b * kSuper;
    float amax = 0.f;
    for (int j = 0; j < kSuper; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float inverse = amax > 0.f ? 127.f / amax : 0.f;
    int8_t* dst = q + b * kSuper;
    for (int j = 0; j < kSuper; ++j) {
      const float v = (src[j] * inverse + kRound) - kRound;
      dst[j] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, v)));
    }
    scale[b] = amax / 127.f;
    for (int h = 0; h < kSuper / 16; ++h) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += dst[16 * h + j];
      sums16[b * 16 + h] = static_cast<int16_t>(sum);
    }
    for (int s = 0; s < 8; ++s)
      scaled_sum[b * 8 + s] = scale[b] * static_cast<float>(sums16[b * 16 + 2 * s] + sums16[b * 16 + 2 * s + 1]);
  }
}

// blocks32: the blocks of 32 (every format but the K-quants); super: the K-quants' blocks of 256.
Activations quantize_activations(const float* x, int64_t m, int64_t k, bool blocks32, bool super) {
  Activations a;
  a.k = k;
  a.padded = (k + kPair - 1) / kPair * kPair;
  const int64_t blocks = a.padded / kBlock;
  if (blocks32) {
    a.q.assign(m * a.padded, 0);
    a.scale.assign(m * blocks, 0.f);
    a.scaled_sum.assign(m * blocks, 0.f);
    a.quad_sum.assign(m * a.padded / 4, 0);
  }
  if (super) {
    a.super_q.assign(m * k, 0);
    a.super_scale.assign(m * k / kSuper, 0.f);
    a.sums16.assign(m * k / 16, 0);
    a.super_scaled_sum.assign(m * k / kBlock, 0.f);
  }
  at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (blocks32)
        quantize_row(x + i * k, k, a.q.data() + i * a.padded, a.scale.data() + i * blocks,
                     a.scaled_sum.data() + i * blocks, a.quad_sum.data() + i * a.padded / 4);
      if (super)
        quantize_super_row(x + i * k, k, a.super_q.data() + i * k, a.super_scale.data() + i * k / kSuper,
                           a.sums16.data() + i * k / 16, a.super_scaled_sum.data() + i * k / kBlock);
    }
  });
  return a;
}

// -b * the sums of four for a symmetric format's bias b: the start of each group's integer dot product.
std::vector<int32_t> bias_start(const std::vector<int32_t>& quad, int bias) {
  std::vector<int32_t> start(quad.size());
  for (size_t j = 0; j < start.size(); ++j) start[j] = -bias * quad[j];
  return start;
}

// Where each output column group of the call lives: a weight part and its row range.
struct Part {
  const uint8_t* bytes;
  int64_t type, rows, row_bytes, column;  // column: where its outputs start in y
  int bias;
  bool affine;
};

// ---- portable --------------------------------------------------------------------------------------
// The same sums as the vector paths' definition above, one value at a time: sub-blocks of 32 (16 for
// Q6_K) in order, each sx * s * exact integer dot, then the offsets.

void rows_portable(const Part& part, const Activations& a, const std::vector<int32_t>&, int64_t m, int64_t r0,
                   int64_t r1, float* y, int64_t y_stride) {
  const int64_t k = a.k, blocks = a.padded / kBlock;
  std::vector<float> scales(k / 16), offsets(k / 16);
  std::vector<int> u(k);
  for (int64_t r = r0; r < r1; ++r) {
    // u, and the scale / offset of every 16 values, from the block's own fields
    const uint8_t* row = part.bytes + r * part.row_bytes;
    const Format lay = format_of(part.type);
    for (int64_t b = 0; b < k / lay.values; ++b) {
      const uint8_t* blk = row + b * lay.bytes;
      int* ub = u.data() + b * lay.values;
      float* sb = scales.data() + b * lay.values / 16;
      float* ob = offsets.data() + b * lay.values / 16;
      switch (part.type) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
          const bool aff = part.affine, five = part.type == Q5_0 || part.type == Q5_1;
          uint32_t high = 0;
          if (five) std::memcpy(&high, blk + (aff ? 4 : 2), 4);
          const uint8_t* qs = blk + (aff ? 4 : 2) + (five ? 4 : 0);
          for (int j = 0; j < 16; ++j) {
            ub[j] = (qs[j] & 0xF) | (five ? ((high >> j) & 1) << 4 : 0);
            ub[j + 16] = (qs[j] >> 4) | (five ? ((high >> (j + 16)) & 1) << 4 : 0);
          }
          sb[0] = sb[1] = half_to_float(blk);
          ob[0] = ob[1] = aff ? half_to_float(blk + 2) : 0.f;
          break;
        }
        case Q8_0:
          for (int j = 0; j < 32; ++j) ub[j] = static_cast<int8_t>(blk[2 + j]) + 128;
          sb[0] = sb[1] = half_to_float(blk);
          ob[0] = ob[1] = 0.f;
          break;
        default: TORCH_CHECK(false, "gguf: unsupported block type ", part.type);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* xq = a.q.data() + i * a.padded;
      float acc = 0.f;
      for (int64_t h = 0; h < k / 16; ++h) {  // sub-blocks of 16: each has one scale
        int32_t dot = 0, sum = 0;
        for (int j = 0; j < 16; ++j) {
          dot += u[h * 16 + j] * xq[h * 16 + j];
          sum += xq[h * 16 + j];
        }
        acc += a.scale[i * blocks + h / 2] * (scales[h] * static_cast<float>(dot - part.bias * sum));
      }
      float offset = 0.f;
      if (part.affine)
        for (int64_t b = 0; b < k / kBlock; ++b) offset += offsets[2 * b] * a.scaled_sum[i * blocks + b];
      y[i * y_stride + part.column + r] = acc + offset;
    }
  }
}

// The K-quants: per block of 256, sum_s sc_s * dot_s in integers (less 32 sc_s * sum_s for Q6_K's bias),
// times the weight's d and the activations' scale; the mins, through the sums of 32, at the end.
void rows_portable_k(const Part& part, const Activations& a, const std::vector<int32_t>&, int64_t m, int64_t r0,
                     int64_t r1, float* y, int64_t y_stride) {
  const int64_t k = a.k, supers = k / kSuper;
  const Format lay = format_of(part.type);
  std::vector<int> u(k), scales(k / 16);
  std::vector<float> d(supers), offsets(k / kBlock);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = part.bytes + r * part.row_bytes;
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* blk = row + b * lay.bytes;
      int* ub = u.data() + b * kSuper;
      int* sb = scales.data() + b * 16;  // the scale of each 16 values
      if (part.type == Q6_K) {
        d[b] = half_to_float(blk + 208);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* ql = blk + 64 * half;
          const uint8_t* qh = blk + 128 + 32 * half;
          for (int l = 0; l < 32; ++l) {
            const int base = 128 * half + l;
            ub[base] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            ub[base + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            ub[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            ub[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
          }
        }
        for (int s = 0; s < 16; ++s) sb[s] = static_cast<int8_t>(blk[192 + s]);
        continue;
      }
      d[b] = half_to_float(blk);
      const float dmin = half_to_float(blk + 2);
      const bool five = part.type == Q5_K;
      const uint8_t* high = blk + 16;
      const uint8_t* qs = blk + (five ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        int sc, mn;
        k_scale_min(blk + 4, s, sc, mn);
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = qs[(s / 2) * 32 + l];
          ub[s * 32 + l] = (s % 2 ? byte >> 4 : byte & 0xF) | (five ? ((high[l] >> s) & 1) << 4 : 0);
        }
        sb[2 * s] = sb[2 * s + 1] = sc;
        offsets[b * 8 + s] = -(dmin * mn);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* xq = a.super_q.data() + i * k;
      float acc = 0.f;
      for (int64_t b = 0; b < supers; ++b) {
        int32_t sumi = 0;
        for (int64_t h = b * 16; h < b * 16 + 16; ++h) {
          int32_t dot = 0, sum = 0;
          for (int j = 0; j < 16; ++j) {
            dot += u[h * 16 + j] * xq[h * 16 + j];
            sum += xq[h * 16 + j];
          }
          sumi += scales[h] * (dot - part.bias * sum);
        }
        acc += d[b] * a.super_scale[i * supers + b] * static_cast<float>(sumi);
      }
      float offset = 0.f;
      if (part.affine)
        for (int64_t t = 0; t < k / kBlock; ++t) offset += offsets[t] * a.super_scaled_sum[i * k / kBlock + t];
      y[i * y_stride + part.column + r] = acc + offset;
    }
  }
}

#ifdef TANDEM_X86

// ---- AVX-512 VNNI: 64 values (two blocks of 32) per step ---------------------------------------------
//
// A weight step is u: 64 unsigned bytes in value order, and s: 16 float lanes, lane t holding the
// scale of values 4t..4t+3. Each lane's integer dot (dpbusd, started from -b * the activations' sum
// of those four values) is converted and multiplied by s * sx once.

struct Step512 {
  __m512i u;
  __m512 s;
};

// [a x 8 | b x 8]
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m512 two_scales(float a, float b) {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m256i nibbles16(const uint8_t* qs) {  // 16 bytes -> 32 values
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
}

// One block of a 32-value format as 32 unsigned values (in a __m256i), its scale and its offset.
template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m256i block32(const uint8_t* blk, float& d, float& m) {
  if (T == Q8_0) {
    d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  constexpr bool aff = T == Q4_1 || T == Q5_1, five = T == Q5_0 || T == Q5_1;
  d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
  if (aff) m = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2));
  __m256i u = nibbles16(blk + (aff ? 4 : 2) + (five ? 4 : 0));
  if (five) {
    uint32_t high;
    std::memcpy(&high, blk + (aff ? 4 : 2), 4);
    u = _mm256_or_si256(u, _mm256_maskz_mov_epi8(high, _mm256_set1_epi8(16)));
  }
  return u;
}

alignas(64) const uint8_t kZeroBlock[64] = {0};  // stands in for a missing last block of an odd count

// Blocks a and b of a 32-value 4- or 5-bit format in nibble order (see Activations::q_nibbles): one
// 256-bit load of both blocks' 16 bytes of nibbles, split into low and high halves. Their d (and m)
// come as [d_a, m_a, d_b, m_b] from one conversion; lane t takes the scale of its block.
template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m512i nibble_pair(const uint8_t* a, const uint8_t* b, __m128& dm) {
  constexpr bool aff = T == Q4_1 || T == Q5_1, five = T == Q5_0 || T == Q5_1;
  constexpr int qs = (aff ? 4 : 2) + (five ? 4 : 0);
  const __m256i packed = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b + qs),
                                             reinterpret_cast<const __m128i*>(a + qs));
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(packed, low)),
                                 _mm256_and_si256(_mm256_srli_epi16(packed, 4), low), 1);
  uint32_t head_a, head_b;
  std::memcpy(&head_a, a, 4);
  std::memcpy(&head_b, b, 4);
  dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(head_b), static_cast<int>(head_a)));
  if (five) {  // bit j of a block's 32 high bits -> 16 on its value j, in nibble order
    uint32_t ha, hb;
    std::memcpy(&ha, a + (aff ? 4 : 2), 4);
    std::memcpy(&hb, b + (aff ? 4 : 2), 4);
    const uint64_t mask = (ha & 0xFFFFull) | (static_cast<uint64_t>(hb & 0xFFFF) << 16) |
                          (static_cast<uint64_t>(ha >> 16) << 32) | (static_cast<uint64_t>(hb >> 16) << 48);
    u = _mm512_or_si512(u, _mm512_maskz_mov_epi8(mask, _mm512_set1_epi8(16)));
  }
  return u;
}

// Lanes 0-3 and 8-11 take element 0 (block a), lanes 4-7 and 12-15 element `b`.
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m512i nibble_lanes(int b) {
  return _mm512_set_epi32(b, b, b, b, 0, 0, 0, 0, b, b, b, b, 0, 0, 0, 0);
}

// Float offsets of weight rows, one per block of 32, gathered while their steps are unpacked.
inline std::vector<float>& offset_scratch(size_t size) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < size) scratch.resize(size);
  return scratch;
}

// Weight rows [r, r + R) against activation rows [i, i + C).
template <int64_t T, int R, int C>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void tile_vnni(const Part& part, const Activations& a,
                                                    const std::vector<int32_t>& start, int64_t r, int64_t i,
                                                    float* y, int64_t y_stride) {
  constexpr int64_t B = kFormat<T>.bytes;
  constexpr bool aff = kFormat<T>.affine, biased = kFormat<T>.bias != 0, nibbles = nibble_format(T);
  const int64_t k = a.k, steps = a.padded / kPair, blocks = a.padded / kBlock;
  // affine offsets: one per block (K-quants), or [d, m] of both blocks per step (nibble formats)
  const int64_t offset_stride = nibbles ? steps * 4 : blocks;
  float* offsets = aff ? offset_scratch(R * offset_stride).data() : nullptr;
  const int8_t* xq = nibbles ? a.q_nibbles.data() : a.q.data();
  const __m512i x_lanes = nibble_lanes(1);
  __m512 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm512_setzero_ps();
  const uint8_t* rows[R];
  for (int j = 0; j < R; ++j) rows[j] = part.bytes + (r + j) * part.row_bytes;
  for (int64_t p = 0; p < steps; ++p) {
    __m512i x[C], s0[C];
    __m512 sx[C];
    for (int c = 0; c < C; ++c) {
      const int64_t row = i + c;
      x[c] = _mm512_loadu_si512(xq + row * a.padded + p * kPair);
      const float* s = a.scale.data() + row * blocks + 2 * p;
      sx[c] = nibbles ? _mm512_permutexvar_ps(x_lanes, _mm512_castps128_ps512(_mm_castpd_ps(
                            _mm_load_sd(reinterpret_cast<const double*>(s)))))
                      : two_scales(s[0], s[1]);
      s0[c] = biased ? _mm512_loadu_si512(start.data() + row * a.padded / 4 + p * 16) : _mm512_setzero_si512();
    }
    for (int j = 0; j < R; ++j) {
      Step512 w;
      if constexpr (nibbles) {
        const uint8_t* first = rows[j] + 2 * p * B;
        const uint8_t* second = 2 * p + 1 < k / kBlock ? first + B : kZeroBlock;
        __m128 dm;
        w.u = nibble_pair<T>(first, second, dm);
        w.s = _mm512_permutexvar_ps(nibble_lanes(2), _mm512_castps128_ps512(dm));
        if (aff) _mm_storeu_ps(offsets + j * offset_stride + 4 * p, dm);
      } else {
        float d0 = 0.f, m0 = 0.f, d1 = 0.f, m1 = 0.f;
        const __m256i lo = block32<T>(rows[j] + 2 * p * B, d0, m0);
        const __m256i hi = 2 * p + 1 < k / kBlock ? block32<T>(rows[j] + (2 * p + 1) * B, d1, m1)
                                                  : _mm256_setzero_si256();
        w = {_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), two_scales(d0, d1)};
        if (aff) {
          offsets[j * blocks + 2 * p] = m0;
          offsets[j * blocks + 2 * p + 1] = m1;
        }
      }
      for (int c = 0; c < C; ++c) {
        const __m512i dot = _mm512_dpbusd_epi32(s0[c], w.u, x[c]);
        acc[j][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.s, sx[c]), acc[j][c]);
      }
    }
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) {
      float value = _mm512_reduce_add_ps(acc[j][c]);
      if (aff && nibbles)  // [d_a, m_a, d_b, m_b] against [0, sum_a, 0, sum_b]: the m terms
        value += dot_floats512(offsets + j * offset_stride, a.scaled_sum_pairs.data() + (i + c) * steps * 4, steps * 4);
      else if (aff)
        value += dot_floats512(offsets + j * offset_stride, a.scaled_sum.data() + (i + c) * blocks, blocks);
      y[(i + c) * y_stride + part.column + r + j] = value;
    }
}

template <int64_t T, int R>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void rows_group_vnni(const Part& part, const Activations& a,
                                                          const std::vector<int32_t>& start, int64_t m, int64_t r,
                                                          float* y, int64_t y_stride) {
  for (int64_t i = 0; i < m;) {
    const int64_t c = std::min<int64_t>(4, m - i);
    if (c == 1) tile_vnni<T, R, 1>(part, a, start, r, i, y, y_stride);
    else if (c == 2) tile_vnni<T, R, 2>(part, a, start, r, i, y, y_stride);
    else if (c == 3) tile_vnni<T, R, 3>(part, a, start, r, i, y, y_stride);
    else tile_vnni<T, R, 4>(part, a, start, r, i, y, y_stride);
    i += c;
  }
}

constexpr int64_t kVnniAhead = 16;  // weight rows asked for into L2 ahead of the four in use

template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void rows_vnni(const Part& part, const Activations& a,
                                                    const std::vector<int32_t>& start, int64_t m, int64_t r0,
                                                    int64_t r1, float* y, int64_t y_stride) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    if (r + 4 + kVnniAhead <= r1) {
      const char* ahead = reinterpret_cast<const char*>(part.bytes + (r + kVnniAhead) * part.row_bytes);
      for (int64_t b = 0; b < 4 * part.row_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T1);
    }
    rows_group_vnni<T, 4>(part, a, start, m, r, y, y_stride);
  }
  for (; r < r1; ++r) rows_group_vnni<T, 1>(part, a, start, m, r, y, y_stride);
}

// ---- AVX-512 VNNI, the K-quants: a block of 256 in four steps of 64 values ---------------------------
// maddubs multiplies a step's 64 unsigned weights by its 64 activation bytes into 32 sums of pairs (int16,
// at most 2 * 63 * 127), dpwssd multiplies each by its sub-block's scale (int16) and adds them into 16
// int32 lanes. Per block of 256 and activation row the lanes are converted once and multiplied by d * the
// activations' scale: one fused multiply-add. Q6_K's bias starts the lanes at -32 * sum_h sc_h sums16_h
// (one more dpwssd); the mins of Q4_K / Q5_K, -dmin * m_s, meet the activations' scaled sums of 32 at the
// end of the row. A block's weights are unpacked once for every activation row of the tile.

struct SuperHead {
  __m512i scales;  // int16: Q4_K / Q5_K its eight scales in words 0..7, Q6_K its sixteen in words 0..15
  __m256i bias;    // Q6_K: -32 * its sixteen scales, int16
  float d;
};

struct WordIndex {
  alignas(64) int16_t w[32];
};

// The sub-block whose scale word w of step pp takes: values 2w, 2w + 1 of the step.
constexpr WordIndex word_index(bool q6, int pp) {
  WordIndex index{};
  for (int w = 0; w < 32; ++w) index.w[w] = static_cast<int16_t>(q6 ? 4 * pp + w / 8 : 2 * pp + w / 16);
  return index;
}
constexpr WordIndex kScaleIndex[2][4] = {
    {word_index(false, 0), word_index(false, 1), word_index(false, 2), word_index(false, 3)},
    {word_index(true, 0), word_index(true, 1), word_index(true, 2), word_index(true, 3)}};

template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline SuperHead super_head(const uint8_t* blk, float* offsets) {
  SuperHead h;
  if (T == Q6_K) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    h.scales = _mm512_zextsi256_si512(sc);
    h.bias = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
    h.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 208));
    return h;
  }
  // the eight 6-bit scales and mins (k_scale_min) four at a time, as bytes of 32-bit words
  uint32_t word[3];
  std::memcpy(word, blk + 4, 12);
  const uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x30303030;
  const uint32_t scales_lo = word[0] & low6, mins_lo = word[1] & low6;
  const uint32_t scales_hi = (word[2] & low4) | ((word[0] >> 2) & top2);
  const uint32_t mins_hi = ((word[2] >> 4) & low4) | ((word[1] >> 2) & top2);
  const __m128i packed = _mm_set_epi32(static_cast<int>(mins_hi), static_cast<int>(mins_lo),
                                       static_cast<int>(scales_hi), static_cast<int>(scales_lo));
  h.scales = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(packed));
  h.bias = _mm256_setzero_si256();
  h.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
  const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)));
  const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2)));
  _mm256_storeu_ps(offsets, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, mins)));
  return h;
}

// Step pp (0..3) of a block of 256: the unsigned weights of values 64 pp .. 64 pp + 63.
template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) inline __m512i super_step(const uint8_t* blk, int pp) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  if (T == Q6_K) {
    // values 64 pp + l (l < 32) and 64 pp + 32 + l: nibbles of ql[l] and ql[32 + l] of the half (low ones
    // in even steps, high in odd), their two high bits at bits 2t, 2t + 1 of qh[l] for quarter t of the
    // half; a shift of each 16-bit lane moves them to bits 4 and 5 (what crosses from the neighbouring
    // byte lands outside them)
    const int half = pp / 2, upper = pp % 2;
    const __m512i ql = _mm512_loadu_si512(blk + 64 * half);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * half)));
    const __m512i nibbles = _mm512_and_si512(upper ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(0x0F));
    const __m512i counts = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(upper ? 0 : 4)),
                                              _mm256_set1_epi16(2), 1);
    const __m512i top = upper ? _mm512_srlv_epi16(qh, counts) : _mm512_sllv_epi16(qh, counts);
    return _mm512_or_si512(nibbles, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
  }
  constexpr bool five = T == Q5_K;
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (five ? 48 : 16) + 32 * pp));
  __m256i a = _mm256_and_si256(packed, low), b = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  if (five) {
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    const __m256i sixteen = _mm256_set1_epi8(16);
    a = _mm256_or_si256(a, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(high, _mm256_set1_epi8(1 << (2 * pp))), sixteen));
    b = _mm256_or_si256(b, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(high, _mm256_set1_epi8(2 << (2 * pp))), sixteen));
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// Weight rows [r, r + R) against activation rows [i, i + C), over the blocks of 256 [b0, b1). A tile over
// part of a row keeps its accumulators in `state` (16 floats per weight and activation row, the weight
// row's first) between calls, so a row's float sums run in the same order as in one call over the whole
// row. offsets: the rows' float offsets (Q4_K / Q5_K), `groups` apart.
template <int64_t T, int R, int C>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void super_tile_vnni(const Part& part, const Activations& a, int64_t r,
                                                          int64_t i, float* y, int64_t y_stride, float* offsets,
                                                          int64_t b0, int64_t b1, float* state) {
  constexpr int64_t B = kFormat<T>.bytes;
  constexpr bool aff = kFormat<T>.affine;
  const int64_t k = a.k, supers = k / kSuper, groups = k / kBlock;
  const int8_t* xq = a.super_q.data() + i * k;
  const float* xs = a.super_scale.data() + i * supers;
  const uint8_t* rows[R];
  for (int j = 0; j < R; ++j) rows[j] = part.bytes + (r + j) * part.row_bytes;
  __m512 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(state + (j * C + c) * 16);
  for (int64_t b = b0; b < b1; ++b) {
    SuperHead h[R];
    for (int j = 0; j < R; ++j) h[j] = super_head<T>(rows[j] + b * B, aff ? offsets + j * groups + 8 * b : nullptr);
    __m512i sum[R][C];
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c) {
        if (T == Q6_K) {
          const __m256i sums16 =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums16.data() + (i + c) * (k / 16) + 16 * b));
          sum[j][c] = _mm512_zextsi256_si512(_mm256_dpwssd_epi32(_mm256_setzero_si256(), sums16, h[j].bias));
        } else {
          sum[j][c] = _mm512_setzero_si512();
        }
      }
    for (int pp = 0; pp < 4; ++pp) {
      __m512i x[C];
      for (int c = 0; c < C; ++c) x[c] = _mm512_loadu_si512(xq + c * k + b * kSuper + 64 * pp);
      const __m512i index = _mm512_load_si512(kScaleIndex[T == Q6_K][pp].w);
      for (int j = 0; j < R; ++j) {
        const __m512i u = super_step<T>(rows[j] + b * B, pp);
        const __m512i scale = _mm512_permutexvar_epi16(index, h[j].scales);
        for (int c = 0; c < C; ++c) sum[j][c] = _mm512_dpwssd_epi32(sum[j][c], _mm512_maddubs_epi16(u, x[c]), scale);
      }
    }
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c)
        acc[j][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j][c]), _mm512_set1_ps(h[j].d * xs[c * supers + b]), acc[j][c]);
  }
  if (b1 < supers) {
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(state + (j * C + c) * 16, acc[j][c]);
    return;
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) {
      float value = _mm512_reduce_add_ps(acc[j][c]);
      if (aff) value += dot_floats512(offsets + j * groups, a.super_scaled_sum.data() + (i + c) * groups, groups);
      y[(i + c) * y_stride + part.column + r + j] = value;
    }
}

constexpr int64_t kL1Activations = 16384;  // activation bytes a tile's rows may span and stay in L1
constexpr int64_t kGroupRows = 32;         // weight rows whose blocks a pass over part of the rows revisits

// Weight rows [r0, r1) against activation rows [i, i + C), R at a time, in groups of kGroupRows. Where
// the C activation rows are longer than L1 holds, each group goes in passes over a part of the row that
// fits, so that every activation byte a pass reads comes from L1 (a verify of 8 rows of 8,192 values
// would otherwise read 64 KB from L2 for every weight row); shorter rows take one pass.
template <int64_t T, int R, int C>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void super_rows_vnni(const Part& part, const Activations& a, int64_t r0,
                                                          int64_t r1, int64_t i, float* y, int64_t y_stride) {
  const int64_t supers = a.k / kSuper, groups = a.k / kBlock;
  const int64_t span = std::max<int64_t>(1, kL1Activations / (C * kSuper));  // blocks of 256 per pass
  float* offsets = offset_scratch(kGroupRows * (groups + C * 16)).data();
  float* state = offsets + kGroupRows * groups;
  for (int64_t g = r0; g < r1; g += kGroupRows) {
    const int64_t g1 = std::min(r1, g + kGroupRows);
    for (int64_t b0 = 0; b0 < supers; b0 += span) {
      const int64_t b1 = std::min(supers, b0 + span);
      int64_t r = g;
      for (; r + R <= g1; r += R) {
        if (b0 == 0 && r + R + kVnniAhead <= r1) {
          const char* ahead = reinterpret_cast<const char*>(part.bytes + (r + kVnniAhead) * part.row_bytes);
          for (int64_t b = 0; b < R * part.row_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T1);
        }
        super_tile_vnni<T, R, C>(part, a, r, i, y, y_stride, offsets + (r - g) * groups, b0, b1,
                                 state + (r - g) * C * 16);
      }
      for (; r < g1; ++r)
        super_tile_vnni<T, 1, C>(part, a, r, i, y, y_stride, offsets + (r - g) * groups, b0, b1,
                                 state + (r - g) * C * 16);
    }
  }
}

template <int64_t T, int R>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void super_chunk_vnni(const Part& part, const Activations& a, int64_t c,
                                                           int64_t r0, int64_t r1, int64_t i, float* y,
                                                           int64_t y_stride) {
  switch (c) {
    case 1: return super_rows_vnni<T, R, 1>(part, a, r0, r1, i, y, y_stride);
    case 2: return super_rows_vnni<T, R, 2>(part, a, r0, r1, i, y, y_stride);
    case 3: return super_rows_vnni<T, R < 2 ? R : 2, 3>(part, a, r0, r1, i, y, y_stride);
    case 4: return super_rows_vnni<T, R < 2 ? R : 2, 4>(part, a, r0, r1, i, y, y_stride);
    case 5: return super_rows_vnni<T, 1, 5>(part, a, r0, r1, i, y, y_stride);
    case 6: return super_rows_vnni<T, 1, 6>(part, a, r0, r1, i, y, y_stride);
    case 7: return super_rows_vnni<T, 1, 7>(part, a, r0, r1, i, y, y_stride);
    default: return super_rows_vnni<T, 1, 8>(part, a, r0, r1, i, y, y_stride);
  }
}

constexpr int64_t kSuperTile = 8;  // activation rows one unpacked weight block serves at once, at most

// Up to 8 activation rows take one tile (four weight rows at a time for one or two activation rows, two
// for three or four, one for more); more rows take tiles of at most 8 over each weight row in turn, so
// that every weight block is read from memory once per call.
template <int64_t T>
__attribute__((target(TANDEM_AVX512_VNNI_F16C))) void rows_super_vnni(const Part& part, const Activations& a,
                                                          const std::vector<int32_t>&, int64_t m, int64_t r0,
                                                          int64_t r1, float* y, int64_t y_stride) {
  if (m <= kSuperTile) return super_chunk_vnni<T, 4>(part, a, m, r0, r1, 0, y, y_stride);
  const int64_t chunks = (m + kSuperTile - 1) / kSuperTile;
  for (int64_t r = r0; r < r1; ++r) {
    if (r + kVnniAhead < r1)
      for (int64_t b = 0; b < part.row_bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(part.bytes + (r + kVnniAhead) * part.row_bytes) + b, _MM_HINT_T1);
    for (int64_t t = 0, i = 0; t < chunks; ++t) {
      const int64_t c = (m - i) / (chunks - t);
      super_chunk_vnni<T, 1>(part, a, c, r, r + 1, i, y, y_stride);
      i += c;
    }
  }
}

// ---- AVX2: 32 values (one block) per step ------------------------------------------------------------
// maddubs multiplies unsigned by signed bytes into 16-bit pair sums: values up to 63 cannot saturate
// (2 * 63 * 127 < 32767). Q8_0's signed weights take |w| * sign(x, w) instead of a bias of 128.

struct Step256 {
  __m256i u;
  __m256 s;
};

template <int64_t T>
__attribute__((target(TANDEM_AVX2_F16C))) inline __m256i block32_avx2(const uint8_t* blk, float& d, float& m) {
  d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
  if (T == Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));  // signed
  constexpr bool aff = T == Q4_1 || T == Q5_1, five = T == Q5_0 || T == Q5_1;
  if (aff) m = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (aff ? 4 : 2) + (five ? 4 : 0)));
  const __m128i low = _mm_set1_epi8(0x0F);
  __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
  if (five) {  // bit j of the 32 high bits -> 16 on value j
    uint32_t high;
    std::memcpy(&high, blk + (aff ? 4 : 2), 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(high)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(16)));
  }
  return u;
}

template <int64_t T, int R, int C>
__attribute__((target(TANDEM_AVX2_F16C))) void tile_avx2(const Part& part, const Activations& a,
                                                  const std::vector<int32_t>& start, int64_t r, int64_t i, float* y,
                                                  int64_t y_stride) {
  constexpr int64_t B = kFormat<T>.bytes;
  constexpr bool aff = kFormat<T>.affine, biased = kFormat<T>.bias != 0 && T != Q8_0;
  const int64_t k = a.k, blocks = k / kBlock, padded_blocks = a.padded / kBlock;
  float* offsets = aff ? offset_scratch(R * padded_blocks).data() : nullptr;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < R; ++j) {
      const uint8_t* row = part.bytes + (r + j) * part.row_bytes;
      Step256 w;
      float d = 0.f, m = 0.f;
      w.u = block32_avx2<T>(row + b * B, d, m);
      w.s = _mm256_set1_ps(d);
      if (aff) offsets[j * padded_blocks + b] = m;
      const __m256i magnitude = T == Q8_0 ? _mm256_sign_epi8(w.u, w.u) : w.u;
      for (int c = 0; c < C; ++c) {
        const int64_t row_i = i + c;
        __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + row_i * a.padded + b * kBlock));
        if (T == Q8_0) x = _mm256_sign_epi8(x, w.u);
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones);
        if (biased)
          dot = _mm256_add_epi32(dot, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(start.data() + row_i * a.padded / 4 + b * 8)));
        const __m256 sx = _mm256_set1_ps(a.scale[row_i * padded_blocks + b]);
        acc[j][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(w.s, sx), acc[j][c]);
      }
    }
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) {
      float value = hsum8(acc[j][c]);
      if (aff) value += dot_floats256(offsets + j * padded_blocks, a.scaled_sum.data() + (i + c) * padded_blocks, blocks);
      y[(i + c) * y_stride + part.column + r + j] = value;
    }
}

template <int64_t T>
__attribute__((target(TANDEM_AVX2_F16C))) void rows_avx2(const Part& part, const Activations& a,
                                                  const std::vector<int32_t>& start, int64_t m, int64_t r0, int64_t r1,
                                                  float* y, int64_t y_stride) {
  for (int64_t i = 0; i < m;) {
    const int64_t c = std::min<int64_t>(2, m - i);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
      if (c == 1) tile_avx2<T, 2, 1>(part, a, start, r, i, y, y_stride);
      else tile_avx2<T, 2, 2>(part, a, start, r, i, y, y_stride);
    }
    for (; r < r1; ++r) {
      if (c == 1) tile_avx2<T, 1, 1>(part, a, start, r, i, y, y_stride);
      else tile_avx2<T, 1, 2>(part, a, start, r, i, y, y_stride);
    }
    i += c;
  }
}

// ---- AVX2, the K-quants: a block of 256 in eight steps of 32 values ----------------------------------
// As on AVX-512, with madd_epi16 in place of dpwssd: maddubs, then the sub-block's scale on each pair sum.

struct SuperHead256 {
  alignas(32) int16_t scales[16];  // Q4_K / Q5_K: its eight scales; Q6_K: its sixteen
  __m256i bias;                    // Q6_K: -32 * its sixteen scales, int16
  float d;
};

template <int64_t T>
__attribute__((target(TANDEM_AVX2_F16C))) inline void super_head_avx2(const uint8_t* blk, SuperHead256& h, float* offsets) {
  if (T == Q6_K) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(h.scales), sc);
    h.bias = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
    h.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 208));
    return;
  }
  h.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
  const float dmin = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2));
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    k_scale_min(blk + 4, s, sc, mn);
    h.scales[s] = static_cast<int16_t>(sc);
    offsets[s] = -(dmin * mn);
  }
}

// Step sb (0..7) of a block of 256: the unsigned weights of values 32 sb .. 32 sb + 31, and the scale of
// each of their 16 pair sums.
template <int64_t T>
__attribute__((target(TANDEM_AVX2_F16C))) inline __m256i super_step_avx2(const uint8_t* blk, const SuperHead256& h, int sb,
                                                                  __m256i& scale) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  if (T == Q6_K) {
    const int half = sb / 4, within = sb % 4;  // within: which 32 of the half's 128 values
    const uint8_t* ql = blk + 64 * half + (within % 2) * 32;
    const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * half));
    const __m256i nib = within >= 2 ? _mm256_and_si256(_mm256_srli_epi16(l, 4), low) : _mm256_and_si256(l, low);
    const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * within)), _mm256_set1_epi8(3));
    scale = _mm256_set_m128i(_mm_set1_epi16(h.scales[2 * sb + 1]), _mm_set1_epi16(h.scales[2 * sb]));
    return _mm256_or_si256(nib, _mm256_slli_epi16(top, 4));
  }
  constexpr bool five = T == Q5_K;
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (five ? 48 : 16) + 32 * (sb / 2)));
  __m256i u = sb % 2 ? _mm256_and_si256(_mm256_srli_epi16(packed, 4), low) : _mm256_and_si256(packed, low);
  if (five) {
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << sb));
    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(high, bit), bit), _mm256_set1_epi8(16)));
  }
  scale = _mm256_set1_epi16(h.scales[sb]);
  return u;
}

template <int64_t T, int R, int C>
__attribute__((target(TANDEM_AVX2_F16C))) void super_tile_avx2(const Part& part, const Activations& a, int64_t r, int64_t i,
                                                        float* y, int64_t y_stride) {
  constexpr int64_t B = kFormat<T>.bytes;
  constexpr bool aff = kFormat<T>.affine;
  const int64_t k = a.k, supers = k / kSuper, groups = k / kBlock;
  float* offsets = aff ? offset_scratch(R * groups).data() : nullptr;
  const int8_t* xq = a.super_q.data() + i * k;
  const float* xs = a.super_scale.data() + i * supers;
  __m256 acc[R][C];
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    SuperHead256 h[R];
    for (int j = 0; j < R; ++j)
      super_head_avx2<T>(part.bytes + (r + j) * part.row_bytes + b * B, h[j], aff ? offsets + j * groups + 8 * b : nullptr);
    __m256i sum[R][C];
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c)
        sum[j][c] = T == Q6_K ? _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                      a.sums16.data() + (i + c) * (k / 16) + 16 * b)),
                                                  h[j].bias)
                              : _mm256_setzero_si256();
    for (int sb = 0; sb < 8; ++sb)
      for (int j = 0; j < R; ++j) {
        __m256i scale;
        const __m256i u = super_step_avx2<T>(part.bytes + (r + j) * part.row_bytes + b * B, h[j], sb, scale);
        for (int c = 0; c < C; ++c) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * k + b * kSuper + 32 * sb));
          sum[j][c] = _mm256_add_epi32(sum[j][c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), scale));
        }
      }
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < C; ++c)
        acc[j][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j][c]), _mm256_set1_ps(h[j].d * xs[c * supers + b]), acc[j][c]);
  }
  for (int j = 0; j < R; ++j)
    for (int c = 0; c < C; ++c) {
      float value = hsum8(acc[j][c]);
      if (aff) value += dot_floats256(offsets + j * groups, a.super_scaled_sum.data() + (i + c) * groups, groups);
      y[(i + c) * y_stride + part.column + r + j] = value;
    }
}

// Two weight rows at a time for one or two activation rows, one for three or four; more activation rows
// take tiles of at most four over each weight row in turn.
template <int64_t T>
__attribute__((target(TANDEM_AVX2_F16C))) void rows_super_avx2(const Part& part, const Activations& a,
                                                        const std::vector<int32_t>&, int64_t m, int64_t r0, int64_t r1,
                                                        float* y, int64_t y_stride) {
  if (m <= 2) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
      if (m == 1) super_tile_avx2<T, 2, 1>(part, a, r, 0, y, y_stride);
      else super_tile_avx2<T, 2, 2>(part, a, r, 0, y, y_stride);
    }
    for (; r < r1; ++r) {
      if (m == 1) super_tile_avx2<T, 1, 1>(part, a, r, 0, y, y_stride);
      else super_tile_avx2<T, 1, 2>(part, a, r, 0, y, y_stride);
    }
    return;
  }
  const int64_t chunks = (m + 3) / 4;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0, i = 0; t < chunks; ++t) {
      const int64_t c = (m - i) / (chunks - t);
      if (c == 1) super_tile_avx2<T, 1, 1>(part, a, r, i, y, y_stride);
      else if (c == 2) super_tile_avx2<T, 1, 2>(part, a, r, i, y, y_stride);
      else if (c == 3) super_tile_avx2<T, 1, 3>(part, a, r, i, y, y_stride);
      else super_tile_avx2<T, 1, 4>(part, a, r, i, y, y_stride);
      i += c;
    }
}

#endif

using Rows = void (*)(const Part&, const Activations&, const std::vector<int32_t>&, int64_t, int64_t, int64_t, float*,
                     int64_t);

#ifdef TANDEM_X86
template <template <int64_t> class Table>
Rows by_type(int64_t type) {
  switch (type) {
    case Q4_0: return Table<Q4_0>::rows;
    case Q4_1: return Table<Q4_1>::rows;
    case Q5_0: return Table<Q5_0>::rows;
    case Q5_1: return Table<Q5_1>::rows;
    case Q8_0: return Table<Q8_0>::rows;
    case Q4_K: return Table<Q4_K>::rows;
    case Q5_K: return Table<Q5_K>::rows;
    case Q6_K: return Table<Q6_K>::rows;
    default: TORCH_CHECK(false, "gguf: unsupported block type ", type);
  }
}
template <int64_t T>
struct VnniRows {
  static constexpr Rows pick() {
    if constexpr (super_format(T)) return rows_super_vnni<T>;
    else return rows_vnni<T>;
  }
  static constexpr Rows rows = pick();
};
template <int64_t T>
struct Avx2Rows {
  static constexpr Rows pick() {
    if constexpr (super_format(T)) return rows_super_avx2<T>;
    else return rows_avx2<T>;
  }
  static constexpr Rows rows = pick();
};
#endif

Rows pick(const std::string& path, int64_t type) {
  format_of(type);  // an unsupported type fails here, on every path
#ifdef TANDEM_X86
  if (path == "vnni") return by_type<VnniRows>(type);
  if (path == "avx2") return by_type<Avx2Rows>(type);
#endif
  if (path == "portable") return super_format(type) ? rows_portable_k : rows_portable;
  TORCH_CHECK(false, "gguf: no code path '", path, "' in this build");
}

}  // namespace

// y = x [W_1; W_2; ...]^T for weights stored as GGUF blocks: x [M, K] float32, weights[p] uint8
// [N_p, K / values * bytes] of block type types[p]. Returns [M, sum N_p]: the parts side by side
// (a fused q/k/v projection whose parts are of different types), the activations quantized once.
torch::Tensor gguf_linear(const torch::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                          const std::string& path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "gguf: x must be [M, K] float32");
  TORCH_CHECK(weights.size() == types.size() && !weights.empty(), "gguf: one type per weight part");
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<Part> parts;
  int64_t columns = 0;
  for (size_t p = 0; p < weights.size(); ++p) {
    const torch::Tensor& w = weights[p];
    const Format lay = format_of(types[p]);
    TORCH_CHECK(k % lay.values == 0, "gguf: K = ", k, " is not a whole number of ", lay.values, "-value blocks");
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous() &&
                    w.size(1) == k / lay.values * lay.bytes,
                "gguf: weight part ", p, " does not hold [N, K] in its block type");
    parts.push_back({w.data_ptr<uint8_t>(), types[p], w.size(0), w.size(1), columns, lay.bias, lay.affine});
    columns += w.size(0);
  }
  torch::Tensor y = torch::empty({m, columns}, x.options());
  if (m == 0 || columns == 0) return y;
  const torch::Tensor xc = x.contiguous();
  const auto is_super = [](const Part& p) { return super_format(p.type); };
  Activations a = quantize_activations(xc.data_ptr<float>(), m, k, !std::all_of(parts.begin(), parts.end(), is_super),
                                       std::any_of(parts.begin(), parts.end(), is_super));
  const bool vnni = path == "vnni";
  if (vnni && std::any_of(parts.begin(), parts.end(), [](const Part& p) { return nibble_format(p.type); }))
    add_nibble_order(a, m);
  std::vector<std::vector<int32_t>> starts(parts.size());
  std::vector<Rows> kernels;
  for (size_t p = 0; p < parts.size(); ++p) {
    kernels.push_back(pick(path, parts[p].type));
    if (parts[p].bias && !super_format(parts[p].type) && path != "portable" && !(path == "avx2" && parts[p].type == Q8_0))
      starts[p] = bias_start(vnni && nibble_format(parts[p].type) ? a.quad_nibbles : a.quad_sum, parts[p].bias);
  }
  float* out = y.data_ptr<float>();
  // every part's rows as one range, so that a small part does not leave a thread idle
  at::parallel_for(0, columns, kTaskRows, [&](int64_t begin, int64_t end) {
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t lo = std::max(begin, parts[p].column), hi = std::min(end, parts[p].column + parts[p].rows);
      if (lo < hi) kernels[p](parts[p], a, starts[p], m, lo - parts[p].column, hi - parts[p].column, out, columns);
    }
  });
  return y;
}

// The float weights of rows `rows` ([T] int64) of a [N, row_bytes] block tensor: [T, K].
torch::Tensor gguf_dequantize_rows(const torch::Tensor& weight, int64_t type, int64_t k, const torch::Tensor& rows) {
  const Format lay = format_of(type);
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kUInt8 && weight.is_contiguous() &&
                  weight.size(1) == k / lay.values * lay.bytes && k % lay.values == 0,
              "gguf: weight does not hold rows of K values in its block type");
  const torch::Tensor index = rows.to(torch::kLong).contiguous();
  const int64_t count = index.numel(), n = weight.size(0);
  torch::Tensor out = torch::empty({count, k}, torch::TensorOptions().dtype(torch::kFloat32));
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t t = 0; t < count; ++t) TORCH_CHECK(idx[t] >= 0 && idx[t] < n, "gguf: row ", idx[t], " is out of range");
  const uint8_t* bytes = weight.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, count, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) dequantize_row(bytes + idx[t] * weight.size(1), type, k, dst + t * k);
  });
  return out;
}

TORCH_LIBRARY(tandem_gguf, lib) {
  lib.def("linear(Tensor x, Tensor[] weights, int[] types, str path) -> Tensor");
  lib.def("dequantize_rows(Tensor weight, int type, int k, Tensor rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem_gguf, CPU, lib) {
  lib.impl("linear", gguf_linear);
  lib.impl("dequantize_rows", gguf_dequantize_rows);
}
