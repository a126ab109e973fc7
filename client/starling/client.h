/* starling/client.h: train any model through the local starling node.
 *
 * A training program attaches to the `starling node --attach` running on
 * its machine, registers its parameters (a list of named float32 tensors in
 * its own memory), and calls st_client_step after every optimizer step. The
 * node does the rest: membership, gossip averaging, the ring all-reduce,
 * state for joiners, encryption, checkpoints (docs/attach.md).
 *
 *   st_client_tensor_t t[] = {{"w", ST_CLIENT_F32, 2, {10, 784}, w},
 *                             {"b", ST_CLIENT_F32, 1, {10}, b}};
 *   st_client_options_t o;
 *   st_client_options_default(&o);
 *   o.socket_path = "state/control.sock";
 *   st_client_t* c;
 *   char err[512];
 *   if (st_client_attach(&o, t, 2, &c, err, sizeof err) != 0) { ... }
 *   for (uint64_t s = st_client_cluster_step(c); ...; ) {
 *     ... one SGD step on w and b ...
 *     if (st_client_step(c, ++s) < 0) { puts(st_client_error(c)); ... }
 *   }
 *   st_client_detach(c);
 *
 * Parameters move through memory shared with the node. The library touches
 * the registered tensors only inside st_client_attach and st_client_step,
 * on the calling thread: a step boundary with nothing to do reads one
 * shared word; one that serves the node adds a correction to the
 * parameters and/or copies them once into the shared segment.
 *
 * Every call returns 0 (or a non-negative count) on success and a negative
 * errno on failure; st_client_error (or the err buffer of
 * st_client_attach) holds one sentence naming the cause and what to do.
 * Not thread-safe: one thread uses a client at a time.
 *
 * Link with `pkg-config --cflags --libs starling`.
 */
#ifndef STARLING_CLIENT_H
#define STARLING_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every public function is exported from the shared library, which is
 * built with hidden visibility (only the st_client_* names are visible). */
#if defined(__GNUC__)
#define ST_CLIENT_API __attribute__((visibility("default")))
#else
#define ST_CLIENT_API
#endif

/* The protocol version this header speaks (docs/attach.md). */
#define ST_CLIENT_PROTOCOL_VERSION 1

/* The protocol version of the library linked at run time: equal to
 * ST_CLIENT_PROTOCOL_VERSION unless the program was built against another
 * release's header. The node checks it at attach (-EPROTO). */
ST_CLIENT_API unsigned st_client_protocol_version(void);

#define ST_CLIENT_MAX_DIMS 8

typedef enum { ST_CLIENT_F32 = 0 } st_client_dtype_t;

typedef struct {
  const char* name;        /* unique in the list, e.g. "conv1.weight" */
  st_client_dtype_t dtype; /* ST_CLIENT_F32 */
  int ndim;                /* 0 (a scalar) .. ST_CLIENT_MAX_DIMS */
  int64_t shape[ST_CLIENT_MAX_DIMS];
  void* data; /* contiguous host memory, prod(shape) elements, owned by the
                 program and valid until st_client_detach */
} st_client_tensor_t;

typedef struct {
  const char*
      socket_path; /* the node's control socket (DATA_DIR/control.sock) */
  /* How long st_client_attach waits for the node to hand over the
   * parameters (it may synchronize from a peer first); 0: no limit.
   * Default 300 s. */
  double attach_timeout_s;
  /* When the node goes away: 0 (default) makes st_client_step fail with
   * -ENOTCONN; 1 makes it wait up to reconnect_timeout_s for the node to
   * come back, attach again, and take the node's parameters. */
  int reconnect;
  double reconnect_timeout_s; /* default 60 s; 0: no limit */
} st_client_options_t;

typedef struct st_client_s st_client_t;

ST_CLIENT_API void st_client_options_default(st_client_options_t* opt);

/* Attaches to the node: checks the tensor list, creates the shared
 * segment, sends both, waits for the node's answer, and copies the
 * parameters the node hands over (the cluster's, its checkpoint's, or this
 * program's own when it is the first) into the tensors. Errors:
 * -ENOENT / -ECONNREFUSED: no node at socket_path (is `starling node
 * --attach` running?), or a node that refuses attaching (not in attach
 * mode, leaving); -EBUSY: another program is attached; -EINVAL: a bad
 * tensor list, or one that differs from the node's model (err names the
 * first differing tensor); -EPROTO: the node speaks another protocol
 * version; -ETIMEDOUT (attach_timeout_s); -ECONNRESET: the node closed the
 * connection before answering; -ENAMETOOLONG: socket_path does not fit a
 * Unix socket address; -ENOMEM. On failure *out is NULL. */
