// Products on the CPU for a decode step's few rows (an AR step at batch 1 is 1 row, a verification of P + 1 tokens
// P + 1 rows; float32 Dense products up to a batch of 64 rows), float32 or bf16 operands, float32 products, sums
// and result: y[M, N] = x[M, K] . w[K, N] (a Dense layer's kernel) and y[M, N] = x[M, K] . e[N, K]^T (a tied LM
// head's [V, d] embedding: each y[m, n] one row of e against x[m]).
//
// Why: XLA CPU runs a one-row product as a matrix-vector kernel that streams the weights at the memory's
// rate, but 2-8 rows as a matrix-matrix kernel that streams them ~1.5-2x slower, so verifying 4 tokens cost
// ~1.3 AR steps where the bandwidth bound says ~1.0. Here every row reads each weight once, in memory order:
// for w [K, N] the K rows are split into contiguous chunks (one per thread of XLA's intra-op pool), each
// chunk's rows read 8 at a time with software prefetch, and the chunks' partial y summed in chunk order; for
// e [N, K] the N rows are split into contiguous chunks, read 4 rows at a time with software prefetch, each row
// once against all M rows of x. Those one-pass loops take 1-8 rows, and 1-24 float32 rows.
//
// More float32 rows of w [K, N] (a decode step at batch 25-64, a batch's verification) run as register tiles of 4
// rows x 96 columns over panels of 96 rows of w, the next panel prefetched to L2, tiles of columns and groups of rows
// split over the threads. XLA's dot packs w at every call, where a decode step's w is read once for all rows: it
// took 1.45-1.5x the kernel's time at 9-16 rows, 1.07-1.1x at 64-128 (SmolLM2's 30 layers' Dense shapes, 2 threads,
// 2026-12-05); in a whole decode step it is as fast from ~128 rows, which `cpu_products.F32_ROWS` sends to it.
//
// bf16 operands of w [K, N] on a CPU with avx512_bf16 go through its pair instruction (vdpbf16ps: a float32 lane
// adds x[k + 1] w[k + 1], then x[k] w[k], both products exact), at 1-8 rows and, tiled as float32 is, at more:
// SmolLM2's 30 layers' Dense products took 0.63x / 0.74x / 0.84x XLA's bf16 dots' time at 16 / 32 / 64 rows, and
// 0.81x the widening loop's at 8 rows (2 threads of an AMD EPYC Zen 4, 2026-12-05,
// docs/experiments/bf16-pairs-2026-12-05). So do a tied head's bf16 rows of e [N, K] (1-8 rows of x): SmolLM2's
// head took 0.50x the widening loop's time at 8 rows and 0.70x at 4, 1.08-1.10x alone at 1 row, where the AR step
// in the decode loop took 0.99-1.04x (2026-12-06, docs/experiments/l2-prefetch-2026-12-06).
//
// Every y[m, n] is computed by the same operations in the same order whatever M is (rows never mix): for each
// chunk of K (the split depends on K and the pool's size only) one float32 multiply-add chain in k order (by bf16
// pairs: one chain of pairs), the chunks' sums added in order. So a token's products in a P + 1-row verification
// equal, bit for bit, its products in a one-row AR step, and a row's products are the same at any batch size.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define CARRYOVER_BF16_PAIRS 1
#endif

namespace ffi = xla::ffi;

