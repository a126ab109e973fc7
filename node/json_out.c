/* json_out.c: the public face of node/json.c's string escaper, for the
 * --json output of the `starling` commands. */
#include "node/json.h"
#include "node/node.h"

int st_json_write_string(FILE* f, const char* s) {
  return st__json_fput_string(f, s);
}
