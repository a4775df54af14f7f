/*
 * Human sizes: "64k", "1G", "512" (bytes), "1.5M"; suffixes are powers of
 * 1024 as in qemu-img (k/K, M, G, T, P, E; optional trailing "B"/"iB").
 */
#ifndef QK_UTIL_SIZE_H
#define QK_UTIL_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "qcowkit/engine.h"
/* qk_parse_size, qk_parse_uint and qk_format_size are declared there. */


#endif
