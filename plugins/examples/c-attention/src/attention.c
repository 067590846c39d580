/*
 * c-attention: block-sparse attention in plain C11 behind dflash_attention.h, to show the ABI
 * needs nothing but a C compiler. Same algorithm as the in-tree `tiled` kernel, one row at a
 * time: forward walks each query row's (at most two) key intervals with an online softmax
 * (running max and sum, every exp argument <= 0); backward recomputes P = exp(s - lse),
 * D_i = rowsum(dO_i * O_i), dS = P * (dP - D_i). Cross-key sums are double, so rounding does
 * not grow with sequence length. Single-threaded with a fixed order: deterministic.
 *
 * Build: cc -std=c11 -O2 -fPIC -shared -I ../../abi/include src/attention.c -o libc_attention.so -lm
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dflash_attention.h"

static _Thread_local char last_error[512] = "";

static DfAttnStatus fail(DfAttnStatus status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

static const DfAttnCapabilities CAPS = {
    sizeof(DfAttnCapabilities),
    kDLCPU,
    DF_ATTN_DTYPE_F32,
    1,    /* head_dim_min */
    512,  /* head_dim_max */
    1,    /* head_dim_multiple */
    DF_ATTN_CAP_GQA | DF_ATTN_CAP_DETERMINISTIC | DF_ATTN_CAP_BACKWARD,
    DF_ATTN_MASK_TWO_INTERVALS | DF_ATTN_MASK_EMPTY_ROWS,
};

/* The dims of one call, from q and k. */
typedef struct {
  int64_t tq, tk, hq, hkv, d;
} Dims;

/* Checks `t` is a compact row-major f32 host tensor of `ndim` dims; fills `shape`. */
static DfAttnStatus check_tensor(const char* what, const DLTensor* t, int32_t ndim,
                                 int64_t* shape) {
  if (t == NULL) return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  if (t->device.device_type != kDLCPU)
    return fail(DF_ATTN_ERR_UNSUPPORTED, "%s: device type %d, only kDLCPU is supported", what,
                (int)t->device.device_type);
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return fail(DF_ATTN_ERR_UNSUPPORTED, "%s: dtype (code %u, bits %u, lanes %u), only f32", what,
                t->dtype.code, t->dtype.bits, t->dtype.lanes);
  if (t->ndim != ndim || t->shape == NULL)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s: ndim %d, expected %d", what, t->ndim, ndim);
  int64_t stride = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    if (t->shape[i] < 0) return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s: negative dim", what);
    if (t->strides != NULL && t->shape[i] > 1 && t->strides[i] != stride)
      return fail(DF_ATTN_ERR_UNSUPPORTED, "%s: strides are not compact row-major", what);
    shape[i] = t->shape[i];
    stride *= t->shape[i];
  }
  if (stride > 0 && t->data == NULL) return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s: data is NULL", what);
  if (t->byte_offset % sizeof(float) != 0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s: byte_offset not f32-aligned", what);
  return DF_ATTN_OK;
}

static DfAttnStatus check_same(const char* what, const int64_t* got, const int64_t* want, int n) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i])
      return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%s: dim %d is %lld, expected %lld", what, i,
                  (long long)got[i], (long long)want[i]);
  return DF_ATTN_OK;
}

static float* f32(const DLTensor* t) { return (float*)((char*)t->data + t->byte_offset); }

#define TRY(x)                          \
  do {                                  \
    DfAttnStatus s_ = (x);              \
    if (s_ != DF_ATTN_OK) return s_;    \
  } while (0)

/* q, k, v and the mask against each other and the capabilities. */
static DfAttnStatus check_inputs(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                 const DfAttnMask* m, float scale, Dims* dims) {
  int64_t qs[3], ks[3], vs[3];
  TRY(check_tensor("q", q, 3, qs));
  TRY(check_tensor("k", k, 3, ks));
  TRY(check_tensor("v", v, 3, vs));
  TRY(check_same("v vs k", vs, ks, 3));
  if (qs[2] != ks[2]) return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "q and k differ in head dim");
  *dims = (Dims){qs[0], ks[0], qs[1], ks[1], qs[2]};
  if (dims->hkv == 0 || dims->hq % dims->hkv != 0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "%lld query heads are not a multiple of %lld kv heads",
                (long long)dims->hq, (long long)dims->hkv);
  if (dims->d < CAPS.head_dim_min || dims->d > CAPS.head_dim_max)
    return fail(DF_ATTN_ERR_UNSUPPORTED, "head dim %lld outside [%u, %u]", (long long)dims->d,
                CAPS.head_dim_min, CAPS.head_dim_max);
  if (!isfinite(scale)) return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "scale is not finite");
  if (m == NULL || m->struct_size < DF_ATTN_MASK_SIZE_V1_0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "mask is NULL or too small");
  if (m->device.device_type != kDLCPU) return fail(DF_ATTN_ERR_UNSUPPORTED, "mask not on the CPU");
  if (m->q_len != dims->tq || m->kv_len != dims->tk)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "mask is %lldx%lld but q has %lld rows and k %lld",
                (long long)m->q_len, (long long)m->kv_len, (long long)dims->tq, (long long)dims->tk);
  if (!m->first_start || !m->first_end || !m->second_start || !m->second_end)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "a mask array is NULL");
  for (int64_t i = 0; i < m->q_len; i++) {
    int32_t iv[2][2] = {{m->first_start[i], m->first_end[i]}, {m->second_start[i], m->second_end[i]}};
    for (int j = 0; j < 2; j++)
      if (iv[j][0] < iv[j][1] && (iv[j][0] < 0 || iv[j][1] > m->kv_len))
        return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "mask row %lld: interval [%d, %d) outside [0, %lld)",
                    (long long)i, iv[j][0], iv[j][1], (long long)m->kv_len);
  }
  return DF_ATTN_OK;
}

