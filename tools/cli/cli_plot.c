/* cli_plot.c: `starling plot`: draws each node's loss and test accuracy
 * against step and time from the nodes' logs, as PNG and SVG. The drawing
 * is matplotlib's, in the Python package (client/python/starling/plot.py);
 * this command finds the package and execs `/usr/bin/python3 -m
 * starling.plot` with the user's arguments, which prints the usage, the
 * errors and the paths written. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli/cli.h"

#define PYTHON "/usr/bin/python3"

/* Where `cmake --install` puts the package, relative to the prefix, and
 * the package's directory in the source tree this binary was built from
 * (CMakeLists.txt defines both). */
#ifndef ST_PY_INSTALL_DIR
#define ST_PY_INSTALL_DIR "lib/python3/dist-packages"
#endif
#ifndef ST_PY_SOURCE_DIR
#define ST_PY_SOURCE_DIR ""
#endif

/* 1 when DIR/starling/plot.py exists. */
static int has_plot(const char* dir) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof(path), "%s/starling/plot.py", dir);
  return dir[0] != '\0' && access(path, R_OK) == 0;
}

/* The installed package beside this binary: PREFIX/bin/starling ->
 * PREFIX/ST_PY_INSTALL_DIR. Writes it to out (empty when the binary is not
 * in a bin/ folder). */
static void installed_dir(char* out, size_t len) {
  char exe[PATH_MAX];
  out[0] = '\0';
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0)
    return;
  exe[n] = '\0';
  char* slash = strrchr(exe, '/');
  if (slash == NULL)
    return;
  *slash = '\0'; /* exe: the binary's folder */
  slash = strrchr(exe, '/');
  if (slash == NULL || strcmp(slash, "/bin") != 0)
    return;
  *slash = '\0'; /* exe: the prefix */
  snprintf(out, len, "%s/%s", exe, ST_PY_INSTALL_DIR);
}

/* Puts the package's folder in front of PYTHONPATH: the installed one
 * first, then the source tree's. 0, or -ENOENT with the places said on
 * stderr when neither holds it and PYTHONPATH does not name another. */
static int add_python_path(void) {
  char inst[PATH_MAX + 64];
  installed_dir(inst, sizeof(inst));
  const char* dir = has_plot(inst)               ? inst
                    : has_plot(ST_PY_SOURCE_DIR) ? ST_PY_SOURCE_DIR
                                                 : NULL;
  const char* old = getenv("PYTHONPATH");
  if (dir == NULL) {
    if (old != NULL && old[0] != '\0')
      return 0; /* the user's: python3 says if it is not there */
    fprintf(stderr,
            "starling plot: cannot find the Python package 'starling' "
            "(starling/plot.py) in '%s' or '%s'; install starling with "
            "`cmake --install`, or set PYTHONPATH to the folder that holds "
            "it (client/python in a checkout)\n",
            inst[0] ? inst : "PREFIX/" ST_PY_INSTALL_DIR,
            ST_PY_SOURCE_DIR[0] ? ST_PY_SOURCE_DIR : "client/python");
    return -ENOENT;
  }
  char path[2 * PATH_MAX];
  if (old != NULL && old[0] != '\0')
    snprintf(path, sizeof(path), "%s:%s", dir, old);
  else
    snprintf(path, sizeof(path), "%s", dir);
  return setenv("PYTHONPATH", path, 1) == 0 ? 0 : -errno;
}

int st__cmd_plot(int argc, char** argv) {
  if (access(PYTHON, X_OK) != 0) {
    fprintf(stderr,
            "starling plot: needs %s with matplotlib: sudo apt-get install "
            "python3 python3-matplotlib\n",
            PYTHON);
    return 1;
  }
  if (add_python_path() != 0)
    return 1;
  setenv("STARLING_PLOT_PROG", "starling plot", 1);
  char** args = calloc((size_t) argc + 3, sizeof(char*));
  if (args == NULL) {
    fprintf(stderr, "starling plot: out of memory\n");
    return 1;
  }
  args[0] = PYTHON;
  args[1] = "-m";
  args[2] = "starling.plot";
  for (int i = 1; i < argc; i++)
    args[i + 2] = argv[i];
  execv(PYTHON, args);
  fprintf(stderr, "starling plot: cannot run %s: %s\n", PYTHON,
          strerror(errno));
  free(args);
  return 1;
}
