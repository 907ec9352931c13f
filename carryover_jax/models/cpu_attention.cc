// Attention of a decode step over one cache segment on the CPU: for every batch row and K/V head, the R = G x T
// queries of its query heads against the slots lower[b, t] <= s < limit[b, t] of a head-major cache
// k, v [B, Hkv, S, D] (float32, or bf16 widened as it is read), float32 scores, softmax statistics and
// output. Returns what `layers._dense_part` returns for the segment: the max score m, the sum l of
// exp(score - m) and the unnormalised output o = sum exp(score - m) v, so segments merge as before; a query
// that sees no slot gets m = -1e30, l = 0, o = 0.
//
// Why: XLA CPU reads a cache segment in fixed 128-slot chunks up to the batch's longest row (`_live_loop`),
// through small matrix products that stream the K/V at ~15 GB/s, ~1/3 of a batch-64 SmolLM2 step. Here each
// (row, K/V head) reads only its own slots, K once and V once, in memory order, on XLA's intra-op threads (at batch 1
// each pair's query rows over all of them: below).
//
// Every query's result depends on its own q, its slots and D only (its scores in slot order, its sums in slot
// order with one lane tree), never on R, T or the other rows: a token's attention in a verification of P + 1
// tokens equals, bit for bit, its attention in a one-token AR step over the same cache.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_common.h"
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace carryover;

constexpr float kNegInf = -1e30f;  // layers.NEG_INF
constexpr int kMaxVectors = 32;    // D <= 512 (16 lanes each)
// K rows prefetched ahead of the block being read, and each block's V rows while its K is read (the V pass then
// finds them in L2): a batch-64 step's 30 layers of cache reads took 0.84x the time in float32, 0.80x as bf16 bits
// (A/A 1.006; 2026-12-05, attention-prefetch-2026-12-05); 16 and 64 slots ahead did no better
constexpr int64_t kSlotsAhead = 32;

