/*
 * Big-endian loads and stores at any alignment: the one set used by the
 * qcow2 metadata (all big-endian on disk) and the NBD wire protocol.
 */
#ifndef QK_COMMON_BYTEORDER_H
#define QK_COMMON_BYTEORDER_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t qk_be16_get(const void *p) { uint16_t v; memcpy(&v, p, 2); return be16toh(v); }
static inline uint32_t qk_be32_get(const void *p) { uint32_t v; memcpy(&v, p, 4); return be32toh(v); }
static inline uint64_t qk_be64_get(const void *p) { uint64_t v; memcpy(&v, p, 8); return be64toh(v); }
static inline void qk_be16_put(void *p, uint16_t v) { v = htobe16(v); memcpy(p, &v, 2); }
static inline void qk_be32_put(void *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); }
static inline void qk_be64_put(void *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); }

#endif
