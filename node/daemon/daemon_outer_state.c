/* daemon_outer_state.c: the outer optimizer's state (--outer; anchor and
 * momentum, daemon_outer.c) across a restart: DATA_DIR/outer.safetensors,
 * written after each checkpoint and after the final one, read back when
 * the node resumes from its checkpoint (docs/compression.md, "The outer
 * optimizer").
 *
 * A periodic checkpoint's write runs on libuv's thread pool from a copy
 * of the state (two more vectors of the model's size while it runs; one
 * at a time), so the loop never waits on the disk; the final one, at the
 * leave, is written before the node exits.
 *
 * The file holds two float32 tensors of the model's size, "outer.anchor"
 * and "outer.momentum", and as metadata the setting ("outer", as
 * st_outer_name writes it) and the model description ("model") it was
 * written under. A file written under another setting or model, of
 * another size, or corrupt is left unused, with a warning naming it and
 * why: the node then starts the state afresh at its first round, as it
 * did before there was a file (the state is an optimization, not the
 * model: nothing is lost but the momentum).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/daemon/daemon_internal.h"

static const char FORMAT[] = "starling-outer-v1";

static void outer_path(const st__daemon_t* d, char* buf, size_t len) {
  snprintf(buf, len, "%s/outer.safetensors", d->data_dir);
}

/* One write of the file: what it writes, copied, so that the loop may go
 * on stepping the state meanwhile. */
typedef struct {
  uv_work_t work;
  st__daemon_t* d;
  char path[700], name[64], model[ST_XCHG_MODEL_MAX], step[32];
  size_t n;
  float* buf; /* anchor, then momentum */
  int rc;
  char err[512];
} save_t;

static void write_file(save_t* j) {
  st_tensor_desc_t t[2] = {
      {.name = "outer.anchor", .data = j->buf, .ndim = 1},
      {.name = "outer.momentum", .data = j->buf + j->n, .ndim = 1}};
  t[0].shape[0] = t[1].shape[0] = j->n;
  st_meta_kv_t meta[] = {{"format", FORMAT},
                         {"outer", j->name},
                         {"model", j->model},
                         {"step", j->step}};
  j->rc = st_safetensors_write(
      j->path, t, 2, meta, sizeof meta / sizeof meta[0], j->err, sizeof j->err);
}

static void save_work(uv_work_t* w) {
  write_file(w->data);
}

static void save_done(uv_work_t* w, int status) {
  save_t* j = w->data;
  j->d->outer_saving = false;
  if (status == 0 && j->rc != 0)
    st__dwarn(j->d, "the outer optimizer's state was not written: %s", j->err);
  free(j->buf);
  free(j);
}

int st__outer_save(st__daemon_t* d, bool now) {
  if (!st__outer_on(d) || d->outer_anchor == NULL || d->outer_n == 0 ||
      (!now && d->outer_saving))
    return 0;
  save_t* j = calloc(1, sizeof *j);
  size_t n = d->outer_n;
  if (j == NULL || (j->buf = malloc(2 * n * sizeof(float))) == NULL ||
      st_outer_name(&d->cfg->outer, j->name, sizeof j->name) != 0) {
    free(j != NULL ? j->buf : NULL);
    free(j);
    st__dwarn(d, "the outer optimizer's state was not written: no memory");
    return -ENOMEM;
  }
  j->d = d;
  j->n = n;
  outer_path(d, j->path, sizeof j->path);
  snprintf(j->model, sizeof j->model, "%s", d->local.model);
  snprintf(j->step, sizeof j->step, "%" PRIu64, d->outer_step);
  memcpy(j->buf, d->outer_anchor, n * sizeof(float));
  memcpy(j->buf + n, d->outer_m, n * sizeof(float));
  j->work.data = j;
  if (!now && uv_queue_work(&d->loop, &j->work, save_work, save_done) == 0) {
    d->outer_saving = true;
    return 0;
  }
  write_file(j);
  int rc = j->rc;
  if (rc != 0)
    st__dwarn(d, "the outer optimizer's state was not written: %s", j->err);
  free(j->buf);
  free(j);
  return rc;
}

/* Why the file at path cannot be this node's state, or NULL when it can
 * (then *anchor and *m point into st, of n floats). */
static const char* unusable(const st__daemon_t* d, const st_safetensors_t* st,
                            const float** anchor, const float** m) {
  char name[64];
  size_t na = 0, nm = 0;
  const char* fmt = st_safetensors_meta(st, "format");
  const char* outer = st_safetensors_meta(st, "outer");
  const char* model = st_safetensors_meta(st, "model");
  *anchor = st_safetensors_tensor(st, "outer.anchor", &na, NULL, NULL);
  *m = st_safetensors_tensor(st, "outer.momentum", &nm, NULL, NULL);
  if (fmt == NULL || strcmp(fmt, FORMAT) != 0)
    return "it is not a starling outer-optimizer state (format)";
  if (st_outer_name(&d->cfg->outer, name, sizeof name) != 0 || outer == NULL ||
      strcmp(outer, name) != 0)
    return "it was written under another --outer setting";
  if (model == NULL || strcmp(model, d->local.model) != 0)
    return "it was written for another model";
  if (*anchor == NULL || *m == NULL || na != nm ||
      na != (size_t) d->local.n_params)
    return "its tensors are missing or not of the model's size";
  return NULL;
}

void st__outer_resume(st__daemon_t* d) {
  char path[700], err[512];
  outer_path(d, path, sizeof path);
  if (!st__outer_on(d) || access(path, F_OK) != 0)
    return;
  st_safetensors_t* st = NULL;
  if (st_safetensors_read(path, &st, err, sizeof err) != 0) {
    st__dwarn(d,
              "%s; the outer optimizer starts afresh at the next round "
              "(remove the file to silence this)",
              err);
    return;
  }
  const float *anchor, *m;
  const char* why = unusable(d, st, &anchor, &m);
  size_t n = (size_t) d->local.n_params;
  if (why == NULL) {
    st__outer_free(d);
    d->outer_anchor = malloc(n * sizeof(float));
    d->outer_m = malloc(n * sizeof(float));
    if (d->outer_anchor == NULL || d->outer_m == NULL) {
      st__outer_free(d);
      why = "no memory for it";
    }
  }
  if (why != NULL) {
    st__dwarn(d,
              "%s is not used: %s; the outer optimizer starts afresh at the "
              "next round",
              path, why);
    st_safetensors_free(st);
    return;
  }
  memcpy(d->outer_anchor, anchor, n * sizeof(float));
  memcpy(d->outer_m, m, n * sizeof(float));
  d->outer_n = n;
  d->c.outer_resumed++;
  st__dlog(d, "resumed the outer optimizer's anchor and momentum from %s",
           path);
  st_safetensors_free(st);
}