ST_CLIENT_API int st_client_attach(const st_client_options_t* opt,
                                   const st_client_tensor_t* tensors,
                                   size_t n_tensors, st_client_t** out,
                                   char* err, size_t err_len);

/* The step boundary: the program finished step `step`. Serves what the
 * node asked for since the last boundary, in place. Returns a bitmask of
 * what was done (0: nothing): ST_CLIENT_DID_STATE (the parameters were
 * replaced by the node's: a re-attach after the node came back, or the
 * node re-synchronizing; st_client_cluster_step says from which step),
 * ST_CLIENT_DID_APPLY (an averaging correction was added),
 * ST_CLIENT_DID_SNAPSHOT (the parameters were copied for the node). Errors:
 * -EDOM: the parameters are not finite (nothing was shared or applied; the
 * error names the first such tensor); -ENOTCONN: the node went away
 * (without reconnect, or it did not come back in time, or refused this
 * program when it did), and every later call returns it too. */
#define ST_CLIENT_DID_APPLY 1
#define ST_CLIENT_DID_SNAPSHOT 2
#define ST_CLIENT_DID_STATE 4
ST_CLIENT_API int st_client_step(st_client_t* c, uint64_t step);

/* What the node has asked for and the next st_client_step will serve (the
 * ST_CLIENT_DID_* bits; 0: nothing). One shared-memory read: a program
 * whose parameters live elsewhere (a GPU) copies them to the registered
 * host buffers only when this says SNAPSHOT or APPLY is wanted. The next
 * st_client_step then serves only what this reported: a request that
 * comes between the two waits for the boundary after (it would otherwise
 * be served from host buffers not copied for it). */
ST_CLIENT_API unsigned st_client_pending(st_client_t* c);

/* The step the parameters handed over at attach (or the last
 * ST_CLIENT_DID_STATE) belong to: a program continues counting from it so
 * that its learning-rate schedule follows the cluster. */
ST_CLIENT_API uint64_t st_client_cluster_step(const st_client_t* c);

/* The program's own figures, shown by `starling status` (NaN: none). */
ST_CLIENT_API void st_client_report(st_client_t* c, double loss,
                                    double accuracy);

/* The last error's sentence ("" when none). */
ST_CLIENT_API const char* st_client_error(const st_client_t* c);

/* Ends the session and frees c: hands the tensors' current values to the
 * node as the program's last parameters (when they are finite; a
 * correction the program has not taken yet is added on the node's side),
 * and the node goes on serving them to its peers and to the next program
 * that attaches. Safe on NULL. Returns 0, or -ENOTCONN when the node had
 * already gone (c is freed either way). */
ST_CLIENT_API int st_client_detach(st_client_t* c);

/* ==== Collectives ==========================================================
 *
 * The communication patterns over the cluster, through the local node
 * (any `starling node`: built-in training or --attach; docs/collectives.md):
 * all-reduce, reduce to a root, broadcast from a root, barrier, and point
 * to point push/pull and notify/wait. A
 * program opens a communicator on its node's control socket; every member
 * of a group calls the same operation (same kind, reduction, dtype, root
 * and count) in the same order, and each call blocks until the operation
 * is complete on this member, or fails everywhere.
 *
 * A group is NULL or "all" (every member alive now, frozen at the call:
 * every member must see the same list, a difference is an error naming
 * both), or a comma-separated list of member ids (32 hex digits each, as
 * st_comm_members and `starling peers` give them; this node included).
 * Ranks are the group's ids in sorted order; a root is a rank.
 *
 * Failures: 0 on success; -EINVAL: bad arguments, or a member called
 * something else (the error names both calls); -ECONNABORTED: a member of
 * the group died, left or went away (named), or failed the operation;
 * -ETIMEDOUT: timeout_s passed (0: no limit; the error names the members
 * not heard from); -ENOTCONN: the node went away (every later call fails
 * too); -ENOMEM. On failure the data is unspecified: nobody returns a
 * partial result as complete. Not thread-safe: one thread per
 * communicator; a program may open several. */

