/* attach_detach.c: the detach frame of the attach protocol (attach.h). */
#include "attach/attach.h"

#include "base/base.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

char* st_attach_detach_encode(bool final, size_t* len) {
  const char* text = final ? "{\"op\":\"detach\",\"final\":true}"
                           : "{\"op\":\"detach\",\"final\":false}";
  *len = strlen(text);
  return strdup(text);
}

int st_attach_detach_decode(const char* json, size_t len, bool* final) {
  *final = false;
  st_json_limits_t lim = {.max_depth = 2, .max_values = 8};
  st_json_doc_t* doc = NULL;
  if (st_json_parse(json, len, &lim, &doc, NULL, 0) != 0)
    return -EBADMSG;
  const st_json_t* root = st_json_root(doc);
  const st_json_t* op =
      root->type == ST_JSON_OBJECT ? st_json_get(root, "op") : NULL;
  const st_json_t* fin =
      root->type == ST_JSON_OBJECT ? st_json_get(root, "final") : NULL;
  int rc =
      op != NULL && op->type == ST_JSON_STRING && strcmp(op->str, "detach") == 0
          ? 0
          : -EBADMSG;
  if (rc == 0 && fin != NULL) {
    if (fin->type == ST_JSON_BOOL)
      *final = fin->boolean;
    else
      rc = -EBADMSG;
  }
  st_json_free(doc);
  return rc;
}
