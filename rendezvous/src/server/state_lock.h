// The lock around a keyspace's state and the rounds. Its critical sections are a few
// microseconds, and with several I/O threads a plain mutex sends a waiter to sleep in the
// kernel and costs a wake-up each time (context switches were the top item of a wait-hop
// profile). An adaptive mutex (glibc) spins briefly first; StoreServerOptions::adaptive_lock
// = false selects the plain one, to compare.
#pragma once

#include <pthread.h>

namespace ddprun::server {

class StateLock {
 public:
  explicit StateLock(bool adaptive) {
    pthread_mutexattr_t attr;
    ::pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    if (adaptive) ::pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#else
    (void)adaptive;
#endif
    ::pthread_mutex_init(&m_, &attr);
    ::pthread_mutexattr_destroy(&attr);
  }
  ~StateLock() { ::pthread_mutex_destroy(&m_); }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;
  void lock() { ::pthread_mutex_lock(&m_); }
  void unlock() { ::pthread_mutex_unlock(&m_); }
  bool try_lock() { return ::pthread_mutex_trylock(&m_) == 0; }

 private:
  pthread_mutex_t m_;
};

}  // namespace ddprun::server