namespace {

using namespace carryover;

constexpr int kMaxRows = 8;
// float32 rows in the one-pass loops; above, w [K, N] goes to the tiled loop (the same sums either way: in SmolLM2's
// AR generation the one-pass loop took 0.92x the tiled loop's time at batch 24 and 1.08x at 32, alternated in one
// process, 2 threads, 2026-12-05), and e [N, K] is refused
constexpr int kMaxF32Rows = 24;
// rows of w read together: 8 rather than 4 loads and stores y half as often (SmolLM2's 30 layers' products took
// 0.90-0.95x the time at 1-8 float32 rows, alternated in one process, 2026-12-04)
constexpr int kBlock = 8;
// software prefetches of weights ask for L2 (prefetcht1), not L1 (likely: an L1 prefetch holds one of L1's few
// miss buffers until its line arrives, and L1 keeps the y rows and x the loop reuses). SmolLM2's 30 layers' products
// from memory took 0.84-0.91x the time at 1-8 float32 rows and 0.70-0.84x in bf16, its tied head 0.71-0.85x in
// float32 and 0.63-0.98x in bf16; an AR step at batch 1 0.79-0.87x, a verification of 4 or 8 tokens 0.82-0.86x
// (2 threads of an AMD EPYC Zen 4, alternated in one process, 2026-12-06, docs/experiments/l2-prefetch-2026-12-06)
constexpr int kLocality = 2;
// rows of w prefetched ahead: the next block (16, the block after next, took 1.02-1.04x the time at 1-8 rows in
// float32, 1.04-1.06x in bf16; 32-48 more still; SmolLM2's 30 layers, alternated, 2026-12-05)
constexpr int kPrefetch = 8;
// rows of e ahead, prefetched line by line as a block is read (the hardware prefetchers alone do not keep enough
// lines in flight): with it, and 4 rows of e read together, SmolLM2's tied head [49152, 576] from memory at 1 / 4 / 8
// rows of x took 3.9 / 4.6 / 5.2 ms, against 5.0 / 6.0 / 7.3 one row of e at a time without it, and XLA's dot
// 4.2 / 6.7 / 8.3 (float32, 2 threads, alternated in one process, 2026-12-05)
constexpr int kRowsAhead = 4;
// more than 8 rows of x above kRowsOfL1 bytes: 8 rows and the rest in turn over blocks of kRowsOfBlock rows of e
// (read from L2 the second time: 74 KB at K 576 in float32)
constexpr int64_t kRowsOfL1 = 26 * 1024, kRowsOfBlock = 32;
// the tiled path (more than kMaxF32Rows rows): 4 x 6 vectors of accumulators, 96 rows of w a panel (4 x 6 over 96
// took 0.63-0.97x the time of 6 x 4, 8 x 3, 3 x 8 or 2 x 12 tiles and of 48- to 192-row panels at 64 rows; prefetching
// the next panel to L2 0.87-0.92x against none: SmolLM2's 30 layers' Dense shapes, 2 threads, 2026-12-05,
// docs/experiments/tiled-products-2026-12-05/tile_variants.cc)
constexpr int kTileRows = 4, kTileVecs = 6, kPanel = 96;
// rows a task takes, so that a pool of more threads than column tiles has work (16-64 rows a task took the same time
// as one task a column tile at 16-128 rows on 2 threads)
constexpr int64_t kGroupRows = 64;

// x's values in a block of rows of w, for the column loop. With many rows of x their 8 M broadcasts and the block's
// 8 vectors of w exceed the 32 vector registers, and hoisted out of the loop (as the compiler does) they are spilled
// as whole vectors, 64 bytes a reload; behind an opaque pointer they stay 4-byte broadcasts folded into the
// multiply-adds. SmolLM2's 30 layers' products with the weights in L3 (the arithmetic's own rate) took 0.86-0.93x
// the time at 6-8 float32 rows, 0.96x at 5, the same at 4 and 1.08x at 3 (so from 5 rows on; A/A 0.95-1.01); from
// memory it shows only where the weight stream is fast (2 threads, AMD EPYC Zen 4, alternated, 2026-12-06,
// docs/experiments/verify-arithmetic-2026-12-06)
template <int M, typename T>
inline const T* opaque(const T* p) {
  if constexpr (M >= 5) asm("" : "+r"(p));
  return p;
}

// y[0:M, :] += x[0:M, k0:k1] . w[k0:k1, :] (each y vector's M accumulators stay in registers over a block).
// W: float, or uint16_t for bf16 weights (widened to float as they are read; float32 products and sums).
template <typename W, int M>
void accumulate(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  int64_t k = k0;
  for (; k + kBlock <= k1; k += kBlock) {
    float b[M][kBlock];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < kBlock; ++j) b[m][j] = x[m * K + k + j];
    const bool ahead = k + kPrefetch + kBlock <= k1;
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
      if (ahead)
        for (int j = 0; j < kBlock; ++j) __builtin_prefetch(w + (k + kPrefetch + j) * N + n, 0, kLocality);
      v16 wv[kBlock];
      for (int j = 0; j < kBlock; ++j) wv[j] = load(w + (k + j) * N + n);
      const float* bp = opaque<M>(&b[0][0]);
      for (int m = 0; m < M; ++m) {
        v16 acc = load(y + m * N + n);
        for (int j = 0; j < kBlock; ++j) acc += bp[m * kBlock + j] * wv[j];
        store(y + m * N + n, acc);
      }
    }
    for (; n < N; ++n)
      for (int m = 0; m < M; ++m) {
        float acc = y[m * N + n];
        for (int j = 0; j < kBlock; ++j) acc = madd(b[m][j], value(w[(k + j) * N + n]), acc);
        y[m * N + n] = acc;
      }
  }
  for (; k < k1; ++k)
    for (int m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = madd(x[m * K + k], value(w[k * N + n]), y[m * N + n]);
}

// y = x[:, k0:k1] . w[k0:k1, :] for M <= 8, all M rows in one pass over w (rows 5-8 in a second pass over
// L2-sized slices of w took 1.19x the time at 8 rows in float32, 1.28x in bf16: SmolLM2's 30 layers, alternated,
// 2026-12-05)
template <typename W, int M>
void chunk(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  std::memset(y, 0, sizeof(float) * M * N);
  accumulate<W, M>(x, w, y, K, N, k0, k1);
}

// y[:, n + r] = x . e[n + r, :]^T for r < R: R rows of e read together (R x M accumulators), each y's K / 16
// vectors summed in order, then the fixed tree, then the K % 16 tail (the same operations whatever R and M).
template <typename W, int M, int R>
void rows_block(const float* x, const W* e, float* y, int64_t K, int64_t N, int64_t n, bool ahead) {
  const int64_t K16 = K / 16 * 16;
  v16 acc[R][M] = {};
  for (int64_t k = 0; k < K16; k += 16) {
    if (ahead)
      for (int r = 0; r < R; ++r) __builtin_prefetch(e + (n + kRowsAhead + r) * K + k, 0, kLocality);
    v16 ev[R];
    for (int r = 0; r < R; ++r) ev[r] = load(e + (n + r) * K + k);
    for (int m = 0; m < M; ++m) {
      const v16 xv = load(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] += xv * ev[r];
    }
  }
  float total[R][M];
  sums<R * M>(&acc[0][0], &total[0][0]);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = total[r][m];
      for (int64_t k = K16; k < K; ++k) s = madd(x[m * K + k], value(e[(n + r) * K + k]), s);
      y[m * N + n + r] = s;
    }
}

// y[:, n0:n1] = x . e[n0:n1, :]^T, 4 rows of e at a time up to 6 rows of x, 2 at 7-8 (R x M accumulators, R rows
// of e and a row of x stay within the 32 vector registers: 4 rows of e at 8 rows of x took 1.11-1.14x the time of 2
// in float32, 1.17-1.18x in bf16, at 7 rows 0.99-1.04x / 1.05-1.09x; from memory, prefetched to L2, alternated,
// 2026-12-06; one row at a time 1.11x at 8 rows, 2026-12-05), one at a time above (in blocks: kRowsOfL1)
template <typename W, int M>
void rows_of(const float* x, const W* e, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  if constexpr (M > kMaxRows) {
    if (M * K * int64_t(sizeof(float)) > kRowsOfL1) {
      // x's first 8 rows, then the rest, over each block of e in L2: an x beyond L1 (36 KB at 16 rows of K 576) was
      // read from L2 for every row of e (SmolLM2's head at 16 rows took 3.1-3.5x the time of 8, blocked 1.7-2.1x)
      for (int64_t b = n0; b < n1; b += kRowsOfBlock) {
        const int64_t b1 = b + kRowsOfBlock < n1 ? b + kRowsOfBlock : n1;
        rows_of<W, kMaxRows>(x, e, y, K, N, b, b1);
        rows_of<W, M - kMaxRows>(x + kMaxRows * K, e, y + kMaxRows * N, K, N, b, b1);
      }
      return;
    }
  }
  constexpr int R = M <= 6 ? 4 : M <= kMaxRows ? 2 : 1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_block<W, M, R>(x, e, y, K, N, n, n + kRowsAhead + R <= N);
  for (; n < n1; ++n) rows_block<W, M, 1>(x, e, y, K, N, n, false);
}

