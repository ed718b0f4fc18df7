// The "vnni" kernel of `"draft_weights": "int4"` (core/int4_kernels.py builds
// and loads it): 4-bit weights times activations rounded to 8 bits per 32 columns,
// multiplied with AVX512-VNNI integer dot products. torch's CPU int4 kernel
// turns each weight into a float before multiplying, and that work, not the
// bytes, set its pace: Qwen2.5-Coder-1.5B's 112 linears (0.82 GB at 4 bits)
// took 54 ms at one token on the 2-core AVX512 Xeon, this one 34 ms
// (benchmarks/kernels/bench_draft_linears.py).
//
// Layout (int4_kernels.tile):
//   w:  [n/4][k/128][4 rows][64 bytes]  a row's 128 columns, two a byte
//       (column 2j in the low half, 2j + 1 in the high), 4 rows side by side,
//       so that each thread reads one stream;
//   sl: [n/4][k/128][2][4 rows][4 groups] bf16: each group's step, then its zero
//       (w = (q - 8) * step + zero, q in 0..15: torch's int4 convention, so
//       that both kernels read the same rounded values).
// Each call rounds x to int8 per group of 32 columns (scale = max|x| / 127):
// sum_k w x = sum_g a_g (step_g * sum q xq + low_g * sum xq), a_g the group's
// activation scale, low_g = zero_g - 8 step_g.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 4
#define COLS 128
#define TMAX 4

static inline float bf16_to_float(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t b;
  memcpy(&b, &f, 4);
  if ((b & 0x7F800000u) == 0x7F800000u) return (uint16_t)((b >> 16) | ((b & 0xFFFF) ? 0x40 : 0));
  b += 0x7FFF + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

// xq: [T][k/128][2][64] int8 (a chunk's even columns, then its odd ones);
// xs, xsum: [T][k/128][16] float (each of the 4 groups' scale over 4 lanes; its
// scaled sum of xq, a quarter a lane, so that the lanes add up to it)
static inline __attribute__((always_inline)) void row_tile(
    const uint8_t* w, const uint16_t* sl, const int8_t* xq, const float* xs, const float* xsum,
    int T, int chunks, const __m512i* lanes_of_row, float* dots) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[ROWS][TMAX];
  for (int i = 0; i < ROWS; ++i)
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
  for (int c = 0; c < chunks; ++c) {
    const uint8_t* wc = w + (size_t)c * ROWS * 64;
    for (int line = 0; line < ROWS; ++line)  // 8 chunks ahead: the stream outruns the hardware prefetcher
      _mm_prefetch((const char*)(wc + 8 * ROWS * 64 + 64 * line), _MM_HINT_T0);
    __m512i steps_lows = _mm512_loadu_si512(sl + (size_t)c * 2 * ROWS * 4);
    __m512 steps = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(steps_lows)), 16));
    __m512 zeros = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(steps_lows, 1)), 16));
    __m512 lows = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), steps, zeros);
    __m512i x_even[TMAX], x_odd[TMAX];
    __m512 scale[TMAX], sum[TMAX];
    for (int t = 0; t < T; ++t) {
      const size_t at = (size_t)t * chunks + c;
      x_even[t] = _mm512_loadu_si512(xq + at * COLS);
      x_odd[t] = _mm512_loadu_si512(xq + at * COLS + 64);
      scale[t] = _mm512_loadu_ps(xs + at * 16);
      sum[t] = _mm512_loadu_ps(xsum + at * 16);
    }
    for (int i = 0; i < ROWS; ++i) {
      __m512i b = _mm512_loadu_si512(wc + 64 * i);
      __m512i low_q = _mm512_and_si512(b, nibble);
      __m512i high_q = _mm512_and_si512(_mm512_srli_epi16(b, 4), nibble);
      __m512 step = _mm512_permutexvar_ps(lanes_of_row[i], steps);
      __m512 low = _mm512_permutexvar_ps(lanes_of_row[i], lows);
      for (int t = 0; t < T; ++t) {
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low_q, x_even[t]);
        d = _mm512_dpbusd_epi32(d, high_q, x_odd[t]);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(step, scale[t]),
                                    _mm512_fmadd_ps(low, sum[t], acc[i][t]));
      }
    }
  }
  for (int i = 0; i < ROWS; ++i)
    for (int t = 0; t < T; ++t) dots[i * TMAX + t] = _mm512_reduce_add_ps(acc[i][t]);
}

