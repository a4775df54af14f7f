/*
 * What an encrypted image says about its encryption. qcowkit holds no
 * keys and never reads encrypted guest data; a metadata-only open (info)
 * still describes such an image as qemu-img info does without a key: the
 * legacy AES method by name, LUKS by the header the crypto header
 * extension points at (cipher, modes, hash, uuid, key slots).
 *
 * Owns: the crypto header extension and the LUKS (version 1) header,
 * read and checked, into s->encrypt.
 */
#include "qcow2/qcow2_int.h"
#include "common/byteorder.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The LUKS1 on-disk header: fixed part, then 8 key slots of 48 bytes. */
enum {
    LUKS_HDR_SIZE = 592,
    LUKS_OFF_VERSION = 6,
    LUKS_OFF_CIPHER_NAME = 8,
    LUKS_OFF_CIPHER_MODE = 40,
    LUKS_OFF_HASH_SPEC = 72,
    LUKS_OFF_PAYLOAD = 104,
    LUKS_OFF_KEY_BYTES = 108,
    LUKS_OFF_MK_ITERS = 164,
    LUKS_OFF_UUID = 168,
    LUKS_OFF_SLOTS = 208,
    LUKS_SLOT_SIZE = 48,
    LUKS_NAME_LEN = 32,
    LUKS_SECTOR = 512,
};
#define LUKS_SLOT_ENABLED 0x00AC71F3U
#define LUKS_SLOT_DISABLED 0x0000DEADU
#define LUKS_STRIPES 4000U

static const uint8_t luks_magic[6] = {'L', 'U', 'K', 'S', 0xba, 0xbe};