// The K chunks of a product: the same split for the few-row and the tiled paths (so a row's sums never depend on
// the row count), [c * size, min(K, (c + 1) * size)) for c < chunks.
struct KSplit {
  int64_t size, chunks;
};
inline KSplit k_split(int64_t K, int64_t threads) {
  const int64_t per = (K + threads - 1) / threads, size = (per + kBlock - 1) / kBlock * kBlock;
  return {size, (K + size - 1) / size};
}

// rows m0..m0+MR of y's columns n..n+16 NV (or the `cols` < 16 columns at n for NV == 0) over k0..k1: each sum's
// chain continues from `run` (row m at run[(m - r0) * rs]; none at a chunk's first panel) and goes back to `run`,
// or at a chunk's last panel is added to y (stride N; written, for chunk 0). `pf`: the next panel's first row in
// these columns.
template <int MR, int NV>
void tile(const float* x, const float* w, float* y, float* run, int64_t rs, int64_t K, int64_t N, int64_t r0,
          int64_t m0, int64_t n, int cols, int64_t k0, int64_t k1, bool first, int finish, const float* pf) {
  if constexpr (NV == 0) {
    for (int m = 0; m < MR; ++m)
      for (int c = 0; c < cols; ++c) {
        float acc = first ? 0.0f : run[(m0 - r0 + m) * rs + c];
        for (int64_t k = k0; k < k1; ++k) acc = madd(x[(m0 + m) * K + k], w[k * N + n + c], acc);
        float* out = finish ? y + (m0 + m) * N + n + c : run + (m0 - r0 + m) * rs + c;
        *out = finish == 2 ? *out + acc : acc;
      }
  } else {
    v16 acc[MR][NV];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NV; ++j) acc[m][j] = first ? v16{} : load(run + (m0 - r0 + m) * rs + 16 * j);
    for (int64_t k = k0; k < k1; ++k) {
      if (pf)
        for (int j = 0; j < NV; ++j) __builtin_prefetch(pf + (k - k0) * N + 16 * j, 0, kLocality);
      v16 wv[NV];
      for (int j = 0; j < NV; ++j) wv[j] = load(w + k * N + n + 16 * j);
      for (int m = 0; m < MR; ++m) {
        const float b = x[(m0 + m) * K + k];
        for (int j = 0; j < NV; ++j) acc[m][j] += b * wv[j];
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NV; ++j) {
        float* out = finish ? y + (m0 + m) * N + n + 16 * j : run + (m0 - r0 + m) * rs + 16 * j;
        store(out, finish == 2 ? load(out) + acc[m][j] : acc[m][j]);
      }
  }
}

#ifdef CARRYOVER_BF16_PAIRS
// bf16 by pairs of rows of w: two rows' 32 columns -> the (w[k], w[k + 1]) pairs of columns {0-3, 8-11, 16-19, 24-27}
// (lo) and {4-7, 12-15, 20-23, 28-31} (hi), as vdpbf16ps takes them; a missing second row (K odd) pairs with zeros.
// Sums run in that column order ("pair order") and `unpair` puts them back.
inline void pair_rows(const uint16_t* a, const uint16_t* b, __m512i& lo, __m512i& hi) {
  const __m512i va = _mm512_loadu_si512(a), vb = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
  lo = _mm512_unpacklo_epi16(va, vb);
  hi = _mm512_unpackhi_epi16(va, vb);
}
// (x[k], x[k + 1]) in every lane; x_last: (x[k], 0) for K's last row where K is odd
inline __m512i x_pair(const uint16_t* x) {
  int32_t p;
  std::memcpy(&p, x, sizeof p);
  return _mm512_set1_epi32(p);
}
inline __m512i x_last(const uint16_t* x) { return _mm512_set1_epi32(int32_t(x[0])); }
inline v16 dot2(v16 acc, __m512i x, __m512i w) {
  __m512 a;
  std::memcpy(&a, &acc, sizeof a);
  a = _mm512_dpbf16_ps(a, (__m512bh)x, (__m512bh)w);
  std::memcpy(&acc, &a, sizeof a);
  return acc;
}
// the same chain for one column (the N % 32 columns), in scalar float32: the products are exact, so each add is
// vdpbf16ps's own rounding (it also flushes subnormals; these columns take this path at every row count)
inline float dot2(float acc, const uint16_t* x, uint16_t w0, uint16_t w1, bool last) {
  acc = acc + (last ? 0.0f : value(x[1]) * value(w1));
  return acc + value(x[0]) * value(w0);
}
// pair order -> columns 0-15 and 16-31
inline void unpair(v16 lo, v16 hi, v16& c0, v16& c1) {
  const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  __m512 a, b;
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
  const __m512 r0 = _mm512_permutex2var_ps(a, i0, b), r1 = _mm512_permutex2var_ps(a, i1, b);
  std::memcpy(&c0, &r0, sizeof c0);
  std::memcpy(&c1, &r1, sizeof c1);
}

