/* Debug breakpoints: a request pauses at the armed event until resumed;
 * other requests and unarmed events pass; tags are unique and one-shot. */
#include "qktest.h"
#include "aio/loop.h"
#include "block/debug.h"

#include <errno.h>

static int progress[3];

static void coroutine_fn req(void *opaque)
{
    int id = *(int *)opaque;
    progress[id] = 1;
    qk_block_debug_event(QK_DBG_WRITE_AIO);
    progress[id] = 2;
    qk_block_debug_event(QK_DBG_L2_UPDATE);
    progress[id] = 3;
}

static void coroutine_fn body(void *opaque)
{
    (void)opaque;
    QK_CHECK_EQ(qk_debug_event_parse("write_aio"), QK_DBG_WRITE_AIO);
    QK_CHECK_EQ(qk_debug_event_parse("nope"), -1);
    QK_CHECK_EQ(qk_debug_break(QK_DBG_L2_UPDATE, "A"), 0);
    QK_CHECK_EQ(qk_debug_break(QK_DBG_L2_UPDATE, "A"), -EEXIST);
    QK_CHECK(!qk_debug_is_paused("A"));

    static int ids[3] = {0, 1, 2};
    qk_coroutine_enter(qk_coroutine_create(req, &ids[0]));
    qk_debug_wait_break("A");
    QK_CHECK(qk_debug_is_paused("A"));
    QK_CHECK_EQ(progress[0], 2); /* paused at l2_update, not write_aio */

    /* The breakpoint is one-shot: a second request passes. */
    qk_coroutine_enter(qk_coroutine_create(req, &ids[1]));
    QK_CHECK_EQ(progress[1], 3);
    QK_CHECK_EQ(progress[0], 2);

    QK_CHECK_EQ(qk_debug_resume("B"), -ENOENT);
    QK_CHECK_EQ(qk_debug_resume("A"), 0);
    qk_co_sleep_ns(100000);
    QK_CHECK_EQ(progress[0], 3);
    QK_CHECK(!qk_debug_is_paused("A"));

    /* Removing an armed breakpoint disarms it. */
    QK_CHECK_EQ(qk_debug_break(QK_DBG_WRITE_AIO, "C"), 0);
    QK_CHECK_EQ(qk_debug_remove_break("C"), 0);
    qk_coroutine_enter(qk_coroutine_create(req, &ids[2]));
    QK_CHECK_EQ(progress[2], 3);
    QK_CHECK_EQ(qk_debug_armed, 0);
}

int main(void)
{
    qk_co_run(body, NULL);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
