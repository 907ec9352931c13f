// Not kept (see ../README.md, "Tried, not kept"): a custom call for several Dense kernels that read the same x,
// inserted into cpu_products.cc before HeadArgmax for many_chain.py, registered as CarryoverCpuProductsMany.

// y_i = x . w_i for a few Dense kernels w_i [K, N_i] that read the same x (a layer's q, k and v; gate and up): one
// pass of the threads over all of them, each chunk of K of w_1, then of w_2, ..., so that the weight stream does not
// stop between them; each y_i as `Products` computes it (the same K split and order, so the same bits).
ffi::Error ProductsMany(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::RemainingArgs ws, ffi::RemainingRets ys) {
  const auto xd = x.dimensions();
  const int64_t n = int64_t(ws.size());
  if (xd.size() != 2 || n < 1 || int64_t(ys.size()) != n)
    return ffi::Error::InvalidArgument("cpu_products_many: x [M, K], one y [M, N_i] for each w_i [K, N_i]");
  const int64_t rows = xd[0], K = xd[1];
  std::vector<const float*> w(n);
  std::vector<float*> y(n);
  std::vector<int64_t> N(n);
  for (int64_t i = 0; i < n; ++i) {
    auto wi = ws.get<ffi::Buffer<ffi::F32>>(i);
    auto yi = ys.get<ffi::Buffer<ffi::F32>>(i);
    if (!wi.has_value() || !yi.has_value()) return ffi::Error::InvalidArgument("cpu_products_many: float32 only");
    const auto wd = wi->dimensions(), yd = (*yi)->dimensions();
    if (wd.size() != 2 || yd.size() != 2 || wd[0] != K || yd[0] != rows || yd[1] != wd[1])
      return ffi::Error::InvalidArgument("cpu_products_many: shapes do not match x[M, K] . w_i = y_i[M, N_i]");
    w[i] = wi->typed_data(), y[i] = (*yi)->typed_data(), N[i] = wd[1];
  }
  const ChunkFn<float> fn = chunk_fn<false, float>(rows);
  if (fn == nullptr) return ffi::Error::InvalidArgument("cpu_products_many: 1 to 24 rows");
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
  const KSplit split = k_split(K, threads);
  if (K == 0 || split.chunks < 1) {
    for (int64_t i = 0; i < n; ++i) std::memset(y[i], 0, sizeof(float) * rows * N[i]);
    return ffi::Error::Success();
  }
  int64_t total = 0;  // partial sums of chunks 1.. for every w_i
  for (int64_t i = 0; i < n; ++i) total += rows * N[i];
  std::vector<float> partials((split.chunks - 1) * total);
  float* part = partials.data();
  const float* xs = x.typed_data();
  parallel_for(pool, split.chunks, threads, [&](int64_t c) {
    const int64_t a = c * split.size, b = a + split.size < K ? a + split.size : K;
    int64_t off = (c - 1) * total;
    for (int64_t i = 0; i < n; off += rows * N[i], ++i) fn(xs, w[i], c == 0 ? y[i] : part + off, K, N[i], a, b);
  });
  for (int64_t c = 1; c < split.chunks; ++c) {
    const float* p = part + (c - 1) * total;
    for (int64_t i = 0; i < n; p += rows * N[i], ++i)
      for (int64_t j = 0; j < rows * N[i]; ++j) y[i][j] += p[j];
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsMany, ProductsMany,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().RemainingArgs()
                                  .RemainingRets());