// y[0:M, :] += x[0:M, k:k + 2P] . w[k:k + 2P, :] by P pairs (`odd`: the last pair is K's last row alone); y in pair
// order
template <int M, int P, bool odd>
void pairs_block(const uint16_t* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t k, bool ahead) {
  const int64_t N32 = N / 32 * 32;
  __m512i xb[M][P];
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p)
      xb[m][p] = odd && p == P - 1 ? x_last(x + m * K + k + 2 * p) : x_pair(x + m * K + k + 2 * p);
  for (int64_t n = 0; n < N32; n += 32) {
    if (ahead)
      for (int j = 0; j < kBlock; ++j) __builtin_prefetch(w + (k + kPrefetch + j) * N + n, 0, kLocality);
    __m512i lo[P], hi[P];
    for (int p = 0; p < P; ++p) {
      const int64_t r = k + 2 * p;
      pair_rows(w + r * N + n, odd && p == P - 1 ? nullptr : w + (r + 1) * N + n, lo[p], hi[p]);
    }
    for (int m = 0; m < M; ++m) {
      v16 a = load(y + m * N + n), b = load(y + m * N + n + 16);
      for (int p = 0; p < P; ++p) a = dot2(a, xb[m][p], lo[p]), b = dot2(b, xb[m][p], hi[p]);
      store(y + m * N + n, a);
      store(y + m * N + n + 16, b);
    }
  }
  for (int64_t n = N32; n < N; ++n)
    for (int m = 0; m < M; ++m) {
      float acc = y[m * N + n];
      for (int p = 0; p < P; ++p) {
        const int64_t r = k + 2 * p;
        const bool last = odd && p == P - 1;
        acc = dot2(acc, x + m * K + r, w[r * N + n], last ? 0 : w[(r + 1) * N + n], last);
      }
      y[m * N + n] = acc;
    }
}

// y[0:M, :] += x[0:M, k0:k1] . w[k0:k1, :] by pairs, kBlock rows of w at a time; y in pair order
template <int M>
void accumulate_pairs(const uint16_t* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  static_assert(kBlock == 8, "blocks of 4 pairs");
  int64_t k = k0;
  for (; k + kBlock <= k1; k += kBlock) pairs_block<M, 4, false>(x, w, y, K, N, k, k + kPrefetch + kBlock <= k1);
  switch (k1 - k) {  // the chunk's last rows (K's end: a chunk is whole blocks otherwise)
    case 1: return pairs_block<M, 1, true>(x, w, y, K, N, k, false);
    case 2: return pairs_block<M, 1, false>(x, w, y, K, N, k, false);
    case 3: return pairs_block<M, 2, true>(x, w, y, K, N, k, false);
    case 4: return pairs_block<M, 2, false>(x, w, y, K, N, k, false);
    case 5: return pairs_block<M, 3, true>(x, w, y, K, N, k, false);
    case 6: return pairs_block<M, 3, false>(x, w, y, K, N, k, false);
    case 7: return pairs_block<M, 4, true>(x, w, y, K, N, k, false);
    default: return;
  }
}

template <int M>
void chunk_pairs(const uint16_t* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  std::memset(y, 0, sizeof(float) * M * N);
  accumulate_pairs<M>(x, w, y, K, N, k0, k1);
}

// bf16 rows of e ahead: the bytes float32's kRowsAhead rows are (4 rows took 1.04-1.09x the time at 1 row of x,
// 1.10x at 4: SmolLM2's tied head from memory, alternated, 2026-12-06)
constexpr int kPairRowsAhead = 2 * kRowsAhead;

// A tied head's bf16 rows by pairs: y[:, n + r] = x . e[n + r, :]^T for r < R, each y's K / 32 pair vectors summed
// in order by vdpbf16ps (lane i: the pairs (2i, 2i + 1) of each 32 columns), then `sum`'s tree, then the K % 32
// tail pair by pair in scalar (the same operations whatever R and M)
template <int M, int R>
void rows_block_pairs(const uint16_t* x, const uint16_t* e, float* y, int64_t K, int64_t N, int64_t n, bool ahead) {
  const int64_t K32 = K / 32 * 32;
  v16 acc[R][M] = {};
  for (int64_t k = 0; k < K32; k += 32) {
    if (ahead)
      for (int r = 0; r < R; ++r) __builtin_prefetch(e + (n + kPairRowsAhead + r) * K + k, 0, kLocality);
    __m512i ev[R];
    for (int r = 0; r < R; ++r) ev[r] = _mm512_loadu_si512(e + (n + r) * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_loadu_si512(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] = dot2(acc[r][m], xv, ev[r]);
    }
  }
  float total[R][M];
  sums<R * M>(&acc[0][0], &total[0][0]);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = total[r][m];
      const uint16_t* er = e + (n + r) * K;
      for (int64_t k = K32; k < K; k += 2) s = dot2(s, x + m * K + k, er[k], k + 1 < K ? er[k + 1] : 0, k + 1 >= K);
      y[m * N + n + r] = s;
    }
}

// y[:, n0:n1] = x . e[n0:n1, :]^T by pairs, R rows of e at a time as `rows_of` reads them
template <int M>
void rows_of_pairs(const uint16_t* x, const uint16_t* e, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  constexpr int R = M <= 6 ? 4 : 2;
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows_block_pairs<M, R>(x, e, y, K, N, n, n + kPairRowsAhead + R <= N);
  for (; n < n1; ++n) rows_block_pairs<M, 1>(x, e, y, K, N, n, false);
}

