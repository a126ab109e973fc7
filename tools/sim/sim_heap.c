/* sim_heap.c: the simulator's one event queue, a binary min-heap keyed by
 * (time, sequence number). The sequence number is taken at push time from
 * a counter, so two events due at the same microsecond come out in the
 * order they were scheduled: the run never depends on how the heap happens
 * to break ties, and the same seed replays the same history. */
#include "tools/sim/sim.h"

#include <errno.h>
#include <stdlib.h>

static bool before(const st_sim_event_t* a, const st_sim_event_t* b) {
  if (a->at_us != b->at_us)
    return a->at_us < b->at_us;
  return a->seq < b->seq;
}

int st__sim_heap_push(st_sim_heap_t* h, const st_sim_event_t* e) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 1024;
    st_sim_event_t* ev = realloc(h->ev, cap * sizeof(*ev));
    if (ev == NULL)
      return -ENOMEM;
    h->ev = ev;
    h->cap = cap;
  }
  st_sim_event_t x = *e;
  x.seq = h->seq++;
  /* Sift up: move parents down until x's slot is found. */
  size_t i = h->n++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!before(&x, &h->ev[parent]))
      break;
    h->ev[i] = h->ev[parent];
    i = parent;
  }
  h->ev[i] = x;
  return 0;
}

bool st__sim_heap_pop(st_sim_heap_t* h, st_sim_event_t* out) {
  if (h->n == 0)
    return false;
  *out = h->ev[0];
  st_sim_event_t last = h->ev[--h->n];
  size_t n = h->n;
  size_t i = 0;
  /* Sift down the former last element from the root. */
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n)
      break;
    if (child + 1 < n && before(&h->ev[child + 1], &h->ev[child]))
      child++;
    if (!before(&h->ev[child], &last))
      break;
    h->ev[i] = h->ev[child];
    i = child;
  }
  if (n > 0)
    h->ev[i] = last;
  return true;
}

void st__sim_heap_free(st_sim_heap_t* h) {
  free(h->ev);
  h->ev = NULL;
  h->n = h->cap = 0;
}