static uint64_t workspace_for(const Dims* d, int32_t pass) {
  /* Forward: one row's f64 output accumulator. Backward: f64 dk, dv and one row's dq. */
  uint64_t n = pass == DF_ATTN_PASS_FORWARD ? (uint64_t)d->d
                                            : 2u * (uint64_t)(d->tk * d->hkv * d->d) + (uint64_t)d->d;
  return n * sizeof(double);
}

static DfAttnStatus check_workspace(const Dims* d, int32_t pass, void* ws, uint64_t bytes) {
  uint64_t need = workspace_for(d, pass);
  if (bytes < need || (need > 0 && ws == NULL))
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "workspace of %llu bytes, %llu needed",
                (unsigned long long)bytes, (unsigned long long)need);
  return DF_ATTN_OK;
}

static double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

/* The (at most two) intervals of row i as [lo, hi) pairs. */
static void row_intervals(const DfAttnMask* m, int64_t i, int32_t iv[2][2]) {
  iv[0][0] = m->first_start[i];
  iv[0][1] = m->first_end[i];
  iv[1][0] = m->second_start[i];
  iv[1][1] = m->second_end[i];
}

/* Every struct_size is checked against the 1.0 size, not sizeof: this plugin reads only 1.0
 * fields, so a 1.x host (larger structs) and a 1.0 host alike are served. */
static DfAttnStatus forward(const DfAttnPlugin* self, const DfAttnForwardArgs* a) {
  (void)self;
  if (a == NULL || a->struct_size < DF_ATTN_FORWARD_ARGS_SIZE_V1_0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "forward args NULL or struct_size too small");
  Dims d;
  TRY(check_inputs(a->q, a->k, a->v, a->mask, a->scale, &d));
  int64_t os[3], ls[2];
  TRY(check_tensor("out", a->out, 3, os));
  TRY(check_tensor("lse", a->lse, 2, ls));
  int64_t qshape[3] = {d.tq, d.hq, d.d}, lshape[2] = {d.tq, d.hq};
  TRY(check_same("out vs q", os, qshape, 3));
  TRY(check_same("lse vs (Tq, Hq)", ls, lshape, 2));
  TRY(check_workspace(&d, DF_ATTN_PASS_FORWARD, a->workspace, a->workspace_bytes));
  const float *q = f32(a->q), *k = f32(a->k), *v = f32(a->v);
  float *out = f32(a->out), *lse = f32(a->lse);
  double* acc = (double*)a->workspace;
  int64_t group = d.hq / d.hkv;
  for (int64_t i = 0; i < d.tq; i++) {
    int32_t iv[2][2];
    row_intervals(a->mask, i, iv);
    for (int64_t h = 0; h < d.hq; h++) {
      const float* qi = q + (i * d.hq + h) * d.d;
      int64_t kh = h / group;
      double m = -INFINITY, l = 0.0;
      memset(acc, 0, (size_t)d.d * sizeof(double));
      for (int r = 0; r < 2; r++)
        for (int64_t j = iv[r][0]; j < iv[r][1]; j++) {
          const float* kj = k + (j * d.hkv + kh) * d.d;
          const float* vj = v + (j * d.hkv + kh) * d.d;
          double s = a->scale * dot(qi, kj, d.d);
          if (s > m) { /* rescale the running sums to the new max */
            double c = exp(m - s);
            l *= c;
            for (int64_t x = 0; x < d.d; x++) acc[x] *= c;
            m = s;
          }
          double p = exp(s - m);
          l += p;
          for (int64_t x = 0; x < d.d; x++) acc[x] += p * vj[x];
        }
      float* o = out + (i * d.hq + h) * d.d;
      if (l == 0.0) {
        for (int64_t x = 0; x < d.d; x++) o[x] = 0.0f;
        lse[i * d.hq + h] = -INFINITY;
      } else {
        for (int64_t x = 0; x < d.d; x++) o[x] = (float)(acc[x] / l);
        lse[i * d.hq + h] = (float)(m + log(l));
      }
    }
  }
  return DF_ATTN_OK;
}

