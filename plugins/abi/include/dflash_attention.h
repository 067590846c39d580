/*
 * dflash_attention.h: the whole contract between dflash-rs (the host) and a foreign attention
 * kernel (the plugin). ABI version 1.0.
 *
 * A plugin is a shared library exporting one symbol, `dflash_attention_plugin`. The host calls
 * it after loading, passing its own ABI version; the plugin returns a pointer to a static table
 * (`DfAttnPlugin`) that stays valid until the library is unloaded, or NULL when it refuses the
 * host's major version. The host refuses a table whose `abi_major` differs from its own. The
 * entry point may be called more than once in a process (each backend that loads the library
 * calls it, also while an earlier load keeps the library loaded): it must be idempotent and
 * return the same table every time.
 *
 * Threads: every function of the table (and the entry point) may be called concurrently from
 * several host threads, each call with its own buffers and workspace: keep per-call scratch in
 * the workspace, guard any state shared between calls (caches) yourself, and keep last_error
 * per thread.
 *
 * Versioning: a minor bump only appends fields at the end of a struct (each struct starts with
 * `struct_size`, so either side can tell which fields the other knows); a major bump may change
 * anything and both sides refuse a major other than their own.
 *
 * Memory: every buffer is allocated and freed by the host (inputs, outputs, workspace, mask);
 * every string the plugin returns (name, version, last_error) is owned by the plugin. Nothing
 * allocated on one side is freed on the other. Inputs (q, k, v, the forward's out and lse
 * handed to the backward, d_out, the mask) are read-only: write only the outputs and the
 * workspace. The host reuses its inputs after the call (q again in the backward), and the
 * conformance suite fails a plugin that changes one.
 *
 * Layouts (dims fixed, strides explicit): q (Tq, Hq, D), k and v (Tk, Hkv, D), out (Tq, Hq, D),
 * lse (Tq, Hq). GQA: query head h reads kv head h / (Hq / Hkv). lse is the natural-log
 * log-sum-exp of the scaled scores; a query row that sees no key has out = 0 and lse = -inf.
 * See docs/plugins.md for the full semantics and the conformance suite.
 */
#ifndef DFLASH_ATTENTION_H
#define DFLASH_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFLASH_ATTN_ABI_MAJOR 1u
#define DFLASH_ATTN_ABI_MINOR 0u

/* The one exported symbol's name and type. */
#define DFLASH_ATTN_ENTRY_POINT "dflash_attention_plugin"

/* ---- DLPack tensor description (the subset this ABI uses, layout-identical to dlpack.h;
 * include dlpack.h (0.6 or later) first to use its definitions instead: it defines
 * DLPACK_MAJOR_VERSION from 1.0 on, DLPACK_VERSION before, and the guard DLPACK_DLPACK_H_). */
#if !defined(DLPACK_DLPACK_H_) && !defined(DLPACK_MAJOR_VERSION) && !defined(DLPACK_VERSION)
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
} DLDataTypeCode;

