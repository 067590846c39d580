/* A stand-in for dmlc's dlpack.h: its version macros and the types dflash_attention.h also
 * defines, with more enumerators (as the real header has), so that including both redefines
 * something unless dflash_attention.h steps aside. Its guard is not the real header's
 * (DLPACK_DLPACK_H_), so the build's checks prove the version macros alone suffice:
 * DLPACK_MAJOR_VERSION (dlpack 1.x) by default, DLPACK_VERSION (0.6 to 0.8) with
 * -DSTANDIN_DLPACK_0_8. */
#ifndef STANDIN_DLPACK_H
#define STANDIN_DLPACK_H

#include <stdint.h>

#ifdef STANDIN_DLPACK_0_8
#define DLPACK_VERSION 80
#define DLPACK_ABI_VERSION 1
#else
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
#endif

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

#endif