// One (batch row, K/V head): q [R, D] float32, k/v [S, D], slot ranges [lo[r], hi[r]) -> m [R], l [R], o [R, D].
// NV = D / 16 (0: read at run time from `nv`). Slots go in blocks of 16 (a block of K or V stays in L1 while
// every query that sees it reads it); `scores` holds R x (16-padded width) floats.
template <typename KV, int NV>
void attend(const float* q, const KV* k, const KV* v, const int64_t* lo, const int64_t* hi, int64_t R, int64_t nv,
            float scale, float* m, float* l, float* o, std::vector<float>& scores) {
  constexpr bool kInPlace = std::is_same_v<KV, float>;  // float32 K/V read where they lie (below)
  const int64_t n_v = NV > 0 ? NV : nv, D = 16 * n_v;
  int64_t begin = INT64_MAX, end = 0;
  for (int64_t r = 0; r < R; ++r)
    if (lo[r] < hi[r]) {
      begin = lo[r] < begin ? lo[r] : begin;
      end = hi[r] > end ? hi[r] : end;
    }
  std::memset(o, 0, sizeof(float) * R * D);
  for (int64_t r = 0; r < R; ++r) m[r] = kNegInf, l[r] = 0.0f;
  if (begin >= end) return;
  const int64_t width = (end - begin + 15) / 16 * 16;
  if (static_cast<int64_t>(scores.size()) < R * width) scores.resize(R * width);
  float* sc = scores.data();
  // scores of 16 slots at a time for every query that sees one of them (slots past `end`: zero keys, unused)
  for (int64_t s0 = begin; s0 < end; s0 += 16) {
    for (int64_t i = s0; i < s0 + 16 && i < end; ++i)
      for (int64_t j = 0; j < n_v; ++j) {
        if (i + kSlotsAhead < end) __builtin_prefetch(k + (i + kSlotsAhead) * D + 16 * j);
        __builtin_prefetch(v + i * D + 16 * j);
      }
    // float32 keys: a full block is read where it lies (in L1 once the first query has read it), and only the last,
    // partial block is copied, padded with zero keys. Copying every block to a local array first (64 vectors at D
    // 64: more than the registers, so a copy in memory) took 1.05-1.10x the time of batch-64 generation at
    // 200-400-token prompts (alternated in one process, A/A 1.004; 2026-12-06,
    // docs/experiments/verify-arithmetic-2026-12-06). bf16 keys are still widened once into that local array (read
    // in place, every query would widen them again; 1.05x the time at batch 64, inside bf16's A/A spread).
    const KV* kp = k + s0 * D;
    KV tail[kInPlace ? 16 * 16 * kMaxVectors : 1];  // 16 slots of up to 512 dims
    v16 kb[kInPlace ? 1 : 16][NV > 0 ? NV : kMaxVectors];
    if constexpr (kInPlace) {
      if (s0 + 16 > end) {
        std::memset(tail, 0, sizeof(KV) * 16 * D);
        std::memcpy(tail, kp, sizeof(KV) * (end - s0) * D);
        kp = tail;
      }
    } else {
      for (int i = 0; i < 16; ++i)
        for (int64_t j = 0; j < n_v; ++j) kb[i][j] = s0 + i < end ? load(kp + i * D + 16 * j) : v16{};
    }
    auto key = [&](int i, int64_t j) __attribute__((always_inline)) {
      if constexpr (kInPlace) return load(kp + i * D + 16 * j);
      else return kb[i][j];
    };
    for (int64_t r = 0; r < R; ++r) {
      if (s0 >= hi[r] || s0 + 16 <= lo[r]) continue;
      const float* qr = q + r * D;
      v16 acc[16];
      for (int i = 0; i < 16; ++i) {
        acc[i] = load(qr) * key(i, 0);
        for (int64_t j = 1; j < n_v; ++j) acc[i] += load(qr + 16 * j) * key(i, j);
      }
      store(sc + r * width + (s0 - begin), sums16(acc) * scale);
    }
  }
  // per query: its max, then exp(score - max) in place and their sum (16 slots at a time from its first slot)
  for (int64_t r = 0; r < R; ++r) {
    if (lo[r] >= hi[r]) continue;
    float* row = sc + r * width + (lo[r] - begin);
    const int64_t n = hi[r] - lo[r];
    float mx = row[0];
    for (int64_t i = 1; i < n; ++i) mx = row[i] > mx ? row[i] : mx;
    v16 total{};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const v16 p = exp_nonpositive(load(row + i) - mx);
      store(row + i, p);
      total += p;
    }
    if (i < n) {
      float tail[16] = {};
      std::memcpy(tail, row + i, sizeof(float) * (n - i));
      v16 p = exp_nonpositive(load(tail) - mx);
      for (int64_t j = n - i; j < 16; ++j) p[j] = 0.0f;
      store(tail, p);
      std::memcpy(row + i, tail, sizeof(float) * (n - i));
      total += p;
    }
    m[r] = mx;
    l[r] = sum(total);
  }
  // outputs: each query's sum over its slots in slot order, 16 value rows at a time
  for (int64_t s0 = begin; s0 < end; s0 += 16) {
    // float32 values read in place (rows past `end` are never read: a query's slots end by then), bf16 ones widened
    // once, as the keys
    const KV* vp = v + s0 * D;
    v16 vb[kInPlace ? 1 : 16][NV > 0 ? NV : kMaxVectors];
    if constexpr (!kInPlace)
      for (int i = 0; i < 16; ++i)
        for (int64_t j = 0; j < n_v; ++j) vb[i][j] = s0 + i < end ? load(vp + i * D + 16 * j) : v16{};
    auto value_row = [&](int64_t i, int64_t j) __attribute__((always_inline)) {
      if constexpr (kInPlace) return load(vp + i * D + 16 * j);
      else return vb[i][j];
    };
    for (int64_t r = 0; r < R; ++r) {
      const int64_t a = lo[r] > s0 ? lo[r] : s0, z = hi[r] < s0 + 16 ? hi[r] : s0 + 16;
      if (a >= z) continue;
      const float* p = sc + r * width - begin;
      float* out = o + r * D;
      v16 acc[NV > 0 ? NV : kMaxVectors];
      for (int64_t j = 0; j < n_v; ++j) acc[j] = load(out + 16 * j);
      for (int64_t s = a; s < z; ++s)
        for (int64_t j = 0; j < n_v; ++j) acc[j] += p[s] * value_row(s - s0, j);
      for (int64_t j = 0; j < n_v; ++j) store(out + 16 * j, acc[j]);
    }
  }
}

