/* bench_exec_stamp PROG ARGS...: appends {"event":"exec","rank":R,"attempt":A,"pid":P,"t_exec":T} to
 * $BENCH_RESTART_TS (T = CLOCK_REALTIME seconds, the moment this process runs), then execs PROG.
 * scripts/bench/bench_restart.py (restart mode) puts it in front of the worker under every launcher, so "replacement
 * running" is measured at exec, before the interpreter's own start-up (~10-20 ms of Python). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (argc < 2) {
    fprintf(stderr, "usage: bench_exec_stamp PROG [ARGS...]\n");
    return 2;
  }
  const char* path = getenv("BENCH_RESTART_TS");
  const char* rank = getenv("RANK");
  const char* attempt = getenv("TORCHELASTIC_RESTART_COUNT");
  if (path) {
    char line[256];
    int n = snprintf(line, sizeof line, "{\"event\": \"exec\", \"rank\": %s, \"attempt\": %s, \"pid\": %d, \"t_exec\": %ld.%09ld}\n",
                     rank ? rank : "-1", attempt ? attempt : "0", (int)getpid(), (long)ts.tv_sec, ts.tv_nsec);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (write(fd, line, (size_t)n) != n) perror("bench_exec_stamp: write");
      close(fd);
    }
  }
  execvp(argv[1], argv + 1);
  fprintf(stderr, "bench_exec_stamp: cannot exec %s\n", argv[1]);
  return 127;
}
