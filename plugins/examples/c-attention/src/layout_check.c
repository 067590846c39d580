/* The header's struct layouts as a C compiler sees them, against the numbers the Rust mirror's
 * test (plugins/abi/src/lib.rs) asserts: compiled (syntax only) by this crate's build script. */
#include <stddef.h>
#include <stdint.h>

#include "dflash_attention.h"

#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(DLTensor) == 48, "DLTensor");
_Static_assert(offsetof(DLTensor, ndim) == 16, "DLTensor.ndim");
_Static_assert(offsetof(DLTensor, dtype) == 20, "DLTensor.dtype");
_Static_assert(offsetof(DLTensor, strides) == 32, "DLTensor.strides");
_Static_assert(sizeof(DfAttnCapabilities) == 32, "DfAttnCapabilities");
_Static_assert(offsetof(DfAttnMask, q_len) == 16, "DfAttnMask.q_len");
_Static_assert(sizeof(DfAttnMask) == 64, "DfAttnMask");
_Static_assert(offsetof(DfAttnShape, q_rows) == 8, "DfAttnShape.q_rows");
_Static_assert(offsetof(DfAttnForwardArgs, scale) == 40, "DfAttnForwardArgs.scale");
_Static_assert(offsetof(DfAttnForwardArgs, workspace_bytes) == 80, "DfAttnForwardArgs.workspace_bytes");
_Static_assert(offsetof(DfAttnBackwardArgs, scale) == 64, "DfAttnBackwardArgs.scale");
_Static_assert(sizeof(DfAttnBackwardArgs) == 120, "DfAttnBackwardArgs");
_Static_assert(offsetof(DfAttnPlugin, name) == 16, "DfAttnPlugin.name");
_Static_assert(offsetof(DfAttnPlugin, last_error) == 64, "DfAttnPlugin.last_error");
_Static_assert(sizeof(DfAttnPlugin) == 72, "DfAttnPlugin");
#endif

/* This is 1.0: every struct is exactly its 1.0 size (as the Rust mirror's constants say). */
_Static_assert(DF_ATTN_CAPABILITIES_SIZE_V1_0 == sizeof(DfAttnCapabilities), "caps 1.0 size");
_Static_assert(DF_ATTN_MASK_SIZE_V1_0 == sizeof(DfAttnMask), "mask 1.0 size");
_Static_assert(DF_ATTN_SHAPE_SIZE_V1_0 == sizeof(DfAttnShape), "shape 1.0 size");
_Static_assert(DF_ATTN_FORWARD_ARGS_SIZE_V1_0 == sizeof(DfAttnForwardArgs), "fwd 1.0 size");
_Static_assert(DF_ATTN_BACKWARD_ARGS_SIZE_V1_0 == sizeof(DfAttnBackwardArgs), "bwd 1.0 size");
_Static_assert(DF_ATTN_PLUGIN_SIZE_V1_0 == sizeof(DfAttnPlugin), "table 1.0 size");
