/* attach.h: the attach protocol between a training program (through the
 * client library, client/starling/client.h) and the `starling node
 * --attach` on its machine (docs/attach.md). Both sides include it; it
 * depends on base/ only. Sans-IO: layouts, the tensor list and its JSON
 * form, checks. The sockets, the memory mapping and the threads belong to
 * the two sides.
 *
 * The conversation, on the node's control socket (AF_UNIX, SOCK_STREAM):
 *
 *   1. The program connects and writes the line "attach\n".
 *   2. The node answers "ready\n" and from then on reads the connection
 *      itself, or "error <sentence>\n" and closes it (not in attach mode,
 *      another program attached, the node leaving).
 *   3. The program sends one frame (below), the attach request, with the
 *      shared segment's file descriptor (a memfd) in SCM_RIGHTS ancillary
 *      data on the same sendmsg.
 *   4. The node answers with one frame, the attach reply: ok, or an error
 *      sentence. With ok, area B of the segment holds the parameters the
 *      program must take before its first step (the cluster's, the node's
 *      checkpoint's, or the program's own when it is the first), and the
 *      reply's "step" the step they belong to. The node may take a while
 *      to answer (it synchronizes from a peer first).
 *   5. Afterwards everything goes through the segment. The program's
 *      "detach" frame (or the connection closing: the program died) ends
 *      the session; the node then keeps serving its last parameters to
 *      peers and to the next program that attaches. The node closing the
 *      connection means it left or died.
 *
 * A frame is a 4-byte little-endian length, then that many bytes of JSON
 * (at most ST_ATTACH_FRAME_MAX).
 *
 * The segment: a header page, then area A (program -> node: snapshots of
 * the parameters), then area B (node -> program: corrections to add, or a
 * state to take), each n_floats float32 rounded up to a page. The program
 * creates it, sizes it with st_attach_segment_bytes, fills the header's
 * first fields and its initial parameters in area A, and sends it.
 *
 * Requests through the segment (one outstanding at a time): the node
 * writes area B and req_flags, then bumps req_seq (release). At its next
 * step boundary the program sees req_seq != ack_seq (acquire) and, in this
 * order: STATE: copies B into its parameters and takes state_step; APPLY:
 * adds B to its parameters; SNAPSHOT: copies its parameters into A. Then
 * it writes ack_status, stores ack_seq = req_seq (release), increments the
 * doorbell and wakes it (FUTEX_WAKE, not private: the word is shared
 * between processes). The node touches neither the program's memory nor
 * area A while a request is outstanding, and the program touches neither
 * area outside a step boundary that serves a request.
 */
#ifndef STARLING_ATTACH_H
#define STARLING_ATTACH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_ATTACH_MAGIC 0x48534154u /* "TASH" little-endian */
#define ST_ATTACH_VERSION 1u
#define ST_ATTACH_PAGE 4096u
#define ST_ATTACH_FRAME_MAX (4u << 20)
#define ST_ATTACH_MAX_TENSORS 65536u
#define ST_ATTACH_MAX_DIMS 8
#define ST_ATTACH_NAME_MAX 255            /* bytes of UTF-8, without the NUL */
#define ST_ATTACH_MAX_FLOATS (1ull << 34) /* 64 GiB of float32 */

/* req_flags */
#define ST_ATTACH_REQ_APPLY 1u    /* params += B */
#define ST_ATTACH_REQ_SNAPSHOT 2u /* A = params (after APPLY) */
#define ST_ATTACH_REQ_STATE 4u    /* params = B, step = state_step */

/* ack_status */
#define ST_ATTACH_ACK_OK 0
/* The program's parameters were not finite: no snapshot was taken (A is
 * unspecified) and nothing was applied. */
#define ST_ATTACH_ACK_NONFINITE 1

typedef struct {
  /* Written by the program before it sends the segment; read-only after. */
  uint32_t magic;
  uint32_t version;
  uint64_t n_floats;
  uint64_t segment_bytes;
  uint8_t pad0[40];

  /* Node -> program. */
  _Atomic uint64_t req_seq;
  uint32_t req_flags;
  uint32_t pad1;
  uint64_t state_step;
  uint8_t pad2[40];

  /* Program -> node. */
  _Atomic uint64_t ack_seq;
  int32_t ack_status;
  _Atomic uint32_t doorbell;      /* futex word */
  _Atomic uint64_t step;          /* the program's last finished step */
  _Atomic uint64_t loss_bits;     /* a double (NaN: none): the program's */
  _Atomic uint64_t accuracy_bits; /* own figures, for status */
  _Atomic uint64_t boundaries;    /* step boundaries seen */
  uint8_t pad3[16];
} st_attach_header_t;

_Static_assert(sizeof(st_attach_header_t) == 192, "header layout");

/* Bytes of one area: n_floats * 4 rounded up to a page. */
uint64_t st_attach_area_bytes(uint64_t n_floats);
/* Header page + area A + area B. */
uint64_t st_attach_segment_bytes(uint64_t n_floats);
/* Both areas start on a page boundary of a page-aligned mapping, so the
 * casts through void* below are aligned. */
