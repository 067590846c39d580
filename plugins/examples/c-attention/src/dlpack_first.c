/* dflash_attention.h after dlpack.h, as docs/plugins.md advises for plugins that use DLPack
 * themselves: the header must take dlpack.h's definitions instead of redefining them. Compiled
 * (syntax only) by this crate's build script against dlpack_standin/dlpack.h. */
#include <stddef.h>

#include <dlpack.h>

#include "dflash_attention.h"

#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(DLTensor) == 48, "DLTensor");
_Static_assert(sizeof(DfAttnForwardArgs) == 88, "DfAttnForwardArgs");
#endif