/* BF16: bfloat16 (2 bytes, the top half of a float32); reductions combine
 * each pair in float32 and round to nearest even, so a sum of n members
 * rounds n - 1 times; min, max and moving data are exact. */
typedef enum {
  ST_COMM_F32 = 0,
  ST_COMM_F64 = 1,
  ST_COMM_BF16 = 2
} st_comm_dtype_t;
typedef enum {
  ST_COMM_SUM = 0,
  ST_COMM_MEAN = 1,
  ST_COMM_MIN = 2,
  ST_COMM_MAX = 3
} st_comm_op_t;

typedef struct st_comm_s st_comm_t;

/* Opens a communicator on the node's control socket, with a segment of
 * memory shared with the node (1 GiB of address space, pages used as
 * written, until st_comm_close): operands of 32 KiB or more are copied
 * there and the result back, the rest travel on the socket; a node without
 * the segment gets everything on the socket. -ENOENT / -ECONNREFUSED: no
 * node there; -EBUSY: the node refused (too many sessions, leaving; err
 * says which); -ENAMETOOLONG; -ENOMEM. */
ST_CLIENT_API int st_comm_open(const char* socket_path, st_comm_t** out,
                               char* err, size_t err_len);
/* Closes it (an operation cannot be in progress: calls block). Safe on
 * NULL. */
ST_CLIENT_API void st_comm_close(st_comm_t* c);
/* The last error's sentence ("" when none). */
ST_CLIENT_API const char* st_comm_error(const st_comm_t* c);

/* The group "all" as the node sees it now: up to cap ids (NUL-terminated
 * hex) in rank order into ids, their number into *n (may exceed cap), and
 * this node's rank into *rank. */
ST_CLIENT_API int st_comm_members(st_comm_t* c, char (*ids)[33], size_t cap,
                                  size_t* n, size_t* rank);

/* data[0..count) becomes the reduction over the group, on every member
 * (bit-identical everywhere). MEAN is the sum divided by the group size. */
ST_CLIENT_API int st_comm_all_reduce(st_comm_t* c, const char* group,
                                     void* data, uint64_t count,
                                     st_comm_dtype_t dtype, st_comm_op_t op,
                                     double timeout_s);
/* The same, kept by the root only: its data[0..count) becomes the
 * reduction; the others' data is left as it was. */
ST_CLIENT_API int st_comm_reduce(st_comm_t* c, const char* group, uint32_t root,
                                 void* data, uint64_t count,
                                 st_comm_dtype_t dtype, st_comm_op_t op,
                                 double timeout_s);
/* The root's data[0..count) is copied into every member's data. */
ST_CLIENT_API int st_comm_broadcast(st_comm_t* c, const char* group,
                                    uint32_t root, void* data, uint64_t count,
                                    st_comm_dtype_t dtype, double timeout_s);
/* Returns once every member of the group has called it. */
ST_CLIENT_API int st_comm_barrier(st_comm_t* c, const char* group,
                                  double timeout_s);
/* Point to point, between this member and peer (a member id, 32 hex
 * digits), matched by name (1 to 128 bytes; names are reused, as MPI tags
 * are: a node numbers calls for at most 65536 distinct names and groups).
 * The k-th push of a name from A to B meets B's k-th pull of that name
 * from A; the k-th notify, the k-th wait. Pushes of other names, or the
 * other way, go their own way. A push or a notify returns once its data
 * is sent (eager, as MPI's small sends): the peer's node keeps what comes
 * before the pull or the wait (up to 256 MiB and 5 minutes; beyond, it is
 * dropped, counted in collectives.dropped, and the pull waits until its
 * timeout). A pull or a wait blocks until it comes or timeout_s passes. A
 * pull whose count or dtype differs from the push's fails with -EINVAL
 * naming both calls (the push has returned); a peer that dies or leaves
 * fails the call with -ECONNABORTED. */
ST_CLIENT_API int st_comm_push(st_comm_t* c, const char* peer, const char* name,
                               const void* data, uint64_t count,
                               st_comm_dtype_t dtype, double timeout_s);