static inline float* st_attach_area_a(void* seg) {
  return (float*) (void*) ((uint8_t*) seg + ST_ATTACH_PAGE);
}
/* Area B of a segment for n_floats parameters: each side passes its own
 * count, never the header's (the other process can write the header). */
static inline float* st_attach_area_b(void* seg, uint64_t n_floats) {
  return (float*) (void*) ((uint8_t*) seg + ST_ATTACH_PAGE +
                           st_attach_area_bytes(n_floats));
}

/* Checks a received segment's header against its file size and the tensor
 * list's element count; err names what is wrong. -EPROTO for a wrong
 * magic or version, -EINVAL for wrong sizes. */
int st_attach_check_header(const st_attach_header_t* h, uint64_t file_bytes,
                           uint64_t n_floats, char* err, size_t err_len);

/* ---- The tensor list ---------------------------------------------------- */

typedef struct {
  char name[ST_ATTACH_NAME_MAX + 1];
  char dtype[8]; /* "F32" (the only one averaged for now) */
  int ndim;      /* 0 .. ST_ATTACH_MAX_DIMS; 0 is a scalar */
  uint64_t shape[ST_ATTACH_MAX_DIMS];
  uint64_t n_elems;
  uint64_t offset; /* in floats, within the concatenation, in list order */
} st_attach_tensor_t;

typedef struct {
  st_attach_tensor_t* t;
  size_t n;
  uint64_t n_floats; /* the sum of n_elems */
} st_attach_model_t;

void st_attach_model_free(st_attach_model_t* m);

/* Appends one tensor, checking it: a non-empty UTF-8 name of at most
 * ST_ATTACH_NAME_MAX bytes without control characters, not already in the
 * list; dtype "F32"; ndim within bounds; every dimension > 0 and the total
 * within ST_ATTACH_MAX_FLOATS. err names the tensor. */
int st_attach_model_add(st_attach_model_t* m, const char* name,
                        const char* dtype, int ndim, const uint64_t* shape,
                        char* err, size_t err_len);

/* The first difference between two lists, as a sentence ("tensor 3:
 * 'fc.weight' F32 [10, 128] here, 'fc.weight' F32 [10, 64] there"); false
 * when they are the same. `here` and `there` name the two sides. */
bool st_attach_model_diff(const st_attach_model_t* a, const char* here,
                          const st_attach_model_t* b, const char* there,
                          char* out, size_t out_len);

/* A one-line description of at most len bytes: "attached:N tensors,P
 * params" with the first tensor's name when it fits. */
void st_attach_model_describe(const st_attach_model_t* m, char* out,
                              size_t len);

/* The canonical text hashed into the model fingerprint: one line per
 * tensor, "name\tdtype\td0,d1,...\n". Owned by the caller (free). */
char* st_attach_model_canonical(const st_attach_model_t* m, size_t* len);

/* The inverse of st_attach_model_canonical, for lists read from files and
 * from other nodes (hostile input): every line "name\tdtype\td0,d1,...\n"
 * with decimal dimensions as the canonical text writes them (no sign,
 * space or leading zero), every tensor checked as st_attach_model_add does,
 * names unique, at least one tensor, no NUL byte. On success *m is a new
 * list (the caller frees it); on error *m is empty and err says which line
 * or tensor is wrong. */
int st_attach_model_parse(const char* text, size_t len, st_attach_model_t* m,
                          char* err, size_t err_len);

/* ---- Frames ------------------------------------------------------------- */

/* The attach request: {"version":1,"pid":P,"tensors":[{"name":..,
 * "dtype":"F32","shape":[..]},..]}. Returns a malloc'd JSON text (not
 * framed). */
char* st_attach_request_encode(const st_attach_model_t* m, int64_t pid,
                               size_t* len);
/* Parses and checks an attach request. -EPROTO (with the versions in err)
 * for another version, -EBADMSG or -EINVAL for a malformed one. */
int st_attach_request_decode(const char* json, size_t len, st_attach_model_t* m,
                             uint32_t* version, int64_t* pid, char* err,
                             size_t err_len);

/* The reply: {"ok":true,"step":S,"source":"..."} or
 * {"ok":false,"error":"..."}. Decoding returns 0 for either (*ok says
 * which; a refusal's sentence is in error), or -EBADMSG for a malformed
 * reply, with what is wrong in error. Strings are copied truncated, control
 * characters as '?'. */
char* st_attach_reply_encode(bool ok, uint64_t step, const char* source,
                             const char* error, size_t* len);
int st_attach_reply_decode(const char* json, size_t len, bool* ok,
                           uint64_t* step, char* source, size_t source_len,
                           char* error, size_t error_len);

/* The detach frame: {"op":"detach","final":B}. With final true the program
 * wrote its last parameters into area A before sending it (and touches the
 * segment no more). decode: -EBADMSG for anything else. */
char* st_attach_detach_encode(bool final, size_t* len);
int st_attach_detach_decode(const char* json, size_t len, bool* final);

/* Frames a JSON text: 4-byte little-endian length + text. Owned by the
 * caller. */
uint8_t* st_attach_frame(const char* json, size_t len, size_t* out_len);
/* Reads a frame's length from its first 4 bytes. */
uint32_t st_attach_frame_len(const uint8_t hdr[4]);

#ifdef __cplusplus
}
#endif

#endif
