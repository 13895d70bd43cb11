// What every kernel's x86 code shares: the detection of an x86-64 build, the target strings of its
// code paths, and the small vector helpers the kernels use alike (a horizontal sum, float dot
// products, exp on 8 lanes). The caller chooses a path from the CPU's features at run time
// (engine/kernels/*.py), so one build serves every x86-64 CPU: each function is compiled for the
// features its path needs, and only called where the CPU has them.
//
// Each helper computes every value the same way wherever it is called, so the kernels' rows stay
// bit for bit the same whatever the number of rows. hsum8 and the dot products are static: each file
// has its own copy, which the compiler inlines into that file's kernels (one out-of-line copy shared
// by the files was not inlined everywhere).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#define TANDEM_X86 1
#endif

#ifdef TANDEM_X86

#include <immintrin.h>

#include <cstdint>

// The code paths' target features. AVX2 with FMA: every AVX2 kernel; with F16C where it widens float16
// (the GGUF blocks' scales, a float16 KV cache).
#define TANDEM_AVX2 "avx2,fma"
#define TANDEM_AVX2_F16C "avx2,fma,f16c"
// AVX-512 for float kernels (row_linear.cpp), and AVX-512 VNNI for integer ones (with F16C for GGUF blocks).
#define TANDEM_AVX512 "avx2,fma,avx512f,avx512dq"
#define TANDEM_AVX512_VNNI "avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"
#define TANDEM_AVX512_VNNI_F16C "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"

// The sum of 8 float lanes: the two halves added, then pairs, then the last two.
__attribute__((target(TANDEM_AVX2))) static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum a[j] * b[j] on 8 lanes in order, their sum, then the tail one value at a time.
__attribute__((target(TANDEM_AVX2))) static inline float dot_floats256(const float* a, const float* b, int64_t count) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
  float total = hsum8(acc);
  for (; j < count; ++j) total += a[j] * b[j];
  return total;
}

// sum a[j] * b[j] on 16 lanes in order, the tail masked into the same lanes, then their sum.
__attribute__((target(TANDEM_AVX512))) static inline float dot_floats512(const float* a, const float* b, int64_t count) {
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
  if (j < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - j)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, a + j), _mm512_maskz_loadu_ps(tail, b + j), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// exp on 8 float lanes, for attention's softmax and the layer's SiLU: the Cephes polynomial, as in
// avx_mathfun. Each lane is computed alike, so a value's result does not depend on where it falls in
// a block of 8.
__attribute__((target(TANDEM_AVX2))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#endif  // TANDEM_X86