// the tiled loop's tile by pairs: NV / 2 groups of 32 columns (NV 0: `cols` < 32 columns in scalar); `run` in pair
// order, y (at a chunk's last panel) in column order
template <int MR, int NV>
void tile(const uint16_t* x, const uint16_t* w, float* y, float* run, int64_t rs, int64_t K, int64_t N, int64_t r0,
          int64_t m0, int64_t n, int cols, int64_t k0, int64_t k1, bool first, int finish, const uint16_t* pf) {
  if constexpr (NV == 0) {
    for (int m = 0; m < MR; ++m)
      for (int c = 0; c < cols; ++c) {
        float acc = first ? 0.0f : run[(m0 - r0 + m) * rs + c];
        for (int64_t k = k0; k < k1; k += 2)
          acc = dot2(acc, x + (m0 + m) * K + k, w[k * N + n + c], k + 1 < K ? w[(k + 1) * N + n + c] : 0, k + 1 >= K);
        float* out = finish ? y + (m0 + m) * N + n + c : run + (m0 - r0 + m) * rs + c;
        *out = finish == 2 ? *out + acc : acc;
      }
  } else {
    static_assert(NV % 2 == 0, "groups of 32 columns");
    v16 acc[MR][NV];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NV; ++j) acc[m][j] = first ? v16{} : load(run + (m0 - r0 + m) * rs + 16 * j);
    // pairs of rows, then K's last row alone where K is odd
    auto step = [&](int64_t k, auto last_row) __attribute__((always_inline)) {
      constexpr bool last = decltype(last_row)::value;
      if (pf)
        for (int j = 0; j < NV / 2; ++j) {
          __builtin_prefetch(pf + (k - k0) * N + 32 * j, 0, kLocality);
          __builtin_prefetch(pf + (k + 1 - k0) * N + 32 * j, 0, kLocality);
        }
      __m512i xb[MR];
      for (int m = 0; m < MR; ++m) xb[m] = last ? x_last(x + (m0 + m) * K + k) : x_pair(x + (m0 + m) * K + k);
      for (int j = 0; j < NV / 2; ++j) {
        __m512i lo, hi;
        pair_rows(w + k * N + n + 32 * j, last ? nullptr : w + (k + 1) * N + n + 32 * j, lo, hi);
        for (int m = 0; m < MR; ++m)
          acc[m][2 * j] = dot2(acc[m][2 * j], xb[m], lo), acc[m][2 * j + 1] = dot2(acc[m][2 * j + 1], xb[m], hi);
      }
    };
    const int64_t k2 = k1 - (k1 - k0) % 2;
    for (int64_t k = k0; k < k2; k += 2) step(k, std::false_type{});
    if (k2 < k1) step(k2, std::true_type{});
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NV; j += 2) {
        if (!finish) {
          store(run + (m0 - r0 + m) * rs + 16 * j, acc[m][j]);
          store(run + (m0 - r0 + m) * rs + 16 * j + 16, acc[m][j + 1]);
          continue;
        }
        v16 c0, c1;
        unpair(acc[m][j], acc[m][j + 1], c0, c1);
        float* out = y + (m0 + m) * N + n + 16 * j;
        store(out, finish == 2 ? load(out) + c0 : c0);
        store(out + 16, finish == 2 ? load(out + 16) + c1 : c1);
      }
  }
}
#endif

// y[r0:r1, n:n + 16 NV] (or `cols` columns), chunk by chunk of K, panel by panel; `run` holds the running sums,
// [r1 - r0, 16 kTileVecs]
template <int NV, typename W>
void tile_columns(const W* x, const W* w, float* y, float* run, int64_t r0, int64_t r1, int64_t K,
                  int64_t N, int64_t n, int cols, KSplit split) {
  constexpr int64_t rs = 16 * kTileVecs;
  for (int64_t c = 0; c < split.chunks; ++c) {
    const int64_t a = c * split.size, b = a + split.size < K ? a + split.size : K;
    for (int64_t k0 = a; k0 < b; k0 += kPanel) {
      const int64_t k1 = k0 + kPanel < b ? k0 + kPanel : b;
      const bool first = k0 == a;
      // the last panel of chunk 0 writes y, of a later chunk adds to it (in chunk order: y = (c0 + c1) + c2 ...)
      const int finish = k1 < b ? 0 : c == 0 ? 1 : 2;
      const W* pf = k1 < K ? w + k1 * N + n : nullptr;
      int64_t m = r0;
      for (; m + kTileRows <= r1; m += kTileRows)
        tile<kTileRows, NV>(x, w, y, run, rs, K, N, r0, m, n, cols, k0, k1, first, finish, m == r0 ? pf : nullptr);
      for (; m < r1; ++m) tile<1, NV>(x, w, y, run, rs, K, N, r0, m, n, cols, k0, k1, first, finish, nullptr);
    }
  }
}

// y = x . w for more rows than the one-pass loops take: tasks of a column tile (16 kTileVecs columns, then 16-column
// tiles, 32 by bf16 pairs, then the last N % 16 or N % 32 columns) by a group of kGroupRows rows, over the threads
template <typename W>
ffi::Error Tiled(ffi::ThreadPool& pool, const W* x, const W* w, float* y, int64_t M, int64_t K, int64_t N,
                 int64_t threads) {
  const KSplit split = k_split(K, threads);
  constexpr int64_t wide = 16 * kTileVecs;
  constexpr int unit = std::is_same_v<W, float> ? 1 : 2;  // vectors of a narrow tile
  const int64_t full = N / wide, narrow = (N - full * wide) / (16 * unit), rest = N % (16 * unit);
  const int64_t groups = (M + kGroupRows - 1) / kGroupRows, tasks = (full + narrow + (rest ? 1 : 0)) * groups;
  parallel_for(pool, tasks, threads, [=](int64_t task) {
    const int64_t t = task / groups, r0 = task % groups * kGroupRows, r1 = r0 + kGroupRows < M ? r0 + kGroupRows : M;
    thread_local std::vector<float> run;  // every panel's first pass writes it before it is read
    if (static_cast<int64_t>(run.size()) < (r1 - r0) * wide) run.resize((r1 - r0) * wide);
    if (t < full) {
      tile_columns<kTileVecs>(x, w, y, run.data(), r0, r1, K, N, t * wide, 0, split);
    } else if (t < full + narrow) {
      tile_columns<unit>(x, w, y, run.data(), r0, r1, K, N, full * wide + (t - full) * 16 * unit, 0, split);
    } else {
      tile_columns<0>(x, w, y, run.data(), r0, r1, K, N, N - rest, int(rest), split);
    }
  });
  return ffi::Error::Success();
}