/* Fills data[0..count) with what peer pushes under name. */
ST_CLIENT_API int st_comm_pull(st_comm_t* c, const char* peer, const char* name,
                               void* data, uint64_t count,
                               st_comm_dtype_t dtype, double timeout_s);
/* Signals peer, which waits for it under name. */
ST_CLIENT_API int st_comm_notify(st_comm_t* c, const char* peer,
                                 const char* name, double timeout_s);
/* Returns once peer has notified this member under name. */
ST_CLIENT_API int st_comm_wait(st_comm_t* c, const char* peer, const char* name,
                               double timeout_s);
/* Publish and fetch (one-sided): a program publishes a named tensor on
 * its node, which keeps a copy; any member may then fetch it, any number
 * of times, without a call by the publisher's program (which may even
 * have gone: the node keeps what was published until it is published
 * again, unpublished, or the node stops). Names are this node's own
 * (1 to 128 bytes), apart from push/pull's. A node keeps at most 1024
 * names and 1 GiB. Every member holding the cluster key may fetch what is
 * published: publish nothing the cluster should not read. */

/* Keeps a copy of data[0..count) under name on this node, replacing what
 * was published under it (a fetch in progress finishes with the old
 * copy). -ENOSPC past the node's bounds (err says which), -EINVAL. */
ST_CLIENT_API int st_comm_publish(st_comm_t* c, const char* name,
                                  const void* data, uint64_t count,
                                  st_comm_dtype_t dtype);
/* Forgets what this node published under name: -ENOENT when nothing. */
ST_CLIENT_API int st_comm_unpublish(st_comm_t* c, const char* name);
/* Fills data[0..count) with what member peer has published under name,
 * as it is when peer's node receives the request. -ENOENT: nothing is
 * published under name there; -EINVAL: it holds another count or dtype
 * (the error names both); -EBUSY: peer's node serves as many fetches as
 * it may at once (retry); -ECONNABORTED: peer died, left or its node
 * stopped; -ETIMEDOUT as for every call. */
ST_CLIENT_API int st_comm_fetch(st_comm_t* c, const char* peer,
                                const char* name, void* data, uint64_t count,
                                st_comm_dtype_t dtype, double timeout_s);

/* This member's rank and the group's size in the last operation that
 * succeeded (0 and 0 before any). */
ST_CLIENT_API void st_comm_last_group(const st_comm_t* c, uint32_t* rank,
                                      uint32_t* size);

/* ==== Algorithms over a group ==============================================
 *
 * Parallel k-means and least squares over the collectives above
 * (client/comm_algos.c over algos/; docs/collectives.md, "Algorithms";
 * the same as `starling kmeans` and `starling lstsq`, which call these).
 * Every member of the group calls the same function with the same options
 * on its own rows (n may be 0 on some), and every member gets the same
 * result, bit for bit. A first exchange checks that the members agree on
 * the options and the number of features (-EINVAL naming the first that
 * differs: "the members disagree on ..."); for the group "all" (NULL) it
 * also fixes the list of members, so that a join or a leave as they start
 * fails every one of them alike. The error of any failure is
 * st_comm_error's, as for every call; timeout_s bounds each collective
 * call (0: none). */

/* One k-means iteration, for progress. */
typedef struct {
  uint32_t iteration; /* 1-based */
  double objective;   /* sum of squared distances before its update */
  double moved;       /* the largest distance a centroid moved */
  size_t empty;       /* clusters without a point (their centroid kept) */
} st_comm_kmeans_iter_t;

typedef struct {
  size_t k;          /* clusters, >= 1 */
  uint32_t max_iter; /* iterations at most (default 300) */
  double tol;        /* converged when no centroid moves more than this
                        (default 1e-4; 0: until no point changes cluster) */
  uint64_t seed;     /* the k-means++ draw (default 1) */
  /* Called after every iteration on the calling thread; may be NULL. */
  void (*progress)(void* arg, const st_comm_kmeans_iter_t* it);
  void* progress_arg;
} st_comm_kmeans_opts_t;

typedef struct {
  uint64_t points; /* over every member */
  uint32_t iterations;
  int converged;       /* 1: stopped by tol; 0: by max_iter */
  double objective;    /* sum of squared distances at the final centroids */
  double moved;        /* the last iteration's largest move */
  uint32_t rank, size; /* this member in the group */
  int same_data;       /* 1: every member held the same rows (each counted size
                          times: give each member its own shard) */
} st_comm_kmeans_info_t;

