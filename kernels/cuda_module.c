/* cuda_module.c: loads the CUDA backend module (libstarling_cuda.so) at run
 * time, the first time a CUDA device is asked for (backend_internal.h).
 *
 * Why a module: linking the CUDA runtime and cuBLAS into every program cost
 * each process about 95 MB of anonymous memory and 60 MB of mapped files
 * before it did anything (`starling keygen --show` peaked at 222 MB RSS,
 * 5 MB without them), on machines with no GPU too. Now a process maps them
 * only when it opens a CUDA device or counts devices on a machine that has
 * the NVIDIA driver.
 *
 * The order: first the driver, libcuda.so.1, which only a machine with an
 * NVIDIA driver has (no driver: no GPU, and the module is never loaded);
 * then the module, looked for in $STARLING_CUDA_MODULE (a file), next to
 * the running program (/proc/self/exe: build/ holds both), and in the build
 * directory this library was built for. Nothing is ever unloaded.
 */
#define _GNU_SOURCE /* readlink, RTLD_* */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend_internal.h"

#define MODULE_NAME "libstarling_cuda.so"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static st__cuda_module_t g_module;
static const st__cuda_module_t* g_loaded;
static char g_why[512];

/* dlopen()s path; on failure appends dlerror()'s sentence to g_why. */
static void* try_open(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char* e = dlerror();
    size_t used = strlen(g_why);
    int room = (int) (sizeof(g_why) - used) - 3;
    if (room > 0)
      snprintf(g_why + used, sizeof(g_why) - used, "%s%.*s",
               used > 0 ? "; " : "", room, e != NULL ? e : path);
  }
  return h;
}

static void load(void) {
  /* No driver, no GPU: stop before the module pulls in cuBLAS. */
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) == NULL) {
    const char* e = dlerror();
    snprintf(g_why, sizeof(g_why), "no NVIDIA driver on this machine (%s)",
             e != NULL ? e : "libcuda.so.1 not found");
    return;
  }
  void* h = NULL;
  const char* env = getenv("STARLING_CUDA_MODULE");
  if (env != NULL && env[0] != '\0') {
    h = try_open(env);
  } else {
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n > 0) {
      path[n] = '\0';
      char* slash = strrchr(path, '/');
      if (slash != NULL &&
          (size_t) (slash + 1 - path) + sizeof(MODULE_NAME) <= sizeof(path)) {
        memcpy(slash + 1, MODULE_NAME, sizeof(MODULE_NAME));
        h = try_open(path);
      }
    }
#ifdef ST_CUDA_MODULE_DIR
    if (h == NULL)
      h = try_open(ST_CUDA_MODULE_DIR "/" MODULE_NAME);
#endif
  }
  if (h == NULL) {
    /* g_why holds the dlerror() of each place tried: say what to do. */
    char tried[sizeof(g_why)];
    memcpy(tried, g_why, sizeof(tried));
    snprintf(g_why, sizeof(g_why),
             "the CUDA backend module " MODULE_NAME
             " could not be loaded (set STARLING_CUDA_MODULE to its path; "
             "%.300s)",
             tried);
    return;
  }
  g_module.device_count = (int (*)(void)) dlsym(h, ST__CUDA_DEVICE_COUNT_SYM);
  g_module.open = (int (*)(int, int, st_backend_t**, char*, size_t)) dlsym(
      h, ST__CUDA_OPEN_SYM);
  if (g_module.device_count == NULL || g_module.open == NULL) {
    snprintf(g_why, sizeof(g_why),
             "the CUDA backend module lacks its entry points (a module of "
             "another version of starling?)");
    return;
  }
  g_why[0] = '\0';
  g_loaded = &g_module;
}

const st__cuda_module_t* st__cuda_module(const char** why) {
  pthread_once(&g_once, load);
  if (why != NULL)
    *why = g_why;
  return g_loaded;
}