template <typename W>
using ChunkFn = void (*)(const float*, const W*, float*, int64_t, int64_t, int64_t, int64_t);

template <typename W, std::size_t... I>
constexpr std::array<ChunkFn<W>, sizeof...(I)> by_k(std::index_sequence<I...>) {
  return {chunk<W, int(I) + 1>...};
}
template <typename W, std::size_t... I>
constexpr std::array<ChunkFn<W>, sizeof...(I)> by_n(std::index_sequence<I...>) {
  return {rows_of<W, int(I) + 1>...};
}

// the one-pass loop for `rows`, or nullptr: 1-8 rows, 1-24 float32 ones
template <bool kRows, typename W>
ChunkFn<W> chunk_fn(int64_t rows) {
  constexpr int most = std::is_same_v<W, float> ? kMaxF32Rows : kMaxRows;
  static constexpr auto table = kRows ? by_n<W>(std::make_index_sequence<most>())
                                      : by_k<W>(std::make_index_sequence<most>());
  return rows >= 1 && rows <= most ? table[rows - 1] : nullptr;
}

// y = x . w by `fn` (a one-pass loop) over the chunks of K (w [K, N]: chunk 0 writes y, the later ones partial sums,
// added to y in chunk order) or of N (e [N, K]: each chunk its own columns of y)
template <bool kRows, typename X, typename W, typename Fn>
void by_chunks(ffi::ThreadPool& pool, Fn fn, const X* xs, const W* ws, float* out, int64_t rows, int64_t K, int64_t N,
               int64_t threads) {
  const KSplit split = k_split(K, threads);
  const int64_t total = kRows ? N : K, size = kRows ? (N + threads - 1) / threads : split.size;
  const int64_t chunks = (total + size - 1) / size;
  std::vector<float> partials(kRows ? 0 : (chunks - 1) * rows * N);
  float* part = partials.data();
  parallel_for(pool, chunks, threads, [=](int64_t c) {
    const int64_t a = c * size, b = a + size < total ? a + size : total;
    fn(xs, ws, kRows || c == 0 ? out : part + (c - 1) * rows * N, K, N, a, b);
  });
  for (int64_t c = 1; !kRows && c < chunks; ++c) {
    const float* p = part + (c - 1) * rows * N;
    for (int64_t i = 0; i < rows * N; ++i) out[i] += p[i];
  }
}

#ifdef CARRYOVER_BF16_PAIRS
using PairFn = void (*)(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
template <bool kRows, std::size_t... I>
constexpr std::array<PairFn, sizeof...(I)> pair_fns(std::index_sequence<I...>) {
  if constexpr (kRows) return {rows_of_pairs<int(I) + 1>...};
  else return {chunk_pairs<int(I) + 1>...};
}

// bf16 x [M, K] . w [K, N] by pairs: 1-8 rows in one pass over w (then y back from pair order), more tiled
ffi::Error Pairs(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* w, float* y, int64_t M, int64_t K,
                 int64_t N, int64_t threads) {
  if (M > kMaxRows) return Tiled(pool, x, w, y, M, K, N, threads);
  static constexpr auto table = pair_fns<false>(std::make_index_sequence<kMaxRows>());
  by_chunks<false>(pool, table[M - 1], x, w, y, M, K, N, threads);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n + 32 <= N; n += 32) {
      v16 c0, c1;
      unpair(load(y + m * N + n), load(y + m * N + n + 16), c0, c1);
      store(y + m * N + n, c0);
      store(y + m * N + n + 16, c1);
    }
  return ffi::Error::Success();
}
#endif

// T: the operands' dtype (F32, or BF16: by pairs where the CPU has avx512_bf16, else x widened to float once and w
// as it is read); y is float32 either way.
template <bool kRows, ffi::DataType T>
ffi::Error Products(ffi::ThreadPool pool, ffi::Buffer<T> x, ffi::Buffer<T> w, ffi::ResultBuffer<ffi::F32> y) {
  using W = ffi::NativeType<T>;
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2)
    return ffi::Error::InvalidArgument("cpu_products: x, w and y must be 2-D");
  const int64_t rows = xd[0], K = xd[1], N = kRows ? wd[0] : wd[1];
  if ((kRows ? wd[1] : wd[0]) != K || yd[0] != rows || yd[1] != N)
    return ffi::Error::InvalidArgument("cpu_products: shapes do not match x[M, K] . w = y[M, N]");
#ifdef CARRYOVER_BF16_PAIRS
  constexpr bool pairs = !kRows && !std::is_same_v<W, float>;
#else
  constexpr bool pairs = false;
#endif
  constexpr bool tiled = !kRows && (std::is_same_v<W, float> || pairs);
  const ChunkFn<W> fn = chunk_fn<kRows, W>(rows);
  if (rows < 1 || (fn == nullptr && !tiled))
    return ffi::Error::InvalidArgument(
        "cpu_products: 1 to 8 rows, 24 in float32, any in float32 w [K, N] (and bf16 with avx512_bf16)");
  if (K == 0 || N == 0) {
    std::memset(y->typed_data(), 0, sizeof(float) * rows * N);
    return ffi::Error::Success();
  }
  // the split depends on K, N and the pool's size only (never on `rows`): every row's sums run in one order
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
#ifdef CARRYOVER_BF16_PAIRS
  if constexpr (pairs) return Pairs(pool, x.typed_data(), w.typed_data(), y->typed_data(), rows, K, N, threads);
  if constexpr (kRows && !std::is_same_v<W, float>) {  // a tied head's bf16 rows (1-8, checked above)
    static constexpr auto table = pair_fns<true>(std::make_index_sequence<kMaxRows>());
    by_chunks<true>(pool, table[rows - 1], x.typed_data(), w.typed_data(), y->typed_data(), rows, K, N, threads);
    return ffi::Error::Success();
  }
