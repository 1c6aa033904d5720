// Symbol visibility of libddprun_worker. The library is compiled with -fvisibility=hidden
// (and hidden inline functions), so only declarations marked DDPRUN_WORKER_API — the API of
// the installed headers — are exported from the shared object; its internals (the store
// client and server, Gloo, Asio, spdlog) stay private to it.
#pragma once

#if defined(_WIN32)
#define DDPRUN_WORKER_API
#else
#define DDPRUN_WORKER_API __attribute__((visibility("default")))
#endif