/* A NUL-padded name field of LEN bytes, as a string. */
static void field_str(const uint8_t *p, size_t len, char *out, size_t outlen)
{
    size_t n = strnlen((const char *)p, len);
    if (n >= outlen) {
        n = outlen - 1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

static bool one_of(const char *s, const char *const *list)
{
    for (; *list; list++) {
        if (strcmp(s, *list) == 0) {
            return true;
        }
    }
    return false;
}

static const char *const hash_names[] = {"md5", "sha1", "sha224", "sha256", "sha384", "sha512", "ripemd160", NULL};

/* The cipher the name and key size make, by QEMU's names ("aes-256"). */
static int cipher_alg(const char *name, uint32_t key_bytes, char *out, size_t outlen)
{
    static const struct { const char *name; uint32_t key_bytes; const char *alg; } algs[] = {
        {"aes", 16, "aes-128"}, {"aes", 24, "aes-192"}, {"aes", 32, "aes-256"},
        {"cast5", 16, "cast5-128"},
        {"serpent", 16, "serpent-128"}, {"serpent", 24, "serpent-192"}, {"serpent", 32, "serpent-256"},
        {"twofish", 16, "twofish-128"}, {"twofish", 24, "twofish-192"}, {"twofish", 32, "twofish-256"},
    };
    for (size_t i = 0; i < sizeof(algs) / sizeof(algs[0]); i++) {
        if (strcmp(algs[i].name, name) == 0 && algs[i].key_bytes == key_bytes) {
            snprintf(out, outlen, "%s", algs[i].alg);
            return 0;
        }
    }
    return -1;
}

/* The names must end inside their fields. */
static int check_names(const uint8_t *h, QkError *err)
{
    static const struct { unsigned off; const char *what; } f[] = {
        {LUKS_OFF_CIPHER_NAME, "cipher name"}, {LUKS_OFF_CIPHER_MODE, "cipher mode"}, {LUKS_OFF_HASH_SPEC, "hash spec"},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (strnlen((const char *)h + f[i].off, LUKS_NAME_LEN) == LUKS_NAME_LEN) {
            return qk_error_set(err, -EINVAL, "LUKS header %s is not NUL terminated", f[i].what);
        }
    }
    return 0;
}

/* The layout LUKS1 prescribes: the header's first 4 KiB, then each slot's
 * key material (key bytes times stripes, in whole 4 KiB units), apart
 * from each other, then the payload. A header that breaks it is damaged:
 * refused as qemu-img refuses it (in its words), even for info. These
 * are the LUKS header's own rules, so the qcow2 image is not marked. */
static int check_layout(const uint8_t *h, QkError *err)
{
    const uint64_t hdr_sectors = 4096 / LUKS_SECTOR;
    uint64_t payload = qk_be32_get(h + LUKS_OFF_PAYLOAD);
    uint64_t key_bytes = qk_be32_get(h + LUKS_OFF_KEY_BYTES);
    if (payload < hdr_sectors) {
        return qk_error_set(err, -EINVAL, "LUKS payload is overlapping with the header");
    }
    uint64_t start[8], len[8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *k = h + LUKS_OFF_SLOTS + i * LUKS_SLOT_SIZE;
        uint32_t state = qk_be32_get(k), stripes = qk_be32_get(k + 44);
        if (state != LUKS_SLOT_ENABLED && state != LUKS_SLOT_DISABLED) {
            return qk_error_set(err, -EINVAL, "Keyslot %d state (active/disable) is corrupted", i);
        }
        if (stripes != LUKS_STRIPES) {
            return qk_error_set(err, -EINVAL, "Keyslot %d is corrupted (stripes %u != %u)", i, stripes, LUKS_STRIPES);
        }
        if (state == LUKS_SLOT_ENABLED && qk_be32_get(k + 4) == 0) {
            return qk_error_set(err, -EINVAL, "Keyslot %d iteration count is zero", i);
        }
        start[i] = qk_be32_get(k + 40);
        len[i] = qk_align_up(QK_DIV_ROUND_UP(key_bytes * stripes, LUKS_SECTOR), hdr_sectors);
        if (start[i] < hdr_sectors) {
            return qk_error_set(err, -EINVAL, "Keyslot %d is overlapping with the LUKS header", i);
        }
        if (start[i] + len[i] > payload) {
            return qk_error_set(err, -EINVAL, "Keyslot %d is overlapping with the encrypted payload", i);
        }
    }
    for (int i = 0; i < 8; i++) {
        for (int j = i + 1; j < 8; j++) {
            if (start[i] < start[j] + len[j] && start[j] < start[i] + len[i]) {
                return qk_error_set(err, -EINVAL, "Keyslots %d and %d are overlapping in the header", i, j);
            }
        }
    }
    return 0;
}

static int parse_luks(QkEncryptInfo *e, const uint8_t *h, QkError *err)
{
    if (memcmp(h, luks_magic, sizeof(luks_magic)) != 0) {
        return qk_error_set(err, -EINVAL, "Volume is not in LUKS format");
    }
    uint16_t version = (uint16_t)(h[LUKS_OFF_VERSION] << 8 | h[LUKS_OFF_VERSION + 1]);
    if (version != 1) {
        return qk_error_set(err, -ENOTSUP, "LUKS version %u is not supported", version);
    }
    int r = check_names(h, err);
    if (r == 0) {
        r = check_layout(h, err);
    }
    if (r < 0) {
        return r;
    }
    char name[LUKS_NAME_LEN], mode[LUKS_NAME_LEN];
    field_str(h + LUKS_OFF_CIPHER_NAME, LUKS_NAME_LEN, name, sizeof(name));
    field_str(h + LUKS_OFF_CIPHER_MODE, LUKS_NAME_LEN, mode, sizeof(mode));
    /* The mode is "MODE-IVGEN", with essiv "MODE-essiv:HASH". */
    char *dash = strchr(mode, '-');
    if (!dash) {
        return qk_error_set(err, -EINVAL, "Unexpected cipher mode string format '%s'", mode);
    }
    *dash = '\0';
    char *ivgen = dash + 1, *colon = strchr(ivgen, ':');
    if (colon) {
        *colon = '\0';
        snprintf(e->ivgen_hash_alg, sizeof(e->ivgen_hash_alg), "%.15s", colon + 1);
    }
    static const char *const modes[] = {"ecb", "cbc", "xts", "ctr", NULL};
    static const char *const ivgens[] = {"plain", "plain64", "essiv", NULL};
    if (!one_of(mode, modes)) {
        return qk_error_set(err, -ENOTSUP, "Cipher mode '%s' not supported", mode);
    }
    /* XTS keys are two keys of the cipher's size. */
    uint32_t key_bytes = qk_be32_get(h + LUKS_OFF_KEY_BYTES);
    uint32_t cipher_key = strcmp(mode, "xts") == 0 ? key_bytes / 2 : key_bytes;
    if (cipher_alg(name, cipher_key, e->cipher_alg, sizeof(e->cipher_alg)) < 0) {
        return qk_error_set(err, -ENOTSUP, "Algorithm '%s' with key size %u bytes not supported", name, cipher_key);
    }
    if (!one_of(ivgen, ivgens)) {
        return qk_error_set(err, -ENOTSUP, "IV generator '%s' not supported", ivgen);
    }
    if ((strcmp(ivgen, "essiv") == 0) != (e->ivgen_hash_alg[0] != '\0') ||
        (e->ivgen_hash_alg[0] && !one_of(e->ivgen_hash_alg, hash_names))) {
        return qk_error_set(err, -ENOTSUP, "IV generator '%s%s%s' not supported", ivgen,
                            e->ivgen_hash_alg[0] ? ":" : "", e->ivgen_hash_alg);
    }
    snprintf(e->cipher_mode, sizeof(e->cipher_mode), "%.7s", mode); /* one of modes[] */
    snprintf(e->ivgen_alg, sizeof(e->ivgen_alg), "%.15s", ivgen);
    field_str(h + LUKS_OFF_HASH_SPEC, LUKS_NAME_LEN, e->hash_alg, sizeof(e->hash_alg));
    if (!one_of(e->hash_alg, hash_names)) {
        return qk_error_set(err, -ENOTSUP, "Hash algorithm '%.31s' not supported",
                            (const char *)(h + LUKS_OFF_HASH_SPEC));
    }
    field_str(h + LUKS_OFF_UUID, 40, e->uuid, sizeof(e->uuid));
    e->payload_offset = (uint64_t)qk_be32_get(h + LUKS_OFF_PAYLOAD) * LUKS_SECTOR;
    e->master_key_iters = qk_be32_get(h + LUKS_OFF_MK_ITERS);
    for (int i = 0; i < 8; i++) {
        const uint8_t *k = h + LUKS_OFF_SLOTS + i * LUKS_SLOT_SIZE;
        QkEncryptSlotInfo *sl = &e->slots[i];
        sl->active = qk_be32_get(k) == LUKS_SLOT_ENABLED;
        sl->iters = qk_be32_get(k + 4);
        sl->key_offset = (uint64_t)qk_be32_get(k + 40) * LUKS_SECTOR;
        sl->stripes = qk_be32_get(k + 44);
    }
    return 0;
}

int coroutine_fn qcow2_crypto_info_load(Qcow2State *s, uint64_t file_len, QkError *err)
{
    QkEncryptInfo *e = calloc(1, sizeof(*e));
    if (!e) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    int r = 0;
    const Qcow2Ext *x = s->exts;
    while (x && x->type != QCOW2_EXT_CRYPTO) {
        x = x->next;
    }
    if (s->h.crypt_method == QCOW2_CRYPT_AES && x) {
        r = qk_error_set(err, -EINVAL, "CRYPTO header extension only expected with LUKS encryption method");
    } else if (s->h.crypt_method == QCOW2_CRYPT_AES) {
        e->format = "aes";
    } else if (s->h.crypt_method == QCOW2_CRYPT_LUKS) {
        e->format = "luks";
        uint64_t off = 0, len = 0;
        if (!x) {
            r = qk_error_set(err, -EINVAL, "the image is LUKS-encrypted but has no crypto header extension");
        } else if (x->len != 16) {
            r = qk_error_set(err, -EINVAL, "CRYPTO header extension size %u, but expected size 16", x->len);
        } else {
            off = qk_be64_get(x->data);
            len = qk_be64_get(x->data + 8);
            if (!qk_is_aligned(off, s->cluster_size)) {
                r = qk_error_set(err, -EINVAL, "Encryption header offset '%" PRIu64 "' is not a multiple of cluster "
                                     "size '%" PRIu64 "'", off, s->cluster_size);
            } else if (off < s->cluster_size) {
                r = qk_error_set(err, -EINVAL, "the LUKS header (offset 0) overlaps the image header");
            } else if (len < LUKS_HDR_SIZE || !qk_range_within(off, len, file_len)) {
                r = qk_error_set(err, -EINVAL, "the LUKS header (offset %#" PRIx64 ", %" PRIu64
                                     " bytes) does not fit in the file", off, len);
            }
        }
        uint8_t h[LUKS_HDR_SIZE];
        if (r == 0) {
            r = qk_co_pread(s->bs->file, off, sizeof(h), h, 0);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not read the LUKS header");
            }
        }
        if (r == 0) {
            r = parse_luks(e, h, err);
        }
    } else {
        r = qk_error_set(err, -ENOTSUP, "Unsupported encryption method %u", s->h.crypt_method);
    }
    if (r < 0) {
        free(e);
        return r;
    }
    s->encrypt = e;
    return 0;
}