#endif
  if constexpr (std::is_same_v<W, float>) {
    if (tiled && rows > kMaxF32Rows)
      return Tiled(pool, x.typed_data(), w.typed_data(), y->typed_data(), rows, K, N, threads);
    by_chunks<kRows>(pool, fn, x.typed_data(), w.typed_data(), y->typed_data(), rows, K, N, threads);
  } else {
    std::vector<float> wide(rows * K);
    for (int64_t i = 0; i < rows * K; ++i) wide[i] = value(x.typed_data()[i]);
    by_chunks<kRows>(pool, fn, wide.data(), w.typed_data(), y->typed_data(), rows, K, N, threads);
  }
  return ffi::Error::Success();
}


// The argmax of a tied head's float32 logits y[m, :] = x[m] . e^T, screened through its bf16 copy (the greedy token of
// an AR step or of each verified row, without the float32 head's whole stream). a[m, n] = bf16(x[m]) . eb[n] by pairs
// lies within b[m, n] = c |x[m]| |e[n]| (+ a tiny absolute slack) of y[m, n] as the float32 kernel computes it: x and
// e rounded to bf16 (2^-8 each, so 2^-7 + 2^-16 relative on each product, which is exact in float32), both sums'
// float32 rounding (gamma_{K+1} each) and Cauchy-Schwarz for sum |x_k e_k|. Every n whose y could be the row's
// largest has a[m, n] + b[m, n] >= max_n' (a[m, n'] - b[m, n']); those few n (a median of 5 and at most 163 of
// SmolLM2's 49,152 at 1,600 of its states) get y[m, n] by `rows_block`'s float32 operations (the bits the full head
// has, whatever the row count), and the first n with the largest y wins, as an argmax over the full head does. A row
// whose |x|, bound or candidate logits are not finite gets -1 (the caller takes the full head's argmax there).
#ifdef CARRYOVER_BF16_PAIRS
// columns a block of the screen's upper maxima, and a piece of a chunk computed and read back in one go
constexpr int64_t kScreenBlock = 256, kScreenPiece = 2048;

