/* cli.h: the subcommands of the `starling` command and the flag-parsing
 * helpers they share. Internal to tools/. */
#ifndef STARLING_CLI_H
#define STARLING_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Each subcommand takes argv with argv[0] = the subcommand's name and
 * returns the process exit status: 0 success, 1 failure at run time,
 * 2 bad usage, 130 interrupted. */
int st__cmd_train(int argc, char** argv);
int st__cmd_keygen(int argc, char** argv);

/* Parsers for flag values. On bad input they print
 * "starling CMD: --FLAG: 'TEXT' is not ..." to stderr and return -EINVAL. */
int st__parse_u64(const char* cmd, const char* flag, const char* text,
                  uint64_t min, uint64_t max, uint64_t* out);
int st__parse_double(const char* cmd, const char* flag, const char* text,
                     double min, double max, double* out);

/* Monotonic seconds. */
double st__now(void);

#endif
