/*
 * The qcow2 format driver (placeholder until the format lands).
 */
#include "block/block.h"

#include <string.h>

static int qcow2_probe(const uint8_t *buf, size_t len)
{
    return len >= 4 && memcmp(buf, "QFI\xfb", 4) == 0 ? 100 : 0;
}

static int coroutine_fn qcow2_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    (void)opts;
    return qk_error_set(err, -ENOTSUP, "'%s': qcow2 is not supported yet", bs->filename);
}

const QkBlockDriver qk_drv_qcow2 = {
    .format_name = "qcow2",
    .probe = qcow2_probe,
    .co_open = qcow2_open,
};