template <typename KV>
using AttendFn = void (*)(const float*, const KV*, const KV*, const int64_t*, const int64_t*, int64_t, int64_t, float,
                          float*, float*, float*, std::vector<float>&);

template <typename KV>
AttendFn<KV> attend_fn(int64_t nv) {  // unrolled for the common head dims 16, 32, 64, 128, 256
  switch (nv) {
    case 1: return attend<KV, 1>;
    case 2: return attend<KV, 2>;
    case 4: return attend<KV, 4>;
    case 8: return attend<KV, 8>;
    case 16: return attend<KV, 16>;
    default: return attend<KV, 0>;
  }
}

// --- The tiled path: a cache-free forward's `Prefix` segment (many queries a K/V head), q, k, v all float32 or bf16
// Scores in tiles of 16 queries (a vector lane each, packed once) x 16 keys (each key's dims broadcast from its row),
// outputs in tiles of 4 queries x D. bf16 multiplies pairs of bf16 values with float32 sums (AVX512-BF16's VDPBF16PS
// where the CPU has it) and rounds the probabilities to bf16 before the values' product, as einsum's bf16 part does
// (`layers._dense_part`). A query's result depends on its own q, slots and D only: every sum runs in one order, over
// slot units that start at multiples of the unit, and slots outside its range add exact zeros. Why: the per-query
// path above (one query's dot products by lane trees, bf16 queries widened) ran a feature pass's attention at ~90-100
// GFLOP/s on a 2-core EPYC; this path runs it 1.41x (float32) and 2.20x (bf16) as fast
// (docs/experiments/bf16-attention-2026-12-06).

typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline u32x16 load32(const uint32_t* p) { u32x16 v; std::memcpy(&v, p, sizeof v); return v; }

// acc + a.x b over each lane's bf16 pair: the odd element's product added first, then the even one's (VDPBF16PS)
inline v16 dot2(v16 acc, u32x16 a, u32x16 b) {
#if defined(__AVX512BF16__)
  return (v16)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
#else
  const u32x16 top = (u32x16){} + 0xFFFF0000u;
  const u32x16 ah = a & top, bh = b & top, al = a << 16, bl = b << 16;
  v16 fah, fbh, fal, fbl;
  std::memcpy(&fah, &ah, 64), std::memcpy(&fbh, &bh, 64), std::memcpy(&fal, &al, 64), std::memcpy(&fbl, &bl, 64);
  acc += fah * fbh;
  return acc + fal * fbl;
#endif
}

// two vectors of finite floats -> their bf16 roundings to nearest even (as astype(bfloat16)), lane by lane one pair:
// a's in the low half, b's in the high half
inline u32x16 bf16_pairs(v16 a, v16 b) {
  u32x16 x, y;
  std::memcpy(&x, &a, 64), std::memcpy(&y, &b, 64);
  x = x + 0x7FFFu + ((x >> 16) & 1u);
  y = y + 0x7FFFu + ((y >> 16) & 1u);
  return (x >> 16) | (y & 0xFFFF0000u);
}

// How the tiled path reads bf16 (its products on pairs of dims, its probabilities rounded to bf16 in pairs of slots)
// and float32 (one dim, one slot a unit).
struct Bf16Pairs {
  typedef uint16_t Elem;  // bf16 bits
  typedef uint32_t Unit;  // two of them
  typedef u32x16 Vec;
  static constexpr int kPerUnit = 2;
  static Vec load(const Unit* p) { return load32(p); }
  static v16 mac(v16 acc, Unit a, Vec b) { return dot2(acc, (u32x16){} + a, b); }
};
struct Float32 {
  typedef float Elem;
  typedef float Unit;
  typedef v16 Vec;
  static constexpr int kPerUnit = 1;
  static Vec load(const Unit* p) { return carryover::load(p); }
  static v16 mac(v16 acc, Unit a, Vec b) { return acc + a * b; }
};

