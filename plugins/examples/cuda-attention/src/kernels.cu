// One thread per (query row, head) for the forward and dq, one per (key, kv head) for dk/dv:
// every output element has one writer, so results are deterministic. f64 scores and softmax
// sums, f32 vector accumulators. Mask: the four i32 interval arrays, in device memory.

#define INF __longlong_as_double(0x7ff0000000000000ULL)

__device__ bool visible(const int* fs, const int* fe, const int* ss, const int* se, int i, int j) {
  return (j >= fs[i] && j < fe[i]) || (j >= ss[i] && j < se[i]);
}

__device__ double dotf(const float* a, const float* b, int d) {
  double s = 0.0;
  for (int x = 0; x < d; x++) s += (double)a[x] * (double)b[x];
  return s;
}

extern "C" __global__ void attn_fwd(const float* q, const float* k, const float* v,
                                    const int* fs, const int* fe, const int* ss, const int* se,
                                    float* out, float* lse, int tq, int hq, int hkv, int d,
                                    float scale) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= tq * hq) return;
  int i = idx / hq, h = idx % hq, kh = h / (hq / hkv);
  const float* qi = q + (size_t)idx * d;
  float* o = out + (size_t)idx * d;
  for (int x = 0; x < d; x++) o[x] = 0.0f;
  double m = -INF, l = 0.0;
  int iv[4] = {fs[i], fe[i], ss[i], se[i]};
  for (int r = 0; r < 2; r++)
    for (int j = iv[2 * r]; j < iv[2 * r + 1]; j++) {
      size_t kv = ((size_t)j * hkv + kh) * d;
      double s = scale * dotf(qi, k + kv, d);
      if (s > m) {
        double c = exp(m - s);
        l *= c;
        for (int x = 0; x < d; x++) o[x] = (float)(o[x] * c);
        m = s;
      }
      double p = exp(s - m);
      l += p;
      for (int x = 0; x < d; x++) o[x] += (float)(p * v[kv + x]);
    }
  if (l == 0.0) {
    lse[idx] = (float)-INF;
  } else {
    for (int x = 0; x < d; x++) o[x] = (float)(o[x] / l);
    lse[idx] = (float)(m + log(l));
  }
}

// dq, and delta = rowsum(d_out * out) per (row, head) into the workspace for attn_bwd_dkdv.
extern "C" __global__ void attn_bwd_dq(const float* q, const float* k, const float* v,
                                       const float* out, const float* lse, const float* d_out,
                                       const int* fs, const int* fe, const int* ss, const int* se,
                                       float* dq, float* delta, int tq, int hq, int hkv, int d,
                                       float scale) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= tq * hq) return;
  int i = idx / hq, h = idx % hq, kh = h / (hq / hkv);
  const float *qi = q + (size_t)idx * d, *gi = d_out + (size_t)idx * d;
  float* dqi = dq + (size_t)idx * d;
  double di = dotf(gi, out + (size_t)idx * d, d);
  delta[idx] = (float)di;
  double li = lse[idx];
  for (int x = 0; x < d; x++) dqi[x] = 0.0f;
  int iv[4] = {fs[i], fe[i], ss[i], se[i]};
  for (int r = 0; r < 2; r++)
    for (int j = iv[2 * r]; j < iv[2 * r + 1]; j++) {
      size_t kv = ((size_t)j * hkv + kh) * d;
      double p = exp(scale * dotf(qi, k + kv, d) - li);
      double ds = p * (dotf(gi, v + kv, d) - di) * scale;
      for (int x = 0; x < d; x++) dqi[x] += (float)(ds * k[kv + x]);
    }
}

extern "C" __global__ void attn_bwd_dkdv(const float* q, const float* k, const float* v,
                                         const float* lse, const float* d_out, const float* delta,
                                         const int* fs, const int* fe, const int* ss,
                                         const int* se, float* dk, float* dv, int tq, int tk,
                                         int hq, int hkv, int d, float scale) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= tk * hkv) return;
  int j = idx / hkv, kh = idx % hkv, group = hq / hkv;
  const float *kj = k + (size_t)idx * d, *vj = v + (size_t)idx * d;
  float *dkj = dk + (size_t)idx * d, *dvj = dv + (size_t)idx * d;
  for (int x = 0; x < d; x++) dkj[x] = dvj[x] = 0.0f;
  for (int i = 0; i < tq; i++) {
    if (!visible(fs, fe, ss, se, i, j)) continue;
    for (int h = kh * group; h < (kh + 1) * group; h++) {
      size_t row = ((size_t)i * hq + h) * d;
      double p = exp(scale * dotf(q + row, kj, d) - (double)lse[i * hq + h]);
      double ds = p * (dotf(d_out + row, vj, d) - (double)delta[i * hq + h]) * scale;
      for (int x = 0; x < d; x++) {
        dkj[x] += (float)(ds * q[row + x]);
        dvj[x] += (float)(p * d_out[row + x]);
      }
    }
  }
}