ffi::Error HeadArgmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> xb,
                      ffi::Buffer<ffi::F32> e, ffi::Buffer<ffi::BF16> eb, ffi::Buffer<ffi::F32> norms,
                      ffi::ResultBuffer<ffi::S32> y) {
  const auto xd = x.dimensions(), ed = e.dimensions();
  const auto xbd = xb.dimensions(), ebd = eb.dimensions();
  if (xd.size() != 2 || ed.size() != 2 || xbd.size() != 2 || ebd.size() != 2 || xbd[0] != xd[0] || xbd[1] != xd[1] ||
      ebd[0] != ed[0] || ebd[1] != ed[1] || xd[1] != ed[1] ||
      norms.dimensions().size() != 1 || norms.dimensions()[0] != ed[0] || y->dimensions().size() != 1 ||
      y->dimensions()[0] != xd[0])
    return ffi::Error::InvalidArgument("cpu_head_argmax: x [M, K] (and its bf16), e [N, K] (and its bf16), |e| [N]");
  const int64_t M = xd[0], K = xd[1], N = ed[0];
  int32_t* out = y->typed_data();
  if (M == 0) return ffi::Error::Success();
  if (N == 0 || K == 0) {
    for (int64_t m = 0; m < M; ++m) out[m] = N == 0 ? -1 : 0;
    return ffi::Error::Success();
  }
  const float* xs = x.typed_data();
  const float* es = e.typed_data();
  const float* wn = norms.typed_data();
  const uint16_t* xbs = reinterpret_cast<const uint16_t*>(xb.typed_data());
  const uint16_t* ebs = reinterpret_cast<const uint16_t*>(eb.typed_data());
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
  // one chunk of whole screen blocks a thread; each computes its columns' bf16 logits a piece at a time and reads
  // them back while they are in cache: the row's max(a - b) over the chunk and max(a + b) over each block
  const int64_t blocks = (N + kScreenBlock - 1) / kScreenBlock;
  const int64_t size = (blocks + threads - 1) / threads * kScreenBlock, chunks = (N + size - 1) / size;
  thread_local std::vector<float> approx, lows, highs;
  approx.resize(size_t(kMaxRows) * N);
  lows.resize(size_t(kMaxRows) * chunks);
  highs.resize(size_t(kMaxRows) * blocks);
  float *a_all = approx.data(), *lo_all = lows.data(), *hi_all = highs.data();
  static constexpr auto table = pair_fns<true>(std::make_index_sequence<kMaxRows>());
  const double u = std::ldexp(1.0, -24), gamma = (K + 1) * u / (1 - (K + 1) * u);
  // 1e-3 over the bound covers the rounding of |x|, |e| and of the bound's own products and sums
  const double c = (std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 2.1 * gamma) * 1.001;
  // the largest |e_n|, NaN if any is (then every row falls back to the full head)
  __m512 most_v = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) {
    const __m512 v = _mm512_loadu_ps(wn + n);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    most_v = _mm512_max_ps(v, most_v);
  }
  float most = _mm512_reduce_max_ps(most_v);
  for (; n < N; ++n) {
    if (std::isnan(wn[n])) nan = 1;
    most = wn[n] > most ? wn[n] : most;
  }
  if (nan) most = NAN;
  float rs[kMaxRows], ss[kMaxRows];
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {  // 8 rows of x for each stream of eb
    const int64_t rows = M - m0 < kMaxRows ? M - m0 : kMaxRows;
    for (int64_t i = 0; i < rows; ++i) {
      const float* xm = xs + (m0 + i) * K;
      double sq = 0;
      for (int64_t k = 0; k < K; ++k) sq += double(xm[k]) * xm[k];
      const double norm = std::sqrt(sq);
      rs[i] = float(c * norm), ss[i] = float(norm * most * 1e-6 + 1e-30);
    }
    const PairFn fn = table[rows - 1];
    parallel_for(pool, chunks, threads, [&](int64_t ch) {
      const int64_t c0 = ch * size, c1 = c0 + size < N ? c0 + size : N;
      float* lo = lo_all + ch * kMaxRows;
      for (int64_t i = 0; i < rows; ++i) lo[i] = -INFINITY;
      for (int64_t p0 = c0; p0 < c1; p0 += kScreenPiece) {
        const int64_t p1 = p0 + kScreenPiece < c1 ? p0 + kScreenPiece : c1;
        fn(xbs + m0 * K, ebs, a_all, K, N, p0, p1);
        for (int64_t i = 0; i < rows; ++i) {
          const float* a = a_all + i * N;
          const __m512 rv = _mm512_set1_ps(rs[i]), sv = _mm512_set1_ps(ss[i]);
          __m512 lv = _mm512_set1_ps(-INFINITY);
          for (int64_t b0 = p0; b0 < p1; b0 += kScreenBlock) {
            const int64_t b1 = b0 + kScreenBlock < p1 ? b0 + kScreenBlock : p1;
            __m512 hv = _mm512_set1_ps(-INFINITY);
            int64_t j = b0;
            for (; j + 16 <= b1; j += 16) {  // NaN lanes never win a max_ps against a number
              const __m512 av = _mm512_loadu_ps(a + j), bv = _mm512_fmadd_ps(rv, _mm512_loadu_ps(wn + j), sv);
              lv = _mm512_max_ps(_mm512_sub_ps(av, bv), lv);
              hv = _mm512_max_ps(_mm512_add_ps(av, bv), hv);
            }
            float hi = _mm512_reduce_max_ps(hv);
            for (; j < b1; ++j) {
              const float bj = rs[i] * wn[j] + ss[i];
              lo[i] = a[j] - bj > lo[i] ? a[j] - bj : lo[i];
              hi = a[j] + bj > hi ? a[j] + bj : hi;
            }
            hi_all[i * blocks + b0 / kScreenBlock] = hi;
          }
          const float l = _mm512_reduce_max_ps(lv);
          lo[i] = l > lo[i] ? l : lo[i];
        }
      }
    });
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t m = m0 + i;
      const float* xm = xs + m * K;
      const float* a = a_all + i * N;
      float thr = -INFINITY;
      for (int64_t ch = 0; ch < chunks; ++ch) thr = lo_all[ch * kMaxRows + i] > thr ? lo_all[ch * kMaxRows + i] : thr;
      if (!std::isfinite(rs[i]) || !std::isfinite(ss[i]) || !std::isfinite(thr)) {
        out[m] = -1;
        continue;
      }
      // only the blocks whose largest a + b reaches the threshold hold candidates
      const __m512 rv = _mm512_set1_ps(rs[i]), sv = _mm512_set1_ps(ss[i]), tv = _mm512_set1_ps(thr);
      int32_t best = -1;
      float top = 0;
      bool bad = false;
      auto exact = [&](int64_t j) {
        float v;
        rows_block<float, 1, 1>(xm, es + j * K, &v, K, 1, 0, false);
        if (std::isnan(v)) bad = true;
        else if (best < 0 || v > top) best = int32_t(j), top = v;
      };
      for (int64_t blk = 0; blk < blocks; ++blk) {
        if (!(hi_all[i * blocks + blk] >= thr)) continue;
        const int64_t b0 = blk * kScreenBlock, b1 = b0 + kScreenBlock < N ? b0 + kScreenBlock : N;
        int64_t j = b0;
        for (; j + 16 <= b1; j += 16) {
          __mmask16 hit = _mm512_cmp_ps_mask(
              _mm512_add_ps(_mm512_loadu_ps(a + j), _mm512_fmadd_ps(rv, _mm512_loadu_ps(wn + j), sv)), tv, _CMP_GE_OQ);
          while (hit) {
            exact(j + __builtin_ctz(hit));
            hit &= hit - 1;
          }
        }
        for (; j < b1; ++j)
          if (a[j] + (rs[i] * wn[j] + ss[i]) >= thr) exact(j);
      }
      out[m] = bad ? -1 : best;
    }
  }
  return ffi::Error::Success();
}
#else
ffi::Error HeadArgmax(ffi::ThreadPool, ffi::Buffer<ffi::F32>, ffi::Buffer<ffi::BF16>, ffi::Buffer<ffi::F32>,
                      ffi::Buffer<ffi::BF16>, ffi::Buffer<ffi::F32>, ffi::ResultBuffer<ffi::S32>) {
  return ffi::Error::InvalidArgument("cpu_head_argmax: this build has no avx512_bf16 pairs");
}
#endif

}  // namespace

#define CARRYOVER_BIND(T)            \
  ffi::Ffi::Bind()                   \
      .Ctx<ffi::ThreadPool>()        \
      .Arg<ffi::Buffer<ffi::T>>()    \
      .Arg<ffi::Buffer<ffi::T>>()    \
      .Ret<ffi::Buffer<ffi::F32>>()
// w [K, N] (a Dense kernel) and e [N, K] (a tied embedding), float32 or bf16
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProducts, (Products<false, ffi::F32>), CARRYOVER_BIND(F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsRows, (Products<true, ffi::F32>), CARRYOVER_BIND(F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsBf16, (Products<false, ffi::BF16>), CARRYOVER_BIND(BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsRowsBf16, (Products<true, ffi::BF16>), CARRYOVER_BIND(BF16));

// the greedy token of a tied float32 head, screened by its bf16 copy: x, bf16(x), e, bf16(e), |e| -> int32 [M]
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuHeadArgmax, HeadArgmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

// What the bf16 products run on this build (cpu_products.py routes bf16 rows by it): 1 by vdpbf16ps pairs (w [K, N]
// at any number of rows, e [N, K] at 1-8), 0 widened to float32 (1-8 rows)
extern "C" int carryover_cpu_products_bf16_pairs() {
#ifdef CARRYOVER_BF16_PAIRS
  return 1;
#else
  return 0;
#endif
}