template <typename T>
struct TileScratch {
  std::vector<typename T::Unit> qp;    // a tile's queries [unit of dims][16 queries]
  std::vector<typename T::Unit> vp;    // bf16: values [pair of slots][D] (float32 reads the values' rows)
  std::vector<float> sc;               // a tile's scores [slot][16 queries], -1e30 outside a query's range
  std::vector<typename T::Unit> pb;    // a tile's probabilities [unit of slots][16 queries]
  std::vector<typename T::Unit> kpad;  // the last 16 keys' block where it runs past S
};

constexpr int kTileRows = 16, kOutRows = 4;
typedef int32_t i16 __attribute__((vector_size(64)));

// out[i, 16 NJ columns] for the rows i < `rows` of a group of `kOutRows`: the sum over slot units [0, units) of the
// probabilities pb[unit * kTileRows + i] x the values vr[unit * D + 16 j] (`kOutRows` x NJ accumulators)
template <typename T, int NJ>
void values_tile(const typename T::Unit* pb, const typename T::Unit* vr, int64_t units, int64_t D, int64_t rows,
                 float* out) {
  v16 acc[kOutRows][NJ] = {};
  for (int64_t u = 0; u < units; ++u) {
    typename T::Vec vv[NJ];
    for (int j = 0; j < NJ; ++j) vv[j] = T::load(vr + u * D + 16 * j);
    for (int i = 0; i < kOutRows; ++i)
      for (int j = 0; j < NJ; ++j) acc[i][j] = T::mac(acc[i][j], pb[u * kTileRows + i], vv[j]);
  }
  for (int i = 0; i < kOutRows; ++i)  // constant bounds: the accumulators stay in registers
    for (int j = 0; j < NJ; ++j)
      if (i < rows) store(out + i * D + 16 * j, acc[i][j]);
}