/* Defaults: k 0 (to set), max_iter 300, tol 1e-4, seed 1, no progress. */
ST_CLIENT_API void st_comm_kmeans_opts_default(st_comm_kmeans_opts_t* o);

/* k-means (Lloyd's algorithm, k-means++ start) on this member's points x
 * (n x dim float32, row-major) with the group's: centroids (k x dim,
 * row-major) and counts (k: points nearest each) are filled; info (may be
 * NULL) says how it went. A point equally near two centroids goes to the
 * lower index; a cluster without a point keeps its previous centroid.
 * -EINVAL: k 0, dim 0, a bad tol, fewer points than k over the group, or
 * options that differ between members. */
ST_CLIENT_API int st_comm_kmeans(st_comm_t* c, const char* group,
                                 const float* x, size_t n, size_t dim,
                                 const st_comm_kmeans_opts_t* opts,
                                 double timeout_s, double* centroids,
                                 double* counts, st_comm_kmeans_info_t* info);

typedef enum {
  ST_COMM_LSTSQ_NORMAL = 0,
  ST_COMM_LSTSQ_GD = 1
} st_comm_lstsq_method_t;

/* One gradient-descent iteration, for progress. */
typedef struct {
  uint32_t iteration; /* 1-based */
  double objective;   /* at the weights before its step */
  double grad_norm;   /* ||g_t|| / ||g_1|| */
} st_comm_lstsq_iter_t;

typedef struct {
  st_comm_lstsq_method_t method; /* NORMAL (default): the closed form from
                                    the summed X^T X and X^T y; GD:
                                    gradient descent */
  int intercept;                 /* 1 (default): fit a bias (not penalized) */
  double ridge;                  /* >= 0 (default 0) */
  uint32_t max_iter;             /* GD: iterations at most (default 1000) */
  double tol;   /* GD: stop at ||g_t|| <= tol ||g_1|| (default 1e-6) */
  double alpha; /* GD: step alpha / (n sqrt(t)); 0 (default): chosen from
                   the data */
  void (*progress)(void* arg, const st_comm_lstsq_iter_t* it); /* GD */
  void* progress_arg;
} st_comm_lstsq_opts_t;

typedef struct {
  double bias;           /* 0 without an intercept */
  uint64_t points;       /* rows over every member */
  int qr;                /* NORMAL: 1 when the normal matrix was singular or ill
                            conditioned and pivoted QR solved it (minimum norm) */
  int positive_definite; /* NORMAL: the normal matrix was (QR: 0 when it
                            was singular, 1 when ill conditioned) */
  double rcond;      /* NORMAL: LAPACK's estimate of its reciprocal condition */
  size_t solve_rank; /* NORMAL: dim, or the rank QR found */
  double rss;        /* sum of squared residuals */
  double objective;  /* rss + ridge ||weight||^2 */
  double rmse;       /* sqrt(rss / points) */
  uint32_t iterations; /* GD */
  int converged;       /* GD: stopped by tol */
  double grad_norm;    /* GD: the last ||g_t|| / ||g_1|| */
  double alpha;        /* GD: the alpha used */
  uint32_t rank, size; /* this member in the group */
  int same_data;       /* as st_comm_kmeans_info_t's */
} st_comm_lstsq_info_t;

/* Defaults: NORMAL, intercept, ridge 0, max_iter 1000, tol 1e-6, alpha 0. */
ST_CLIENT_API void st_comm_lstsq_opts_default(st_comm_lstsq_opts_t* o);

/* Least squares, min ||X w + b - y||^2 + ridge ||w||^2, on this member's
 * rows (x: n x dim float32 row-major, y: n) with the group's: weight (dim)
 * is filled, info (may be NULL) holds the bias and the rest. -EINVAL: dim
 * 0, a bad ridge, tol or alpha, no rows on any member, options that
 * differ; -EDOM: LAPACK failed. */
ST_CLIENT_API int st_comm_lstsq(st_comm_t* c, const char* group, const float* x,
                                const float* y, size_t n, size_t dim,
                                const st_comm_lstsq_opts_t* opts,
                                double timeout_s, double* weight,
                                st_comm_lstsq_info_t* info);

#ifdef __cplusplus
}
#endif

#endif