#define RUN_T(TT)                                                                              \
  static void run_##TT(const uint8_t* w, const uint16_t* sl, const int8_t* xq, const float* xs, \
                       const float* xsum, int chunks, int n, const uint16_t* bias,             \
                       uint16_t* out) {                                                       \
    __m512i lanes_of_row[ROWS];                                                               \
    for (int i = 0; i < ROWS; ++i) {                                                          \
      int r = 4 * i;                                                                          \
      lanes_of_row[i] = _mm512_set_epi32(r + 3, r + 3, r + 3, r + 3, r + 2, r + 2, r + 2,     \
                                         r + 2, r + 1, r + 1, r + 1, r + 1, r, r, r, r);      \
    }                                                                                         \
    _Pragma("omp parallel for schedule(static)") for (int tile = 0; tile < n / ROWS; ++tile) { \
      float dots[ROWS * TMAX];                                                                \
      row_tile(w + (size_t)tile * chunks * ROWS * 64, sl + (size_t)tile * chunks * 2 * ROWS * 4, \
               xq, xs, xsum, TT, chunks, lanes_of_row, dots);                                 \
      for (int i = 0; i < ROWS; ++i) {                                                        \
        const int r = tile * ROWS + i;                                                        \
        const float b = bias ? bf16_to_float(bias[r]) : 0.f;                                  \
        for (int t = 0; t < TT; ++t) out[(size_t)t * n + r] = float_to_bf16(dots[i * TMAX + t] + b); \
      }                                                                                       \
    }                                                                                         \
  }
RUN_T(1)
RUN_T(2)
RUN_T(3)
RUN_T(4)

static void round_activations(const uint16_t* x, int T, int k, int8_t* xq, float* xs, float* xsum) {
  const int chunks = k / COLS;
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < chunks; ++c) {
      const size_t at = (size_t)t * chunks + c;
      for (int g = 0; g < 4; ++g) {
        const uint16_t* xg = x + (size_t)t * k + c * COLS + g * 32;
        float v[32], peak = 0.f;
        for (int j = 0; j < 32; ++j) {
          v[j] = bf16_to_float(xg[j]);
          const float a = v[j] < 0 ? -v[j] : v[j];
          if (a > peak) peak = a;
        }
        const float inv = peak > 0 ? 127.f / peak : 0.f;
        int total = 0;
        for (int j = 0; j < 32; ++j) {
          const int q = (int)__builtin_roundf(v[j] * inv);
          const int col = g * 32 + j;
          total += q;
          xq[at * COLS + (col & 1) * 64 + col / 2] = (int8_t)q;
        }
        for (int lane = 0; lane < 4; ++lane) {
          xs[at * 16 + 4 * g + lane] = peak / 127.f;
          xsum[at * 16 + 4 * g + lane] = peak / 127.f * (float)total / 4.f;
        }
      }
    }
}

// x: [T][k] bf16, T in 1..4; bias: [n] bf16 or NULL; out: [T][n] bf16.
// Returns 0; -1 where the shapes do not fit, -2 where memory ran out.
int int4_vnni_mm(const uint8_t* w, const uint16_t* sl, const uint16_t* x, int T, int n, int k,
                 const uint16_t* bias, uint16_t* out) {
  if (T < 1 || T > TMAX || k % COLS || n % ROWS) return -1;
  const int chunks = k / COLS;
  int8_t* xq = (int8_t*)malloc((size_t)T * k);
  float* xs = (float*)malloc((size_t)T * chunks * 16 * 2 * sizeof(float));
  if (!xq || !xs) {
    free(xq);
    free(xs);
    return -2;
  }
  float* xsum = xs + (size_t)T * chunks * 16;
  round_activations(x, T, k, xq, xs, xsum);
  switch (T) {
    case 1: run_1(w, sl, xq, xs, xsum, chunks, n, bias, out); break;
    case 2: run_2(w, sl, xq, xs, xsum, chunks, n, bias, out); break;
    case 3: run_3(w, sl, xq, xs, xsum, chunks, n, bias, out); break;
    default: run_4(w, sl, xq, xs, xsum, chunks, n, bias, out); break;
  }
  free(xq);
  free(xs);
  return 0;
}