// One (batch row, K/V head): q [R, D], k/v [S, D], slot ranges [lo[r], hi[r]) -> m [R], l [R], o [R, D]. Queries go
// in tiles of 16, one per vector lane: scores [slot][16 queries] by 16 slots at a time (each key's units broadcast
// from its row, the tile's queries packed once), each lane's max, then exp and sums down the slots, then the outputs
// over the tile's slots (a slot outside a query's range: probability 0, an exact 0).
template <typename T, int NV>  // D / 16 (0: from D at run time)
void attend_tiles(const typename T::Elem* q, const typename T::Elem* k, const typename T::Elem* v, const int64_t* lo,
                  const int64_t* hi, int64_t R, int64_t S, int64_t D_, float scale, float* m, float* l, float* o,
                  TileScratch<T>& w) {
  typedef typename T::Unit U;
  constexpr int64_t W = T::kPerUnit;
  const int64_t D = NV > 0 ? 16 * NV : D_, P = D / W, nv = D / 16;
  int64_t begin = INT64_MAX, end = 0;
  for (int64_t r = 0; r < R; ++r)
    if (lo[r] < hi[r]) begin = lo[r] < begin ? lo[r] : begin, end = hi[r] > end ? hi[r] : end;
  std::memset(o, 0, sizeof(float) * R * D);
  for (int64_t r = 0; r < R; ++r) m[r] = kNegInf, l[r] = 0.0f;
  if (begin >= end) return;
  const int64_t b0 = begin / W * W;  // slot units start at a multiple of W
  if constexpr (W == 2) {  // values in pairs of slots: vp[(s - b0) / 2 * D + d] = dim d of slots s, s + 1 (0 past end)
    typedef uint16_t u16x16 __attribute__((vector_size(32)));
    const int64_t npairs = (end - b0 + 1) / 2;
    w.vp.resize(npairs * D);
    for (int64_t pr = 0; pr < npairs; ++pr)
      for (int64_t j = 0; j < nv; ++j) {
        const int64_t s = b0 + 2 * pr;
        u16x16 a, b{};
        std::memcpy(&a, v + s * D + 16 * j, 32);
        if (s + 1 < end) std::memcpy(&b, v + (s + 1) * D + 16 * j, 32);
        const u32x16 pair = __builtin_convertvector(a, u32x16) | __builtin_convertvector(b, u32x16) << 16;
        std::memcpy(w.vp.data() + pr * D + 16 * j, &pair, 64);
      }
  }
  w.qp.resize(P * kTileRows);
  const U* ku = reinterpret_cast<const U*>(k);
  const U* qu = reinterpret_cast<const U*>(q);
  for (int64_t t0 = 0; t0 < R; t0 += kTileRows) {
    const int64_t rows = R - t0 < kTileRows ? R - t0 : kTileRows;
    i16 lov{}, hiv{};
    int64_t tlo = INT64_MAX, thi = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t a = lo[t0 + i], z = hi[t0 + i];
      lov[i] = static_cast<int32_t>(a), hiv[i] = static_cast<int32_t>(z);
      if (a < z) tlo = a < tlo ? a : tlo, thi = z > thi ? z : thi;
    }
    if (tlo >= thi) continue;
    if (rows < kTileRows) std::fill(w.qp.begin(), w.qp.end(), U{});
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t p = 0; p < P; ++p) w.qp[p * kTileRows + i] = qu[(t0 + i) * P + p];
    // slots [e0, e1): the tile's, whole units (bf16: a key past S is read as 0, masked)
    const int64_t e0 = tlo / W * W, e1 = (thi + W - 1) / W * W, n = e1 - e0;
    if (static_cast<int64_t>(w.sc.size()) < (n + 15) / 16 * 16 * kTileRows) w.sc.resize((n + 15) / 16 * 16 * kTileRows);
    if (static_cast<int64_t>(w.pb.size()) < n / W * kTileRows) w.pb.resize(n / W * kTileRows);
    float* sc = w.sc.data();
    const v16 neg = (v16){} + kNegInf;
    v16 mx = neg;
    for (int64_t s0 = e0; s0 < e1; s0 += 16) {
      const U* kb = ku + s0 * P;
      if (s0 + 16 > S) {  // the last keys, copied with zero rows after them
        w.kpad.assign(16 * P, U{});
        std::memcpy(w.kpad.data(), kb, sizeof(U) * (S - s0) * P);
        kb = w.kpad.data();
      }
      v16 acc[16] = {};
      for (int64_t p = 0; p < P; ++p) {
        const typename T::Vec qv = T::load(w.qp.data() + p * kTileRows);
        for (int j = 0; j < 16; ++j) acc[j] = T::mac(acc[j], kb[j * P + p], qv);
      }
      for (int j = 0; j < 16; ++j) {  // a slot outside a lane's range: -1e30 there; each lane's max
        const i16 keep = (lov <= static_cast<int32_t>(s0 + j)) & (hiv > static_cast<int32_t>(s0 + j));
        const v16 x = keep ? acc[j] * scale : neg;
        mx = x > mx ? x : mx;
        store(sc + (s0 - e0 + j) * kTileRows, x);
      }
    }
    // exp(score - max), 0 outside a lane's range (-1e30 - max; an empty lane's max +inf), their sums in slot order
    mx = lov < hiv ? mx : (v16){} + __builtin_inff();
    v16 total{};
    for (int64_t s = e0; s < e1; s += W) {
      v16 pr[W];
      for (int h = 0; h < W; ++h) {
        pr[h] = exp_nonpositive(load(sc + (s + h - e0) * kTileRows) - mx);
        total += pr[h];
      }
      if constexpr (W == 2) {  // two slots' probabilities rounded to bf16 into one pair
        const u32x16 pair = bf16_pairs(pr[0], pr[1]);
        std::memcpy(w.pb.data() + (s - e0) / 2 * kTileRows, &pair, 64);
      } else {
        store(w.pb.data() + (s - e0) * kTileRows, pr[0]);
      }
    }
    for (int64_t i = 0; i < rows; ++i)
      if (lov[i] < hiv[i]) m[t0 + i] = mx[i], l[t0 + i] = total[i];
    // outputs: 4 rows x D at a time over the tile's slot units
    const U* vr = W == 2 ? w.vp.data() + (e0 - b0) / 2 * D : reinterpret_cast<const U*>(v) + e0 * D;
    for (int64_t i0 = 0; i0 < rows; i0 += kOutRows) {
      const int64_t nr = rows - i0 < kOutRows ? rows - i0 : kOutRows;
      float* out = o + (t0 + i0) * D;
      const U* pb = w.pb.data() + i0;
      int64_t j0 = 0;
      for (; j0 + 4 <= nv; j0 += 4) values_tile<T, 4>(pb, vr + 16 * j0, n / W, D, nr, out + 16 * j0);
      switch (nv - j0) {
        case 1: values_tile<T, 1>(pb, vr + 16 * j0, n / W, D, nr, out + 16 * j0); break;
        case 2: values_tile<T, 2>(pb, vr + 16 * j0, n / W, D, nr, out + 16 * j0); break;
        case 3: values_tile<T, 3>(pb, vr + 16 * j0, n / W, D, nr, out + 16 * j0); break;
      }
    }
  }
}

