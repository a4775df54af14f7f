/*
 * The io_uring backend's page-cache writer thread (see uring_writer.c).
 */
#ifndef QK_AIO_URING_WRITER_H
#define QK_AIO_URING_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/aio.h"

typedef struct QkUringWriter QkUringWriter;

/* Whether the kernel can post completions from one ring to another. */
bool qk_uring_writer_usable(void);
/* Starts the thread. When results are ready it posts one completion to the
 * ring whose fd is target_ring_fd, with user_data = the writer's address
 * with the low bit set (request addresses never have it); the loop then
 * calls qk_uring_writer_take. */
QkUringWriter *qk_uring_writer_new(int target_ring_fd, int *errno_out);
/* Hands over a list of buffered writes (linked by next, head to tail);
 * returns how many. */
unsigned qk_uring_writer_push(QkUringWriter *w, QkAioReq *head, QkAioReq *tail);
/* The finished writes (req->result set), oldest first, linked by next. */
QkAioReq *qk_uring_writer_take(QkUringWriter *w);
/* Finishes the writes handed over, delivers their results, and stops. */
void qk_uring_writer_free(QkUringWriter *w);

#endif