typedef struct {
  uint8_t code;  /* DLDataTypeCode */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  /* In elements; NULL means compact row-major. */
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
#endif

/* ---- Status codes. Zero is success; on any other value the plugin's last_error() says why. */
typedef int32_t DfAttnStatus;
#define DF_ATTN_OK 0
/* A malformed call: null pointer, wrong ndim, shapes that disagree, a too small workspace. */
#define DF_ATTN_ERR_INVALID_ARGUMENT 1
/* A well-formed call outside the declared capabilities (dtype, head dim, strides, device). */
#define DF_ATTN_ERR_UNSUPPORTED 2
/* The host's ABI major is not the plugin's. */
#define DF_ATTN_ERR_VERSION 3
/* The kernel failed (launch failure, device error). */
#define DF_ATTN_ERR_INTERNAL 4
/* A Rust plugin caught a panic at the boundary. */
#define DF_ATTN_ERR_PANIC 5

/* ---- Capabilities. */
#define DF_ATTN_DTYPE_F32 (1u << 0)
#define DF_ATTN_DTYPE_BF16 (1u << 1)
#define DF_ATTN_DTYPE_F16 (1u << 2)

/* Query heads may be a multiple of kv heads (grouped-query attention). */
#define DF_ATTN_CAP_GQA (1u << 0)
/* Repeated calls on the same inputs give bit-identical outputs. */
#define DF_ATTN_CAP_DETERMINISTIC (1u << 1)
/* backward is implemented (otherwise the pointer may be NULL). */
#define DF_ATTN_CAP_BACKWARD (1u << 2)
/* Strides other than compact row-major are accepted (otherwise such calls are UNSUPPORTED). */
#define DF_ATTN_CAP_STRIDED (1u << 3)

/* Required: the host refuses every call to a plugin that does not declare it. Each row's
 * two intervals may be anywhere in [0, Tk), not only a causal prefix; every mask the host
 * passes (causal ones included) is in this two-interval form. */
#define DF_ATTN_MASK_TWO_INTERVALS (1u << 0)
/* Rows whose intervals are both empty are handled (out = 0, lse = -inf). */
#define DF_ATTN_MASK_EMPTY_ROWS (1u << 1)

typedef struct {
  uint32_t struct_size;
  /* DLDeviceType of every tensor the plugin accepts. */
  int32_t device_type;
  /* DF_ATTN_DTYPE_* bits. */
  uint32_t dtypes;
  /* Supported head dims: min <= D <= max and D % multiple == 0. */
  uint32_t head_dim_min;
  uint32_t head_dim_max;
  uint32_t head_dim_multiple;
  /* DF_ATTN_CAP_* bits. */
  uint32_t flags;
  /* DF_ATTN_MASK_* bits. */
  uint32_t mask_rules;
} DfAttnCapabilities;

/* ---- Call descriptions. */

/* For each query row i, keys [first_start[i], first_end[i]) and [second_start[i], second_end[i])
 * are visible; an interval with start >= end is empty. The two intervals of a row do not
 * overlap and lie within [0, kv_len). The arrays hold q_len values each and live in the memory
 * of `device` (the host's memory on the CPU). */
typedef struct {
  uint32_t struct_size;
  DLDevice device;
  int64_t q_len;
  int64_t kv_len;
  const int32_t* first_start;
  const int32_t* first_end;
  const int32_t* second_start;
  const int32_t* second_end;
} DfAttnMask;

/* What a workspace query describes. */
typedef struct {
  uint32_t struct_size;
  DLDataType dtype;
  int64_t q_rows;
  int64_t kv_rows;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
} DfAttnShape;

#define DF_ATTN_PASS_FORWARD 0
#define DF_ATTN_PASS_BACKWARD 1

typedef struct {
  uint32_t struct_size;
  /* Inputs: read-only, including the memory their `data` points to. */
  const DLTensor* q;
  const DLTensor* k;
  const DLTensor* v;
  const DfAttnMask* mask;
  /* Multiplies q.k before the softmax. */
  float scale;
  /* Outputs, fully overwritten (the host may fill them with NaN first to prove it). */
  DLTensor* out;
  DLTensor* lse;
  /* A CUstream on CUDA, NULL on the CPU. */
  void* stream;
  /* Host-allocated scratch of the size workspace_bytes() asked for (NULL when 0). */
  void* workspace;
  uint64_t workspace_bytes;
} DfAttnForwardArgs;

typedef struct {
  uint32_t struct_size;
  /* Inputs: read-only, including the memory their `data` points to. */
  const DLTensor* q;
  const DLTensor* k;
  const DLTensor* v;
  /* The forward's outputs, inputs here. */
  const DLTensor* out;
  const DLTensor* lse;
  const DLTensor* d_out;
  const DfAttnMask* mask;
  float scale;
  /* Outputs, fully overwritten. */
  DLTensor* dq;
  DLTensor* dk;
  DLTensor* dv;
  void* stream;
  void* workspace;
  uint64_t workspace_bytes;
} DfAttnBackwardArgs;

/* ---- The plugin table. */
typedef struct DfAttnPlugin DfAttnPlugin;
struct DfAttnPlugin {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t reserved;
  /* NUL-terminated, plugin-owned, valid for the library's lifetime. */
  const char* name;
  const char* version;
  /* Plugin-owned, valid for the library's lifetime. */
  const DfAttnCapabilities* capabilities;
  /* Scratch bytes one call of `pass` (DF_ATTN_PASS_*) needs for `shape`. */
  DfAttnStatus (*workspace_bytes)(const DfAttnPlugin* self, const DfAttnShape* shape,
                                  int32_t pass, uint64_t* bytes);
  DfAttnStatus (*forward)(const DfAttnPlugin* self, const DfAttnForwardArgs* args);
  DfAttnStatus (*backward)(const DfAttnPlugin* self, const DfAttnBackwardArgs* args);
  /* Why the calling thread's last call failed: plugin-owned, NUL-terminated, valid until the
   * thread's next call into the plugin. Never NULL. */
  const char* (*last_error)(const DfAttnPlugin* self);
};

/* ---- The 1.0 size of each struct: where its last 1.0 field ends. A later minor appends
 * fields, so sizeof grows and a struct_size is checked against these, never against the
 * reader's own sizeof: the host accepts a table and capabilities of at least these sizes, and a
 * plugin must accept args, a mask and a shape of at least these sizes (reading only the fields
 * struct_size covers, e.g. by copying that prefix into a zeroed struct). */
#define DF_ATTN_END_OF(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))
#define DF_ATTN_CAPABILITIES_SIZE_V1_0 DF_ATTN_END_OF(DfAttnCapabilities, mask_rules)
#define DF_ATTN_MASK_SIZE_V1_0 DF_ATTN_END_OF(DfAttnMask, second_end)
#define DF_ATTN_SHAPE_SIZE_V1_0 DF_ATTN_END_OF(DfAttnShape, head_dim)
#define DF_ATTN_FORWARD_ARGS_SIZE_V1_0 DF_ATTN_END_OF(DfAttnForwardArgs, workspace_bytes)
#define DF_ATTN_BACKWARD_ARGS_SIZE_V1_0 DF_ATTN_END_OF(DfAttnBackwardArgs, workspace_bytes)
#define DF_ATTN_PLUGIN_SIZE_V1_0 DF_ATTN_END_OF(DfAttnPlugin, last_error)

typedef const DfAttnPlugin* (*DfAttnEntryPoint)(uint32_t host_abi_major, uint32_t host_abi_minor);

/* The entry point every plugin exports: callable from any thread, any number of times. */
const DfAttnPlugin* dflash_attention_plugin(uint32_t host_abi_major, uint32_t host_abi_minor);

#ifdef __cplusplus
}
#endif

#endif /* DFLASH_ATTENTION_H */