// q [B, Hkv, R, D] (row r = g * T + t: query head g of the group at query t), k/v [B, Hkv, S, D], limit/lower [B, T]
// int32 -> m, l [B, Hkv, R], o [B, Hkv, R, D] float32. `Tiles`: the tiled path (q, k, v all float32 or all bf16),
// else the per-query path (float32 q).
template <ffi::DataType TQ, ffi::DataType T, bool Tiles>
ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<TQ> q, ffi::Buffer<T> k, ffi::Buffer<T> v,
                     ffi::Buffer<ffi::S32> limit, ffi::Buffer<ffi::S32> lower, float scale,
                     ffi::ResultBuffer<ffi::F32> m, ffi::ResultBuffer<ffi::F32> l, ffi::ResultBuffer<ffi::F32> o) {
  using KV = ffi::NativeType<T>;
  const auto qd = q.dimensions(), kd = k.dimensions(), ld = limit.dimensions();
  const auto vd = v.dimensions(), wd = lower.dimensions();
  bool alike = vd.size() == 4 && wd.size() == 2;
  for (size_t i = 0; alike && i < 4; ++i) alike = kd.size() == 4 && vd[i] == kd[i];
  for (size_t i = 0; alike && i < 2; ++i) alike = ld.size() == 2 && wd[i] == ld[i];
  if (qd.size() != 4 || !alike)
    return ffi::Error::InvalidArgument("cpu_attention: q, k, v must be 4-D and limit, lower 2-D alike");
  const int64_t B = qd[0], H = qd[1], R = qd[2], D = qd[3], S = kd[2], Tq = ld[1];
  if (kd[0] != B || kd[1] != H || kd[3] != D || ld[0] != B || Tq < 1 || R % Tq != 0)
    return ffi::Error::InvalidArgument("cpu_attention: shapes do not match q[B, Hkv, G*T, D], k[B, Hkv, S, D]");
  if (D % 16 != 0 || D / 16 > kMaxVectors)
    return ffi::Error::InvalidArgument("cpu_attention: the head dim must be a multiple of 16, at most 512");
  const int32_t *lim = limit.typed_data(), *low = lower.typed_data();
  float *ms = m->typed_data(), *ls = l->typed_data(), *os = o->typed_data();
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
  const auto ranges = [=](int64_t b, int64_t r0, int64_t r1, int64_t* lo, int64_t* hi) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % Tq, a = low[b * Tq + t], z = lim[b * Tq + t];
      lo[r - r0] = a < 0 ? 0 : a;
      hi[r - r0] = z > S ? S : z;
    }
  };
  if constexpr (Tiles) {
    // each (row, K/V head)'s queries in parts of >= 96 rows (bf16: its values packed once a part) where the pairs
    // are too few to keep the threads busy (a batch-1 prefill)
    using Path = std::conditional_t<TQ == ffi::DataType::BF16, Bf16Pairs, Float32>;
    using E = typename Path::Elem;
    const E *qs = reinterpret_cast<const E*>(q.typed_data()), *ks = reinterpret_cast<const E*>(k.typed_data()),
            *vs = reinterpret_cast<const E*>(v.typed_data());
    const int64_t pairs = B * H, want = (4 * threads + pairs - 1) / pairs, most = R / 96 > 1 ? R / 96 : 1;
    const int64_t parts = want < most ? want : most;
    const auto fn = D == 64    ? attend_tiles<Path, 4>
                    : D == 128 ? attend_tiles<Path, 8>
                    : D == 256 ? attend_tiles<Path, 16>
                               : attend_tiles<Path, 0>;
    parallel_for(pool, pairs * parts, threads, [=](int64_t item) {
      thread_local TileScratch<Path> scratch;
      const int64_t task = item / parts, part = item % parts, b = task / H;
      const int64_t r0 = part * R / parts, r1 = (part + 1) * R / parts, n = r1 - r0;
      std::vector<int64_t> lo(n), hi(n);
      ranges(b, r0, r1, lo.data(), hi.data());
      fn(qs + (task * R + r0) * D, ks + task * S * D, vs + task * S * D, lo.data(), hi.data(), n, S, D, scale,
         ms + task * R + r0, ls + task * R + r0, os + (task * R + r0) * D, scratch);
    });
  } else {
    const float* qs = q.typed_data();
    const KV *ks = k.typed_data(), *vs = v.typed_data();
    const AttendFn<KV> fn = attend_fn<KV>(D / 16);
    // Fewer (row, K/V head) pairs than a few per thread (batch 1: SmolLM2's 3 K/V heads on 2 threads, a 1-K/V-head
    // model on 1) leave threads idle or unevenly loaded: each pair's query rows are then split into `parts`, each
    // part reading the pair's K/V on its own (a query's result does not depend on the other rows of its call).
    // SmolLM2's AR generation at batch 1 took 0.93-0.94x the time from ~1k tokens of context (float32, alternated,
    // 2026-12-05).
    const int64_t pairs = B * H;
    const int64_t parts = pairs % threads != 0 && pairs < 4 * threads ? (R < threads ? R : threads) : 1;
    parallel_for(pool, pairs * parts, threads, [=](int64_t item) {
      thread_local std::vector<float> scores;
      const int64_t task = item / parts, part = item % parts, b = task / H;
      const int64_t r0 = part * R / parts, r1 = (part + 1) * R / parts, n = r1 - r0;
      std::vector<int64_t> lo(n), hi(n);
      ranges(b, r0, r1, lo.data(), hi.data());
      fn(qs + (task * R + r0) * D, ks + task * S * D, vs + task * S * D, lo.data(), hi.data(), n, D / 16, scale,
         ms + task * R + r0, ls + task * R + r0, os + (task * R + r0) * D, scores);
    });
  }
  return ffi::Error::Success();
}

}  // namespace

