// Symbol visibility of libddprun_worker_torch. The library is compiled with -fvisibility=hidden
// and -fvisibility-inlines-hidden, so only what is marked DDPRUN_WORKER_TORCH_API — the API of
// the installed headers ddp.h and state.h — is exported from the shared object; the autograd
// hooks, the engine's state and the helpers stay private to it.
#pragma once

#if defined(_WIN32)
#define DDPRUN_WORKER_TORCH_API
#else
#define DDPRUN_WORKER_TORCH_API __attribute__((visibility("default")))
#endif