static DfAttnStatus backward(const DfAttnPlugin* self, const DfAttnBackwardArgs* a) {
  (void)self;
  if (a == NULL || a->struct_size < DF_ATTN_BACKWARD_ARGS_SIZE_V1_0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "backward args NULL or struct_size too small");
  Dims d;
  TRY(check_inputs(a->q, a->k, a->v, a->mask, a->scale, &d));
  int64_t s3[3], s2[2];
  int64_t qshape[3] = {d.tq, d.hq, d.d}, kshape[3] = {d.tk, d.hkv, d.d}, lshape[2] = {d.tq, d.hq};
  TRY(check_tensor("out", a->out, 3, s3));
  TRY(check_same("out vs q", s3, qshape, 3));
  TRY(check_tensor("d_out", a->d_out, 3, s3));
  TRY(check_same("d_out vs q", s3, qshape, 3));
  TRY(check_tensor("dq", a->dq, 3, s3));
  TRY(check_same("dq vs q", s3, qshape, 3));
  TRY(check_tensor("dk", a->dk, 3, s3));
  TRY(check_same("dk vs k", s3, kshape, 3));
  TRY(check_tensor("dv", a->dv, 3, s3));
  TRY(check_same("dv vs k", s3, kshape, 3));
  TRY(check_tensor("lse", a->lse, 2, s2));
  TRY(check_same("lse vs (Tq, Hq)", s2, lshape, 2));
  TRY(check_workspace(&d, DF_ATTN_PASS_BACKWARD, a->workspace, a->workspace_bytes));
  const float *q = f32(a->q), *k = f32(a->k), *v = f32(a->v);
  const float *out = f32(a->out), *lse = f32(a->lse), *d_out = f32(a->d_out);
  float *dq = f32(a->dq), *dk = f32(a->dk), *dv = f32(a->dv);
  int64_t kv_n = d.tk * d.hkv * d.d;
  double* dk_acc = (double*)a->workspace;
  double* dv_acc = dk_acc + kv_n;
  double* dq_acc = dv_acc + kv_n;
  memset(dk_acc, 0, 2 * (size_t)kv_n * sizeof(double));
  int64_t group = d.hq / d.hkv;
  for (int64_t i = 0; i < d.tq; i++) {
    int32_t iv[2][2];
    row_intervals(a->mask, i, iv);
    for (int64_t h = 0; h < d.hq; h++) {
      int64_t row = (i * d.hq + h) * d.d, kh = h / group;
      const float *qi = q + row, *gi = d_out + row;
      double li = lse[i * d.hq + h];
      double delta = dot(gi, out + row, d.d);
      memset(dq_acc, 0, (size_t)d.d * sizeof(double));
      for (int r = 0; r < 2; r++)
        for (int64_t j = iv[r][0]; j < iv[r][1]; j++) {
          int64_t kv = (j * d.hkv + kh) * d.d;
          double p = exp(a->scale * dot(qi, k + kv, d.d) - li);
          double ds = p * (dot(gi, v + kv, d.d) - delta) * a->scale;
          for (int64_t x = 0; x < d.d; x++) {
            dq_acc[x] += ds * k[kv + x];
            dk_acc[kv + x] += ds * qi[x];
            dv_acc[kv + x] += p * gi[x];
          }
        }
      for (int64_t x = 0; x < d.d; x++) dq[row + x] = (float)dq_acc[x];
    }
  }
  for (int64_t x = 0; x < kv_n; x++) {
    dk[x] = (float)dk_acc[x];
    dv[x] = (float)dv_acc[x];
  }
  return DF_ATTN_OK;
}

static DfAttnStatus workspace_bytes(const DfAttnPlugin* self, const DfAttnShape* s, int32_t pass,
                                    uint64_t* bytes) {
  (void)self;
  if (s == NULL || bytes == NULL || s->struct_size < DF_ATTN_SHAPE_SIZE_V1_0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "workspace_bytes: NULL or short shape");
  if (pass != DF_ATTN_PASS_FORWARD && pass != DF_ATTN_PASS_BACKWARD)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "workspace_bytes: unknown pass %d", pass);
  if (s->q_rows < 0 || s->kv_rows < 0 || s->kv_heads < 0 || s->head_dim < 0)
    return fail(DF_ATTN_ERR_INVALID_ARGUMENT, "workspace_bytes: negative dim");
  Dims d = {s->q_rows, s->kv_rows, s->q_heads, s->kv_heads, s->head_dim};
  *bytes = workspace_for(&d, pass);
  return DF_ATTN_OK;
}

static const char* get_last_error(const DfAttnPlugin* self) {
  (void)self;
  return last_error;
}

static const DfAttnPlugin PLUGIN = {
    sizeof(DfAttnPlugin), DFLASH_ATTN_ABI_MAJOR, DFLASH_ATTN_ABI_MINOR, 0,
    "c-attention", "0.1.0", &CAPS, workspace_bytes, forward, backward, get_last_error,
};

#if defined(_WIN32)
__declspec(dllexport)
#else
__attribute__((visibility("default")))
#endif
const DfAttnPlugin* dflash_attention_plugin(uint32_t host_abi_major, uint32_t host_abi_minor) {
  (void)host_abi_minor; /* a 1.x host reads only the 1.0 fields this table has */
  return host_abi_major == DFLASH_ATTN_ABI_MAJOR ? &PLUGIN : NULL;
}