#define CARRYOVER_BIND(TQ, T)           \
  ffi::Ffi::Bind()                      \
      .Ctx<ffi::ThreadPool>()           \
      .Arg<ffi::Buffer<ffi::TQ>>()      \
      .Arg<ffi::Buffer<ffi::T>>()       \
      .Arg<ffi::Buffer<ffi::T>>()       \
      .Arg<ffi::Buffer<ffi::S32>>()     \
      .Arg<ffi::Buffer<ffi::S32>>()     \
      .Attr<float>("scale")             \
      .Ret<ffi::Buffer<ffi::F32>>()     \
      .Ret<ffi::Buffer<ffi::F32>>()     \
      .Ret<ffi::Buffer<ffi::F32>>()
// a float32 or bf16 cache, or a bf16 cache kept as its uint16 bits (`models/cache.py`: a bitcast would copy it)
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuAttention, (Attention<ffi::F32, ffi::F32, false>), CARRYOVER_BIND(F32, F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuAttentionBf16, (Attention<ffi::F32, ffi::BF16, false>),
                              CARRYOVER_BIND(F32, BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuAttentionBits, (Attention<ffi::F32, ffi::U16, false>),
                              CARRYOVER_BIND(F32, U16));
// the tiled path: q, k, v float32, or all bf16
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuAttentionTiles, (Attention<ffi::F32, ffi::F32, true>),
                              CARRYOVER_BIND(F32, F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuAttentionTilesBf16, (Attention<ffi::BF16, ffi::BF16, true>),
                              CARRYOVER_BIND(BF16, BF16));
